// The backend-neutral passes over a Plan (plan.h), in the order a compiler runs them; each is a
// function of its own file. What is a backend's own (which kernels run which nodes, layouts,
// library copies) is in its passes (backends/cpu/passes.h); these decide the rest.
#pragma once

#include <functional>

#include "plan/plan.h"

namespace lockstep::plan {

// fusion.cpp: which fusible nodes are computed inside their consumers' trees (Plan::absorbed)
// instead of being written to memory, by a cost model of memory traffic.
struct FusionRules {
  // Whether a node may be part of an elementwise tree.
  std::function<bool(const ir::Graph&, int32_t)> fusible;
  // Whether reduction `consumer` can read operand `operand` through a tree (the backend's
  // reductions walk it in long enough contiguous runs).
  std::function<bool(const ir::Graph&, int32_t consumer, int32_t operand)> reduction_takes;
  // Whether a node is a view that trees read as a leaf of its operand, through strides (a
  // permute): absorbed when every consumer is a tree node of its shape; its operand stays in
  // memory. May be empty.
  std::function<bool(const ir::Graph&, int32_t)> view_leaf;
  // Largest tree (in instructions) recomputed in each of several consumers.
  int recompute_limit = 8;
};
void choose_fusion(Plan& plan, const FusionRules& rules);

// steps.cpp: drops the steps whose values no output needs (e.g. a transpose a matmul reads
// through strides).
void drop_unread_steps(Plan& plan);

// schedule.cpp: refines the step order (a convolution's weight gradient next to its input
// gradient, so that their shared operand copy lives one step).
void schedule(Plan& plan);

// checks.cpp: each data check (an index range) runs as a step of its own, as early as it can.
void add_checks(Plan& plan);

// memory.cpp: where every value lives (inputs, outputs, aliases, one arena by liveness), which
// outputs may overwrite an input (donations), the steps that run before the outputs are
// allocated, and the bytes a run takes (Plan::planned).
void plan_memory(Plan& plan);
// Per node, the node whose memory its value lives in, as plan_memory lays them out: reshapes
// and contiguous slices (slice_offset) that are steps and not outputs alias their operand's;
// every other value is its own.
std::vector<int32_t> memory_roots(const Plan& plan);
// Where a slice's values start in its operand's memory, in bytes, when they are one run of it (a
// slice of the first axis longer than 1, of step 1, or of a single index: an LSTM's time steps
// unbound from one product), so that it can live there; -1 for any other node.
int64_t slice_offset(const ir::Graph& g, int32_t id);

// verify.cpp: the invariants every pass keeps (sizes, one writer per value, reads after writes);
// throws InternalError naming the pass `after`. run_pipeline runs it between passes in debug
// builds and with LOCKSTEP_VERIFY_PLANS=1.
void verify_plan(const Plan& plan, const char* after);

// preflight.cpp: the memory preflight. Throws Error when the plan needs more than `limit` bytes,
// naming what it needs and the largest values with their lines; `backend` names the backend.
void check_memory(const Plan& plan, size_t limit, const char* backend);

}  // namespace lockstep::plan
