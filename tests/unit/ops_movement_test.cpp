// Movement ops against hand-computed values: reshape (with -1), permute, transpose, expand,
// unsqueeze, squeeze, flatten, slice (steps, negative and clamped bounds), concat and pad, in
// every dtype, with size-1, empty and 0-d shapes.
#include <cstdint>

#include "unit/ops_test_util.h"

namespace {

using namespace ops_test;

using OpsReshape = OnTestDevice;
using OpsPermute = OnTestDevice;
using OpsTranspose = OnTestDevice;
using OpsExpand = OnTestDevice;
using OpsUnsqueezeSqueezeFlatten = OnTestDevice;
using OpsSlice = OnTestDevice;
using OpsConcat = OnTestDevice;
using OpsPad = OnTestDevice;
using OpsMovement = OnTestDevice;

// x[i][j][k] = 12 i + 4 j + k, shape [2, 3, 4].
template <typename T>
ls::Tensor x234() {
  return iota<T>({2, 3, 4});
}

TEST_F(OpsReshape, InfersMinusOne) {
  const ls::Tensor x = iota<float>({6});
  expect_tensor<float>(ls::reshape(x, {2, 3}), {2, 3}, {0, 1, 2, 3, 4, 5});
  expect_tensor<float>(ls::reshape(x, {-1, 2}), {3, 2}, {0, 1, 2, 3, 4, 5});
  expect_tensor<float>(ls::reshape(x, {3, -1}), {3, 2}, {0, 1, 2, 3, 4, 5});
  expect_tensor<float>(x.reshape({1, -1, 1}), {1, 6, 1}, {0, 1, 2, 3, 4, 5});
  expect_tensor<float>(ls::reshape(ls::reshape(x, {2, 3}), {-1}), {6}, {0, 1, 2, 3, 4, 5});
  expect_tensor<float>(ls::reshape(x, {6}), {6}, {0, 1, 2, 3, 4, 5});  // same shape
}

TEST_F(OpsReshape, ZeroDimAndEmpty) {
  const ls::Tensor s = ls::scalar_tensor(4, ls::i64);
  expect_tensor<int64_t>(ls::reshape(s, {1}), {1}, {4});
  expect_tensor<int64_t>(ls::reshape(s, {1, 1}), {1, 1}, {4});
  expect_tensor<int64_t>(ls::reshape(s, {-1}), {1}, {4});
  expect_tensor<int64_t>(ls::reshape(i64({9}), {}), {}, {9});
  expect_tensor<float>(ls::reshape(ls::zeros({0, 3}), {3, 0}), {3, 0}, {});
  expect_tensor<float>(ls::reshape(ls::zeros({2, 0}), {-1}), {0}, {});
  expect_tensor<float>(ls::reshape(ls::zeros({2, 0}), {0, 5}), {0, 5}, {});
}

TEST_F(OpsReshape, AllDtypes) {
  expect_tensor<double>(ls::reshape(iota<double>({4}), {2, 2}), {2, 2}, {0, 1, 2, 3});
  expect_tensor<int32_t>(ls::reshape(iota<int32_t>({4}), {2, -1}), {2, 2}, {0, 1, 2, 3});
  expect_tensor<bool>(ls::reshape(b8({true, false, false, true}), {2, 2}), {2, 2},
                      {true, false, false, true});
}

template <typename T>
std::vector<T> permuted_201() {  // x234 permuted by {2, 0, 1}: out[k][i][j] = x[i][j][k]
  std::vector<T> v;
  for (int k = 0; k < 4; ++k)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j) v.push_back(static_cast<T>(12 * i + 4 * j + k));
  return v;
}

TEST_F(OpsPermute, Values) {
  expect_tensor<float>(ls::permute(x234<float>(), {2, 0, 1}), {4, 2, 3}, permuted_201<float>());
  expect_tensor<float>(ls::permute(x234<float>(), {-1, 0, 1}), {4, 2, 3}, permuted_201<float>());
  expect_tensor<int64_t>(x234<int64_t>().permute({2, 0, 1}), {4, 2, 3}, permuted_201<int64_t>());
  std::vector<double> ramp(24);
  for (int i = 0; i < 24; ++i) ramp[i] = i;
  expect_tensor<double>(ls::permute(x234<double>(), {0, 1, 2}), {2, 3, 4}, ramp);
  expect_tensor<float>(ls::permute(ls::scalar_tensor(3.0f), {}), {}, {3});
  expect_tensor<float>(ls::permute(ls::zeros({2, 0, 3}), {2, 1, 0}), {3, 0, 2}, {});
  expect_tensor<bool>(ls::permute(b8({true, false, false, false}, {2, 2}), {1, 0}), {2, 2},
                      {true, false, false, false});
  expect_tensor<bool>(ls::permute(b8({false, true, false, false}, {2, 2}), {1, 0}), {2, 2},
                      {false, false, true, false});
}

TEST_F(OpsTranspose, Values) {
  const ls::Tensor x = iota<int32_t>({2, 3});  // [[0, 1, 2], [3, 4, 5]]
  expect_tensor<int32_t>(ls::transpose(x, 0, 1), {3, 2}, {0, 3, 1, 4, 2, 5});
  expect_tensor<int32_t>(ls::transpose(x, -1, -2), {3, 2}, {0, 3, 1, 4, 2, 5});
  expect_tensor<int32_t>(ls::transpose(x, 1, 1), {2, 3}, {0, 1, 2, 3, 4, 5});
  // [2, 3, 4] swapping axes 0 and 2: out[k][j][i] = 12 i + 4 j + k.
  std::vector<float> want;
  for (int k = 0; k < 4; ++k)
    for (int j = 0; j < 3; ++j)
      for (int i = 0; i < 2; ++i) want.push_back(static_cast<float>(12 * i + 4 * j + k));
  expect_tensor<float>(ls::transpose(x234<float>(), 0, 2), {4, 3, 2}, want);
}

TEST_F(OpsExpand, Values) {
  const ls::Tensor col = f32({1, 2, 3}, {3, 1});
  expect_tensor<float>(ls::expand(col, {3, 4}), {3, 4}, {1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3});
  expect_tensor<float>(ls::expand(col, {2, -1, 2}), {2, 3, 2},
                       {1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3});
  expect_tensor<int64_t>(ls::expand(i64({7, 8}), {2, 2}), {2, 2}, {7, 8, 7, 8});
  expect_tensor<int64_t>(ls::expand(i64({7, 8}), {2}), {2}, {7, 8});  // no-op
  expect_tensor<double>(ls::expand(ls::scalar_tensor(2.5, ls::f64), {2, 2}), {2, 2},
                        {2.5, 2.5, 2.5, 2.5});
  expect_tensor<bool>(ls::expand(b8({true}, {1, 1}), {1, 3}), {1, 3}, {true, true, true});
  expect_tensor<int32_t>(ls::expand(i32({5}), {0}), {0}, {});
  expect_tensor<float>(ls::expand(ls::zeros({0, 1}), {2, 0, 3}), {2, 0, 3}, {});
}

TEST_F(OpsUnsqueezeSqueezeFlatten, Values) {
  const ls::Tensor v = f32({1, 2, 3});
  expect_tensor<float>(ls::unsqueeze(v, 0), {1, 3}, {1, 2, 3});
  expect_tensor<float>(ls::unsqueeze(v, 1), {3, 1}, {1, 2, 3});
  expect_tensor<float>(ls::unsqueeze(v, -1), {3, 1}, {1, 2, 3});
  expect_tensor<float>(ls::unsqueeze(v, -2), {1, 3}, {1, 2, 3});
  expect_tensor<int64_t>(ls::unsqueeze(ls::scalar_tensor(5, ls::i64), 0), {1}, {5});
  expect_tensor<float>(ls::unsqueeze(ls::zeros({0}), 0), {1, 0}, {});

  expect_tensor<float>(ls::squeeze(f32({1, 2, 3}, {1, 3}), 0), {3}, {1, 2, 3});
  expect_tensor<float>(ls::squeeze(f32({1, 2, 3}, {1, 3}), -2), {3}, {1, 2, 3});
  expect_tensor<float>(ls::squeeze(f32({1, 2, 3}, {3, 1}), -1), {3}, {1, 2, 3});
  expect_tensor<bool>(ls::squeeze(b8({true}), 0), {}, {true});
  expect_tensor<float>(ls::squeeze(ls::zeros({1, 0}), 0), {0}, {});

  std::vector<double> all(24);
  for (int i = 0; i < 24; ++i) all[i] = i;
  expect_tensor<double>(ls::flatten(x234<double>()), {24}, all);
  expect_tensor<double>(ls::flatten(x234<double>(), 1), {2, 12}, all);
  expect_tensor<double>(ls::flatten(x234<double>(), 0, 1), {6, 4}, all);
  expect_tensor<double>(ls::flatten(x234<double>(), -2, -1), {2, 12}, all);
  expect_tensor<double>(ls::flatten(x234<double>(), 1, 1), {2, 3, 4}, all);
  expect_tensor<float>(ls::flatten(ls::scalar_tensor(1.0f)), {1}, {1});
  expect_tensor<float>(ls::flatten(ls::scalar_tensor(1.0f), -1, 0), {1}, {1});
  expect_tensor<float>(ls::flatten(ls::zeros({2, 0, 3}), 1), {2, 0}, {});
}

TEST_F(OpsSlice, StepsAndBounds) {
  const ls::Tensor x = iota<int64_t>({10});
  expect_tensor<int64_t>(ls::slice(x, 0, 2, 8, 2), {3}, {2, 4, 6});
  expect_tensor<int64_t>(ls::slice(x, 0, 1, 10, 3), {3}, {1, 4, 7});
  expect_tensor<int64_t>(ls::slice(x, 0, 0, 10, 4), {3}, {0, 4, 8});
  expect_tensor<int64_t>(ls::slice(x, 0, 0, 9, 4), {3}, {0, 4, 8});
  expect_tensor<int64_t>(ls::slice(x, 0, 0, 8, 4), {2}, {0, 4});
  expect_tensor<int64_t>(ls::slice(x, 0, 3, 4), {1}, {3});
  // Negative bounds count from the end; out-of-range bounds are clamped (Python slicing).
  expect_tensor<int64_t>(ls::slice(x, 0, -3, 100), {3}, {7, 8, 9});
  expect_tensor<int64_t>(ls::slice(x, -1, -100, 3), {3}, {0, 1, 2});
  expect_tensor<int64_t>(ls::slice(x, 0, 2, -5), {3}, {2, 3, 4});
  expect_tensor<int64_t>(ls::slice(x, 0, -4, -1, 2), {2}, {6, 8});
  expect_tensor<int64_t>(ls::slice(x, 0, 0, 100, 100), {1}, {0});
  // Empty results.
  expect_tensor<int64_t>(ls::slice(x, 0, 5, 2), {0}, {});
  expect_tensor<int64_t>(ls::slice(x, 0, 12, 20), {0}, {});
  expect_tensor<int64_t>(ls::slice(x, 0, -1, -3), {0}, {});
  expect_tensor<int64_t>(ls::slice(x, 0, 4, 4), {0}, {});
}

TEST_F(OpsSlice, InnerAxesAndDtypes) {
  const ls::Tensor x = iota<float>({3, 4});  // rows [0..3], [4..7], [8..11]
  expect_tensor<float>(ls::slice(x, 1, 1, 4, 2), {3, 2}, {1, 3, 5, 7, 9, 11});
  expect_tensor<float>(ls::slice(x, -2, 1, 3), {2, 4}, {4, 5, 6, 7, 8, 9, 10, 11});
  expect_tensor<float>(ls::slice(x, 0, 0, 3, 2), {2, 4}, {0, 1, 2, 3, 8, 9, 10, 11});
  expect_tensor<float>(ls::slice(ls::slice(x, 0, 1, 3), 1, -1, 10), {2, 1}, {7, 11});
  expect_tensor<double>(ls::slice(iota<double>({2, 3, 2}), 1, 1, 2), {2, 1, 2}, {2, 3, 8, 9});
  expect_tensor<int32_t>(ls::slice(iota<int32_t>({5}), 0, 1, 5, 3), {2}, {1, 4});
  expect_tensor<bool>(ls::slice(b8({true, false, true, false}), 0, 1, 4, 2), {2}, {false, false});
  expect_tensor<float>(ls::slice(ls::zeros({0, 3}), 1, 0, 2), {0, 2}, {});
  expect_tensor<float>(ls::slice(ls::zeros({0, 3}), 0, 0, 2), {0, 3}, {});
}

TEST_F(OpsConcat, Values) {
  const ls::Tensor a = f32({1, 2, 3, 4}, {2, 2});
  const ls::Tensor b = f32({5, 6}, {2, 1});
  expect_tensor<float>(ls::concat({a, b}, 1), {2, 3}, {1, 2, 5, 3, 4, 6});
  expect_tensor<float>(ls::concat({a, b}, -1), {2, 3}, {1, 2, 5, 3, 4, 6});
  expect_tensor<float>(ls::concat({b, a, b}, 1), {2, 4}, {5, 1, 2, 5, 6, 3, 4, 6});
  expect_tensor<float>(ls::concat({f32({9, 8}, {1, 2}), a}, 0), {3, 2}, {9, 8, 1, 2, 3, 4});
  expect_tensor<float>(ls::concat({a, ls::zeros({2, 0}), b}, 1), {2, 3}, {1, 2, 5, 3, 4, 6});
  expect_tensor<float>(ls::concat({ls::zeros({0, 2}), a}, 0), {2, 2}, {1, 2, 3, 4});
  expect_tensor<float>(ls::concat({ls::zeros({0, 2}), ls::zeros({0, 2})}, 0), {0, 2}, {});
  expect_tensor<float>(ls::concat({a}, 0), {2, 2}, {1, 2, 3, 4});
  expect_tensor<int64_t>(ls::concat({i64({1}), i64({2, 3})}, 0), {3}, {1, 2, 3});
  expect_tensor<int32_t>(ls::concat({i32({1, 2}, {1, 2, 1}), i32({3, 4}, {1, 2, 1})}, 2), {1, 2, 2},
                         {1, 3, 2, 4});
  expect_tensor<double>(ls::concat({f64({1}), f64({2})}, 0), {2}, {1, 2});
  expect_tensor<bool>(ls::concat({b8({true}), b8({false, true})}, 0), {3}, {true, false, true});
}

TEST_F(OpsPad, Values) {
  const ls::Tensor x = f32({1, 2, 3, 4}, {2, 2});
  expect_tensor<float>(ls::pad(x, {{1, 0}, {0, 2}}, 9), {3, 4},
                       {9, 9, 9, 9, 1, 2, 9, 9, 3, 4, 9, 9});
  expect_tensor<float>(ls::pad(x, {{0, 0}, {1, 1}}), {2, 4}, {0, 1, 2, 0, 0, 3, 4, 0});
  expect_tensor<float>(ls::pad(x, {{0, 0}, {0, 0}}), {2, 2}, {1, 2, 3, 4});
  expect_tensor<float>(
      ls::pad(x, {{1, 1}, {1, 1}}, -0.5), {4, 4},
      {-0.5, -0.5, -0.5, -0.5, -0.5, 1, 2, -0.5, -0.5, 3, 4, -0.5, -0.5, -0.5, -0.5, -0.5});
  expect_tensor<int64_t>(ls::pad(i64({5, 6}), {{2, 1}}, -1), {5}, {-1, -1, 5, 6, -1});
  expect_tensor<int32_t>(ls::pad(i32({5}, {1, 1}), {{0, 1}, {1, 0}}, 7), {2, 2}, {7, 5, 7, 7});
  expect_tensor<double>(ls::pad(f64({1.5}), {{1, 0}}, 2.5), {2}, {2.5, 1.5});
  expect_tensor<bool>(ls::pad(b8({false}), {{1, 1}}, true), {3}, {true, false, true});
  // Empty input: all padding. 0-d input: nothing to pad.
  expect_tensor<float>(ls::pad(ls::zeros({0}), {{1, 2}}, 3), {3}, {3, 3, 3});
  expect_tensor<float>(ls::pad(ls::zeros({2, 0}), {{0, 0}, {1, 0}}, 4), {2, 1}, {4, 4});
  expect_tensor<float>(ls::pad(ls::zeros({2, 0}), {{1, 0}, {0, 0}}, 4), {3, 0}, {});
  expect_tensor<float>(ls::pad(ls::scalar_tensor(6.0f), {}), {}, {6});
}

TEST_F(OpsMovement, ChainsCompose) {
  // transpose -> slice -> reshape -> expand -> pad: all views collapse correctly.
  const ls::Tensor x = iota<int64_t>({2, 3});            // [[0, 1, 2], [3, 4, 5]]
  const ls::Tensor t = ls::transpose(x, 0, 1);           // [[0, 3], [1, 4], [2, 5]]
  const ls::Tensor s = ls::slice(t, 0, 1, 3);            // [[1, 4], [2, 5]]
  const ls::Tensor r = ls::reshape(s, {4, 1});           // [1, 4, 2, 5]^T
  const ls::Tensor e = ls::expand(r, {4, 2});            // each row twice
  const ls::Tensor p = ls::pad(e, {{0, 1}, {0, 0}}, 0);  // one zero row
  expect_tensor<int64_t>(p, {5, 2}, {1, 1, 4, 4, 2, 2, 5, 5, 0, 0});
}

}  // namespace
