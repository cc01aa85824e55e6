// Fused elementwise trees, their building: which nodes fuse, the tree's instructions, registers
// and leaves (see fused.h). Not here: evaluating a tree over tiles (fused_eval.cpp).
#include "backends/cpu/fused.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/cpu/kernels.h"
#include "util/check.h"

namespace lockstep::backends::cpu {
namespace {

using ir::Op;

// The dtypes a tree holds: f32, bool (as 0/1) and bf16 (widened exactly; each instruction that
// yields bf16 rounds its tile, as the ref backend rounds each op's result).
bool fusible_dtype(DType d) { return d == DType::F32 || d == DType::Bool || d == DType::BF16; }

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
    case ir::OpFamily::Recurrent:
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

bool swaps_last_two(const ir::GraphNode& n) {
  if (n.op != Op::Permute || n.attrs.size() < 2) return false;
  const size_t r = n.attrs.size();
  for (size_t i = 0; i + 2 < r; ++i)
    if (n.attrs[i] != static_cast<int64_t>(i)) return false;
  return n.attrs[r - 2] == static_cast<int64_t>(r - 1) &&
         n.attrs[r - 1] == static_cast<int64_t>(r - 2);
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
    : tile_(kRowTile), row_(row) {
  LS_INTERNAL_CHECK(!roots.empty() && row > 0 && row <= kRowTile, "a staged tree needs short rows");
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
  native_loads_ = 0;
  for (Instr& in : instrs_)
    if (in.op == Op::Data) in.native_slot = in.kept ? in.slot : num_slots_ + native_loads_++;
  // A staged tree's stages under native code: which have code, and where their exports go.
  std::vector<int> slot_of(num_regs_, -1);
  for (const Instr& in : instrs_) slot_of[in.out] = in.slot;
  stage_coded_.assign(stage_root_.size(), 0);
  stage_exports_.assign(stage_root_.size(), {});
  native_out_ = num_slots_ + native_loads_;
  for (size_t k = 0; k < stage_root_.size(); ++k) {
    for (size_t i = k == 0 ? 0 : stage_end_[k - 1]; i < stage_end_[k]; ++i)
      stage_coded_[k] |= instrs_[i].op != Op::Data;
    // (A value the interpreter passes on from an operand's tile has no tile of its own: it
    // gets one.)
    for (int r : native_exports(k))
      stage_exports_[k].push_back({r, slot_of[r] >= 0 ? slot_of[r] : native_out_++});
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
    } else if (leaf.div.size() == 1 && leaf.div[0] == 1 && leaf.mod[0] < numel_ &&
               (row_ > 0 ? row_ : tile_) % leaf.mod[0] == 0) {
      // A run repeated along the outer dims (a bias or a layer norm's weight over rows) whose
      // length divides where tiles start (a tile, or a staged tree's row): read from a tile's
      // worth of copies in place, instead of copied run by run into each tile.
      leaf.period = leaf.mod[0];
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
  if (leaf.period > 0) leaf.expanded = leaf.period * std::max<int64_t>(1, tile_ / leaf.period);
  leaves_.push_back(std::move(leaf));
  leaf_nodes_.push_back(node);
  const int reg = num_regs_++;
  scalar_reg_.push_back(leaves_.back().numel == 1 && numel_ != 1);
  // Leaves are loaded into registers 0..; remember the mapping by order of leaves_.
  instrs_.push_back(
      {Op::Data, reg, static_cast<int>(leaves_.size() - 1), -1, -1, 0, src.dtype, src.dtype});
  return reg;
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

}  // namespace lockstep::backends::cpu
