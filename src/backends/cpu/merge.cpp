// The merge passes: sums over one layout that a few steps apart need nothing computed in between
// walk their input together (merge_sums), and consecutive fused steps over the same number of
// elements run tile by tile together (merge_fused_steps).
#include <algorithm>

#include "backends/cpu/kernels.h"
#include "backends/cpu/passes.h"

namespace lockstep::backends::cpu {

using ir::Op;

// Consecutive fused steps over the same number of elements run as one group: per tile, each
// tree in turn, so a value one writes and the next reads (an optimizer's new momentum, then
// the parameter it moves) is still in cache; every read of a group member's value must be at
// the same element (no broadcast), which keeps tiles independent.
void merge_fused_steps(plan::Plan& p) {
  std::vector<plan::Step> out;
  for (plan::Step& s : p.steps) {
    // A host scalar reads nothing: it moves ahead of a fused step rather than separate it from
    // the next one.
    if (p.graph.nodes[s.node].op == Op::Scalar && !out.empty() && kernel(out.back()).fused) {
      out.insert(out.end() - 1, std::move(s));
      continue;
    }
    if (!out.empty() && kernel(out.back()).fused && kernel(s).fused) {
      plan::Step& g = out.back();
      const FusedTree& next = *kernel(s).fused->front().second;
      const int64_t numel = kernel(g).fused->front().second->numel();
      bool ok = next.numel() == numel && numel >= kTile;
      for (size_t k = 0; ok && k < next.leaf_nodes().size(); ++k)
        for (const auto& [node, tree] : *kernel(g).fused)
          if (next.leaf_nodes()[k] == node && !next.leaf_is_elementwise(k)) ok = false;
      if (ok) {
        kernel(g).fused->push_back(kernel(s).fused->front());
        g.extras.push_back(s.node);
        for (int32_t r : s.reads)
          if (std::find(g.reads.begin(), g.reads.end(), r) == g.reads.end()) g.reads.push_back(r);
        g.members = members_of(*kernel(g).fused);
        g.label = "fused_group";
        g.detail += "; " + s.detail;
        kernel(g).run = run_fused(kernel(g).fused);
        continue;
      }
    }
    out.push_back(std::move(s));
  }
  p.steps = std::move(out);
}

// Sums over the same values' layout (same input shape and axes) that a few steps apart need
// nothing computed in between run as one walk, reading their inputs once: batch norm's backward
// sums the output gradient and the gradient times the normalized input per channel.
void merge_sums(plan::Plan& p) {
  constexpr size_t kLookahead = 12;
  std::vector<bool> gone(p.steps.size(), false);
  for (size_t i = 0; i < p.steps.size(); ++i) {
    if (gone[i] || !kernel(p.steps[i]).sum) continue;
    std::vector<size_t> members{i};
    // Values written by the members and the steps between: a sum that reads one (a softmax's
    // backward sums a value divided by the forward's sum) cannot share the walk.
    std::vector<int32_t> written = p.steps[i].writes();
    for (size_t j = i + 1; j < p.steps.size() && j <= i + kLookahead; ++j) {
      if (gone[j]) continue;
      const plan::Step& t = p.steps[j];
      bool depends = false;
      for (int32_t r : t.reads)
        depends = depends || std::find(written.begin(), written.end(), r) != written.end();
      if (kernel(t).sum && !depends && kernel(t).sum->in == kernel(p.steps[i]).sum->in &&
          kernel(t).sum->attrs == kernel(p.steps[i]).sum->attrs) {
        members.push_back(j);
        gone[j] = true;
        const std::vector<int32_t> w = t.writes();
        written.insert(written.end(), w.begin(), w.end());
        continue;
      }
      const std::vector<int32_t> w = t.writes();
      written.insert(written.end(), w.begin(), w.end());
    }
    if (members.size() == 1) continue;
    plan::Step& s = p.steps[i];
    SumParts parts;
    for (size_t m : members) {
      parts.emplace_back(p.steps[m].node, kernel(p.steps[m]).sum);
      if (m == i) continue;
      s.extras.push_back(p.steps[m].node);
      for (int32_t r : p.steps[m].reads)
        if (std::find(s.reads.begin(), s.reads.end(), r) == s.reads.end()) s.reads.push_back(r);
      s.detail += "; " + p.steps[m].detail;
    }
    s.label = "sums";
    kernel(s).sum = nullptr;
    kernel(s).run = run_sums(std::move(parts));
  }
  std::vector<plan::Step> kept;
  for (size_t i = 0; i < p.steps.size(); ++i)
    if (!gone[i]) kept.push_back(std::move(p.steps[i]));
  p.steps = std::move(kept);
}

}  // namespace lockstep::backends::cpu
