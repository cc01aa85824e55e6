// Reductions, pooling and strided copies on f32; see kernels.h.
#include "backends/cpu/kernels.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "ir/attrs.h"
#include "lockstep/error.h"
#include "util/check.h"

namespace lockstep::backends::cpu {

// The rounding is ls::bfloat16's (branch-free, so these loops vectorize).
LOCKSTEP_TARGET_CLONES void bf16_to_f32(const uint16_t* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_value(src[i]);
}
LOCKSTEP_TARGET_CLONES void round_to_bf16(const float* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_value(bfloat16(x[i]).bits);
}
void round_to_bf16(float* y, int64_t n) { round_to_bf16(y, n, y); }
LOCKSTEP_TARGET_CLONES void exact_to_bf16(const float* src, int64_t n, uint16_t* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = exact_bf16_bits(src[i]);
}
LOCKSTEP_TARGET_CLONES void f32_to_bf16(const float* src, int64_t n, uint16_t* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bfloat16(src[i]).bits;
}

namespace {
// A thread's buffers for RunBuffers: the first `used` are taken.
struct RunPool {
  struct Buffer {
    std::unique_ptr<float[]> floats;
    int64_t size = 0;
  };
  std::vector<Buffer> buffers;
  size_t used = 0;
};
RunPool& run_pool() {
  thread_local RunPool pool;
  return pool;
}
}  // namespace

RunBuffers::RunBuffers() : base_(run_pool().used) {}
RunBuffers::~RunBuffers() { run_pool().used = base_; }
float* RunBuffers::take(int64_t n) {
  RunPool& pool = run_pool();
  const size_t i = pool.used++;
  if (i == pool.buffers.size()) pool.buffers.emplace_back();
  RunPool::Buffer& b = pool.buffers[i];
  if (b.size < n) {
    b.floats = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(n));
    b.size = n;
  }
  return b.floats.get();
}

ReduceLayout reduce_layout(const Shape& in, const std::vector<int64_t>& attrs) {
  const size_t r = in.size();
  std::vector<bool> reduced(r, false);
  for (size_t i = 1; i < attrs.size(); ++i) reduced[attrs[i]] = true;
  std::vector<int64_t> stride(r);
  int64_t acc = 1;
  for (size_t d = r; d-- > 0;) {
    stride[d] = acc;
    acc *= in[d];
  }
  ReduceLayout l;
  for (size_t d = 0; d < r; ++d) {
    if (in[d] == 1) continue;
    (reduced[d] ? l.rdim : l.kdim).push_back(in[d]);
    (reduced[d] ? l.rstride : l.kstride).push_back(stride[d]);
  }
  for (int64_t d : l.kdim) l.outer *= d;
  int64_t block = 1;
  for (int64_t d : l.rdim) block *= d;
  // The innermost reduced dim, if contiguous, is walked as runs; merge contiguous outer dims.
  if (!l.rstride.empty() && l.rstride.back() == 1) {
    l.inner = l.rdim.back();
    l.rdim.pop_back();
    l.rstride.pop_back();
    while (!l.rstride.empty() && l.rstride.back() == l.inner) {
      l.inner *= l.rdim.back();
      l.rdim.pop_back();
      l.rstride.pop_back();
    }
  }
  l.groups = l.inner ? block / l.inner : 0;
  return l;
}

namespace {

// acc[j] += rows[i * stride + j] over i < n, j < len: the sums of reduce_columns, in double.
// Compiled for each instruction set (the widening to double is most of the work: baseline SSE2
// ran a [4096, 1024] column sum at a third of AVX2's speed).
LOCKSTEP_TARGET_CLONES void add_rows_f64(const float* rows, int64_t n, int64_t stride, int64_t len,
                                         double* acc) {
  for (int64_t i = 0; i < n; ++i) {
    const float* row = rows + i * stride;
    for (int64_t j = 0; j < len; ++j) acc[j] += row[j];
  }
}

// Reductions over a block of dims followed by kept ones: x viewed as [A, R, K] (K contiguous
// kept elements innermost), out [A, K]. Whole rows of K are combined at a time, so the loads
// stay contiguous and vectorize (the generic walk would visit one element per run). Rows are
// read in runs of up to 2048 values: shorter runs (1 KiB of each 4 KiB row) broke the
// hardware's prefetch streams and ran a bias gradient's [4096, 1024] -> [1024] sum at a third
// of the speed.
bool reduce_columns(ir::Op op, const float* x, const Shape& in, const std::vector<int64_t>& attrs,
                    float* out) {
  std::vector<bool> reduced(in.size(), false);
  for (size_t i = 1; i < attrs.size(); ++i) reduced[attrs[i]] = true;
  size_t d = in.size();
  int64_t k = 1, r = 1, a = 1;
  while (d > 0 && (!reduced[d - 1] || in[d - 1] == 1)) k *= in[--d];
  while (d > 0 && (reduced[d - 1] || in[d - 1] == 1)) r *= in[--d];
  while (d > 0) {
    if (reduced[d - 1] && in[d - 1] != 1) return false;
    a *= in[--d];
  }
  if (k < 16 || r < 2) return false;
  constexpr int64_t kChunk = 2048;
  const int64_t chunks = (k + kChunk - 1) / kChunk;
  // Few columns over many rows (a bias's gradient: [B T, C] -> [C]) would leave threads idle:
  // the rows are also cut into bands of a fixed height (so the values do not depend on the
  // thread count), each band combined on its own, then the bands in order.
  const int64_t band = std::max<int64_t>(64, kParallelMin / std::max<int64_t>(k, 1));
  const int64_t bands = a * chunks >= 8 ? 1 : (r + band - 1) / band;
  const int64_t rows = bands == 1 ? r : band;
  const bool is_sum = op == ir::Op::Sum, is_max = op == ir::Op::Max;
  // Per band and column: the partial sum, or the extreme and whether a NaN was seen.
  std::vector<double> part(bands == 1 ? 0 : static_cast<size_t>(a * bands * k));
  std::vector<char> part_bad(bands == 1 || is_sum ? 0 : static_cast<size_t>(a * bands * k));
  parallel_for(a * r * k > 32768, a * chunks * bands, [&](int64_t job) {
    const int64_t bi = job % bands, ci = job / bands % chunks, ai = job / bands / chunks;
    const int64_t k0 = ci * kChunk, len = std::min(kChunk, k - k0);
    const int64_t r0 = bi * rows, r1 = std::min(r, r0 + rows);
    const float* base = x + ai * r * k + k0;
    double* p = bands == 1 ? nullptr : part.data() + (ai * bands + bi) * k + k0;
    float* o = out + ai * k + k0;
    if (is_sum) {
      double acc[kChunk];
      std::fill(acc, acc + len, 0.0);
      add_rows_f64(base + r0 * k, r1 - r0, k, len, acc);
      for (int64_t j = 0; j < len; ++j) {
        if (p)
          p[j] = acc[j];
        else
          o[j] = static_cast<float>(acc[j]);
      }
    } else {
      float best[kChunk];
      int bad[kChunk] = {};
      std::copy(base + r0 * k, base + r0 * k + len, best);
      for (int64_t ri = r0; ri < r1; ++ri)
        for (int64_t j = 0; j < len; ++j) {
          const float v = base[ri * k + j];
          bad[j] |= v != v;
          best[j] = is_max ? (v > best[j] ? v : best[j]) : (v < best[j] ? v : best[j]);
        }
      for (int64_t j = 0; j < len; ++j) {
        if (p) {
          p[j] = best[j];
          part_bad[static_cast<size_t>(p - part.data()) + static_cast<size_t>(j)] = bad[j] != 0;
        } else {
          o[j] = bad[j] ? __builtin_nanf("") : best[j];
        }
      }
    }
  });
  if (bands == 1) return true;
  if (is_sum) {  // band by band, each column's bands in order (rows of `part` read whole)
    std::vector<double> acc(static_cast<size_t>(k));
    for (int64_t ai = 0; ai < a; ++ai) {
      const double* p0 = part.data() + ai * bands * k;
      std::copy(p0, p0 + k, acc.begin());
      for (int64_t bi = 1; bi < bands; ++bi) {
        const double* pb = p0 + bi * k;
        for (int64_t j = 0; j < k; ++j) acc[static_cast<size_t>(j)] += pb[j];
      }
      for (int64_t j = 0; j < k; ++j)
        out[ai * k + j] = static_cast<float>(acc[static_cast<size_t>(j)]);
    }
    return true;
  }
  for (int64_t ai = 0; ai < a; ++ai)
    for (int64_t j = 0; j < k; ++j) {
      double acc = part[static_cast<size_t>(ai * bands * k + j)];
      bool bad = !is_sum && part_bad[static_cast<size_t>(ai * bands * k + j)];
      for (int64_t bi = 1; bi < bands; ++bi) {
        const size_t at = static_cast<size_t>((ai * bands + bi) * k + j);
        const double v = part[at];
        if (is_sum) {
          acc += v;
        } else {
          bad = bad || part_bad[at];
          acc = is_max ? (v > acc ? v : acc) : (v < acc ? v : acc);
        }
      }
      out[ai * k + j] = bad ? __builtin_nanf("") : static_cast<float>(acc);
    }
  return true;
}

}  // namespace

void reduce_f32(ir::Op op, const float* x, const Shape& in, const std::vector<int64_t>& attrs,
                float* out) {
  if (reduce_layout(in, attrs).inner == 1 && reduce_columns(op, x, in, attrs, out)) return;
  reduce_f32(
      op, reduce_layout(in, attrs), [x](int64_t off, int64_t, float*, bool) { return x + off; },
      out, 0);
}

void merge_dims(std::vector<int64_t>& div, std::vector<int64_t>& mod, std::vector<int64_t>& step) {
  for (size_t k = 0; k + 1 < div.size();) {
    if (div[k + 1] == div[k] * mod[k] && step[k + 1] == step[k] * mod[k]) {
      mod[k] *= mod[k + 1];
      const auto next = static_cast<std::ptrdiff_t>(k) + 1;
      div.erase(div.begin() + next);
      mod.erase(mod.begin() + next);
      step.erase(step.begin() + next);
    } else {
      ++k;
    }
  }
}

ReduceMap reduce_map(const Shape& in, const std::vector<int64_t>& attrs) {
  const size_t r = in.size();
  std::vector<bool> reduced(r, false);
  for (size_t i = 1; i < attrs.size(); ++i) reduced[attrs[i]] = true;
  ReduceMap m;
  m.numel = shape_numel(in);
  size_t d = r;
  while (d > 0 && reduced[d - 1]) m.run *= in[--d];
  int64_t stride = m.run, mul = 1;
  for (; d-- > 0;) {
    if (!reduced[d] && in[d] > 1) {  // a kept dim of size 1 adds nothing
      m.div.push_back(stride);
      m.mod.push_back(in[d]);
      m.mul.push_back(mul);
      mul *= in[d];
    }
    stride *= in[d];
  }
  merge_dims(m.div, m.mod, m.mul);
  m.out_size = mul;
  return m;
}

namespace {
constexpr int kLanes = 16;
}

// The sum of a run in kLanes partial sums; inlined into each clone that uses it.
inline float sum_lanes(const float* p, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += p[i + j];
  float s = 0;
  for (; i < n; ++i) s += p[i];
  for (int j = 0; j < kLanes; ++j) s += acc[j];
  return s;
}

LOCKSTEP_TARGET_CLONES float sum_run_f32(const float* p, int64_t n) { return sum_lanes(p, n); }

LOCKSTEP_TARGET_CLONES void add_blocks(const float* p, int64_t n, float* part) {
  // A vector of GCC's vector extension: written as a loop over 16 lanes, -O3 unrolls it into
  // 16 scalar additions before the vectorizer sees it.
  using Block = float __attribute__((vector_size(4 * kBlock)));
  Block acc;
  std::memcpy(&acc, part, sizeof acc);
  for (int64_t j = 0; j < n; ++j) {
    Block v;
    std::memcpy(&v, p + j * kBlock, sizeof v);
    acc += v;
  }
  std::memcpy(part, &acc, sizeof acc);
}

LOCKSTEP_TARGET_CLONES void add_widened(const float* __restrict p, int64_t n,
                                        double* __restrict acc) {
  for (int64_t i = 0; i < n; ++i) acc[i] += p[i];
}

// The largest (kMax) or smallest value of a run, 16 lanes at a time in vectors of GCC's vector
// extension (one register with AVX-512, two with AVX2); inlined into each clone below, compiled
// for that clone's instruction set. NaNs are flagged per lane apart from the comparison, so the
// loop is a compare, a max and a masked move. (Written as loops over arrays of lanes, -O3
// unrolled them before the vectorizer saw them and left a scalar, branchy loop: a softmax's max
// over [128, 64, 64] took 0.2-1 ms.)
template <bool kMax>
inline float extreme_run(const float* p, int64_t n, bool* nan) {
  using Lanes = float __attribute__((vector_size(4 * kLanes)));
  using Flags = int __attribute__((vector_size(4 * kLanes)));
  const float start =
      kMax ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
  Lanes best = start - Lanes{};
  Flags bad = Flags{};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    Lanes v;
    std::memcpy(&v, p + i, sizeof v);
    bad |= v != v;
    best = (kMax ? v > best : v < best) ? v : best;
  }
  auto pick = [](float v, float b) { return (kMax ? v > b : v < b) ? v : b; };
  float b = start;
  int any = 0;
  for (; i < n; ++i) {
    any |= p[i] != p[i];
    b = pick(p[i], b);
  }
  for (int j = 0; j < kLanes; ++j) {
    any |= bad[j];
    b = pick(best[j], b);
  }
  if (any) *nan = true;
  return b;
}

LOCKSTEP_TARGET_CLONES float max_run_f32(const float* p, int64_t n, bool* nan) {
  return extreme_run<true>(p, n, nan);
}

LOCKSTEP_TARGET_CLONES float min_run_f32(const float* p, int64_t n, bool* nan) {
  return extreme_run<false>(p, n, nan);
}

LOCKSTEP_TARGET_CLONES void reduce_rows_f32(ir::Op op, const float* p, int64_t rows, int64_t len,
                                            float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* run = p + r * len;
    bool nan = false;
    if (op == ir::Op::Sum)
      out[r] = sum_lanes(run, len);
    else if (op == ir::Op::Max)
      out[r] = extreme_run<true>(run, len, &nan);
    else
      out[r] = extreme_run<false>(run, len, &nan);
    if (nan) out[r] = __builtin_nanf("");
  }
}

namespace {

#if defined(__x86_64__)
// d[k * dd + j] = s[j * ss + k] for j, k < 8: an 8x8 block of 4-byte values transposed in
// registers (unpack pairs, then quads, then the 128-bit halves).
__attribute__((target("avx2"))) void transpose8x8(const void* src, int64_t ss, void* dst,
                                                  int64_t dd) {
  const float* s = static_cast<const float*>(src);
  float* d = static_cast<float*>(dst);
  __m256 r[8], t[8];
  for (int k = 0; k < 8; ++k) r[k] = _mm256_loadu_ps(s + k * ss);
  for (int k = 0; k < 8; k += 2) {
    t[k] = _mm256_unpacklo_ps(r[k], r[k + 1]);
    t[k + 1] = _mm256_unpackhi_ps(r[k], r[k + 1]);
  }
  for (int k = 0; k < 8; k += 4) {
    r[k] = _mm256_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int k = 0; k < 4; ++k) {
    _mm256_storeu_ps(d + k * dd, _mm256_permute2f128_ps(r[k], r[k + 4], 0x20));
    _mm256_storeu_ps(d + (k + 4) * dd, _mm256_permute2f128_ps(r[k], r[k + 4], 0x31));
  }
}

// The same for 2-byte values (bf16), in SSE2 registers: unpack 16-bit pairs, then 32-bit, then
// 64-bit halves.
void transpose8x8_2(const void* src, int64_t ss, void* dst, int64_t dd) {
  const uint16_t* s = static_cast<const uint16_t*>(src);
  uint16_t* d = static_cast<uint16_t*>(dst);
  __m128i r[8], t[8];
  for (int k = 0; k < 8; ++k) r[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + k * ss));
  for (int k = 0; k < 8; k += 2) {
    t[k] = _mm_unpacklo_epi16(r[k], r[k + 1]);
    t[k + 1] = _mm_unpackhi_epi16(r[k], r[k + 1]);
  }
  for (int k = 0; k < 8; k += 4) {
    r[k] = _mm_unpacklo_epi32(t[k], t[k + 2]);
    r[k + 1] = _mm_unpackhi_epi32(t[k], t[k + 2]);
    r[k + 2] = _mm_unpacklo_epi32(t[k + 1], t[k + 3]);
    r[k + 3] = _mm_unpackhi_epi32(t[k + 1], t[k + 3]);
  }
  for (int k = 0; k < 4; ++k) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 2 * k * dd),
                     _mm_unpacklo_epi64(r[k], r[k + 4]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + (2 * k + 1) * dd),
                     _mm_unpackhi_epi64(r[k], r[k + 4]));
  }
}
#endif

// A copy whose source runs along output dim u (stride 1) while the output runs along its last
// dim: a transpose of those two dims (attention's heads, a matrix's transpose) for each position
// of the others. Done in square tiles, so each source cache line is used whole while it is in
// cache (the row-by-row walk read one value per line: [128, 64, 128] -> [128, 128, 64] at a
// fifth of the memory's speed).
template <typename E>
bool transpose_copy(const E* s, const Shape& out_shape, const std::vector<int64_t>& strides,
                    int64_t src_offset, E* o) {
  const size_t r = out_shape.size();
  if (r < 2 || strides[r - 1] == 1 || out_shape[r - 1] < 8) return false;
  size_t u = r;
  for (size_t d = r - 1; d-- > 0;)
    if (strides[d] == 1 && out_shape[d] >= 8) {
      u = d;
      break;
    }
  if (u == r) return false;
  std::vector<int64_t> ostride(r);
  int64_t acc = 1;
  for (size_t d = r; d-- > 0;) {
    ostride[d] = acc;
    acc *= out_shape[d];
  }
  // The other dims: each position's source and output offsets.
  std::vector<int64_t> dims, sst, ost;
  for (size_t d = 0; d + 1 < r; ++d)
    if (d != u) dims.push_back(out_shape[d]), sst.push_back(strides[d]), ost.push_back(ostride[d]);
  const int64_t rows = out_shape[u], cols = out_shape[r - 1], cstride = strides[r - 1];
  const int64_t orow = ostride[u];
  constexpr int64_t kT = 16;
  const int64_t row_tiles = (rows + kT - 1) / kT;
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
#endif
  const int64_t outer = shape_numel(out_shape) / (rows * cols);
  parallel_for(outer * rows * cols > 65536, outer * row_tiles, [&](int64_t job) {
    int64_t rest = job / row_tiles, so = src_offset, oo = 0;
    for (size_t k = dims.size(); k-- > 0;) {
      so += rest % dims[k] * sst[k];
      oo += rest % dims[k] * ost[k];
      rest /= dims[k];
    }
    const int64_t i0 = job % row_tiles * kT, i1 = std::min(rows, i0 + kT);
    int64_t j_done = 0;  // columns done by 8x8 blocks
#if defined(__x86_64__)
    if (((sizeof(E) == 4 && avx2) || sizeof(E) == 2) && i1 - i0 == kT) {
      j_done = cols / 8 * 8;
      for (int64_t j = 0; j < j_done; j += 8)
        for (int64_t i = i0; i < i1; i += 8) {
          const E* from = s + so + i + j * cstride;
          E* to = o + oo + i * orow + j;
          if (sizeof(E) == 4)
            transpose8x8(from, cstride, to, orow);
          else
            transpose8x8_2(from, cstride, to, orow);
        }
    }
#endif
    for (int64_t j0 = j_done; j0 < cols; j0 += kT) {
      const int64_t j1 = std::min(cols, j0 + kT);
      for (int64_t i = i0; i < i1; ++i) {
        const E* from = s + so + i;
        E* to = o + oo + i * orow;
        for (int64_t j = j0; j < j1; ++j) to[j] = from[j * cstride];
      }
    }
  });
  return true;
}

template <typename E>
void strided_copy(const void* src, const Shape& out_shape, const std::vector<int64_t>& strides,
                  int64_t src_offset, void* out) {
  const int64_t n = shape_numel(out_shape);
  if (n == 0) return;
  const size_t r = out_shape.size();
  if (transpose_copy(static_cast<const E*>(src), out_shape, strides, src_offset,
                     static_cast<E*>(out)))
    return;
  // Output rows (along the last dim) in blocks of up to kBlock consecutive rows of one matrix
  // (the last two dims): a block's source offset is computed once, its rows step by the
  // second-to-last dim's stride (a division per row cost more than copying rows of 64 bf16).
  const int64_t last = r ? out_shape[r - 1] : 1;
  const int64_t last_stride = r ? strides[r - 1] : 0;
  const int64_t mid = r >= 2 ? out_shape[r - 2] : 1;
  const int64_t mid_stride = r >= 2 ? strides[r - 2] : 0;
  const int64_t matrices = n / (last * mid);
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (mid + kBlock - 1) / kBlock;
  const E* s = static_cast<const E*>(src);
  E* o = static_cast<E*>(out);
  parallel_for(n > 65536, matrices * blocks, [&](int64_t job) {
    const int64_t matrix = job / blocks, m0 = job % blocks * kBlock;
    const int64_t m1 = std::min(mid, m0 + kBlock);
    int64_t off = src_offset, rest = matrix;
    for (size_t d = r >= 2 ? r - 2 : 0; d-- > 0;) {
      off += rest % out_shape[d] * strides[d];
      rest /= out_shape[d];
    }
    for (int64_t m = m0; m < m1; ++m) {
      const E* from = s + off + m * mid_stride;
      E* dst = o + (matrix * mid + m) * last;
      if (last_stride == 1)
        std::memcpy(dst, from, last * sizeof(E));
      else
        for (int64_t i = 0; i < last; ++i) dst[i] = from[i * last_stride];
    }
  });
}
}  // namespace

void strided_copy_4(const void* src, const Shape& out_shape, const std::vector<int64_t>& strides,
                    int64_t src_offset, void* out) {
  strided_copy<uint32_t>(src, out_shape, strides, src_offset, out);
}
void strided_copy_2(const void* src, const Shape& out_shape, const std::vector<int64_t>& strides,
                    int64_t src_offset, void* out) {
  strided_copy<uint16_t>(src, out_shape, strides, src_offset, out);
}
void strided_copy(size_t elem, const void* src, const Shape& out_shape,
                  const std::vector<int64_t>& strides, int64_t src_offset, void* out) {
  switch (elem) {
    case 1:
      return strided_copy<uint8_t>(src, out_shape, strides, src_offset, out);
    case 2:
      return strided_copy<uint16_t>(src, out_shape, strides, src_offset, out);
    case 4:
      return strided_copy<uint32_t>(src, out_shape, strides, src_offset, out);
    case 8:
      return strided_copy<uint64_t>(src, out_shape, strides, src_offset, out);
    default:
      util::internal_fail(__FILE__, __LINE__, "strided_copy: no element of that size");
  }
}

std::vector<int64_t> expand_strides(const Shape& in, const Shape& out) {
  std::vector<int64_t> st(out.size(), 0);
  int64_t acc = 1;
  for (size_t i = 0; i < in.size(); ++i) {
    const size_t din = in.size() - 1 - i, dout = out.size() - 1 - i;
    st[dout] = in[din] == 1 && out[dout] != 1 ? 0 : acc;
    acc *= in[din];
  }
  return st;
}

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
