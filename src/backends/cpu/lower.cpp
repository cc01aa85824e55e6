// The lowering pass: the kernel that runs each node the plan computes at run time, a step each,
// picked by a table of rules tried in order. Here: the table, and the rules for fused elementwise
// trees, convolutions, reductions, strided copies, reshapes and collectives; the matmul, pooling,
// index and typed rules are in lower_*.cpp (lower_rules.h). Also the kernels and predicates other
// cpu passes rebuild steps with (passes.h).
#include <algorithm>
#include <cstring>
#include <span>
#include <string>

#include "backends/cpu/kernels.h"
#include "backends/cpu/lower_rules.h"
#include "backends/cpu/passes.h"
#include "backends/ref/ref_kernels.h"
#include "dist/comm.h"
#include "ir/attrs.h"
#include "util/check.h"

namespace lockstep::backends::cpu {

using ir::Op;
using plan::bytes_of;

namespace {

// Reductions whose contiguous runs are at least this long walk the runs; shorter ones (sums over
// small feature maps) go by tiles of the input instead.
constexpr int64_t kLongRun = 512;

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
    const std::optional<ColumnReduction> cols =
        in_dtype == DType::BF16 ? column_reduction(in, attrs) : std::nullopt;
    if (!cols) return;
    // A bf16 sum over leading axes (autocast's bias gradients) by whole rows: through the
    // tiles, a [2048, 512] -> [512] one took 0.79 ms, 4.6x its f32 sum (two Xeon model 207
    // cores).
    const int64_t out_size = cols->a * cols->k;
    l.cs.run = [=, c = *cols](Ctx& ctx) {
      RunBuffers staged;
      float* o = bf16_out ? staged.take(out_size) : static_cast<float*>(ctx.ptr[id]);
      sum_columns_bf16(static_cast<const uint16_t*>(ctx.ptr[x]), c, o);
      if (bf16_out) f32_to_bf16(o, out_size, static_cast<uint16_t*>(ctx.ptr[id]));
    };
  } else if (const std::optional<ColumnReduction> cols = column_reduction(in, attrs)) {
    // Over leading axes, the kept ones innermost (Max, Min, f32 sums): by whole rows.
    l.cs.run = [=, c = *cols](Ctx& ctx) {
      reduce_columns_f32(op, static_cast<const float*>(ctx.ptr[x]), c,
                         static_cast<float*>(ctx.ptr[id]));
    };
  } else {  // the other layouts, by the generic walk (see reduce_f32)
    l.cs.run = [=](Ctx& ctx) {
      reduce_f32(op, static_cast<const float*>(ctx.ptr[x]), in, attrs,
                 static_cast<float*>(ctx.ptr[id]));
    };
  }
}

}  // namespace

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
  // A slice that lives in its operand's memory (plan::slice_offset) has nothing to copy.
  l.cs.run = [=](Ctx& c) {
    if (c.ptr[id] != static_cast<const char*>(c.ptr[x]) + offset * static_cast<int64_t>(elem))
      strided_copy(elem, c.ptr[x], out, st, offset, c.ptr[id]);
  };
}

namespace {

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

// Collectives the bucket pass does not take (collectives.cpp): the value copied into place,
// then summed over the ranks (and scaled, floats only) or sent from the root.
bool collective_applies(const Lowering& l) {
  return ir::op_info(l.n.op).family == ir::OpFamily::Collective;
}
void lower_collective(Lowering& l) {
  // A broadcast's operands before its value only order it (ir.h).
  const int32_t id = l.id, x = l.n.operands.back();
  l.step.reads = l.n.operands;
  const DType dtype = l.n.dtype;
  const int64_t count = shape_numel(l.n.shape);
  const size_t bytes = bytes_of(l.n);
  const std::string where = util::where(l.n.origin.loc);
  if (l.n.op == Op::Broadcast) {
    const int root = static_cast<int>(l.n.attrs[0]);
    const std::string what = util::cat("broadcast recorded at ", where);
    l.cs.run = [=](Ctx& c) { dist::detail::broadcast(c.ptr[id], c.ptr[x], bytes, root, what); };
    return;
  }
  // A reduce (root >= 0) leaves the other ranks' values as they were: only the root's is read.
  const ir::AllReduceAttrs attrs = ir::AllReduceAttrs::of(l.n.attrs);
  const double scale = attrs.scale;
  const int root = static_cast<int>(attrs.root);
  const std::string what = util::cat(root < 0 ? "all_reduce" : "reduce", " recorded at ", where);
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
    dist::detail::all_reduce(data, count, sum_dtype, what, root);
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
    {attention_applies, lower_attention},
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
    {recurrent_applies, lower_recurrent},
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
