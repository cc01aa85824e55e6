// Plan: construction, the producers index, and the text form (to_text).
#include "plan/plan.h"

#include <cstdio>

#include "util/check.h"

namespace lockstep::plan {

std::vector<int32_t> Step::writes() const {
  if (kind == StepKind::Check || kind == StepKind::Start) return {};
  std::vector<int32_t> w{node};
  w.insert(w.end(), extras.begin(), extras.end());
  return w;
}

Plan::Plan(ir::Graph g) : graph(std::move(g)) {
  const size_t n = graph.nodes.size();
  consumers.assign(n, {});
  is_output.assign(n, false);
  for (size_t i = 0; i < n; ++i)
    for (int32_t o : graph.nodes[i].operands) consumers[o].push_back(static_cast<int32_t>(i));
  for (int32_t o : graph.outputs) is_output[o] = true;
  run_time.assign(n, true);
  constant_at.assign(n, -1);
  absorbed.assign(n, false);
  merged.assign(n, false);
}

std::vector<int> Plan::producers() const {
  std::vector<int> producer(graph.nodes.size(), -1);
  for (size_t s = 0; s < steps.size(); ++s)
    for (int32_t v : steps[s].writes()) producer[v] = static_cast<int>(s);
  return producer;
}

size_t bytes_of(const ir::GraphNode& n) {
  return static_cast<size_t>(shape_numel(n.shape)) * dtype_size(n.dtype);
}

namespace {

const char* slot_name(Slot::Kind k) {
  switch (k) {
    case Slot::None:
      return "none";
    case Slot::Input:
      return "input";
    case Slot::Arena:
      return "arena";
    case Slot::Output:
      return "output";
    case Slot::Alias:
      return "alias";
    case Slot::Constant:
      return "constant";
    case Slot::Region:
      return "region";
  }
  return "?";
}

void appendf(std::string& out, const char* format, auto... args) {
  const int n = std::snprintf(nullptr, 0, format, args...);
  const size_t at = out.size();
  out.resize(at + static_cast<size_t>(n) + 1);
  std::snprintf(out.data() + at, static_cast<size_t>(n) + 1, format, args...);
  out.resize(at + static_cast<size_t>(n));
}

}  // namespace

std::string to_text(const Plan& p, bool decisions) {
  const ir::Graph& g = p.graph;
  std::string out;
  // The data checks end at step `last_can_fail` (-1: none); the first `prefix` steps run before
  // the outputs are allocated.
  appendf(out, "arena %zu bytes, %zu steps, last check at step %d, %zu steps before outputs\n",
          p.arena_bytes, p.steps.size(), p.last_can_fail, p.prefix);
  if (decisions) {
    // What was decided per node: "%7 add f32[64, 10] absorbed nChw16c slot arena@128".
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      const ir::GraphNode& n = g.nodes[i];
      std::string what;
      if (p.is_output[i]) what += " output";
      if (!p.run_time[i]) what += " folded";
      if (p.absorbed[i]) what += " absorbed";
      if (p.merged[i]) what += " merged";
      if (p.decisions) what += p.decisions->describe(static_cast<int32_t>(i));
      if (i < p.slot.size() && p.slot[i].kind != Slot::None)
        what += util::cat(" slot ", slot_name(p.slot[i].kind),
                          p.slot[i].kind == Slot::Region ? util::cat(p.slot[i].region) : "", "@",
                          p.slot[i].index);
      appendf(out, "node %%%zu %s %s%s%s\n", i, ir::op_info(n.op).name, dtype_name(n.dtype),
              shape_str(n.shape).c_str(), what.c_str());
    }
  }
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (p.constant_at[i] >= 0)
      appendf(out, "%%%zu constant %s%s (folded)\n", i, dtype_name(g.nodes[i].dtype),
              shape_str(g.nodes[i].shape).c_str());
  auto mark = [&](int32_t v) { return p.decisions ? p.decisions->mark(v) : ""; };
  for (const Step& s : p.steps) {
    const ir::GraphNode& n = g.nodes[s.node];
    std::string reads;
    for (int32_t r : s.reads) reads += util::cat(" %", r, shape_str(g.nodes[r].shape), mark(r));
    appendf(out, "%%%d %s %s%s%s <-%s  %s\n", s.node, s.label, dtype_name(n.dtype),
            shape_str(n.shape).c_str(), p.decisions ? p.decisions->step_mark(s.node) : "",
            reads.c_str(), s.detail.c_str());
  }
  if (decisions && !p.donor.empty()) {
    for (size_t k = 0; k < p.donor.size(); ++k)
      if (p.donor[k] >= 0)
        appendf(out, "output %zu may overwrite input %d at step %d\n", k, p.donor[k],
                p.donor_step[k]);
  }
  return out;
}

}  // namespace lockstep::plan
