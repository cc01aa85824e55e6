// Steps, syncs and metrics: the boundaries at which recorded work is hashed, compiled (or found
// in the compile cache) and run. Not here: the recording itself (ops.h).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "lockstep/loc.h"
#include "lockstep/tensor.h"

namespace lockstep {

// Materializes every live pending tensor, as one program per device. Returns once the work is
// enqueued; execution runs on the runtime thread while the caller records more.
void sync(Loc loc = Loc::current());
// Blocks until every enqueued program has run; rethrows an execution error not yet reported.
void wait();

// A transactional step. Syncs pending work on entry (so the step's program covers exactly what
// happens inside it) and on normal exit. If an exception leaves `fn`, every tensor changed in
// the step is restored to its value at entry, tensors created in it are poisoned, and the
// exception propagates unchanged. Steps do not nest.
//
// Threads: each thread that records has its own pending work and its own steps, so threads can
// train independent models at once. A step covers only the thread that entered it. While it
// runs, a tensor it changed or created may not be used by another thread; and an in-place update
// (add_, sub_, mul_, div_) computed from a value that another thread replaced meanwhile would be
// lost: both are an Error naming the threads. A tensor may move between threads between steps
// (made on one, trained on another).
void step(const std::function<void()>& fn, Loc loc = Loc::current());

// What a step does besides its transaction. `autocast`: the step's ops are recorded under
// ls::autocast(*autocast) (lockstep/autocast.h), e.g. {.autocast = ls::bf16}.
struct StepOptions {
  std::optional<DType> autocast;
};
void step(const std::function<void()>& fn, const StepOptions& options, Loc loc = Loc::current());

// The same as a scope guard: `{ ls::Step s; ...; }`. Its destructor tells normal exit from
// unwinding by std::uncaught_exceptions(). A step belongs to the thread that entered it: ending
// it on another thread is an Error (and, while unwinding, leaves the step to its own thread).
class Step {
 public:
  explicit Step(Loc loc = Loc::current());
  explicit Step(const StepOptions& options, Loc loc = Loc::current());
  ~Step() noexcept(false);
  Step(const Step&) = delete;
  Step& operator=(const Step&) = delete;
  // Ends the step now (sync on exit); the destructor then does nothing.
  void commit();
  // Ends the step now as an exception leaving it would: every tensor it changed is restored,
  // those it created are poisoned, and `reason` is what later uses of them are told. For
  // bindings whose exceptions do not unwind C++ (Python's `with`); the destructor then does
  // nothing.
  void rollback(const std::string& reason);
  // For a step dropped without being ended (a binding's step object collected, an interrupt
  // between a `with` block's end and its commit): rolls it back as an exception would, never
  // commits it. On the entering thread at once; from another thread the step is marked, and the
  // entering thread rolls it back at its next step entry or sync (until then it is still in that
  // step). Never throws; the destructor then does nothing.
  void abandon() noexcept;

 private:
  int uncaught_at_entry_;
  bool done_ = false;
  const void* context_;  // the entering thread's recording context
  void* state_;          // its state, owned by the entering thread (step.cpp)
};

// Zero-copy exchange (DLPack, NumPy): the host memory holding the tensor's current value
// (computed first if pending: a blocking read), row-major and contiguous, and an owner that keeps
// that memory alive. While any owner lives, lockstep never updates that memory in place: an
// in-place update of the tensor (an optimizer step on a parameter) then writes new memory, so
// what was exported keeps the values it had, never half of an update, and the update is not
// lost. The export waits for every program the calling thread has queued (a step's, a sync's), so
// none of them reads the memory while it is written; a program queued after it reads what was
// written by then (write, then queue the step). In a step closure it cannot wait for the steps
// queued after the closure's: write through an export taken outside closures. The memory is this
// handle's alone: where its value is shared (with a clone, a cat of one, an op recorded but not
// run), the handle first takes a copy of its own, so writing changes no other tensor. An Error for
// a tensor on a device without host memory.
struct HostMemory {
  void* data = nullptr;  // null for a tensor of no elements
  std::shared_ptr<void> owner;
};
HostMemory host_memory(const Tensor& t, Loc loc = Loc::current());

// Number of the current (or, outside a step, the last) step; the first step is 1.
int64_t current_step();
bool in_step();

// Runs `fn` after the current step's program has run, with its values ready. Closures run on
// the runtime thread in step order; an exception from one is raised at the next blocking point.
// A step whose program fails runs none of its closures: a loop that waits for a closure's
// signal must not wait forever, and asks check_errors() while it waits.
void add_step_closure(std::function<void()> fn, Loc loc = Loc::current());
// Raises, without waiting for programs still running, the first error of this thread's programs
// and closures not raised yet (after undoing its failed steps), as the next blocking point
// would; returns when there is none.
void check_errors();

// Threads the cpu backend uses (default: OpenMP's, OMP_NUM_THREADS or every core; 0 restores
// that). A program runs with the count in force when it was synced; a new count compiles a
// graph again (oneDNN builds its primitives for a thread count).
void set_num_threads(int n);
int num_threads();

// Whether the cpu backend's programs flush denormal floats (below 1.2e-38 in f32) to zero, in
// their inputs and results (default: on, as XLA's CPU runtime; PyTorch's
// torch.set_flush_denormal). Denormals cost ~100 cycles an operation on x86: a gradient on its
// way to zero made a wide MLP's 30 ms steps take 0.5 s. Off keeps IEEE gradual underflow. Takes
// effect at the next program; returns whether this CPU can flush (x86: yes).
bool set_flush_denormal(bool on);
bool flush_denormal();

// The oneDNN kernels the cpu backend's matmuls and convolutions of `dtype` (f32 or bf16) run on
// this machine, as oneDNN names them (its implementation and instruction set), e.g.
// "matmul brg:avx512_core_bf16, convolution jit_bf16:avx512_core_bf16". oneDNN picks them at
// run time from the CPU (AVX2, AVX-512, AVX512-BF16, AMX) and ONEDNN_MAX_CPU_ISA.
std::string cpu_kernels(DType dtype = DType::F32);

// The most memory one compiled program may plan to take when it runs: on the cpu backend, its
// intermediate values, outputs, copies in oneDNN's layouts and scratch, and folded constants (not
// its inputs, which exist already). A program that would need more fails when it is compiled,
// before anything runs (a step's transaction holds: the model is as before the step), with an
// Error naming the planned bytes and the largest values live at its peak, with the user lines
// that made them. Default: the machine's memory (its physical memory, or the limit of the
// process's cgroup when lower); 0 restores the default.
void set_memory_limit(size_t bytes);
size_t memory_limit();

// How lockstep's OpenMP threads wait between parallel work: libgomp reads it (OMP_WAIT_POLICY,
// GOMP_SPINCOUNT) once, when the program starts, and its default (spin ~300,000 times before
// sleeping) collapses on a busy machine: beside two busy loops on 2 cores a small CNN kept 7-40%
// of its quiet speed, varying from run to run, where a spin count of 10,000 kept 37-40% at the
// same quiet speed (docs/performance.md). Call first thing in main(): when neither variable is
// set, sets GOMP_SPINCOUNT=10000 and executes the program again with it (the same pid, arguments
// and environment), so nothing before the call may have side effects; returns without doing
// anything when either is set (your choice stands), or when the program cannot be executed again
// (then libgomp's default stays). lockstep-train, the examples and the benchmarks call it; the
// Python module sets the same default when it is imported first.
void apply_thread_wait_default(char** argv);
// How the OpenMP threads wait in this process, for logs: "GOMP_SPINCOUNT=10000",
// "OMP_WAIT_POLICY=passive", ... or "libgomp's default".
std::string thread_wait_setting();

// Most compiled programs kept (least recently used are dropped first). Default 1024, as
// torch_xla's XLA_COMPILATION_CACHE_SIZE: a loop that slices its batches from one tensor at
// many offsets (word_language_model's get_batch: 64 offsets an epoch) makes a program per
// offset, and a smaller cache dropped the training step's own program among them each epoch.
// Only the 8 most recently run keep their memory arenas.
void set_compile_cache_capacity(size_t capacity);

// Most programs waiting behind the one that runs (default 2, at least 1). A sync or step that
// would queue more waits for room, so tracing runs at most that far ahead of execution and the
// inputs of queued programs (e.g. uploaded batches) stay bounded. Counted as `queue_waits`.
void set_max_queued_programs(size_t n);

namespace metrics {
// Counters: steps, syncs, implicit_syncs, compiles, cache_hits, executions, executed_nodes,
// rollbacks, run_time_rollbacks (steps undone because their program failed), transfers,
// bytes_to_device, bytes_from_device, execution_errors, queue_waits, and from the cpu backend
// in_place_outputs, in_place_copies (values copied aside because a check that may fail runs after
// their in-place update), winograd_convolutions. Gauge: planned_bytes (the memory the most
// recently queued program planned to take, see set_memory_limit; each site's largest is in
// report_json's sites); the whole list, with meanings, is src/runtime/metrics.def. A
// name not there is an Error naming the known ones (a misspelling must not read 0).
int64_t counter(const std::string& name);
// Timers (trace, graph, compile, execute; all_reduce_wait: time a data parallel step waited for
// its gradients' all-reduces, the communication not hidden behind the backward; under
// LOCKSTEP_PROFILE, one per kind of kernel that has run): total nanoseconds and number of
// samples. An unknown name is an Error.
int64_t timer_total_ns(const std::string& name);
int64_t timer_count(const std::string& name);
void reset();
// A table of every counter and timer, then a row per site (debug::sites).
std::string report();
// The same as JSON, schema "lockstep-metrics/1":
//   {"schema": "lockstep-metrics/1",
//    "counters": {"<name>": <int>, ...},
//    "timers": {"<name>": {"count": <int>, "total_ns": <int>}, ...},
//    "sites": [{"site": <string>, "syncs": <int>, "compiles": <int>, "cache_hits": <int>,
//               "nodes": <int>, "graphs": <int>, "in_step": <int>, "planned_bytes": <int>,
//               "misses": {"<reason>": <int>, ...},
//               "timers": {"trace"|"graph"|"compile"|"execute":
//                          {"count": <int>, "median_ms": <number>, "p90_ms": <number>}}}, ...],
//    (a site's timers: a step's tracing, building and hashing the graph, compiling, running on
//    the runtime thread; median and 90th percentile of the last 1024 samples)
//    "last_cache_miss": null | {"site": <string>, "first": <bool>, "node": <int>,
//                               "op": <string>, "field": <string>, "before": <string>,
//                               "after": <string>, "where": <string>, "module": <string>,
//                               "more": <int>, "hint": <string>, "text": <string>}}
std::string report_json();
}  // namespace metrics

namespace debug {
// The IR text of the most recently built graph (for tests and LOCKSTEP_DEBUG output), each node
// with the user's line that recorded it.
std::string last_graph_text();
// A unified diff ("@@ -a,n +b,m @@", "-" and "+" lines, two lines of context) of two texts,
// e.g. two graphs' last_graph_text() or two LOCKSTEP_DUMP graph files; empty when equal.
std::string diff(const std::string& a, const std::string& b);

// Sites: every program is built at a site, the place that asked for it: "step at file:line" (the
// line that entered the ls::step or ls::Step), "sync on entry to the step at file:line", "sync at
// file:line" (ls::sync), and "<api> at file:line" for an implicit sync: a blocking read of a
// pending value ("item", "to_vector", "to_string", "to" a device, "save"). Compiles, cache hits
// and syncs are counted per site.
struct SiteStats {
  std::string site;
  int64_t syncs = 0;  // programs built here (cache hits and compiles)
  int64_t compiles = 0;
  int64_t cache_hits = 0;
  int64_t nodes = 0;    // graph nodes built here, in all
  int64_t graphs = 0;   // distinct graphs compiled here
  int64_t in_step = 0;  // implicit syncs made while the thread's step was being recorded
  // The most memory a program compiled here plans to take when it runs (the cpu backend's
  // arena, outputs, copies, scratch and constants; 0 for backends that do not plan).
  int64_t planned_bytes = 0;
  // Compiles by their reason (CacheMiss::field, or "first"): {"shape": 3, "first": 1}.
  std::map<std::string, int64_t> misses;
};
// Every site so far, in the order first seen (reset with metrics::reset()).
std::vector<SiteStats> sites();

// Why the latest compile happened. Against the nearest graph compiled before at the same site
// (the longest common prefix of nodes in canonical order, then the fewest differing nodes, then
// the most recent), the first node that differs: its op, the field (op, dtype, shape,
// attributes, operands, input, nodes, outputs), the old and new value, the line that recorded
// it, and how many more nodes differ; field "evicted" when the graph is one compiled here before
// that the cache dropped since; field "setting" when it is one compiled here for another backend
// setting (the cpu backend's thread count, ls::set_num_threads: "cpu: 2 threads before, 1 thread
// now"). LOCKSTEP_DEBUG=1 prints `text` at every compile.
struct CacheMiss {
  std::string site;
  bool first = false;            // the site's first compile: nothing to compare with
  int64_t compiles_at_site = 0;  // this one included
  int64_t node = -1;             // %N in the new graph (as LOCKSTEP_DUMP's graph text numbers it)
  std::string op, field, before, after, where;
  std::string module;       // the path of the module that recorded it ("layer1.0.conv1")
  std::string backward_of;  // a gradient node: the op whose gradient it computes
  int64_t more = 0;         // further nodes that differ
  // Set once when the same node's same field has differed on three misses in a row here: a
  // value baked into the graph that changes every step, and what to do about it.
  std::string hint;
  std::string text;  // all of the above, as one message
};
// The latest compile's explanation; site empty when nothing was compiled yet.
CacheMiss last_cache_miss();

// A steady-state contract: once a site has built `after_syncs` more programs (counted from this
// call, or from its first sync for sites seen later), a compile there breaks it: a warning on
// stderr (Warn) or an Error thrown before anything is compiled or run (Throw; the step's
// transaction holds), with the miss's explanation in the message. `implicit_syncs_per_step` >= 0
// also bounds the implicit syncs (blocking reads of pending values) inside one step: the one past
// it warns or throws the same way, before it syncs anything (-1: no bound).
enum class OnRecompile { Warn, Throw };
void expect_steady(int64_t after_syncs = 0, OnRecompile policy = OnRecompile::Throw,
                   int64_t implicit_syncs_per_step = -1);
void stop_expecting_steady();

// The pending-graph guard: a thread that records more than this many nodes without a sync (a
// forgotten step boundary, which ends in an out-of-memory or a compile that never finishes)
// gets one warning on stderr naming the lines that recorded most of them, and the
// pending_graph_warnings counter counts it. Default (and 0): ten times the largest program
// compiled so far, at least 100000. Setting it also re-arms the warning.
void set_pending_graph_limit(int64_t nodes);
}  // namespace debug

}  // namespace lockstep
