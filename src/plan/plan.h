// The plan a backend's compiler builds for one graph, and that its passes read and write: the
// graph, a decision per node (fused into its consumers, folded to a constant, layout), the steps
// that compute the rest in order, and where every value lives (the memory plan). Printable as
// text (to_text), so that every pass can be tested as plan text in, plan text out, and a
// decision traced to the pass that made it (LOCKSTEP_DUMP_PASSES, see pipeline.h).
//
// A step's backend-specific part (the kernel that runs it) is an opaque StepPayload: the
// backend-neutral passes (passes.h) reorder, merge and place steps without knowing it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "ir/ir.h"

namespace lockstep::plan {

// What a step runs, as far as the backend-neutral passes need to know.
enum class StepKind : uint8_t {
  Kernel,       // anything else: one op by a kernel of the backend's own (or ref)
  Elementwise,  // a fused elementwise tree, or a group of them (see Member)
  Reduction,    // a reduction, possibly over a fused tree
  Conv,         // a convolution (or its gradient) by a library that copies its operands
  Check,        // a data check of another step's operand (add_checks); writes nothing
  Start,        // starts work (a collective) that a later step finishes and writes; writes nothing
};

// The backend's part of a step: what runs it. Opaque to the neutral passes.
struct StepPayload {
  virtual ~StepPayload() = default;
  // Splits off the step's data check, to run as a step of its own (add_checks); null if none.
  virtual std::shared_ptr<StepPayload> take_check() { return nullptr; }
};

// One value an elementwise step writes, and the values it reads element for element (which the
// output may overwrite: see plan_memory's donations).
struct Member {
  int32_t node = -1;
  std::vector<int32_t> reads;              // every value its tree reads
  std::vector<int32_t> elementwise_reads;  // those read at the same index as it writes
};

struct Step {
  const char* label = "";  // the kind of kernel, for dumps and LOCKSTEP_PROFILE
  std::string detail;      // for dumps
  // The value it writes (a check: the op whose operand it checks; a start: the first value the
  // step that finishes its work writes).
  int32_t node = -1;
  std::vector<int32_t> extras;  // further values it writes
  std::vector<int32_t> reads;   // values it reads
  StepKind kind = StepKind::Kernel;
  std::vector<Member> members;  // Elementwise: the values it writes, in the order it computes them
  // Whether it checks its data and may throw (indices out of range, integer division by zero).
  bool can_fail = false;
  // An operand it checks (an index), whose check add_checks moves into a step of its own so that
  // it runs as early as it can; -1 if none.
  int32_t checked = -1;
  size_t scratch_bytes = 0;  // of scratch memory shared between steps, while it runs
  // A start: values its collective writes before the step that finishes it (a gather's
  // destination), whose memory is in use from this step on.
  std::vector<int32_t> receives;
  // A region of the plan (Plan::regions) the step reads or writes besides its values' (a bucket's
  // start packs gradients into it, its wait reads the sums from it); -1 if none.
  int32_t region = -1;
  std::shared_ptr<StepPayload> payload;
  // The values it writes: node, then extras (a check writes nothing).
  std::vector<int32_t> writes() const;
};

// Where a value lives during a run.
struct Slot {
  enum Kind { None, Input, Arena, Output, Alias, Constant, Region } kind = None;
  // Input number, arena offset, output number, aliased node, offset among the constants, or
  // offset in its region.
  int64_t index = 0;
  int32_t region = -1;  // Region: which of the plan's regions (an output there is a slice of it)
  int64_t offset = 0;   // Alias: bytes into the aliased node's memory (a contiguous slice)
};

// A backend's own decisions per node (the cpu's: which values it holds in oneDNN's blocked
// layout, which convolutions run as Winograd), kept in the plan for that backend's passes and
// shown in the plan's text, opaque to the neutral passes.
struct BackendDecisions {
  virtual ~BackendDecisions() = default;
  // What was decided for `node`, for to_text's per-node lines: "" or words each after a space.
  virtual std::string describe(int32_t node) const = 0;
  // A mark after a value read or written by a step ("(nChw16c)"), or "".
  virtual const char* mark(int32_t value) const = 0;
  // The mark after the value a step writes (it may say how the step walks its input).
  virtual const char* step_mark(int32_t node) const { return mark(node); }
};

// The bytes a run takes besides its inputs (plan_memory): checked against ls::memory_limit().
struct PlannedBytes {
  size_t arena = 0, outputs = 0, copies = 0, scratch = 0, constants = 0;
  size_t total() const { return arena + outputs + copies + scratch + constants; }
};

struct Plan {
  explicit Plan(ir::Graph g);

  ir::Graph graph;
  // Facts about the graph.
  std::vector<std::vector<int32_t>> consumers;  // per node, the nodes that read it (repeats kept)
  std::vector<bool> is_output;
  // Decisions, per node.
  std::vector<bool> run_time;        // computed by a step (false: folded at compile time)
  std::vector<int64_t> constant_at;  // offset of a folded constant in `constants`, else -1
  std::vector<bool> absorbed;        // computed inside its consumers' fused trees
  std::vector<bool> merged;          // computed by another node's step
  std::shared_ptr<BackendDecisions> decisions;   // the backend's own (null: none)
  std::shared_ptr<backends::Storage> constants;  // the folded values
  // The steps, in the order they run.
  std::vector<Step> steps;
  // The memory plan.
  std::vector<Slot> slot;
  size_t arena_bytes = 0;
  size_t copies_bytes = 0;      // a backend's own memory for operand copies (cpu: oneDNN's)
  std::vector<int32_t> donor;   // per output: the input it may overwrite, or -1
  std::vector<int> donor_step;  // per output: the step that overwrites it (-1: none)
  int last_can_fail = -1;       // the last step that may throw (-1: none)
  size_t prefix = 0;            // leading steps that write no output (up to last_can_fail)
  PlannedBytes planned;
  std::vector<int32_t> live_at_peak;  // arena values live at the step where most bytes are
  // Blocks of memory that a backend's pass lays values out in (the cpu: each all-reduce bucket, its
  // gradients side by side): the bytes of each region, and per node (or empty) the
  // {region, offset} plan_memory gives it (region -1: none). plan_memory places a region that
  // holds no output in the arena, live from the first step that uses it to the last
  // (region_at: its offset); one that holds outputs (slices of it, which the caller keeps) is
  // allocated for every run (region_at -1).
  std::vector<size_t> regions;
  std::vector<std::pair<int32_t, int64_t>> placed;
  std::vector<int64_t> region_at;

  // The step that writes each value (-1: none), in the current order.
  std::vector<int> producers() const;
};

size_t bytes_of(const ir::GraphNode& n);

// The plan as text. The final plan's form (what LOCKSTEP_DUMP writes): a header line (arena,
// steps, checks), the folded constants, then a line per step:
//   %12 fused f32[64, 10] <- %3[64, 10] %11[10]  <detail>
// with "(nChw16c)" after a value held blocked. `decisions` adds a line per node with what the
// passes decided for it so far (the form of the dumps after each pass).
std::string to_text(const Plan& plan, bool decisions = false);

}  // namespace lockstep::plan
