// The scheduling pass: the step order, refined. The order of the graph is a valid one, but it
// computes some values long before they are needed and reads others long after they were written.
#include <algorithm>

#include "plan/passes.h"

namespace lockstep::plan {

// A weight gradient moves up to right after the input gradient of the same convolution (both
// read the output gradient): its operands are ready there, the shared copy of the output
// gradient (the cpu's share_conv_copies) lives for one step instead of hundreds, and so do the
// operands' last reads.
void schedule(Plan& p) {
  const ir::Graph& g = p.graph;
  std::vector<Step>& steps = p.steps;
  std::vector<int> producer = p.producers();
  for (size_t w = 0; w < steps.size(); ++w) {
    const ir::GraphNode& wn = g.nodes[steps[w].node];
    if (steps[w].kind != StepKind::Conv || wn.op != ir::Op::Conv2dBackwardWeight) continue;
    const int dy_step = producer[wn.operands[1]];
    for (size_t d = static_cast<size_t>(std::max(dy_step, 0)); d + 1 < w; ++d) {
      const ir::GraphNode& dn = g.nodes[steps[d].node];
      if (steps[d].kind != StepKind::Conv || dn.op != ir::Op::Conv2dBackwardInput ||
          dn.operands[0] != wn.operands[1])
        continue;
      bool ready = true;
      for (int32_t r : steps[w].reads) ready = ready && producer[r] <= static_cast<int>(d);
      if (!ready) break;
      Step moved = std::move(steps[w]);
      steps.erase(steps.begin() + static_cast<std::ptrdiff_t>(w));
      steps.insert(steps.begin() + static_cast<std::ptrdiff_t>(d) + 1, std::move(moved));
      producer = p.producers();
      break;
    }
  }
}

}  // namespace lockstep::plan
