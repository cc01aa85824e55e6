// The constants pass: values that depend on nothing supplied at run time are computed once, at
// compile time, by the ref kernels (plan::Plan::run_time, constant_at, constants).
#include <cstring>

#include "backends/cpu/passes.h"
#include "backends/ref/ref_kernels.h"
#include "passes/passes.h"
#include "runtime/metrics.h"

namespace lockstep::backends::cpu {

using plan::bytes_of;

namespace {
// Constant values larger than this are recomputed every run rather than kept with the program.
constexpr size_t kFoldMaxBytes = size_t{16} << 20;
}  // namespace

// Values that depend on nothing supplied at run time (index ramps and what is computed from
// them alone) are computed here, once, by the ref kernels, and kept with the program: the steps
// that read them read the kept copy.
void fold_constants(plan::Plan& p) {
  const size_t n = p.graph.nodes.size();
  const passes::Constants c = passes::find_constants(p.graph, kFoldMaxBytes);
  p.run_time = c.run_time;
  p.constant_at.assign(n, -1);
  if (c.fold.empty()) return;
  // Everything the folded values are computed from, evaluated in graph order.
  std::vector<bool> needed(n, false);
  for (int32_t f : c.fold) needed[f] = true;
  for (size_t i = n; i-- > 0;)
    if (needed[i])
      for (int32_t o : p.graph.nodes[i].operands) needed[o] = true;
  std::vector<std::vector<std::byte>> value(n);
  const std::vector<ir::ScalarValue> no_scalars;
  for (size_t i = 0; i < n; ++i) {
    if (!needed[i]) continue;
    const ir::GraphNode& node = p.graph.nodes[i];
    std::vector<ref::Arr> args;
    for (int32_t o : node.operands)
      args.push_back({value[o].data(), p.graph.nodes[o].shape, p.graph.nodes[o].dtype});
    value[i].resize(bytes_of(node));
    ref::eval_node(node, args, no_scalars, value[i].data());
  }
  size_t total = 0;
  for (int32_t f : c.fold) {
    p.constant_at[f] = static_cast<int64_t>(total);
    total += (bytes_of(p.graph.nodes[f]) + 63) / 64 * 64;
  }
  p.constants = alloc_host(std::max<size_t>(total, 64));
  for (int32_t f : c.fold)
    if (!value[f].empty())
      std::memcpy(static_cast<char*>(p.constants->data()) + p.constant_at[f], value[f].data(),
                  value[f].size());
  runtime::count(runtime::Counter::FoldedConstants, static_cast<int64_t>(c.fold.size()));
}

}  // namespace lockstep::backends::cpu
