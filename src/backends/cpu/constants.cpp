// The constants pass: values that depend on nothing supplied at run time are computed once, at
// compile time, by the cpu backend's own kernels (plan::Plan::run_time, constant_at, constants).
#include <cstring>
#include <string_view>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/executable.h"
#include "backends/cpu/passes.h"
#include "passes/passes.h"
#include "runtime/metrics.h"

namespace lockstep::backends::cpu {

using plan::bytes_of;

namespace {
// Constant values larger than this are recomputed every run rather than kept with the program.
constexpr size_t kFoldMaxBytes = size_t{16} << 20;
}  // namespace

// Values that depend on nothing supplied at run time (index ramps and what is computed from
// them alone) are computed here, once, and kept with the program: the steps that read them read
// the kept copy. They are computed as a program of their own, compiled by the rest of this
// pipeline (every pass but this one) and run: the same kernels as at run time.
void fold_constants(plan::Plan& p) {
  const size_t n = p.graph.nodes.size();
  const passes::Constants c = passes::find_constants(p.graph, kFoldMaxBytes);
  p.run_time = c.run_time;
  p.constant_at.assign(n, -1);
  if (c.fold.empty()) return;
  // The folded values' program: everything they are computed from, in graph order (constants
  // read no input), its outputs the folded values.
  std::vector<bool> needed(n, false);
  for (int32_t f : c.fold) needed[f] = true;
  for (size_t i = n; i-- > 0;)
    if (needed[i])
      for (int32_t o : p.graph.nodes[i].operands) needed[o] = true;
  ir::Graph sub;
  sub.device = p.graph.device;
  std::vector<int32_t> at(n, -1);
  for (size_t i = 0; i < n; ++i) {
    if (!needed[i]) continue;
    ir::GraphNode node = p.graph.nodes[i];
    for (int32_t& o : node.operands) o = at[o];
    at[i] = static_cast<int32_t>(sub.nodes.size());
    sub.nodes.push_back(std::move(node));
  }
  for (int32_t f : c.fold) sub.outputs.push_back(at[f]);
  plan::Plan q(std::move(sub));
  for (const plan::Pass& pass : pipeline())
    if (std::string_view(pass.name) != "fold_constants") pass.run(q);
  CpuExecutable program(std::move(q), num_threads());
  const std::vector<std::shared_ptr<Storage>> value = program.run({}, {}, {}, nullptr);
  size_t total = 0;
  for (int32_t f : c.fold) {
    p.constant_at[f] = static_cast<int64_t>(total);
    total += (bytes_of(p.graph.nodes[f]) + 63) / 64 * 64;
  }
  p.constants = alloc_host(std::max<size_t>(total, 64));
  for (size_t k = 0; k < c.fold.size(); ++k) {
    const size_t bytes = bytes_of(p.graph.nodes[c.fold[k]]);
    if (bytes)
      std::memcpy(static_cast<char*>(p.constants->data()) + p.constant_at[c.fold[k]],
                  value[k]->data(), bytes);
  }
  runtime::count(runtime::Counter::FoldedConstants, static_cast<int64_t>(c.fold.size()));
}

}  // namespace lockstep::backends::cpu
