// The fuzzer's random graph builder, part two: the heavy op families (matmul, convolution and
// its gradients, pooling and its gradients) and fresh leaves; see fuzz_graph.h.
#include <algorithm>
#include <string>

#include "fuzz_graph.h"

namespace conformance {
namespace {

namespace ls = lockstep;

// Output size of a convolution or pooling along one axis (as the shape rules compute it).
int64_t window_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
  const int64_t span = in + 2 * p - d * (k - 1) - 1;
  return span < 0 ? 0 : span / s + 1;
}

}  // namespace

bool FuzzGraph::matmul() {
  const FuzzValue a = squashed(values_[pick()]);
  const Shape& s = a.t.shape();
  const int64_t r = static_cast<int64_t>(s.size());
  if (r == 0) return false;
  const int64_t n = uni(1, 9);
  ls::Tensor y;
  std::string what;
  int64_t k;
  bool self = false;
  if (r == 1) {
    k = s[0];
    const int64_t v = uni(0, 2);
    if (v == 0)
      y = ls::matmul(a.t, input({k, n}, -1, 1).t), what = "vector x matrix";
    else if (v == 1)
      y = ls::matmul(input({n, k}, -1, 1).t, a.t), what = "matrix x vector";
    else
      y = ls::matmul(a.t, a.t), what = "dot", self = true;
  } else {
    const int64_t m = s[r - 2];
    k = s[r - 1];
    Shape batch(s.begin(), s.end() - 2);
    switch (uni(0, 4)) {
      case 0:
        y = ls::matmul(a.t, input({k, n}, -1, 1).t), what = "matmul";
        break;
      case 1:
        y = ls::matmul(a.t, ls::transpose(input({n, k}, -1, 1).t, 0, 1));
        what = "matmul, transposed right operand";
        break;
      case 2:
        if (ls::shape_numel(batch) * m * m > kFuzzMaxNumel) return false;
        y = ls::matmul(a.t, ls::transpose(a.t, -1, -2)), what = "x x^T", self = true;
        break;
      case 3:
        y = ls::matmul(ls::transpose(a.t, -1, -2), input({m, n}, -1, 1).t);
        what = "x^T x matrix", k = m;
        break;
      default: {
        Shape bs = batch;
        for (int64_t& d : bs)
          if (coin(0.4)) d = 1;
        if (coin(0.3)) bs.insert(bs.begin(), uni(1, 2));
        bs.push_back(k);
        bs.push_back(n);
        if (ls::shape_numel(bs) > kFuzzMaxNumel) return false;
        y = ls::matmul(a.t, input(bs, -1, 1).t), what = "batched matmul " + ls::shape_str(bs);
      }
    }
  }
  if (ls::shape_numel(y.shape()) > kFuzzMaxNumel) return false;
  if (y.dim() >= 2 && coin(0.2)) y = ls::transpose(y, -1, -2), what += ", transposed";
  // Operands of |values| <= 1 besides `a` (in x x^T, `a` twice).
  const double kk = static_cast<double>(k), other = self ? a.bound : 1;
  add({y, false, kk * a.err * (self ? 2 * a.bound : 1) + accumulation_error(kk, a.bound * other),
       a.bound * other * std::max(1.0, kk)},
      what);
  return true;
}

// A rank-4 value to convolve or pool: one that is rank 4, or a matrix seen as one plane.
static bool plane_of(const FuzzValue& v, FuzzValue* x) {
  const ls::Shape& s = v.t.shape();
  *x = v;
  if (s.size() == 4) return s[1] > 0 && s[2] > 0 && s[3] > 0;
  if (s.size() < 2 || ls::shape_numel(s) == 0) return false;
  x->t = ls::reshape(v.t, {1, 1, ls::shape_numel(s) / s.back(), s.back()});
  return true;
}

bool FuzzGraph::conv() {
  FuzzValue x;
  if (!plane_of(values_[pick()], &x)) return false;
  x = squashed(x);
  const Shape s = x.t.shape();
  const int64_t c = s[1];
  std::vector<int64_t> divisors;
  for (int64_t g = 1; g <= c; ++g)
    if (c % g == 0) divisors.push_back(g);
  const int64_t g =
      divisors[static_cast<size_t>(uni(0, static_cast<int64_t>(divisors.size()) - 1))];
  // Now and then 16 or 32 output channels: values the cpu backend may hold in oneDNN's blocked
  // layout, for the trees, sums and convolutions that read them.
  const bool blockable = 16 % g == 0 && coin(0.35);
  const int64_t o = blockable ? 16 * uni(1, 2) : g * uni(1, 3), kh = uni(1, 3), kw = uni(1, 3);
  ls::Conv2dOptions opt;
  opt.stride = {uni(1, 3), uni(1, 3)};
  opt.padding = {uni(0, 2), uni(0, 2)};
  opt.dilation = {uni(1, 2), uni(1, 2)};
  opt.groups = g;
  const int64_t ho = window_out(s[2], kh, opt.stride[0], opt.padding[0], opt.dilation[0]);
  const int64_t wo = window_out(s[3], kw, opt.stride[1], opt.padding[1], opt.dilation[1]);
  const Shape ws = {o, c / g, kh, kw}, ys = {s[0], o, ho, wo};
  if (ho <= 0 || wo <= 0 || ls::shape_numel(ys) > kFuzzMaxNumel) return false;
  const double taps = static_cast<double>(c / g * kh * kw);
  const std::string what =
      " w " + ls::shape_str(ws) + " stride " + ls::shape_str({opt.stride[0], opt.stride[1]}) +
      " padding " + ls::shape_str({opt.padding[0], opt.padding[1]}) + " dilation " +
      ls::shape_str({opt.dilation[0], opt.dilation[1]}) + " groups " + std::to_string(g);
  switch (uni(0, 2)) {
    case 0:
      add({ls::conv2d(x.t, input(ws, -0.5, 0.5).t, opt), false,
           taps * x.err * 0.5 + accumulation_error(taps, x.bound * 0.5), x.bound * taps},
          "conv2d" + what);
      break;
    case 1:
      // Each input element takes at most (o / g) * kh * kw products of |dy| <= 2, |w| <= 0.5.
      add({ls::conv2d_backward_input(input(ys).t, input(ws, -0.5, 0.5).t, s, opt) + x.t, false,
           x.err + accumulation_error(static_cast<double>(o / g * kh * kw), 1) + 2 * x.bound +
               2 * static_cast<double>(o / g * kh * kw),
           x.bound + static_cast<double>(o / g * kh * kw)},
          "conv2d_backward_input" + what);
      break;
    default: {
      const double n = static_cast<double>(ys[0] * ho * wo);
      add({ls::conv2d_backward_weight(x.t, input(ys, -1, 1).t, ws, opt), false,
           n * x.err + accumulation_error(n, x.bound), x.bound * std::max(1.0, n)},
          "conv2d_backward_weight" + what);
    }
  }
  return true;
}

bool FuzzGraph::pool() {
  FuzzValue x;
  if (!plane_of(values_[pick()], &x)) return false;
  const Shape s = x.t.shape();
  ls::Pool2dOptions opt;
  opt.kernel = {uni(1, 3), uni(1, 3)};
  opt.stride = {uni(1, 3), uni(1, 3)};
  opt.padding = {uni(0, opt.kernel[0] / 2), uni(0, opt.kernel[1] / 2)};
  opt.count_include_pad = coin(0.5);
  const int64_t ho = window_out(s[2], opt.kernel[0], opt.stride[0], opt.padding[0], 1);
  const int64_t wo = window_out(s[3], opt.kernel[1], opt.stride[1], opt.padding[1], 1);
  if (ho <= 0 || wo <= 0) return false;
  const Shape ys = {s[0], s[1], ho, wo};
  const double taps = static_cast<double>(opt.kernel[0] * opt.kernel[1]);
  const std::string what = " kernel " + ls::shape_str({opt.kernel[0], opt.kernel[1]}) + " stride " +
                           ls::shape_str({opt.stride[0], opt.stride[1]}) + " padding " +
                           ls::shape_str({opt.padding[0], opt.padding[1]});
  int64_t v = uni(0, 3);
  if (v == 2 && !x.exact) v = 0;
  switch (v) {
    case 0:
      add({ls::max_pool2d(x.t, opt), x.exact, x.err, x.bound}, "max_pool2d" + what);
      break;
    case 1:
      add({ls::avg_pool2d(x.t, opt), false,
           x.err + accumulation_error(taps, x.bound) / taps + 2 * x.bound, x.bound},
          "avg_pool2d" + what);
      break;
    case 2: {
      const auto [values, indices] = ls::max_pool2d_with_indices(x.t, opt);
      if (coin(0.3)) outputs_.push_back({indices, true, 0, 1});
      add({values, true, 0, x.bound}, "max_pool2d_with_indices" + what);
      add({ls::max_pool2d_backward(input(ys).t, indices, s, opt), false,
           accumulation_error(taps, 2), 2 * taps},
          "max_pool2d_backward" + what);
      break;
    }
    default:
      add({ls::avg_pool2d_backward(input(ys).t, s, opt), false, accumulation_error(taps, 2) + 4,
           2 * taps},
          "avg_pool2d_backward" + what);
  }
  return true;
}

bool FuzzGraph::leaf() {
  const Shape s = random_shape(4);
  switch (uni(0, 2)) {
    case 0:
      add(input(s), "input");
      break;
    case 1:  // drawn as f32, so the f64 graph draws the same numbers
      add({ls::cast(ls::rand(s, {ls::f32, device_}), dtype_), true, 0, 1}, "rand");
      break;
    default: {
      const int64_t n = ls::shape_numel(s);
      add({ls::reshape(ls::arange(n, {dtype_, device_}), s), true, 0, static_cast<double>(n)},
          "arange");
    }
  }
  return true;
}

}  // namespace conformance
