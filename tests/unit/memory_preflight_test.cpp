// The memory preflight (DESIGN.md section 4, cpu backend): a program whose plan needs more memory
// than ls::memory_limit() fails when it is compiled, before anything runs, naming the planned bytes
// and the largest values with their user lines; the step's transaction holds; planned bytes are
// reported in ls::metrics.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include <lockstep/lockstep.h>
#include "unit/ops_test_util.h"

namespace ls = lockstep;
using ops_test::bits;
using ::testing::HasSubstr;

namespace {

// Restores the default limit when a test ends, however it ends.
struct LimitGuard {
  ~LimitGuard() { ls::set_memory_limit(0); }
};

using ops_test::Delta;

// Two layers with a wide hidden layer: x [64, 128] -> h [64, 4096] (1 MiB) -> 10 classes.
struct Wide {
  ls::Tensor w1, w2;
  int hidden_line = 0;
  Wide() {
    ls::manual_seed(5);
    w1 = ls::randn({128, 4096}).mul_(0.01).set_requires_grad();
    w2 = ls::randn({4096, 10}).mul_(0.01).set_requires_grad();
    ls::sync();
  }
  ls::Tensor train_step() {
    ls::Tensor loss;
    ls::step([&] {
      const ls::Tensor x = ls::randn({64, 128});
      hidden_line = __LINE__ + 1;
      const ls::Tensor h = ls::relu(ls::matmul(x, w1));
      loss = ls::nn::cross_entropy(ls::matmul(h, w2), ls::full({64}, 3, ls::i64));
      loss.backward();
      ls::NoGrad no_grad;
      w1.sub_(w1.grad() * 0.1);
      w2.sub_(w2.grad() * 0.1);
      w1.set_grad(ls::Tensor());
      w2.set_grad(ls::Tensor());
    });
    return loss;
  }
};

}  // namespace

TEST(MemoryPreflight, TheDefaultLimitIsTheMachinesMemory) {
  const size_t phys = static_cast<size_t>(::sysconf(_SC_PHYS_PAGES)) *
                      static_cast<size_t>(::sysconf(_SC_PAGE_SIZE));
  EXPECT_GT(ls::memory_limit(), size_t{64} << 20);
  EXPECT_LE(ls::memory_limit(), phys);
  LimitGuard guard;
  ls::set_memory_limit(12345);
  EXPECT_EQ(ls::memory_limit(), 12345u);
  ls::set_memory_limit(0);
  EXPECT_LE(ls::memory_limit(), phys);
}

TEST(MemoryPreflight, AStepThatWouldNotFitFailsBeforeItRunsAndLeavesTheModel) {
  LimitGuard guard;
  Wide model;
  const std::vector<uint32_t> w1 = bits(model.w1), w2 = bits(model.w2);
  const std::vector<int64_t> generator = ls::generator_state().to_vector<int64_t>();
  ls::set_memory_limit(size_t{1} << 20);  // 1 MiB: the hidden layer alone is 1 MiB
  Delta executions("executions"), rollbacks("rollbacks");
  std::string message;
  try {
    model.train_step();
    ls::wait();
  } catch (const ls::Error& e) {
    message = e.what();
  }
  EXPECT_THAT(message, ::testing::ContainsRegex("^step [0-9]+ \\(entered at "));
  EXPECT_THAT(message, HasSubstr("): cpu: the program needs "));
  EXPECT_THAT(message, HasSubstr("more than the memory limit of 1.00 MiB (1048576 bytes)"));
  const std::string at = "memory_preflight_test.cpp:" + std::to_string(model.hidden_line);
  // The hidden layer, and its weight gradient (made from the same line's matmul).
  EXPECT_THAT(message, HasSubstr("f32[64, 4096] 1.00 MiB (1048576 bytes) from relu at "));
  EXPECT_THAT(message, HasSubstr("f32[128, 4096] 2.00 MiB (2097152 bytes) from matmul at "));
  EXPECT_THAT(message, HasSubstr(at));
  EXPECT_THAT(message, HasSubstr("Nothing ran"));
  EXPECT_EQ(executions.get(), 0) << "the program must not run";
  EXPECT_EQ(rollbacks.get(), 1) << "the step's transaction holds";
  EXPECT_EQ(bits(model.w1), w1);
  EXPECT_EQ(bits(model.w2), w2);
  EXPECT_FALSE(model.w1.is_pending());
  EXPECT_FALSE(model.w1.grad().defined());
  EXPECT_EQ(ls::generator_state().to_vector<int64_t>(), generator);

  // With the memory it needs, the same step runs and reports what it planned.
  ls::set_memory_limit(0);
  const float loss = model.train_step().item<float>();
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_NE(bits(model.w1), w1);
  const int64_t planned = ls::metrics::counter("planned_bytes");
  EXPECT_GE(planned, int64_t{1} << 20) << "at least the hidden layer";
  EXPECT_LT(planned, int64_t{64} << 20);
  EXPECT_GE(ls::metrics::counter("max_planned_bytes"), planned);
  // A limit just at the plan lets it run; one byte less does not, though the program is compiled.
  ls::set_memory_limit(static_cast<size_t>(planned));
  EXPECT_NO_THROW((void)model.train_step().item<float>());
  ls::set_memory_limit(static_cast<size_t>(planned) - 1);
  EXPECT_THROW((void)model.train_step().item<float>(), ls::Error);
}

TEST(MemoryPreflight, ASyncThatWouldNotFitLeavesItsTensorsPending) {
  LimitGuard guard;
  const ls::Tensor a = ls::ones({512, 512});
  ls::sync();
  const ls::Tensor b = ls::matmul(a, a) + 1;
  ls::set_memory_limit(size_t{256} << 10);
  EXPECT_THROW(ls::sync(), ls::Error);
  EXPECT_TRUE(b.is_pending());
  ls::set_memory_limit(0);
  EXPECT_EQ(b.to_vector<float>()[7], 513.0f);
}

TEST(MemoryPreflight, PlannedBytesAreAGaugeReset) {
  ls::metrics::reset();
  EXPECT_EQ(ls::metrics::counter("planned_bytes"), 0);
  EXPECT_EQ(ls::metrics::counter("max_planned_bytes"), 0);
  const ls::Tensor x = ls::ones({256, 256}) * 2;
  (void)x.to_vector<float>();
  const int64_t first = ls::metrics::counter("planned_bytes");
  EXPECT_GE(first, 256 * 256 * 4) << "the output";
  const ls::Tensor y = ls::ones({4}) * 3;
  (void)y.to_vector<float>();
  EXPECT_LT(ls::metrics::counter("planned_bytes"), first) << "the latest program's";
  EXPECT_EQ(ls::metrics::counter("max_planned_bytes"), first) << "the largest since the reset";
}
