// Sizes and counts a user may pass by mistake (or on purpose) are refused with an ls::Error that
// names the limit, or handled within a bound: thread counts, narrow/slice/split lengths near
// 2^63, adaptive pooling to huge outputs, a module inside itself.
#include <gtest/gtest.h>

#include <lockstep/lockstep.h>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "unit/ops_test_util.h"

namespace ls = lockstep;

namespace {

constexpr int64_t kHuge = std::numeric_limits<int64_t>::max();

class HostileSizes : public ops_test::OnTestDevice {};

// The Error's message, or "" when `fn` throws nothing (an InternalError fails the test).
template <typename F>
std::string error_of(F fn) {
  try {
    fn();
  } catch (const ls::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(HostileThreads, ACountAboveTheLimitIsRefusedAndChangesNothing) {
  const int before = ls::num_threads();
  const std::string m = error_of([] { ls::set_num_threads(100000); });
  EXPECT_NE(m.find("1024"), std::string::npos) << m;
  EXPECT_NE(m.find("100000"), std::string::npos) << m;
  EXPECT_EQ(ls::num_threads(), before);
  EXPECT_NE(error_of([] { ls::set_num_threads(-1); }), "");
  EXPECT_NE(error_of([] { ls::set_num_threads(std::numeric_limits<int>::max()); }), "");
}

TEST_F(HostileSizes, NarrowWithAHugeLengthOrStartIsAnErrorNotAnOverflow) {
  const ls::Tensor x = ls::zeros({4, 3});
  for (auto [start, length] : {std::pair<int64_t, int64_t>{2, kHuge},
                               {kHuge, 1},
                               {-4, kHuge},
                               {std::numeric_limits<int64_t>::min(), 1},
                               {1, -kHuge}}) {
    SCOPED_TRACE(::testing::Message() << start << ", " << length);
    const std::string m = error_of([&] { ls::narrow(x, 0, start, length); });
    EXPECT_NE(m.find("narrow"), std::string::npos) << m;
    EXPECT_NE(m.find("do not fit"), std::string::npos) << m;
  }
  EXPECT_EQ(ls::narrow(x, 0, 2, 2).shape(), (ls::Shape{2, 3}));
}

TEST_F(HostileSizes, SliceAndSplitWithHugeValuesStayInRange) {
  const ls::Tensor x = ops_test::f32({0, 1, 2, 3, 4});
  EXPECT_EQ(ls::slice(x, 0, 1, kHuge, kHuge).to_vector<float>(), (std::vector<float>{1}));
  EXPECT_EQ(ls::slice(x, 0, -kHuge, kHuge, 2).to_vector<float>(), (std::vector<float>{0, 2, 4}));
  EXPECT_EQ(ls::index(x, {ls::Slice(kHuge, kHuge)}).numel(), 0);
  // Sizes whose sum wraps around to the axis' length.
  const std::string m = error_of([&] { ls::split(x, {kHuge, kHuge, 7}, 0); });
  EXPECT_NE(m.find("split"), std::string::npos) << m;
  EXPECT_NE(m.find("add up to"), std::string::npos) << m;
}

TEST_F(HostileSizes, AdaptiveAvgPoolRecordsAFewOpsWhateverItsOutputSize) {
  const ls::Tensor x = ls::rand({1, 2, 7, 9});
  ls::sync();
  ls::wait();  // programs still running count their nodes when they run
  ops_test::Delta nodes("executed_nodes");
  const ls::Tensor y = ls::nn::AdaptiveAvgPool2d({50, 60})(x);
  ls::sync();
  ls::wait();
  EXPECT_EQ(y.shape(), (ls::Shape{1, 2, 50, 60}));
  EXPECT_LT(nodes.get(), 1000);  // one op per output cell would be 3,000 and more
  // A huge output is recorded at once (and refused by its size when it would run).
  const ls::Tensor big = ls::nn::AdaptiveAvgPool2d({100000, 100000})(x);
  EXPECT_EQ(big.shape(), (ls::Shape{1, 2, 100000, 100000}));
}

namespace {
struct Holder : ls::nn::Module {
  void hold(const std::string& name, std::shared_ptr<ls::nn::Module> m) {
    register_module(name, std::move(m));
  }
};
}  // namespace

TEST(HostileModules, AModuleCannotContainItselfAtAnyDepth) {
  auto m = std::make_shared<Holder>();
  auto child = std::make_shared<Holder>();
  auto grandchild = std::make_shared<Holder>();
  m->hold("child", child);
  child->hold("grandchild", grandchild);
  grandchild->hold("linear", std::make_shared<ls::nn::Linear>(2, 2));
  std::string e = error_of([&] { m->hold("me", m); });
  EXPECT_NE(e.find("'me' as a child of itself"), std::string::npos) << e;
  e = error_of([&] { grandchild->hold("up", m); });
  EXPECT_NE(e.find("'up.child.grandchild'"), std::string::npos) << e;
  // Nothing was registered: traversals end and see each module once.
  EXPECT_EQ(m->named_modules().size(), 4u);
  EXPECT_EQ(m->parameters().size(), 2u);
  EXPECT_EQ(m->state_dict().size(), 2u);
  // Sharing a module in two places (not a cycle) stays allowed.
  auto shared = std::make_shared<ls::nn::Linear>(2, 2);
  m->hold("a", shared);
  child->hold("b", shared);
  EXPECT_EQ(m->parameters().size(), 4u);
}

// Sampling from invalid weights or probabilities is an Error when the program runs (no sync when
// it is recorded), naming what was wrong, as PyTorch's checks do; valid ones still draw.
TEST_F(HostileSizes, SamplingFromInvalidWeightsFailsTheRunNamingWhy) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const std::vector<float>& w : std::vector<std::vector<float>>{
           {0, 0, 0}, {1, -0.5f, 2}, {1, inf, 1}, {nan, 1, 1}, {-1, -1, -1}}) {
    for (bool replacement : {false, true}) {
      SCOPED_TRACE(::testing::PrintToString(w) + (replacement ? " with" : " without"));
      ls::Tensor draw;
      // Recording reads nothing: the weights are only known when the program runs.
      ASSERT_NO_THROW(draw = ls::multinomial(ls::from_vector<float>(w), 2, replacement));
      const std::string e = error_of([&] { (void)draw.to_vector<int64_t>(); });
      EXPECT_NE(e.find("multinomial: the weights hold a negative, infinite or NaN value"),
                std::string::npos)
          << e;
    }
  }
  // One bad row of two fails the batch; good rows draw as before.
  ls::Tensor rows = ls::reshape(ls::from_vector<float>({1, 2, 3, 0, 0, 0}), {2, 3});
  EXPECT_NE(error_of([&] { (void)ls::multinomial(rows, 1).to_vector<int64_t>(); }), "");
  const std::vector<int64_t> ok =
      ls::multinomial(ls::from_vector<float>({0, 0, 5, 0}), 3, true).to_vector<int64_t>();
  EXPECT_EQ(ok, (std::vector<int64_t>{2, 2, 2}));

  for (float p : {-0.1f, 1.5f, nan, inf}) {
    SCOPED_TRACE(p);
    ls::Tensor draw;
    ASSERT_NO_THROW(draw = ls::bernoulli(ls::from_vector<float>({0.5f, p})));
    const std::string e = error_of([&] { (void)draw.to_vector<float>(); });
    EXPECT_NE(e.find("bernoulli: a probability is below 0, above 1 or NaN"), std::string::npos)
        << e;
  }
  EXPECT_EQ(ls::bernoulli(ls::from_vector<float>({0, 1, 1, 0})).to_vector<float>(),
            (std::vector<float>{0, 1, 1, 0}));
}
