// Tests of the losses in nn.h against PyTorch's documented formulas computed here with plain
// loops (values and gradients), and the errors for bad inputs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "unit/ops_test_util.h"
#include "unit/train_test_util.h"

namespace {

using ops_test::f32;
using ops_test::f64;
using ops_test::i64;
using train_test::as_double;
using train_test::expect_all_near;
using train_test::values;

// PyTorch's cross_entropy (class-index targets) in plain loops: per row
// (1 - eps) * (-log p[y]) + eps / C * sum_c (-log p[c]); ignored rows are 0 and left out of the
// mean's denominator.
std::vector<double> ce_rows(const std::vector<double>& z, const std::vector<int64_t>& y, int64_t C,
                            int64_t ignore, double eps) {
  std::vector<double> out;
  for (size_t i = 0; i < y.size(); ++i) {
    if (y[i] == ignore) {
      out.push_back(0);
      continue;
    }
    double m = -1e300, s = 0;
    for (int64_t c = 0; c < C; ++c) m = std::max(m, z[i * C + c]);
    for (int64_t c = 0; c < C; ++c) s += std::exp(z[i * C + c] - m);
    const double lse = m + std::log(s);
    double all = 0;
    for (int64_t c = 0; c < C; ++c) all += lse - z[i * C + c];
    out.push_back((1 - eps) * (lse - z[i * C + y[i]]) + eps / C * all);
  }
  return out;
}

}  // namespace

TEST(NnLoss, CrossEntropyWithIgnoreIndexAndLabelSmoothing) {
  const int64_t C = 4;
  const std::vector<double> z = values(5 * C, 21);
  const std::vector<int64_t> y{2, -100, 0, 3, 1};
  ls::Tensor logits = f64(z, {5, C});
  ls::Tensor t = i64(y);
  for (double eps : {0.0, 0.1}) {
    SCOPED_TRACE(::testing::Message() << "label_smoothing " << eps);
    const std::vector<double> rows = ce_rows(z, y, C, -100, eps);
    double total = 0;
    for (double r : rows) total += r;
    ls::nn::CrossEntropyOptions o{.label_smoothing = eps};
    EXPECT_NEAR(ls::nn::cross_entropy(logits, t, o).item<double>(), total / 4, 1e-12);
    o.reduction = ls::nn::Reduction::Sum;
    EXPECT_NEAR(ls::nn::cross_entropy(logits, t, o).item<double>(), total, 1e-12);
    o.reduction = ls::nn::Reduction::None;
    expect_all_near(ls::nn::cross_entropy(logits, t, o).to_vector<double>(), rows, 1e-12);
    // Another ignore_index: class 0 rows are left out instead.
    const std::vector<double> r0 = ce_rows(z, {2, 1, 0, 3, 1}, C, 0, eps);
    double t0 = 0;
    for (double r : r0) t0 += r;
    EXPECT_NEAR(ls::nn::cross_entropy(logits, i64({2, 1, 0, 3, 1}),
                                      {.ignore_index = 0, .label_smoothing = eps})
                    .item<double>(),
                t0 / 4, 1e-12);
  }
  // Gradient: (softmax - smoothed one-hot) / count for kept rows, 0 for ignored ones.
  ls::Tensor zl = f64(z, {5, C});
  zl.set_requires_grad();
  const double eps = 0.2;
  ls::step([&] { ls::nn::cross_entropy(zl, t, {.label_smoothing = eps}).backward(); });
  std::vector<double> want;
  for (size_t i = 0; i < 5; ++i) {
    double s = 0;
    for (int64_t c = 0; c < C; ++c) s += std::exp(z[i * C + c]);
    for (int64_t c = 0; c < C; ++c) {
      const double target = (c == y[i] ? 1 - eps : 0) + eps / C;
      want.push_back(y[i] == -100 ? 0 : (std::exp(z[i * C + c]) / s - target) / 4);
    }
  }
  expect_all_near(zl.grad().to_vector<double>(), want, 1e-12);
}

TEST(NnLoss, CrossEntropyInFloat32AndNllLoss) {
  const std::vector<double> z = values(3 * 5, 4);
  std::vector<float> zf(z.begin(), z.end());
  const std::vector<double> zd(zf.begin(), zf.end());
  const std::vector<double> rows = ce_rows(zd, {4, 0, 2}, 5, -100, 0);
  EXPECT_NEAR(ls::nn::cross_entropy(f32(zf, {3, 5}), i64({4, 0, 2})).item<float>(),
              (rows[0] + rows[1] + rows[2]) / 3, 2e-6);
  // nll_loss picks -log_probs[target], mean over the kept rows.
  ls::Tensor lp = f64({-0.1, -2.5, -3.0, -1.2, -0.4, -2.2}, {2, 3});
  EXPECT_NEAR(ls::nn::nll_loss(lp, i64({1, 2})).item<double>(), (2.5 + 2.2) / 2, 1e-14);
  EXPECT_NEAR(ls::nn::nll_loss(lp, i64({1, -100})).item<double>(), 2.5, 1e-14);
  EXPECT_NEAR(
      ls::nn::nll_loss(lp, i64({0, 2}), {.reduction = ls::nn::Reduction::Sum}).item<double>(),
      0.1 + 2.2, 1e-14);
}

TEST(NnLoss, MseAndAccuracy) {
  ls::Tensor a = f64({1, 2, 3, 4}, {2, 2}), b = f64({1.5, 0, 3, 7}, {2, 2});
  EXPECT_NEAR(ls::nn::mse_loss(a, b).item<double>(), (0.25 + 4 + 0 + 9) / 4, 1e-14);
  EXPECT_NEAR(ls::nn::mse_loss(a, b, ls::nn::Reduction::Sum).item<double>(), 13.25, 1e-14);
  ops_test::expect_tensor<double>(ls::nn::mse_loss(a, b, ls::nn::Reduction::None), {2, 2},
                                  {0.25, 4, 0, 9});
  ls::Tensor logits =
      f32({0.1f, 0.9f, 0.0f, 2.0f, 1.0f, 0.5f, 0.2f, 0.3f, 0.9f, 0.0f, 0.0f, -1.0f}, {4, 3});
  ls::Tensor acc = ls::nn::accuracy(logits, i64({1, 0, 1, 0}));
  EXPECT_EQ(acc.dtype(), ls::f32);
  EXPECT_EQ(acc.shape(), (ls::Shape{}));
  EXPECT_FLOAT_EQ(acc.item<float>(), 0.75f);  // rows 0, 1 and 3 right (row 3: a tie, first wins)
}

TEST(NnLoss, BinaryCrossEntropyWithLogitsIsStableForLargeLogits) {
  const std::vector<double> xv{100, -100, 100, -100, 0.5, -2, 30};
  const std::vector<double> yv{0, 1, 1, 0, 0.3, 1, 0.5};
  for (ls::DType dt : {ls::f32, ls::f64}) {
    SCOPED_TRACE(::testing::Message() << dt);
    ls::Tensor x = f64(xv).to(dt), y = f64(yv).to(dt);
    x.set_requires_grad();
    ls::Tensor per_row, mean;
    ls::step([&] {
      per_row = ls::nn::binary_cross_entropy_with_logits(x, y, ls::nn::Reduction::None);
      mean = ls::nn::binary_cross_entropy_with_logits(x, y);
      mean.backward();
    });
    std::vector<double> want, grad;
    double total = 0;
    for (size_t i = 0; i < xv.size(); ++i) {
      const double v = xv[i], t = yv[i];
      want.push_back(std::max(v, 0.0) - v * t + std::log1p(std::exp(-std::abs(v))));
      total += want.back();
      grad.push_back((1 / (1 + std::exp(-v)) - t) / static_cast<double>(xv.size()));
    }
    const double tol = dt == ls::f32 ? 1e-6 : 1e-14;
    expect_all_near(as_double(per_row), want, tol);
    EXPECT_NEAR(as_double(mean)[0], total / 7, tol * (1 + total / 7));
    expect_all_near(as_double(x.grad()), grad, tol);
  }
}

TEST(NnLoss, BinaryCrossEntropyIsTorchsFormulaWithLogsClampedAtMinus100) {
  // Probabilities at 0 and 1 (clamped logs: a loss of 100, not inf) and in between; a weight.
  const std::vector<double> xv{0.0, 1.0, 0.25, 0.9, 0.5, 0.01};
  const std::vector<double> yv{1.0, 0.0, 0.0, 1.0, 0.3, 0.7};
  const std::vector<double> wv{1.0, 2.0, 0.5, 1.5, 1.0, 3.0};
  for (ls::DType dt : {ls::f32, ls::f64}) {
    SCOPED_TRACE(::testing::Message() << dt);
    ls::Tensor x = f64(xv).to(dt), y = f64(yv).to(dt), w = f64(wv).to(dt);
    x.set_requires_grad();
    ls::Tensor per_row, mean, summed;
    ls::step([&] {
      per_row = ls::nn::binary_cross_entropy(x, y, w, ls::nn::Reduction::None);
      summed = ls::nn::binary_cross_entropy(x, y, ls::Tensor(), ls::nn::Reduction::Sum);
      mean = ls::nn::binary_cross_entropy(x, y);
      mean.backward();
    });
    std::vector<double> want, grad;
    double total = 0;
    for (size_t i = 0; i < xv.size(); ++i) {
      const double v = xv[i], t = yv[i];
      const double l =
          -(t * std::max(std::log(v), -100.0) + (1 - t) * std::max(std::log(1 - v), -100.0));
      want.push_back(wv[i] * l);
      total += l;
      // d/dx where neither log is clamped; 0 through a clamped one (x = 0 with t = 1 reads
      // only log(x), clamped; x = 1 with t = 0 only log(1 - x)).
      const double d = (v > 0 && v < 1) ? (v - t) / (v * (1 - v)) : 0.0;
      grad.push_back(d / static_cast<double>(xv.size()));
    }
    const double tol = dt == ls::f32 ? 1e-5 : 1e-12;
    expect_all_near(as_double(per_row), want, tol * 100);
    EXPECT_NEAR(as_double(summed)[0], total, tol * total);
    EXPECT_NEAR(as_double(mean)[0], total / 6, tol * total);
    expect_all_near(as_double(x.grad()), grad, tol * 10);
  }
}

TEST(NnLoss, BadInputsAreErrors) {
  ls::Tensor logits = f32(std::vector<float>(6, 0.0f), {2, 3});
  EXPECT_LS_ERROR(ls::nn::cross_entropy(logits, ops_test::i32({0, 1})), "cross_entropy", "i64",
                  "i32");
  EXPECT_LS_ERROR(ls::nn::cross_entropy(logits, f32({0, 1})), "cross_entropy", "i64");
  EXPECT_LS_ERROR(ls::nn::cross_entropy(logits, i64({0, 1}, {2, 1})), "cross_entropy", "[2, 1]",
                  "[2, 3]");
  EXPECT_LS_ERROR(ls::nn::cross_entropy(logits, i64({0, 1, 2})), "cross_entropy", "[3]");
  EXPECT_LS_ERROR(ls::nn::cross_entropy(f32({0, 1, 2}), i64({0})), "cross_entropy", "[3]");
  EXPECT_LS_ERROR(ls::nn::cross_entropy(logits, i64({0, 1}), {.label_smoothing = 1.5}),
                  "cross_entropy", "label_smoothing");
  EXPECT_LS_ERROR(ls::nn::nll_loss(logits, i64({0})), "nll_loss", "[1]");
  EXPECT_LS_ERROR(ls::nn::accuracy(logits, ops_test::i32({0, 1})), "accuracy", "i64");
  EXPECT_LS_ERROR(ls::nn::binary_cross_entropy_with_logits(logits, ls::zeros({3, 2})),
                  "binary_cross_entropy_with_logits", "[2, 3]", "[3, 2]");
  EXPECT_LS_ERROR(ls::nn::binary_cross_entropy(logits, ls::zeros({3, 2})), "binary_cross_entropy",
                  "[2, 3]", "[3, 2]");
  EXPECT_LS_ERROR(ls::nn::binary_cross_entropy(logits, ls::zeros({2, 3}), ls::zeros({4})), "[4]");
  EXPECT_LS_ERROR(ls::nn::binary_cross_entropy(logits, ls::zeros({2, 3}), ls::zeros({2, 1, 3})),
                  "binary_cross_entropy", "[2, 1, 3]");
  EXPECT_LS_ERROR(ls::nn::mse_loss(logits, ls::zeros({2, 4})), "[2, 3]", "[2, 4]");
  EXPECT_LS_ERROR(ls::nn::linear(f32({1, 2}), f32({1, 2})), "linear", "[2]");
}
