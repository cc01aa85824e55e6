// Common-subexpression elimination and dead-node removal; see passes.h.
#include <map>
#include <tuple>

#include "passes/passes.h"

namespace lockstep::passes {

ir::Graph cse(const ir::Graph& g) {
  using Key = std::tuple<int, int, std::vector<int32_t>, std::vector<int64_t>, Shape>;
  std::vector<int32_t> remap(g.nodes.size());
  std::map<Key, int32_t> seen;
  ir::Graph merged;
  merged.device = g.device;
  merged.num_buffer_inputs = g.num_buffer_inputs;
  merged.num_scalar_inputs = g.num_scalar_inputs;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    ir::GraphNode n = g.nodes[i];
    for (int32_t& o : n.operands) o = remap[o];
    if (n.op != ir::Op::Data && n.op != ir::Op::Scalar) {
      Key k{static_cast<int>(n.op), static_cast<int>(n.dtype), n.operands, n.attrs, n.shape};
      auto [it, fresh] = seen.emplace(std::move(k), static_cast<int32_t>(merged.nodes.size()));
      if (!fresh) {
        remap[i] = it->second;
        continue;
      }
    }
    remap[i] = static_cast<int32_t>(merged.nodes.size());
    merged.nodes.push_back(std::move(n));
  }
  for (int32_t o : g.outputs) merged.outputs.push_back(remap[o]);
  // Dead nodes: keep what an output needs, and every input (inputs are numbered).
  std::vector<bool> live(merged.nodes.size(), false);
  for (int32_t o : merged.outputs) live[o] = true;
  for (size_t i = merged.nodes.size(); i-- > 0;) {
    const ir::GraphNode& n = merged.nodes[i];
    if (n.input >= 0) live[i] = true;
    if (live[i])
      for (int32_t o : n.operands) live[o] = true;
  }
  ir::Graph out;
  out.device = merged.device;
  out.num_buffer_inputs = merged.num_buffer_inputs;
  out.num_scalar_inputs = merged.num_scalar_inputs;
  std::vector<int32_t> keep(merged.nodes.size(), -1);
  for (size_t i = 0; i < merged.nodes.size(); ++i) {
    if (!live[i]) continue;
    ir::GraphNode n = merged.nodes[i];
    for (int32_t& o : n.operands) o = keep[o];
    keep[i] = static_cast<int32_t>(out.nodes.size());
    out.nodes.push_back(std::move(n));
  }
  for (int32_t o : merged.outputs) out.outputs.push_back(keep[o]);
  return out;
}

}  // namespace lockstep::passes
