// End to end on the ref backend: MLPs learn synthetic tasks generated here deterministically (two
// interleaved spirals in 2-D, full batch, AdamW; four Gaussian blobs in 8-D, host mini-batches,
// SGD with momentum) inside ls::step loops, reach >= 98% accuracy on held-out points, and each
// whole loop (first step, steady state, evaluation) compiles at most 3 programs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <numbers>
#include <random>

#include "unit/train_test_util.h"

namespace {

using train_test::Delta;

// Makes `device` the default for the scope.
class DefaultDevice {
 public:
  explicit DefaultDevice(ls::Device d) : saved_(ls::default_device()) { ls::set_default_device(d); }
  ~DefaultDevice() { ls::set_default_device(saved_); }
  DefaultDevice(const DefaultDevice&) = delete;
  DefaultDevice& operator=(const DefaultDevice&) = delete;

 private:
  ls::Device saved_;
};

struct Data {
  ls::Tensor x, y;  // f32 [n, 2], i64 [n]
};

// Two spirals of two turns, class k rotated by k * pi, with Gaussian noise. Uses only the
// exactly specified std::mt19937 (not the library's distributions), so every platform gets the
// same points.
Data spirals(int per_class, uint32_t seed) {
  std::mt19937 rng(seed);
  auto uniform = [&] { return (static_cast<double>(rng() >> 8) + 0.5) / 16777216.0; };
  auto normal = [&] {
    return std::sqrt(-2 * std::log(uniform())) * std::cos(2 * std::numbers::pi * uniform());
  };
  std::vector<float> xs;
  std::vector<int64_t> ys;
  for (int i = 0; i < per_class; ++i)
    for (int k = 0; k < 2; ++k) {
      const double t = uniform();
      const double angle = 4.0 * std::numbers::pi * t + k * std::numbers::pi;
      const double r = 0.15 + t;
      xs.push_back(static_cast<float>(r * std::cos(angle) + 0.02 * normal()));
      xs.push_back(static_cast<float>(r * std::sin(angle) + 0.02 * normal()));
      ys.push_back(k);
    }
  const int64_t n = 2 * per_class;
  return {ls::from_vector<float>(xs, {n, 2}), ls::from_vector<int64_t>(ys, {n})};
}

}  // namespace

TEST(TrainSynthetic, MlpLearnsTwoSpiralsWithFewCompiles) {
  DefaultDevice on_ref(ls::Device{ls::DeviceKind::Ref});
  ls::manual_seed(2024);
  const Data train = spirals(200, 1), test = spirals(200, 2);
  ASSERT_EQ(train.x.device(), (ls::Device{ls::DeviceKind::Ref}));
  ls::models::MLP model({2, 64, 64, 2});
  ls::optim::AdamW opt(model.parameters(), {.lr = 0.03, .weight_decay = 1e-4});
  ls::optim::CosineWarmupLR sched(opt, 10, 300, 1e-4);
  ls::sync();  // initial values: not part of the training loop
  ls::wait();

  Delta compiles("compiles");
  ls::Tensor loss;
  std::vector<float> losses;
  for (int s = 0; s < 300; ++s) {
    ls::step([&] {
      opt.zero_grad();
      loss = ls::nn::cross_entropy(model(train.x), train.y);
      loss.backward();
      opt.step();
    });
    sched.step();
    if (s % 100 == 0) losses.push_back(loss.item<float>());
  }
  losses.push_back(loss.item<float>());
  model.eval();
  const float train_acc = ls::nn::accuracy(model(train.x), train.y).item<float>();
  const float test_acc = ls::nn::accuracy(model(test.x), test.y).item<float>();
  ls::wait();
  EXPECT_LE(compiles.get(), 3);
  EXPECT_GE(test_acc, 0.98f) << "train accuracy " << train_acc;
  EXPECT_GE(train_acc, 0.98f);
  EXPECT_LT(losses.back(), 0.1f * losses.front());
  for (const ls::Tensor& p : model.parameters())
    EXPECT_EQ(p.device(), (ls::Device{ls::DeviceKind::Ref}));
}

namespace {

// Four classes in 8-D: Gaussian blobs (sigma 0.6) around the corners (+-2, +-2) on the
// first two axes, shifted by a common offset on the others. As host vectors, for mini-batches.
void blobs(int n, uint32_t seed, std::vector<float>* xs, std::vector<int64_t>* ys) {
  std::mt19937 rng(seed);
  auto uniform = [&] { return (static_cast<double>(rng() >> 8) + 0.5) / 16777216.0; };
  auto normal = [&] {
    return std::sqrt(-2 * std::log(uniform())) * std::cos(2 * std::numbers::pi * uniform());
  };
  for (int i = 0; i < n; ++i) {
    const int64_t k = static_cast<int64_t>(rng() % 4);
    for (int d = 0; d < 8; ++d) {
      double centre = d == 0 ? (k & 1 ? 2.0 : -2.0) : d == 1 ? (k & 2 ? 2.0 : -2.0) : 0.5;
      xs->push_back(static_cast<float>(centre + 0.6 * normal()));
    }
    ys->push_back(k);
  }
}

}  // namespace

TEST(TrainSynthetic, SgdMomentumOnHostMiniBatchesOfGaussianBlobs) {
  DefaultDevice on_ref(ls::Device{ls::DeviceKind::Ref});
  ls::manual_seed(7);
  std::vector<float> xs, test_xs;
  std::vector<int64_t> ys, test_ys;
  blobs(1024, 11, &xs, &ys);
  blobs(512, 12, &test_xs, &test_ys);
  ls::models::MLP model({8, 32, 4});
  ls::optim::SGD opt(model.parameters(), {.lr = 0.05, .momentum = 0.9, .nesterov = true});
  ls::sync();
  ls::wait();

  Delta compiles("compiles");
  const int batch = 64, batches = 1024 / batch;
  for (int epoch = 0; epoch < 3; ++epoch)
    for (int b = 0; b < batches; ++b) {
      // A new batch each step, uploaded from the host: data, not a new graph.
      ls::Tensor x = ls::from_vector<float>(
          std::vector<float>(xs.begin() + b * batch * 8, xs.begin() + (b + 1) * batch * 8),
          {batch, 8});
      ls::Tensor y = ls::from_vector<int64_t>(
          std::vector<int64_t>(ys.begin() + b * batch, ys.begin() + (b + 1) * batch), {batch});
      ls::step([&] {
        opt.zero_grad();
        ls::nn::cross_entropy(model(x), y).backward();
        opt.step();
      });
    }
  const ls::Tensor tx = ls::from_vector<float>(test_xs, {512, 8});
  const ls::Tensor ty = ls::from_vector<int64_t>(test_ys, {512});
  const float acc = ls::nn::accuracy(model(tx), ty).item<float>();
  ls::wait();
  EXPECT_LE(compiles.get(), 3);
  EXPECT_GE(acc, 0.98f);
}
