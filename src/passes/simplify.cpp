// Algebraic simplification; see passes.h.
#include <vector>

#include "passes/passes.h"

namespace lockstep::passes {
namespace {

using ir::Op;

bool is_identity(const std::vector<int64_t>& perm) {
  for (size_t i = 0; i < perm.size(); ++i)
    if (perm[i] != static_cast<int64_t>(i)) return false;
  return true;
}

}  // namespace

ir::Graph simplify(const ir::Graph& g) {
  std::vector<bool> is_output(g.nodes.size(), false);
  for (int32_t o : g.outputs) is_output[o] = true;
  ir::Graph out;
  out.device = g.device;
  out.num_buffer_inputs = g.num_buffer_inputs;
  out.num_scalar_inputs = g.num_scalar_inputs;
  std::vector<int32_t> remap(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    ir::GraphNode n = g.nodes[i];
    for (int32_t& o : n.operands) o = remap[o];
    const ir::GraphNode* a = n.operands.empty() ? nullptr : &out.nodes[n.operands[0]];
    // permute(permute(x, p), q) = permute(x, p o q); reshape(reshape(x)) = reshape(x).
    if (n.op == Op::Permute && a->op == Op::Permute) {
      std::vector<int64_t> composed(n.attrs.size());
      for (size_t d = 0; d < n.attrs.size(); ++d) composed[d] = a->attrs[n.attrs[d]];
      n.attrs = std::move(composed);
      n.operands = {a->operands[0]};
    } else if (n.op == Op::Reshape && a->op == Op::Reshape) {
      n.operands = {a->operands[0]};
    }
    a = n.operands.empty() ? nullptr : &out.nodes[n.operands[0]];
    // Ops that return their operand unchanged. An output keeps its own node: backends give
    // every output its own storage.
    const bool identity = a && a->dtype == n.dtype && a->shape == n.shape &&
                          (n.op == Op::Reshape || n.op == Op::Expand || n.op == Op::Cast ||
                           (n.op == Op::Permute && is_identity(n.attrs)));
    if (identity && !is_output[i]) {
      remap[i] = n.operands[0];
      continue;
    }
    remap[i] = static_cast<int32_t>(out.nodes.size());
    out.nodes.push_back(std::move(n));
  }
  for (int32_t o : g.outputs) out.outputs.push_back(remap[o]);
  return out;
}

}  // namespace lockstep::passes
