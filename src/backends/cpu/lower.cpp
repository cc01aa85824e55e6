// The lowering pass: the kernel that runs each node the plan computes at run time, a step each:
// fused elementwise trees and reductions over them, oneDNN matmuls, convolutions and average
// pooling, our own reductions, max pooling and strided copies, index kernels, and the kernels for
// every dtype (typed_kernels.h) for the rest. Also the kernels other cpu passes rebuild steps with.
#include <algorithm>
#include <cstring>
#include <span>
#include <string>

#include "backends/cpu/index_kernels.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/matmul.h"
#include "backends/cpu/passes.h"
#include "backends/cpu/typed_kernels.h"
#include "backends/ref/ref_kernels.h"
#include "dist/comm.h"
#include "ir/attrs.h"
#include "runtime/metrics.h"
#include "util/check.h"

namespace lockstep::backends::cpu {

using ir::Op;
using plan::bytes_of;

namespace {

// Reductions whose contiguous runs are at least this long walk the runs; shorter ones (sums over
// small feature maps) go by tiles of the input instead.
constexpr int64_t kLongRun = 512;

// A Permute that swaps the last two axes and nothing else.
bool is_last_two_swap(const ir::GraphNode& n) {
  if (n.op != Op::Permute || n.attrs.size() < 2) return false;
  const size_t r = n.attrs.size();
  for (size_t i = 0; i + 2 < r; ++i)
    if (n.attrs[i] != static_cast<int64_t>(i)) return false;
  return n.attrs[r - 2] == static_cast<int64_t>(r - 1) &&
         n.attrs[r - 1] == static_cast<int64_t>(r - 2);
}

// Whether oneDNN takes this convolution: its right padding (what makes oneDNN's output size
// PyTorch's floor formula) must not skip more than a stride's worth of input.
bool dnnl_conv_fits(const ir::Graph& g, int32_t id) {
  const ir::GraphNode& n = g.nodes[id];
  const Shape& x = n.op == Op::Conv2dBackwardInput ? n.shape : g.nodes[n.operands[0]].shape;
  const Shape& w = n.op == Op::Conv2dBackwardWeight ? n.shape : g.nodes[n.operands[1]].shape;
  const Shape& y = n.op == Op::Conv2d                ? n.shape
                   : n.op == Op::Conv2dBackwardInput ? g.nodes[n.operands[0]].shape
                                                     : g.nodes[n.operands[1]].shape;
  const ir::ConvAttrs a = ir::ConvAttrs::of(n.attrs);
  for (int d = 0; d < 2; ++d) {
    const int64_t extent = (w[2 + d] - 1) * a.dilation[d] + 1;
    const int64_t pad_r = (y[2 + d] - 1) * a.stride[d] + extent - x[2 + d] - a.padding[d];
    // A negative right padding (input rows a stride skips at the end) is fine: oneDNN just
    // does not read them. Padding beyond "same" is fine too: the crashes once seen with it
    // (groups 2, dilation 2, padding 2 on a 2-tap kernel) came from oneDNN's thread-bound
    // scratchpad (see dnnl_ops.cpp), and the conformance suite covers such shapes.
    if (pad_r < -(a.stride[d] - 1)) return false;
  }
  return true;
}
// The forward pooling's input and output shapes, for an average pooling or its backward.
const Shape& pool_input(const ir::Graph& g, const ir::GraphNode& n) {
  return n.op == Op::AvgPool2dBackward ? n.shape : g.nodes[n.operands[0]].shape;
}
const Shape& pool_output(const ir::Graph& g, const ir::GraphNode& n) {
  return n.op == Op::AvgPool2dBackward ? g.nodes[n.operands[0]].shape : n.shape;
}
// Whether a matmul's right-hand operand is one matrix for its whole batch ([1..., K, N]).
bool shared_right(const ir::Graph& g, const ir::GraphNode& mm) {
  const Shape& b = g.nodes[mm.operands[1]].shape;
  if (mm.shape.size() < 3) return false;
  for (size_t d = 0; d + 2 < b.size(); ++d)
    if (b[d] != 1) return false;
  return true;
}

// A last-two-axes transpose, or a permute that keeps the last axis, of an f32 or bf16 matmul that
// nothing else reads: the matmul writes the permuted layout itself.
bool transposed_matmul(const plan::Plan& p, int32_t id) {
  const ir::GraphNode& n = p.graph.nodes[id];
  if (!(is_last_two_swap(n) || keeps_last_axis(n)) ||
      (n.dtype != DType::F32 && n.dtype != DType::BF16) || shape_numel(n.shape) == 0)
    return false;
  const int32_t m = n.operands[0];
  const ir::GraphNode& mm = p.graph.nodes[m];
  if (mm.op != Op::MatMul || p.is_output[m] || p.consumers[m].size() != 1 || !p.run_time[m])
    return false;
  // A batch over one right-hand matrix folds into one product instead (fold_matmul_batch), worth
  // more than the permute's copy.
  if (!is_last_two_swap(n) && shared_right(p.graph, mm)) return false;
  for (int32_t o : mm.operands)
    if (p.graph.nodes[o].dtype != n.dtype || shape_numel(p.graph.nodes[o].shape) == 0) return false;
  return true;
}

// Indices of a max pooling gradient that the same pooling's max_pool2d_with_indices computed.
bool pooling_indices(const ir::Graph& g, const ir::GraphNode& n) {
  if (n.op != Op::MaxPool2dBackward) return false;
  const ir::GraphNode& i = g.nodes[n.operands[1]];
  return i.op == Op::MaxPool2dIndices && i.attrs == n.attrs &&
         g.nodes[i.operands[0]].shape == n.shape;
}

}  // namespace

std::shared_ptr<plan::StepPayload> CpuStep::take_check() {
  if (!check) return nullptr;
  auto c = std::make_shared<CpuStep>();
  c->run = std::move(check);
  check = nullptr;
  return c;
}

bool is_f32(const ir::Graph& g, int32_t id) { return g.nodes[id].dtype == DType::F32; }

bool bf16_sum(const ir::Graph& g, int32_t id) {
  const ir::GraphNode& n = g.nodes[id];
  if (n.op != Op::Sum || shape_numel(n.shape) == 0) return false;
  const ir::GraphNode& x = g.nodes[n.operands[0]];
  auto ok = [](DType d) { return d == DType::F32 || d == DType::BF16; };
  return ok(n.dtype) && ok(x.dtype) && (n.dtype == DType::BF16 || x.dtype == DType::BF16) &&
         shape_numel(x.shape) > 0;
}

bool all_f32(const ir::Graph& g, int32_t id) {
  const ir::GraphNode& n = g.nodes[id];
  for (int32_t o : n.operands)
    if (!is_f32(g, o) || shape_numel(g.nodes[o].shape) == 0) return false;
  return is_f32(g, id) && shape_numel(n.shape) > 0;
}
bool all_bf16(const ir::Graph& g, int32_t id) {
  const ir::GraphNode& n = g.nodes[id];
  for (int32_t o : n.operands)
    if (g.nodes[o].dtype != DType::BF16 || shape_numel(g.nodes[o].shape) == 0) return false;
  return n.dtype == DType::BF16 && shape_numel(n.shape) > 0;
}
bool dnnl_conv(const ir::Graph& g, int32_t id) {
  const Op op = g.nodes[id].op;
  return (op == Op::Conv2d || op == Op::Conv2dBackwardInput || op == Op::Conv2dBackwardWeight) &&
         (all_f32(g, id) || all_bf16(g, id)) && dnnl_conv_fits(g, id);
}
bool blockable_pool(const ir::Graph& g, int32_t id) {
  const ir::GraphNode& n = g.nodes[id];
  if (n.op != Op::MaxPool2d && n.op != Op::MaxPool2dIndices && n.op != Op::MaxPool2dBackward)
    return false;
  const ir::GraphNode& x = g.nodes[n.operands[0]];  // the input, or the output gradient
  if (x.dtype != DType::F32 && x.dtype != DType::BF16) return false;
  if (n.dtype != (n.op == Op::MaxPool2dIndices ? DType::I64 : x.dtype)) return false;
  if (!blockable(x.shape) || !blockable(n.shape)) return false;
  return n.op != Op::MaxPool2dBackward || g.nodes[n.operands[1]].dtype == DType::I64;
}
bool sum_takes_blocked(const Shape& in, const std::vector<int64_t>& attrs) {
  if (!blockable(in)) return false;
  bool reduced[4] = {false, false, false, false};
  for (size_t i = 1; i < attrs.size(); ++i) reduced[attrs[i]] = true;
  return reduced[1] || (reduced[2] && reduced[3]);
}
std::pair<Shape, std::vector<int64_t>> blocked_sum(const Shape& in,
                                                   const std::vector<int64_t>& attrs) {
  const Shape in5{in[0], in[1] / kBlock, in[2], in[3], kBlock};
  std::vector<int64_t> a5{attrs[0]};
  for (size_t i = 1; i < attrs.size(); ++i) {
    a5.push_back(attrs[i]);
    if (attrs[i] == 1) a5.push_back(4);
  }
  std::sort(a5.begin() + 1, a5.end());
  return {in5, a5};
}

CpuDecisions& decisions(plan::Plan& p) {
  if (!p.decisions) p.decisions = std::make_shared<CpuDecisions>(p.graph.nodes.size());
  return static_cast<CpuDecisions&>(*p.decisions);
}

std::vector<bool> blocked_values(const plan::Plan& p) {
  if (!p.decisions) return std::vector<bool>(p.graph.nodes.size(), false);
  return static_cast<const CpuDecisions&>(*p.decisions).blocked;
}

std::string CpuDecisions::describe(int32_t node) const {
  std::string what;
  if (blocked[node]) what += " nChw16c";
  if (walk_blocked[node]) what += " walks-nChw16c";
  if (winograd[node]) what += " winograd";
  return what;
}
const char* CpuDecisions::mark(int32_t value) const { return blocked[value] ? "(nChw16c)" : ""; }
const char* CpuDecisions::step_mark(int32_t node) const {
  return walk_blocked[node] ? "(nChw16c)" : mark(node);
}

std::vector<plan::Member> members_of(const FusedMembers& fused) {
  std::vector<plan::Member> out;
  for (const auto& [node, tree] : fused) {
    plan::Member m;
    m.node = node;
    m.reads = tree->leaf_nodes();
    for (size_t l = 0; l < tree->leaf_nodes().size(); ++l)
      if (tree->leaf_is_elementwise(l)) m.elementwise_reads.push_back(tree->leaf_nodes()[l]);
    out.push_back(std::move(m));
  }
  return out;
}

std::function<void(Ctx&)> run_conv_step(std::shared_ptr<DnnlConv> conv, int32_t x, int32_t y,
                                        int32_t id, std::pair<int64_t, bool> copy0,
                                        std::pair<int64_t, bool> copy1) {
  return [=](Ctx& c) {
    auto place = [&](std::pair<int64_t, bool> p) {
      DnnlConv::Copy copy;
      if (p.first >= 0 && p.second) copy.keep = c.copies + p.first;
      if (p.first >= 0 && !p.second) copy.ready = c.copies + p.first;
      return copy;
    };
    conv->run(c.ptr[x], c.ptr[y], c.ptr[id], place(copy0), place(copy1));
  };
}
// Runs the trees of a fused step, tile by tile.
std::function<void(Ctx&)> run_fused(std::shared_ptr<const FusedMembers> members) {
  return [members](Ctx& c) {
    std::vector<const FusedTree*> trees;
    std::vector<std::vector<const void*>> leaves;
    RunBuffers expanded;
    std::vector<void*> outs;
    for (const auto& [node, tree] : *members) {
      trees.push_back(tree.get());
      leaves.push_back(tree->bind(c.ptr, expanded));
      outs.push_back(c.ptr[node]);
    }
    FusedTree::run_group(trees, leaves, outs);
  };
}

// Computes sums that share one input layout: short runs (sums over small feature maps) by tiles
// of the input, long ones walked run by run.
std::function<void(Ctx&)> run_sums(SumParts parts) {
  const ReduceLayout layout = reduce_layout(parts[0].second->in, parts[0].second->attrs);
  const ReduceMap map = reduce_map(parts[0].second->in, parts[0].second->attrs);
  size_t tmp_floats = 0;
  for (const auto& [node, of] : parts) {
    if (of->tree) tmp_floats = std::max(tmp_floats, of->tree->scratch_floats());
    if (!of->tree && of->input_dtype == DType::BF16)
      tmp_floats = std::max<size_t>(tmp_floats, kTile);
  }
  return [parts = std::move(parts), layout, map, tmp_floats](Ctx& c) {
    std::vector<std::vector<const void*>> leaves(parts.size());
    RunBuffers expanded;
    std::vector<float*> outs;
    // bf16 sums are computed in f32 here, then rounded into their outputs.
    std::vector<std::vector<float>> staged(parts.size());
    for (size_t k = 0; k < parts.size(); ++k) {
      const SumOf& of = *parts[k].second;
      if (of.tree) leaves[k] = of.tree->bind(c.ptr, expanded);
      if (of.bf16_out) {
        staged[k].resize(static_cast<size_t>(map.out_size));
        outs.push_back(staged[k].data());
      } else {
        outs.push_back(static_cast<float*>(c.ptr[parts[k].first]));
      }
    }
    auto read = [&](size_t k, int64_t off, int64_t len, float* tmp, bool again) -> const float* {
      const SumOf& of = *parts[k].second;
      if (!of.tree && of.input_dtype == DType::BF16) {
        bf16_to_f32(static_cast<const uint16_t*>(c.ptr[of.input]) + off, len, tmp);
        return tmp;
      }
      if (!of.tree) return static_cast<const float*>(c.ptr[of.input]) + off;
      of.tree->prefetch(leaves[k], off, len);
      return of.tree->eval(leaves[k], off, len, tmp, nullptr, again);
    };
    if (layout.inner < kLongRun)
      sum_tiles_f32(map, parts.size(), read, outs, tmp_floats);
    else
      sum_multi_f32(layout, parts.size(), read, outs, tmp_floats);
    for (size_t k = 0; k < parts.size(); ++k)
      if (parts[k].second->bf16_out)
        f32_to_bf16(staged[k].data(), map.out_size, static_cast<uint16_t*>(c.ptr[parts[k].first]));
  };
}
namespace {

// What a lowering rule sees: the plan, the node, and the step it fills in.
struct Lowering {
  plan::Plan& p;
  const std::vector<bool>& mask;  // per value: held blocked
  const int32_t id;
  const ir::GraphNode& n;
  plan::Step& step;
  CpuStep& cs;
  const bool f32;      // the node computes f32 values
  int32_t index = -1;  // the value an indexed op's kernel reads its indices from (its check's)

  const ir::GraphNode& node(int32_t value) const { return p.graph.nodes[value]; }
  const ir::GraphNode& operand(size_t k) const { return node(n.operands[k]); }
};

// Elementwise trees, fused into one pass over tiles (fused.cpp).
bool fused_applies(const Lowering& l) { return fusible(l.p.graph, l.id); }
void lower_fused(Lowering& l) {
  auto tree = std::make_shared<FusedTree>(l.p.graph, l.id, l.p.absorbed, &l.mask, l.mask[l.id]);
  l.step.reads = tree->leaf_nodes();
  l.step.label = "fused";
  l.step.detail = tree->describe();
  l.cs.fused = std::make_shared<FusedMembers>(1, std::make_pair(l.id, tree));
  l.step.kind = plan::StepKind::Elementwise;
  l.step.members = members_of(*l.cs.fused);
  l.cs.run = run_fused(l.cs.fused);
}

// A batch of products with one right-hand matrix ([P..., M, K] x [1..., K, N]: a linear layer
// applied to [B, T, D], and its input gradient) is one product of [P M, K] by [K, N] when the
// left operand's rows lie contiguously across the batch: the output [P..., M, N] is the same
// memory. oneDNN would otherwise run P small products with the right-hand matrix reread for
// each (measured on a GPT's [64, 32, 128] x [1, 128, 128]: 1.5-9 ms against ~0.5 ms).
void fold_matmul_batch(Shape (&shape)[2], std::vector<int64_t> (&strides)[2], Shape& out) {
  const size_t r = shape[0].size();
  if (r < 3 || out.size() != r) return;
  for (size_t d = 0; d + 2 < shape[1].size(); ++d)
    if (shape[1][d] != 1) return;
  if (strides[0] != ref::strides_of(shape[0])) return;
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < r; ++d) rows *= shape[0][d];
  const size_t rb = shape[1].size();
  const int64_t k = shape[0][r - 1], n = shape[1][rb - 1];
  shape[0] = {rows, k};
  strides[0] = {k, 1};
  shape[1] = {shape[1][rb - 2], n};
  strides[1] = {strides[1][rb - 2], strides[1][rb - 1]};
  out = {rows, n};
}

// f32 and bf16 matmuls through oneDNN; also the transpose of one, computed directly as B^T A^T.
bool matmul_applies(const Lowering& l) {
  return (l.n.op == Op::MatMul && (all_f32(l.p.graph, l.id) || all_bf16(l.p.graph, l.id))) ||
         transposed_matmul(l.p, l.id);
}
// How a product reads its operands and writes its result: the layout lower_matmul gives it.
struct ProductLayout {
  int32_t operand[2] = {-1, -1};
  Shape shape[2], out_shape;
  std::vector<int64_t> strides[2], out_strides;
  bool through_permute = false;  // an operand read through a permute's strides, or the result
                                 // written through them
  bool permuted_out = false;     // the node is a permute of the product (not a transpose)
};

// The layout of `n`'s product: a matmul; or the transpose of one, computed directly as B^T A^T;
// or a permute of one that keeps the last axis, written through the strides of the permuted
// layout. Operands that are transposes are read through their strides instead of being copied,
// and with `through_permutes` so are permutes of them (see lower_matmul).
ProductLayout product_layout(const plan::Plan& p, const ir::GraphNode& n, bool through_permutes) {
  ProductLayout pl;
  const bool flip = is_last_two_swap(n);
  pl.permuted_out = !flip && n.op == Op::Permute;
  const ir::GraphNode& mm_node = n.op == Op::Permute ? p.graph.nodes[n.operands[0]] : n;
  int32_t* operand = pl.operand;
  operand[0] = mm_node.operands[0];
  operand[1] = mm_node.operands[1];
  if (flip) std::swap(operand[0], operand[1]);
  Shape* shape = pl.shape;
  std::vector<int64_t>* strides = pl.strides;
  for (int k = 0; k < 2; ++k) {
    const ir::GraphNode& o = p.graph.nodes[operand[k]];
    bool transposed = flip;  // (A B)^T = B^T A^T: each operand is read transposed
    int32_t source = operand[k];
    // Views read through instead of copied, in any order: transposes of the last two axes (read
    // with those strides swapped) and reshapes that only put 1-dims in front (a linear layer's
    // transposed weight as [1, in, out] against a [B, T, in] batch, and its gradient's transpose
    // of that).
    size_t lead = 0;
    for (;;) {
      const ir::GraphNode& v = p.graph.nodes[source];
      if (!p.run_time[source]) break;
      if (is_last_two_swap(v)) {
        source = v.operands[0];
        transposed = !transposed;
        continue;
      }
      if (v.op != Op::Reshape) break;
      const Shape& us = p.graph.nodes[v.operands[0]].shape;
      if (us.size() < 2 || us.size() >= v.shape.size()) break;
      const auto added = static_cast<ptrdiff_t>(v.shape.size() - us.size());
      if (!std::all_of(v.shape.begin(), v.shape.begin() + added,
                       [](int64_t d) { return d == 1; }) ||
          !std::equal(us.begin(), us.end(), v.shape.begin() + added))
        break;
      lead += static_cast<size_t>(added);
      source = v.operands[0];
    }
    const Shape& ss = p.graph.nodes[source].shape;
    strides[k] = ref::strides_of(ss);
    shape[k] = ss;
    // A permute keeping the last axis (or swapping it with the next): read through its strides
    // when one of the two matrix axes stays contiguous (oneDNN's gemm takes such views).
    // Not the left operand of a product with one right-hand matrix for the batch: that one is
    // worth its copy, which lets the batch fold into one product (fold_matmul_batch).
    const bool keep_for_fold = k == (flip ? 1 : 0) && shared_right(p.graph, mm_node);
    if (through_permutes && source == operand[k] && o.op == Op::Permute && p.run_time[operand[k]] &&
        !keep_for_fold && o.dtype == p.graph.nodes[o.operands[0]].dtype) {
      const std::vector<int64_t> in = ref::strides_of(p.graph.nodes[o.operands[0]].shape);
      std::vector<int64_t> st;
      for (int64_t a : o.attrs) st.push_back(in[static_cast<size_t>(a)]);
      const size_t r = st.size();
      if (r >= 2 && (st[r - 1] == 1 || st[r - 2] == 1)) {
        source = o.operands[0];
        strides[k] = st;
        pl.through_permute = true;
      }
    }
    operand[k] = source;
    if (transposed) {
      const size_t r = ss.size();
      std::swap(strides[k][r - 1], strides[k][r - 2]);
      std::swap(shape[k][r - 1], shape[k][r - 2]);
    }
    shape[k].insert(shape[k].begin(), lead, 1);
    strides[k].insert(strides[k].begin(), lead, shape_numel(ss));
  }
  pl.out_shape = mm_node.shape;
  pl.out_strides = ref::strides_of(pl.out_shape);
  if (pl.permuted_out) {  // matmul axis attrs[i] lands at axis i of the permute's contiguous output
    const std::vector<int64_t> contiguous = ref::strides_of(n.shape);
    for (size_t i = 0; i < n.attrs.size(); ++i)
      pl.out_strides[static_cast<size_t>(n.attrs[i])] = contiguous[i];
    pl.through_permute = true;
  } else {
    pl.out_shape = n.shape;
    fold_matmul_batch(pl.shape, pl.strides, pl.out_shape);
    pl.out_strides = ref::strides_of(pl.out_shape);
  }
  return pl;
}

// Whether oneDNN runs the product on a brgemm kernel ("brg:avx512_core_bf16", ...), not on its
// older gemm ("gemm:jit").
bool on_brgemm(const ProductLayout& pl, DType dtype) {
  return matmul_implementation(pl.shape[0], pl.strides[0], pl.shape[1], pl.strides[1], pl.out_shape,
                               pl.out_strides, dtype)
      .starts_with("brg");
}

void lower_strided_copy(Lowering& l);

void lower_matmul(Lowering& l) {
  const ir::GraphNode& mm_node = l.n.op == Op::Permute ? l.operand(0) : l.n;
  // Permuted operands and results are read and written through their strides, without a copy,
  // unless that costs the product its brgemm kernel: oneDNN 2.x runs a batch whose matrices
  // interleave in memory (an attention's heads over a sequence-first [T, B H, E]) on gemm:jit,
  // which on AVX512-BF16 takes 1.2-1.5 ms where brgemm over dense copies takes 0.95-1.2 plus
  // 0.07 for the copy ([96, 256, 64] x [96, 64, 256] bf16, two Zen 5 cores). Then the
  // permutes are copied (their own steps) and the product reads or writes the copies.
  ProductLayout pl = product_layout(l.p, l.n, true);
  if (pl.through_permute && !on_brgemm(pl, mm_node.dtype)) {
    const ProductLayout dense = product_layout(l.p, pl.permuted_out ? mm_node : l.n, false);
    bool copies_ready = true;  // each permute read as a copy is a step of its own
    for (int k = 0; k < 2; ++k) copies_ready = copies_ready && !l.p.absorbed[dense.operand[k]];
    if (copies_ready && on_brgemm(dense, mm_node.dtype)) {
      if (pl.permuted_out) return lower_strided_copy(l);  // the matmul is a step of its own
      pl = dense;
    }
  }
  auto mm =
      std::make_shared<cpu::MatMul>(pl.shape[0], pl.strides[0], pl.shape[1], pl.strides[1],
                                    pl.out_shape, mm_node.dtype, mm_node.dtype, pl.out_strides);
  l.step.scratch_bytes = mm->scratch_bytes();
  l.step.reads = {pl.operand[0], pl.operand[1]};
  l.step.label = "mat_mul";
  const int32_t a = pl.operand[0], b = pl.operand[1], id = l.id;
  l.cs.run = [mm, a, b, id](Ctx& c) { mm->run(c.ptr[a], c.ptr[b], c.ptr[id]); };
}

// f32 and bf16 convolutions and their gradients through oneDNN, direct or Winograd.
bool convolution_applies(const Lowering& l) { return dnnl_conv(l.p.graph, l.id); }
void lower_convolution(Lowering& l) {
  const ir::GraphNode& a = l.operand(0);
  const ir::GraphNode& b = l.operand(1);
  std::shared_ptr<DnnlConv> conv;
  const bool winograd = decisions(l.p).winograd[l.id];
  const DnnlConv::Blocked blocked{l.mask[l.n.operands[0]], l.mask[l.n.operands[1]], l.mask[l.id]};
  if (l.n.op == Op::Conv2d)
    conv = std::make_shared<DnnlConv>(DnnlConv::Kind::Forward, a.shape, b.shape, l.n.shape,
                                      l.n.attrs, blocked, winograd, l.n.dtype);
  else if (l.n.op == Op::Conv2dBackwardInput)
    conv = std::make_shared<DnnlConv>(DnnlConv::Kind::BackwardData, l.n.shape, b.shape, a.shape,
                                      l.n.attrs, blocked, winograd, l.n.dtype);
  else
    conv = std::make_shared<DnnlConv>(DnnlConv::Kind::BackwardWeights, a.shape, l.n.shape, b.shape,
                                      l.n.attrs, blocked, winograd, l.n.dtype);
  l.step.reads = l.n.operands;
  l.cs.conv = conv;
  l.step.kind = plan::StepKind::Conv;
  l.step.scratch_bytes = conv->scratch_bytes();
  l.cs.run = run_conv_step(conv, l.n.operands[0], l.n.operands[1], l.id);
}

// f32 reductions (and bf16 sums) that compute the elementwise tree they read as they go.
bool tree_reduction_applies(const Lowering& l) {
  return (l.n.op == Op::Sum || l.n.op == Op::Max || l.n.op == Op::Min) &&
         (l.f32 || (l.n.op == Op::Sum && l.n.dtype == DType::BF16)) &&
         l.p.absorbed[l.n.operands[0]];
}
void lower_tree_reduction(Lowering& l) {
  l.step.kind = plan::StepKind::Reduction;
  const bool walk_blocked = decisions(l.p).walk_blocked[l.id];
  auto tree =
      std::make_shared<FusedTree>(l.p.graph, l.n.operands[0], l.p.absorbed, &l.mask, walk_blocked);
  l.step.reads = tree->leaf_nodes();
  l.step.label = "fused_reduce";
  l.step.detail = tree->describe();
  if (l.n.op == Op::Sum) {
    auto [in, attrs] = walk_blocked ? blocked_sum(l.operand(0).shape, l.n.attrs)
                                    : std::make_pair(l.operand(0).shape, l.n.attrs);
    l.cs.sum = std::make_shared<SumOf>(SumOf{in, attrs, tree, -1});
    l.cs.sum->bf16_out = l.n.dtype == DType::BF16;
    l.cs.run = run_sums({{l.id, l.cs.sum}});
  } else {
    const ReduceLayout layout = reduce_layout(l.operand(0).shape, l.n.attrs);
    const Op op = l.n.op;
    const int32_t id = l.id;
    l.cs.run = [tree, layout, op, id](Ctx& c) {
      RunBuffers expanded;
      const std::vector<const void*> leaves = tree->bind(c.ptr, expanded);
      reduce_f32(
          op, layout,
          [&](int64_t off, int64_t len, float* tmp, bool again) {
            return tree->eval(leaves, off, len, tmp, nullptr, again);
          },
          static_cast<float*>(c.ptr[id]), tree->scratch_floats());
    };
  }
}

// f32 reductions and bf16 sums of a computed value.
bool reduction_applies(const Lowering& l) {
  return (l.n.op == Op::Sum || l.n.op == Op::Max || l.n.op == Op::Min) &&
         (all_f32(l.p.graph, l.id) || bf16_sum(l.p.graph, l.id));
}
void lower_reduction(Lowering& l) {
  l.step.kind = plan::StepKind::Reduction;
  l.step.reads = l.n.operands;
  const int32_t id = l.id, x = l.n.operands[0];
  const Shape in = l.node(x).shape;
  const std::vector<int64_t> attrs = l.n.attrs;
  const Op op = l.n.op;
  const DType in_dtype = l.node(x).dtype;
  const bool bf16_out = l.n.dtype == DType::BF16;
  if (decisions(l.p).walk_blocked[id]) {
    auto [in5, attrs5] = blocked_sum(in, attrs);
    l.cs.sum = std::make_shared<SumOf>(SumOf{in5, attrs5, nullptr, x, in_dtype, bf16_out});
    l.cs.run = run_sums({{id, l.cs.sum}});
  } else if (l.n.op == Op::Sum &&
             (reduce_layout(in, attrs).inner >= 2 || !all_f32(l.p.graph, id))) {
    l.cs.sum = std::make_shared<SumOf>(SumOf{in, attrs, nullptr, x, in_dtype, bf16_out});
    l.cs.run = run_sums({{id, l.cs.sum}});
  } else {  // Max, Min, and sums over axes below kept ones (by rows, see reduce_f32)
    l.cs.run = [=](Ctx& c) {
      reduce_f32(op, static_cast<const float*>(c.ptr[x]), in, attrs,
                 static_cast<float*>(c.ptr[id]));
    };
  }
}

// Max pooling: values and indices of the same pooling in one pass, plain or blocked.
bool max_pooling_applies(const Lowering& l) {
  return (l.n.op == Op::MaxPool2d || l.n.op == Op::MaxPool2dIndices) &&
         (is_f32(l.p.graph, l.n.operands[0]) || l.operand(0).dtype == DType::BF16) &&
         shape_numel(l.n.shape) > 0;
}
void lower_max_pooling(Lowering& l) {
  // Values and indices of the same pooling come from one pass.
  const int32_t x = l.n.operands[0];
  const Op other = l.n.op == Op::MaxPool2d ? Op::MaxPool2dIndices : Op::MaxPool2d;
  for (int32_t k : l.p.consumers[x])
    if (k != l.id && l.node(k).op == other && l.node(k).attrs == l.n.attrs && !l.p.absorbed[k] &&
        l.p.run_time[k]) {
      l.step.extras = {k};
      l.p.merged[k] = true;
      break;
    }
  l.step.reads = l.n.operands;
  const int32_t other_id = l.step.extras.empty() ? -1 : l.step.extras[0];
  const int32_t values = l.n.op == Op::MaxPool2d ? l.id : other_id;
  const int32_t indices = l.n.op == Op::MaxPool2d ? other_id : l.id;
  const Shape in = l.node(x).shape, out = l.n.shape;
  const std::vector<int64_t> attrs = l.n.attrs;
  const bool blocked = l.mask[x];
  LS_INTERNAL_CHECK(l.mask[l.id] == blocked && (other_id < 0 || l.mask[other_id] == blocked),
                    "max pooling's input, values and indices in different layouts");
  if (blocked) runtime::count(runtime::Counter::BlockedMaxPooling);
  if (l.node(x).dtype == DType::BF16) {
    l.cs.run = [=](Ctx& c) {
      uint16_t* v = values >= 0 ? static_cast<uint16_t*>(c.ptr[values]) : nullptr;
      int64_t* i = indices >= 0 ? static_cast<int64_t*>(c.ptr[indices]) : nullptr;
      const uint16_t* xs = static_cast<const uint16_t*>(c.ptr[x]);
      if (blocked)
        max_pool2d_blocked_bf16(xs, in, out, attrs, v, i);
      else
        max_pool2d_bf16(xs, in, out, attrs, v, i);
    };
  } else {
    l.cs.run = [=](Ctx& c) {
      float* v = values >= 0 ? static_cast<float*>(c.ptr[values]) : nullptr;
      int64_t* i = indices >= 0 ? static_cast<int64_t*>(c.ptr[indices]) : nullptr;
      if (blocked)
        max_pool2d_blocked_f32(static_cast<const float*>(c.ptr[x]), in, out, attrs, v, i);
      else
        max_pool2d_f32(static_cast<const float*>(c.ptr[x]), in, out, attrs, v, i);
    };
  }
}

// Average pooling and its gradient through oneDNN.
bool avg_pooling_applies(const Lowering& l) {
  return (l.n.op == Op::AvgPool2d || l.n.op == Op::AvgPool2dBackward) &&
         (all_f32(l.p.graph, l.id) || all_bf16(l.p.graph, l.id)) &&
         DnnlAvgPool::fits(pool_input(l.p.graph, l.n), pool_output(l.p.graph, l.n), l.n.attrs);
}
void lower_avg_pooling(Lowering& l) {
  auto pool =
      std::make_shared<DnnlAvgPool>(l.n.op == Op::AvgPool2dBackward, pool_input(l.p.graph, l.n),
                                    pool_output(l.p.graph, l.n), l.n.attrs, l.n.dtype);
  l.step.scratch_bytes = pool->scratch_bytes();
  l.step.reads = l.n.operands;
  const int32_t x = l.n.operands[0], id = l.id;
  l.cs.run = [pool, x, id](Ctx& c) { pool->run(c.ptr[x], c.ptr[id]); };
}

// The gradient of max pooling, plain or blocked.
bool max_pooling_backward_applies(const Lowering& l) {
  return l.n.op == Op::MaxPool2dBackward && (l.f32 || l.n.dtype == DType::BF16) &&
         l.operand(0).dtype == l.n.dtype && shape_numel(l.n.shape) > 0;
}
void lower_max_pooling_backward(Lowering& l) {
  l.step.reads = l.n.operands;
  const int32_t id = l.id, gy = l.n.operands[0], idx = l.n.operands[1];
  const Shape gys = l.node(gy).shape, in = l.n.shape;
  const bool blocked = l.mask[id];
  LS_INTERNAL_CHECK(l.mask[gy] == blocked && l.mask[idx] == blocked,
                    "max pooling's gradient, output gradient and indices in different layouts");
  if (blocked) runtime::count(runtime::Counter::BlockedMaxPooling);
  // Its indices are checked ahead unless the forward pooling computed them (see the end of
  // add_step); the kernel checks them again, before its threads start. A bf16 gradient is
  // summed in f32 and rounded once, as ref computes it.
  const bool bf16 = l.n.dtype == DType::BF16;
  l.cs.run = [=](Ctx& c) {
    const int64_t* i = static_cast<const int64_t*>(c.ptr[idx]);
    if (bf16) {
      const uint16_t* g = static_cast<const uint16_t*>(c.ptr[gy]);
      uint16_t* dx = static_cast<uint16_t*>(c.ptr[id]);
      if (blocked)
        max_pool2d_backward_blocked_bf16(g, i, gys, in, dx);
      else
        max_pool2d_backward_bf16(g, i, gys, in, dx);
      return;
    }
    const float* g = static_cast<const float*>(c.ptr[gy]);
    float* dx = static_cast<float*>(c.ptr[id]);
    if (blocked)
      max_pool2d_backward_blocked_f32(g, i, gys, in, dx);
    else
      max_pool2d_backward_f32(g, i, gys, in, dx);
  };
}

// Permutes, slices and broadcasts of any dtype as strided copies.
bool strided_copy_applies(const Lowering& l) {
  return l.n.op == Op::Permute || l.n.op == Op::Slice || l.n.op == Op::Expand;
}
void lower_strided_copy(Lowering& l) {
  l.step.reads = l.n.operands;
  const int32_t id = l.id, x = l.n.operands[0];
  const std::vector<int64_t> xs = ref::strides_of(l.node(x).shape);
  std::vector<int64_t> st;
  int64_t offset = 0;
  if (l.n.op == Op::Permute) {
    for (int64_t a : l.n.attrs) st.push_back(xs[a]);
  } else if (l.n.op == Op::Expand) {
    st = expand_strides(l.node(x).shape, l.n.shape);
  } else {
    const ir::SliceAttrs slice = ir::SliceAttrs::of(l.n.attrs);
    st = xs;
    st[slice.axis] *= slice.step;
    offset = slice.start * xs[slice.axis];
  }
  const Shape out = l.n.shape;
  const size_t elem = dtype_size(l.n.dtype);
  l.cs.run = [=](Ctx& c) { strided_copy(elem, c.ptr[x], out, st, offset, c.ptr[id]); };
}

// An index operand as the kernels read it: through an Expand that broadcasts a smaller index
// (embeddings' and index_select's), with zero strides, rather than from a materialized copy.
std::pair<int32_t, std::vector<int64_t>> index_source(const plan::Plan& p, int32_t index) {
  const ir::GraphNode& e = p.graph.nodes[index];
  if (e.op == Op::Expand && p.run_time[index] && !p.is_output[index])
    return {e.operands[0], expand_strides(p.graph.nodes[e.operands[0]].shape, e.shape)};
  return {index, ref::strides_of(e.shape)};
}

// Gather, scatter-add, pad, concat, index ramps and random bits: the index kernels, any dtype.
bool index_applies(const Lowering& l) {
  switch (l.n.op) {
    case Op::Gather:
    case Op::ScatterAdd:
    case Op::Pad:
    case Op::Concat:
      return !l.n.shape.empty();
    case Op::Iota:
    case Op::RandomUniform:
    case Op::Scalar:
      return true;
    case Op::ArgMax:
    case Op::ArgMin:
    case Op::Argsort:
      return shape_numel(l.operand(0).shape) > 0;
    default:
      return false;
  }
}
void lower_index(Lowering& l) {
  l.step.reads = l.n.operands;
  const int32_t id = l.id;
  const Shape out = l.n.shape;
  const DType dtype = l.n.dtype;
  const size_t elem = dtype_size(l.n.dtype);
  const std::vector<int64_t> attrs = l.n.attrs;
  switch (l.n.op) {
    case Op::Gather:
    case Op::ScatterAdd: {
      const int32_t x = l.n.operands[0];
      const std::pair<int32_t, std::vector<int64_t>> source = index_source(l.p, l.n.operands[1]);
      const int32_t index = source.first;
      const std::vector<int64_t> strides = source.second;
      l.step.reads[1] = index;
      l.index = index;
      const Shape xs = l.node(x).shape, is = l.operand(1).shape;
      const int64_t axis = attrs[0];
      if (l.n.op == Op::Gather) {
        l.step.label = "gather";
        l.cs.run = [=](Ctx& c) {
          gather(elem, c.ptr[x], xs, {static_cast<const int64_t*>(c.ptr[index]), strides}, is, axis,
                 c.ptr[id]);
        };
      } else {
        l.step.label = "scatter_add";
        const int32_t src = l.n.operands[2];
        const Shape ss = l.node(src).shape;
        l.cs.run = [=](Ctx& c) {
          scatter_add(dtype, c.ptr[x], xs, {static_cast<const int64_t*>(c.ptr[index]), strides}, is,
                      c.ptr[src], ss, axis, c.ptr[id]);
        };
      }
      return;
    }
    case Op::Pad: {
      const int32_t x = l.n.operands[0], value = l.n.operands[1];
      const Shape xs = l.node(x).shape;
      l.step.label = "pad";
      l.cs.run = [=](Ctx& c) { pad(elem, c.ptr[x], xs, attrs, c.ptr[value], out, c.ptr[id]); };
      return;
    }
    case Op::Concat: {
      std::vector<Shape> shapes;
      for (int32_t o : l.n.operands) shapes.push_back(l.node(o).shape);
      const std::vector<int32_t> ops = l.n.operands;
      l.step.label = "concat";
      l.cs.run = [=](Ctx& c) {
        std::vector<const void*> xs;
        for (int32_t o : ops) xs.push_back(c.ptr[o]);
        concat(elem, xs, shapes, attrs[0], out, c.ptr[id]);
      };
      return;
    }
    case Op::Iota:
      l.step.label = "iota";
      l.cs.run = [=](Ctx& c) { iota(dtype, out, attrs[0], c.ptr[id]); };
      return;
    case Op::RandomUniform: {
      const int32_t state = l.n.operands[0];
      const int64_t count = shape_numel(out);
      l.step.label = "rand";
      l.cs.run = [=](Ctx& c) {
        random_uniform(dtype, static_cast<const int64_t*>(c.ptr[state]), count, c.ptr[id]);
      };
      return;
    }
    case Op::ArgMax:
    case Op::ArgMin: {
      const int32_t x = l.n.operands[0];
      const Shape xs = l.node(x).shape;
      const DType xd = l.node(x).dtype;
      const bool is_max = l.n.op == Op::ArgMax;
      l.step.label = is_max ? "argmax" : "argmin";
      l.cs.run = [=](Ctx& c) {
        arg_reduce(is_max, xd, c.ptr[x], xs, attrs, static_cast<int64_t*>(c.ptr[id]));
      };
      return;
    }
    case Op::Argsort: {
      const int32_t x = l.n.operands[0];
      const Shape xs = l.node(x).shape;
      const DType xd = l.node(x).dtype;
      l.step.label = "argsort";
      l.cs.run = [=](Ctx& c) {
        argsort(xd, c.ptr[x], xs, attrs[0], attrs[1] != 0, static_cast<int64_t*>(c.ptr[id]));
      };
      return;
    }
    case Op::Scalar: {  // a host scalar of this run, written as the node's dtype (as ref does)
      const int64_t input = l.n.input;
      l.step.label = "scalar";
      l.cs.run = [=](Ctx& c) {
        const ir::ScalarValue v = c.scalars->at(static_cast<size_t>(input));
        void* out = c.ptr[id];
        switch (dtype) {
          case DType::F32:
            *static_cast<float*>(out) = static_cast<float>(v.f);
            return;
          case DType::F64:
            *static_cast<double*>(out) = v.f;
            return;
          case DType::BF16:
            *static_cast<uint16_t*>(out) = bfloat16(static_cast<float>(v.f)).bits;
            return;
          case DType::I32:
            *static_cast<int32_t*>(out) = static_cast<int32_t>(v.i);
            return;
          case DType::I64:
            *static_cast<int64_t*>(out) = v.i;
            return;
          case DType::Bool:
            *static_cast<bool*>(out) = static_cast<bool>(v.i);
            return;
        }
      };
      return;
    }
    default:
      util::internal_fail(__FILE__, __LINE__, "lower_index: not an index op");
  }
}

// Reshapes: an alias (no step runs), or a copy when the result must own its memory.
bool reshape_applies(const Lowering& l) { return l.n.op == Op::Reshape; }
void lower_reshape(Lowering& l) {
  l.step.reads = l.n.operands;
  const int32_t id = l.id, x = l.n.operands[0];
  const size_t bytes = bytes_of(l.n);
  // Usually an alias (no step runs); a copy only when the result must own its memory.
  l.cs.run = [=](Ctx& c) {
    if (c.ptr[id] != c.ptr[x] && bytes) std::memcpy(c.ptr[id], c.ptr[x], bytes);
  };
}

// What the kernels above do not take: other dtypes (f64, integers, bool, casts between any two)
// and the corners of the f32 and bf16 kernels (empty shapes, geometries oneDNN refuses), on the
// kernels for every dtype (typed_kernels.h).
bool typed_applies(const Lowering& l) {
  switch (ir::op_info(l.n.op).family) {
    case ir::OpFamily::Unary:
    case ir::OpFamily::Binary:
    case ir::OpFamily::Comparison:
    case ir::OpFamily::Select:
    case ir::OpFamily::Reduction:
    case ir::OpFamily::Contraction:
    case ir::OpFamily::Convolution:
    case ir::OpFamily::Pooling:
      return true;
    case ir::OpFamily::Movement:  // a 0-d pad: its operand as it is
      return l.n.op == Op::Pad && l.n.shape.empty();
    case ir::OpFamily::Index:  // an argsort of nothing: no step has anything to write
      return l.n.op == Op::Argsort && shape_numel(l.n.shape) == 0;
    default:
      return false;
  }
}
void lower_typed(Lowering& l) {
  l.step.reads = l.n.operands;
  const int32_t id = l.id;
  const Op op = l.n.op;
  const DType dtype = l.n.dtype;
  const Shape out = l.n.shape;
  const std::vector<int64_t> attrs = l.n.attrs;
  const std::vector<int32_t> operands = l.n.operands;
  std::vector<TypedArg> args;
  std::vector<Shape> shapes;
  for (int32_t o : l.n.operands) {
    args.push_back({nullptr, l.node(o).dtype});
    shapes.push_back(l.node(o).shape);
  }
  // Each run binds the operands' memory to a copy of `args`.
  auto bind = [args, operands](const Ctx& c) {
    std::vector<TypedArg> a = args;
    for (size_t k = 0; k < a.size(); ++k) a[k].data = c.ptr[operands[k]];
    return a;
  };
  switch (ir::op_info(op).family) {
    case ir::OpFamily::Reduction:
      l.step.kind = plan::StepKind::Reduction;
      l.cs.run = [=](Ctx& c) { typed_reduce(op, dtype, bind(c)[0], shapes[0], attrs, c.ptr[id]); };
      return;
    case ir::OpFamily::Contraction:
      l.cs.run = [=](Ctx& c) {
        const std::vector<TypedArg> a = bind(c);
        typed_matmul(dtype, a[0], shapes[0], a[1], shapes[1], out, c.ptr[id]);
      };
      return;
    case ir::OpFamily::Convolution:
      l.cs.run = [=](Ctx& c) {
        const std::vector<TypedArg> a = bind(c);
        typed_conv(op, dtype, a[0], shapes[0], a[1], shapes[1], out, attrs, c.ptr[id]);
      };
      return;
    case ir::OpFamily::Pooling:
      l.cs.run = [=](Ctx& c) {
        const std::vector<TypedArg> a = bind(c);
        const int64_t* indices =
            op == Op::MaxPool2dBackward ? static_cast<const int64_t*>(a[1].data) : nullptr;
        typed_pool(op, a[0], shapes[0], indices, out, attrs, c.ptr[id]);
      };
      return;
    case ir::OpFamily::Movement:
    case ir::OpFamily::Index: {
      const size_t bytes = bytes_of(l.n);
      l.cs.run = [=](Ctx& c) {
        if (bytes) std::memcpy(c.ptr[id], c.ptr[operands[0]], bytes);
      };
      return;
    }
    default: {
      // Not StepKind::Elementwise (fused trees): small integer steps that compute checked indices
      // stay eligible to run early with their checks (plan/checks.cpp), as ref's steps were.
      const int64_t count = shape_numel(out);
      l.cs.run = [=](Ctx& c) { typed_elementwise(op, dtype, bind(c), count, c.ptr[id]); };
      return;
    }
  }
}

// Collectives the bucket pass does not take (collectives.cpp): the value copied into place,
// then summed over the ranks (and scaled, floats only) or sent from the root.
bool collective_applies(const Lowering& l) {
  return ir::op_info(l.n.op).family == ir::OpFamily::Collective;
}
void lower_collective(Lowering& l) {
  const int32_t id = l.id, x = l.n.operands[0];
  l.step.reads = l.n.operands;
  const DType dtype = l.n.dtype;
  const int64_t count = shape_numel(l.n.shape);
  const size_t bytes = bytes_of(l.n);
  const std::string where = util::where(l.n.origin.loc);
  if (l.n.op == Op::Broadcast) {
    const int root = static_cast<int>(l.n.attrs[0]);
    const std::string what = util::cat("broadcast recorded at ", where);
    l.cs.run = [=](Ctx& c) {
      if (bytes && c.ptr[id] != c.ptr[x]) std::memcpy(c.ptr[id], c.ptr[x], bytes);
      dist::detail::broadcast(c.ptr[id], bytes, root, what);
    };
    return;
  }
  const double scale = ir::AllReduceAttrs::of(l.n.attrs).scale;
  const std::string what = util::cat("all_reduce recorded at ", where);
  l.cs.run = [=](Ctx& c) {
    // bf16 values are summed in f32 and rounded once.
    std::vector<float> wide;
    void* data = c.ptr[id];
    if (dtype == DType::BF16) {
      wide.resize(static_cast<size_t>(count));
      bf16_to_f32(static_cast<const uint16_t*>(c.ptr[x]), count, wide.data());
      data = wide.data();
    } else if (bytes && c.ptr[id] != c.ptr[x]) {
      std::memcpy(c.ptr[id], c.ptr[x], bytes);
    }
    const DType sum_dtype = dtype == DType::BF16 ? DType::F32 : dtype;
    dist::detail::all_reduce(data, count, sum_dtype, what);
    if (scale != 1 && sum_dtype == DType::F32)
      for (float& v : std::span(static_cast<float*>(data), static_cast<size_t>(count)))
        v = static_cast<float>(v * scale);
    if (scale != 1 && sum_dtype == DType::F64)
      for (double& v : std::span(static_cast<double*>(data), static_cast<size_t>(count)))
        v *= scale;
    if (dtype == DType::BF16) f32_to_bf16(wide.data(), count, static_cast<uint16_t*>(c.ptr[id]));
  };
}

// The lowering rules, one per kind of kernel, tried in order: the first that applies lowers the
// node. Every op of the table, on every dtype it admits, has one (conformance runs them all).
struct LoweringRule {
  bool (*applies)(const Lowering& l);
  void (*lower)(Lowering& l);
};
const LoweringRule kRules[] = {
    {fused_applies, lower_fused},
    {matmul_applies, lower_matmul},
    {convolution_applies, lower_convolution},
    {tree_reduction_applies, lower_tree_reduction},
    {reduction_applies, lower_reduction},
    {max_pooling_applies, lower_max_pooling},
    {avg_pooling_applies, lower_avg_pooling},
    {max_pooling_backward_applies, lower_max_pooling_backward},
    {strided_copy_applies, lower_strided_copy},
    {reshape_applies, lower_reshape},
    {index_applies, lower_index},
    {typed_applies, lower_typed},
    {collective_applies, lower_collective},
};

void add_step(plan::Plan& p, const std::vector<bool>& mask, int32_t id) {
  const ir::GraphNode& n = p.graph.nodes[id];
  plan::Step step;
  auto payload = std::make_shared<CpuStep>();
  CpuStep& cs = *payload;
  step.node = id;
  step.label = ir::op_info(n.op).name;
  Lowering l{p, mask, id, n, step, cs, is_f32(p.graph, id)};
  const LoweringRule* rule = std::find_if(std::begin(kRules), std::end(kRules),
                                          [&](const LoweringRule& r) { return r.applies(l); });
  LS_INTERNAL_CHECK(rule != std::end(kRules), "no cpu kernel for ", ir::op_info(n.op).name, " on ",
                    dtype_name(n.dtype));
  rule->lower(l);
  // Whether the step may throw comes from the op table. Indices are checked ahead, in a step of
  // their own that add_checks places as early as it can, unless they are the ones the forward
  // pooling computed in this program (in range by construction); once they pass, the op cannot
  // fail on them.
  step.can_fail = ir::may_fail(n.op, n.dtype);
  if (const int k = ir::index_operand(n.op); k >= 0) {
    step.can_fail = false;
    if (!pooling_indices(p.graph, n)) {
      const int32_t index = l.index >= 0 ? l.index : n.operands[static_cast<size_t>(k)];
      const Shape index_shape = p.graph.nodes[index].shape;
      const ir::IndexBound bound =
          ir::index_bound(n.op, n.attrs, p.graph.nodes[n.operands[0]].shape, n.shape);
      const char* name = ir::op_info(n.op).name;
      step.checked = index;
      cs.check = [=](Ctx& c) {
        ref::check_indices(name, {c.ptr[index], index_shape, DType::I64}, bound);
      };
    }
  }
  step.payload = std::move(payload);
  p.steps.push_back(std::move(step));
}

}  // namespace

void lower(plan::Plan& p) {
  const std::vector<bool> blocked = blocked_values(p);
  for (size_t i = 0; i < p.graph.nodes.size(); ++i)
    if (!p.absorbed[i] && !p.merged[i] && p.run_time[i] && p.graph.nodes[i].op != Op::Data)
      add_step(p, blocked, static_cast<int32_t>(i));
}

plan::FusionRules fusion_rules() {
  plan::FusionRules rules;
  rules.fusible = fusible;
  rules.view_leaf = permute_leaf;
  // An f32 reduction takes a tree when it walks it in long contiguous runs (sums in shorter ones
  // too: they go by tiles).
  rules.reduction_takes = [](const ir::Graph& g, int32_t c, int32_t id) {
    const ir::GraphNode& cn = g.nodes[c];
    const ir::GraphNode& node = g.nodes[id];
    // (A sum may also write bf16, and read a tree whose values are bf16.)
    const bool bf16 = cn.op == Op::Sum && (cn.dtype == DType::BF16 || node.dtype == DType::BF16) &&
                      (cn.dtype == DType::F32 || cn.dtype == DType::BF16) &&
                      (node.dtype == DType::F32 || node.dtype == DType::BF16);
    return (cn.op == Op::Sum || cn.op == Op::Max || cn.op == Op::Min) &&
           ((cn.dtype == DType::F32 && node.dtype == DType::F32) || bf16) &&
           shape_numel(cn.shape) > 0 &&
           (reduce_layout(node.shape, cn.attrs).inner >= 64 ||
            (cn.op == Op::Sum && reduce_layout(node.shape, cn.attrs).inner >= 4));
  };
  return rules;
}

}  // namespace lockstep::backends::cpu
