// The narrow boundary between the runtime and a backend: memory, copies, compile, run.
// A backend sees only data-free ir::Graphs and opaque storage; it knows nothing of tensors,
// steps or the cache.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ir/ir.h"
#include "lockstep/error.h"

namespace lockstep::backends {

// A program that failed while it ran: the message names the failing op and its user line; the
// inputs it had already overwritten in place (see Executable::run) are listed, their values lost.
class RunError : public BackendError {
 public:
  RunError(const std::string& what, std::vector<int32_t> overwritten_inputs)
      : BackendError(what), overwritten_(std::move(overwritten_inputs)) {}
  const std::vector<int32_t>& overwritten_inputs() const { return overwritten_; }

 private:
  std::vector<int32_t> overwritten_;
};

// A failure of graph node `n`, as a RunError naming what the user called first: "<user op> at
// <file:line> in <module path>: <primitive's error>" for a node recorded by a user-facing
// function (ir::Origin::user_op), else "<primitive's error> (at <file:line> in <module path>)".
[[noreturn]] void fail_at(const ir::GraphNode& n, const std::exception& e,
                          std::vector<int32_t> overwritten_inputs = {});

// A block of device memory. Host backends (ref, cpu) allocate plain aligned host memory.
class Storage {
 public:
  virtual ~Storage() = default;
  virtual void* data() = 0;
  virtual size_t bytes() const = 0;
};

class Executable {
 public:
  virtual ~Executable() = default;
  // Runs the program. inputs[k] is the storage of Data input #k, scalars[k] the value of Scalar
  // input #k. Returns one storage per graph output. Throws RunError on a run-time failure (e.g.
  // an index out of range), naming the op's line; the runtime then poisons the step's outputs
  // and restores what the step changed to its values before the step.
  // donatable[k] (when the vector has that entry) says nothing but this run (and the step's
  // record of values to restore) references input k: the program may overwrite it and return it
  // as an output (a parameter updated in place). When it fails, every such input must be as it
  // was (run the checks that can fail first, or keep a copy), or be listed in the RunError.
  // `past_checks` (if set) is called once the program has passed every step that checks its
  // data: from there on it fails only on a fault (memory, a library), and the runtime stops
  // keeping the values it would have restored.
  virtual std::vector<std::shared_ptr<Storage>> run(
      const std::vector<std::shared_ptr<Storage>>& inputs,
      const std::vector<ir::ScalarValue>& scalars, const std::vector<bool>& donatable,
      const std::function<void()>& past_checks) = 0;
  // Bytes a run takes besides its inputs, as planned at compile time (0: not planned).
  virtual size_t planned_bytes() const { return 0; }
  // The memory preflight, before each run is queued: throws Error, naming what the program needs
  // and why, when its plan needs more than `limit` bytes (ls::set_memory_limit).
  virtual void check_memory(size_t limit) const { (void)limit; }
  // Gives back the memory the program keeps between runs (its arena), for the next run to take
  // again; called by the compile cache for programs it keeps but has not run lately, from any
  // thread: skipped while the program runs.
  virtual void release_idle_memory() {}
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual std::shared_ptr<Storage> alloc(size_t bytes) = 0;
  virtual void copy_in(Storage& dst, const void* src, size_t bytes) = 0;
  virtual void copy_out(Storage& src, void* dst, size_t bytes) = 0;
  virtual std::unique_ptr<Executable> compile(const ir::Graph& graph) = 0;
  // What the programs compile() builds now depend on besides the graph, in words ("" if
  // nothing): the cpu backend's thread count, which its oneDNN primitives are built for. Part of
  // the compile cache's key, so a change compiles the graph again, and named when it does.
  virtual std::string compile_setting() const { return ""; }
  // Whether `setting` was chosen for the machine's load, not by the user (the cpu backend's fewer
  // threads while other processes busy the cores): a compile for it, or from it back to the
  // user's, breaks no steady state (ls::debug::expect_steady).
  virtual bool setting_follows_load(const std::string&) const { return false; }
  // Waits for all work this backend has queued on its device (no-op for host backends).
  virtual void synchronize() {}
};

// The backend serving `device`; throws Error if it is not available in this build or machine.
Backend& backend_for(Device device);
// Makes `backend` (which must live until the process ends) serve `device`. The built-in ref and
// cpu backends are there from the start; a backend built as a separate library registers itself
// when it is loaded (from a static initializer). Throws Error if `device` is served already.
void register_backend(Device device, Backend* backend);

// Host memory, 64-byte aligned, shared by the host backends.
std::shared_ptr<Storage> alloc_host(size_t bytes);
// The bytes of host storages alive, and of released buffers kept for reuse: at most as many as
// are alive (at least 64 MiB), none released over 10 s ago.
size_t host_memory_in_use();
size_t host_memory_kept();
// `bytes` of `parent` from `offset` on, as a storage of its own that keeps `parent` alive.
std::shared_ptr<Storage> slice_of(std::shared_ptr<Storage> parent, size_t offset, size_t bytes);

}  // namespace lockstep::backends
