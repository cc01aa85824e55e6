#include "backends/cpu/typed_kernels.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "backends/by_dtype.h"
#include "backends/cpu/matmul.h"
#include "backends/cpu/parallel.h"
#include "ir/attrs.h"
#include "ir/elementwise.h"
#include "lockstep/dtype.h"
#include "lockstep/error.h"
#include "util/check.h"

namespace lockstep::backends::cpu {
namespace {

using ir::Op;

// Loops over fewer elements than this (or products of fewer multiply-adds) run on one thread.
constexpr int64_t kParallelElems = 1 << 15;

template <typename S>
constexpr bool kBf16 = std::is_same_v<S, bfloat16>;
template <typename S>
constexpr bool kBool = std::is_same_v<S, bool>;
// What an element of storage type S is computed as: bf16 in f32, everything else as itself.
template <typename S>
using Calc = std::conditional_t<kBf16<S>, float, S>;
template <typename C>
constexpr bool kFloat = std::is_floating_point_v<C>;
template <typename C>
constexpr bool kInt = std::is_integral_v<C> && !kBool<C>;
// Sums and products accumulate floats in double and integers in 64 bits.
template <typename C>
using Acc = std::conditional_t<kFloat<C>, double, int64_t>;

template <typename S>
Calc<S> load(S v) {
  if constexpr (kBf16<S>)
    return static_cast<float>(v);
  else
    return v;
}
template <typename S, typename C>
S store(C v) {
  if constexpr (kBf16<S>)
    return bfloat16(static_cast<float>(v));
  else
    return static_cast<S>(v);
}

// y[i] = f(x[i]...) over n elements, threaded when large. f takes and returns computed values.
template <typename Y, typename F, typename... X>
void map(int64_t n, Y* y, F f, const X*... x) {
  parallel_for(n > kParallelElems, n, [&](int64_t i) { y[i] = store<Y>(f(load(x[i])...)); });
}

// An elementwise op (ir/elementwise.h) over n elements of storage type S: each value computed
// by the table's formula. Integer divisors are checked first, so that a failing op writes
// nothing. False if the op does not admit S.
template <typename S>
bool elementwise(Op op, const std::vector<TypedArg>& args, int64_t n, void* out) {
  using C = Calc<S>;
  const auto x = [&](size_t k) { return static_cast<const S*>(args[k].data); };
  return ir::elementwise::with_fn<C>(op, [&](auto fn) {
    using Fn = decltype(fn);
    if constexpr (requires(C v) { Fn::f(v); }) {
      using Y = std::conditional_t<kBool<decltype(Fn::f(C{}))>, bool, S>;
      map(
          n, static_cast<Y*>(out), [](C v) { return Fn::f(v); }, x(0));
    } else if constexpr (requires(C v) { Fn::f(v, v); }) {
      if constexpr (kInt<C> && requires { Fn::int_failure(C{}); }) {
        for (int64_t i = 0; i < n; ++i)
          if (const char* why = Fn::int_failure(x(1)[i]))
            throw BackendError(util::cat(ir::op_info(op).name, ": ", why));
      }
      using Y = std::conditional_t<kBool<decltype(Fn::f(C{}, C{}))>, bool, S>;
      map(
          n, static_cast<Y*>(out), [](C u, C v) { return Fn::f(u, v); }, x(0), x(1));
    } else {
      const bool* c = static_cast<const bool*>(args[0].data);
      const S* a = x(1);
      const S* b = x(2);
      S* y = static_cast<S*>(out);
      parallel_for(n > kParallelElems, n, [&](int64_t i) { y[i] = Fn::f(c[i], a[i], b[i]); });
    }
  });
}

}  // namespace

void typed_elementwise(Op op, DType out_dtype, const std::vector<TypedArg>& args, int64_t n,
                       void* out) {
  if (n == 0) return;
  if (op == Op::Cast) {
    return by_dtype<bfloat16>(args[0].dtype, [&](auto from) {
      using From = decltype(from);
      by_dtype<bfloat16>(out_dtype, [&](auto to) {
        using To = decltype(to);
        const From* x = static_cast<const From*>(args[0].data);
        To* y = static_cast<To*>(out);
        parallel_for(n > kParallelElems, n,
                     [&](int64_t i) { y[i] = ir::elementwise::convert<To>(x[i]); });
      });
    });
  }
  // A select's operand 0 is its condition: its branches have the values' dtype.
  const DType operands = args[ir::op_info(op).family == ir::OpFamily::Select ? 1 : 0].dtype;
  bool known = false;
  by_dtype<bfloat16>(operands,
                     [&](auto tag) { known = elementwise<decltype(tag)>(op, args, n, out); });
  if (!known)
    util::internal_fail(
        __FILE__, __LINE__,
        util::cat("no cpu kernel for ", ir::op_info(op).name, " on ", dtype_name(operands)));
}

// ---- reductions -------------------------------------------------------------------------------

namespace {

// The kept axes (output order) and the reduced ones, each with its stride in the input.
struct ReduceWalk {
  Shape kept, reduced;
  std::vector<int64_t> kept_stride, reduced_stride;
  int64_t out_n = 1, block = 1;

  ReduceWalk(const Shape& xs, const std::vector<int64_t>& attrs) {
    std::vector<bool> is_reduced(xs.size(), false);
    for (size_t i = 1; i < attrs.size(); ++i) is_reduced[static_cast<size_t>(attrs[i])] = true;
    int64_t stride = 1;
    std::vector<int64_t> strides(xs.size());
    for (size_t d = xs.size(); d-- > 0;) {
      strides[d] = stride;
      stride *= xs[d];
    }
    for (size_t d = 0; d < xs.size(); ++d) {
      (is_reduced[d] ? reduced : kept).push_back(xs[d]);
      (is_reduced[d] ? reduced_stride : kept_stride).push_back(strides[d]);
    }
    for (int64_t k : kept) out_n *= k;
    for (int64_t r : reduced) block *= r;
  }

  int64_t base(int64_t o) const {
    int64_t off = 0;
    for (size_t d = kept.size(); d-- > 0;) {
      off += (o % kept[d]) * kept_stride[d];
      o /= kept[d];
    }
    return off;
  }

  // f(offset in x, position in the block) for the block of output o, in row-major order.
  template <typename F>
  void visit(int64_t o, F&& f) const {
    const int64_t b = base(o);
    if (reduced.empty()) return f(b, int64_t{0});
    if (block == 0) return;
    const size_t r = reduced.size();
    const int64_t inner = reduced[r - 1], step = reduced_stride[r - 1];
    std::vector<int64_t> idx(r - 1, 0);
    int64_t off = b, pos = 0;
    for (;;) {
      for (int64_t i = 0; i < inner; ++i) f(off + i * step, pos + i);
      pos += inner;
      size_t d = r - 1;
      for (; d-- > 0;) {
        off += reduced_stride[d];
        if (++idx[d] < reduced[d]) break;
        off -= reduced_stride[d] * reduced[d];
        idx[d] = 0;
      }
      if (d == static_cast<size_t>(-1)) return;
    }
  }
};

}  // namespace

namespace {

template <typename S, typename O>
void sum_over(const ReduceWalk& w, const S* X, O* Y, bool threaded) {
  using C = Calc<S>;
  parallel_for(threaded, w.out_n, [&](int64_t o) {
    Acc<C> acc = 0;
    w.visit(o, [&acc, X](int64_t off, int64_t) {
      if constexpr (kFloat<C>)
        acc += static_cast<double>(load(X[off]));
      else
        acc = ir::elementwise::wrap_add<int64_t>(acc, static_cast<int64_t>(X[off]));
    });
    if constexpr (kBf16<O>)
      Y[o] = bfloat16(static_cast<float>(acc));
    else if constexpr (kBool<O>)
      Y[o] = acc != 0;
    else
      Y[o] = static_cast<O>(acc);
  });
}

// The first largest (is_max) or smallest value of each block and its position; NaN wins and
// stays, as PyTorch's max and argmax.
template <typename S>
void extreme_over(const ReduceWalk& w, const S* X, bool is_max, bool want_index, void* out,
                  bool threaded) {
  using C = Calc<S>;
  parallel_for(threaded, w.out_n, [&](int64_t o) {
    C best{};
    int64_t at = -1;
    w.visit(o, [&best, &at, X, is_max](int64_t off, int64_t pos) {
      const C v = load(X[off]);
      bool take = at < 0;
      if (!take) {
        if constexpr (kFloat<C>)
          take = !std::isnan(best) && (std::isnan(v) || (is_max ? v > best : v < best));
        else
          take = is_max ? v > best : v < best;
      }
      if (take) {
        best = v;
        at = pos;
      }
    });
    if (want_index)
      static_cast<int64_t*>(out)[o] = at;
    else
      static_cast<S*>(out)[o] = store<S>(best);
  });
}

}  // namespace

void typed_reduce(Op op, DType out_dtype, TypedArg x, const Shape& xs,
                  const std::vector<int64_t>& attrs, void* out) {
  const ReduceWalk w(xs, attrs);
  if (w.out_n == 0) return;
  const bool threaded = w.out_n > 1 && w.out_n * std::max<int64_t>(w.block, 1) > kParallelElems;
  by_dtype<bfloat16>(x.dtype, [&](auto tag) {
    using S = decltype(tag);
    const S* X = static_cast<const S*>(x.data);
    if (op == Op::Sum)
      by_dtype<bfloat16>(out_dtype, [&](auto otag) {
        using O = decltype(otag);
        sum_over<S, O>(w, X, static_cast<O*>(out), threaded);
      });
    else
      extreme_over<S>(w, X, op == Op::Max || op == Op::ArgMax, op == Op::ArgMax || op == Op::ArgMin,
                      out, threaded);
  });
}

// ---- products and convolutions ----------------------------------------------------------------

namespace {

// C = op(A) op(B) (+ C when accumulating), row-major, op() a transpose where asked. f64 on
// OpenBLAS, f32 on the BLAS sgemm (matmul.h); integers wrap.
template <typename T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B,
          int64_t ldb, T* C, int64_t ldc, bool accumulate) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    if (!accumulate)
      for (int64_t i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, T(0));
    return;
  }
  if constexpr (std::is_same_v<T, double>) {
    const CBLAS_TRANSPOSE a_t = ta ? CblasTrans : CblasNoTrans;
    const CBLAS_TRANSPOSE b_t = tb ? CblasTrans : CblasNoTrans;
    const auto m = static_cast<blasint>(M), n = static_cast<blasint>(N),
               k = static_cast<blasint>(K);
    cblas_dgemm(CblasRowMajor, a_t, b_t, m, n, k, 1.0, A, static_cast<blasint>(lda), B,
                static_cast<blasint>(ldb), accumulate ? 1.0 : 0.0, C, static_cast<blasint>(ldc));
  } else if constexpr (std::is_same_v<T, float>) {
    blas_sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, accumulate ? 1.0f : 0.0f, C, ldc);
  } else {
    using U = std::make_unsigned_t<T>;
    const bool threaded = !omp_in_parallel() && M > 1 && M * N * K > kParallelElems;
    parallel_region(threaded, [&] {
      std::vector<U> row(static_cast<size_t>(N));
#pragma omp for schedule(static)
      for (int64_t i = 0; i < M; ++i) {
        for (int64_t j = 0; j < N; ++j) row[j] = accumulate ? static_cast<U>(C[i * ldc + j]) : 0;
        for (int64_t kk = 0; kk < K; ++kk) {
          const U a = static_cast<U>(ta ? A[kk * lda + i] : A[i * lda + kk]);
          for (int64_t j = 0; j < N; ++j)
            row[j] += a * static_cast<U>(tb ? B[j * ldb + kk] : B[kk * ldb + j]);
        }
        for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = static_cast<T>(row[j]);
      }
    });
  }
}

// bf16 operands widened to f32 (and the result rounded) around a kernel on f32 values.
template <typename F>
void through_f32(const TypedArg& a, const Shape& as, const TypedArg& b, const Shape& bs,
                 const Shape& out_shape, void* out, F&& f) {
  auto widen = [](const TypedArg& x, const Shape& s) {
    std::vector<float> w(static_cast<size_t>(shape_numel(s)));
    const bfloat16* p = static_cast<const bfloat16*>(x.data);
    for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(p[i]);
    return w;
  };
  const std::vector<float> wa = widen(a, as), wb = widen(b, bs);
  std::vector<float> result(static_cast<size_t>(shape_numel(out_shape)));
  f(wa.data(), wb.data(), result.data());
  bfloat16* dst = static_cast<bfloat16*>(out);
  for (size_t i = 0; i < result.size(); ++i) dst[i] = bfloat16(result[i]);
}

template <typename T>
void matmul_as(const T* A, const Shape& as, const T* B, const Shape& bs, const Shape& out_shape,
               T* Y) {
  const size_t r = out_shape.size();
  const int64_t M = as[r - 2], K = as[r - 1], N = bs[r - 1];
  const Shape batch(out_shape.begin(), out_shape.end() - 2);
  std::vector<int64_t> a_stride(r - 2), b_stride(r - 2);
  int64_t acc_a = M * K, acc_b = K * N;
  for (size_t d = r - 2; d-- > 0;) {
    a_stride[d] = as[d] == 1 ? 0 : acc_a;
    b_stride[d] = bs[d] == 1 ? 0 : acc_b;
    acc_a *= as[d];
    acc_b *= bs[d];
  }
  const int64_t nb = shape_numel(batch);
  // Many small products: one per thread (BLAS runs single-threaded inside a parallel region).
  const bool threaded = nb > 1 && M * N * K < (1 << 20) && nb * M * N * K > kParallelElems;
  parallel_for(threaded, nb, [&](int64_t bi) {
    int64_t a_off = 0, b_off = 0, rest = bi;
    for (size_t d = batch.size(); d-- > 0;) {
      const int64_t i = rest % batch[d];
      rest /= batch[d];
      a_off += i * a_stride[d];
      b_off += i * b_stride[d];
    }
    gemm<T>(false, false, M, N, K, A + a_off, K, B + b_off, N, Y + bi * M * N, N, false);
  });
}

struct ConvGeometry {
  int64_t N, C, H, W, O, Cg, KH, KW, HO, WO, groups, Og;
  ir::ConvAttrs a;
  int64_t rows() const { return Cg * KH * KW; }
  int64_t cols() const { return HO * WO; }
};

// cols[(c KH + kh) KW + kw][ho WO + wo]: the input under each tap of group g of image x.
template <typename T>
void im2col(const ConvGeometry& g, const T* x, int64_t group, T* cols) {
  for (int64_t c = 0; c < g.Cg; ++c) {
    const T* plane = x + (group * g.Cg + c) * g.H * g.W;
    for (int64_t kh = 0; kh < g.KH; ++kh)
      for (int64_t kw = 0; kw < g.KW; ++kw) {
        T* row = cols + ((c * g.KH + kh) * g.KW + kw) * g.cols();
        for (int64_t ho = 0; ho < g.HO; ++ho) {
          const int64_t h = ho * g.a.stride[0] - g.a.padding[0] + kh * g.a.dilation[0];
          for (int64_t wo = 0; wo < g.WO; ++wo) {
            const int64_t w = wo * g.a.stride[1] - g.a.padding[1] + kw * g.a.dilation[1];
            row[ho * g.WO + wo] =
                (h >= 0 && h < g.H && w >= 0 && w < g.W) ? plane[h * g.W + w] : T(0);
          }
        }
      }
  }
}

// The inverse scatter: each tap's column added back into image x's group g.
template <typename T>
void col2im(const ConvGeometry& g, const T* cols, int64_t group, T* x) {
  for (int64_t c = 0; c < g.Cg; ++c) {
    T* plane = x + (group * g.Cg + c) * g.H * g.W;
    for (int64_t kh = 0; kh < g.KH; ++kh)
      for (int64_t kw = 0; kw < g.KW; ++kw) {
        const T* row = cols + ((c * g.KH + kh) * g.KW + kw) * g.cols();
        for (int64_t ho = 0; ho < g.HO; ++ho) {
          const int64_t h = ho * g.a.stride[0] - g.a.padding[0] + kh * g.a.dilation[0];
          if (h < 0 || h >= g.H) continue;
          for (int64_t wo = 0; wo < g.WO; ++wo) {
            const int64_t w = wo * g.a.stride[1] - g.a.padding[1] + kw * g.a.dilation[1];
            if (w >= 0 && w < g.W)
              plane[h * g.W + w] = static_cast<T>(plane[h * g.W + w] + row[ho * g.WO + wo]);
          }
        }
      }
  }
}

template <typename T>
void conv_as(Op op, const ConvGeometry& g, const T* a, const T* b, T* y) {
  const int64_t R = g.rows(), P = g.cols();
  const int64_t image = g.C * g.H * g.W, out_image = g.O * P;
  const int64_t w_group = g.Og * R;
  if (op == Op::Conv2dBackwardWeight) {
    // dw_g += gy_g [Og, P] x cols_g^T, image after image (the sum in image order).
    std::vector<T> cols(static_cast<size_t>(R * P));
    for (int64_t n = 0; n < g.N; ++n)
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        im2col(g, a + n * image, grp, cols.data());
        gemm<T>(false, true, g.Og, R, P, b + n * out_image + grp * g.Og * P, P, cols.data(), P,
                y + grp * w_group, R, n > 0);
      }
    if (g.N == 0) std::fill(y, y + g.O * R, T(0));
    return;
  }
  if (op == Op::Conv2dBackwardInput) std::fill(y, y + g.N * image, T(0));
  const bool threaded = g.N > 1 && g.N * g.O * R * P > kParallelElems;
  parallel_region(threaded, [&] {
    std::vector<T> cols(static_cast<size_t>(R * P));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < g.N; ++n)
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        if (op == Op::Conv2d) {  // y_g = w_g [Og, R] x cols_g
          im2col(g, a + n * image, grp, cols.data());
          gemm<T>(false, false, g.Og, P, R, b + grp * w_group, R, cols.data(), P,
                  y + n * out_image + grp * g.Og * P, P, false);
        } else {  // cols_g = w_g^T x gy_g, scattered back
          gemm<T>(true, false, R, P, g.Og, b + grp * w_group, R, a + n * out_image + grp * g.Og * P,
                  P, cols.data(), P, false);
          col2im(g, cols.data(), grp, y + n * image);
        }
      }
  });
}

}  // namespace

void typed_matmul(DType dtype, TypedArg a, const Shape& as, TypedArg b, const Shape& bs,
                  const Shape& out_shape, void* out) {
  if (shape_numel(out_shape) == 0) return;
  if (dtype == DType::BF16)
    return through_f32(a, as, b, bs, out_shape, out, [&](const float* A, const float* B, float* Y) {
      matmul_as<float>(A, as, B, bs, out_shape, Y);
    });
  by_dtype<bfloat16>(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (kBf16<T>) {
    } else if constexpr (kBool<T>) {
      util::internal_fail(__FILE__, __LINE__, "no matmul on bool");
    } else {
      matmul_as<T>(static_cast<const T*>(a.data), as, static_cast<const T*>(b.data), bs, out_shape,
                   static_cast<T*>(out));
    }
  });
}

void typed_conv(Op op, DType dtype, TypedArg a, const Shape& as, TypedArg b, const Shape& bs,
                const Shape& out_shape, const std::vector<int64_t>& attrs, void* out) {
  if (shape_numel(out_shape) == 0) return;
  // x, w and y of the forward convolution, whichever two this op reads.
  const Shape& x = op == Op::Conv2dBackwardInput ? out_shape : as;
  const Shape& w = op == Op::Conv2dBackwardWeight ? out_shape : bs;
  const Shape& y = op == Op::Conv2d ? out_shape : op == Op::Conv2dBackwardInput ? as : bs;
  ConvGeometry g{
      x[0], x[1], x[2], x[3], w[0], w[1], w[2], w[3], y[2], y[3], 1, 1, ir::ConvAttrs::of(attrs)};
  g.groups = g.a.groups;
  g.Og = g.O / g.groups;
  if (dtype == DType::BF16)
    return through_f32(a, as, b, bs, out_shape, out, [&](const float* A, const float* B, float* Y) {
      conv_as<float>(op, g, A, B, Y);
    });
  by_dtype<bfloat16>(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (kBf16<T>) {
    } else if constexpr (kBool<T>) {
      util::internal_fail(__FILE__, __LINE__, "no convolution on bool");
    } else {
      conv_as<T>(op, g, static_cast<const T*>(a.data), static_cast<const T*>(b.data),
                 static_cast<T*>(out));
    }
  });
}

// ---- pooling ----------------------------------------------------------------------------------

void typed_pool(Op op, TypedArg x, const Shape& xs, const int64_t* indices, const Shape& out_shape,
                const std::vector<int64_t>& attrs, void* out) {
  if (shape_numel(out_shape) == 0) return;
  const ir::PoolAttrs p = ir::PoolAttrs::of(attrs);
  // The input side (the forward's x) and the output side of the pooling.
  const bool backward = op == Op::MaxPool2dBackward || op == Op::AvgPool2dBackward;
  const Shape& in = backward ? out_shape : xs;
  const Shape& pooled = backward ? xs : out_shape;
  const int64_t planes = in[0] * in[1], H = in[2], W = in[3], HO = pooled[2], WO = pooled[3];
  const bool threaded = planes > 1 && planes * H * W > kParallelElems;
  by_dtype<bfloat16>(x.dtype, [&](auto tag) {
    using S = decltype(tag);
    using C = Calc<S>;
    const S* X = static_cast<const S*>(x.data);
    if (op == Op::MaxPool2d || op == Op::MaxPool2dIndices) {
      parallel_for(threaded, planes, [&](int64_t plane) {
        for (int64_t ho = 0; ho < HO; ++ho)
          for (int64_t wo = 0; wo < WO; ++wo) {
            C best{};
            int64_t at = -1;
            for (int64_t kh = 0; kh < p.kernel[0]; ++kh) {
              const int64_t h = ho * p.stride[0] - p.padding[0] + kh;
              if (h < 0 || h >= H) continue;
              for (int64_t kw = 0; kw < p.kernel[1]; ++kw) {
                const int64_t w = wo * p.stride[1] - p.padding[1] + kw;
                if (w < 0 || w >= W) continue;
                const C v = load(X[(plane * H + h) * W + w]);
                bool take;
                if constexpr (kFloat<C>)  // NaN wins and stays
                  take = at < 0 || (!std::isnan(best) && (std::isnan(v) || v > best));
                else
                  take = at < 0 || v > best;
                if (take) {
                  best = v;
                  at = h * W + w;
                }
              }
            }
            const int64_t o = (plane * HO + ho) * WO + wo;
            if (op == Op::MaxPool2dIndices)
              static_cast<int64_t*>(out)[o] = at;
            else
              static_cast<S*>(out)[o] = store<S>(best);
          }
      });
      return;
    }
    S* Y = static_cast<S*>(out);
    // PyTorch's average window: the divisor counts padding cells (when asked) but not cells
    // past the padded edge.
    auto window = [&](int64_t ho, int64_t wo, int64_t& h0, int64_t& h1, int64_t& w0, int64_t& w1) {
      h0 = ho * p.stride[0] - p.padding[0];
      w0 = wo * p.stride[1] - p.padding[1];
      h1 = std::min(h0 + p.kernel[0], H + p.padding[0]);
      w1 = std::min(w0 + p.kernel[1], W + p.padding[1]);
      const int64_t pool_size = (h1 - h0) * (w1 - w0);
      h0 = std::max<int64_t>(h0, 0);
      w0 = std::max<int64_t>(w0, 0);
      h1 = std::min(h1, H);
      w1 = std::min(w1, W);
      return p.count_include_pad ? pool_size : (h1 - h0) * (w1 - w0);
    };
    if (op == Op::AvgPool2d) {
      parallel_for(threaded, planes, [&](int64_t plane) {
        for (int64_t ho = 0; ho < HO; ++ho)
          for (int64_t wo = 0; wo < WO; ++wo) {
            int64_t h0, h1, w0, w1;
            const int64_t divisor = window(ho, wo, h0, h1, w0, w1);
            Acc<C> s = 0;
            for (int64_t h = h0; h < h1; ++h)
              for (int64_t w = w0; w < w1; ++w) s += load(X[(plane * H + h) * W + w]);
            Y[(plane * HO + ho) * WO + wo] =
                divisor > 0 ? store<S>(static_cast<C>(s / static_cast<Acc<C>>(divisor))) : S(0);
          }
      });
      return;
    }
    // The gradients: each plane summed in its own accumulator, then stored.
    parallel_region(threaded, [&] {
      std::vector<Acc<C>> acc(static_cast<size_t>(H * W));
#pragma omp for schedule(static)
      for (int64_t plane = 0; plane < planes; ++plane) {
        std::fill(acc.begin(), acc.end(), Acc<C>(0));
        const S* gy = X + plane * HO * WO;
        if (op == Op::MaxPool2dBackward) {
          const int64_t* at = indices + plane * HO * WO;
          for (int64_t o = 0; o < HO * WO; ++o) acc[at[o]] += static_cast<Acc<C>>(load(gy[o]));
        } else {
          for (int64_t ho = 0; ho < HO; ++ho)
            for (int64_t wo = 0; wo < WO; ++wo) {
              int64_t h0, h1, w0, w1;
              const int64_t divisor = window(ho, wo, h0, h1, w0, w1);
              if (divisor <= 0) continue;
              const Acc<C> v =
                  static_cast<Acc<C>>(load(gy[ho * WO + wo])) / static_cast<Acc<C>>(divisor);
              for (int64_t h = h0; h < h1; ++h)
                for (int64_t w = w0; w < w1; ++w) acc[h * W + w] += v;
            }
        }
        for (int64_t i = 0; i < H * W; ++i) Y[plane * H * W + i] = store<S>(static_cast<C>(acc[i]));
      }
    });
  });
}

}  // namespace lockstep::backends::cpu
