// The checks pass: each data check (an index range) runs as early as it can: first when the
// value it checks is an input, or computed from inputs alone by small steps (nll_loss's masked
// labels), which move to the front with it; else right after the step that computes the value. A
// failing check then comes before any parameter is updated in place and before the outputs are
// allocated, so a failed run has nothing to put back and a passing one keeps nothing aside.
#include <functional>

#include "plan/passes.h"
#include "util/check.h"

namespace lockstep::plan {

void add_checks(Plan& p) {
  const size_t n = p.graph.nodes.size();
  std::vector<Step>& steps = p.steps;
  const std::vector<int> producer = p.producers();
  // Values available before any step runs, and the small steps that may move to the front.
  constexpr size_t kSmallBytes = size_t{1} << 20;
  std::vector<char> early(n, 0);  // 0 unknown, 1 early, 2 not
  std::vector<bool> hoisted(steps.size(), false);
  std::function<bool(int32_t)> is_early = [&](int32_t v) -> bool {
    if (early[v]) return early[v] == 1;
    early[v] = 2;
    const int at = producer[v];
    if (at < 0) {
      early[v] = 1;  // an input or a constant
      return true;
    }
    const Step& s = steps[at];
    // Not a check, a fused elementwise step or a library convolution: those are not small. Nor
    // a step with a check of its own (a gather of indices gathered from an input): its check
    // must run before it, and the hoisted steps run before every check.
    bool ok = s.kind != StepKind::Check && s.kind != StepKind::Elementwise &&
              s.kind != StepKind::Conv && !s.can_fail && s.checked < 0;
    for (int32_t w : s.writes())
      ok = ok && bytes_of(p.graph.nodes[w]) <= kSmallBytes && !p.is_output[w];
    for (int32_t r : s.reads) ok = ok && is_early(r);
    if (ok) {
      hoisted[at] = true;
      for (int32_t w : s.writes()) early[w] = 1;
    }
    return ok;
  };
  for (const Step& s : steps)
    if (s.checked >= 0) is_early(s.checked);
  // position[v]: 1 + the index of the step that computes v in the new order; 0 for values
  // available before the first step that is not hoisted.
  std::vector<int> position(n, 0);
  for (size_t k = 0; k < steps.size(); ++k)
    if (!hoisted[k])
      for (int32_t w : steps[k].writes()) position[w] = static_cast<int>(k) + 1;
  std::vector<std::vector<Step>> after(steps.size() + 1);  // the checks after step k - 1
  for (Step& s : steps) {
    if (s.checked < 0) continue;
    Step check;
    check.label = "check";
    check.detail = util::cat("check of ", ir::op_info(p.graph.nodes[s.node].op).name, " %", s.node);
    check.node = s.node;
    check.reads = {s.checked};
    check.kind = StepKind::Check;
    check.can_fail = true;
    check.payload = s.payload->take_check();
    LS_INTERNAL_CHECK(check.payload != nullptr, "a checked step without a check");
    const int32_t checked = s.checked;
    s.checked = -1;
    after[position[checked]].push_back(std::move(check));
  }
  std::vector<Step> out;
  out.reserve(steps.size());
  for (size_t k = 0; k < steps.size(); ++k)
    if (hoisted[k]) out.push_back(std::move(steps[k]));
  for (Step& c : after[0]) out.push_back(std::move(c));
  for (size_t k = 0; k < steps.size(); ++k) {
    if (!hoisted[k]) out.push_back(std::move(steps[k]));
    for (Step& c : after[k + 1]) out.push_back(std::move(c));
  }
  steps = std::move(out);
}

}  // namespace lockstep::plan
