// Elementwise ops against hand-computed values: every unary and binary op, in every dtype it
// admits, in tensor/tensor, tensor/scalar and scalar/tensor forms, with NumPy broadcasting,
// size-1 and empty dims, 0-d tensors; where, cast and clamp.
#include <cmath>
#include <limits>
#include <numbers>

#include "unit/ops_test_util.h"

namespace {

using namespace ops_test;

using OpsBoolUnary = OnTestDevice;
using OpsBoolBinary = OnTestDevice;
using OpsBroadcast = OnTestDevice;
using OpsWhere = OnTestDevice;
using OpsCast = OnTestDevice;
using OpsClamp = OnTestDevice;

template <typename T>
class OpsFloatUnary : public OnTestDevice {};
using FloatTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(OpsFloatUnary, FloatTypes);

template <typename T>
ls::Tensor t1(const std::vector<T>& v) {
  return tensor<T>(v);
}

TYPED_TEST(OpsFloatUnary, Arithmetic) {
  using T = TypeParam;
  constexpr T nan = std::numeric_limits<T>::quiet_NaN();
  constexpr T inf = std::numeric_limits<T>::infinity();
  expect_tensor<T>(ls::neg(t1<T>({1.5, -2, 0})), {3}, {-1.5, 2, 0});
  expect_tensor<T>(-t1<T>({1.5, -2}), {2}, {-1.5, 2});
  expect_tensor<T>(ls::abs(t1<T>({-3, 2.5, 0, -inf})), {4}, {3, 2.5, 0, inf});
  expect_tensor<T>(ls::relu(t1<T>({-1, 0, 2.5, nan})), {4}, {0, 0, 2.5, nan});
  expect_tensor<T>(ls::floor(t1<T>({1.5, -1.5, 2, -0.2})), {4}, {1, -2, 2, -1});
  expect_tensor<T>(ls::ceil(t1<T>({1.5, -1.5, 2, -0.2})), {4}, {2, -1, 2, 0});
  expect_tensor<T>(ls::sign(t1<T>({-3, 0, 2.5, nan, -inf})), {5}, {-1, 0, 1, nan, -1});
  expect_tensor<T>(ls::square(t1<T>({-3, 0.5})), {2}, {9, 0.25});
}

TYPED_TEST(OpsFloatUnary, Transcendental) {
  using T = TypeParam;
  constexpr T nan = std::numeric_limits<T>::quiet_NaN();
  constexpr T inf = std::numeric_limits<T>::infinity();
  constexpr T e = std::numbers::e_v<T>;
  constexpr T pi = std::numbers::pi_v<T>;
  expect_tensor<T>(ls::exp(t1<T>({0, 1, -1, -inf, inf})), {5},
                   {1, 2.718281828459045, 0.36787944117144233, 0, inf});
  expect_tensor<T>(ls::log(t1<T>({1, e, 0, -1, inf})), {5}, {0, 1, -inf, nan, inf});
  expect_tensor<T>(ls::sqrt(t1<T>({4, 2, 0, -1})), {4}, {2, 1.4142135623730951, 0, nan});
  expect_tensor<T>(ls::rsqrt(t1<T>({4, 0.25, 0})), {3}, {0.5, 2, inf});
  expect_tensor<T>(ls::tanh(t1<T>({0, 1, -1, 20})), {4},
                   {0, 0.7615941559557649, -0.7615941559557649, 1});
  expect_tensor<T>(ls::sigmoid(t1<T>({0, 2, -2, -1000, 1000})), {5},
                   {0.5, 0.8807970779778823, 0.11920292202211755, 0, 1});
  expect_tensor<T>(ls::sin(t1<T>({0, pi / 2, pi / 6})), {3}, {0, 1, 0.5}, 1e-6);
  expect_tensor<T>(ls::cos(t1<T>({0, pi, pi / 3})), {3}, {1, -1, 0.5}, 1e-6);
}

TYPED_TEST(OpsFloatUnary, LogicalNotAndIsFinite) {
  using T = TypeParam;
  constexpr T nan = std::numeric_limits<T>::quiet_NaN();
  constexpr T inf = std::numeric_limits<T>::infinity();
  expect_tensor<bool>(ls::logical_not(t1<T>({0, 1.5, nan, -0.0})), {4}, {true, false, false, true});
  expect_tensor<bool>(!t1<T>({0, 2}), {2}, {true, false});
  expect_tensor<bool>(ls::isfinite(t1<T>({1, inf, -inf, nan, 0})), {5},
                      {true, false, false, false, true});
}

TYPED_TEST(OpsFloatUnary, ZeroDimAndEmpty) {
  using T = TypeParam;
  expect_tensor<T>(ls::exp(ls::scalar_tensor(0.0, ls::dtype_of<T>())), {}, {1});
  expect_tensor<T>(ls::neg(ls::zeros({2, 0}, ls::dtype_of<T>())), {2, 0}, {});
  expect_tensor<bool>(ls::isfinite(ls::zeros({0}, ls::dtype_of<T>())), {0}, {});
}

template <typename T>
class OpsIntUnary : public OnTestDevice {};
using IntTypes = ::testing::Types<int32_t, int64_t>;
TYPED_TEST_SUITE(OpsIntUnary, IntTypes);

TYPED_TEST(OpsIntUnary, Arithmetic) {
  using T = TypeParam;
  constexpr T lo = std::numeric_limits<T>::min();
  expect_tensor<T>(ls::neg(t1<T>({5, -3, 0})), {3}, {-5, 3, 0});
  expect_tensor<T>(ls::neg(t1<T>({lo})), {1}, {lo});  // wraps
  expect_tensor<T>(ls::abs(t1<T>({-5, 3, 0, lo})), {4}, {5, 3, 0, lo});
  expect_tensor<T>(ls::relu(t1<T>({-5, 3, 0})), {3}, {0, 3, 0});
  expect_tensor<T>(ls::sign(t1<T>({-5, 3, 0})), {3}, {-1, 1, 0});
  expect_tensor<T>(ls::floor(t1<T>({-5, 3})), {2}, {-5, 3});
  expect_tensor<T>(ls::ceil(t1<T>({-5, 3})), {2}, {-5, 3});
  expect_tensor<T>(ls::square(t1<T>({-3, 4})), {2}, {9, 16});
  expect_tensor<bool>(ls::logical_not(t1<T>({0, 7, -1})), {3}, {true, false, false});
  expect_tensor<bool>(ls::isfinite(t1<T>({0, lo})), {2}, {true, true});
}

TEST_F(OpsBoolUnary, LogicalNotAndIsFinite) {
  expect_tensor<bool>(ls::logical_not(b8({true, false})), {2}, {false, true});
  expect_tensor<bool>(ls::isfinite(b8({true, false})), {2}, {true, true});
}

// ---- binary -------------------------------------------------------------------------------
template <typename T>
class OpsFloatBinary : public OnTestDevice {};
TYPED_TEST_SUITE(OpsFloatBinary, FloatTypes);

TYPED_TEST(OpsFloatBinary, TensorTensor) {
  using T = TypeParam;
  const ls::Tensor a = t1<T>({6, -7, 2.5, -1});
  const ls::Tensor b = t1<T>({4, 2, -0.5, 8});
  expect_tensor<T>(ls::add(a, b), {4}, {10, -5, 2, 7});
  expect_tensor<T>(a + b, {4}, {10, -5, 2, 7});
  expect_tensor<T>(ls::sub(a, b), {4}, {2, -9, 3, -9});
  expect_tensor<T>(a - b, {4}, {2, -9, 3, -9});
  expect_tensor<T>(ls::mul(a, b), {4}, {24, -14, -1.25, -8});
  expect_tensor<T>(a * b, {4}, {24, -14, -1.25, -8});
  expect_tensor<T>(ls::div(a, b), {4}, {1.5, -3.5, -5, -0.125});
  expect_tensor<T>(a / b, {4}, {1.5, -3.5, -5, -0.125});
  expect_tensor<T>(ls::pow(a, b), {4}, {1296, 49, 0.6324555320336759, 1});
  expect_tensor<T>(ls::maximum(a, b), {4}, {6, 2, 2.5, 8});
  expect_tensor<T>(ls::minimum(a, b), {4}, {4, -7, -0.5, -1});
}

TYPED_TEST(OpsFloatBinary, ScalarForms) {
  using T = TypeParam;
  const ls::Tensor a = t1<T>({0, 1, 3});
  expect_tensor<T>(ls::add(a, 2), {3}, {2, 3, 5});
  expect_tensor<T>(ls::add(0.5, a), {3}, {0.5, 1.5, 3.5});
  expect_tensor<T>(a + 0.5, {3}, {0.5, 1.5, 3.5});
  expect_tensor<T>(ls::sub(a, 1), {3}, {-1, 0, 2});
  expect_tensor<T>(10 - a, {3}, {10, 9, 7});
  expect_tensor<T>(ls::mul(a, -2), {3}, {0, -2, -6});
  expect_tensor<T>(0.5 * a, {3}, {0, 0.5, 1.5});
  expect_tensor<T>(ls::div(a, 4), {3}, {0, 0.25, 0.75});
  expect_tensor<T>(3 / a, {3}, {std::numeric_limits<T>::infinity(), 3, 1});
  expect_tensor<T>(ls::pow(a, 2), {3}, {0, 1, 9});
  expect_tensor<T>(ls::pow(2, a), {3}, {1, 2, 8});
  expect_tensor<T>(ls::maximum(a, 1), {3}, {1, 1, 3});
  expect_tensor<T>(ls::maximum(2.5, a), {3}, {2.5, 2.5, 3});
  expect_tensor<T>(ls::minimum(a, 1), {3}, {0, 1, 1});
  expect_tensor<T>(ls::minimum(2.5, a), {3}, {0, 1, 2.5});
}

TYPED_TEST(OpsFloatBinary, NanInfAndDivisionByZero) {
  using T = TypeParam;
  constexpr T nan = std::numeric_limits<T>::quiet_NaN();
  constexpr T inf = std::numeric_limits<T>::infinity();
  expect_tensor<T>(t1<T>({1, -1, 0}) / 0, {3}, {inf, -inf, nan});
  // maximum/minimum propagate NaN from either side, as PyTorch does.
  expect_tensor<T>(ls::maximum(t1<T>({nan, 1}), t1<T>({1, nan})), {2}, {nan, nan});
  expect_tensor<T>(ls::minimum(t1<T>({nan, 1}), t1<T>({1, nan})), {2}, {nan, nan});
  expect_tensor<bool>(ls::eq(t1<T>({nan, 1}), t1<T>({nan, 1})), {2}, {false, true});
  expect_tensor<bool>(ls::ne(t1<T>({nan, 1}), t1<T>({nan, 1})), {2}, {true, false});
  expect_tensor<bool>(ls::lt(t1<T>({nan}), 1), {1}, {false});
  expect_tensor<bool>(ls::ge(t1<T>({nan}), 1), {1}, {false});
  expect_tensor<bool>(ls::lt(t1<T>({-inf}), t1<T>({inf})), {1}, {true});
}

TYPED_TEST(OpsFloatBinary, Comparisons) {
  using T = TypeParam;
  const ls::Tensor a = t1<T>({1, 2, 3});
  const ls::Tensor b = t1<T>({2, 2, 2});
  expect_tensor<bool>(ls::eq(a, b), {3}, {false, true, false});
  expect_tensor<bool>(ls::ne(a, b), {3}, {true, false, true});
  expect_tensor<bool>(ls::lt(a, b), {3}, {true, false, false});
  expect_tensor<bool>(ls::le(a, b), {3}, {true, true, false});
  expect_tensor<bool>(ls::gt(a, b), {3}, {false, false, true});
  expect_tensor<bool>(ls::ge(a, b), {3}, {false, true, true});
  expect_tensor<bool>(a == 2, {3}, {false, true, false});
  expect_tensor<bool>(a != 2, {3}, {true, false, true});
  expect_tensor<bool>(a < 2, {3}, {true, false, false});
  expect_tensor<bool>(a <= 2, {3}, {true, true, false});
  expect_tensor<bool>(a > 2, {3}, {false, false, true});
  expect_tensor<bool>(a >= 2, {3}, {false, true, true});
  // Scalar on the left: 2 < a, etc.
  expect_tensor<bool>(ls::lt(2, a), {3}, {false, false, true});
  expect_tensor<bool>(ls::le(2, a), {3}, {false, true, true});
  expect_tensor<bool>(ls::gt(2, a), {3}, {true, false, false});
  expect_tensor<bool>(ls::ge(2, a), {3}, {true, true, false});
  expect_tensor<bool>(ls::eq(2, a), {3}, {false, true, false});
  expect_tensor<bool>(ls::ne(2.5, a), {3}, {true, true, true});
  expect_tensor<bool>(2 < a, {3}, {false, false, true});
  // logical ops on floats: non-zero (NaN included) is true.
  constexpr T nan = std::numeric_limits<T>::quiet_NaN();
  const ls::Tensor c = t1<T>({0, 2, nan, 0});
  const ls::Tensor d = t1<T>({1, 1, 1, 0});
  expect_tensor<bool>(ls::logical_and(c, d), {4}, {false, true, true, false});
  expect_tensor<bool>(ls::logical_or(c, d), {4}, {true, true, true, false});
  expect_tensor<bool>(ls::logical_and(c, 1), {4}, {false, true, true, false});
  expect_tensor<bool>(ls::logical_or(0, c), {4}, {false, true, true, false});
}

template <typename T>
class OpsIntBinary : public OnTestDevice {};
TYPED_TEST_SUITE(OpsIntBinary, IntTypes);

TYPED_TEST(OpsIntBinary, Arithmetic) {
  using T = TypeParam;
  constexpr T hi = std::numeric_limits<T>::max();
  constexpr T lo = std::numeric_limits<T>::min();
  const ls::Tensor a = t1<T>({6, -7, 2, 0});
  const ls::Tensor b = t1<T>({4, 2, -5, 3});
  expect_tensor<T>(a + b, {4}, {10, -5, -3, 3});
  expect_tensor<T>(a - b, {4}, {2, -9, 7, -3});
  expect_tensor<T>(a * b, {4}, {24, -14, -10, 0});
  expect_tensor<T>(ls::maximum(a, b), {4}, {6, 2, 2, 3});
  expect_tensor<T>(ls::minimum(a, b), {4}, {4, -7, -5, 0});
  // Two's complement wrap-around.
  expect_tensor<T>(t1<T>({hi}) + 1, {1}, {lo});
  expect_tensor<T>(t1<T>({lo}) - 1, {1}, {hi});
  expect_tensor<T>(ls::mul(t1<T>({hi}), 2), {1}, {static_cast<T>(-2)});
  // Scalar forms.
  expect_tensor<T>(ls::add(a, 1), {4}, {7, -6, 3, 1});
  expect_tensor<T>(ls::sub(10, a), {4}, {4, 17, 8, 10});
  expect_tensor<T>(3 * a, {4}, {18, -21, 6, 0});
  // A float scalar promotes the integer tensor to f32, as in PyTorch.
  expect_tensor<float>(a * 2.0, {4}, {12, -14, 4, 0});
  expect_tensor<float>(a * 0.5, {4}, {3, -3.5, 1, 0});
  expect_tensor<T>(ls::maximum(a, 0), {4}, {6, 0, 2, 0});
  expect_tensor<T>(ls::minimum(1, a), {4}, {1, -7, 1, 0});
}

TYPED_TEST(OpsIntBinary, DivisionIsTrueDivisionAndFloorDivideRoundsDown) {
  using T = TypeParam;
  constexpr T lo = std::numeric_limits<T>::min();
  // `/` of integers is true division in f32 (PyTorch's), dividing by zero included.
  expect_tensor<float>(t1<T>({7, -7, 6, 0}) / t1<T>({2, 2, 3, 5}), {4}, {3.5f, -3.5f, 2, 0});
  const std::vector<float> inf = (t1<T>({1}) / 0).template to_vector<float>();
  EXPECT_TRUE(std::isinf(inf[0]));
  // floor_divide keeps integers and rounds toward -inf (Python's //).
  expect_tensor<T>(ls::floor_divide(t1<T>({7, -7, 7, -7, 6, 0}), t1<T>({2, 2, -2, -2, 3, 5})), {6},
                   {3, -4, -4, 3, 2, 0});
  expect_tensor<T>(ls::floor_divide(t1<T>({9, -9}), 4), {2}, {2, -3});
  expect_tensor<T>(ls::floor_divide(-9, t1<T>({4, -4})), {2}, {-3, 2});
  expect_tensor<T>(ls::floor_divide(t1<T>({lo}), -1), {1}, {lo});  // wraps instead of trapping
  expect_tensor<T>(ls::fmod(t1<T>({7, -7, 7, -7}), t1<T>({3, 3, -3, -3})), {4}, {1, -1, 1, -1});
  expect_tensor<T>(t1<T>({7, -7, 7, -7}) % t1<T>({3, 3, -3, -3}), {4}, {1, 2, -2, -1});
  expect_tensor<T>(ls::fmod(t1<T>({lo}), -1), {1}, {0});
}

TYPED_TEST(OpsIntBinary, DivisionByZeroFailsAtRunTime) {
  using T = TypeParam;
  const ls::Tensor a = t1<T>({1, 2});
  ls::Tensor y = ls::floor_divide(a, t1<T>({1, 0}));
  EXPECT_BACKEND_ERROR(y.template to_vector<T>(), "division by zero");
  EXPECT_TRUE(y.is_poisoned());
  EXPECT_BACKEND_ERROR(y.template to_vector<T>(), "division by zero");  // stays poisoned
  ls::Tensor z = ls::floor_divide(a, 0);
  EXPECT_BACKEND_ERROR(z.template to_vector<T>(), "division by zero");
  ls::Tensor w = ls::fmod(0, a - 1);
  EXPECT_BACKEND_ERROR(w.template to_vector<T>(), "fmod", "division by zero");
  ls::Tensor v = a % 0;
  EXPECT_BACKEND_ERROR(v.template to_vector<T>(), "division by zero");
  // The runtime is still usable afterwards.
  expect_tensor<T>(a + 1, {2}, {2, 3});
}

TYPED_TEST(OpsIntBinary, Pow) {
  using T = TypeParam;
  expect_tensor<T>(ls::pow(t1<T>({2, 3, -2, 0, 5, -1}), t1<T>({10, 0, 3, 0, 1, 7})), {6},
                   {1024, 1, -8, 1, 5, -1});
  expect_tensor<T>(ls::pow(t1<T>({3, -3}), 2), {2}, {9, 9});
  expect_tensor<T>(ls::pow(2, t1<T>({0, 5})), {2}, {1, 32});
  ls::Tensor bad = ls::pow(t1<T>({2}), t1<T>({-1}));
  EXPECT_BACKEND_ERROR(bad.template to_vector<T>(), "pow", "negative");
}

TYPED_TEST(OpsIntBinary, ComparisonsAndLogical) {
  using T = TypeParam;
  const ls::Tensor a = t1<T>({1, 2, 3});
  expect_tensor<bool>(ls::eq(a, t1<T>({1, 5, 3})), {3}, {true, false, true});
  expect_tensor<bool>(a != 2, {3}, {true, false, true});
  expect_tensor<bool>(a < 2, {3}, {true, false, false});
  expect_tensor<bool>(a <= 2, {3}, {true, true, false});
  expect_tensor<bool>(a > 2, {3}, {false, false, true});
  expect_tensor<bool>(a >= 2, {3}, {false, true, true});
  expect_tensor<bool>(ls::gt(2, a), {3}, {true, false, false});
  expect_tensor<bool>(ls::logical_and(t1<T>({0, 3, -1}), t1<T>({5, 0, 2})), {3},
                      {false, false, true});
  expect_tensor<bool>(ls::logical_or(t1<T>({0, 3, 0}), t1<T>({0, 0, 2})), {3}, {false, true, true});
}

TEST_F(OpsBoolBinary, LogicalAndComparisons) {
  const ls::Tensor a = b8({true, true, false, false});
  const ls::Tensor b = b8({true, false, true, false});
  expect_tensor<bool>(ls::logical_and(a, b), {4}, {true, false, false, false});
  expect_tensor<bool>(a && b, {4}, {true, false, false, false});
  expect_tensor<bool>(ls::logical_or(a, b), {4}, {true, true, true, false});
  expect_tensor<bool>(a || b, {4}, {true, true, true, false});
  expect_tensor<bool>(ls::logical_and(a, true), {4}, {true, true, false, false});
  expect_tensor<bool>(ls::logical_or(false, b), {4}, {true, false, true, false});
  expect_tensor<bool>(ls::eq(a, b), {4}, {true, false, false, true});
  expect_tensor<bool>(ls::ne(a, b), {4}, {false, true, true, false});
  expect_tensor<bool>(ls::lt(a, b), {4}, {false, false, true, false});
  expect_tensor<bool>(ls::ge(a, b), {4}, {true, true, false, true});
  expect_tensor<bool>(a == true, {4}, {true, true, false, false});
}

// ---- broadcasting -------------------------------------------------------------------------
TEST_F(OpsBroadcast, NumpyRules) {
  // [2, 1] + [3] -> [2, 3]
  expect_tensor<float>(f32({1, 2}, {2, 1}) + f32({10, 20, 30}), {2, 3}, {11, 21, 31, 12, 22, 32});
  // [1, 3] * [2, 1] -> [2, 3]
  expect_tensor<int64_t>(i64({1, 2, 3}, {1, 3}) * i64({10, 100}, {2, 1}), {2, 3},
                         {10, 20, 30, 100, 200, 300});
  // 0-d with [2, 2]
  expect_tensor<double>(ls::scalar_tensor(1.0, ls::f64) - f64({1, 2, 3, 4}, {2, 2}), {2, 2},
                        {0, -1, -2, -3});
  // [3, 1, 2] + [4, 1] -> [3, 4, 2]
  const ls::Tensor y = iota<int32_t>({3, 1, 2}) + i32({100, 200, 300, 400}, {4, 1});
  std::vector<int32_t> want;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j)
      for (int k = 0; k < 2; ++k) want.push_back(2 * i + k + 100 * (j + 1));
  expect_tensor<int32_t>(y, {3, 4, 2}, want);
  // Comparisons broadcast too.
  expect_tensor<bool>(ls::lt(f32({1, 2, 3}, {3, 1}), f32({2, 3}, {1, 2})), {3, 2},
                      {true, true, false, true, false, false});
}

TEST_F(OpsBroadcast, EmptyAndZeroDim) {
  expect_tensor<float>(ls::zeros({2, 0}) + f32({1}), {2, 0}, {});
  expect_tensor<float>(ls::zeros({0}) * ls::scalar_tensor(3.0f), {0}, {});
  expect_tensor<float>(ls::ones({2, 1, 3}) + ls::zeros({0, 1}), {2, 0, 3}, {});
  expect_tensor<bool>(ls::eq(ls::zeros({0}, ls::i64), 1), {0}, {});
  expect_tensor<float>(ls::scalar_tensor(2.0f) * ls::scalar_tensor(3.0f), {}, {6});
  expect_tensor<float>(ls::scalar_tensor(7, ls::i64) / 2, {}, {3.5f});
}

// ---- where, cast, clamp -------------------------------------------------------------------
TEST_F(OpsWhere, AllForms) {
  const ls::Tensor c = b8({true, false, true});
  expect_tensor<float>(ls::where(c, f32({1, 2, 3}), f32({10, 20, 30})), {3}, {1, 20, 3});
  expect_tensor<float>(ls::where(c, f32({1, 2, 3}), 0.5), {3}, {1, 0.5, 3});
  expect_tensor<int64_t>(ls::where(c, 7, i64({10, 20, 30})), {3}, {7, 20, 7});
  expect_tensor<bool>(ls::where(c, b8({false, false, false}), true), {3}, {false, true, false});
  expect_tensor<int32_t>(ls::where(c, i32({1, 2, 3}), i32({-1, -2, -3})), {3}, {1, -2, 3});
  // The unselected branch's NaN does not leak.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  expect_tensor<double>(ls::where(c, f64({1, nan, 3}), f64({nan, 2, nan})), {3}, {1, 2, 3});
}

TEST_F(OpsWhere, Broadcasts) {
  // cond [2, 1], a [3], b 0-d -> [2, 3]
  expect_tensor<float>(ls::where(b8({true, false}, {2, 1}), f32({1, 2, 3}), 0), {2, 3},
                       {1, 2, 3, 0, 0, 0});
  // cond [3], a [2, 1], b [1] -> [2, 3]
  expect_tensor<int64_t>(ls::where(b8({true, false, true}), i64({1, 2}, {2, 1}), i64({9})), {2, 3},
                         {1, 9, 1, 2, 9, 2});
  expect_tensor<float>(ls::where(b8({}, {0}), f32({1}), 2), {0}, {});
}

TEST_F(OpsCast, FloatToIntNanGivesZeroAndSaturates) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  constexpr int32_t hi = std::numeric_limits<int32_t>::max();
  constexpr int32_t lo = std::numeric_limits<int32_t>::min();
  expect_tensor<int32_t>(ls::cast(f32({1.9f, -1.9f, nan, 3e9f, -3e9f, inf, -inf, -0.5f}), ls::i32),
                         {8}, {1, -1, 0, hi, lo, hi, lo, 0});
  constexpr int64_t hi64 = std::numeric_limits<int64_t>::max();
  constexpr int64_t lo64 = std::numeric_limits<int64_t>::min();
  expect_tensor<int64_t>(ls::cast(f64({1e19, -1e19, nan, 2.5, -2.5, 4e9}), ls::i64), {6},
                         {hi64, lo64, 0, 2, -2, 4000000000});
  expect_tensor<int64_t>(ls::cast(f32({inf, -inf, nan, 1e30f}), ls::i64), {4},
                         {hi64, lo64, 0, hi64});
  expect_tensor<int32_t>(ls::cast(f64({2147483647.0, 2147483648.0, -2147483649.0}), ls::i32), {3},
                         {hi, hi, lo});
}

TEST_F(OpsCast, AllPairs) {
  expect_tensor<float>(ls::cast(i64({3, -4}), ls::f32), {2}, {3, -4});
  expect_tensor<double>(ls::cast(i32({3, -4}), ls::f64), {2}, {3, -4});
  expect_tensor<double>(ls::cast(f32({0.5f, -1.25f}), ls::f64), {2}, {0.5, -1.25});
  expect_tensor<float>(
      ls::cast(f64({0.1, 1e300, -1e300}), ls::f32), {3},
      {0.1f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()});
  const float nan = std::numeric_limits<float>::quiet_NaN();
  expect_tensor<bool>(ls::cast(f32({0, -0.0f, 0.5f, nan}), ls::boolean), {4},
                      {false, false, true, true});
  expect_tensor<bool>(ls::cast(i64({0, -3}), ls::boolean), {2}, {false, true});
  expect_tensor<float>(ls::cast(b8({true, false}), ls::f32), {2}, {1, 0});
  expect_tensor<int64_t>(ls::cast(b8({true, false}), ls::i64), {2}, {1, 0});
  expect_tensor<int32_t>(ls::cast(b8({true}), ls::i32), {1}, {1});
  // i64 -> i32 keeps the low 32 bits (two's complement), as PyTorch.
  expect_tensor<int32_t>(ls::cast(i64({(int64_t{1} << 32) + 5, -1, 2147483648}), ls::i32), {3},
                         {5, -1, std::numeric_limits<int32_t>::min()});
  expect_tensor<int64_t>(ls::cast(i32({-7}), ls::i64), {1}, {-7});
  // Same dtype: a no-op; Tensor::to(DType) is the same op.
  expect_tensor<float>(ls::cast(f32({1, 2}), ls::f32), {2}, {1, 2});
  expect_tensor<double>(f32({1.5f}).to(ls::f64), {1}, {1.5});
  expect_tensor<int64_t>(ls::cast(ls::zeros({0, 2}), ls::i64), {0, 2}, {});
  expect_tensor<int32_t>(ls::cast(ls::scalar_tensor(2.7), ls::i32), {}, {2});
}

TEST_F(OpsClamp, Values) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  expect_tensor<float>(ls::clamp(f32({-2, 0.5f, 3, nan}), 0, 1), {4}, {0, 0.5f, 1, nan});
  expect_tensor<double>(ls::clamp(f64({-2, 0.5, 3}), -1.5, 0.25), {3}, {-1.5, 0.25, 0.25});
  expect_tensor<int64_t>(ls::clamp(i64({-5, 5, 15}), 0, 10), {3}, {0, 5, 10});
  expect_tensor<int32_t>(ls::clamp(i32({-5, 5, 15}), 3, 3), {3}, {3, 3, 3});
  expect_tensor<float>(ls::clamp(ls::zeros({0}), 0, 1), {0}, {});
}

}  // namespace

// PyTorch's type promotion (torch.result_type), one rule per line.
TEST(OpsPromotion, FollowsPyTorch) {
  const ls::Tensor f = ls::zeros({2}), d = ls::zeros({2}, ls::f64);
  const ls::Tensor i = ls::zeros({2}, ls::i64), i32 = ls::zeros({2}, ls::i32);
  const ls::Tensor b = ls::zeros({2}, ls::boolean);
  EXPECT_EQ((f + i).dtype(), ls::f32);  // higher category wins
  EXPECT_EQ((i + f).dtype(), ls::f32);
  EXPECT_EQ((f + d).dtype(), ls::f64);  // same category: the larger
  EXPECT_EQ((i32 + i).dtype(), ls::i64);
  EXPECT_EQ((b + i32).dtype(), ls::i32);
  EXPECT_EQ((f + ls::scalar_tensor(1, ls::f64)).dtype(), ls::f32);    // a 0-d tensor of the same
  EXPECT_EQ((i32 + ls::scalar_tensor(1, ls::i64)).dtype(), ls::i32);  // category does not count
  EXPECT_EQ((i + ls::scalar_tensor(1, ls::f64)).dtype(), ls::f64);    // a higher one does
  EXPECT_EQ((i * 2.5).dtype(), ls::f32);  // a float scalar: the default float dtype
  EXPECT_EQ((i32 * 2).dtype(), ls::i32);
  EXPECT_EQ((d * 2.5).dtype(), ls::f64);
  EXPECT_EQ((b + 1).dtype(), ls::i64);
  EXPECT_EQ((b * 0.5).dtype(), ls::f32);
  EXPECT_EQ(ls::logical_and(b, true).dtype(), ls::boolean);
  EXPECT_EQ((i / i).dtype(), ls::f32);  // true division
  EXPECT_EQ(ls::floor_divide(i, i).dtype(), ls::i64);
  EXPECT_EQ(ls::where(b, f, i).dtype(), ls::f32);
  EXPECT_EQ(ls::where(b, i, 0.5).dtype(), ls::f32);
  EXPECT_EQ(ls::where(b, 1, 2).dtype(), ls::i64);
  EXPECT_EQ(ls::where(b, 1, 2.0).dtype(), ls::f32);
  EXPECT_EQ((f == i).dtype(), ls::boolean);
  expect_tensor<bool>(ls::from_vector<float>({1.5f, 2}) == ls::from_vector<int64_t>({1, 2}), {2},
                      {false, true});
  // Gradients flow back through the promotion in the input's own dtype.
  ls::Tensor w = ls::from_vector<float>({1, 2}).set_requires_grad();
  ls::sum(w * ls::from_vector<double>({3, 4})).backward();
  EXPECT_EQ(w.grad().dtype(), ls::f32);
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{3, 4}));
  // In place, the result must fit the tensor's dtype (PyTorch refuses the same).
  ls::Tensor acc = ls::zeros({2});
  acc.add_(ls::ones({2}, ls::i64));
  EXPECT_EQ(acc.to_vector<float>(), (std::vector<float>{1, 1}));
  ls::Tensor counts = ls::zeros({2}, ls::i64);
  EXPECT_LS_ERROR(counts.add_(ls::ones({2})), "add_", "f32", "i64");
}

TEST(OpsPromotion, ItemConverts) {
  EXPECT_EQ(ls::scalar_tensor(2.5).item<double>(), 2.5);
  EXPECT_EQ(ls::scalar_tensor(7, ls::i64).item<double>(), 7.0);
  EXPECT_EQ(ls::scalar_tensor(3.75, ls::f64).item<float>(), 3.75f);
  EXPECT_EQ(ls::scalar_tensor(-2.5).item<int64_t>(), -2);  // as a C++ cast: toward zero
  EXPECT_EQ(ls::scalar_tensor(true, ls::boolean).item<int32_t>(), 1);
  EXPECT_EQ(ls::scalar_tensor(0.25).item<bool>(), true);
}
