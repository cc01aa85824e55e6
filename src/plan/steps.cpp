// drop_unread_steps: a step survives only if an output needs what it writes.
#include <algorithm>

#include "plan/passes.h"

namespace lockstep::plan {

void drop_unread_steps(Plan& p) {
  std::vector<bool> needed(p.graph.nodes.size(), false);
  for (int32_t o : p.graph.outputs) needed[o] = true;
  std::vector<Step> kept;
  for (size_t s = p.steps.size(); s-- > 0;) {
    bool any = false;
    for (int32_t w : p.steps[s].writes()) any = any || needed[w];
    if (!any) continue;
    for (int32_t r : p.steps[s].reads) needed[r] = true;
    kept.push_back(std::move(p.steps[s]));
  }
  std::reverse(kept.begin(), kept.end());
  p.steps = std::move(kept);
}

}  // namespace lockstep::plan
