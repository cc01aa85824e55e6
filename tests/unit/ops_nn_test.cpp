// matmul, conv2d and its two gradients, max/avg pooling and their gradients: small cases by
// hand, larger ones against naive loops written here (PyTorch semantics), and the gradients by
// the adjoint identity <op(x), g> == <x, op_backward(g)> in f64.
#include <algorithm>
#include <cstdint>
#include <limits>

#include "unit/ops_test_util.h"

namespace {

using namespace ops_test;

using OpsMatmul = OnTestDevice;
using OpsConv2d = OnTestDevice;
using OpsMaxPool2d = OnTestDevice;
using OpsAvgPool2d = OnTestDevice;
using OpsPool2d = OnTestDevice;

// Deterministic, distinct-ish values in [-5, 5] that are exact in f32.
std::vector<double> data(int64_t n, int salt) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<double>((i * 37 + salt * 11) % 23) / 2 - 5.5;
  return v;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double s = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) s += a[i] * b[i];
  return s;
}

// ---- matmul -------------------------------------------------------------------------------
TEST_F(OpsMatmul, HandComputed) {
  const ls::Tensor a = f32({1, 2, 3, 4, 5, 6}, {2, 3});
  const ls::Tensor b = f32({7, 8, 9, 10, 11, 12}, {3, 2});
  expect_tensor<float>(ls::matmul(a, b), {2, 2}, {58, 64, 139, 154});
  expect_tensor<float>(ls::matmul(b, a), {3, 3}, {39, 54, 69, 49, 68, 87, 59, 82, 105});
  // 1-d operands as numpy.matmul.
  expect_tensor<float>(ls::matmul(f32({1, 2, 3}), f32({4, 5, 6})), {}, {32});
  expect_tensor<float>(ls::matmul(a, f32({1, 0, -1})), {2}, {-2, -2});
  expect_tensor<float>(ls::matmul(f32({1, 1}), a), {3}, {5, 7, 9});
  expect_tensor<double>(ls::matmul(f64({1, 2, 3, 4}, {2, 2}), f64({0.5, -1}, {2, 1})), {2, 1},
                        {-1.5, -2.5});
  expect_tensor<int32_t>(ls::matmul(i32({1, 2, 3, 4}, {2, 2}), i32({5, 6, 7, 8}, {2, 2})), {2, 2},
                         {19, 22, 43, 50});
  expect_tensor<int64_t>(ls::matmul(i64({1, -2}, {1, 2}), i64({3, 4}, {2, 1})), {1, 1}, {-5});
}

TEST_F(OpsMatmul, EmptyInnerAndOuterDims) {
  expect_tensor<float>(ls::matmul(ls::zeros({2, 0}), ls::zeros({0, 3})), {2, 3},
                       {0, 0, 0, 0, 0, 0});
  expect_tensor<float>(ls::matmul(ls::zeros({0, 4}), ls::ones({4, 3})), {0, 3}, {});
  expect_tensor<float>(ls::matmul(ls::zeros({0}), ls::zeros({0})), {}, {0});
  expect_tensor<float>(ls::matmul(ls::zeros({0, 2, 3}), ls::ones({3, 1})), {0, 2, 1}, {});
}

// y[b...][i][j] = sum_k a[.][i][k] b[.][k][j] with batch broadcasting, by hand.
std::vector<double> naive_batched(const std::vector<double>& a, const ls::Shape& as,
                                  const std::vector<double>& b, const ls::Shape& bs,
                                  ls::Shape* out) {
  const size_t r = as.size();  // both rank r here
  const int64_t M = as[r - 2], K = as[r - 1], N = bs[r - 1];
  ls::Shape batch;
  for (size_t d = 0; d + 2 < r; ++d) batch.push_back(std::max(as[d], bs[d]));
  *out = batch;
  out->push_back(M);
  out->push_back(N);
  std::vector<double> y;
  const int64_t nb = ls::shape_numel(batch);
  for (int64_t bi = 0; bi < nb; ++bi) {
    int64_t ao = 0, bo = 0, rest = bi, astr = M * K, bstr = K * N;
    for (size_t d = batch.size(); d-- > 0;) {
      const int64_t i = rest % batch[d];
      rest /= batch[d];
      ao += (as[d] == 1 ? 0 : i) * astr;
      bo += (bs[d] == 1 ? 0 : i) * bstr;
      astr *= as[d];
      bstr *= bs[d];
    }
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) s += a[ao + i * K + k] * b[bo + k * N + j];
        y.push_back(s);
      }
  }
  return y;
}

TEST_F(OpsMatmul, BatchedWithBroadcast) {
  struct Case {
    ls::Shape a, b;
  };
  for (const Case& c : {Case{{2, 2, 3}, {2, 3, 4}}, Case{{2, 1, 2, 3}, {3, 3, 2}},
                        Case{{1, 3, 2}, {4, 1, 2, 2}}, Case{{3, 2, 2}, {2, 5}}}) {
    SCOPED_TRACE(ls::shape_str(c.a) + " x " + ls::shape_str(c.b));
    const std::vector<double> av = data(ls::shape_numel(c.a), 1);
    const std::vector<double> bv = data(ls::shape_numel(c.b), 2);
    // Align ranks for the reference.
    ls::Shape as = c.a, bs = c.b;
    while (as.size() < bs.size()) as.insert(as.begin(), 1);
    while (bs.size() < as.size()) bs.insert(bs.begin(), 1);
    ls::Shape out;
    const std::vector<double> want = naive_batched(av, as, bv, bs, &out);
    expect_tensor<double>(ls::matmul(f64(av, c.a), f64(bv, c.b)), out, want);
  }
}

TEST_F(OpsMatmul, VectorWithBatchedMatrix) {
  // [2] x [3, 2, 4] -> [3, 4];  [3, 2, 4] x [4] -> [3, 2]
  const ls::Tensor m = iota<float>({3, 2, 4});  // m[b][k][j] = 8b + 4k + j
  std::vector<float> left;
  for (int b = 0; b < 3; ++b)
    for (int j = 0; j < 4; ++j)
      left.push_back(static_cast<float>((8 * b + j) + 2 * (8 * b + 4 + j)));
  expect_tensor<float>(ls::matmul(f32({1, 2}), m), {3, 4}, left);
  std::vector<float> right;
  for (int b = 0; b < 3; ++b)
    for (int k = 0; k < 2; ++k) right.push_back(static_cast<float>(8 * b + 4 * k + 3));
  expect_tensor<float>(ls::matmul(m, f32({0, 0, 0, 1})), {3, 2}, right);
}

// ---- conv2d -------------------------------------------------------------------------------
TEST_F(OpsConv2d, HandComputed) {
  const ls::Tensor x = f32({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3});
  const ls::Tensor w = f32({1, 2, 3, 4}, {1, 1, 2, 2});
  expect_tensor<float>(ls::conv2d(x, w), {1, 1, 2, 2}, {37, 47, 67, 77});
  // Padding 1, 3x3 ones kernel on ones: corners see 4, edges 6, the center 9.
  expect_tensor<float>(
      ls::conv2d(ls::ones({1, 1, 3, 3}), ls::ones({1, 1, 3, 3}), {.padding = {1, 1}}), {1, 1, 3, 3},
      {4, 6, 4, 6, 9, 6, 4, 6, 4});
  // Stride 2: 2x2 window sums of 0..15.
  expect_tensor<float>(
      ls::conv2d(iota<float>({1, 1, 4, 4}), ls::ones({1, 1, 2, 2}), {.stride = {2, 2}}),
      {1, 1, 2, 2}, {10, 18, 42, 50});
  // Dilation 2: the four corners of the 3x3 input.
  expect_tensor<float>(ls::conv2d(x, ls::ones({1, 1, 2, 2}), {.dilation = {2, 2}}), {1, 1, 1, 1},
                       {20});
  // Two groups of one channel each, two output channels: out[o] = x[o] * w[o].
  expect_tensor<double>(
      ls::conv2d(f64({1, 2, 3, 4}, {1, 2, 1, 2}), f64({10, 100}, {2, 1, 1, 1}), {.groups = 2}),
      {1, 2, 1, 2}, {10, 20, 300, 400});
  // Two input channels summed.
  expect_tensor<double>(ls::conv2d(f64({1, 2, 3, 4}, {1, 2, 1, 2}), f64({10, 100}, {1, 2, 1, 1})),
                        {1, 1, 1, 2}, {310, 420});
}

TEST_F(OpsConv2d, GradientsHandComputed) {
  const ls::Tensor x = f32({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3});
  const ls::Tensor w = f32({1, 2, 3, 4}, {1, 1, 2, 2});
  const ls::Tensor g = ls::ones({1, 1, 2, 2});
  expect_tensor<float>(ls::conv2d_backward_input(g, w, {1, 1, 3, 3}), {1, 1, 3, 3},
                       {1, 3, 2, 4, 10, 6, 3, 7, 4});
  expect_tensor<float>(ls::conv2d_backward_weight(x, g, {1, 1, 2, 2}), {1, 1, 2, 2},
                       {12, 16, 24, 28});
  // Stride 2 on a 5x5 input: the last row and column never reach the output.
  const ls::Tensor gi = ls::conv2d_backward_input(ls::ones({1, 1, 2, 2}), ls::ones({1, 1, 2, 2}),
                                                  {1, 1, 5, 5}, {.stride = {2, 2}});
  expect_tensor<float>(gi, {1, 1, 5, 5},
                       {1, 1, 1, 1, 0, 1, 1, 1, 1, 0, 1, 1, 1, 1, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0});
}

TEST_F(OpsConv2d, EmptyBatchAndChannels) {
  expect_tensor<float>(ls::conv2d(ls::zeros({0, 2, 4, 4}), ls::ones({3, 2, 3, 3})), {0, 3, 2, 2},
                       {});
  // No input channels: every output is an empty sum.
  expect_tensor<float>(ls::conv2d(ls::zeros({1, 0, 3, 3}), ls::ones({2, 0, 2, 2})), {1, 2, 2, 2},
                       {0, 0, 0, 0, 0, 0, 0, 0});
  expect_tensor<float>(
      ls::conv2d_backward_input(ls::zeros({0, 3, 2, 2}), ls::ones({3, 2, 3, 3}), {0, 2, 4, 4}),
      {0, 2, 4, 4}, {});
  expect_tensor<float>(
      ls::conv2d_backward_weight(ls::zeros({0, 2, 4, 4}), ls::zeros({0, 3, 2, 2}), {3, 2, 3, 3}),
      {3, 2, 3, 3}, std::vector<float>(54, 0));
  expect_tensor<float>(ls::max_pool2d(ls::zeros({0, 2, 4, 4}), {}), {0, 2, 2, 2}, {});
  expect_tensor<float>(ls::avg_pool2d(ls::zeros({2, 0, 4, 4}), {}), {2, 0, 2, 2}, {});
}

struct ConvCase {
  ls::Shape x, w;
  ls::Conv2dOptions o;
};

std::vector<ConvCase> conv_cases() {
  return {
      {{2, 3, 5, 6}, {4, 3, 3, 2}, {}},
      {{1, 2, 7, 7}, {2, 2, 3, 3}, {.stride = {2, 2}, .padding = {1, 1}}},
      {{1, 4, 6, 5},
       {6, 2, 2, 3},
       {.stride = {1, 2}, .padding = {2, 1}, .dilation = {2, 1}, .groups = 2}},
      {{2, 4, 5, 5}, {4, 1, 3, 3}, {.padding = {1, 1}, .groups = 4}},
      {{1, 1, 8, 7}, {1, 1, 3, 2}, {.stride = {3, 2}, .padding = {0, 2}, .dilation = {2, 3}}},
      {{1, 6, 4, 4}, {3, 2, 1, 1}, {.groups = 3}},
      {{1, 2, 5, 5}, {3, 2, 2, 2}, {.stride = {2, 2}}},
  };
}

// Direct definition of a grouped, strided, padded, dilated cross-correlation (PyTorch conv2d).
std::vector<double> naive_conv(const std::vector<double>& x, const ls::Shape& xs,
                               const std::vector<double>& w, const ls::Shape& ws,
                               const ls::Conv2dOptions& o, ls::Shape* out) {
  const int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3];
  const int64_t O = ws[0], Cg = ws[1], KH = ws[2], KW = ws[3];
  const int64_t Og = O / o.groups;
  const int64_t HO = (H + 2 * o.padding[0] - o.dilation[0] * (KH - 1) - 1) / o.stride[0] + 1;
  const int64_t WO = (W + 2 * o.padding[1] - o.dilation[1] * (KW - 1) - 1) / o.stride[1] + 1;
  *out = {N, O, HO, WO};
  std::vector<double> y;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t oc = 0; oc < O; ++oc)
      for (int64_t i = 0; i < HO; ++i)
        for (int64_t j = 0; j < WO; ++j) {
          double s = 0;
          for (int64_t ci = 0; ci < Cg; ++ci) {
            const int64_t c = (oc / Og) * Cg + ci;
            for (int64_t a = 0; a < KH; ++a)
              for (int64_t b = 0; b < KW; ++b) {
                const int64_t h = i * o.stride[0] - o.padding[0] + a * o.dilation[0];
                const int64_t v = j * o.stride[1] - o.padding[1] + b * o.dilation[1];
                if (h < 0 || h >= H || v < 0 || v >= W) continue;
                s += x[((n * C + c) * H + h) * W + v] * w[((oc * Cg + ci) * KH + a) * KW + b];
              }
          }
          y.push_back(s);
        }
  return y;
}

TEST_F(OpsConv2d, MatchesNaiveLoop) {
  int salt = 0;
  for (const ConvCase& c : conv_cases()) {
    SCOPED_TRACE(ls::shape_str(c.x) + " * " + ls::shape_str(c.w));
    const std::vector<double> xv = data(ls::shape_numel(c.x), ++salt);
    const std::vector<double> wv = data(ls::shape_numel(c.w), ++salt);
    ls::Shape out;
    const std::vector<double> want = naive_conv(xv, c.x, wv, c.w, c.o, &out);
    expect_tensor<double>(ls::conv2d(f64(xv, c.x), f64(wv, c.w), c.o), out, want);
    // f32 too (the values are small multiples of 1/2, so sums are exact).
    std::vector<float> want32(want.begin(), want.end());
    expect_tensor<float>(ls::conv2d(f64(xv, c.x).to(ls::f32), f64(wv, c.w).to(ls::f32), c.o), out,
                         want32);
  }
}

TEST_F(OpsConv2d, GradientsSatisfyTheAdjointIdentity) {
  int salt = 100;
  for (const ConvCase& c : conv_cases()) {
    SCOPED_TRACE(ls::shape_str(c.x) + " * " + ls::shape_str(c.w));
    const std::vector<double> xv = data(ls::shape_numel(c.x), ++salt);
    const std::vector<double> wv = data(ls::shape_numel(c.w), ++salt);
    const ls::Tensor x = f64(xv, c.x), w = f64(wv, c.w);
    const ls::Tensor y = ls::conv2d(x, w, c.o);
    const std::vector<double> gv = data(y.numel(), ++salt);
    const ls::Tensor g = f64(gv, y.shape());
    const ls::Tensor gx = ls::conv2d_backward_input(g, w, c.x, c.o);
    const ls::Tensor gw = ls::conv2d_backward_weight(x, g, c.w, c.o);
    EXPECT_EQ(gx.shape(), c.x);
    EXPECT_EQ(gw.shape(), c.w);
    const double lhs = dot(y.to_vector<double>(), gv);
    EXPECT_NEAR(dot(xv, gx.to_vector<double>()), lhs, 1e-9 * (1 + std::abs(lhs)));
    EXPECT_NEAR(dot(wv, gw.to_vector<double>()), lhs, 1e-9 * (1 + std::abs(lhs)));
  }
}

// ---- pooling ------------------------------------------------------------------------------
TEST_F(OpsMaxPool2d, HandComputed) {
  const std::vector<float> xv = {1, 5, 2, 0, 3, 4, 8, 6, 7, 2, 9, 1, 0, 6, 3, 9};
  const ls::Tensor x = f32(xv, {1, 1, 4, 4});
  expect_tensor<float>(ls::max_pool2d(x, {.kernel = {2, 2}}), {1, 1, 2, 2}, {5, 8, 7, 9});
  auto [v, idx] = ls::max_pool2d_with_indices(x, {.kernel = {2, 2}});
  expect_tensor<float>(v, {1, 1, 2, 2}, {5, 8, 7, 9});
  // Indices into the flattened H*W plane; the tie between (2,2) and (3,3) keeps the first.
  expect_tensor<int64_t>(idx, {1, 1, 2, 2}, {1, 6, 8, 10});
  // With padding the padded cells never win, even when every real value is negative.
  std::vector<float> neg;
  for (float f : xv) neg.push_back(-f - 1);
  auto [pv, pidx] = ls::max_pool2d_with_indices(
      f32(neg, {1, 1, 4, 4}), {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}});
  expect_tensor<float>(pv, {1, 1, 2, 2}, {-2, -1, -1, -2});
  expect_tensor<int64_t>(pidx, {1, 1, 2, 2}, {0, 3, 12, 11});
  // Integer input, two planes: indices restart in each plane.
  auto [iv, iidx] =
      ls::max_pool2d_with_indices(i64({1, 2, 3, 4, 8, 7, 6, 5}, {1, 2, 2, 2}), {.kernel = {2, 2}});
  expect_tensor<int64_t>(iv, {1, 2, 1, 1}, {4, 8});
  expect_tensor<int64_t>(iidx, {1, 2, 1, 1}, {3, 0});
  const double nan = std::numeric_limits<double>::quiet_NaN();
  expect_tensor<double>(ls::max_pool2d(f64({1, nan, 3, 2}, {1, 1, 2, 2}), {.kernel = {2, 2}}),
                        {1, 1, 1, 1}, {nan});
}

TEST_F(OpsMaxPool2d, BackwardHandComputed) {
  // Overlapping windows (stride 1) that all pick the center: its gradient is their sum.
  const ls::Tensor x = f32({1, 2, 3, 4, 9, 5, 6, 7, 8}, {1, 1, 3, 3});
  const ls::Pool2dOptions o{.kernel = {2, 2}, .stride = {1, 1}};
  auto [v, idx] = ls::max_pool2d_with_indices(x, o);
  expect_tensor<int64_t>(idx, {1, 1, 2, 2}, {4, 4, 4, 4});
  expect_tensor<float>(
      ls::max_pool2d_backward(f32({1, 2, 3, 4}, {1, 1, 2, 2}), idx, {1, 1, 3, 3}, o), {1, 1, 3, 3},
      {0, 0, 0, 0, 10, 0, 0, 0, 0});
}

TEST_F(OpsAvgPool2d, HandComputed) {
  const ls::Tensor x = iota<float>({1, 1, 4, 4});
  expect_tensor<float>(ls::avg_pool2d(x, {.kernel = {2, 2}}), {1, 1, 2, 2}, {2.5, 4.5, 10.5, 12.5});
  // Padding 1, kernel 3, stride 2: PyTorch's default counts the padding in the divisor (9);
  // count_include_pad = false divides by the real cells only.
  const ls::Pool2dOptions o{.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}};
  expect_tensor<float>(ls::avg_pool2d(x, o), {1, 1, 2, 2},
                       {10.0 / 9, 24.0 / 9, 51.0 / 9, 90.0 / 9});
  ls::Pool2dOptions ex = o;
  ex.count_include_pad = false;
  expect_tensor<float>(ls::avg_pool2d(x, ex), {1, 1, 2, 2}, {2.5, 4, 8.5, 10});
  // Backward: each output's gradient spread evenly over its window.
  expect_tensor<float>(
      ls::avg_pool2d_backward(f32({4, 8, 12, 16}, {1, 1, 2, 2}), {1, 1, 4, 4}, {.kernel = {2, 2}}),
      {1, 1, 4, 4}, {1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4});
  // Backward with padding: corner (0, 0) of a 3x3 input is the only real cell of output (0, 0).
  const ls::Pool2dOptions p{.kernel = {2, 2}, .stride = {2, 2}, .padding = {1, 1}};
  expect_tensor<double>(ls::avg_pool2d_backward(f64({4, 0, 0, 0}, {1, 1, 2, 2}), {1, 1, 3, 3}, p),
                        {1, 1, 3, 3}, {1, 0, 0, 0, 0, 0, 0, 0, 0});
  ls::Pool2dOptions pex = p;
  pex.count_include_pad = false;
  expect_tensor<double>(ls::avg_pool2d_backward(f64({4, 0, 0, 0}, {1, 1, 2, 2}), {1, 1, 3, 3}, pex),
                        {1, 1, 3, 3}, {4, 0, 0, 0, 0, 0, 0, 0, 0});
}

struct PoolCase {
  ls::Shape x;
  ls::Pool2dOptions o;
};

std::vector<PoolCase> pool_cases() {
  return {
      {{2, 3, 4, 4}, {.kernel = {2, 2}}},
      {{1, 2, 5, 5}, {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}}},
      {{1, 1, 6, 5}, {.kernel = {3, 2}, .stride = {1, 2}, .padding = {1, 1}}},
      {{1, 1, 4, 4}, {.kernel = {2, 2}, .stride = {1, 1}}},
      {{1, 1, 7, 7}, {.kernel = {3, 3}, .stride = {3, 3}, .padding = {1, 0}}},
      {{2, 1, 5, 6}, {.kernel = {4, 2}, .stride = {2, 3}, .padding = {2, 1}}},
  };
}

// PyTorch's max_pool2d / avg_pool2d (ceil_mode false) written out directly.
struct NaivePool {
  std::vector<double> max, avg;
  std::vector<int64_t> argmax;
  ls::Shape shape;
};

NaivePool naive_pool(const std::vector<double>& x, const ls::Shape& xs, ls::Pool2dOptions o) {
  const int64_t P = xs[0] * xs[1], H = xs[2], W = xs[3];
  const int64_t kh = o.kernel[0], kw = o.kernel[1], ph = o.padding[0], pw = o.padding[1];
  const int64_t sh = o.stride[0] ? o.stride[0] : kh, sw = o.stride[1] ? o.stride[1] : kw;
  const int64_t HO = (H + 2 * ph - kh) / sh + 1, WO = (W + 2 * pw - kw) / sw + 1;
  NaivePool r;
  r.shape = {xs[0], xs[1], HO, WO};
  for (int64_t p = 0; p < P; ++p)
    for (int64_t i = 0; i < HO; ++i)
      for (int64_t j = 0; j < WO; ++j) {
        double best = -std::numeric_limits<double>::infinity(), sum = 0;
        int64_t at = -1, real = 0;
        for (int64_t a = 0; a < kh; ++a)
          for (int64_t b = 0; b < kw; ++b) {
            const int64_t h = i * sh - ph + a, w = j * sw - pw + b;
            if (h < 0 || h >= H || w < 0 || w >= W) continue;
            const double v = x[(p * H + h) * W + w];
            if (at < 0 || v > best) best = v, at = h * W + w;
            sum += v;
            ++real;
          }
        r.max.push_back(best);
        r.argmax.push_back(at);
        // Floor mode: a window never extends past the padded edge, so the padded window size
        // is kh * kw.
        r.avg.push_back(sum / static_cast<double>(o.count_include_pad ? kh * kw : real));
      }
  return r;
}

TEST_F(OpsPool2d, MatchesNaiveLoops) {
  int salt = 0;
  for (PoolCase c : pool_cases()) {
    for (bool include_pad : {true, false}) {
      c.o.count_include_pad = include_pad;
      SCOPED_TRACE(ls::shape_str(c.x) + (include_pad ? " include_pad" : " exclude_pad"));
      const std::vector<double> xv = data(ls::shape_numel(c.x), ++salt);
      const NaivePool want = naive_pool(xv, c.x, c.o);
      const ls::Tensor x = f64(xv, c.x);
      auto [v, idx] = ls::max_pool2d_with_indices(x, c.o);
      expect_tensor<double>(v, want.shape, want.max);
      expect_tensor<int64_t>(idx, want.shape, want.argmax);
      expect_tensor<double>(ls::max_pool2d(x, c.o), want.shape, want.max);
      expect_tensor<double>(ls::avg_pool2d(x, c.o), want.shape, want.avg);
    }
  }
}

TEST_F(OpsPool2d, GradientsSatisfyTheAdjointIdentity) {
  int salt = 50;
  for (PoolCase c : pool_cases()) {
    for (bool include_pad : {true, false}) {
      c.o.count_include_pad = include_pad;
      SCOPED_TRACE(ls::shape_str(c.x) + (include_pad ? " include_pad" : " exclude_pad"));
      const std::vector<double> xv = data(ls::shape_numel(c.x), ++salt);
      const ls::Tensor x = f64(xv, c.x);
      auto [v, idx] = ls::max_pool2d_with_indices(x, c.o);
      const std::vector<double> gv = data(v.numel(), ++salt);
      const ls::Tensor g = f64(gv, v.shape());
      // max pooling is linear in x once the indices are fixed.
      const ls::Tensor gmax = ls::max_pool2d_backward(g, idx, c.x, c.o);
      const double lmax = dot(v.to_vector<double>(), gv);
      EXPECT_NEAR(dot(xv, gmax.to_vector<double>()), lmax, 1e-9 * (1 + std::abs(lmax)));
      const ls::Tensor gavg = ls::avg_pool2d_backward(g, c.x, c.o);
      const double lavg = dot(ls::avg_pool2d(x, c.o).to_vector<double>(), gv);
      EXPECT_NEAR(dot(xv, gavg.to_vector<double>()), lavg, 1e-9 * (1 + std::abs(lavg)));
    }
  }
}

TEST_F(OpsPool2d, BackwardWithBadIndicesFailsAtRunTime) {
  const ls::Pool2dOptions o{.kernel = {2, 2}};
  ls::Tensor gx =
      ls::max_pool2d_backward(ls::ones({1, 1, 1, 1}), i64({4}, {1, 1, 1, 1}), {1, 1, 2, 2}, o);
  EXPECT_BACKEND_ERROR(gx.to_vector<float>(), "max_pool2d_backward", "out of range");
}

}  // namespace
