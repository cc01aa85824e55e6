// The fusion pass: which fusible nodes are evaluated inside their consumers' trees, so that their
// values never go to memory. Backend-neutral: the backend says what may fuse (FusionRules).
#include <algorithm>

#include "plan/passes.h"

namespace lockstep::plan {

// A fusible node is absorbed when every consumer can take it: a fusible node of its shape, or a
// reduction that reads it through a tree (FusionRules::reduction_takes). A view the trees read
// through strides (FusionRules::view_leaf) is absorbed when every consumer is such a node. With
// several consumers the node is recomputed in each, which pays on a memory-bound machine as long as
// the recomputed tree stays small.
void choose_fusion(Plan& p, const FusionRules& rules) {
  const ir::Graph& g = p.graph;
  const size_t n = g.nodes.size();
  p.absorbed.assign(n, false);
  // Instructions of the tree a node brings into its consumers, saturating: an operand used twice
  // (y = y * y, again and again) doubles it at every level.
  constexpr int kCostCap = 1 << 28;
  std::vector<int> cost(n, 0);
  // The distinct full-size values that tree reads from memory, kept up to kLeafCap of them: the
  // recompute rule below refuses every tree of kLeafCap or more (with k >= 2 consumers,
  // (k - 1) L <= k + 2 needs L <= 4), so a longer list would change no decision, and a chain of
  // 100,000 fused ops would copy and search lists as long as itself at every node.
  constexpr size_t kLeafCap = 5;
  std::vector<std::vector<int32_t>> full_leaves(n);
  auto add_leaf = [&](std::vector<int32_t>& leaves, int32_t l) {
    if (leaves.size() < kLeafCap && std::find(leaves.begin(), leaves.end(), l) == leaves.end())
      leaves.push_back(l);
  };
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = static_cast<int32_t>(i);
    const ir::GraphNode& node = g.nodes[i];
    const bool view = rules.view_leaf && rules.view_leaf(g, id);
    if (p.is_output[i] || node.op == ir::Op::Scalar || !(view || rules.fusible(g, id)) ||
        p.consumers[i].empty() || !p.run_time[i])
      continue;
    bool all_take = true;
    std::vector<int32_t> distinct;
    for (int32_t c : p.consumers[i]) {
      if (!p.run_time[c]) continue;  // computed at compile time, from its own copy
      if (std::find(distinct.begin(), distinct.end(), c) == distinct.end()) distinct.push_back(c);
      const bool tree = rules.fusible(g, c) && g.nodes[c].shape == node.shape;
      // (A view is read by trees alone: a reduction walks its operand's memory in order.)
      all_take = all_take && (tree || (!view && rules.reduction_takes(g, c, id)));
    }
    if (view) {  // a load through strides: no instruction, and its operand is read in full
      full_leaves[i] = {node.operands[0]};
      p.absorbed[i] = all_take;
      continue;
    }
    cost[i] = node.op == ir::Op::Expand ? 0 : 1;  // a broadcast is a load, not an instruction
    for (int32_t o : node.operands) {
      if (p.absorbed[o]) {
        cost[i] = std::min(cost[i] + cost[o], kCostCap);
        for (int32_t l : full_leaves[o]) add_leaf(full_leaves[i], l);
      } else if (node.op != ir::Op::Expand && g.nodes[o].shape == node.shape) {
        add_leaf(full_leaves[i], o);
      }
    }
    // Recomputing in k consumers reads the tree's L full-size inputs k times; storing it reads
    // them once, writes the value (about two reads' worth, with the cache line fetched first)
    // and reads it k times: recompute while (k - 1) L <= k + 2, and the tree stays short.
    const int64_t k = static_cast<int64_t>(distinct.size());
    const int64_t l = static_cast<int64_t>(full_leaves[i].size());
    p.absorbed[i] =
        all_take && (k == 1 || (cost[i] <= rules.recompute_limit && (k - 1) * l <= k + 2));
  }
}

}  // namespace lockstep::plan
