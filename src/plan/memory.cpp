// The memory pass: where every value lives during a run. Inputs and folded constants stay where
// they are; outputs get memory of their own (or take over an input: donations); reshapes alias
// their operand; everything else, and the regions that hold no output, gets an offset in one
// arena, reused by liveness (first fit).
// Then: the leading steps that may run before the outputs are allocated, and the bytes a run
// takes, with the values live at its peak (the memory preflight's message).
#include <algorithm>

#include "ir/attrs.h"
#include "plan/first_fit.h"
#include "plan/passes.h"
#include "util/check.h"

namespace lockstep::plan {
namespace {

// An output computed by an elementwise step may take over the memory of an input (a Data node)
// that the step reads element for element and nothing reads afterwards: an optimizer's update
// writes the new parameter where the old one was. Whether it may, the runtime says per run (no
// one else may still hold the old value); this plans which input each output would take.
void plan_donations(Plan& p, const std::vector<int>& last, const std::vector<int32_t>& root) {
  const ir::Graph& g = p.graph;
  p.donor.assign(g.outputs.size(), -1);
  p.donor_step.assign(g.outputs.size(), -1);
  p.last_can_fail = -1;
  for (size_t si = 0; si < p.steps.size(); ++si)
    if (p.steps[si].can_fail) p.last_can_fail = static_cast<int>(si);
  std::vector<bool> taken(g.nodes.size(), false);
  std::vector<int> output_number(g.nodes.size(), -1);
  for (size_t k = 0; k < g.outputs.size(); ++k)
    if (output_number[g.outputs[k]] < 0) output_number[g.outputs[k]] = static_cast<int>(k);
  for (size_t si = 0; si < p.steps.size(); ++si) {
    const std::vector<Member>& members = p.steps[si].members;
    for (size_t m = 0; m < members.size(); ++m) {
      const int32_t id = members[m].node;
      if (output_number[id] < 0) continue;
      for (int32_t in : members[m].elementwise_reads) {
        const ir::GraphNode& src = g.nodes[in];
        if (src.op != ir::Op::Data || taken[in] || p.is_output[in] ||
            src.dtype != g.nodes[id].dtype || bytes_of(src) != bytes_of(g.nodes[id]) ||
            last[root[in]] != static_cast<int>(si))
          continue;
        // Later members of the step must not read the old value after this one overwrote it.
        bool later_reads = false;
        for (size_t m2 = m + 1; m2 < members.size(); ++m2) {
          const std::vector<int32_t>& r = members[m2].reads;
          later_reads = later_reads || std::find(r.begin(), r.end(), in) != r.end();
        }
        if (later_reads) continue;
        taken[in] = true;
        p.donor[output_number[id]] = src.input;
        p.donor_step[output_number[id]] = static_cast<int>(si);
        break;
      }
    }
  }
}

}  // namespace

int64_t slice_offset(const ir::Graph& g, int32_t id) {
  const ir::GraphNode& n = g.nodes[id];
  if (n.op != ir::Op::Slice) return -1;
  const Shape& x = g.nodes[n.operands[0]].shape;
  const ir::SliceAttrs a = ir::SliceAttrs::of(n.attrs);
  for (int64_t d = 0; d < a.axis; ++d)
    if (x[d] != 1) return -1;  // rows of it, apart
  if (a.step != 1 && n.shape[a.axis] > 1) return -1;
  int64_t inner = 1;
  for (size_t d = static_cast<size_t>(a.axis) + 1; d < x.size(); ++d) inner *= x[d];
  return a.start * inner * static_cast<int64_t>(dtype_size(n.dtype));
}

std::vector<int32_t> memory_roots(const Plan& p) {
  const ir::Graph& g = p.graph;
  std::vector<int32_t> root(g.nodes.size());
  for (size_t i = 0; i < root.size(); ++i) root[i] = static_cast<int32_t>(i);
  for (const Step& s : p.steps) {
    const ir::GraphNode& node = g.nodes[s.node];
    if (s.kind != StepKind::Check && !p.is_output[s.node] &&
        (node.op == ir::Op::Reshape || slice_offset(g, s.node) >= 0))
      root[s.node] = root[node.operands[0]];
  }
  return root;
}

void plan_memory(Plan& p) {
  const ir::Graph& g = p.graph;
  const size_t n = g.nodes.size();
  p.slot.assign(n, Slot{});
  for (size_t i = 0; i < n; ++i) {
    if (g.nodes[i].op == ir::Op::Data) p.slot[i] = {Slot::Input, g.nodes[i].input};
    if (p.constant_at[i] >= 0) p.slot[i] = {Slot::Constant, p.constant_at[i]};
  }
  for (int32_t o : g.outputs) p.slot[o] = {Slot::Output, 0};
  // Reshapes and contiguous slices that are not outputs alias their operand's memory.
  const std::vector<int32_t> root = memory_roots(p);
  for (size_t i = 0; i < n; ++i)
    if (root[i] != static_cast<int32_t>(i))
      p.slot[i] = {Slot::Alias, g.nodes[i].operands[0], -1,
                   std::max<int64_t>(0, slice_offset(g, static_cast<int32_t>(i)))};
  // Values a pass laid out in a region (outputs among them: slices of it).
  for (size_t i = 0; i < p.placed.size() && i < n; ++i)
    if (p.placed[i].first >= 0) {
      LS_INTERNAL_CHECK(p.slot[i].kind == Slot::None || p.slot[i].kind == Slot::Output,
                        "a value placed in a region must be computed by the program");
      p.slot[i] = {Slot::Region, p.placed[i].second, p.placed[i].first};
    }
  // Liveness in step order, by the memory each value really lives in.
  std::vector<int> first(n, -1), last(n, -1);
  auto taken = [&](const Step& s) {  // the values whose memory a step starts to use
    std::vector<int32_t> w = s.writes();
    w.insert(w.end(), s.receives.begin(), s.receives.end());
    return w;
  };
  for (size_t s = 0; s < p.steps.size(); ++s) {
    for (int32_t written : taken(p.steps[s])) {
      const int32_t w = root[written];
      if (first[w] < 0) first[w] = static_cast<int>(s);
      last[w] = std::max(last[w], static_cast<int>(s));
    }
    for (int32_t r : p.steps[s].reads) last[root[r]] = std::max(last[root[r]], static_cast<int>(s));
  }
  // Each region's life: from the first step that uses it (a value there, or the region itself)
  // to the last; whether it goes in the arena (it holds no output).
  const size_t nr = p.regions.size();
  std::vector<int> region_first(nr, -1), region_last(nr, -1);
  std::vector<bool> region_in_arena(nr, true);
  auto use_region = [&](int32_t r, int s) {
    if (s < 0) return;
    if (region_first[r] < 0 || s < region_first[r]) region_first[r] = s;
    region_last[r] = std::max(region_last[r], s);
  };
  for (size_t i = 0; i < n; ++i)
    if (p.slot[i].kind == Slot::Region) {
      const int32_t r = p.slot[i].region;
      if (p.is_output[i]) region_in_arena[r] = false;
      use_region(r, first[i]);
      use_region(r, last[i]);
    }
  for (size_t s = 0; s < p.steps.size(); ++s)
    if (p.steps[s].region >= 0) use_region(p.steps[s].region, static_cast<int>(s));
  // Greedy first-fit offsets in one arena, 64-byte aligned.
  FirstFit fit;
  p.region_at.assign(nr, -1);
  std::vector<std::vector<int32_t>> regions_from(p.steps.size());
  for (size_t r = 0; r < nr; ++r)
    if (region_in_arena[r] && region_first[r] >= 0)
      regions_from[static_cast<size_t>(region_first[r])].push_back(static_cast<int32_t>(r));
  for (size_t s = 0; s < p.steps.size(); ++s) {
    for (int32_t r : regions_from[s])
      p.region_at[r] = static_cast<int64_t>(
          fit.place((p.regions[r] + 63) / 64 * 64, static_cast<int64_t>(s), region_last[r]));
    for (int32_t id : taken(p.steps[s])) {
      if (p.slot[id].kind != Slot::None || root[id] != id) continue;
      const size_t size = (bytes_of(g.nodes[id]) + 63) / 64 * 64;
      p.slot[id] = {Slot::Arena,
                    static_cast<int64_t>(fit.place(size, static_cast<int64_t>(s), last[id]))};
    }
  }
  p.arena_bytes = fit.peak();
  plan_donations(p, last, root);

  // The leading steps that write no output or donated input run before the outputs are
  // allocated, up to the last step that may throw at most.
  auto writes_output = [&](const Step& s) {
    const std::vector<int32_t> w = taken(s);
    return std::any_of(w.begin(), w.end(), [&](int32_t v) {
      int32_t r = v;
      while (p.slot[r].kind == Slot::Alias) r = static_cast<int32_t>(p.slot[r].index);
      return p.slot[r].kind == Slot::Output || p.slot[r].kind == Slot::Input;
    });
  };
  p.prefix = 0;
  while (static_cast<int>(p.prefix) <= p.last_can_fail && !writes_output(p.steps[p.prefix]))
    ++p.prefix;

  // What a run takes: the arena, the outputs (all allocated: the most, when none is updated in
  // place), the backend's copies, the largest scratch one step takes, constants.
  p.planned = {};
  p.planned.arena = p.arena_bytes;
  for (int32_t o : g.outputs)
    if (p.slot[o].kind != Slot::Region) p.planned.outputs += bytes_of(g.nodes[o]);
  for (size_t r = 0; r < nr; ++r)
    if (p.region_at[r] < 0) p.planned.outputs += p.regions[r];
  p.planned.copies = p.copies_bytes;
  for (const Step& s : p.steps) p.planned.scratch = std::max(p.planned.scratch, s.scratch_bytes);
  p.planned.constants = p.constants ? p.constants->bytes() : 0;
  // The arena values live together at the step where the most bytes are live (the arena is at
  // least that big; first fit may leave gaps).
  std::vector<int64_t> delta(p.steps.size() + 1, 0);
  for (size_t i = 0; i < n; ++i)
    if (p.slot[i].kind == Slot::Arena && first[i] >= 0) {
      delta[first[i]] += static_cast<int64_t>(bytes_of(g.nodes[i]));
      delta[last[i] + 1] -= static_cast<int64_t>(bytes_of(g.nodes[i]));
    }
  for (size_t r = 0; r < nr; ++r)
    if (p.region_at[r] >= 0) {
      delta[region_first[r]] += static_cast<int64_t>(p.regions[r]);
      delta[region_last[r] + 1] -= static_cast<int64_t>(p.regions[r]);
    }
  int64_t live = 0, most = -1;
  int peak = 0;
  for (size_t s = 0; s < p.steps.size(); ++s) {
    live += delta[s];
    if (live > most) most = live, peak = static_cast<int>(s);
  }
  p.live_at_peak.clear();
  for (size_t i = 0; i < n; ++i)
    if (p.slot[i].kind == Slot::Arena && first[i] >= 0 && first[i] <= peak && last[i] >= peak)
      p.live_at_peak.push_back(static_cast<int32_t>(i));
}

}  // namespace lockstep::plan
