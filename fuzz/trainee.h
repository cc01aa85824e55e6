// The model, optimizer and generator state the checkpoint harness loads into, built the same way
// by the harness and by the seed writer (a checkpoint that fits it is the main seed).
#pragma once

#include <memory>

#include "lockstep/nn.h"
#include "lockstep/ops.h"
#include "lockstep/optim.h"
#include "lockstep/runtime.h"

namespace lockstep::fuzz {

// Linear, BatchNorm (running statistics and an int64 batch count), ReLU, Linear; AdamW after one
// step (moments and a step count).
struct Trainee {
  std::shared_ptr<nn::Sequential> model = std::make_shared<nn::Sequential>();
  std::unique_ptr<optim::AdamW> optimizer;
  Trainee() {
    manual_seed(7);
    model->emplace<nn::Linear>(4, 6).emplace<nn::BatchNorm>(6).emplace<nn::ReLU>();
    model->emplace<nn::Linear>(6, 3);
    optimizer = std::make_unique<optim::AdamW>(model->parameters(), optim::AdamOptions{.lr = 0.01});
    const Tensor x = randn({5, 4});
    model->forward(x).sum().backward();
    optimizer->step();
    optimizer->zero_grad();
    sync();
  }
};

}  // namespace lockstep::fuzz
