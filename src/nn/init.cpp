// torch.nn.init with PyTorch's formulas: fans, gains, and the fills built on the thread's
// counter-based generator. trunc_normal_ inverts the normal CDF with an erfinv written from
// Giles' single-precision approximation (M. Giles, "Approximating the erfinv function", 2010).
#include <cmath>
#include <numbers>

#include "lockstep/autograd.h"
#include "lockstep/nn.h"
#include "util/check.h"

namespace lockstep::nn::init {

using util::cat;

namespace {

void check_target(const Tensor& t, const char* op) {
  if (!t.defined()) throw Error(cat(op, ": the tensor is an empty handle; create it first"));
  if (!is_floating(t.dtype()))
    throw Error(cat(op, ": needs a floating-point tensor, got ", dtype_name(t.dtype()),
                    shape_str(t.shape()), ". Initialize a float tensor and cast it"));
}

Tensor fill(Tensor t, const Tensor& value) {
  NoGrad no_grad;
  t.copy_(value);
  return t;
}

Tensor uniform_values(const Tensor& t, double a, double b) {
  return add(mul(rand(t.shape(), TensorOptions(t.dtype(), t.device())), b - a), a);
}

// Giles' erfinv for |x| < 1, both branches evaluated on inputs of their own range.
Tensor erfinv(const Tensor& x) {
  const Tensor w = neg(log(mul(sub(1.0, x), add(x, 1.0))));
  const Tensor central = lt(w, 5.0);
  const Tensor wc = sub(where(central, w, 2.5), 2.5);
  const Tensor wt = sub(sqrt(where(central, 9.0, w)), 3.0);
  auto poly = [](const Tensor& v, std::initializer_list<double> c) {
    Tensor p;
    for (double k : c) p = p.defined() ? add(mul(p, v), k) : full_like(v, k);
    return p;
  };
  const Tensor pc =
      poly(wc, {2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                -0.00125372503, -0.00417768164, 0.246640727, 1.50140941});
  const Tensor pt = poly(wt, {-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844,
                              0.00573950773, -0.0076224613, 0.00943887047, 1.00167406, 2.83297682});
  return mul(where(central, pc, pt), x);
}

double norm_cdf(double x) { return (1.0 + std::erf(x / std::numbers::sqrt2)) / 2.0; }

double fan(const Tensor& t, FanMode mode) {
  const auto [in, out] = calculate_fan_in_and_fan_out(t);
  return static_cast<double>(mode == FanMode::FanIn ? in : out);
}

}  // namespace

double calculate_gain(const std::string& nonlinearity, double param) {
  if (nonlinearity == "linear" || nonlinearity == "conv1d" || nonlinearity == "conv2d" ||
      nonlinearity == "conv3d" || nonlinearity == "conv_transpose1d" ||
      nonlinearity == "conv_transpose2d" || nonlinearity == "conv_transpose3d" ||
      nonlinearity == "sigmoid")
    return 1.0;
  if (nonlinearity == "tanh") return 5.0 / 3.0;
  if (nonlinearity == "relu") return std::sqrt(2.0);
  if (nonlinearity == "leaky_relu") {
    const double slope = std::isnan(param) ? 0.01 : param;
    return std::sqrt(2.0 / (1 + slope * slope));
  }
  if (nonlinearity == "selu") return 3.0 / 4.0;
  throw Error(cat("calculate_gain: unsupported nonlinearity '", nonlinearity,
                  "'. Use linear, conv1d, conv2d, sigmoid, tanh, relu, leaky_relu or selu"));
}

std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& t) {
  if (!t.defined() || t.dim() < 2)
    throw Error(cat("calculate_fan_in_and_fan_out: needs a tensor of rank >= 2, got ",
                    t.defined() ? shape_str(t.shape()) : std::string("an empty handle"),
                    ". Fans are defined for weights [out, in, ...]"));
  int64_t receptive = 1;
  for (int64_t d = 2; d < t.dim(); ++d) receptive *= t.size(d);
  return {t.size(1) * receptive, t.size(0) * receptive};
}

Tensor uniform_(Tensor t, double a, double b) {
  check_target(t, "uniform_");
  if (!(a <= b)) throw Error(cat("uniform_: a = ", a, " is above b = ", b, ". Pass a <= b"));
  return fill(t, uniform_values(t, a, b));
}

Tensor normal_(Tensor t, double mean, double std) {
  check_target(t, "normal_");
  if (!(std >= 0)) throw Error(cat("normal_: std = ", std, " must be >= 0"));
  return fill(t, add(mul(randn(t.shape(), TensorOptions(t.dtype(), t.device())), std), mean));
}

Tensor constant_(Tensor t, double value) {
  check_target(t, "constant_");
  return fill(t, full_like(t, value));
}
Tensor zeros_(Tensor t) { return constant_(t, 0.0); }
Tensor ones_(Tensor t) { return constant_(t, 1.0); }

Tensor xavier_uniform_(Tensor t, double gain) {
  check_target(t, "xavier_uniform_");
  const auto [in, out] = calculate_fan_in_and_fan_out(t);
  const double bound = gain * std::sqrt(6.0 / static_cast<double>(in + out));
  return fill(t, uniform_values(t, -bound, bound));
}

Tensor xavier_normal_(Tensor t, double gain) {
  check_target(t, "xavier_normal_");
  const auto [in, out] = calculate_fan_in_and_fan_out(t);
  return normal_(t, 0.0, gain * std::sqrt(2.0 / static_cast<double>(in + out)));
}

Tensor kaiming_uniform_(Tensor t, double a, FanMode mode, const std::string& nonlinearity) {
  check_target(t, "kaiming_uniform_");
  const double bound = std::sqrt(3.0) * calculate_gain(nonlinearity, a) / std::sqrt(fan(t, mode));
  return fill(t, uniform_values(t, -bound, bound));
}

Tensor kaiming_normal_(Tensor t, double a, FanMode mode, const std::string& nonlinearity) {
  check_target(t, "kaiming_normal_");
  return normal_(t, 0.0, calculate_gain(nonlinearity, a) / std::sqrt(fan(t, mode)));
}

Tensor trunc_normal_(Tensor t, double mean, double std, double a, double b) {
  check_target(t, "trunc_normal_");
  if (!(std > 0) || !(a < b))
    throw Error(
        cat("trunc_normal_: needs std > 0 and a < b, got std = ", std, ", [", a, ", ", b, "]"));
  const double l = norm_cdf((a - mean) / std), u = norm_cdf((b - mean) / std);
  // Uniform over the CDF's image of [a, b], mapped back through the inverse CDF.
  const Tensor p = uniform_values(t, 2 * l - 1, 2 * u - 1);
  const Tensor v = add(mul(erfinv(clamp(p, -1 + 1e-7, 1 - 1e-7)), std * std::numbers::sqrt2), mean);
  return fill(t, clamp(v, a, b));
}

}  // namespace lockstep::nn::init
