// The cpu backend's own f32 kernels besides fused elementwise trees: reductions, pooling and
// strided copies, parallel over OpenMP threads.
#pragma once

#include <omp.h>

// Kernels compiled for AVX-512, AVX2 and baseline x86-64, picked at load time by an ifunc
// resolver. Under ThreadSanitizer the resolver would run instrumented before the sanitizer's
// runtime is up (and crash), so that build has the baseline only; so has the fuzz build
// (LOCKSTEP_NO_TARGET_CLONES: clang 16 leaves template instantiations used in clones undefined).
#if defined(__SANITIZE_THREAD__) || defined(LOCKSTEP_NO_TARGET_CLONES)
#define LOCKSTEP_TARGET_CLONES
#else
#define LOCKSTEP_TARGET_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif

#include <algorithm>
#include <bit>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "backends/cpu/parallel.h"
#include "ir/ir.h"

namespace lockstep::backends::cpu {

// Passes over fewer elements run on one thread: waking the others costs more than they save.
// (ResNet-50's steps under 131,072 values, batch norm's over 256 channels of 4x4 maps and the
// like, took 0.3-2.9 ms a step less with this threshold than with 131,072, in five pairs of runs.)
constexpr int64_t kParallelMin = 32768;

// Channels per block of oneDNN's blocked activation layout nChw16c, [N][C / 16][H][W][16] (see
// blockable() in fused.h).
constexpr int64_t kBlock = 16;

// Floats per tile of the fused passes and the sums that read them (FusedTree::eval fills one
// tile per call, so both must agree).
constexpr int64_t kTile = 512;

// How a reduction walks its input: output elements over the kept dims (parallel), each a walk
// over the reduced dims in runs of `inner` contiguous elements.
struct ReduceLayout {
  std::vector<int64_t> kdim, kstride, rdim, rstride;
  int64_t outer = 1, groups = 1, inner = 1;
};
ReduceLayout reduce_layout(const Shape& in, const std::vector<int64_t>& attrs);

// bf16 runs: widened to f32 (exact), f32 rounded to the nearest bf16 (ties to even, NaN kept a
// quiet NaN) as ls::bfloat16 does, in place or into bf16.
void bf16_to_f32(const uint16_t* src, int64_t n, float* dst);
// A [rows x cols] bf16 matrix, its rows ld apart, widened into a dense f32 one.
void bf16_rows_to_f32(const uint16_t* src, int64_t rows, int64_t cols, int64_t ld, float* dst);
void round_to_bf16(float* y, int64_t n);
void round_to_bf16(const float* x, int64_t n, float* y);  // y may be x
void f32_to_bf16(const float* src, int64_t n, uint16_t* dst);
// Floats that are bf16 values already (rounded, or exact) stored as bf16: their top halves.
void exact_to_bf16(const float* src, int64_t n, uint16_t* dst);
inline float bf16_value(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}
// The bits of a float that is a bf16 value already (its top half; no rounding).
inline uint16_t exact_bf16_bits(float v) {
  return static_cast<uint16_t>(std::bit_cast<uint32_t>(v) >> 16);
}

// Buffers one run of a kernel needs (a fused tree's expanded leaves), taken from its thread's
// pool and given back when the RunBuffers ends: kept from run to run, so a step's kernels neither
// allocate nor fault in fresh pages each time they run (a 1 MiB expansion allocated per run cost
// a small GPT's bf16 step a third of its time in page faults). Uninitialized; nest as a stack.
class RunBuffers {
 public:
  RunBuffers();
  ~RunBuffers();
  RunBuffers(const RunBuffers&) = delete;
  RunBuffers& operator=(const RunBuffers&) = delete;
  // n floats, valid until this RunBuffers ends.
  float* take(int64_t n);

 private:
  size_t base_;
};

// Sum, Max or Min over a layout. read(offset, len, tmp, again) returns a pointer to the input
// values [offset, offset + len) (len <= 512), possibly computing them into tmp (tmp_floats, at
// least 512); `again`: this thread read into the same tmp before (what a fused tree keeps there
// from call to call, its one-value leaves' tiles, is still there).
template <typename Read>
void reduce_f32(ir::Op op, const ReduceLayout& l, Read&& read, float* out, size_t tmp_floats);

// Sum, max and min of a run of n floats, vectorized (independent partial sums in lanes, so the
// result is deterministic but not the sequential left-to-right sum). max/min set *nan when the
// run holds a NaN.
float sum_run_f32(const float* p, int64_t n);
// acc[i] += p[i] for i < n, in double, vectorized.
void add_widened(const float* p, int64_t n, double* acc);
// part[q] += p[j * stride + q] for j < n, q < kBlock: the channels of a blocked (nChw16c) run
// (stride kBlock), or 16 of the columns of rows `stride` long; one vector of 16 lanes.
void add_blocks(const float* p, int64_t n, int64_t stride, float* part);
float max_run_f32(const float* p, int64_t n, bool* nan);
float min_run_f32(const float* p, int64_t n, bool* nan);
// out[r] = the sum, max or min (op) of p[r * len, (r + 1) * len) for r < rows, each as
// sum_run_f32, max_run_f32 or min_run_f32 gives it (a NaN in a row: NaN for max and min), in one
// call: rows of 64 cost a call each otherwise.
void reduce_rows_f32(ir::Op op, const float* p, int64_t rows, int64_t len, float* out);

// Index maps of the form sum_d ((i / div[d]) % mod[d]) * step[d] (broadcast reads, reduction
// outputs) with neighbouring dims merged where one continues the other (div[d + 1] = div[d] *
// mod[d] and step[d + 1] = step[d] * mod[d]): [N, C] of [N, C, H, W] is one dim.
void merge_dims(std::vector<int64_t>& div, std::vector<int64_t>& mod, std::vector<int64_t>& step);

// Where each input element of a reduction goes: output (i) = sum over the kept dims of
// (i / div) % mod * mul; `run` consecutive elements (the trailing reduced dims) share one.
struct ReduceMap {
  std::vector<int64_t> div, mod, mul;
  int64_t run = 1, numel = 0, out_size = 1;
};
ReduceMap reduce_map(const Shape& in, const std::vector<int64_t>& attrs);

// Sums by tiles of the flattened input (good when the runs are short, e.g. per-channel sums of
// small feature maps): each source is read through read(k, offset, len, tmp, again) (len <= 512;
// tmp and again as for reduce_f32, per source) in whole tiles, and the tile's runs are added to
// their outputs; per-thread partial sums are combined in thread order, so results do not depend on
// timing.
template <typename Read>
void sum_tiles_f32(const ReduceMap& m, size_t sources, Read&& read, const std::vector<float*>& out,
                   size_t tmp_floats);

// Several sums over the same layout in one walk (the batch norm backward's two per-channel
// sums read the same values): read(k, offset, len, tmp, again) gives source k's values; out[k] its
// sums.
template <typename Read>
void sum_multi_f32(const ReduceLayout& l, size_t sources, Read&& read,
                   const std::vector<float*>& out, size_t tmp_floats);

// A reduction over a block of axes followed by kept ones (a bias gradient's [B T, C] -> [C]),
// viewed as [A, R, K] -> [A, K] (K contiguous kept elements innermost): combined by whole rows
// of K at a time, so the loads stay contiguous and vectorize.
struct ColumnReduction {
  int64_t a = 1, r = 1, k = 1;
};
// The column view of a reduction of `in` over the axes in attrs ([keepdim, axes...]), where it
// has one worth it (at least 16 columns and 2 rows); nullopt otherwise. Decided at lowering.
std::optional<ColumnReduction> column_reduction(const Shape& in, const std::vector<int64_t>& attrs);
// The sum of bf16 x by columns into f32 out.
void sum_columns_bf16(const uint16_t* x, const ColumnReduction& c, float* out);
// Sum, Max or Min of f32 x by columns.
void reduce_columns_f32(ir::Op op, const float* x, const ColumnReduction& c, float* out);

// Sum, Max or Min of x (shape `in`) over the axes in attrs ([keepdim, axes...]), any layout.
void reduce_f32(ir::Op op, const float* x, const Shape& in, const std::vector<int64_t>& attrs,
                float* out);

// out (contiguous, shape `out_shape`) from src read at src_offset + sum(idx[d] * strides[d]).
void strided_copy_4(const void* src, const Shape& out_shape, const std::vector<int64_t>& strides,
                    int64_t src_offset, void* out);
// The same for 2-byte elements (bf16).
void strided_copy_2(const void* src, const Shape& out_shape, const std::vector<int64_t>& strides,
                    int64_t src_offset, void* out);
// The same for elements of `elem` bytes (1, 2, 4 or 8).
void strided_copy(size_t elem, const void* src, const Shape& out_shape,
                  const std::vector<int64_t>& strides, int64_t src_offset, void* out);
// The strides that read a contiguous `in` as its broadcast to `out` (Expand: dims aligned at the
// right, 0 where a dim is new or stretched from 1).
std::vector<int64_t> expand_strides(const Shape& in, const Shape& out);

// attrs as ir::Node's pooling attrs. Indices (if not null) are into each input plane's H*W.
void max_pool2d_f32(const float* x, const Shape& in, const Shape& out,
                    const std::vector<int64_t>& attrs, float* values, int64_t* indices);
void max_pool2d_backward_f32(const float* gy, const int64_t* indices, const Shape& gy_shape,
                             const Shape& in, float* gx);
// The same on bf16 (bits): maxima compared as floats, the gradient summed in f32, rounded once.
void max_pool2d_bf16(const uint16_t* x, const Shape& in, const Shape& out,
                     const std::vector<int64_t>& attrs, uint16_t* values, int64_t* indices);
void max_pool2d_backward_bf16(const uint16_t* gy, const int64_t* indices, const Shape& gy_shape,
                              const Shape& in, uint16_t* gx);
// The same two on values held in the blocked nChw16c layout (C a multiple of 16): x, values, gy
// and gx as [N][C/16][H][W][16], and the indices in that order too (each still an index into
// its plane's H*W, as PyTorch's). Every output equals the plain kernels' bit for bit.
void max_pool2d_blocked_f32(const float* x, const Shape& in, const Shape& out,
                            const std::vector<int64_t>& attrs, float* values, int64_t* indices);
void max_pool2d_backward_blocked_f32(const float* gy, const int64_t* indices, const Shape& gy_shape,
                                     const Shape& in, float* gx);
void max_pool2d_blocked_bf16(const uint16_t* x, const Shape& in, const Shape& out,
                             const std::vector<int64_t>& attrs, uint16_t* values, int64_t* indices);
void max_pool2d_backward_blocked_bf16(const uint16_t* gy, const int64_t* indices,
                                      const Shape& gy_shape, const Shape& in, uint16_t* gx);

// Walking a layout: the offset of output o's first run, and the step from one group of runs to
// the next (idx counts through the reduced dims).
inline int64_t first_run(const ReduceLayout& l, int64_t o) {
  int64_t off = 0;
  for (size_t d = l.kdim.size(); d-- > 0;) {
    off += o % l.kdim[d] * l.kstride[d];
    o /= l.kdim[d];
  }
  return off;
}
inline void next_group(const ReduceLayout& l, std::vector<int64_t>& idx, int64_t& off) {
  for (size_t d = l.rdim.size(); d-- > 0;) {
    off += l.rstride[d];
    if (++idx[d] < l.rdim[d]) break;
    off -= l.rstride[d] * l.rdim[d];
    idx[d] = 0;
  }
}

// A reduction thread's scratch for its sources' reads: source k's tmp (tmp_floats, at least a
// tile), and whether the thread read source k into it before (see reduce_f32).
class ReadScratch {
 public:
  ReadScratch(size_t sources, size_t tmp_floats)
      : stride_(std::max<size_t>(tmp_floats, kTile)), buf_(sources * stride_), used_(sources) {}
  float* tmp(size_t k) { return buf_.data() + k * stride_; }
  bool again(size_t k) { return std::exchange(used_[k], char{1}) != 0; }

 private:
  size_t stride_;
  std::vector<float> buf_;
  std::vector<char> used_;  // (not vector<bool>, whose elements are no references)
};

// Whether each output's input is one contiguous run and the runs lie end to end (output o's at
// o * inner): a reduction over trailing axes, as a softmax's or a layer norm's rows.
inline bool rows_end_to_end(const ReduceLayout& l) {
  if (l.groups != 1) return false;
  int64_t span = l.inner;
  for (size_t d = l.kdim.size(); d-- > 0;) {
    if (l.kstride[d] != span) return false;
    span *= l.kdim[d];
  }
  return true;
}
// Short rows end to end are read a tile of whole rows at a time (a fused tree's evaluation costs
// about as much per call as per element on rows of 64) and reduced row by row:
// tile(o0, rows, scratch) reduces outputs [o0, o0 + rows), whose inputs are the rows * l.inner
// values from o0 * l.inner (at most kTile), reading them through `scratch`, its thread's (one
// source, tmp_floats). Returns false, doing nothing, for other layouts.
template <typename Tile>
bool reduce_short_rows(const ReduceLayout& l, size_t tmp_floats, Tile&& tile) {
  if (!rows_end_to_end(l) || l.inner < 1 || l.inner * 2 > kTile) return false;
  const int64_t per_tile = kTile / l.inner;
  const int64_t tiles = (l.outer + per_tile - 1) / per_tile;
  parallel_region(tiles > 1 && l.outer * l.inner > 32768, [&] {
    ReadScratch scratch(1, tmp_floats);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tiles; ++t)
      tile(t * per_tile, std::min(per_tile, l.outer - t * per_tile), scratch);
  });
  return true;
}

template <typename Read>
void reduce_f32(ir::Op op, const ReduceLayout& l, Read&& read, float* out, size_t tmp_floats) {
  if (op == ir::Op::Sum) {
    sum_multi_f32(
        l, 1,
        [&](size_t, int64_t off, int64_t len, float* tmp, bool again) {
          return read(off, len, tmp, again);
        },
        {out}, tmp_floats);
    return;
  }
  const bool is_max = op == ir::Op::Max;
  if (reduce_short_rows(l, tmp_floats, [&](int64_t o0, int64_t rows, ReadScratch& scratch) {
        const float* p = read(o0 * l.inner, rows * l.inner, scratch.tmp(0), scratch.again(0));
        reduce_rows_f32(op, p, rows, l.inner, out + o0);
      }))
    return;
  parallel_region(l.outer > 1 && l.outer * l.groups * l.inner > 32768, [&] {
    ReadScratch scratch(1, tmp_floats);
    std::vector<int64_t> idx(l.rdim.size());
#pragma omp for schedule(static)
    for (int64_t o = 0; o < l.outer; ++o) {
      int64_t off = first_run(l, o);
      float best = is_max ? -__builtin_inff() : __builtin_inff();
      bool nan = false;
      std::fill(idx.begin(), idx.end(), 0);
      for (int64_t g = 0; g < l.groups; ++g) {
        for (int64_t c = 0; c < l.inner; c += 512) {
          const int64_t len = std::min<int64_t>(512, l.inner - c);
          const float* p = read(off + c, len, scratch.tmp(0), scratch.again(0));
          const float b = is_max ? max_run_f32(p, len, &nan) : min_run_f32(p, len, &nan);
          best = is_max ? (b > best ? b : best) : (b < best ? b : best);
        }
        next_group(l, idx, off);
      }
      out[o] = nan ? __builtin_nanf("") : best;
    }
  });
}

template <typename Read>
void sum_tiles_f32(const ReduceMap& m, size_t sources, Read&& read, const std::vector<float*>& out,
                   size_t tmp_floats) {
  const int64_t tiles = (m.numel + kTile - 1) / kTile;
  const int threads = m.numel >= kParallelMin ? omp_get_max_threads() : 1;
  const size_t per_thread = sources * static_cast<size_t>(m.out_size);
  std::vector<double> acc(static_cast<size_t>(threads) * per_thread, 0.0);
  parallel_region(threads > 1, [&] {
    ReadScratch scratch(sources, tmp_floats);
    double* a = acc.data() + static_cast<size_t>(omp_get_thread_num()) * per_thread;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t i0 = t * kTile, len = std::min(kTile, m.numel - i0);
      for (size_t k = 0; k < sources; ++k) {
        const float* p = read(k, i0, len, scratch.tmp(k), scratch.again(k));
        double* ak = a + k * static_cast<size_t>(m.out_size);
        if (m.run == 1 && m.div.size() == 2 && m.div[0] == 1 && m.mod[0] == kBlock &&
            m.mul[0] == 1 && m.mul[1] == kBlock && m.div[1] % kBlock == 0 && i0 % kBlock == 0 &&
            len % kBlock == 0) {
          // Per-channel sums of a blocked (nChw16c) value: each 16 consecutive values go to the
          // 16 channels of their block, counted along without divisions.
          // A block's values are added up in floats along the tile, as runs are.
          const int64_t span = m.div[1], blocks = m.mod[1];
          int64_t b = i0 / span % blocks, left = span - i0 % span;
          for (int64_t j = 0; j < len;) {
            const int64_t n = std::min(left, len - j);  // this tile's values of block b
            alignas(64) float part[kBlock] = {};
            add_blocks(p + j, n / kBlock, kBlock, part);
            double* o = ak + b * kBlock;
            for (int q = 0; q < kBlock; ++q) o[q] += part[q];
            j += n;
            left -= n;
            if (left == 0) {
              left = span;
              if (++b == blocks) b = 0;
            }
          }
          continue;
        }
        if (const int64_t period = m.mod.size() == 1 ? m.mod[0] : 0;
            period > 0 && m.run == 1 && m.div[0] == 1 && m.mul[0] == 1 && period % kBlock == 0 &&
            kTile % period == 0 && len % period == 0) {
          // Sums over leading axes into outputs that a tile holds whole rows of (a channel sum
          // of a blocked value with one block, a bias's gradient over [N, 256]): each 16 of the
          // columns added up in floats down the tile's rows, as a block's values are above,
          // then once into the doubles (not a call per row of 16 values).
          for (int64_t q = 0; q < period; q += kBlock) {
            alignas(64) float part[kBlock] = {};
            add_blocks(p + q, len / period, period, part);
            for (int64_t c = 0; c < kBlock; ++c) ak[q + c] += part[c];
          }
          continue;
        }
        if (m.run == 1 && !m.div.empty() && m.div[0] == 1 && m.mul[0] == 1) {
          // Sums over leading axes (a bias's gradient, [N, T, C] -> [C]): the innermost kept
          // dim is the input's last, so consecutive values go to consecutive outputs, a
          // segment at a time (the other kept dims' part of the output index once per segment).
          for (int64_t j = 0; j < len;) {
            const int64_t pos = i0 + j, c0 = pos % m.mod[0];
            int64_t o = c0;
            for (size_t d = 1; d < m.div.size(); ++d) o += pos / m.div[d] % m.mod[d] * m.mul[d];
            const int64_t n = std::min(len - j, m.mod[0] - c0);
            add_widened(p + j, n, ak + o);
            j += n;
          }
          continue;
        }
        if (m.div.size() == 1 && m.div[0] == m.run) {
          // One kept dim right above the runs (per-channel sums of a feature map): consecutive
          // runs go to consecutive outputs, counted along without divisions; short runs are
          // added inline.
          int64_t o = i0 / m.div[0] % m.mod[0], left = m.run - i0 % m.run;
          for (int64_t j = 0; j < len;) {
            const int64_t n = std::min(len - j, left);
            float s = 0;
            if (n < 16)
              for (int64_t q = 0; q < n; ++q) s += p[j + q];
            else
              s = sum_run_f32(p + j, n);
            ak[o] += s;
            j += n;
            left = m.run;
            if (++o == m.mod[0]) o = 0;
          }
          continue;
        }
        for (int64_t j = 0; j < len;) {
          const int64_t pos = i0 + j;
          int64_t o = 0;
          for (size_t d = 0; d < m.div.size(); ++d) o += pos / m.div[d] % m.mod[d] * m.mul[d];
          const int64_t n = std::min(len - j, m.run - pos % m.run);
          ak[o] += sum_run_f32(p + j, n);
          j += n;
        }
      }
    }
  });
  for (size_t k = 0; k < sources; ++k)
    for (int64_t o = 0; o < m.out_size; ++o) {
      double s = 0;
      for (int t = 0; t < threads; ++t)
        s += acc[static_cast<size_t>(t) * per_thread + k * static_cast<size_t>(m.out_size) + o];
      out[k][o] = static_cast<float>(s);
    }
}

template <typename Read>
void sum_multi_f32(const ReduceLayout& l, size_t sources, Read&& read,
                   const std::vector<float*>& out, size_t tmp_floats) {
  parallel_region(l.outer > 1 && l.outer * l.groups * l.inner > 32768, [&] {
    ReadScratch scratch(sources, tmp_floats);
    std::vector<int64_t> idx(l.rdim.size());
    std::vector<double> sum(sources);
#pragma omp for schedule(static)
    for (int64_t o = 0; o < l.outer; ++o) {
      int64_t off = first_run(l, o);
      std::fill(sum.begin(), sum.end(), 0.0);
      std::fill(idx.begin(), idx.end(), 0);
      for (int64_t g = 0; g < l.groups; ++g) {
        for (int64_t c = 0; c < l.inner; c += 512) {
          const int64_t len = std::min<int64_t>(512, l.inner - c);
          for (size_t k = 0; k < sources; ++k)
            sum[k] += sum_run_f32(read(k, off + c, len, scratch.tmp(k), scratch.again(k)), len);
        }
        next_group(l, idx, off);
      }
      for (size_t k = 0; k < sources; ++k) out[k][o] = static_cast<float>(sum[k]);
    }
  });
}

}  // namespace lockstep::backends::cpu
