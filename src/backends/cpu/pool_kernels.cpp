// Max pooling on f32 and bf16 (see kernels.h): values and indices in one pass, and the
// gradient, in the plain layout and the blocked nChw16c one. Not average pooling, which runs on
// oneDNN (dnnl_ops.h).
#include <algorithm>
#include <type_traits>
#include <vector>

#include "backends/cpu/kernels.h"
#include "ir/attrs.h"
#include "lockstep/error.h"
#include "util/check.h"

namespace lockstep::backends::cpu {

namespace {

// Max pooling's elements: f32, or bf16 bits (compared as the floats they widen to; maxima are
// input values, so writing them back as bf16 is exact).
inline float as_float(float v) { return v; }
inline float as_float(uint16_t v) { return bf16_value(v); }
template <typename T>
inline T from_float(float v) {
  if constexpr (std::is_same_v<T, float>)
    return v;
  else
    return exact_bf16_bits(v);
}

// One output row of a max pooling, for the window row h and column offset kx: outputs
// [lo, hi) (whose windows lie inside the plane along w) take x[h, wo * S - pw + kx] when it is
// larger or the first NaN. S is the stride when known at compile time (so the strided loads
// vectorize), 0 for "use sw".
template <int S>
void pool_row(const float* xrow, int64_t lo, int64_t hi, int64_t sw, int64_t off, int32_t base,
              float* __restrict best, int32_t* __restrict at) {
  const int64_t stride = S > 0 ? S : sw;
  for (int64_t wo = lo; wo < hi; ++wo) {
    const int64_t w = wo * stride + off;
    const float v = xrow[w];
    const float b = best[wo];
    const bool take = (v > b) | ((v != v) & (b == b));
    best[wo] = take ? v : b;
    at[wo] = take ? base + static_cast<int32_t>(w) : at[wo];
  }
}

// Plane p of x (plane values each) as floats: an f32 plane where it lies, a bf16 one widened
// into `wide` (one vectorized pass).
template <typename T>
const float* plane_f32(const T* x, int64_t p, int64_t plane, std::vector<float>& wide) {
  if constexpr (std::is_same_v<T, float>) {
    return x + p * plane;
  } else {
    bf16_to_f32(x + p * plane, plane, wide.data());
    return wide.data();
  }
}

// One window element for n outputs at once: v[j] at its plane index at_k[j] (-1: outside the
// plane, never taken), taken as pool_row takes one, or as the first when nothing is yet (at < 0).
LOCKSTEP_TARGET_CLONES void pool_take(const float* __restrict v, const int32_t* __restrict at_k,
                                      int64_t n, float* __restrict best, int32_t* __restrict at) {
  for (int64_t j = 0; j < n; ++j) {
    const float x = v[j], b = best[j];
    const bool take = (at_k[j] >= 0) & ((at[j] < 0) | (x > b) | ((x != x) & (b == b)));
    best[j] = take ? x : b;
    at[j] = take ? at_k[j] : at[j];
  }
}

template <typename T>
void max_pool2d_plain(const T* x, const Shape& in, const Shape& out, const std::vector<int64_t>& a,
                      T* values, int64_t* indices) {
  const int64_t planes = in[0] * in[1], H = in[2], W = in[3], HO = out[2], WO = out[3];
  const ir::PoolAttrs pool = ir::PoolAttrs::of(a);
  const int64_t kh = pool.kernel[0], kw = pool.kernel[1], sh = pool.stride[0], sw = pool.stride[1],
                ph = pool.padding[0], pw = pool.padding[1];
  if (H * W > INT32_MAX) {  // indices kept as int32 below
    throw BackendError(util::cat("max_pool2d: a plane of ", H * W, " elements is too large"));
  }
  // Short output rows (small maps: 14x14 pooled to 7x7) a whole plane at a time: rows of 7
  // cost a few calls per window element each. Per window element k (row-major), the plane index
  // each output reads there (-1 outside the plane), the same for every plane; per plane, those
  // values gathered, then taken in window order for all its outputs at once.
  const int64_t plane_out = HO * WO, window = kh * kw;
  if (WO < 16 && plane_out * window <= 16384) {
    std::vector<int32_t> at_k(static_cast<size_t>(window * plane_out));
    for (int64_t ky = 0; ky < kh; ++ky)
      for (int64_t kx = 0; kx < kw; ++kx)
        for (int64_t ho = 0; ho < HO; ++ho)
          for (int64_t wo = 0; wo < WO; ++wo) {
            const int64_t h = ho * sh - ph + ky, w = wo * sw - pw + kx;
            at_k[((ky * kw + kx) * HO + ho) * WO + wo] =
                h >= 0 && h < H && w >= 0 && w < W ? static_cast<int32_t>(h * W + w) : -1;
          }
#pragma omp parallel
    {
      std::vector<float> v(static_cast<size_t>(plane_out)), best(v.size());
      std::vector<int32_t> at(v.size());
      std::vector<float> wide(std::is_same_v<T, float> ? 0 : static_cast<size_t>(H * W));
#pragma omp for schedule(static)
      for (int64_t p = 0; p < planes; ++p) {
        const float* xp = plane_f32(x, p, H * W, wide);
        std::fill(best.begin(), best.end(), 0.0f);  // an empty window: 0 at -1
        std::fill(at.begin(), at.end(), -1);
        for (int64_t k = 0; k < window; ++k) {
          const int32_t* ak = at_k.data() + k * plane_out;
          for (int64_t j = 0; j < plane_out; ++j) v[j] = ak[j] >= 0 ? xp[ak[j]] : 0.0f;
          pool_take(v.data(), ak, plane_out, best.data(), at.data());
        }
        const int64_t o = p * plane_out;
        if (values)
          for (int64_t j = 0; j < plane_out; ++j) values[o + j] = from_float<T>(best[j]);
        if (indices) std::copy(at.begin(), at.end(), indices + o);
      }
    }
    return;
  }
#pragma omp parallel
  {
    // A row of outputs at a time, window element by window element in row-major order: each
    // output keeps the first element of its window, then any larger one or the first NaN (so
    // ties go to the first). The outputs of a row are independent, so this vectorizes.
    std::vector<float> best(static_cast<size_t>(WO));
    std::vector<int32_t> at(static_cast<size_t>(WO));
    std::vector<float> wide(std::is_same_v<T, float> ? 0 : static_cast<size_t>(H * W));
#pragma omp for schedule(static)
    for (int64_t p = 0; p < planes; ++p) {
      const float* xp = plane_f32(x, p, H * W, wide);
      for (int64_t ho = 0; ho < HO; ++ho) {
        const int64_t h0 = ho * sh - ph;
        const int64_t hs = std::max<int64_t>(h0, 0), he = std::min(h0 + kh, H);
        for (int64_t wo = 0; wo < WO; ++wo) {
          const int64_t ws = std::max<int64_t>(wo * sw - pw, 0);
          const bool any = hs < he && ws < std::min(wo * sw - pw + kw, W);
          at[wo] = any ? static_cast<int32_t>(hs * W + ws) : -1;
          best[wo] = any ? xp[at[wo]] : 0.0f;
        }
        for (int64_t h = hs; h < he; ++h)
          for (int64_t kx = 0; kx < kw; ++kx) {
            // Outputs whose column w = wo * sw - pw + kx lies in [0, W).
            const int64_t off = kx - pw;
            const int64_t lo = off >= 0 ? 0 : (-off + sw - 1) / sw;
            const int64_t hi = std::min(WO, W - off > 0 ? (W - off - 1) / sw + 1 : 0);
            const float* xrow = xp + h * W;
            const int32_t base = static_cast<int32_t>(h * W);
            if (sw == 2)
              pool_row<2>(xrow, lo, hi, sw, off, base, best.data(), at.data());
            else if (sw == 1)
              pool_row<1>(xrow, lo, hi, sw, off, base, best.data(), at.data());
            else
              pool_row<0>(xrow, lo, hi, sw, off, base, best.data(), at.data());
          }
        const int64_t o = (p * HO + ho) * WO;
        if (values)
          for (int64_t wo = 0; wo < WO; ++wo) values[o + wo] = from_float<T>(best[wo]);
        if (indices) std::copy(at.begin(), at.end(), indices + o);
      }
    }
  }
}

// Every index a max pooling gradient scatters through must lie in its plane of `plane` values.
void check_pool_indices(const int64_t* indices, int64_t count, int64_t plane) {
  for (int64_t i = 0; i < count; ++i)
    if (indices[i] < 0 || indices[i] >= plane)
      throw BackendError(util::cat("max_pool2d_backward: index ", indices[i],
                                   " out of range for a plane of ", plane, " elements"));
}

// A bf16 gradient is summed in f32 (a plane's worth per thread) and rounded once.
template <typename T>
void max_pool2d_backward_plain(const T* gy, const int64_t* indices, const Shape& gy_shape,
                               const Shape& in, T* gx) {
  const int64_t planes = in[0] * in[1], HW = in[2] * in[3];
  const int64_t OHW = gy_shape[2] * gy_shape[3];
  check_pool_indices(indices, planes * OHW, HW);  // first: no throwing inside OpenMP
#pragma omp parallel
  {
    std::vector<float> acc(std::is_same_v<T, float> ? 0 : static_cast<size_t>(HW));
#pragma omp for schedule(static)
    for (int64_t p = 0; p < planes; ++p) {
      float* g = std::is_same_v<T, float> ? reinterpret_cast<float*>(gx + p * HW) : acc.data();
      std::fill(g, g + HW, 0.0f);
      for (int64_t o = 0; o < OHW; ++o) {
        const int64_t at = indices[p * OHW + o];
        g[at] += as_float(gy[p * OHW + o]);
      }
      if constexpr (!std::is_same_v<T, float>)
        f32_to_bf16(g, HW, reinterpret_cast<uint16_t*>(gx + p * HW));
    }
  }
}

}  // namespace

void max_pool2d_f32(const float* x, const Shape& in, const Shape& out,
                    const std::vector<int64_t>& a, float* values, int64_t* indices) {
  max_pool2d_plain(x, in, out, a, values, indices);
}
void max_pool2d_bf16(const uint16_t* x, const Shape& in, const Shape& out,
                     const std::vector<int64_t>& a, uint16_t* values, int64_t* indices) {
  max_pool2d_plain(x, in, out, a, values, indices);
}
void max_pool2d_backward_f32(const float* gy, const int64_t* indices, const Shape& gy_shape,
                             const Shape& in, float* gx) {
  max_pool2d_backward_plain(gy, indices, gy_shape, in, gx);
}
void max_pool2d_backward_bf16(const uint16_t* gy, const int64_t* indices, const Shape& gy_shape,
                              const Shape& in, uint16_t* gx) {
  max_pool2d_backward_plain(gy, indices, gy_shape, in, gx);
}

namespace {

// One output of a blocked max pooling: the window [hs, he) x [ws, we) of a block's plane (16
// channels per pixel), row-major, keeping the first element, then any larger one or the first
// NaN, as the plain kernel does per channel. The 16 channels are one vector: `omp simd` makes
// GCC vectorize the 16-lane loops rather than unroll them into scalars.
template <typename T>
LOCKSTEP_TARGET_CLONES void pool_window_blocked(const T* __restrict xp, int64_t W, int64_t hs,
                                                int64_t he, int64_t ws, int64_t we,
                                                T* __restrict value, int64_t* __restrict index) {
  alignas(64) float best[kBlock];
  alignas(64) int32_t at[kBlock];
  const int32_t first = static_cast<int32_t>(hs * W + ws);
#pragma omp simd
  for (int64_t q = 0; q < kBlock; ++q) {
    best[q] = as_float(xp[first * kBlock + q]);
    at[q] = first;
  }
  for (int64_t h = hs; h < he; ++h)
    for (int64_t w = h == hs ? ws + 1 : ws; w < we; ++w) {
      const int32_t i = static_cast<int32_t>(h * W + w);
      const T* v = xp + i * kBlock;
#pragma omp simd
      for (int64_t q = 0; q < kBlock; ++q) {
        const float x = as_float(v[q]);
        const bool take = (x > best[q]) | ((x != x) & (best[q] == best[q]));
        best[q] = take ? x : best[q];
        at[q] = take ? i : at[q];
      }
    }
  if (value) {
#pragma omp simd
    for (int64_t q = 0; q < kBlock; ++q) value[q] = from_float<T>(best[q]);
  }
  if (index) {
#pragma omp simd
    for (int64_t q = 0; q < kBlock; ++q) index[q] = at[q];
  }
}

template <typename T>
void max_pool2d_blocked_any(const T* x, const Shape& in, const Shape& out,
                            const std::vector<int64_t>& a, T* values, int64_t* indices) {
  const int64_t blocks = in[0] * (in[1] / kBlock), H = in[2], W = in[3], HO = out[2], WO = out[3];
  const ir::PoolAttrs pool = ir::PoolAttrs::of(a);
  const int64_t kh = pool.kernel[0], kw = pool.kernel[1], sh = pool.stride[0], sw = pool.stride[1],
                ph = pool.padding[0], pw = pool.padding[1];
  if (H * W > INT32_MAX) {  // indices kept as int32 below
    throw BackendError(util::cat("max_pool2d: a plane of ", H * W, " elements is too large"));
  }
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const T* xp = x + b * H * W * kBlock;
    for (int64_t ho = 0; ho < HO; ++ho) {
      const int64_t h0 = ho * sh - ph;
      const int64_t hs = std::max<int64_t>(h0, 0), he = std::min(h0 + kh, H);
      for (int64_t wo = 0; wo < WO; ++wo) {
        const int64_t w0 = wo * sw - pw;
        const int64_t ws = std::max<int64_t>(w0, 0), we = std::min(w0 + kw, W);
        const int64_t o = ((b * HO + ho) * WO + wo) * kBlock;
        T* value = values ? values + o : nullptr;
        int64_t* index = indices ? indices + o : nullptr;
        if (hs < he && ws < we) {
          pool_window_blocked(xp, W, hs, he, ws, we, value, index);
        } else {  // a window of padding only (as the plain kernel: 0 and index -1)
          for (int64_t q = 0; q < kBlock; ++q) {
            if (value) value[q] = from_float<T>(0.0f);
            if (index) index[q] = -1;
          }
        }
      }
    }
  }
}

template <typename T>
void max_pool2d_backward_blocked_any(const T* gy, const int64_t* indices, const Shape& gy_shape,
                                     const Shape& in, T* gx) {
  const int64_t blocks = in[0] * (in[1] / kBlock), HW = in[2] * in[3];
  const int64_t OHW = gy_shape[2] * gy_shape[3];
  check_pool_indices(indices, blocks * OHW * kBlock, HW);  // first: no throwing inside OpenMP
#pragma omp parallel
  {
    std::vector<float> acc(std::is_same_v<T, float> ? 0 : static_cast<size_t>(HW * kBlock));
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      float* g =
          std::is_same_v<T, float> ? reinterpret_cast<float*>(gx + b * HW * kBlock) : acc.data();
      std::fill(g, g + HW * kBlock, 0.0f);
      const T* gyb = gy + b * OHW * kBlock;
      const int64_t* ib = indices + b * OHW * kBlock;
      // Per channel in output order, as the plain kernel adds them.
      for (int64_t o = 0; o < OHW; ++o)
        for (int64_t q = 0; q < kBlock; ++q)
          g[ib[o * kBlock + q] * kBlock + q] += as_float(gyb[o * kBlock + q]);
      if constexpr (!std::is_same_v<T, float>)
        f32_to_bf16(g, HW * kBlock, reinterpret_cast<uint16_t*>(gx + b * HW * kBlock));
    }
  }
}

}  // namespace

void max_pool2d_blocked_f32(const float* x, const Shape& in, const Shape& out,
                            const std::vector<int64_t>& a, float* values, int64_t* indices) {
  max_pool2d_blocked_any(x, in, out, a, values, indices);
}
void max_pool2d_blocked_bf16(const uint16_t* x, const Shape& in, const Shape& out,
                             const std::vector<int64_t>& a, uint16_t* values, int64_t* indices) {
  max_pool2d_blocked_any(x, in, out, a, values, indices);
}
void max_pool2d_backward_blocked_f32(const float* gy, const int64_t* indices, const Shape& gy_shape,
                                     const Shape& in, float* gx) {
  max_pool2d_backward_blocked_any(gy, indices, gy_shape, in, gx);
}
void max_pool2d_backward_blocked_bf16(const uint16_t* gy, const int64_t* indices,
                                      const Shape& gy_shape, const Shape& in, uint16_t* gx) {
  max_pool2d_backward_blocked_any(gy, indices, gy_shape, in, gx);
}

}  // namespace lockstep::backends::cpu
