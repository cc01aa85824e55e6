// The layout pass: which activations stay in oneDNN's blocked layout (nChw16c) between
// convolutions (CpuDecisions::blocked, and walk_blocked for sums reading them in that order).
#include "backends/cpu/kernels.h"
#include "backends/cpu/passes.h"
#include "runtime/metrics.h"

namespace lockstep::backends::cpu {

using ir::Op;

// Which activations stay in oneDNN's blocked layout (nChw16c) between convolutions. Values are
// grouped into classes that must share a layout: a fused tree's result with the full-size values
// it reads (it walks them all in one order), the full-size values one sum reads, a max
// pooling's input with its values and indices and the gradients computed from those indices. A
// class is blocked when every member may be: a blockable f32 or bf16 value computed at run time by
// a oneDNN convolution, a fused tree or our max pooling (or a bool mask a tree computes, or the
// pooling's i64 indices), not a program output, and read only by oneDNN convolutions (as an
// activation or gradient, never as weights), fused trees of its shape, sums over its channels
// or its whole feature maps and max pooling. A value anything else reads (average pooling,
// reshapes, matmuls, the kernels for other dtypes) stays plain, and so does its class: a
// convolution then reorders it as before.
void choose_layouts(plan::Plan& p) {
  const size_t n = p.graph.nodes.size();
  CpuDecisions& d = decisions(p);
  d.blocked.assign(n, false);
  d.walk_blocked.assign(n, false);
  // Union-find over the nodes; n stands for "plain", n + 1 + i for sum i's walk over its input.
  std::vector<int32_t> parent(2 * n + 1);
  for (size_t i = 0; i < parent.size(); ++i) parent[i] = static_cast<int32_t>(i);
  auto find = [&](int32_t v) {
    while (parent[v] != v) v = parent[v] = parent[parent[v]];
    return v;
  };
  auto join = [&](int32_t a, int32_t b) { parent[find(a)] = find(b); };
  const int32_t plain = static_cast<int32_t>(n);
  // The leaves of the tree at `root` that it reads in its own order; those it reads through a
  // permute are plain.
  auto tree_leaves = [&](int32_t root) {
    const FusedTree tree(p.graph, root, p.absorbed);
    std::vector<int32_t> leaves;
    for (size_t k = 0; k < tree.leaf_nodes().size(); ++k) {
      if (tree.leaf_is_permuted(k))
        join(tree.leaf_nodes()[k], plain);
      else
        leaves.push_back(tree.leaf_nodes()[k]);
    }
    return leaves;
  };
  std::vector<bool> candidate(n, false);
  for (size_t i = 0; i < n; ++i) {
    const ir::GraphNode& node = p.graph.nodes[i];
    // f32 and bf16 values, and bool ones (masks) that trees compute and read.
    const bool fused = fusible(p.graph, static_cast<int32_t>(i));
    const bool pool = blockable_pool(p.graph, static_cast<int32_t>(i));
    candidate[i] =
        (node.dtype == DType::F32 || node.dtype == DType::BF16 ||
         (fused && node.dtype == DType::Bool) || pool) &&
        blockable(node.shape) && p.run_time[i] && !p.absorbed[i] && !p.is_output[i] &&
        node.op != Op::Data &&
        (fused || pool ||
         (node.op != Op::Conv2dBackwardWeight && dnnl_conv(p.graph, static_cast<int32_t>(i))));
    if (!candidate[i]) join(static_cast<int32_t>(i), plain);
  }
  // The full-size leaves of a walk over `shape` (a tree's or a sum's) share its layout; a
  // smaller value read through a broadcast stays plain. Says whether any leaf was full-size.
  auto walk = [&](int32_t self, const Shape& shape, const std::vector<int32_t>& leaves) {
    bool full = false;
    for (int32_t l : leaves) {
      const bool same = p.graph.nodes[l].shape == shape;
      join(l, same ? self : plain);
      full = full || same;
    }
    return full;
  };
  std::vector<int32_t> walking_sums;  // sums whose walk reads a full-size value
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = static_cast<int32_t>(i);
    const ir::GraphNode& node = p.graph.nodes[i];
    if (p.absorbed[i] || !p.run_time[i] || node.op == Op::Data) continue;
    if (fusible(p.graph, id)) {
      walk(id, node.shape, tree_leaves(id));
    } else if (dnnl_conv(p.graph, id)) {
      // Weights (forward and backward-data operand 1) and weight gradients stay plain.
      if (node.op != Op::Conv2dBackwardWeight) join(node.operands[1], plain);
      if (node.op == Op::Conv2dBackwardWeight) join(id, plain);
    } else if (blockable_pool(p.graph, id)) {
      // Max pooling takes its input (or output gradient) and indices in the layout of its
      // result: the values and indices of one pooling, and the gradients that use those
      // indices, all share one layout.
      for (int32_t o : node.operands) join(o, id);
    } else if (node.op == Op::Sum && (node.dtype == DType::F32 || node.dtype == DType::BF16) &&
               sum_takes_blocked(p.graph.nodes[node.operands[0]].shape, node.attrs)) {
      const int32_t x = node.operands[0];
      const Shape& shape = p.graph.nodes[x].shape;
      if (walk(plain + 1 + id, shape, p.absorbed[x] ? tree_leaves(x) : std::vector<int32_t>{x}))
        walking_sums.push_back(id);
    } else {
      join(id, plain);
      for (int32_t o : node.operands) {
        if (!p.absorbed[o]) {
          join(o, plain);
        } else {  // a reduction other than those sums walks the tree in plain order
          for (int32_t l : tree_leaves(o)) join(l, plain);
        }
      }
    }
  }
  for (int32_t o : p.graph.outputs) join(o, plain);
  int64_t count = 0;
  for (size_t i = 0; i < n; ++i) {
    const bool blocked = candidate[i] && find(static_cast<int32_t>(i)) != find(plain);
    d.blocked[i] = blocked;
    count += blocked;
  }
  // A sum walks in blocked order when the values it reads are blocked: its full-size leaves
  // share its class, and a class that is not plain holds only blocked values. (A walk over
  // broadcasts only stays plain.)
  for (int32_t id : walking_sums) d.walk_blocked[id] = find(plain + 1 + id) != find(plain);
  if (count) runtime::count(runtime::Counter::BlockedActivations, count);
}

}  // namespace lockstep::backends::cpu
