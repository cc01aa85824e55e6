// Reductions against hand-computed values: sum, mean, max, min, argmax, argmin over single,
// multiple, all and negative axes, with keepdim; empty and 0-d inputs; result dtypes; softmax,
// log_softmax and logsumexp including their numerically delicate cases.
#include <cmath>
#include <limits>

#include "unit/ops_test_util.h"

namespace {

using namespace ops_test;

using OpsReduce = OnTestDevice;
using OpsSoftmax = OnTestDevice;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// x[i][j][k] = 12 i + 4 j + k, shape [2, 3, 4].
ls::Tensor x234() { return iota<float>({2, 3, 4}); }

TEST_F(OpsReduce, SumOverEachAxis) {
  expect_tensor<float>(ls::sum(x234()), {}, {276});
  expect_tensor<float>(x234().sum(), {}, {276});
  expect_tensor<float>(ls::sum(x234(), {0}), {3, 4},
                       {12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34});
  expect_tensor<float>(ls::sum(x234(), {1}), {2, 4}, {12, 15, 18, 21, 48, 51, 54, 57});
  expect_tensor<float>(ls::sum(x234(), {2}), {2, 3}, {6, 22, 38, 54, 70, 86});
  expect_tensor<float>(ls::sum(x234(), {-1}), {2, 3}, {6, 22, 38, 54, 70, 86});
  expect_tensor<float>(ls::sum(x234(), {-3}), {3, 4},
                       {12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34});
}

TEST_F(OpsReduce, SumOverSeveralAxes) {
  expect_tensor<float>(ls::sum(x234(), {0, 2}), {3}, {60, 92, 124});
  expect_tensor<float>(ls::sum(x234(), {2, 0}), {3}, {60, 92, 124});  // order does not matter
  expect_tensor<float>(ls::sum(x234(), {-1, 0}), {3}, {60, 92, 124});
  expect_tensor<float>(ls::sum(x234(), {1, 2}), {2}, {66, 210});
  expect_tensor<float>(ls::sum(x234(), {0, 1, 2}), {}, {276});
}

TEST_F(OpsReduce, Keepdim) {
  expect_tensor<float>(ls::sum(x234(), {1}, true), {2, 1, 4}, {12, 15, 18, 21, 48, 51, 54, 57});
  expect_tensor<float>(ls::sum(x234(), {0, 2}, true), {1, 3, 1}, {60, 92, 124});
  expect_tensor<float>(ls::sum(x234(), {}, true), {1, 1, 1}, {276});
  expect_tensor<float>(ls::max(x234(), {-1}, true), {2, 3, 1}, {3, 7, 11, 15, 19, 23});
  expect_tensor<int64_t>(ls::argmin(x234(), {1}, true), {2, 1, 4}, {0, 0, 0, 0, 0, 0, 0, 0});
  expect_tensor<float>(ls::mean(x234(), {2}, true), {2, 3, 1}, {1.5, 5.5, 9.5, 13.5, 17.5, 21.5});
  expect_tensor<float>(x234().mean({0, 1}, true), {1, 1, 4}, {10, 11, 12, 13});
}

TEST_F(OpsReduce, Mean) {
  expect_tensor<float>(ls::mean(x234()), {}, {11.5});
  expect_tensor<float>(ls::mean(x234(), {2}), {2, 3}, {1.5, 5.5, 9.5, 13.5, 17.5, 21.5});
  expect_tensor<float>(ls::mean(x234(), {-3, -2}), {4}, {10, 11, 12, 13});
  expect_tensor<double>(ls::mean(f64({1, 2, 4}, {3})), {}, {7.0 / 3});
  // An empty reduction is 0/0 = NaN, as in PyTorch; a reduction over a non-empty axis of an
  // empty tensor is empty.
  expect_tensor<float>(ls::mean(ls::zeros({2, 0}), {1}), {2}, {kNaN, kNaN});
  expect_tensor<float>(ls::mean(ls::zeros({0})), {}, {kNaN});
  expect_tensor<float>(ls::mean(ls::zeros({0, 3}), {1}), {0}, {});
}

TEST_F(OpsReduce, MaxMinArgmaxArgmin) {
  expect_tensor<float>(ls::max(x234(), {1}), {2, 4}, {8, 9, 10, 11, 20, 21, 22, 23});
  expect_tensor<float>(ls::min(x234(), {1}), {2, 4}, {0, 1, 2, 3, 12, 13, 14, 15});
  expect_tensor<int64_t>(ls::argmax(x234(), {1}), {2, 4}, {2, 2, 2, 2, 2, 2, 2, 2});
  // Over several axes the index counts row-major over the reduced axes.
  expect_tensor<int64_t>(ls::argmax(x234(), {1, 2}), {2}, {11, 11});
  expect_tensor<int64_t>(ls::argmax(x234(), {0, 2}), {3}, {7, 7, 7});
  expect_tensor<int64_t>(ls::argmax(x234()), {}, {23});
  expect_tensor<int64_t>(ls::argmin(x234()), {}, {0});

  // y = [[3, 7, 7, 1], [9, -2, 9, 0]]: ties pick the first.
  const ls::Tensor y = f32({3, 7, 7, 1, 9, -2, 9, 0}, {2, 4});
  expect_tensor<float>(ls::max(y, {1}), {2}, {7, 9});
  expect_tensor<float>(ls::min(y, {-1}), {2}, {1, -2});
  expect_tensor<int64_t>(ls::argmax(y, {1}), {2}, {1, 0});
  expect_tensor<int64_t>(ls::argmin(y, {1}), {2}, {3, 1});
  expect_tensor<float>(ls::max(y, {0}), {4}, {9, 7, 9, 1});
  expect_tensor<float>(ls::min(y, {0}), {4}, {3, -2, 7, 0});
  expect_tensor<int64_t>(ls::argmax(y, {0}), {4}, {1, 0, 1, 0});
  expect_tensor<int64_t>(ls::argmin(y, {-2}), {4}, {0, 1, 0, 1});
  expect_tensor<float>(ls::max(y), {}, {9});
  expect_tensor<float>(ls::min(y), {}, {-2});
  expect_tensor<int64_t>(ls::argmax(y), {}, {4});
  expect_tensor<int64_t>(ls::argmin(y), {}, {5});
  expect_tensor<int64_t>(ls::argmax(f32({5, 5, 5})), {}, {0});
}

TEST_F(OpsReduce, NanPropagates) {
  const ls::Tensor y = f64({1, kNaN, 3, -kInf}, {4});
  expect_tensor<double>(ls::max(y), {}, {kNaN});
  expect_tensor<double>(ls::min(y), {}, {kNaN});
  expect_tensor<int64_t>(ls::argmax(y), {}, {1});
  expect_tensor<int64_t>(ls::argmin(y), {}, {1});
  expect_tensor<double>(ls::sum(y), {}, {kNaN});
  expect_tensor<double>(ls::min(f64({1, 3, -kInf})), {}, {-kInf});
  expect_tensor<int64_t>(ls::argmin(f64({1, 3, -kInf})), {}, {2});
}

TEST_F(OpsReduce, IntegerAndBoolDtypes) {
  // sum of bool/i32 gives i64; of i64 stays i64; of f32/f64 keeps the float dtype.
  expect_tensor<int64_t>(ls::sum(i32({1, 2, 3, -10})), {}, {-4});
  expect_tensor<int64_t>(ls::sum(i32({2147483647, 1})), {}, {2147483648});  // no i32 overflow
  expect_tensor<int64_t>(ls::sum(b8({true, false, true, true})), {}, {3});
  expect_tensor<int64_t>(ls::sum(b8({true, false, true, true}, {2, 2}), {0}), {2}, {2, 1});
  expect_tensor<int64_t>(ls::sum(i64({5, -7}, {2, 1}), {1}), {2}, {5, -7});
  expect_tensor<double>(ls::sum(f64({0.5, 0.25})), {}, {0.75});
  expect_tensor<int32_t>(ls::max(i32({3, -1, 8, 2}, {2, 2}), {1}), {2}, {3, 8});
  expect_tensor<int64_t>(ls::min(i64({3, -1, 8, 2}, {2, 2}), {0}), {2}, {3, -1});
  expect_tensor<int64_t>(ls::argmax(i64({3, -1, 8, 8})), {}, {2});
  expect_tensor<int64_t>(ls::argmin(i32({3, -1, 8, -1})), {}, {1});
  expect_tensor<bool>(ls::max(b8({false, true, false})), {}, {true});
  expect_tensor<bool>(ls::min(b8({false, true, false})), {}, {false});
  expect_tensor<int64_t>(ls::argmax(b8({false, true, true})), {}, {1});
}

TEST_F(OpsReduce, EmptyAndZeroDim) {
  expect_tensor<float>(ls::sum(ls::zeros({2, 0}), {1}), {2}, {0, 0});
  expect_tensor<float>(ls::sum(ls::zeros({2, 0}), {0}), {0}, {});
  expect_tensor<float>(ls::sum(ls::zeros({0})), {}, {0});
  expect_tensor<int64_t>(ls::sum(ls::zeros({0, 4}, ls::i32), {0}, true), {1, 4}, {0, 0, 0, 0});
  expect_tensor<float>(ls::max(ls::zeros({0, 3}), {1}), {0}, {});  // the reduced axis is not empty
  expect_tensor<int64_t>(ls::argmax(ls::zeros({0, 3}), {1}), {0}, {});
  const ls::Tensor s = ls::scalar_tensor(2.5);
  expect_tensor<float>(ls::sum(s), {}, {2.5});
  expect_tensor<float>(ls::sum(s, {}, true), {}, {2.5});
  expect_tensor<float>(ls::max(s), {}, {2.5});
  expect_tensor<float>(ls::min(s), {}, {2.5});
  expect_tensor<float>(ls::mean(s), {}, {2.5});
  expect_tensor<int64_t>(ls::argmax(s), {}, {0});
  expect_tensor<int64_t>(ls::argmin(s), {}, {0});
  expect_tensor<int64_t>(ls::sum(ls::scalar_tensor(true, ls::boolean)), {}, {1});
}

TEST_F(OpsReduce, SizeOneAxes) {
  const ls::Tensor y = f32({1, 2, 3}, {1, 3, 1});
  expect_tensor<float>(ls::sum(y, {0}), {3, 1}, {1, 2, 3});
  expect_tensor<float>(ls::sum(y, {2}), {1, 3}, {1, 2, 3});
  expect_tensor<float>(ls::max(y, {0, 2}), {3}, {1, 2, 3});
  expect_tensor<int64_t>(ls::argmax(y, {0, 2}), {3}, {0, 0, 0});
  expect_tensor<int64_t>(ls::argmax(y, {1}, true), {1, 1, 1}, {2});
}

// ---- softmax family -----------------------------------------------------------------------
TEST_F(OpsSoftmax, Values) {
  const std::vector<double> sm = {0.09003057317038046, 0.24472847105479767, 0.6652409557748219};
  const std::vector<double> lsm = {-2.40760596444438, -1.4076059644443801, -0.4076059644443803};
  expect_tensor<double>(ls::softmax(f64({1, 2, 3}), 0), {3}, sm);
  expect_tensor<double>(ls::log_softmax(f64({1, 2, 3}), -1), {3}, lsm);
  expect_tensor<double>(ls::logsumexp(f64({1, 2, 3}), {0}), {}, {3.40760596444438});
  expect_tensor<float>(ls::softmax(f32({1, 2, 3}), 0), {3},
                       {0.09003057317038046, 0.24472847105479767, 0.6652409557748219});
  expect_tensor<float>(ls::log_softmax(f32({1, 2, 3}), 0), {3},
                       {-2.40760596444438, -1.4076059644443801, -0.4076059644443803});
}

TEST_F(OpsSoftmax, AlongEachAxisOfAMatrix) {
  const ls::Tensor x = f64({1, 2, 3, 1, 1, 1}, {2, 3});
  const double third = 1.0 / 3;
  expect_tensor<double>(
      ls::softmax(x, 1), {2, 3},
      {0.09003057317038046, 0.24472847105479767, 0.6652409557748219, third, third, third});
  expect_tensor<double>(
      ls::softmax(x, -1), {2, 3},
      {0.09003057317038046, 0.24472847105479767, 0.6652409557748219, third, third, third});
  // Columns [1, 1], [2, 1], [3, 1].
  expect_tensor<double>(
      ls::softmax(x, 0), {2, 3},
      {0.5, 0.7310585786300049, 0.8807970779778824, 0.5, 0.2689414213699951, 0.11920292202211757});
  expect_tensor<double>(
      ls::log_softmax(x, 0), {2, 3},
      {std::log(0.5), std::log(0.7310585786300049), std::log(0.8807970779778824), std::log(0.5),
       std::log(0.2689414213699951), std::log(0.11920292202211757)});
}

TEST_F(OpsSoftmax, LargeAndInfiniteInputsAreStable) {
  expect_tensor<float>(ls::softmax(f32({1000, 1000}), 0), {2}, {0.5, 0.5});
  expect_tensor<float>(ls::softmax(f32({-1000, 0}), 0), {2}, {0, 1});
  expect_tensor<double>(ls::log_softmax(f64({1000, 0}), 0), {2}, {0, -1000});
  expect_tensor<double>(ls::logsumexp(f64({1000, 1000}), {0}), {}, {1000 + std::log(2.0)});
  expect_tensor<double>(ls::softmax(f64({-kInf, 0}), 0), {2}, {0, 1});
  // All -inf: logsumexp is -inf (no NaN from -inf - -inf).
  expect_tensor<double>(ls::logsumexp(f64({-kInf, -kInf}), {0}), {}, {-kInf});
  expect_tensor<double>(ls::logsumexp(f64({kInf, 1}), {0}), {}, {kInf});
  expect_tensor<double>(ls::logsumexp(f64({kNaN, 1}), {0}), {}, {kNaN});
}

TEST_F(OpsSoftmax, LogsumexpAxesAndKeepdim) {
  // exp values 1, 2, 3, 4: logsumexp over all = log 10.
  const ls::Tensor x = f64({0, std::log(2.0), std::log(3.0), std::log(4.0)}, {2, 2});
  expect_tensor<double>(ls::logsumexp(x, {0, 1}), {}, {std::log(10.0)});
  expect_tensor<double>(ls::logsumexp(x, {}), {}, {std::log(10.0)});
  expect_tensor<double>(ls::logsumexp(x, {0, 1}, true), {1, 1}, {std::log(10.0)});
  expect_tensor<double>(ls::logsumexp(x, {1}), {2}, {std::log(3.0), std::log(7.0)});
  expect_tensor<double>(ls::logsumexp(x, {-2}, true), {1, 2}, {std::log(4.0), std::log(6.0)});
  expect_tensor<double>(ls::logsumexp(ls::zeros({2, 3, 1}, ls::f64), {1, 2}), {2},
                        {std::log(3.0), std::log(3.0)});
  expect_tensor<float>(ls::logsumexp(ls::scalar_tensor(1.5f), {}), {}, {1.5});
}

TEST_F(OpsSoftmax, EmptyInputs) {
  // Empty along the softmax axis: the result is empty (PyTorch); logsumexp over an empty axis is
  // log(0) = -inf.
  expect_tensor<float>(ls::softmax(ls::zeros({2, 0}), 1), {2, 0}, {});
  expect_tensor<float>(ls::log_softmax(ls::zeros({2, 0}), 1), {2, 0}, {});
  const float inf = std::numeric_limits<float>::infinity();
  expect_tensor<float>(ls::logsumexp(ls::zeros({2, 0}), {1}), {2}, {-inf, -inf});
  // Empty along another axis.
  expect_tensor<float>(ls::softmax(ls::zeros({0, 3}), 1), {0, 3}, {});
  expect_tensor<float>(ls::logsumexp(ls::zeros({0, 3}), {1}), {0}, {});
}

}  // namespace
