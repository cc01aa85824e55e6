// Contract tests of the transactional step (DESIGN.md section 1, "Step"): sync on entry and
// exit, rollback on an exception, poisoning, closures, nesting.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include <lockstep/lockstep.h>
#include "unit/ops_test_util.h"

namespace ls = lockstep;
using ::testing::HasSubstr;

namespace {

using ops_test::Delta;

struct UserError : std::runtime_error {
  int code;
  explicit UserError(int c) : std::runtime_error("user error"), code(c) {}
};

using ops_test::bits;  // bit patterns: "restored" means bit for bit, not approximately

// A little SGD-with-momentum model whose update is written by hand.
struct Model {
  ls::Tensor w = ls::randn({4, 3});
  ls::Tensor velocity = ls::zeros({4, 3});
  void update(const ls::Tensor& x, double lr) {
    ls::Tensor grad = ls::matmul(ls::transpose(x, 0, 1), ls::tanh(ls::matmul(x, w)));
    velocity.mul_(0.9).add_(grad);
    w.sub_(lr * velocity);
  }
};

}  // namespace

TEST(Step, SyncsOnEntrySoTheStepCoversOnlyItsOwnWork) {
  ls::Tensor before = ls::from_vector<float>({1, 2}) * 3.0f;  // pending
  ASSERT_TRUE(before.is_pending());
  ls::step([&] {
    EXPECT_FALSE(before.is_pending());  // the entry sync materialized it
    before += 1.0f;
    EXPECT_TRUE(before.is_pending());
  });
  EXPECT_FALSE(before.is_pending());  // the exit sync too
  EXPECT_EQ(before.to_vector<float>(), (std::vector<float>{4, 7}));
}

TEST(Step, EmptyStepCostsNothing) {
  ls::sync();
  ls::wait();
  Delta syncs("syncs"), compiles("compiles"), executions("executions"), steps("steps");
  for (int i = 0; i < 5; ++i) ls::step([] {});
  ls::wait();
  EXPECT_EQ(steps.get(), 5);
  EXPECT_EQ(syncs.get(), 0);
  EXPECT_EQ(compiles.get(), 0);
  EXPECT_EQ(executions.get(), 0);
}

TEST(Step, HundredStepsWithChangingLearningRateCompileAtMostTwice) {
  ls::manual_seed(7);
  Model m;
  ls::sync();
  Delta compiles("compiles"), hits("cache_hits");
  for (int i = 0; i < 100; ++i) {
    const double lr = 0.1 / (1 + i);  // a host scalar: a runtime input, never a recompile
    ls::step([&] {
      ls::Tensor x = ls::randn({8, 4});
      m.update(x, lr);
    });
  }
  ls::wait();
  EXPECT_LE(compiles.get(), 2);
  EXPECT_GE(hits.get(), 98);
  for (float v : m.w.to_vector<float>()) EXPECT_TRUE(std::isfinite(v));
}

TEST(Step, ExceptionRestoresEveryChangedTensorBitForBit) {
  ls::manual_seed(3);
  Model m;
  ls::step([&] { m.update(ls::randn({8, 4}), 0.1); });  // velocity is non-zero now
  const auto w0 = bits(m.w), v0 = bits(m.velocity);
  const auto rng0 = ls::generator_state().to_vector<int64_t>();
  Delta rollbacks("rollbacks");
  ls::Tensor created_inside;
  try {
    ls::step([&] {
      m.update(ls::randn({8, 4}), 0.1);
      created_inside = m.w * 2.0f;
      throw UserError(42);
    });
    FAIL() << "the exception did not propagate";
  } catch (const UserError& e) {
    EXPECT_EQ(e.code, 42);  // unchanged: same type, same payload
  }
  EXPECT_EQ(rollbacks.get(), 1);
  EXPECT_EQ(bits(m.w), w0);
  EXPECT_EQ(bits(m.velocity), v0);
  EXPECT_EQ(ls::generator_state().to_vector<int64_t>(), rng0);  // RNG state too
  EXPECT_TRUE(created_inside.is_poisoned());
  try {
    created_inside.to_vector<float>();
    FAIL();
  } catch (const ls::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("rolled back"));
    EXPECT_THAT(e.what(), HasSubstr("user error"));
  }
  // The next step works, and draws the same random numbers the failed one drew.
  ls::Tensor x_next;
  ls::step([&] {
    x_next = ls::randn({8, 4});
    m.update(x_next, 0.1);
  });
  EXPECT_NE(bits(m.w), w0);
}

TEST(Step, RollbackAfterAReadInsideTheStep) {
  ls::Tensor p = ls::from_vector<float>({1, 2, 3});
  const auto p0 = bits(p);
  Delta implicit("implicit_syncs");
  EXPECT_THROW(ls::step([&] {
                 p.mul_(10.0f);
                 ls::Tensor s = ls::sum(p);
                 if (s.item<float>() > 0) throw std::runtime_error("loss exploded");
               }),
               std::runtime_error);
  EXPECT_EQ(implicit.get(), 1);  // the read inside the step was an implicit sync
  EXPECT_EQ(bits(p), p0);
}

// A read inside a step computes the step's work so far, once: the forward behind a loss already
// differentiated is not computed again by the step's program (the gradients were computed with
// the read), so the step with reads executes no more nodes than the same step without them.
TEST(Step, AReadInsideTheStepComputesTheWorkSoFarOnlyOnce) {
  ls::Tensor x = ls::from_vector<float>({0.5f, -1.0f, 2.0f, 0.25f});
  auto run = [&](bool read) {
    ls::Tensor w = ls::from_vector<float>({1, 2, 3, 4});
    w.set_requires_grad(true);
    ls::wait();
    Delta nodes("executed_nodes");
    float seen = 0;
    ls::step([&] {
      ls::Tensor h = x * w;
      for (int i = 0; i < 8; ++i) h = ls::tanh(h * 1.5f + 0.1f);
      ls::Tensor loss = ls::sum(h * h);
      loss.backward();
      if (read) seen = loss.item<float>();  // the forward and the gradient, computed here
      ls::NoGrad no_grad;
      w.sub_(w.grad() * 0.1f);
      if (read) seen += ls::sum(w).item<float>();  // the update only
    });
    ls::wait();
    return std::pair{nodes.get(), w.to_vector<float>()};
  };
  const auto [plain_nodes, plain_w] = run(false);
  const auto [read_nodes, read_w] = run(true);
  EXPECT_EQ(read_w, plain_w);
  EXPECT_LE(read_nodes, plain_nodes + 8) << "without reads: " << plain_nodes;
}

TEST(Step, GuardCommitsOnNormalExitAndRollsBackOnUnwinding) {
  ls::Tensor p = ls::from_vector<float>({1, 1});
  {
    ls::Step s;
    p += 1.0f;
  }
  EXPECT_EQ(p.to_vector<float>(), (std::vector<float>{2, 2}));
  try {
    ls::Step s;
    p += 100.0f;
    throw UserError(1);
  } catch (const UserError&) {
  }
  EXPECT_EQ(p.to_vector<float>(), (std::vector<float>{2, 2}));
  EXPECT_FALSE(ls::in_step());
  {
    ls::Step s;
    p += 1.0f;
    s.commit();
    EXPECT_FALSE(ls::in_step());
  }
  EXPECT_EQ(p.to_vector<float>(), (std::vector<float>{3, 3}));
}

TEST(Step, ShapeErrorInsideAStepRollsBack) {
  ls::Tensor p = ls::from_vector<float>({1, 2});
  EXPECT_THROW(ls::step([&] {
                 p += 1.0f;
                 p += ls::zeros({3});  // does not broadcast: ls::Error at this line
               }),
               ls::Error);
  EXPECT_EQ(p.to_vector<float>(), (std::vector<float>{1, 2}));
}

TEST(Step, NestingThrowsAndTheOuterStepStillWorks) {
  ls::Tensor p = ls::from_vector<float>({0});
  ls::step([&] {
    p += 1.0f;
    try {
      ls::step([&] { p += 100.0f; });
      ADD_FAILURE() << "nested step did not throw";
    } catch (const ls::Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("nest"));
    }
    EXPECT_THROW(ls::Step inner, ls::Error);
    p += 1.0f;
  });
  EXPECT_EQ(p.item<float>(), 2.0f);
}

TEST(Step, ClosuresRunAfterTheProgramWithValuesReady) {
  ls::Tensor p = ls::from_vector<float>({1, 2});
  std::vector<float> seen;
  int order = 0, first = 0, second = 0;
  ls::step([&] {
    p *= 3.0f;
    ls::Tensor s = ls::sum(p);
    ls::add_step_closure([&, s] {
      seen.push_back(s.item<float>());  // ready: no sync needed
      first = ++order;
    });
    ls::add_step_closure([&] { second = ++order; });
    EXPECT_TRUE(seen.empty());  // not while tracing
  });
  ls::wait();
  EXPECT_EQ(seen, (std::vector<float>{9}));
  EXPECT_EQ(first, 1);
  EXPECT_EQ(second, 2);
  EXPECT_THROW(ls::add_step_closure([] {}), ls::Error);  // outside a step
}

TEST(Step, ClosuresOfARolledBackStepNeverRun) {
  bool ran = false;
  EXPECT_THROW(ls::step([&] {
                 ls::add_step_closure([&] { ran = true; });
                 throw UserError(0);
               }),
               UserError);
  ls::wait();
  EXPECT_FALSE(ran);
}

TEST(Step, ClosureExceptionIsRaisedAtTheNextBlockingPoint) {
  ls::step([&] { ls::add_step_closure([] { throw std::runtime_error("closure failed"); }); });
  try {
    ls::wait();
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("closure failed"));
  }
}

TEST(Step, ExecutionFailureRestoresWhatTheStepChanged) {
  ls::Tensor a = ls::from_vector<int64_t>({5, 6});
  ls::Tensor b = ls::from_vector<int64_t>({1, 1});
  ls::Tensor divisor = ls::from_vector<int64_t>({1, 0});
  ls::Tensor made;
  const int line = __LINE__ + 4;
  ls::step([&] {
    b += 1;
    made = b * 2;
    a.copy_(ls::floor_divide(a, divisor));  // fails when run
  });
  try {
    ls::wait();
    ADD_FAILURE() << "the division by zero was not reported";
  } catch (const ls::Error& e) {
    // The error names the step and the failing op's line, not the line of the read.
    EXPECT_THAT(e.what(), HasSubstr("integer division by zero"));
    EXPECT_THAT(e.what(), HasSubstr("step_test.cpp:" + std::to_string(line)));
    EXPECT_THAT(e.what(), HasSubstr("rolled back"));
  }
  // Both tensors the failed program updated are at their values before the step; a tensor the
  // step made is poisoned.
  EXPECT_EQ(a.to_vector<int64_t>(), (std::vector<int64_t>{5, 6}));
  EXPECT_EQ(b.to_vector<int64_t>(), (std::vector<int64_t>{1, 1}));
  EXPECT_THROW(made.to_vector<int64_t>(), ls::Error);
  // The next step works.
  ls::step([&] { b += 1; });
  EXPECT_EQ(b.to_vector<int64_t>(), (std::vector<int64_t>{2, 2}));
}

TEST(Step, TensorsMadeByOtherThreadsAreNotPartOfTheStep) {
  ls::Tensor from_worker;
  EXPECT_THROW(ls::step([&] {
                 std::thread t([&] { from_worker = ls::from_vector<float>({1, 2}); });
                 t.join();
                 throw UserError(0);
               }),
               UserError);
  EXPECT_FALSE(from_worker.is_poisoned());
  EXPECT_EQ(from_worker.to_vector<float>(), (std::vector<float>{1, 2}));
}

TEST(Step, StepNumbersIncrease) {
  const int64_t before = ls::current_step();
  ls::step([] {});
  EXPECT_EQ(ls::current_step(), before + 1);
  EXPECT_FALSE(ls::in_step());
  ls::step([] { EXPECT_TRUE(ls::in_step()); });
}
