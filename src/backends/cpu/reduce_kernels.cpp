// Reductions on f32 (see kernels.h): the layout a reduction walks, sums and extremes of whole
// columns, and the runs' sums, maxima and minima compiled per instruction set. Not the fused
// trees they read as they go (fused.cpp), nor other dtypes (typed_kernels.h).
#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "backends/cpu/kernels.h"

namespace lockstep::backends::cpu {

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
// The same over bf16 rows (widened exactly as they are read).
LOCKSTEP_TARGET_CLONES void add_rows_f64(const uint16_t* rows, int64_t n, int64_t stride,
                                         int64_t len, double* acc) {
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t* row = rows + i * stride;
    for (int64_t j = 0; j < len; ++j) acc[j] += bf16_value(row[j]);
  }
}
inline float value_of(float v) { return v; }
inline float value_of(uint16_t bits) { return bf16_value(bits); }

// Reductions over a block of dims followed by kept ones: x viewed as [A, R, K] (K contiguous
// kept elements innermost), out [A, K]. Whole rows of K are combined at a time, so the loads
// stay contiguous and vectorize (the generic walk would visit one element per run). Rows are
// read in runs of up to 2048 values: shorter runs (1 KiB of each 4 KiB row) broke the
// hardware's prefetch streams and ran a bias gradient's [4096, 1024] -> [1024] sum at a third
// of the speed.
// x: f32, or bf16 (uint16_t) values.
template <typename T>
void reduce_columns(ir::Op op, const T* x, const ColumnReduction& c, float* out) {
  const int64_t a = c.a, r = c.r, k = c.k;
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
    const T* base = x + ai * r * k + k0;
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
      for (int64_t j = 0; j < len; ++j) best[j] = value_of(base[r0 * k + j]);
      for (int64_t ri = r0; ri < r1; ++ri)
        for (int64_t j = 0; j < len; ++j) {
          const float v = value_of(base[ri * k + j]);
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
  if (bands == 1) return;
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
    return;
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
}

}  // namespace

std::optional<ColumnReduction> column_reduction(const Shape& in,
                                                const std::vector<int64_t>& attrs) {
  std::vector<bool> reduced(in.size(), false);
  for (size_t i = 1; i < attrs.size(); ++i) reduced[static_cast<size_t>(attrs[i])] = true;
  size_t d = in.size();
  ColumnReduction c;
  while (d > 0 && (!reduced[d - 1] || in[d - 1] == 1)) c.k *= in[--d];
  while (d > 0 && (reduced[d - 1] || in[d - 1] == 1)) c.r *= in[--d];
  while (d > 0) {
    if (reduced[d - 1] && in[d - 1] != 1) return std::nullopt;
    c.a *= in[--d];
  }
  if (c.k < 16 || c.r < 2) return std::nullopt;
  return c;
}

void sum_columns_bf16(const uint16_t* x, const ColumnReduction& c, float* out) {
  reduce_columns(ir::Op::Sum, x, c, out);
}

void reduce_columns_f32(ir::Op op, const float* x, const ColumnReduction& c, float* out) {
  reduce_columns(op, x, c, out);
}

void reduce_f32(ir::Op op, const float* x, const Shape& in, const std::vector<int64_t>& attrs,
                float* out) {
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

using Lanes = float __attribute__((vector_size(4 * kLanes)));

// How tree_lanes() combines two lanes.
enum class Combine { kSum, kMax, kMin };

// x = x op y, lane by lane (by reference: GCC warns that passing vectors by value changes the
// ABI between the clones' instruction sets).
template <Combine kC, typename V>
__attribute__((always_inline)) inline void combine(V& x, const V& y) {
  if constexpr (kC == Combine::kSum)
    x = x + y;
  else if constexpr (kC == Combine::kMax)
    x = x > y ? x : y;
  else
    x = x < y ? x : y;
}

// The lanes of v combined pairwise (8 pairs, then 4, 2, 1): four dependent steps where lane
// after lane took sixteen, which a softmax's or a layer norm's rows of 128 paid per row.
template <Combine kC>
__attribute__((always_inline)) inline float tree_lanes(const Lanes& v) {
  using Half = float __attribute__((vector_size(4 * kLanes / 2)));
  using Quarter = float __attribute__((vector_size(4 * kLanes / 4)));
  Half h = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
  const Half h2 = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  combine<kC>(h, h2);
  Quarter q = __builtin_shufflevector(h, h, 0, 1, 2, 3);
  const Quarter q2 = __builtin_shufflevector(h, h, 4, 5, 6, 7);
  combine<kC>(q, q2);
  float a = q[0], b = q[1];
  const float c = q[2], d = q[3];
  combine<kC>(a, c);
  combine<kC>(b, d);
  combine<kC>(a, b);
  return a;
}

// The sum of a run in two vectors of kLanes partial sums (two chains of additions in flight),
// then pairwise; inlined into each clone that uses it.
inline float sum_lanes(const float* p, int64_t n) {
  Lanes a = Lanes{}, b = Lanes{};
  int64_t i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    Lanes u, v;
    std::memcpy(&u, p + i, sizeof u);
    std::memcpy(&v, p + i + kLanes, sizeof v);
    a += u;
    b += v;
  }
  if (i + kLanes <= n) {
    Lanes u;
    std::memcpy(&u, p + i, sizeof u);
    a += u;
    i += kLanes;
  }
  float s = tree_lanes<Combine::kSum>(a + b);
  for (; i < n; ++i) s += p[i];
  return s;
}

LOCKSTEP_TARGET_CLONES float sum_run_f32(const float* p, int64_t n) { return sum_lanes(p, n); }

LOCKSTEP_TARGET_CLONES void add_blocks(const float* p, int64_t n, int64_t stride, float* part) {
  // A vector of GCC's vector extension: written as a loop over 16 lanes, -O3 unrolls it into
  // 16 scalar additions before the vectorizer sees it.
  using Block = float __attribute__((vector_size(4 * kBlock)));
  Block acc;
  std::memcpy(&acc, part, sizeof acc);
  for (int64_t j = 0; j < n; ++j) {
    Block v;
    std::memcpy(&v, p + j * stride, sizeof v);
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
  for (int j = 0; j < kLanes; ++j) any |= bad[j];
  if (any) *nan = true;
  return pick(tree_lanes < kMax ? Combine::kMax : Combine::kMin > (best), b);
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

}  // namespace lockstep::backends::cpu
