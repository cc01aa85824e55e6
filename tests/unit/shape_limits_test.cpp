// Shapes whose element or byte count overflows (or nears int64's limit) are refused where they
// are recorded, with an ls::Error naming the op; nothing crashes, aborts or computes a wrong
// count. The stress test records random shapes near the limits through creation, movement,
// elementwise and reduction ops; LOCKSTEP_SHAPE_STRESS_CASES runs more of them by hand.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <lockstep/lockstep.h>
#include "unit/ops_test_util.h"

namespace ls = lockstep;
using ::testing::HasSubstr;

namespace {

constexpr int64_t kMaxBytes = int64_t{1} << 60;

// The shape's byte count at `elem` bytes an element, or -1 when it (or the product of its non-zero
// sizes, for an empty shape) passes the limit.
int64_t bytes_of(const ls::Shape& s, int64_t elem) {
  int64_t b = elem;
  bool empty = false;
  for (int64_t d : s) {
    empty = empty || d == 0;
    if (d != 0 && (__builtin_mul_overflow(b, d, &b) || b > kMaxBytes)) return -1;
  }
  return empty ? 0 : b;
}

}  // namespace

TEST(ShapeLimits, OverflowingShapesAreRefusedWhereTheyAreRecorded) {
  const int64_t big = int64_t{1} << 62;
  // Element counts that wrap around to small numbers.
  std::string m = ops_test::error_of([&] { (void)ls::ones({big + 1, 4}); });
  EXPECT_THAT(m, HasSubstr("full"));
  EXPECT_THAT(m, HasSubstr("too large"));
  EXPECT_THAT(ops_test::error_of([&] {
                (void)ls::ones({int64_t{1} << 31, int64_t{1} << 31});
              }),
              HasSubstr("too large"));
  EXPECT_THAT(ops_test::error_of([&] { (void)ls::zeros({big}); }), HasSubstr("too large"));
  EXPECT_THAT(ops_test::error_of([&] { (void)ls::rand({big, big}); }), HasSubstr("too large"));
  // Through ops: a broadcast or a reshape to a shape that overflows.
  const ls::Tensor x = ls::ones({4});
  m = ops_test::error_of([&] { (void)ls::expand(ls::reshape(x, {4, 1}), {4, big}); });
  EXPECT_THAT(m, HasSubstr("expand"));
  EXPECT_THAT(m, HasSubstr("too large"));
  EXPECT_THAT(ops_test::error_of([&] {
                (void)ls::reshape(x, {big + 1, 4});
              }),
              HasSubstr("reshape"));
  // An empty value's other sizes count too (kernels multiply them in any order).
  EXPECT_THAT(ops_test::error_of([&] { (void)ls::ones({0, big, big}); }), HasSubstr("too large"));
  EXPECT_EQ(ls::ones({0, int64_t{1} << 40}).numel(), 0);
  // The largest allowed values are recorded (not allocated until something reads them).
  EXPECT_EQ(ls::ones({int64_t{1} << 30, int64_t{1} << 28}).numel(), int64_t{1} << 58);
}

TEST(ShapeLimits, RandomShapesNearTheLimitsNeverCrash) {
  const char* env = std::getenv("LOCKSTEP_SHAPE_STRESS_CASES");
  const int cases = env ? std::atoi(env) : 300;
  std::mt19937_64 rng(12345);
  const std::vector<int64_t> sizes = {0,
                                      1,
                                      2,
                                      3,
                                      7,
                                      (int64_t{1} << 31) - 1,
                                      int64_t{1} << 31,
                                      (int64_t{1} << 31) + 1,
                                      int64_t{1} << 32,
                                      int64_t{1} << 40,
                                      int64_t{1} << 58,
                                      int64_t{1} << 61,
                                      int64_t{1} << 62,
                                      (int64_t{1} << 62) + 1,
                                      INT64_MAX};
  int refused = 0, recorded = 0, computed = 0;
  for (int c = 0; c < cases; ++c) {
    ls::Shape s(1 + rng() % 4);
    for (int64_t& d : s) d = sizes[rng() % sizes.size()];
    const int64_t bytes = bytes_of(s, 4);
    const int kind = static_cast<int>(rng() % 5);
    SCOPED_TRACE(ls::shape_str(s) + " kind " + std::to_string(kind));
    try {
      ls::Tensor t = kind == 0 ? ls::ones(s) : kind == 1 ? ls::rand(s) : ls::full(s, 2.0);
      ASSERT_GE(bytes, 0) << "recorded a shape whose byte count passes the limit";
      EXPECT_EQ(t.numel(), bytes / 4);
      ls::Tensor y = kind == 3 ? ls::sum(t + 1.0) : kind == 4 ? ls::mean(ls::reshape(t, {-1})) : t;
      ++recorded;
      if (bytes <= (1 << 16)) {  // small enough to compute: the values are right
        const float v = ls::sum(y).item<float>();
        if (kind == 3) {
          EXPECT_EQ(v, 3.0f * static_cast<float>(t.numel()));
        } else if (kind == 0) {
          EXPECT_EQ(v, static_cast<float>(t.numel()));
        }
        ++computed;
      }
    } catch (const ls::Error& e) {
      ++refused;
      if (bytes >= 0) {
        // A valid shape may only be refused for what the op itself cannot do (mean of an empty
        // value's nothing, a reshape of -1 with a zero size), never for its size.
        EXPECT_THAT(e.what(), ::testing::Not(HasSubstr("too large")));
      }
    }
  }
  EXPECT_GT(refused, 0);
  EXPECT_GT(recorded, 0);
  EXPECT_GT(computed, 0);
}
