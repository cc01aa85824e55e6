// conv_transpose2d / nn::ConvTranspose2d and nn::interpolate / nn::Upsample: values against a
// direct host loop and PyTorch 1.13's numbers, gradients against central finite differences in
// f64 on the test device, shapes, PyTorch's initialisation and the errors.
#include <gtest/gtest.h>

#include <random>

#include "ops_test_util.h"

namespace {

using ops_test::error_of;
using ops_test::f32;
using ops_test::f64;

class Upsampling : public ops_test::OnTestDevice {};

std::vector<double> ramp(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> v(n);
  for (double& e : v) e = u(rng);
  return v;
}

// The definition: every input entry scatters its kernel into the output.
std::vector<double> transposed_by_loop(const std::vector<double>& x, const ls::Shape& xs,
                                       const std::vector<double>& w, const ls::Shape& ws,
                                       const ls::ConvTranspose2dOptions& o, const ls::Shape& ys) {
  std::vector<double> y(static_cast<size_t>(ls::shape_numel(ys)), 0.0);
  const int64_t in_per_group = xs[1] / o.groups, out_per_group = ws[1];
  for (int64_t n = 0; n < xs[0]; ++n)
    for (int64_t c = 0; c < xs[1]; ++c)
      for (int64_t i = 0; i < xs[2]; ++i)
        for (int64_t j = 0; j < xs[3]; ++j)
          for (int64_t oc = 0; oc < out_per_group; ++oc)
            for (int64_t a = 0; a < ws[2]; ++a)
              for (int64_t b = 0; b < ws[3]; ++b) {
                const int64_t oh = i * o.stride[0] - o.padding[0] + a * o.dilation[0];
                const int64_t ow = j * o.stride[1] - o.padding[1] + b * o.dilation[1];
                if (oh < 0 || ow < 0 || oh >= ys[2] || ow >= ys[3]) continue;
                const int64_t co = c / in_per_group * out_per_group + oc;
                y[static_cast<size_t>(((n * ys[1] + co) * ys[2] + oh) * ys[3] + ow)] +=
                    x[static_cast<size_t>(((n * xs[1] + c) * xs[2] + i) * xs[3] + j)] *
                    w[static_cast<size_t>(((c * ws[1] + oc) * ws[2] + a) * ws[3] + b)];
              }
  return y;
}

// d/d(inputs) of sum(fn(inputs) * weights) from backward() against central differences.
void expect_gradients_match_differences(
    const std::vector<ls::Shape>& shapes,
    const std::function<ls::Tensor(const std::vector<ls::Tensor>&)>& fn) {
  std::vector<std::vector<double>> values;
  for (size_t i = 0; i < shapes.size(); ++i)
    values.push_back(ramp(static_cast<size_t>(ls::shape_numel(shapes[i])), 7 + i));
  std::vector<double> weights;
  const auto objective = [&](const std::vector<std::vector<double>>& v,
                             std::vector<ls::Tensor>* leaves) {
    std::vector<ls::Tensor> xs;
    for (size_t i = 0; i < v.size(); ++i) {
      xs.push_back(f64(v[i], shapes[i]));
      if (leaves) xs.back().set_requires_grad();
    }
    const ls::Tensor y = fn(xs);
    if (weights.empty()) weights = ramp(static_cast<size_t>(y.numel()), 3);
    const ls::Tensor loss = ls::sum(y * f64(weights, y.shape()));
    if (leaves) {
      loss.backward();
      *leaves = xs;
    }
    return loss.item<double>();
  };
  std::vector<ls::Tensor> leaves;
  objective(values, &leaves);
  const double step = 1e-6;
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_TRUE(leaves[i].grad().defined()) << "input " << i << " got no gradient";
    const std::vector<double> analytic = leaves[i].grad().to_vector<double>();
    for (size_t j = 0; j < values[i].size(); ++j) {
      auto plus = values, minus = values;
      plus[i][j] += step;
      minus[i][j] -= step;
      const double numeric = (objective(plus, nullptr) - objective(minus, nullptr)) / (2 * step);
      EXPECT_NEAR(analytic[j], numeric, 1e-6 * std::max(1.0, std::abs(numeric)))
          << "input " << i << " element " << j;
    }
  }
}

struct TransposedCase {
  ls::Shape x, w;
  ls::ConvTranspose2dOptions o;
  ls::Shape y;
};

std::vector<TransposedCase> transposed_cases() {
  return {
      {{2, 3, 4, 5}, {3, 2, 3, 3}, {}, {2, 2, 6, 7}},
      {{1, 4, 3, 4}, {4, 3, 3, 3}, {{2, 2}, {1, 1}, {1, 1}, 1, {1, 1}}, {1, 3, 6, 8}},
      {{2, 4, 3, 3}, {4, 1, 3, 2}, {{2, 3}, {1, 0}, {1, 2}, 2, {1, 1}}, {2, 2, 6, 10}},
      {{1, 2, 4, 3}, {2, 2, 3, 3}, {{1, 1}, {1, 1}, {0, 0}, 2, {2, 2}}, {1, 4, 6, 5}},
      // output_padding >= stride, allowed by a larger dilation: rows past the unpadded output.
      {{1, 2, 3, 3}, {2, 2, 3, 3}, {{1, 1}, {2, 0}, {1, 1}, 1, {2, 2}}, {1, 2, 4, 8}},
      {{1, 1, 2, 2}, {1, 1, 2, 3}, {{3, 3}, {0, 2}, {2, 0}, 1, {1, 3}}, {1, 1, 7, 6}},
  };
}

TEST_F(Upsampling, ConvTransposeMatchesItsDefinition) {
  for (const TransposedCase& c : transposed_cases()) {
    const std::vector<double> x = ramp(static_cast<size_t>(ls::shape_numel(c.x)), 1);
    const std::vector<double> w = ramp(static_cast<size_t>(ls::shape_numel(c.w)), 2);
    const ls::Tensor y = ls::conv_transpose2d(f64(x, c.x), f64(w, c.w), ls::Tensor(), c.o);
    ASSERT_EQ(y.shape(), c.y) << ls::shape_str(c.x);
    const std::vector<double> want = transposed_by_loop(x, c.x, w, c.w, c.o, c.y);
    const std::vector<double> got = y.to_vector<double>();
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << i;
  }
}

TEST_F(Upsampling, ConvTransposeGradientsMatchDifferences) {
  for (const TransposedCase& c : transposed_cases())
    expect_gradients_match_differences({c.x, c.w, {c.y[1]}},
                                       [&](const std::vector<ls::Tensor>& in) {
                                         return ls::conv_transpose2d(in[0], in[1], in[2], c.o);
                                       });
}

TEST_F(Upsampling, ConvTransposeLayerAsPyTorchs) {
  ls::nn::ConvTranspose2dSpec s;
  s.in_channels = 4;
  s.out_channels = 6;
  s.kernel = {3, 3};
  s.stride = {2, 2};
  s.padding = {1, 1};
  s.groups = 2;
  ls::nn::ConvTranspose2d m(s);
  const auto sd = m.state_dict();
  ASSERT_EQ(sd.size(), 2u);
  EXPECT_EQ(sd[0].first, "weight");
  EXPECT_EQ(sd[1].first, "bias");
  EXPECT_EQ(m.weight.shape(), (ls::Shape{4, 3, 3, 3}));
  // U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with PyTorch's fan_in: weight.size(1) * kh * kw.
  const double bound = 1 / std::sqrt(27.0);
  for (float v : m.weight.to_vector<float>()) EXPECT_LE(std::abs(v), bound);
  const ls::Tensor x = ls::zeros({2, 4, 5, 5});
  EXPECT_EQ(m(x).shape(), (ls::Shape{2, 6, 9, 9}));
  EXPECT_EQ(m(x, {10, 9}).shape(), (ls::Shape{2, 6, 10, 9}));
  EXPECT_EQ(m(x, {2, 6, 9, 10}).shape(), (ls::Shape{2, 6, 9, 10}));
  EXPECT_NE(error_of([&] {
              m(x, {11, 9});
            }).find("valid sizes range from 9 to 10"),
            std::string::npos);
}

TEST_F(Upsampling, ConvTransposeErrorsNameTheProblem) {
  const ls::Tensor x = ls::zeros({1, 2, 3, 3}), w = ls::zeros({2, 2, 3, 3});
  EXPECT_NE(error_of([&] {
              ls::conv_transpose2d(x, w, {}, {{2, 2}, {0, 0}, {2, 2}, 1, {1, 1}});
            }).find("output padding 2 must be smaller than either stride 2 or dilation 1"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              ls::conv_transpose2d(x, ls::zeros({3, 2, 3, 3}));
            }).find("channels"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              ls::conv_transpose2d(ls::zeros({2, 3, 3}), w);
            }).find("rank 4"),
            std::string::npos);
}

ls::nn::InterpolateOptions options(std::string mode, std::vector<int64_t> size,
                                   std::vector<double> scale,
                                   std::optional<bool> align_corners = std::nullopt) {
  ls::nn::InterpolateOptions o;
  o.mode = std::move(mode);
  o.size = std::move(size);
  o.scale_factor = std::move(scale);
  o.align_corners = align_corners;
  return o;
}

TEST_F(Upsampling, InterpolateValuesAsPyTorchs) {
  // torch.nn.functional.interpolate(x, ...) of PyTorch 1.13 on this input.
  const ls::Tensor x = f32({1, 2, 4, 3, -1, 0.5}, {1, 1, 2, 3});
  const auto expect = [&](const ls::nn::InterpolateOptions& o, const ls::Shape& shape,
                          const std::vector<float>& want) {
    const ls::Tensor y = ls::nn::interpolate(x, o);
    ASSERT_EQ(y.shape(), shape) << o.mode;
    const std::vector<float> got = y.to_vector<float>();
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 2e-6) << o.mode << i;
  };
  expect(options("bilinear", {3, 4}, {}, false), {1, 1, 3, 4},
         {1.0, 1.625, 2.75, 4.0, 2.0, 1.0625, 1.15625, 2.25, 3.0, 0.5, -0.4375, 0.5});
  expect(options("bicubic", {}, {1.5}, false), {1, 1, 3, 4},
         {0.701908, 1.351834, 2.678165, 4.03545, 2.130209, 1.085938, 0.620949, 1.972801, 3.55851,
          0.820041, -1.436265, -0.089846});
  expect(options("nearest", {3, 5}, {}), {1, 1, 3, 5},
         {1, 1, 2, 2, 4, 1, 1, 2, 2, 4, 3, 3, -1, -1, 0.5});
  // align_corners: the corners stay, and a linear ramp stays linear.
  const ls::Tensor r =
      ls::nn::interpolate(f64({0, 1, 2, 3}, {1, 1, 2, 2}), options("bilinear", {3, 5}, {}, true));
  EXPECT_EQ(r.to_vector<double>(), (std::vector<double>{0, 0.25, 0.5, 0.75, 1, 1, 1.25, 1.5, 1.75,
                                                        2, 2, 2.25, 2.5, 2.75, 3}));
}

TEST_F(Upsampling, InterpolateGradientsMatchDifferences) {
  for (const ls::nn::InterpolateOptions& o :
       {options("nearest", {}, {1.7, 0.6}), options("nearest-exact", {5, 7}, {}),
        options("bilinear", {}, {2}, false), options("bilinear", {2, 7}, {}, true),
        options("bicubic", {}, {1.5, 0.7}, false), options("bicubic", {5, 4}, {}, true)}) {
    SCOPED_TRACE(o.mode);
    expect_gradients_match_differences({{2, 1, 4, 3}}, [&](const std::vector<ls::Tensor>& in) {
      return ls::nn::interpolate(in[0], o);
    });
  }
}

TEST_F(Upsampling, UpsampleModuleAndErrors) {
  ls::nn::Upsample up(options("nearest", {}, {2}));
  EXPECT_TRUE(up.state_dict().empty());
  EXPECT_EQ(up(ls::zeros({1, 2, 3, 4})).shape(), (ls::Shape{1, 2, 6, 8}));
  const ls::Tensor x = ls::zeros({1, 1, 4, 4});
  EXPECT_NE(error_of([&] {
              ls::nn::interpolate(x, options("nearest", {}, {2}, false));
            }).find("align_corners option can only be set with the interpolating modes"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              ls::nn::interpolate(x, options("bilinear", {3}, {2}));
            }).find("only one of size or scale_factor"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ls::nn::interpolate(x, options("area", {3}, {})); }).find("area"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              ls::nn::interpolate(x, options("nearest", {}, {0.1}));
            }).find("greater than 0"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              ls::nn::interpolate(ls::zeros({2, 4, 4}), options("nearest", {3}, {}));
            }).find("[N, C, H, W]"),
            std::string::npos);
}

}  // namespace
