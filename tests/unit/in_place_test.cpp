// Parameters and optimizer state updated in place by the cpu backend (buffer donation): only
// when nothing but the program still references the old value, with the same results as
// computing into fresh memory, and never behind the back of a tensor that still holds it.
#include <gtest/gtest.h>

#include <lockstep/lockstep.h>
#include "runtime/lazy.h"
#include "unit/ops_test_util.h"

namespace ls = lockstep;
using ops_test::bits;

namespace {

const void* storage_of(const ls::Tensor& t) {
  ls::wait();
  const auto& node = t.impl()->node;
  EXPECT_EQ(node->op, ls::ir::Op::Data);
  return node->binding.buffer->storage->data();
}

struct Net {
  explicit Net(int64_t hidden) : fc1(16, hidden), fc2(hidden, 4) {}
  ls::nn::Linear fc1, fc2;
  std::vector<ls::Tensor> params() const { return {fc1.weight, fc1.bias, fc2.weight, fc2.bias}; }
  ls::Tensor loss(const ls::Tensor& x, const ls::Tensor& y) {
    return ls::nn::cross_entropy(fc2(ls::relu(fc1(x))), y);
  }
};

struct Seeded {
  explicit Seeded(uint64_t seed) { ls::manual_seed(seed); }
};

// A net trained with SGD on a fixed batch; three steps in, so the momentum buffers exist.
struct Training : Seeded {
  Net net;
  ls::optim::SGD opt;
  ls::Tensor x = ls::randn({8, 16}), y = ls::randint(0, 4, {8});
  explicit Training(uint64_t seed, bool nesterov = false, int64_t hidden = 32)
      : Seeded(seed),
        net(hidden),
        opt(net.params(), {.lr = 0.05, .momentum = 0.9, .nesterov = nesterov}) {
    for (int i = 0; i < 3; ++i) step();
  }
  void step() {
    ls::step([&] {
      opt.zero_grad();
      net.loss(x, y).backward();
      opt.step();
    });
  }
};

}  // namespace

TEST(InPlace, SgdMomentumUpdatesParametersWhereTheyAre) {
  Training t(3);
  const void* w = storage_of(t.net.fc1.weight);
  const int64_t before = ls::metrics::counter("in_place_outputs");
  for (int i = 0; i < 3; ++i) {
    t.step();
    EXPECT_EQ(storage_of(t.net.fc1.weight), w) << "the weight moved to new memory in step " << i;
  }
  // Four parameters and four momentum buffers per step.
  EXPECT_GE(ls::metrics::counter("in_place_outputs") - before, 3 * 8);
}

TEST(InPlace, GivesTheSameValuesAsFreshMemory) {
  // Twin runs: one where every old value is still held (so nothing is donated), one where none
  // is. Bit-identical parameters after every step. With 2,600 hidden units the first layer's
  // weight (41,600 values) is updated over many tiles, on several threads.
  for (int64_t hidden : {32, 2600}) {
    SCOPED_TRACE(hidden);
    Training a(4, true, hidden), b(4, true, hidden);
    const int64_t before = ls::metrics::counter("in_place_outputs");
    for (int i = 0; i < 5; ++i) {
      std::vector<ls::Tensor> held;
      for (const ls::Tensor& p : b.net.params()) held.push_back(p.detach());
      a.step();
      b.step();
      for (size_t k = 0; k < a.net.params().size(); ++k)
        ASSERT_EQ(bits(a.net.params()[k]), bits(b.net.params()[k]))
            << "step " << i << " parameter " << k;
    }
    EXPECT_GE(ls::metrics::counter("in_place_outputs") - before, 5 * 8)
        << "a updated nothing in place";
  }
}

TEST(InPlace, NeverOverwritesAValueATensorStillHolds) {
  Training t(5);
  const ls::Tensor old = t.net.fc1.weight.detach();  // shares the current value
  const std::vector<uint32_t> old_bits = bits(old);
  const void* old_storage = storage_of(t.net.fc1.weight);
  t.step();
  EXPECT_EQ(bits(old), old_bits) << "a held value was overwritten";
  EXPECT_NE(storage_of(t.net.fc1.weight), old_storage);
  EXPECT_NE(bits(t.net.fc1.weight), old_bits) << "the step did not update the weight";
}
