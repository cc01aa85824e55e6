// The op table (ir/ops.def) says what each op is, and the compiler believes it: a test per column
// that matters for correctness. Chiefly: every op that can fail at run time is marked so, because a
// step that fails in an op the backend thinks infallible may already have overwritten a parameter
// it updated in place, and could not roll back.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <lockstep/lockstep.h>
#include "backends/cpu/passes.h"
#include "ir/ir.h"
#include "plan/pipeline.h"
#include "unit/ops_test_util.h"

namespace ls = lockstep;
using ls::ir::Op;
using ls::ir::OpFamily;
using ops_test::bits;
using ops_test::Delta;

namespace {

// A failure case of one fallible op: given `p`, a parameter the step has just updated in place,
// records the op (reading p, so that it runs after the update) on bad data.
using FailureCase = std::function<ls::Tensor(const ls::Tensor& p)>;

ls::Tensor ints_of(const ls::Tensor& p, int64_t n) {
  return ls::slice(ls::cast(p, ls::DType::I64), 0, 0, n);
}

const std::map<Op, FailureCase>& failure_cases() {
  static const std::map<Op, FailureCase> cases = {
      {Op::Div,
       [](const ls::Tensor& p) {
         return ls::floor_divide(ints_of(p, 2), ls::from_vector<int64_t>({1, 0}));
       }},
      {Op::Fmod,
       [](const ls::Tensor& p) {
         return ls::fmod(ints_of(p, 2), ls::from_vector<int64_t>({3, 0}));
       }},
      {Op::Pow,
       [](const ls::Tensor& p) {
         return ls::pow(ints_of(p, 2), ls::from_vector<int64_t>({2, -1}));
       }},
      {Op::Check,
       [](const ls::Tensor& p) {
         // Negative weights (a run-time argument check of a composite op).
         return ls::multinomial(ls::sub(ls::slice(p, 0, 0, 3), 1e9), 1);
       }},
      {Op::Gather,
       [](const ls::Tensor& p) {
         return ls::gather(p, 0, ls::from_vector<int64_t>({0, 1, int64_t{1} << 20}));
       }},
      {Op::ScatterAdd,
       [](const ls::Tensor& p) {
         return ls::scatter_add(p, 0, ls::from_vector<int64_t>({3, -2}),
                                ls::from_vector<float>({1, 2}));
       }},
      {Op::MaxPool2dBackward,
       [](const ls::Tensor& p) {
         // The gradient of a 2x2 pooling of a 4x4 plane, with an index outside the plane.
         const ls::Tensor gy = ls::reshape(ls::slice(p, 0, 0, 4), {1, 1, 2, 2});
         const ls::Tensor idx = ls::reshape(ls::from_vector<int64_t>({0, 3, 8, 16}), {1, 1, 2, 2});
         return ls::max_pool2d_backward(gy, idx, {1, 1, 4, 4}, {.kernel = {2, 2}});
       }},
  };
  return cases;
}

// Ops whose failures need more than one process: the data parallel tests (tests/dist) cover them
// (a rank that misses the deadline: every rank raises, the step is undone).
bool needs_peers(Op op) { return ls::ir::is_collective(op); }

bool can_fail_somewhere(Op op) {
  return ls::ir::may_fail(op, ls::DType::I64) || ls::ir::may_fail(op, ls::DType::F32);
}

}  // namespace

TEST(OpTable, EveryOpMarkedFallibleHasAFailureCase) {
  for (int k = 0; k < ls::ir::kNumOps; ++k) {
    const Op op = static_cast<Op>(k);
    if (!can_fail_somewhere(op) || needs_peers(op)) continue;
    EXPECT_TRUE(failure_cases().count(op))
        << ls::ir::op_info(op).name << " may fail at run time but has no failure case here";
  }
}

// Each case fails inside a step, after the step has updated a parameter in place: the parameter
// is back, bit for bit, and the failure is counted as a run-time rollback. An op that fails but is
// not marked so in the table would leave the update behind.
TEST(OpTable, EachFallibleOpRollsBackAStepThatFailsInIt) {
  for (const auto& [op, make_failure] : failure_cases()) {
    SCOPED_TRACE(ls::ir::op_info(op).name);
    EXPECT_TRUE(can_fail_somewhere(op)) << "a failure case for an op the table says cannot fail";
    for (const char* device : {"cpu", "ref"}) {
      SCOPED_TRACE(device);
      const ls::Device saved = ls::default_device();
      ls::set_default_device(ls::parse_device(device));
      ls::Tensor p = ls::arange(1 << 16).to(ls::DType::F32);
      ls::sync();
      ls::wait();
      const std::vector<uint32_t> before = bits(p);
      Delta rollbacks("run_time_rollbacks");
      ls::Tensor out;
      ls::step([&] {
        p.mul_(0.5);
        out = make_failure(p);
      });
      EXPECT_THROW(ls::wait(), ls::Error);
      EXPECT_EQ(rollbacks.get(), 1);
      EXPECT_EQ(bits(p), before) << "the in-place update of the failed step is undone";
      // The same program with good data commits.
      ls::step([&] { p.mul_(0.5); });
      EXPECT_EQ(p.to_vector<float>()[2], 1.0f);
      ls::set_default_device(saved);
    }
  }
}

TEST(OpTable, IndicesAreCheckedAheadUnlessTheirOwnPoolingComputedThem) {
  // The plan's steps for a max pooling gradient: through indices from outside, a check step
  // first; through the indices the same pooling computed (in range by construction), none.
  auto steps = [](const std::string& graph) {
    lockstep::plan::Plan p(ls::ir::from_text(graph));
    for (const lockstep::plan::Pass& pass : lockstep::backends::cpu::pipeline()) pass.run(p);
    std::string out;
    for (const lockstep::plan::Step& s : p.steps)
      out += std::string(s.label) + (s.can_fail ? " (may fail)" : "") + "\n";
    return out;
  };
  EXPECT_EQ(steps("%0 = data(#0) f32[1, 1, 2, 2]\n"
                  "%1 = data(#1) i64[1, 1, 2, 2]\n"
                  "%2 = max_pool2d_backward(%0, %1) {2, 2, 2, 2, 0, 0, 1} f32[1, 1, 4, 4]\n"
                  "return %2\n"),
            "check (may fail)\nmax_pool2d_backward\n");
  EXPECT_EQ(steps("%0 = data(#0) f32[1, 1, 4, 4]\n"
                  "%1 = max_pool2d_indices(%0) {2, 2, 2, 2, 0, 0, 1} i64[1, 1, 2, 2]\n"
                  "%2 = data(#1) f32[1, 1, 2, 2]\n"
                  "%3 = max_pool2d_backward(%2, %1) {2, 2, 2, 2, 0, 0, 1} f32[1, 1, 4, 4]\n"
                  "return %3\n"),
            "max_pool2d_indices\nmax_pool2d_backward\n");
}

TEST(OpTable, FamiliesAgreeWithArityAndGradients) {
  for (int k = 0; k < ls::ir::kNumOps; ++k) {
    const Op op = static_cast<Op>(k);
    const ls::ir::OpInfo& info = ls::ir::op_info(op);
    SCOPED_TRACE(info.name);
    EXPECT_NE(std::string(info.user_name), "");
    Op back{};
    ASSERT_TRUE(ls::ir::op_from_name(info.name, &back));
    EXPECT_EQ(back, op);
    switch (info.family) {
      case OpFamily::Leaf:
        EXPECT_EQ(info.arity, 0);
        break;
      case OpFamily::Unary:
        EXPECT_EQ(info.arity, 1);
        break;
      case OpFamily::Binary:
        EXPECT_EQ(info.arity, 2);
        break;
      case OpFamily::Comparison:
        EXPECT_EQ(info.arity, 2);
        EXPECT_FALSE(info.differentiable) << "a bool result has no gradient";
        break;
      case OpFamily::Select:
        EXPECT_EQ(info.arity, 3);
        break;
      case OpFamily::Random:
      case OpFamily::Reduction:
      case OpFamily::Movement:
      case OpFamily::Index:
      case OpFamily::Contraction:
      case OpFamily::Convolution:
      case OpFamily::Pooling:
      case OpFamily::Collective:
      case OpFamily::Recurrent:
        break;
    }
    if (ls::ir::index_operand(op) >= 0) {
      EXPECT_TRUE(ls::ir::may_fail(op, ls::DType::F32));
    }
  }
  EXPECT_STREQ(ls::ir::user_name(Op::MatMul), "matmul");
  EXPECT_STREQ(ls::ir::user_name(Op::Add), "add");
  EXPECT_TRUE(ls::ir::may_fail(Op::Div, ls::DType::I64));
  EXPECT_FALSE(ls::ir::may_fail(Op::Div, ls::DType::F32));
}
