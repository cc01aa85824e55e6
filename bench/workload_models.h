// lockstep's side of the workloads (workloads.h): each one's model and fixed batch, shared by
// train_bench and dist_bench.
#pragma once

#include <lockstep/lockstep.h>

#include <memory>
#include <vector>

#include "workloads.h"

inline std::shared_ptr<lockstep::nn::Module> make_model(const Workload& w) {
  namespace models = lockstep::models;
  if (w.name == "mlp")
    return std::make_shared<models::MLP>(std::vector<int64_t>{784, 1024, 1024, 10});
  if (w.name == "cnn" || w.name == "cnn256")
    return std::make_shared<models::FashionCNN>(10, w.channels, w.image);
  if (w.name == "resnet18")
    return std::make_shared<models::ResNet>(
        models::resnet18({.num_classes = 10, .stem = models::ResNetStem::Small}));
  if (w.name == "resnet50_96" || w.name == "resnet50_224")
    return std::make_shared<models::ResNet>(
        models::resnet50({.num_classes = 10, .stem = models::ResNetStem::ImageNet}));
  return std::make_shared<models::ResNet>(models::resnet50({.num_classes = 10}));
}

// A random batch of the workload's shape with labels among its 10 classes.
struct FixedBatch {
  lockstep::Tensor images, labels;
};
inline FixedBatch fixed_batch(const Workload& w) {
  return {w.image ? lockstep::randn({w.batch, w.channels, w.image, w.image})
                  : lockstep::randn({w.batch, 784}),
          lockstep::randint(0, 10, {w.batch})};
}
