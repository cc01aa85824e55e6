// Gathers run again for the backward; see passes.h.
#include <vector>

#include "ir/attrs.h"
#include "passes/passes.h"

namespace lockstep::passes {

namespace {

bool is_gather(const ir::GraphNode& n) {
  return n.op == ir::Op::Broadcast &&
         ir::BroadcastAttrs::of(n.attrs).gather == ir::BroadcastAttrs::Gather::Again;
}

}  // namespace

ir::Graph regather(const ir::Graph& g) {
  const size_t n = g.nodes.size();
  // What a gather gives: its broadcast, or a split parameter's runs' broadcasts joined (a
  // concatenation, a reshape) with all it reads.
  std::vector<char> gathered(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const ir::GraphNode& node = g.nodes[i];
    gathered[i] = is_gather(node);
    if ((node.op == ir::Op::Concat || node.op == ir::Op::Reshape) && node.origin.backward_of < 0) {
      gathered[i] = 1;
      for (int32_t o : node.operands) gathered[i] = gathered[i] && gathered[o];
    }
  }
  // Per gathered value, the first node of the backward that reads it, when the forward reads it
  // too (outside the gather it is part of).
  std::vector<int32_t> first_backward(n, -1);
  std::vector<char> forward_reads(n, 0), is_output(n, 0);
  for (int32_t o : g.outputs) is_output[o] = 1;
  for (size_t i = 0; i < n; ++i)
    for (int32_t o : g.nodes[i].operands) {
      if (!gathered[o] || gathered[i]) continue;
      if (g.nodes[i].origin.backward_of < 0)
        forward_reads[o] = 1;
      else if (first_backward[o] < 0)
        first_backward[o] = static_cast<int32_t>(i);
    }
  // The gathers to run again, listed at the node before which each runs.
  std::vector<std::vector<int32_t>> before(n);
  bool any = false;
  for (size_t i = 0; i < n; ++i)
    if (first_backward[i] >= 0 && forward_reads[i] && !is_output[i]) {
      before[static_cast<size_t>(first_backward[i])].push_back(static_cast<int32_t>(i));
      any = true;
    }
  if (!any) return g;
  ir::Graph out;
  out.device = g.device;
  out.num_buffer_inputs = g.num_buffer_inputs;
  out.num_scalar_inputs = g.num_scalar_inputs;
  out.nodes.reserve(n + n / 8);
  std::vector<int32_t> remap(n, -1), again(n, -1);
  // A gathered value again: what it is joined from first (each once), then itself.
  auto copy = [&](auto& self, int32_t k) -> void {
    if (again[k] >= 0) return;
    ir::GraphNode node = g.nodes[static_cast<size_t>(k)];
    for (int32_t& o : node.operands) {
      if (gathered[o]) self(self, o);
      o = gathered[o] ? again[o] : remap[o];
    }
    again[k] = static_cast<int32_t>(out.nodes.size());
    out.nodes.push_back(std::move(node));
  };
  for (size_t i = 0; i < n; ++i) {
    for (int32_t k : before[i]) copy(copy, k);
    ir::GraphNode node = g.nodes[i];
    const bool backward = node.origin.backward_of >= 0;
    for (int32_t& o : node.operands) o = backward && again[o] >= 0 ? again[o] : remap[o];
    remap[i] = static_cast<int32_t>(out.nodes.size());
    out.nodes.push_back(std::move(node));
  }
  for (int32_t o : g.outputs) out.outputs.push_back(remap[o]);
  return out;
}

}  // namespace lockstep::passes
