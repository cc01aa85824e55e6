// The plan verifier: invariants every pass must keep, checked before the first pass and after
// each one (run_pipeline) in debug builds and when LOCKSTEP_VERIFY_PLANS=1 (the tests set it). It
// reads the plan and never changes it; a broken invariant is an InternalError naming the pass.
#include <string>
#include <vector>

#include "plan/passes.h"
#include "util/check.h"

namespace lockstep::plan {
namespace {

using util::cat;

[[noreturn]] void broken(const char* after, const std::string& what) {
  util::internal_fail(__FILE__, __LINE__, cat("plan invariant broken after ", after, ": ", what));
}

}  // namespace

void verify_plan(const Plan& p, const char* after) {
  const size_t n = p.graph.nodes.size();
  const auto in_range = [&](int32_t v) { return v >= 0 && static_cast<size_t>(v) < n; };
  // Per-node decisions cover every node.
  if (p.consumers.size() != n || p.is_output.size() != n || p.run_time.size() != n ||
      p.constant_at.size() != n || p.absorbed.size() != n || p.merged.size() != n)
    broken(after, cat("per-node decisions do not cover the graph's ", n, " nodes"));
  if (!p.slot.empty() && p.slot.size() != n)
    broken(after, cat("the memory plan has ", p.slot.size(), " slots for ", n, " nodes"));
  for (int32_t o : p.graph.outputs)
    if (!in_range(o) || !p.is_output[o]) broken(after, cat("output %", o, " is not marked one"));
  // Each value is written by at most one step, never one folded to a constant, and read by a
  // step only after the step that writes it, or by that step itself (a merged step's members
  // read the values its earlier members computed).
  std::vector<int> writer(n, -1);
  for (size_t s = 0; s < p.steps.size(); ++s) {
    const Step& step = p.steps[s];
    if (!in_range(step.node)) broken(after, cat("step ", s, " is about node %", step.node));
    for (int32_t w : step.writes()) {
      if (!in_range(w)) broken(after, cat("step ", s, " writes node %", w));
      if (writer[w] >= 0)
        broken(after, cat("%", w, " is written by steps ", writer[w], " and ", s));
      if (p.constant_at[w] >= 0)
        broken(after, cat("step ", s, " writes %", w, ", which is folded to a constant"));
      writer[w] = static_cast<int>(s);
    }
    for (int32_t r : step.reads)
      if (!in_range(r)) broken(after, cat("step ", s, " reads node %", r));
  }
  for (size_t s = 0; s < p.steps.size(); ++s)
    for (int32_t r : p.steps[s].reads)
      if (writer[r] > static_cast<int>(s))
        broken(after, cat("step ", s, " reads %", r, " before step ", writer[r], " writes it"));
  if (p.last_can_fail >= static_cast<int>(p.steps.size()))
    broken(after, cat("the last step that may fail is ", p.last_can_fail, " of ", p.steps.size()));
}

}  // namespace lockstep::plan
