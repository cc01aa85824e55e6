// The ref backend's heavy and indexing kernels: matmul, convolution and its gradients, pooling
// and its gradients, gather and scatter-add. Direct loops; floats accumulate in double.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <type_traits>

#include "backends/ref/ref_kernels.h"
#include "ir/attrs.h"
#include "util/check.h"

namespace lockstep::backends::ref {
namespace {

using util::cat;

template <typename T>
using Acc = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;

// The loops below name ir::ConvAttrs' and ir::PoolAttrs' fields per axis.
struct ConvGeometry {
  int64_t sh, sw, ph, pw, dh, dw, groups;
  explicit ConvGeometry(const ir::ConvAttrs& c)
      : sh(c.stride[0]),
        sw(c.stride[1]),
        ph(c.padding[0]),
        pw(c.padding[1]),
        dh(c.dilation[0]),
        dw(c.dilation[1]),
        groups(c.groups) {}
};

struct PoolGeometry {
  int64_t kh, kw, sh, sw, ph, pw;
  bool count_include_pad;
  explicit PoolGeometry(const ir::PoolAttrs& p)
      : kh(p.kernel[0]),
        kw(p.kernel[1]),
        sh(p.stride[0]),
        sw(p.stride[1]),
        ph(p.padding[0]),
        pw(p.padding[1]),
        count_include_pad(p.count_include_pad) {}
};

// Visits every (input, weight, output) index triple of a convolution:
// f(x_offset, w_offset, y_offset). x: [N,C,H,W], w: [O,C/g,KH,KW], y: [N,O,HO,WO].
template <typename F>
void for_each_conv_tap(const Shape& x, const Shape& w, const Shape& y, const ConvGeometry& c,
                       F&& f) {
  const int64_t N = x[0], C = x[1], H = x[2], W = x[3];
  const int64_t O = w[0], Cg = w[1], KH = w[2], KW = w[3];
  const int64_t HO = y[2], WO = y[3];
  const int64_t Og = O / c.groups;
  (void)C;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o) {
      const int64_t g = o / Og;
      for (int64_t ci = 0; ci < Cg; ++ci) {
        const int64_t cin = g * Cg + ci;
        for (int64_t kh = 0; kh < KH; ++kh)
          for (int64_t kw = 0; kw < KW; ++kw) {
            const int64_t w_off = ((o * Cg + ci) * KH + kh) * KW + kw;
            for (int64_t ho = 0; ho < HO; ++ho) {
              const int64_t h = ho * c.sh - c.ph + kh * c.dh;
              if (h < 0 || h >= H) continue;
              for (int64_t wo = 0; wo < WO; ++wo) {
                const int64_t wi = wo * c.sw - c.pw + kw * c.dw;
                if (wi < 0 || wi >= W) continue;
                f(((n * x[1] + cin) * H + h) * W + wi, w_off, ((n * O + o) * HO + ho) * WO + wo);
              }
            }
          }
      }
    }
}

template <typename T>
void store(const std::vector<Acc<T>>& acc, void* out) {
  T* dst = static_cast<T*>(out);
  for (size_t i = 0; i < acc.size(); ++i) dst[i] = static_cast<T>(acc[i]);
}

}  // namespace

void matmul(const ir::GraphNode& n, const Arr& a, const Arr& b, void* out) {
  const size_t r = n.shape.size();
  const int64_t M = a.shape[r - 2], K = a.shape[r - 1], N = b.shape[r - 1];
  Shape batch(n.shape.begin(), n.shape.end() - 2);
  std::vector<int64_t> as(r - 2), bs(r - 2);
  {
    int64_t acc_a = M * K, acc_b = K * N;
    for (size_t d = r - 2; d-- > 0;) {
      as[d] = a.shape[d] == 1 ? 0 : acc_a;
      bs[d] = b.shape[d] == 1 ? 0 : acc_b;
      acc_a *= a.shape[d];
      acc_b *= b.shape[d];
    }
  }
  const int64_t nb = shape_numel(batch);
  by_dtype<void>(n.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, bool>) {
      const T* A = a.as<T>();
      const T* B = b.as<T>();
      T* Y = static_cast<T*>(out);
      for (int64_t bi = 0; bi < nb; ++bi) {
        int64_t a_off = 0, b_off = 0, rest = bi;
        for (size_t d = batch.size(); d-- > 0;) {
          const int64_t i = rest % batch[d];
          rest /= batch[d];
          a_off += i * as[d];
          b_off += i * bs[d];
        }
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < N; ++j) {
            Acc<T> s = 0;
            for (int64_t k = 0; k < K; ++k)
              s += static_cast<Acc<T>>(A[a_off + i * K + k]) *
                   static_cast<Acc<T>>(B[b_off + k * N + j]);
            Y[(bi * M + i) * N + j] = static_cast<T>(s);
          }
      }
    }
  });
}

void conv2d(const ir::GraphNode& n, const Arr& x, const Arr& w, void* out) {
  const ConvGeometry c(ir::ConvAttrs::of(n.attrs));
  by_dtype<void>(n.dtype, [&](auto tag) {
    using T = decltype(tag);
    std::vector<Acc<T>> acc(shape_numel(n.shape), 0);
    const T* X = x.as<T>();
    const T* Wt = w.as<T>();
    for_each_conv_tap(x.shape, w.shape, n.shape, c, [&](int64_t xo, int64_t wo, int64_t yo) {
      acc[yo] += static_cast<Acc<T>>(X[xo]) * static_cast<Acc<T>>(Wt[wo]);
    });
    store<T>(acc, out);
  });
}

void conv2d_backward_input(const ir::GraphNode& n, const Arr& gy, const Arr& w, void* out) {
  const ConvGeometry c(ir::ConvAttrs::of(n.attrs));
  by_dtype<void>(n.dtype, [&](auto tag) {
    using T = decltype(tag);
    std::vector<Acc<T>> acc(shape_numel(n.shape), 0);
    const T* GY = gy.as<T>();
    const T* Wt = w.as<T>();
    for_each_conv_tap(n.shape, w.shape, gy.shape, c, [&](int64_t xo, int64_t wo, int64_t yo) {
      acc[xo] += static_cast<Acc<T>>(GY[yo]) * static_cast<Acc<T>>(Wt[wo]);
    });
    store<T>(acc, out);
  });
}

void conv2d_backward_weight(const ir::GraphNode& n, const Arr& x, const Arr& gy, void* out) {
  const ConvGeometry c(ir::ConvAttrs::of(n.attrs));
  by_dtype<void>(n.dtype, [&](auto tag) {
    using T = decltype(tag);
    std::vector<Acc<T>> acc(shape_numel(n.shape), 0);
    const T* X = x.as<T>();
    const T* GY = gy.as<T>();
    for_each_conv_tap(x.shape, n.shape, gy.shape, c, [&](int64_t xo, int64_t wo, int64_t yo) {
      acc[wo] += static_cast<Acc<T>>(X[xo]) * static_cast<Acc<T>>(GY[yo]);
    });
    store<T>(acc, out);
  });
}

void max_pool2d(const ir::GraphNode& n, const Arr& x, void* out, bool indices) {
  const PoolGeometry p(ir::PoolAttrs::of(n.attrs));
  const int64_t NC = x.shape[0] * x.shape[1], H = x.shape[2], W = x.shape[3];
  const int64_t HO = n.shape[2], WO = n.shape[3];
  by_dtype<void>(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* X = x.as<T>();
    for (int64_t plane = 0; plane < NC; ++plane)
      for (int64_t ho = 0; ho < HO; ++ho)
        for (int64_t wo = 0; wo < WO; ++wo) {
          T best{};
          int64_t at = -1;
          for (int64_t kh = 0; kh < p.kh; ++kh)
            for (int64_t kw = 0; kw < p.kw; ++kw) {
              const int64_t h = ho * p.sh - p.ph + kh, w = wo * p.sw - p.pw + kw;
              if (h < 0 || h >= H || w < 0 || w >= W) continue;
              const T v = X[(plane * H + h) * W + w];
              bool take = at < 0 || v > best;
              if constexpr (std::is_floating_point_v<T>)
                take = at < 0 || (!std::isnan(best) && (std::isnan(v) || v > best));
              if (take) {
                best = v;
                at = h * W + w;
              }
            }
          const int64_t o = (plane * HO + ho) * WO + wo;
          if (indices)
            static_cast<int64_t*>(out)[o] = at;
          else
            static_cast<T*>(out)[o] = best;
        }
  });
}

void max_pool2d_backward(const ir::GraphNode& n, const Arr& gy, const Arr& idx, void* out) {
  const int64_t NC = n.shape[0] * n.shape[1], HW = n.shape[2] * n.shape[3];
  const int64_t OHW = gy.shape[2] * gy.shape[3];
  by_dtype<void>(n.dtype, [&](auto tag) {
    using T = decltype(tag);
    std::vector<Acc<T>> acc(shape_numel(n.shape), 0);
    const T* GY = gy.as<T>();
    const int64_t* I = idx.as<int64_t>();
    check_indices("max_pool2d_backward", idx, {HW, -1});
    for (int64_t plane = 0; plane < NC; ++plane)
      for (int64_t o = 0; o < OHW; ++o) {
        const int64_t at = I[plane * OHW + o];
        acc[plane * HW + at] += static_cast<Acc<T>>(GY[plane * OHW + o]);
      }
    store<T>(acc, out);
  });
}

namespace {

// PyTorch's avg_pool2d window: the divisor counts padding cells (when asked) but not cells past
// the padded edge.
template <typename F>
void for_each_avg_window(const Shape& in, const Shape& outs, const PoolGeometry& p, F&& f) {
  const int64_t NC = in[0] * in[1], H = in[2], W = in[3];
  const int64_t HO = outs[2], WO = outs[3];
  for (int64_t plane = 0; plane < NC; ++plane)
    for (int64_t ho = 0; ho < HO; ++ho)
      for (int64_t wo = 0; wo < WO; ++wo) {
        int64_t h0 = ho * p.sh - p.ph, w0 = wo * p.sw - p.pw;
        int64_t h1 = std::min(h0 + p.kh, H + p.ph), w1 = std::min(w0 + p.kw, W + p.pw);
        const int64_t pool_size = (h1 - h0) * (w1 - w0);
        h0 = std::max<int64_t>(h0, 0);
        w0 = std::max<int64_t>(w0, 0);
        h1 = std::min(h1, H);
        w1 = std::min(w1, W);
        const int64_t divisor = p.count_include_pad ? pool_size : (h1 - h0) * (w1 - w0);
        f(plane, (plane * HO + ho) * WO + wo, h0, h1, w0, w1, divisor);
      }
}

}  // namespace

void avg_pool2d(const ir::GraphNode& n, const Arr& x, void* out) {
  const PoolGeometry p(ir::PoolAttrs::of(n.attrs));
  const int64_t H = x.shape[2], W = x.shape[3];
  by_dtype<void>(n.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* X = x.as<T>();
    T* Y = static_cast<T*>(out);
    for_each_avg_window(x.shape, n.shape, p,
                        [&](int64_t plane, int64_t o, int64_t h0, int64_t h1, int64_t w0,
                            int64_t w1, int64_t divisor) {
                          Acc<T> s = 0;
                          for (int64_t h = h0; h < h1; ++h)
                            for (int64_t w = w0; w < w1; ++w) s += X[(plane * H + h) * W + w];
                          Y[o] =
                              divisor > 0 ? static_cast<T>(s / static_cast<Acc<T>>(divisor)) : T(0);
                        });
  });
}

void avg_pool2d_backward(const ir::GraphNode& n, const Arr& gy, void* out) {
  const PoolGeometry p(ir::PoolAttrs::of(n.attrs));
  const int64_t H = n.shape[2], W = n.shape[3];
  by_dtype<void>(n.dtype, [&](auto tag) {
    using T = decltype(tag);
    std::vector<Acc<T>> acc(shape_numel(n.shape), 0);
    const T* GY = gy.as<T>();
    for_each_avg_window(n.shape, gy.shape, p,
                        [&](int64_t plane, int64_t o, int64_t h0, int64_t h1, int64_t w0,
                            int64_t w1, int64_t divisor) {
                          if (divisor <= 0) return;
                          const Acc<T> g =
                              static_cast<Acc<T>>(GY[o]) / static_cast<Acc<T>>(divisor);
                          for (int64_t h = h0; h < h1; ++h)
                            for (int64_t w = w0; w < w1; ++w) acc[(plane * H + h) * W + w] += g;
                        });
    store<T>(acc, out);
  });
}

namespace {

// Element offsets of x for each element of `index` along `axis`; throws on an index out of
// range (known only at run time), negative ones included, as PyTorch's gather and scatter do.
template <typename F>
void for_each_indexed(const char* op, const Shape& x, const Arr& index, int64_t axis, F&& f) {
  check_indices(op, index, {x[axis], axis});
  const std::vector<int64_t> xs = strides_of(x);
  std::vector<int64_t> walk = xs;
  walk[axis] = 0;
  const int64_t n = shape_numel(index.shape);
  const int64_t* I = index.as<int64_t>();
  IndexWalker w(index.shape, walk, 0);
  for (int64_t i = 0; i < n; ++i, w.next()) f(i, w.offset + I[i] * xs[axis]);
}

}  // namespace

void check_indices(const char* op, const Arr& index, ir::IndexBound bound) {
  const int64_t n = shape_numel(index.shape);
  const int64_t* I = index.as<int64_t>();
  for (int64_t i = 0; i < n; ++i)
    if (I[i] < 0 || I[i] >= bound.size)
      throw BackendError(cat(op, ": index ", I[i], " is out of range [0, ", bound.size, ")",
                             bound.axis >= 0 ? cat(" for axis ", bound.axis)
                                             : cat(" for a plane of ", bound.size, " elements"),
                             I[i] < 0 ? " (negative indices are errors, as in PyTorch)" : ""));
}

void gather(const ir::GraphNode& n, const Arr& x, const Arr& idx, void* out) {
  const size_t elem = dtype_size(n.dtype);
  for_each_indexed("gather", x.shape, idx, n.attrs[0], [&](int64_t i, int64_t at) {
    std::memcpy(static_cast<char*>(out) + i * elem, static_cast<const char*>(x.data) + at * elem,
                elem);
  });
}

void argsort(const ir::GraphNode& n, const Arr& x, void* out) {
  const int64_t axis = n.attrs[0];
  const bool descending = n.attrs[1] != 0;
  const int64_t len = x.shape.empty() ? 1 : x.shape[axis];
  const int64_t inner = x.shape.empty() ? 1 : strides_of(x.shape)[axis];
  const int64_t outer = len * inner == 0 ? 0 : shape_numel(x.shape) / (len * inner);
  int64_t* Y = static_cast<int64_t*>(out);
  by_dtype<void>(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* X = x.as<T>();
    // NaN is the largest value (PyTorch's order); ties keep their order (stable).
    auto above = [](T a, T b) {
      if constexpr (std::is_floating_point_v<T>) {
        if (std::isnan(a)) return !std::isnan(b);
        if (std::isnan(b)) return false;
      }
      return a > b;
    };
    std::vector<int64_t> order(static_cast<size_t>(len));
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < inner; ++i) {
        const int64_t base = o * len * inner + i;
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
          const T va = X[base + a * inner], vb = X[base + b * inner];
          return descending ? above(va, vb) : above(vb, va);
        });
        for (int64_t k = 0; k < len; ++k) Y[base + k * inner] = order[static_cast<size_t>(k)];
      }
  });
}

void scatter_add(const ir::GraphNode& n, const Arr& x, const Arr& idx, const Arr& src, void* out) {
  const std::vector<int64_t> ss = strides_of(src.shape);
  by_dtype<void>(n.dtype, [&](auto tag) {
    using T = decltype(tag);
    T* Y = static_cast<T*>(out);
    const T* S = src.as<T>();
    const int64_t total = shape_numel(n.shape);
    for (int64_t i = 0; i < total; ++i) Y[i] = x.as<T>()[i];
    IndexWalker ws(idx.shape, ss, 0);
    for_each_indexed("scatter_add", x.shape, idx, n.attrs[0], [&](int64_t, int64_t at) {
      if constexpr (std::is_same_v<T, bool>) {
        Y[at] = Y[at] || S[ws.offset];
      } else if constexpr (std::is_integral_v<T>) {  // wraps, as integer add does
        using U = std::make_unsigned_t<T>;
        Y[at] = static_cast<T>(static_cast<U>(Y[at]) + static_cast<U>(S[ws.offset]));
      } else {
        Y[at] = static_cast<T>(Y[at] + S[ws.offset]);
      }
      ws.next();
    });
  });
}

}  // namespace lockstep::backends::ref
