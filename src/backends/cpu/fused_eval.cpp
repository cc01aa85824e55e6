// Fused elementwise trees, their evaluation (see fused.h): leaves loaded tile by tile, each
// instruction a loop over one tile of up to kTile floats, so the compiler vectorizes it (an
// operand that is one value for the whole tree is read once, not from a tile of copies); tiles are
// spread over the OpenMP threads. Not here: building the trees (fused.cpp).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/cpu/fused.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/native.h"
#include "backends/cpu/vector_math.h"
#include "ir/elementwise.h"
#include "util/check.h"

namespace lockstep::backends::cpu {
using ir::Op;

bool exact_in_bf16(Op op, DType in) {
  if (in != DType::BF16 && in != DType::Bool) return false;
  bool exact = false;
  ir::elementwise::with_fn<float>(op, [&](auto fn) {
    exact = requires { decltype(fn)::kExact; };
  });
  return exact;
}

namespace {

// Element i of a leaf's memory as a float.
inline float read_value(DType d, const void* p, int64_t i) {
  switch (d) {
    case DType::Bool:
      return static_cast<const uint8_t*>(p)[i] != 0;
    case DType::BF16:
      return bf16_value(static_cast<const uint16_t*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

// Broadcast loads: n copies of v, with the machine's widest stores.
LOCKSTEP_TARGET_CLONES void fill_run(float* dst, int64_t n, float v) {
  for (int64_t i = 0; i < n; ++i) dst[i] = v;
}

}  // namespace

std::vector<const void*> FusedTree::bind(const std::vector<void*>& ptr,
                                         RunBuffers& expanded) const {
  std::vector<const void*> out;
  out.reserve(leaves_.size());
  for (size_t k = 0; k < leaves_.size(); ++k) {
    const Leaf& leaf = leaves_[k];
    const void* p = ptr[leaf_nodes_[k]];
    if (leaf.period > 0) {
      float* e = expanded.take(leaf.expanded);
      load_source(leaf, p, 0, leaf.expanded, e);
      p = e;
    } else if (leaf.per_block) {
      // Block b's 16 channels, kTile / 16 times over, at b * kTile.
      const int64_t blocks = leaf.mod[1], st = leaf.stride[1];
      float* e = expanded.take(blocks * kTile);
      for (int64_t b = 0; b < blocks; ++b) {
        float* row = e + b * kTile;
        for (int64_t q = 0; q < kBlock; ++q) row[q] = read_value(leaf.dtype, p, b * st + q);
        for (int64_t r = kBlock; r < kTile; r += kBlock)
          std::memcpy(row + r, row, kBlock * sizeof(float));
      }
      p = e;
    }
    out.push_back(p);
  }
  return out;
}

void FusedTree::load(const Leaf& leaf, const void* src, int64_t i0, int64_t len, float* dst) const {
  if (leaf.per_block) {
    // src is the table bind() wrote: runs of one block's channels, piece by piece.
    const float* table = static_cast<const float*>(src);
    const int64_t span = leaf.div[1], blocks = leaf.mod[1];
    int64_t b = i0 / span % blocks, left = span - i0 % span;
    const int64_t phase = i0 % kBlock;
    for (int64_t i = 0; i < len;) {
      const int64_t n = std::min({len - i, left, kTile - kBlock});
      std::memcpy(dst + i, table + b * kTile + (phase + i) % kBlock, n * sizeof(float));
      i += n;
      left -= n;
      if (left == 0) {
        left = span;
        if (++b == blocks) b = 0;
      }
    }
    return;
  }
  if (leaf.period == 0) {
    load_source(leaf, src, i0, len, dst);
    return;
  }
  // src is one expanded period (bind()).
  const float* e = static_cast<const float*>(src);
  for (int64_t i = 0, at = i0 % leaf.period; i < len;) {
    const int64_t n = std::min(len - i, leaf.period - at);
    std::memcpy(dst + i, e + at, n * sizeof(float));
    i += n;
    at = 0;
  }
}

namespace {
// n values of dtype dt from element `off` of src, `st` elements apart, as floats: a run is
// copied or widened whole, not read a value at a time through the dtype's switch.
void copy_run(DType dt, const void* src, int64_t off, int64_t st, int64_t n, float* dst) {
  if (dt == DType::F32) {
    const float* s = static_cast<const float*>(src) + off;
    if (st == 1)
      std::memcpy(dst, s, n * sizeof(float));
    else
      for (int64_t j = 0; j < n; ++j) dst[j] = s[j * st];
  } else if (dt == DType::BF16) {
    const uint16_t* s = static_cast<const uint16_t*>(src) + off;
    if (st == 1)
      bf16_to_f32(s, n, dst);
    else
      for (int64_t j = 0; j < n; ++j) dst[j] = bf16_value(s[j * st]);
  } else {
    for (int64_t j = 0; j < n; ++j) dst[j] = read_value(dt, src, off + j * st);
  }
}
}  // namespace

void FusedTree::load_source(const Leaf& leaf, const void* src, int64_t i0, int64_t len,
                            float* dst) const {
  if (leaf.numel == 1) {
    fill_run(dst, len, read_value(leaf.dtype, src, 0));
    return;
  }
  if (leaf.contiguous) {
    if (leaf.dtype == DType::Bool) {
      const uint8_t* s = static_cast<const uint8_t*>(src) + i0;
      for (int64_t i = 0; i < len; ++i) dst[i] = s[i] != 0;
    } else if (leaf.dtype == DType::BF16) {
      bf16_to_f32(static_cast<const uint16_t*>(src) + i0, len, dst);
    } else {
      std::memcpy(dst, static_cast<const float*>(src) + i0, len * sizeof(float));
    }
    return;
  }
  // Walk the tile in segments: along the innermost present dim when it is the output's
  // innermost (a run of source elements), else runs of one repeated source element.
  const size_t rank = leaf.div.size();
  const bool inner_run = rank > 0 && leaf.div[0] == 1;
  const int64_t repeat = rank > 0 ? leaf.div[0] : 1;
  const DType dt = leaf.dtype;
  if (rank == 1 && !inner_run) {
    // One broadcast dim (a per-channel value over [N, C, H, W]): runs of `repeat` copies of
    // consecutive source elements, walked without a division per run.
    const int64_t mod = leaf.mod[0], st = leaf.stride[0];
    int64_t c = i0 / repeat % mod, left = repeat - i0 % repeat;
    for (int64_t i = 0; i < len;) {
      const int64_t n = std::min(len - i, left);
      const float v = read_value(dt, src, c * st);
      if (n < 16)  // short runs inline, not a call each
        for (int64_t q = 0; q < n; ++q) dst[i + q] = v;
      else
        fill_run(dst + i, n, v);
      i += n;
      left = repeat;
      if (++c == mod) c = 0;
    }
    return;
  }
  if (rank == 2 && inner_run && leaf.mod[0] == kBlock && leaf.stride[0] == 1 &&
      leaf.div[1] % kBlock == 0) {
    // Blocks of 16 consecutive source values, each repeated over a run of div[1] outputs
    // ([N, C, 1, 1] over a blocked map whose per-block table would be too large): copied 16
    // at a time, counted along without divisions.
    const int64_t span = leaf.div[1], blocks = leaf.mod[1], st = leaf.stride[1];
    int64_t b = i0 / span % blocks, left = span - i0 % span, q = i0 % kBlock;
    for (int64_t i = 0; i < len;) {
      const int64_t n = std::min(len - i, kBlock - q);
      copy_run(dt, src, b * st + q, 1, n, dst + i);
      i += n;
      left -= n;
      q = 0;
      if (left == 0) {
        left = span;
        if (++b == blocks) b = 0;
      }
    }
    return;
  }
  if (inner_run) {
    // Runs along the source's innermost present dim (a bias over rows, a mask over a batch,
    // the rows of a permute), each copied, not read a value at a time through the dtype's
    // switch. The source offset follows the output index as an odometer: a digit per present
    // dim, and one per stretch of broadcast dims between two (stride 0), set with divisions
    // once per tile; a run then costs a few adds (a permute's rows of 32 values cost more in
    // divisions than in copying).
    struct Digit {
      int64_t size, stride, at;
    };
    thread_local std::vector<Digit> digits;
    digits.clear();
    int64_t off = 0;
    for (size_t d = 0; d < rank; ++d) {
      const int64_t at = i0 / leaf.div[d] % leaf.mod[d];
      digits.push_back({leaf.mod[d], leaf.stride[d], at});
      off += at * leaf.stride[d];
      const int64_t span = leaf.div[d] * leaf.mod[d];
      if (d + 1 < rank && leaf.div[d + 1] > span) {
        const int64_t gap = leaf.div[d + 1] / span;
        digits.push_back({gap, 0, i0 / span % gap});
      }
    }
    Digit* dg = digits.data();
    const size_t nd = digits.size();
    for (int64_t i = 0;;) {
      const int64_t n = std::min(len - i, dg[0].size - dg[0].at);
      copy_run(dt, src, off, dg[0].stride, n, dst + i);
      if ((i += n) >= len) return;
      // The run reached the end of the innermost dim: back to its start, one on in the next
      // digit, and so on while digits wrap (past the last, the outer broadcast dims).
      off -= dg[0].at * dg[0].stride;
      dg[0].at = 0;
      for (size_t k = 1; k < nd; ++k) {
        if (++dg[k].at < dg[k].size) {
          off += dg[k].stride;
          break;
        }
        off -= (dg[k].size - 1) * dg[k].stride;
        dg[k].at = 0;
      }
    }
  }
  int64_t i = 0;
  while (i < len) {
    const int64_t o = i0 + i;
    int64_t off = 0;
    for (size_t d = 0; d < rank; ++d) off += (o / leaf.div[d]) % leaf.mod[d] * leaf.stride[d];
    const int64_t n = std::min(len - i, repeat - o % repeat);
    fill_run(dst + i, n, read_value(dt, src, off));
    i += n;
  }
}

namespace {

// y = f(a, b) over a tile; an operand flagged in `scalars` is one value (a tile's first float)
// held in a register instead of read from its tile.
template <typename F>
__attribute__((always_inline)) inline void binary(int64_t len, float* y, const float* a,
                                                  const float* b, unsigned scalars, F f) {
  if (scalars & kScalarA) {
    const float av = a[0];
    for (int64_t i = 0; i < len; ++i) y[i] = f(av, b[i]);
  } else if (scalars & kScalarB) {
    const float bv = b[0];
    for (int64_t i = 0; i < len; ++i) y[i] = f(a[i], bv);
  } else {
    for (int64_t i = 0; i < len; ++i) y[i] = f(a[i], b[i]);
  }
}

// How an operand of a folded sum is scaled: not, by one value, or element by element.
enum Scale { kUnscaled, kByValue, kByTile };

// y = a * sa + b * sb (or -), each product rounded before the sum as the unfolded
// instructions would (fused.cpp is built with -ffp-contract=off: no fused multiply-adds); with
// kRelu, max(0, y) as Relu computes it (NaN stays NaN, -0 stays -0).
template <int kA, int kB, bool kSub, bool kRelu>
__attribute__((always_inline)) inline void scaled_sum(int64_t len, float* y, const float* a,
                                                      const float* sa, const float* b,
                                                      const float* sb) {
  const float va = kA == kByValue ? sa[0] : 1.0f, vb = kB == kByValue ? sb[0] : 1.0f;
  for (int64_t i = 0; i < len; ++i) {
    const float x = kA == kUnscaled ? a[i] : a[i] * (kA == kByValue ? va : sa[i]);
    const float z = kB == kUnscaled ? b[i] : b[i] * (kB == kByValue ? vb : sb[i]);
    const float v = kSub ? x - z : x + z;
    y[i] = kRelu && v < 0.0f ? 0.0f : v;
  }
}

template <int kA, int kB>
__attribute__((always_inline)) inline void scaled_sum_op(bool sub, bool relu, int64_t len, float* y,
                                                         const float* a, const float* sa,
                                                         const float* b, const float* sb) {
  if (sub && relu)
    scaled_sum<kA, kB, true, true>(len, y, a, sa, b, sb);
  else if (sub)
    scaled_sum<kA, kB, true, false>(len, y, a, sa, b, sb);
  else if (relu)
    scaled_sum<kA, kB, false, true>(len, y, a, sa, b, sb);
  else
    scaled_sum<kA, kB, false, false>(len, y, a, sa, b, sb);
}

template <int kA>
__attribute__((always_inline)) inline void scaled_sum_b(int kb, bool sub, bool relu, int64_t len,
                                                        float* y, const float* a, const float* sa,
                                                        const float* b, const float* sb) {
  if (kb == kUnscaled)
    scaled_sum_op<kA, kUnscaled>(sub, relu, len, y, a, sa, b, sb);
  else if (kb == kByValue)
    scaled_sum_op<kA, kByValue>(sub, relu, len, y, a, sa, b, sb);
  else
    scaled_sum_op<kA, kByTile>(sub, relu, len, y, a, sa, b, sb);
}

LOCKSTEP_TARGET_CLONES void apply_scaled(bool sub, bool relu, int ka, int kb, int64_t len, float* y,
                                         const float* a, const float* sa, const float* b,
                                         const float* sb) {
  if (ka == kUnscaled)
    scaled_sum_b<kUnscaled>(kb, sub, relu, len, y, a, sa, b, sb);
  else if (ka == kByValue)
    scaled_sum_b<kByValue>(kb, sub, relu, len, y, a, sa, b, sb);
  else
    scaled_sum_b<kByTile>(kb, sub, relu, len, y, a, sa, b, sb);
}

// A formula's result as a float: a predicate's as a select of 1 or 0, which vectorizes into a
// masked blend (GCC 12 leaves a bool returned by an inlined function and converted to float
// scalar).
template <typename R>
__attribute__((always_inline)) inline float as_float(R r) {
  if constexpr (std::is_same_v<R, bool>)
    return r ? 1.0f : 0.0f;
  else
    return r;
}

// An op by its formula (ir/elementwise.h) over a tile; bool values are 0/1 floats, which every
// formula that admits bool computes on alike. Inlined into each target clone of apply(), where
// its loops vectorize as the ops' own loops did.
template <typename Fn>
__attribute__((always_inline)) inline void apply_formula(int64_t len, float* y, const float* a,
                                                         const float* b, const float* c,
                                                         unsigned scalars) {
  if constexpr (requires(float v) { Fn::f(v); }) {
    for (int64_t i = 0; i < len; ++i) y[i] = as_float(Fn::f(a[i]));
  } else if constexpr (requires(float v) { Fn::f(v, v); }) {
    binary(len, y, a, b, scalars, [](float u, float v) { return as_float(Fn::f(u, v)); });
  } else {
    for (int64_t i = 0; i < len; ++i) {
      const float bv = b[i], cv = c[i];
      y[i] = Fn::f(a[i] != 0.0f, bv, cv);
    }
  }
}

// One instruction over one tile. Separate, with AVX-512 and AVX2 clones picked at load time, so
// every loop vectorizes. No restrict: y may be an operand's tile itself (a tree's root written
// in place over a leaf), which each loop reads at an index before it writes that index; GCC's
// runtime overlap check lets such loops run vectorized.
LOCKSTEP_TARGET_CLONES void apply(Op op, int64_t len, float* y, const float* a, const float* b,
                                  const float* c, unsigned scalars, DType out_dtype) {
  // The SIMD bodies that replace a formula of ir/elementwise.h (conformance checks them against
  // the ref backend's), and the casts (the conversion is the store's: see run()).
  switch (op) {
    case Op::Exp:
      return vector_math(MathFn::Exp, len, a, y);
    case Op::Log:
      return vector_math(MathFn::Log, len, a, y);
    case Op::Tanh:
      return vector_math(MathFn::Tanh, len, a, y);
    case Op::Sigmoid:
      for (int64_t i = 0; i < len; ++i) y[i] = -a[i];
      vector_math(MathFn::Exp, len, y, y);
      for (int64_t i = 0; i < len; ++i) y[i] = 1.0f / (1.0f + y[i]);
      return;
    case Op::Sin:
      return vector_math(MathFn::Sin, len, a, y);
    case Op::Cos:
      return vector_math(MathFn::Cos, len, a, y);
    case Op::Erf:
      return vector_math(MathFn::Erf, len, a, y);
    case Op::Gelu:
      return vector_math(MathFn::Gelu, len, a, y);
    case Op::GeluDerivative:
      return vector_math(MathFn::GeluDerivative, len, a, y);
    case Op::Cast:
      // f32 <-> bool: to bool is "!= 0" (NaN is true); from bool, 0/1 already.
      if (out_dtype == DType::Bool)
        for (int64_t i = 0; i < len; ++i) y[i] = a[i] != 0.0f;
      else
        for (int64_t i = 0; i < len; ++i) y[i] = a[i];
      return;
    default:
      break;
  }
  // Every other op by its formula.
  const bool known = ir::elementwise::with_fn<float>(
      op, [&](auto fn) { apply_formula<decltype(fn)>(len, y, a, b, c, scalars); });
  if (!known)
    util::internal_fail(__FILE__, __LINE__,
                        util::cat("no fused kernel for ", ir::op_info(op).name,
                                  ": fusible() takes its family, so apply() must compute it"));
}

}  // namespace

const float* FusedTree::eval(const std::vector<const void*>& leaf_ptrs, int64_t i0, int64_t len,
                             float* scratch, float* dst, bool scalars_loaded) const {
  // Registers point into the sources when they can (contiguous f32 leaves), else into scratch;
  // the root writes straight to `dst` when given.
  thread_local std::vector<const float*> regs;
  if (regs.size() < static_cast<size_t>(num_regs_)) regs.resize(num_regs_);
  const float** reg = regs.data();
  // With a root `where` of one condition, the side it picks is the result: only that side's
  // instructions run, and the one computing its value writes it to dst.
  int result = root_reg_;
  const char* needs = nullptr;
  bool yes = true;
  if (pick_cond_leaf_ >= 0) {
    const void* c = leaf_ptrs[pick_cond_leaf_];
    yes = read_value(leaves_[pick_cond_leaf_].dtype, c, 0) != 0.0f;
    result = yes ? instrs_.back().b : instrs_.back().c;
    needs = pick_needs_[yes ? 0 : 1].data();
  }
  if (const NativeFn fn = native_.load(std::memory_order_acquire))
    return run_native(fn, yes ? 0 : 1, leaf_ptrs, 0, instrs_.size(), needs, reg, i0, len, scratch,
                      dst, scalars_loaded);
  return run(leaf_ptrs, 0, instrs_.size(), result, needs, reg, i0, len, scratch, dst,
             scalars_loaded);
}

const float* FusedTree::run_native(NativeFn fn, int part, const std::vector<const void*>& leaf_ptrs,
                                   size_t begin, size_t end, const char* needs, const float** reg,
                                   int64_t i0, int64_t len, float* scratch, float* dst,
                                   bool scalars_loaded) const {
  // The leaves loaded as the interpreter loads them, each into a tile of its own
  // (Instr::native_slot); a staged tree's values that later stages read given their tiles; then
  // the part in one pass of native code, into `dst` or the tile after all others.
  for (size_t i = begin; i < end; ++i) {
    const Instr& in = instrs_[i];
    if (in.op == Op::Data && (!needs || needs[i]))
      reg[in.out] =
          load_data(in, leaf_ptrs, i0, len, scratch + static_cast<int64_t>(in.native_slot) * tile_,
                    scalars_loaded);
  }
  if (row_ > 0)
    for (const auto& [r, slot] : stage_exports_[static_cast<size_t>(part)])
      reg[r] = scratch + static_cast<int64_t>(slot) * tile_;
  float* y = dst ? dst : scratch + static_cast<int64_t>(native_out_) * tile_;
  const NativeCall call{len, reg, y, part, native_math()};
  fn(&call);
  return y;
}

const float* FusedTree::load_data(const Instr& in, const std::vector<const void*>& leaf_ptrs,
                                  int64_t i0, int64_t len, float* own, bool scalars_loaded) const {
  const Leaf& leaf = leaves_[in.a];
  const float* p = static_cast<const float*>(leaf_ptrs[in.a]);
  if (leaf.contiguous && leaf.dtype == DType::F32 && leaf.numel != 1) return p + i0;
  if (leaf.period > 0 && i0 % leaf.period + len <= leaf.expanded) return p + i0 % leaf.period;
  if (leaf.per_block && i0 % kBlock == 0 && i0 % leaf.div[1] + len <= leaf.div[1])
    return p + i0 / leaf.div[1] % leaf.mod[1] * kTile;  // within one block's run
  if (leaf.numel == 1) {  // a tile of the one value, filled once per scratch
    // A kept tile is filled whole, for every later call whatever its length.
    if (!scalars_loaded || !in.kept) load(leaf, leaf_ptrs[in.a], 0, in.kept ? tile_ : len, own);
    return own;
  }
  load(leaf, leaf_ptrs[in.a], i0, len, own);
  return own;
}

const float* FusedTree::run(const std::vector<const void*>& leaf_ptrs, size_t begin, size_t end,
                            int result, const char* needs, const float** reg, int64_t i0,
                            int64_t len, float* scratch, float* dst, bool scalars_loaded) const {
  for (size_t i = begin; i < end; ++i) {
    if (needs && !needs[i]) continue;
    const Instr& in = instrs_[i];
    float* own = scratch + static_cast<int64_t>(in.slot) * tile_;
    if (in.op == Op::Data) {
      reg[in.out] = load_data(in, leaf_ptrs, i0, len, own, scalars_loaded);
      continue;
    }
    if (in.op == Op::Where && (in.scalars & kScalarA)) {
      // One condition for the whole tree: its result is one of the two operands' tiles.
      reg[in.out] = reg[in.a][0] != 0.0f ? reg[in.b] : reg[in.c];
      continue;
    }
    if (in.op == Op::Cast && in.in_dtype == DType::BF16 && in.out_dtype == DType::F32) {
      reg[in.out] = reg[in.a];  // bf16 values are held as the floats they widen to
      continue;
    }
    float* y = (in.out == result && dst) ? dst : own;
    if (in.op == Op::Cast && in.out_dtype == DType::BF16 && in.in_dtype == DType::F32) {
      round_to_bf16(reg[in.a], len, y);  // one pass: rounded as it is copied
      reg[in.out] = y;
      continue;
    }
    if (in.sa >= 0 || in.sb >= 0 || in.relu) {
      auto kind = [&](int r) { return r < 0 ? kUnscaled : scalar_reg_[r] ? kByValue : kByTile; };
      apply_scaled(in.op == Op::Sub, in.relu, kind(in.sa), kind(in.sb), len, y, reg[in.a],
                   in.sa >= 0 ? reg[in.sa] : nullptr, reg[in.b], in.sb >= 0 ? reg[in.sb] : nullptr);
      if (in.out_dtype == DType::BF16) round_to_bf16(y, len);  // a bf16 sum with its relu
    } else {
      apply(in.op, len, y, reg[in.a], in.b >= 0 ? reg[in.b] : nullptr,
            in.c >= 0 ? reg[in.c] : nullptr, in.scalars, in.out_dtype);
      // A bf16 result is rounded as the op's own, unless the op gives one of its bf16
      // operands' values (or an integer below 256, or 0/1 from bool) back exactly.
      if (in.out_dtype == DType::BF16 && !exact_in_bf16(in.op, in.in_dtype)) round_to_bf16(y, len);
    }
    reg[in.out] = y;
  }
  return reg[result];
}

void FusedTree::prefetch(const std::vector<const void*>& leaf_ptrs, int64_t i0, int64_t len) const {
  for (size_t k = 0; k < leaves_.size(); ++k) {
    const Leaf& leaf = leaves_[k];
    if (!leaf.contiguous || leaf.numel == 1) continue;
    const size_t size = dtype_size(leaf.dtype);
    const char* p = static_cast<const char*>(leaf_ptrs[k]) + i0 * size;
    for (int64_t b = 0; b < len * static_cast<int64_t>(size); b += 64) __builtin_prefetch(p + b);
  }
}

namespace {

// Values [at, at + len) of a result computed as floats, into `out` of `dtype`.
void store(DType dtype, const float* v, void* out, int64_t at, int64_t len) {
  if (dtype == DType::BF16) {
    exact_to_bf16(v, len, static_cast<uint16_t*>(out) + at);  // bf16 values already
  } else if (dtype == DType::Bool) {
    uint8_t* o = static_cast<uint8_t*>(out) + at;
    for (int64_t i = 0; i < len; ++i) o[i] = v[i] != 0.0f;
  } else if (v != static_cast<float*>(out) + at) {
    std::memcpy(static_cast<float*>(out) + at, v, len * sizeof(float));
  }
}

}  // namespace

void FusedTree::run_group(const std::vector<const FusedTree*>& trees,
                          const std::vector<std::vector<const void*>>& leaves,
                          const std::vector<void*>& outs) {
  const int64_t numel = trees[0]->numel_;
  const int64_t tiles = (numel + kTile - 1) / kTile;
  // Each tree its own registers, so the scalar leaves' tiles survive from tile to tile.
  std::vector<size_t> base(trees.size() + 1, 0);
  for (size_t k = 0; k < trees.size(); ++k) base[k + 1] = base[k] + trees[k]->scratch_floats();
  // A tree written in place over one of its leaves (read element for element: plan_donations)
  // writes each tile straight over it: its root, the last instruction, is the only one that
  // writes there, and it reads each element before writing it.
  // Tiles t0 .. t1 on this thread, with its own scratch (kept from run to run: a small tree's
  // whole run is a few tiles, and allocating and clearing registers would cost as much).
  auto run_tiles = [&](int64_t t0, int64_t t1) {
    thread_local std::vector<float> scratch;
    if (scratch.size() < base.back()) scratch.resize(base.back());
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t i0 = t * kTile;
      const int64_t len = std::min(kTile, numel - i0);
      // All the tile's streams at once, not one instruction's after another's.
      for (size_t k = 0; k < trees.size(); ++k) trees[k]->prefetch(leaves[k], i0, len);
      for (size_t k = 0; k < trees.size(); ++k) {
        const DType out_dtype = trees[k]->out_dtype_;
        const bool f32_out = out_dtype == DType::F32;
        float* direct = f32_out ? static_cast<float*>(outs[k]) + i0 : nullptr;
        const float* r =
            trees[k]->eval(leaves[k], i0, len, scratch.data() + base[k], direct, t > t0);
        store(out_dtype, r, outs[k], i0, len);
      }
    }
  };
  if (numel < kParallelMin) {
    run_tiles(0, tiles);
    return;
  }
#pragma omp parallel
  {
    // schedule(static)'s split: contiguous chunks, the first tiles % threads one tile longer.
    const int64_t nt = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t chunk = tiles / nt, extra = tiles % nt;
    const int64_t t0 = id * chunk + std::min(id, extra);
    run_tiles(t0, t0 + chunk + (id < extra ? 1 : 0));
  }
}

void FusedTree::run_rows(const FusedTree& tree, const std::vector<const void*>& leaves,
                         const std::vector<RowStep>& steps) {
  const int64_t row = tree.row_, rows = tree.numel_ / row;
  const int64_t per_tile = tree.tile_ / row;  // whole rows
  const int64_t tiles = (rows + per_tile - 1) / per_tile;
  const int last = static_cast<int>(tree.stage_root_.size()) - 1;
  const NativeFn native = tree.native_.load(std::memory_order_acquire);  // one for the whole run
  // Scratch per thread: the staged tree's, then each per-row tree's own (its one-value leaves'
  // tiles stay filled from tile to tile).
  std::vector<size_t> base{tree.scratch_floats()};
  for (const RowStep& s : steps)
    base.push_back(base.back() + (s.per_row ? s.per_row->scratch_floats() : 0));
  parallel_region(tiles > 1 && tree.numel_ >= kParallelMin, [&] {
    thread_local std::vector<float> scratch;
    if (scratch.size() < base.back()) scratch.resize(base.back());
    std::vector<const float*> reg(static_cast<size_t>(tree.num_regs_));
    bool again = false;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t r0 = t * per_tile, n = std::min(per_tile, rows - r0);
      const int64_t i0 = r0 * row, len = n * row;
      for (size_t k = 0; k < steps.size(); ++k) {
        const RowStep& s = steps[k];
        if (s.per_row) {
          float* dst =
              s.per_row->out_dtype_ == DType::F32 ? static_cast<float*>(s.out) + r0 : nullptr;
          const float* v = s.per_row->eval(s.leaves, r0, n, scratch.data() + base[k], dst, again);
          store(s.per_row->out_dtype_, v, s.out, r0, n);
          continue;
        }
        const size_t begin = s.stage == 0 ? 0 : tree.stage_end_[s.stage - 1];
        // The last stage's f32 values go straight to their output: no later stage reads them
        // from a register, and its root, the stage's last instruction, reads each element
        // before it writes it (an output in place over a leaf, as in run_group()).
        float* direct =
            s.sink == Op::Data && s.stage == last && tree.stage_dtype_[s.stage] == DType::F32
                ? static_cast<float*>(s.out) + i0
                : nullptr;
        const float* v =
            native && tree.stage_coded_[s.stage]
                ? tree.run_native(native, s.stage, leaves, begin, tree.stage_end_[s.stage], nullptr,
                                  reg.data(), i0, len, scratch.data(), direct, again)
                : tree.run(leaves, begin, tree.stage_end_[s.stage], tree.stage_root_[s.stage],
                           nullptr, reg.data(), i0, len, scratch.data(), direct, again);
        if (s.sink != Op::Data)
          reduce_rows_f32(s.sink, v, n, row, static_cast<float*>(s.out) + r0);
        else
          store(tree.stage_dtype_[s.stage], v, s.out, i0, len);
      }
      again = true;
    }
  });
}

}  // namespace lockstep::backends::cpu
