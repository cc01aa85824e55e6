// Fused elementwise trees; see fused.h. Each instruction is a loop over one tile of up to kTile
// floats, so the compiler vectorizes it (an operand that is one value for the whole tree is read
// once, not from a tile of copies); tiles are spread over the OpenMP threads.
#include "backends/cpu/fused.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/cpu/kernels.h"
#include "backends/cpu/vector_math.h"
#include "ir/elementwise.h"
#include "util/check.h"

namespace lockstep::backends::cpu {
namespace {

using ir::Op;

// The dtypes a tree holds: f32, bool (as 0/1) and bf16 (widened exactly; each instruction that
// yields bf16 rounds its tile, as the ref backend rounds each op's result).
bool fusible_dtype(DType d) { return d == DType::F32 || d == DType::Bool || d == DType::BF16; }

// Whether `op` on bf16 (or bool) operands yields bf16 values as they are: no rounding needed.
bool exact_in_bf16(Op op, DType in) {
  if (in != DType::BF16 && in != DType::Bool) return false;
  bool exact = false;
  ir::elementwise::with_fn<float>(op, [&](auto fn) {
    exact = requires { decltype(fn)::kExact; };
  });
  return exact;
}

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

bool fusible(const ir::Graph& g, int32_t id) {
  const ir::GraphNode& n = g.nodes[id];
  // Every elementwise family (`apply` computes each op; conformance runs them all), and
  // broadcasts (a leaf read with zero strides).
  switch (ir::op_info(n.op).family) {
    case ir::OpFamily::Unary:
    case ir::OpFamily::Binary:
    case ir::OpFamily::Comparison:
    case ir::OpFamily::Select:
      break;
    case ir::OpFamily::Movement:
      if (n.op != Op::Expand) return false;
      break;
    case ir::OpFamily::Leaf:
    case ir::OpFamily::Random:
    case ir::OpFamily::Reduction:
    case ir::OpFamily::Index:
    case ir::OpFamily::Contraction:
    case ir::OpFamily::Convolution:
    case ir::OpFamily::Pooling:
    case ir::OpFamily::Collective:
      return false;
  }
  if (!fusible_dtype(n.dtype)) return false;
  for (int32_t o : n.operands)
    if (!fusible_dtype(g.nodes[o].dtype)) return false;
  return true;
}

bool keeps_last_axis(const ir::GraphNode& n) {
  return n.op == Op::Permute && !n.attrs.empty() &&
         n.attrs.back() == static_cast<int64_t>(n.attrs.size()) - 1;
}

bool permute_leaf(const ir::Graph& g, int32_t id) {
  // Runs shorter than this would be read a few values at a time: the copy is better then.
  constexpr int64_t kMinRun = 16;
  const ir::GraphNode& n = g.nodes[id];
  return keeps_last_axis(n) && n.attrs.size() >= 2 && n.shape.back() >= kMinRun &&
         fusible_dtype(n.dtype) && g.nodes[n.operands[0]].dtype == n.dtype;
}

bool blockable(const Shape& s) {
  return s.size() == 4 && s[0] > 0 && s[1] > 0 && s[1] % kBlock == 0 && s[2] * s[3] > 1;
}

FusedTree::FusedTree(const ir::Graph& g, int32_t root, const std::vector<bool>& absorbed,
                     const std::vector<bool>* blocked, bool blocked_order)
    : blocked_order_(blocked_order), blocked_(blocked) {
  const ir::GraphNode& r = g.nodes[root];
  LS_INTERNAL_CHECK(!blocked_order || blockable(r.shape),
                    "blocked order over an unblockable shape");
  numel_ = shape_numel(r.shape);
  out_dtype_ = r.dtype;
  root_reg_ = visit(g, root, absorbed);
  blocked_ = nullptr;
  fold_scaled_sums();
  // A root `where` whose condition is one value: per side, the instructions it needs.
  const Instr& top = instrs_.back();
  if (top.out == root_reg_ && top.op == Op::Where && (top.scalars & kScalarA)) {
    for (const Instr& in : instrs_)
      if (in.op == Op::Data && in.out == top.a) pick_cond_leaf_ = in.a;
    for (int side = 0; side < 2; ++side) {
      std::vector<char> live(num_regs_, 0);
      live[side == 0 ? top.b : top.c] = 1;
      pick_needs_[side].assign(instrs_.size(), 0);
      for (size_t i = instrs_.size() - 1; i-- > 0;) {
        const Instr& in = instrs_[i];
        if (!live[in.out]) continue;
        pick_needs_[side][i] = 1;
        if (in.op == Op::Data) continue;  // its `a` is a leaf, not a register
        for (int o : {in.a, in.b, in.c, in.sa, in.sb})
          if (o >= 0) live[o] = 1;
      }
    }
  }
  assign_slots();
}

FusedTree::FusedTree(const ir::Graph& g, const std::vector<int32_t>& roots,
                     const std::vector<bool>& computed, const std::vector<bool>& absorbed,
                     int64_t row)
    : row_(row) {
  LS_INTERNAL_CHECK(!roots.empty() && row > 0 && row <= kTile, "a staged tree needs short rows");
  numel_ = shape_numel(g.nodes[roots[0]].shape);
  LS_INTERNAL_CHECK(numel_ % row == 0, "a staged tree's values are whole rows");
  for (size_t k = 0; k < roots.size(); ++k) {
    LS_INTERNAL_CHECK(shape_numel(g.nodes[roots[k]].shape) == numel_, "stages of one size");
    const size_t first = instrs_.size();
    const int32_t r = roots[k];
    if (computed[k])
      stage_root_.push_back(visit(g, r, absorbed));
    else if (const auto it = reg_of_.find(r); it != reg_of_.end())  // an earlier stage's value
      stage_root_.push_back(it->second);
    else
      stage_root_.push_back(reg_of_[r] = add_leaf(g, r, g.nodes[r].shape));
    stage_dtype_.push_back(g.nodes[roots[k]].dtype);
    for (size_t i = first; i < instrs_.size(); ++i) instrs_[i].stage = static_cast<int>(k);
  }
  out_dtype_ = stage_dtype_.back();
  root_reg_ = stage_root_.back();
  fold_scaled_sums();
  stage_end_.assign(roots.size(), 0);
  for (const Instr& in : instrs_) ++stage_end_[in.stage];
  for (size_t k = 1; k < roots.size(); ++k) stage_end_[k] += stage_end_[k - 1];
  assign_slots();
}

void FusedTree::assign_slots() {
  constexpr int kKeptScalars = 32;
  const size_t n = instrs_.size();
  // A widening cast and a `where` of one condition pass an operand's tile on as their value.
  auto passes_on = [](const Instr& in) {
    return (in.op == Op::Where && (in.scalars & kScalarA)) ||
           (in.op == Op::Cast && in.in_dtype == DType::BF16 && in.out_dtype == DType::F32);
  };
  // Per register: the last instruction that reads it (n: the result, read after the last).
  std::vector<size_t> last(num_regs_, 0);
  for (size_t i = 0; i < n; ++i) {
    const Instr& in = instrs_[i];
    last[in.out] = std::max(last[in.out], i);
    if (in.op != Op::Data)
      for (int r : {in.a, in.b, in.c, in.sa, in.sb})
        if (r >= 0) last[r] = std::max(last[r], i);
  }
  last[root_reg_] = n;
  // A stage's result lives until its stage's values are stored or reduced, after its last
  // instruction.
  for (size_t k = 0; k < stage_root_.size(); ++k)
    if (stage_end_[k] > 0) last[stage_root_[k]] = std::max(last[stage_root_[k]], stage_end_[k] - 1);
  if (pick_cond_leaf_ >= 0) last[instrs_.back().b] = last[instrs_.back().c] = n;
  for (size_t i = n; i-- > 0;) {  // a tile passed on lives as long as the value it became
    const Instr& in = instrs_[i];
    if (!passes_on(in)) continue;
    for (int r : {in.op == Op::Where ? in.b : in.a, in.op == Op::Where ? in.c : -1})
      if (r >= 0) last[r] = std::max(last[r], last[in.out]);
  }
  std::vector<int> free_slots;
  std::vector<std::vector<int>> free_after(n + 1);
  int kept = 0;
  num_slots_ = 0;
  for (size_t i = 0; i < n; ++i) {
    Instr& in = instrs_[i];
    if (!passes_on(in)) {
      // A kept tile is its leaf's alone for the whole tree: the instructions before it reuse
      // theirs on the next tile too.
      in.kept = in.op == Op::Data && scalar_reg_[in.out] && kept < kKeptScalars;
      if (in.kept || free_slots.empty()) {
        in.slot = num_slots_++;
      } else {
        in.slot = free_slots.back();
        free_slots.pop_back();
      }
      if (in.kept)
        ++kept;
      else
        free_after[last[in.out]].push_back(in.slot);
    }
    for (int slot : free_after[i]) free_slots.push_back(slot);
  }
}

void FusedTree::fold_scaled_sums() {
  std::vector<int> uses(num_regs_, 0), producer(num_regs_, -1);
  ++uses[root_reg_];
  for (int r : stage_root_) ++uses[r];
  for (size_t i = 0; i < instrs_.size(); ++i) {
    const Instr& in = instrs_[i];
    producer[in.out] = static_cast<int>(i);
    if (in.op != Op::Data)
      for (int o : {in.a, in.b, in.c})
        if (o >= 0) ++uses[o];
  }
  std::vector<char> folded(instrs_.size(), 0);
  auto f32 = [](const Instr& in) {
    return in.in_dtype == DType::F32 && in.out_dtype == DType::F32;
  };
  for (Instr& in : instrs_) {
    if ((in.op != Op::Add && in.op != Op::Sub) || !f32(in) || in.scalars != 0) continue;
    // Operand r, if a multiply that nothing else reads: read its tile operand instead, scaled
    // by its other operand (one value, or a tile).
    auto fold = [&](int& r, int& scale) {
      const int p = producer[r];
      if (p < 0 || uses[r] != 1 || folded[p]) return;
      const Instr& m = instrs_[p];
      if (m.op != Op::Mul || !f32(m)) return;
      if (m.scalars == kScalarA) {  // scaled by one value, whichever side it is on
        r = m.b;
        scale = m.a;
      } else if (m.scalars == kScalarB || m.scalars == 0) {  // or element by element
        r = m.a;
        scale = m.b;
      } else {
        return;
      }
      folded[p] = 1;
    };
    fold(in.a, in.sa);
    fold(in.b, in.sb);
  }
  // A relu whose operand is such a sum (of two tiles, scaled or not) that nothing else reads:
  // applied by the sum as it stores (the sum takes over the relu's register). Also an unscaled
  // bf16 sum, rounded after the relu: rounding to nearest keeps signs and zero, so it commutes
  // with the relu.
  auto bf16 = [](const Instr& in) {
    return in.in_dtype == DType::BF16 && in.out_dtype == DType::BF16;
  };
  for (size_t i = 0; i < instrs_.size(); ++i) {
    const Instr& r = instrs_[i];
    if (r.op != Op::Relu || !(f32(r) || bf16(r)) || uses[r.a] != 1 || producer[r.a] < 0) continue;
    Instr& sum = instrs_[producer[r.a]];
    const bool same = f32(r) ? f32(sum) : bf16(sum) && sum.sa < 0 && sum.sb < 0;
    if ((sum.op != Op::Add && sum.op != Op::Sub) || !same || sum.scalars != 0 || sum.relu) continue;
    sum.relu = true;
    sum.out = r.out;
    folded[i] = 1;
  }
  std::vector<Instr> kept;
  for (size_t i = 0; i < instrs_.size(); ++i)
    if (!folded[i]) kept.push_back(instrs_[i]);
  instrs_ = std::move(kept);
}

int FusedTree::visit(const ir::Graph& g, int32_t root, const std::vector<bool>& absorbed) {
  // A post-order walk, operands in order, as a loop: a tree is as deep as the chain of
  // elementwise ops it fuses, and 100,000 adds in a row must not overflow the stack. A value
  // read from outside the tree (or a broadcast) is a leaf; a value met again reuses its register.
  auto leaf = [&](int32_t id, bool is_root) -> int {  // its register, or -1: an instruction
    const ir::GraphNode& n = g.nodes[id];
    if (!is_root && !absorbed[id]) return reg_of_[id] = add_leaf(g, id, n.shape);
    if (n.op == Op::Expand) return reg_of_[id] = add_leaf(g, n.operands[0], n.shape);
    if (n.op == Op::Permute) return reg_of_[id] = add_leaf(g, n.operands[0], n.shape, &n.attrs);
    return -1;
  };
  if (auto it = reg_of_.find(root); it != reg_of_.end()) return it->second;
  if (const int reg = leaf(root, true); reg >= 0) return reg;
  std::vector<std::pair<int32_t, size_t>> stack{{root, 0}};  // a node, its next operand
  while (!stack.empty()) {
    const int32_t id = stack.back().first;
    const ir::GraphNode& n = g.nodes[id];
    const size_t arity = std::min<size_t>(n.operands.size(), 3);
    if (stack.back().second < arity) {
      const int32_t o = n.operands[stack.back().second++];
      if (!reg_of_.count(o) && leaf(o, false) < 0) stack.push_back({o, 0});
      continue;
    }
    Instr in{n.op, -1, -1, -1, -1, 0, g.nodes[n.operands[0]].dtype, n.dtype};
    if (arity > 0) in.a = reg_of_.at(n.operands[0]);
    if (arity > 1) in.b = reg_of_.at(n.operands[1]);
    if (arity > 2) in.c = reg_of_.at(n.operands[2]);
    in.scalars = (in.a >= 0 && scalar_reg_[in.a] ? kScalarA : 0u) |
                 (in.b >= 0 && scalar_reg_[in.b] ? kScalarB : 0u);
    in.out = num_regs_++;
    scalar_reg_.push_back(0);
    instrs_.push_back(in);
    reg_of_[id] = in.out;
    stack.pop_back();
  }
  return reg_of_.at(root);
}

int FusedTree::add_leaf(const ir::Graph& g, int32_t node, const Shape& out_shape,
                        const std::vector<int64_t>* perm) {
  const ir::GraphNode& src = g.nodes[node];
  Leaf leaf;
  leaf.dtype = src.dtype;
  leaf.numel = shape_numel(src.shape);
  leaf.permuted = perm != nullptr;
  // A blocked value is only read whole, by a tree in blocked order (choose_layouts).
  const bool src_blocked = blocked_ && (*blocked_)[node];
  LS_INTERNAL_CHECK(!src_blocked || (!perm && blocked_order_ && src.shape == out_shape),
                    "a blocked value read in plain order, through a broadcast or a permute");
  leaf.contiguous =
      src_blocked || (!perm && !blocked_order_ && (src.shape == out_shape || leaf.numel == numel_));
  if (leaf.numel == 1) {
    leaf.contiguous = numel_ == 1;
  } else if (!leaf.contiguous) {
    // The source's stride along each output dim: src aligned to the right of out_shape, size-1
    // (broadcast) dims stride 0; through a permute, output dim d is source dim perm[d].
    const size_t r = out_shape.size(), lead = r - src.shape.size();
    std::vector<int64_t> size(out_shape.begin(), out_shape.end()), stride(r, 0);
    int64_t acc = 1;
    for (size_t d = r; d-- > lead;) {
      if (src.shape[d - lead] != 1) stride[d] = acc;
      acc *= src.shape[d - lead];
    }
    if (perm) {
      const std::vector<int64_t> own = stride;
      for (size_t d = 0; d < r; ++d) stride[d] = own[(*perm)[d]];  // (0 for size-1 dims)
    }
    if (blocked_order_) {
      // Walked as [N, C/16, H, W, 16]: the channel dim as blocks of 16 and the channel within.
      const int64_t cb = size[1] / kBlock;
      size = {size[0], cb, size[2], size[3], kBlock};
      stride = {stride[0], kBlock * stride[1], stride[2], stride[3], stride[1]};
    }
    // Dims whose source stride is 0 (broadcast) contribute nothing and are skipped.
    int64_t out_stride = 1;
    for (size_t d = size.size(); d-- > 0;) {
      if (stride[d] != 0 && size[d] > 1) {
        leaf.div.push_back(out_stride);
        leaf.mod.push_back(size[d]);
        leaf.stride.push_back(stride[d]);
      }
      out_stride *= size[d];
    }
    // Neighbouring dims that are neighbours in the source too are one dim ([N, C, 1, 1] into
    // [N, C, H, W]: runs of H * W copies of consecutive values).
    merge_dims(leaf.div, leaf.mod, leaf.stride);
    if (leaf.div.size() == 1 && leaf.div[0] == 1 && leaf.stride[0] == 1 && leaf.mod[0] == numel_) {
      leaf.contiguous = true;  // same order after all (e.g. [1, C, H, W] as [C, H, W])
      leaf.div.clear();
      leaf.mod.clear();
      leaf.stride.clear();
    } else if (leaf.div.size() == 1 && leaf.div[0] > 1 && leaf.div[0] <= kShortRun &&
               leaf.div[0] * leaf.mod[0] <= kMaxPeriod && leaf.div[0] * leaf.mod[0] < numel_) {
      // (A period as long as the tree would be the whole broadcast written out by one thread
      // before the pass: read run by run instead.)
      leaf.period = leaf.div[0] * leaf.mod[0];
    } else if (blocked_order_ && leaf.div.size() == 2 && leaf.div[0] == 1 &&
               leaf.mod[0] == kBlock && leaf.stride[0] == 1 && leaf.div[1] % kBlock == 0) {
      // Blocks of 16 consecutive values, each block for div[1] values in a row: a per-channel
      // value (or [N, C, 1, 1]) in blocked order. Runs shorter than a tile (maps of 2x2 or
      // 4x4) are read from one period written out in full, which is then smaller than a
      // tile-long row per block, and longer ones from that per-block table.
      const int64_t period = leaf.div[1] * leaf.mod[1];
      if (leaf.div[1] < kTile && period <= kMaxPeriod && period < numel_)
        leaf.period = period;
      else if (leaf.mod[1] * kTile <= kMaxPeriod)
        leaf.per_block = true;
    }
  }
  leaves_.push_back(std::move(leaf));
  leaf_nodes_.push_back(node);
  const int reg = num_regs_++;
  scalar_reg_.push_back(leaves_.back().numel == 1 && numel_ != 1);
  // Leaves are loaded into registers 0..; remember the mapping by order of leaves_.
  instrs_.push_back(
      {Op::Data, reg, static_cast<int>(leaves_.size() - 1), -1, -1, 0, src.dtype, src.dtype});
  return reg;
}

std::vector<const void*> FusedTree::bind(const std::vector<void*>& ptr,
                                         RunBuffers& expanded) const {
  std::vector<const void*> out;
  out.reserve(leaves_.size());
  for (size_t k = 0; k < leaves_.size(); ++k) {
    const Leaf& leaf = leaves_[k];
    const void* p = ptr[leaf_nodes_[k]];
    if (leaf.period > 0) {
      float* e = expanded.take(leaf.period);
      load_source(leaf, p, 0, leaf.period, e);
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

// An op by its formula (ir/elementwise.h) over a tile; bool values are 0/1 floats, which every
// formula that admits bool computes on alike. One function per op, each with its AVX-512 and AVX2
// clones, so that every loop vectorizes (inside one function holding all the ops, GCC 12 left a
// third of them scalar).
// A formula's result as a float: a predicate's as a select of 1 or 0, which vectorizes into a
// masked blend (GCC 12 leaves a bool converted to float scalar).
template <typename R>
__attribute__((always_inline)) inline float as_float(R r) {
  if constexpr (std::is_same_v<R, bool>)
    return r ? 1.0f : 0.0f;
  else
    return r;
}

template <typename Fn>
LOCKSTEP_TARGET_CLONES void apply_formula(int64_t len, float* y, const float* a, const float* b,
                                          const float* c, unsigned scalars) {
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
  // Every other op by its formula, inlined into each clone's loop so that it vectorizes.
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
  if (pick_cond_leaf_ >= 0) {
    const void* c = leaf_ptrs[pick_cond_leaf_];
    const bool yes = read_value(leaves_[pick_cond_leaf_].dtype, c, 0) != 0.0f;
    result = yes ? instrs_.back().b : instrs_.back().c;
    needs = pick_needs_[yes ? 0 : 1].data();
  }
  return run(leaf_ptrs, 0, instrs_.size(), result, needs, reg, i0, len, scratch, dst,
             scalars_loaded);
}

const float* FusedTree::run(const std::vector<const void*>& leaf_ptrs, size_t begin, size_t end,
                            int result, const char* needs, const float** reg, int64_t i0,
                            int64_t len, float* scratch, float* dst, bool scalars_loaded) const {
  for (size_t i = begin; i < end; ++i) {
    if (needs && !needs[i]) continue;
    const Instr& in = instrs_[i];
    float* own = scratch + static_cast<int64_t>(in.slot) * kTile;
    if (in.op == Op::Data) {
      const Leaf& leaf = leaves_[in.a];
      if (leaf.contiguous && leaf.dtype == DType::F32 && leaf.numel != 1) {
        reg[in.out] = static_cast<const float*>(leaf_ptrs[in.a]) + i0;
      } else if (leaf.period > 0 && i0 % leaf.period + len <= leaf.period) {
        reg[in.out] = static_cast<const float*>(leaf_ptrs[in.a]) + i0 % leaf.period;
      } else if (leaf.per_block && i0 % kBlock == 0 &&
                 i0 % leaf.div[1] + len <= leaf.div[1]) {  // within one block's run
        reg[in.out] =
            static_cast<const float*>(leaf_ptrs[in.a]) + i0 / leaf.div[1] % leaf.mod[1] * kTile;
      } else if (leaf.numel == 1) {  // a tile of the one value, filled once per scratch
        // A kept tile is filled whole, for every later call whatever its length.
        if (!scalars_loaded || !in.kept) load(leaf, leaf_ptrs[in.a], 0, in.kept ? kTile : len, own);
        reg[in.out] = own;
      } else {
        load(leaf, leaf_ptrs[in.a], i0, len, own);
        reg[in.out] = own;
      }
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

std::string FusedTree::describe() const {
  std::string s;
  for (const Instr& in : instrs_) {
    if (in.op == Op::Data) continue;
    s += util::cat(ir::op_info(in.op).name, "(");
    for (int r : {in.a, in.b, in.c}) {
      if (r < 0) continue;
      s += util::cat(r == in.a ? "" : ",", "r", r);
      const int scale = r == in.a ? in.sa : r == in.b ? in.sb : -1;
      if (scale >= 0) s += util::cat("*r", scale);
    }
    s += util::cat(")", in.relu ? "+relu" : "", "->r", in.out, " ");
  }
  return s;
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
  const int64_t per_tile = kTile / row;  // whole rows
  const int64_t tiles = (rows + per_tile - 1) / per_tile;
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
        const float* v =
            tree.run(leaves, begin, tree.stage_end_[s.stage], tree.stage_root_[s.stage], nullptr,
                     reg.data(), i0, len, scratch.data(), nullptr, again);
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
