// The cpu backend's own f32 kernels besides fused elementwise trees: reductions, pooling and
// strided copies, parallel over OpenMP threads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "ir/ir.h"

namespace lockstep::backends::cpu {

// How a reduction walks its input: output elements over the kept dims (parallel), each a walk
// over the reduced dims in runs of `inner` contiguous elements.
struct ReduceLayout {
  std::vector<int64_t> kdim, kstride, rdim, rstride;
  int64_t outer = 1, groups = 1, inner = 1;
};
ReduceLayout reduce_layout(const Shape& in, const std::vector<int64_t>& attrs);

// Sum, Max or Min over a layout. read(offset, len, tmp) returns a pointer to the input values
// [offset, offset + len) (len <= 512), possibly computing them into tmp (512 floats).
template <typename Read>
void reduce_f32(ir::Op op, const ReduceLayout& l, Read&& read, float* out, size_t tmp_floats);

// Sum, max and min of a run of n floats, vectorized (independent partial sums in lanes, so the
// result is deterministic but not the sequential left-to-right sum). max/min set *nan when the
// run holds a NaN.
float sum_run_f32(const float* p, int64_t n);
float max_run_f32(const float* p, int64_t n, bool* nan);
float min_run_f32(const float* p, int64_t n, bool* nan);

// Several sums over the same layout in one walk (the batch norm backward's two per-channel
// sums read the same values): read(k, offset, len, tmp) gives source k's values; out[k] its sums.
template <typename Read>
void sum_multi_f32(const ReduceLayout& l, size_t sources, Read&& read,
                   const std::vector<float*>& out, size_t tmp_floats);

// Sum, Max or Min of x (shape `in`) over the axes in attrs ([keepdim, axes...]).
void reduce_f32(ir::Op op, const float* x, const Shape& in, const std::vector<int64_t>& attrs,
                float* out);

// out (contiguous, shape `out_shape`) from src read at src_offset + sum(idx[d] * strides[d]).
void strided_copy_4(const void* src, const Shape& out_shape, const std::vector<int64_t>& strides,
                    int64_t src_offset, void* out);

// attrs as ir::Node's pooling attrs. Indices (if not null) are into each input plane's H*W.
void max_pool2d_f32(const float* x, const Shape& in, const Shape& out,
                    const std::vector<int64_t>& attrs, float* values, int64_t* indices);
void max_pool2d_backward_f32(const float* gy, const int64_t* indices, const Shape& gy_shape,
                             const Shape& in, float* gx);

template <typename Read>
void reduce_f32(ir::Op op, const ReduceLayout& l, Read&& read, float* out, size_t tmp_floats) {
  const bool is_sum = op == ir::Op::Sum, is_max = op == ir::Op::Max;
#pragma omp parallel if (l.outer > 1 && l.outer * l.groups * l.inner > 32768)
  {
    std::vector<float> tmp(tmp_floats);
    std::vector<int64_t> idx(l.rdim.size());
#pragma omp for schedule(static)
    for (int64_t o = 0; o < l.outer; ++o) {
      int64_t off = 0, rest = o;
      for (size_t d = l.kdim.size(); d-- > 0;) {
        off += rest % l.kdim[d] * l.kstride[d];
        rest /= l.kdim[d];
      }
      double sum = 0;
      float best = is_max ? -__builtin_inff() : __builtin_inff();
      bool nan = false;
      std::fill(idx.begin(), idx.end(), 0);
      for (int64_t g = 0; g < l.groups; ++g) {
        for (int64_t c = 0; c < l.inner; c += 512) {
          const int64_t len = std::min<int64_t>(512, l.inner - c);
          const float* p = read(off + c, len, tmp.data());
          if (is_sum) {
            sum += sum_run_f32(p, len);
          } else {
            const float b = is_max ? max_run_f32(p, len, &nan) : min_run_f32(p, len, &nan);
            best = is_max ? (b > best ? b : best) : (b < best ? b : best);
          }
        }
        for (size_t d = l.rdim.size(); d-- > 0;) {
          off += l.rstride[d];
          if (++idx[d] < l.rdim[d]) break;
          off -= l.rstride[d] * l.rdim[d];
          idx[d] = 0;
        }
      }
      out[o] = is_sum ? static_cast<float>(sum) : (nan ? __builtin_nanf("") : best);
    }
  }
}

template <typename Read>
void sum_multi_f32(const ReduceLayout& l, size_t sources, Read&& read,
                   const std::vector<float*>& out, size_t tmp_floats) {
#pragma omp parallel if (l.outer > 1 && l.outer * l.groups * l.inner > 32768)
  {
    std::vector<float> tmp(tmp_floats);
    std::vector<int64_t> idx(l.rdim.size());
    std::vector<double> sum(sources);
#pragma omp for schedule(static)
    for (int64_t o = 0; o < l.outer; ++o) {
      int64_t off = 0, rest = o;
      for (size_t d = l.kdim.size(); d-- > 0;) {
        off += rest % l.kdim[d] * l.kstride[d];
        rest /= l.kdim[d];
      }
      std::fill(sum.begin(), sum.end(), 0.0);
      std::fill(idx.begin(), idx.end(), 0);
      for (int64_t g = 0; g < l.groups; ++g) {
        for (int64_t c = 0; c < l.inner; c += 512) {
          const int64_t len = std::min<int64_t>(512, l.inner - c);
          for (size_t k = 0; k < sources; ++k)
            sum[k] += sum_run_f32(read(k, off + c, len, tmp.data()), len);
        }
        for (size_t d = l.rdim.size(); d-- > 0;) {
          off += l.rstride[d];
          if (++idx[d] < l.rdim[d]) break;
          off -= l.rstride[d] * l.rdim[d];
          idx[d] = 0;
        }
      }
      for (size_t k = 0; k < sources; ++k) out[k][o] = static_cast<float>(sum[k]);
    }
  }
}

}  // namespace lockstep::backends::cpu
