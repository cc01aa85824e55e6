// gather and scatter_add against hand-computed values (torch.gather / torch.scatter_add
// semantics), their dtypes, empty indices, and the run-time failure of an out-of-range index.
#include <cstdint>

#include "unit/ops_test_util.h"

namespace {

using namespace ops_test;

using OpsGather = OnTestDevice;
using OpsScatterAdd = OnTestDevice;
using OpsGatherScatter = OnTestDevice;

TEST_F(OpsGather, Axis0) {
  // out[i][j] = x[index[i][j]][j]
  const ls::Tensor x = f32({1, 2, 3, 4, 5, 6}, {3, 2});
  expect_tensor<float>(ls::gather(x, 0, i64({2, 0, 1, 1}, {2, 2})), {2, 2}, {5, 2, 3, 4});
  expect_tensor<float>(ls::gather(x, -2, i64({2, 0, 1, 1}, {2, 2})), {2, 2}, {5, 2, 3, 4});
  // The index may be longer than x along the gather axis, and narrower elsewhere.
  expect_tensor<float>(ls::gather(x, 0, i64({0, 2, 2, 1}, {4, 1})), {4, 1}, {1, 5, 5, 3});
}

TEST_F(OpsGather, Axis1) {
  // out[i][j] = x[i][index[i][j]]
  const ls::Tensor x = i64({1, 2, 3, 4, 5, 6}, {2, 3});
  expect_tensor<int64_t>(ls::gather(x, 1, i64({2, 2, 0, 1, 0, 0}, {2, 3})), {2, 3},
                         {3, 3, 1, 5, 4, 4});
  expect_tensor<int64_t>(ls::gather(x, -1, i64({0, 2}, {2, 1})), {2, 1}, {1, 6});
  expect_tensor<int64_t>(ls::gather(x, 1, i64({0, 0, 0, 0, 1, 1, 1, 1}, {2, 4})), {2, 4},
                         {1, 1, 1, 1, 5, 5, 5, 5});
  expect_tensor<int64_t>(ls::gather(x, 1, i64({1}, {1, 1})), {1, 1}, {2});
}

TEST_F(OpsGather, ThreeDimsAndDtypes) {
  // x[i][j][k] = 100 i + 10 j + k, gather along the middle axis.
  std::vector<double> xv;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 2; ++k) xv.push_back(100 * i + 10 * j + k);
  const ls::Tensor x = f64(xv, {2, 3, 2});
  const ls::Tensor idx = i64({2, 0, 1, 1}, {2, 1, 2});  // idx[i][0][k]
  expect_tensor<double>(ls::gather(x, 1, idx), {2, 1, 2}, {20, 1, 110, 111});
  expect_tensor<int32_t>(ls::gather(i32({7, 8, 9}), 0, i64({2, 2, 0})), {3}, {9, 9, 7});
  expect_tensor<bool>(ls::gather(b8({true, false}), 0, i64({1, 0, 1})), {3}, {false, true, false});
  expect_tensor<float>(ls::gather(f32({1, 2}), 0, ls::zeros({0}, ls::i64)), {0}, {});
  expect_tensor<float>(ls::gather(f32({1, 2, 3, 4}, {2, 2}), 1, ls::zeros({2, 0}, ls::i64)), {2, 0},
                       {});
}

TEST_F(OpsGather, OutOfRangeIndexFailsAtRunTime) {
  const ls::Tensor x = f32({1, 2, 3});
  ls::Tensor hi = ls::gather(x, 0, i64({0, 3}));
  EXPECT_BACKEND_ERROR(hi.to_vector<float>(), "gather", "index 3", "out of range");
  ls::Tensor lo = ls::gather(x, 0, i64({-4}));
  EXPECT_BACKEND_ERROR(lo.to_vector<float>(), "gather", "out of range");
  ls::Tensor on_axis1 = ls::gather(f32({1, 2, 3, 4}, {2, 2}), 1, i64({0, 1, 2, 0}, {2, 2}));
  EXPECT_BACKEND_ERROR(on_axis1.to_vector<float>(), "gather", "index 2");
  // Computing on a poisoned value fails too; the runtime then works normally.
  EXPECT_LS_ERROR((hi + 1).to_vector<float>(), "out of range");
  expect_tensor<float>(ls::gather(x, 0, i64({2})), {1}, {3});
}

TEST_F(OpsScatterAdd, Axis0) {
  // out = x; out[index[i][j]][j] += src[i][j]
  const ls::Tensor src = f32({1, 2, 3, 4, 5, 6}, {3, 2});
  const ls::Tensor idx = i64({0, 1, 0, 2, 2, 2}, {3, 2});
  expect_tensor<float>(ls::scatter_add(ls::zeros({3, 2}), 0, idx, src), {3, 2},
                       {4, 0, 0, 2, 5, 10});
  expect_tensor<float>(ls::scatter_add(ls::ones({3, 2}), 0, idx, src), {3, 2}, {5, 1, 1, 3, 6, 11});
  expect_tensor<float>(ls::scatter_add(ls::zeros({3, 2}), -2, idx, src), {3, 2},
                       {4, 0, 0, 2, 5, 10});
  // x may be larger than the index along the scatter axis.
  expect_tensor<float>(ls::scatter_add(ls::zeros({4, 2}), 0, i64({3, 0}, {1, 2}), src), {4, 2},
                       {0, 2, 0, 0, 0, 0, 1, 0});
}

TEST_F(OpsScatterAdd, Axis1AndLargerSrc) {
  const ls::Tensor src = i64({1, 2, 3, 4, 5, 6}, {2, 3});
  const ls::Tensor idx = i64({0, 0, 2, 1, 1, 1}, {2, 3});
  expect_tensor<int64_t>(ls::scatter_add(ls::zeros({2, 3}, ls::i64), 1, idx, src), {2, 3},
                         {3, 0, 3, 0, 15, 0});
  // src larger than the index: only src[:2, :2] is used.
  const ls::Tensor big = f64({1, 2, 3, 4, 5, 6, 7, 8, 9}, {3, 3});
  expect_tensor<double>(
      ls::scatter_add(ls::zeros({2, 2}, ls::f64), 1, i64({1, 1, 0, 1}, {2, 2}), big), {2, 2},
      {0, 3, 4, 5});
  expect_tensor<int32_t>(ls::scatter_add(i32({10, 20, 30}), 0, i64({2, 2, 0}), i32({1, 2, 3})), {3},
                         {13, 20, 33});
  // Integers wrap around, as integer add does.
  expect_tensor<int32_t>(ls::scatter_add(i32({INT32_MAX, 0}), 0, i64({0, 0}), i32({1, 1})), {2},
                         {INT32_MIN + 1, 0});
  expect_tensor<int64_t>(ls::scatter_add(i64({INT64_MIN}), 0, i64({0}), i64({-1})), {1},
                         {INT64_MAX});
  // bool accumulates with "or".
  expect_tensor<bool>(
      ls::scatter_add(b8({false, false, false}), 0, i64({0, 0, 2}), b8({true, false, true})), {3},
      {true, false, true});
  // An empty index changes nothing.
  expect_tensor<float>(ls::scatter_add(f32({1, 2}), 0, ls::zeros({0}, ls::i64), f32({5})), {2},
                       {1, 2});
}

TEST_F(OpsScatterAdd, OutOfRangeIndexFailsAtRunTime) {
  ls::Tensor y = ls::scatter_add(ls::zeros({2}), 0, i64({0, 2}), f32({1, 1}));
  EXPECT_BACKEND_ERROR(y.to_vector<float>(), "scatter_add", "index 2", "out of range");
  ls::Tensor z = ls::scatter_add(ls::zeros({2}), 0, i64({-3}), f32({1}));
  EXPECT_BACKEND_ERROR(z.to_vector<float>(), "scatter_add", "out of range");
}

TEST_F(OpsGatherScatter, ScatterAddIsTheAdjointOfGather) {
  // <gather(x, idx), g> == <x, scatter_add(0, idx, g)> for any x, g.
  const ls::Tensor x = f64({0.5, -1, 2, 3, 0.25, -4, 1.5, 2.5, -0.75, 1, 2, 3}, {3, 4});
  const ls::Tensor idx = i64({2, 0, 1, 1, 0, 0, 2, 2}, {2, 4});
  const ls::Tensor g = f64({1, 2, 3, 4, 5, 6, 7, 8}, {2, 4});
  for (int64_t axis : {0, 1}) {
    SCOPED_TRACE(axis);
    const ls::Tensor lhs = ls::sum(ls::gather(x, axis, idx) * g);
    const ls::Tensor rhs = ls::sum(x * ls::scatter_add(ls::zeros_like(x), axis, idx, g));
    EXPECT_NEAR(lhs.item<double>(), rhs.item<double>(), 1e-12);
  }
}

}  // namespace

// The index ops written on gather (index_select, take_along_dim, one_hot's scatter) refuse
// negative and out-of-range indices when the step runs, as PyTorch does; nothing wraps.
TEST(OpsIndexComposites, NegativeAndOutOfRangeIndicesAreErrors) {
  const ls::Tensor x = ls::from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2});
  ls::Tensor a = ls::index_select(x, 0, ls::from_vector<int64_t>({0, -1}));
  EXPECT_BACKEND_ERROR(a.to_vector<float>(), "index -1", "negative indices are errors");
  ls::Tensor b = ls::take_along_dim(x, ls::from_vector<int64_t>({0, 2, 1}, {3, 1}), 1);
  EXPECT_BACKEND_ERROR(b.to_vector<float>(), "index 2", "out of range");
  ls::Tensor c = ls::one_hot(ls::from_vector<int64_t>({1, 4}), 4);
  EXPECT_BACKEND_ERROR(c.to_vector<int64_t>(), "index 4");
  ls::Tensor d = ls::one_hot(ls::from_vector<int64_t>({-1}), 4);
  EXPECT_BACKEND_ERROR(d.to_vector<int64_t>(), "negative indices are errors");
  expect_tensor<float>(ls::index_select(x, 1, ls::from_vector<int64_t>({1, 1})), {3, 2},
                       {2, 2, 4, 4, 6, 6});
  EXPECT_LS_ERROR(ls::index_select(x, 0, ls::zeros({2}, ls::f32)), "index_select", "integer");
  EXPECT_LS_ERROR(ls::one_hot(ls::from_vector<int64_t>({1}), 0), "one_hot", "num_classes");
}
