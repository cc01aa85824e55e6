// Constant folding, the plan; see passes.h.
#include "passes/passes.h"

namespace lockstep::passes {

Constants find_constants(const ir::Graph& g, size_t max_bytes) {
  const size_t n = g.nodes.size();
  Constants c;
  c.constant.assign(n, false);
  for (size_t i = 0; i < n; ++i) {
    const ir::GraphNode& node = g.nodes[i];
    if (node.op == ir::Op::Data || node.op == ir::Op::Scalar) continue;
    // A leaf without runtime inputs (Iota), or an op of constants only (a random draw from a
    // constant key included: its bits are a function of the key).
    // Collectives exchange data at run time: never folded.
    bool all = !ir::is_collective(node.op);
    for (int32_t o : node.operands) all = all && c.constant[o];
    c.constant[i] = all;
  }
  std::vector<bool> is_output(n, false);
  for (int32_t o : g.outputs) is_output[o] = true;
  c.run_time.assign(n, false);
  for (size_t i = 0; i < n; ++i) {
    const ir::GraphNode& node = g.nodes[i];
    const size_t bytes = static_cast<size_t>(shape_numel(node.shape)) * dtype_size(node.dtype);
    c.run_time[i] = !c.constant[i] || is_output[i] || bytes > max_bytes;
  }
  std::vector<bool> read_at_run_time(n, false);
  for (size_t i = 0; i < n; ++i)
    if (c.run_time[i])
      for (int32_t o : g.nodes[i].operands) read_at_run_time[o] = true;
  for (size_t i = 0; i < n; ++i)
    if (!c.run_time[i] && read_at_run_time[i]) c.fold.push_back(static_cast<int32_t>(i));
  return c;
}

}  // namespace lockstep::passes
