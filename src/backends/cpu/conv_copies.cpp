// The convolution copies pass: a value several convolutions copy to the same oneDNN layout is
// copied once, into memory of its own planned by lifetime (plan::Plan::copies_bytes).
#include <array>
#include <map>

#include "backends/cpu/passes.h"
#include "plan/first_fit.h"
#include "runtime/metrics.h"

namespace lockstep::backends::cpu {

// A value that several convolutions copy to the same oneDNN layout is copied once: a forward
// convolution's input, copied again by its weight gradient, and an output gradient, copied by
// both backward convolutions. The first of them in step order writes the copy, the others read
// it. The copies live in their own memory, planned like the arena (first fit by lifetime).
void share_conv_copies(plan::Plan& p) {
  struct Use {
    size_t step;
    int k;
  };
  std::vector<std::vector<Use>> groups;
  std::vector<int32_t> group_value;
  for (size_t s = 0; s < p.steps.size(); ++s) {
    if (!kernel(p.steps[s]).conv) continue;
    for (int k = 0; k < 2; ++k) {
      if (kernel(p.steps[s]).conv->copy_floats(k) == 0) continue;
      const int32_t v = p.graph.nodes[p.steps[s].node].operands[k];
      bool joined = false;
      for (size_t gi = 0; gi < groups.size() && !joined; ++gi) {
        const Use& u = groups[gi][0];
        if (group_value[gi] == v &&
            kernel(p.steps[s]).conv->same_copy(k, *kernel(p.steps[u.step]).conv, u.k)) {
          groups[gi].push_back({s, k});
          joined = true;
        }
      }
      if (!joined) {
        groups.push_back({{s, k}});
        group_value.push_back(v);
      }
    }
  }
  plan::FirstFit fit;
  using Place = std::pair<int64_t, bool>;         // see run_conv_step
  std::map<size_t, std::array<Place, 2>> places;  // by step, for steps that share a copy
  for (const std::vector<Use>& uses : groups) {
    if (uses.size() < 2) continue;
    const size_t first = uses.front().step, last = uses.back().step;
    const size_t offset = fit.place(kernel(p.steps[first]).conv->copy_floats(uses.front().k),
                                    static_cast<int64_t>(first), static_cast<int64_t>(last));
    runtime::count(runtime::Counter::SharedConvCopies, static_cast<int64_t>(uses.size() - 1));
    for (const Use& u : uses) {
      auto [it, fresh] =
          places.try_emplace(u.step, std::array<Place, 2>{Place{-1, false}, Place{-1, false}});
      it->second[u.k] = {static_cast<int64_t>(offset), u.step == first};
    }
  }
  p.copies_bytes = fit.peak() * sizeof(float);
  for (const auto& [s, place] : places) {
    plan::Step& st = p.steps[s];
    const ir::GraphNode& n = p.graph.nodes[st.node];
    kernel(st).run =
        run_conv_step(kernel(st).conv, n.operands[0], n.operands[1], st.node, place[0], place[1]);
  }
}

}  // namespace lockstep::backends::cpu
