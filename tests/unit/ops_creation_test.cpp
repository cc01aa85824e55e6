// Creation ops: constants, ramps, host uploads in every dtype, and the seeded random generator
// (same seed same numbers, uniform range, rough moments of randn and randint).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>

#include "unit/ops_test_util.h"

namespace {

using namespace ops_test;

using OpsCreation = OnTestDevice;
using OpsRandom = OnTestDevice;

TEST_F(OpsCreation, ConstantsInEveryDtype) {
  expect_tensor<float>(ls::zeros({2, 3}), {2, 3}, {0, 0, 0, 0, 0, 0});
  expect_tensor<double>(ls::ones({2}, ls::f64), {2}, {1, 1});
  expect_tensor<int64_t>(ls::ones({1, 2}, ls::i64), {1, 2}, {1, 1});
  expect_tensor<int32_t>(ls::full({3}, -7, ls::i32), {3}, {-7, -7, -7});
  expect_tensor<int64_t>(ls::full({2}, 4.0, ls::i64), {2}, {4, 4});  // a whole float is fine
  expect_tensor<bool>(ls::full({2}, true, ls::boolean), {2}, {true, true});
  expect_tensor<bool>(ls::zeros({2}, ls::boolean), {2}, {false, false});
  expect_tensor<bool>(ls::ones({1}, ls::boolean), {1}, {true});
  expect_tensor<double>(ls::full({2, 2}, 2.5, ls::f64), {2, 2}, {2.5, 2.5, 2.5, 2.5});
  expect_tensor<float>(ls::full({}, 3.5), {}, {3.5});
  expect_tensor<float>(ls::zeros({0, 3}), {0, 3}, {});
  expect_tensor<int64_t>(ls::scalar_tensor(9, ls::i64), {}, {9});
  expect_tensor<float>(ls::scalar_tensor(0.25), {}, {0.25});
  EXPECT_EQ(ls::zeros({2}).dtype(), ls::f32);  // the default dtype
}

TEST_F(OpsCreation, LikeVariantsKeepShapeAndDtype) {
  const ls::Tensor x = i32({1, 2, 3, 4, 5, 6}, {2, 3});
  expect_tensor<int32_t>(ls::zeros_like(x), {2, 3}, {0, 0, 0, 0, 0, 0});
  expect_tensor<int32_t>(ls::ones_like(x), {2, 3}, {1, 1, 1, 1, 1, 1});
  expect_tensor<int32_t>(ls::full_like(x, 5), {2, 3}, {5, 5, 5, 5, 5, 5});
  expect_tensor<double>(ls::full_like(f64({1}), -0.5), {1}, {-0.5});
  expect_tensor<bool>(ls::ones_like(b8({false, false})), {2}, {true, true});
  expect_tensor<float>(ls::zeros_like(ls::scalar_tensor(4.0f)), {}, {0});
}

TEST_F(OpsCreation, Arange) {
  expect_tensor<int64_t>(ls::arange(5), {5}, {0, 1, 2, 3, 4});
  expect_tensor<int64_t>(ls::arange(2, 11, 3), {3}, {2, 5, 8});
  expect_tensor<int64_t>(ls::arange(2, 12, 3), {4}, {2, 5, 8, 11});
  expect_tensor<int64_t>(ls::arange(5, 0, -2), {3}, {5, 3, 1});
  expect_tensor<int64_t>(ls::arange(-3, 0, 1), {3}, {-3, -2, -1});
  expect_tensor<int32_t>(ls::arange(4, ls::i32), {4}, {0, 1, 2, 3});
  expect_tensor<float>(ls::arange(0, 1, 0.25, ls::f32), {4}, {0, 0.25, 0.5, 0.75});
  expect_tensor<double>(ls::arange(1.5, ls::f64), {2}, {0, 1});
  expect_tensor<double>(ls::arange(1, -1, -0.5, ls::f64), {4}, {1, 0.5, 0, -0.5});
  expect_tensor<int64_t>(ls::arange(0), {0}, {});
  expect_tensor<int64_t>(ls::arange(3, 3, 1), {0}, {});
  expect_tensor<int64_t>(ls::arange(5, 0, 1), {0}, {});
}

TEST_F(OpsCreation, FromVectorAndFromBlob) {
  expect_tensor<float>(ls::from_vector<float>({1.5f, -2}), {2}, {1.5, -2});
  expect_tensor<double>(ls::from_vector<double>({1, 2, 3, 4, 5, 6}, {3, 2}), {3, 2},
                        {1, 2, 3, 4, 5, 6});
  expect_tensor<int32_t>(ls::from_vector<int32_t>({INT32_MIN, INT32_MAX}), {2},
                         {INT32_MIN, INT32_MAX});
  expect_tensor<int64_t>(ls::from_vector<int64_t>({INT64_MIN, 0, INT64_MAX}, {1, 3}), {1, 3},
                         {INT64_MIN, 0, INT64_MAX});
  expect_tensor<bool>(ls::from_vector<bool>({true, false, true}), {3}, {true, false, true});
  expect_tensor<float>(ls::from_vector<float>({}), {0}, {});
  expect_tensor<float>(ls::from_vector<float>({}, {2, 0}), {2, 0}, {});
  expect_tensor<float>(ls::from_vector<float>({7}, {1, 1, 1}), {1, 1, 1}, {7});

  const double d[4] = {0.5, 1.5, 2.5, 3.5};
  expect_tensor<double>(ls::from_blob(d, {2, 2}, ls::f64, ls::default_device()), {2, 2},
                        {0.5, 1.5, 2.5, 3.5});
  const int32_t i[1] = {42};
  expect_tensor<int32_t>(ls::from_blob(i, {}, ls::i32, ls::default_device()), {}, {42});
  const bool b[2] = {false, true};
  expect_tensor<bool>(ls::from_blob(b, {2}, ls::boolean, ls::default_device()), {2}, {false, true});
  expect_tensor<float>(ls::from_blob(nullptr, {0}, ls::f32, ls::default_device()), {0}, {});
  // The data is copied: changing the host array afterwards does not change the tensor.
  float host[2] = {1, 2};
  const ls::Tensor t = ls::from_blob(host, {2}, ls::f32, ls::default_device());
  host[0] = 100;
  expect_tensor<float>(t, {2}, {1, 2});
  EXPECT_FALSE(t.is_pending());
}

TEST_F(OpsCreation, ReadsAndPrinting) {
  const ls::Tensor t = f32({1, 2, 3, 4}, {2, 2});
  EXPECT_EQ(t.to_string(), "[[1, 2],\n [3, 4]]");
  EXPECT_EQ(b8({true, false}).to_string(), "[true, false]");
  EXPECT_EQ(ls::scalar_tensor(7, ls::i64).item<int64_t>(), 7);
  EXPECT_EQ(f64({2.5}, {1, 1}).item<double>(), 2.5);
  EXPECT_EQ(b8({true}).item<bool>(), true);
  EXPECT_EQ(i32({-3}).item<int32_t>(), -3);
  EXPECT_EQ(t.dim(), 2);
  EXPECT_EQ(t.size(-1), 2);
  EXPECT_EQ(t.numel(), 4);
}

// ---- random -------------------------------------------------------------------------------
TEST_F(OpsRandom, SameSeedSameNumbers) {
  ls::manual_seed(42);
  const std::vector<float> a = ls::rand({1000}).to_vector<float>();
  const std::vector<float> a2 = ls::rand({1000}).to_vector<float>();
  ls::manual_seed(42);
  const std::vector<float> b = ls::rand({1000}).to_vector<float>();
  EXPECT_EQ(a, b);
  EXPECT_NE(a, a2);  // the generator advances
  ls::manual_seed(43);
  EXPECT_NE(ls::rand({1000}).to_vector<float>(), a);

  ls::manual_seed(7);
  const std::vector<double> n1 = ls::randn({100}, ls::f64).to_vector<double>();
  const std::vector<int64_t> r1 = ls::randint(0, 1000, {100}).to_vector<int64_t>();
  ls::manual_seed(7);
  EXPECT_EQ(ls::randn({100}, ls::f64).to_vector<double>(), n1);
  EXPECT_EQ(ls::randint(0, 1000, {100}).to_vector<int64_t>(), r1);
}

TEST_F(OpsRandom, DrawsAreAFunctionOfSeedAndCounter) {
  // Two draws of 10 and 5 give the same numbers as one draw of 15.
  ls::manual_seed(5);
  std::vector<double> parts = ls::rand({10}, ls::f64).to_vector<double>();
  const std::vector<double> tail = ls::rand({5}, ls::f64).to_vector<double>();
  parts.insert(parts.end(), tail.begin(), tail.end());
  ls::manual_seed(5);
  EXPECT_EQ(ls::rand({3, 5}, ls::f64).to_vector<double>(), parts);
  // Unread draws still advance the generator.
  ls::manual_seed(5);
  { ls::Tensor unused = ls::rand({10}, ls::f64); }
  EXPECT_EQ(ls::rand({5}, ls::f64).to_vector<double>(), tail);
}

TEST_F(OpsRandom, GeneratorStateCountsDraws) {
  ls::manual_seed(11);
  expect_tensor<int64_t>(ls::generator_state(), {2}, {11, 0});
  (void)ls::rand({2, 5});
  expect_tensor<int64_t>(ls::generator_state(), {2}, {11, 10});
  (void)ls::randn({3});  // Box-Muller draws two numbers per output
  expect_tensor<int64_t>(ls::generator_state(), {2}, {11, 16});
  (void)ls::randint(0, 5, {4});
  expect_tensor<int64_t>(ls::generator_state(), {2}, {11, 20});
  (void)ls::rand({0});
  expect_tensor<int64_t>(ls::generator_state(), {2}, {11, 20});
}

TEST_F(OpsRandom, RandIsUniformInUnitInterval) {
  ls::manual_seed(123);
  for (ls::DType dt : {ls::f32, ls::f64}) {
    const ls::Tensor u = ls::rand({100, 100}, dt);
    EXPECT_EQ(u.shape(), (ls::Shape{100, 100}));
    EXPECT_EQ(u.dtype(), dt);
    const std::vector<double> v = ls::cast(u, ls::f64).to_vector<double>();
    double sum = 0, lo = 1, hi = 0;
    int below_tenth = 0;
    for (double x : v) {
      EXPECT_GE(x, 0.0);
      EXPECT_LT(x, 1.0);
      sum += x;
      lo = std::min(lo, x);
      hi = std::max(hi, x);
      below_tenth += x < 0.1;
    }
    EXPECT_NEAR(sum / v.size(), 0.5, 0.015);  // std of the mean: 0.29 / 100
    EXPECT_LT(lo, 0.001);
    EXPECT_GT(hi, 0.999);
    EXPECT_NEAR(below_tenth, 1000, 120);
  }
  expect_tensor<float>(ls::rand({0, 4}), {0, 4}, {});
  EXPECT_EQ(ls::rand({}).shape(), ls::Shape{});
}

TEST_F(OpsRandom, RandnHasZeroMeanUnitStd) {
  ls::manual_seed(2024);
  for (ls::DType dt : {ls::f32, ls::f64}) {
    const ls::Tensor z = ls::randn({10000}, dt);
    EXPECT_EQ(z.dtype(), dt);
    const std::vector<double> v = ls::cast(z, ls::f64).to_vector<double>();
    double sum = 0, sq = 0;
    int within_one = 0;
    for (double x : v) {
      ASSERT_TRUE(std::isfinite(x));
      sum += x;
      sq += x * x;
      within_one += std::abs(x) < 1;
    }
    const double mean = sum / v.size();
    const double std = std::sqrt(sq / v.size() - mean * mean);
    EXPECT_NEAR(mean, 0.0, 0.05);  // std of the mean: 0.01
    EXPECT_NEAR(std, 1.0, 0.05);
    EXPECT_NEAR(within_one / 10000.0, 0.6827, 0.03);
  }
  EXPECT_EQ(ls::randn({2, 0, 3}).shape(), (ls::Shape{2, 0, 3}));
  EXPECT_TRUE(std::isfinite(ls::randn({}).item<float>()));
}

TEST_F(OpsRandom, LikeFormsTakeShapeAndDtypeAndDrawTheSameStream) {
  const ls::Tensor x = ls::zeros({3, 4}, ls::f64);
  ls::manual_seed(5);
  const ls::Tensor u = ls::rand_like(x);
  const ls::Tensor z = ls::randn_like(x);
  EXPECT_EQ(u.shape(), (ls::Shape{3, 4}));
  EXPECT_EQ(z.dtype(), ls::f64);
  ls::manual_seed(5);
  EXPECT_EQ(u.to_vector<double>(), ls::rand({3, 4}, ls::f64).to_vector<double>());
  EXPECT_EQ(z.to_vector<double>(), ls::randn({3, 4}, ls::f64).to_vector<double>());
  EXPECT_LS_ERROR(ls::randn_like(ls::zeros({2}, ls::i64)), "randn", "float");
  EXPECT_LS_ERROR(ls::rand_like(ls::Tensor()), "rand_like", "empty");
}

TEST_F(OpsRandom, RandintCoversTheHalfOpenRange) {
  ls::manual_seed(99);
  const std::vector<int64_t> v = ls::randint(-3, 4, {10000}).to_vector<int64_t>();
  std::set<int64_t> seen(v.begin(), v.end());
  EXPECT_EQ(seen, (std::set<int64_t>{-3, -2, -1, 0, 1, 2, 3}));
  double sum = 0;
  for (int64_t x : v) sum += static_cast<double>(x);
  EXPECT_NEAR(sum / v.size(), 0.0, 0.1);
  const ls::Tensor r32 = ls::randint(5, 6, {4}, ls::i32);
  expect_tensor<int32_t>(r32, {4}, {5, 5, 5, 5});
  const std::vector<int64_t> big = ls::randint(0, int64_t{1} << 40, {100}).to_vector<int64_t>();
  for (int64_t x : big) {
    EXPECT_GE(x, 0);
    EXPECT_LT(x, int64_t{1} << 40);
  }
  EXPECT_GT(*std::max_element(big.begin(), big.end()), int64_t{1} << 39);
  // The full int64 range (its width overflows int64).
  const std::vector<int64_t> full = ls::randint(INT64_MIN, INT64_MAX, {1000}).to_vector<int64_t>();
  EXPECT_LT(*std::min_element(full.begin(), full.end()), INT64_MIN / 2);
  EXPECT_GT(*std::max_element(full.begin(), full.end()), INT64_MAX / 2);
  // Narrow ranges far from 0 are exact (no rounding through double).
  const int64_t far = (int64_t{1} << 60) + 1;
  const std::vector<int64_t> f = ls::randint(far, far + 2, {200}).to_vector<int64_t>();
  EXPECT_EQ(std::set<int64_t>(f.begin(), f.end()), (std::set<int64_t>{far, far + 1}));
  const std::vector<int64_t> top =
      ls::randint(INT64_MAX - 2, INT64_MAX, {200}).to_vector<int64_t>();
  EXPECT_EQ(std::set<int64_t>(top.begin(), top.end()),
            (std::set<int64_t>{INT64_MAX - 2, INT64_MAX - 1}));
  const std::vector<int32_t> i32s =
      ls::randint(INT32_MIN, INT32_MAX, {1000}, ls::i32).to_vector<int32_t>();
  EXPECT_LT(*std::min_element(i32s.begin(), i32s.end()), INT32_MIN / 2);
  EXPECT_GT(*std::max_element(i32s.begin(), i32s.end()), INT32_MAX / 2);
}

}  // namespace
