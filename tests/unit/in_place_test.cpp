// Parameters and optimizer state updated in place by the cpu backend (buffer donation): only
// when nothing but the program still references the old value, with the same results as
// computing into fresh memory, and never behind the back of a tensor that still holds it.
#include <gtest/gtest.h>

#include <cstring>

#include <lockstep/lockstep.h>
#include "runtime/lazy.h"

namespace ls = lockstep;

namespace {

const void* storage_of(const ls::Tensor& t) {
  ls::wait();
  const auto& node = t.impl()->node;
  EXPECT_EQ(node->op, ls::ir::Op::Data);
  return node->buffer->storage->data();
}

std::vector<uint32_t> bits(const ls::Tensor& t) {
  std::vector<float> v = t.to_vector<float>();
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

struct Net {
  ls::nn::Linear fc1{16, 32}, fc2{32, 4};
  std::vector<ls::Tensor> params() const { return {fc1.weight, fc1.bias, fc2.weight, fc2.bias}; }
  ls::Tensor loss(const ls::Tensor& x, const ls::Tensor& y) {
    return ls::nn::cross_entropy(fc2(ls::relu(fc1(x))), y);
  }
};

}  // namespace

TEST(InPlace, SgdMomentumUpdatesParametersWhereTheyAre) {
  ls::manual_seed(3);
  Net net;
  ls::optim::SGD opt(net.params(), {.lr = 0.1, .momentum = 0.9});
  const ls::Tensor x = ls::randn({8, 16}), y = ls::randint(0, 4, {8});
  auto body = [&] {
    opt.zero_grad();
    net.loss(x, y).backward();
    opt.step();
  };
  for (int i = 0; i < 3; ++i) ls::step(body);  // momentum buffers exist from here on
  const void* w = storage_of(net.fc1.weight);
  const int64_t before = ls::metrics::counter("in_place_outputs");
  for (int i = 0; i < 3; ++i) {
    ls::step(body);
    EXPECT_EQ(storage_of(net.fc1.weight), w) << "the weight moved to new memory in step " << i;
  }
  EXPECT_EQ(storage_of(net.fc1.weight), w) << "the weight moved to new memory";
  // Four parameters and four momentum buffers per step.
  EXPECT_GE(ls::metrics::counter("in_place_outputs") - before, 3 * 8);
}

TEST(InPlace, GivesTheSameValuesAsFreshMemory) {
  // Twin runs: one where every old value is still held (so nothing is donated), one where none
  // is. Bit-identical parameters after every step.
  ls::manual_seed(4);
  Net a;
  ls::manual_seed(4);
  Net b;
  ls::optim::SGD opt_a(a.params(), {.lr = 0.05, .momentum = 0.9, .nesterov = true});
  ls::optim::SGD opt_b(b.params(), {.lr = 0.05, .momentum = 0.9, .nesterov = true});
  const ls::Tensor x = ls::randn({8, 16}), y = ls::randint(0, 4, {8});
  for (int i = 0; i < 5; ++i) {
    std::vector<ls::Tensor> held;
    for (const ls::Tensor& p : b.params()) held.push_back(p.detach());
    ls::step([&] {
      opt_a.zero_grad();
      a.loss(x, y).backward();
      opt_a.step();
    });
    ls::step([&] {
      opt_b.zero_grad();
      b.loss(x, y).backward();
      opt_b.step();
    });
    for (size_t k = 0; k < a.params().size(); ++k)
      ASSERT_EQ(bits(a.params()[k]), bits(b.params()[k])) << "step " << i << " parameter " << k;
  }
}

TEST(InPlace, NeverOverwritesAValueATensorStillHolds) {
  ls::manual_seed(5);
  Net net;
  ls::optim::SGD opt(net.params(), {.lr = 0.1, .momentum = 0.9});
  const ls::Tensor x = ls::randn({8, 16}), y = ls::randint(0, 4, {8});
  auto body = [&] {
    opt.zero_grad();
    net.loss(x, y).backward();
    opt.step();
  };
  for (int i = 0; i < 3; ++i) ls::step(body);
  const ls::Tensor old = net.fc1.weight.detach();  // shares the current value
  const std::vector<uint32_t> old_bits = bits(old);
  const void* old_storage = storage_of(net.fc1.weight);
  ls::step(body);
  EXPECT_EQ(bits(old), old_bits) << "a held value was overwritten";
  EXPECT_NE(storage_of(net.fc1.weight), old_storage);
  EXPECT_NE(bits(net.fc1.weight), old_bits) << "the step did not update the weight";
}
