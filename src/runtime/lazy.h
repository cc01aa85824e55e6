// The entry points the frontend calls to record, mutate and read values: new tensors, operand
// nodes, in-place updates, gradients' handles, syncs and blocking reads. Not here: op semantics
// (ir/), kernels (backends/), metrics (metrics.h), the step transaction (transaction.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "ir/ir.h"
#include "lockstep/loc.h"
#include "lockstep/tensor.h"
#include "runtime/tensor_impl.h"

namespace lockstep::runtime {

using detail::TensorImpl;

// A new tensor holding `node`; registered as pending when node is not Data, and (unless
// `of_step` is false) as created in the current step, if any.
Tensor new_tensor(ir::NodePtr node, bool of_step = true);
// The node to use as an operand for `t`; throws Error if t is empty or poisoned, or in use by
// another thread's step (see context.h).
ir::NodePtr node_of(const Tensor& t, const char* op, const Loc& loc);
// While alive, this thread reads a sharded parameter's (TensorImpl::gather_root) own value, not
// the broadcast from its owner: the owner's update and checkpoint of it.
class OwnValues {
 public:
  OwnValues();
  ~OwnValues();
  OwnValues(const OwnValues&) = delete;
  OwnValues& operator=(const OwnValues&) = delete;

 private:
  bool previous_;
};
// Whether the calling thread reads sharded parameters through their broadcasts (no OwnValues).
bool reads_gathered();
// Forgets the broadcast a sharded parameter's reads share (TensorImpl::gathered): the next read
// records another. Called as each step ends, so that the gather (and the value it read) is not
// held between steps.
void drop_gathered(TensorImpl& impl);
// The node of a defined tensor's current value, for its metadata (no checks).
ir::NodePtr current_node(const TensorImpl& impl);
// What a step closure (on the runtime thread) sees of `impl`, whose value is `value`: the value
// as of the closure's step, where a step queued after it has given the tensor a value its
// program has not computed yet; `value` itself everywhere else.
ir::NodePtr closure_value(const TensorImpl& impl, ir::NodePtr value);
// In-place update of a tensor's value: journaled for rollback when inside a step. Throws Error
// when another thread's running step holds the tensor, or when `node` was computed from `base`
// and another thread has replaced that value meanwhile (see context.h); `op` and `loc` name the
// update.
void set_value(TensorImpl& impl, ir::NodePtr node, const char* op = "in-place update",
               const Loc& loc = Loc::current(), const ir::Node* base = nullptr);
// A tensor's gradient handle, and replacing it (journaled, with the same checks as set_value).
Tensor grad_of(const TensorImpl& impl);
void set_grad_of(TensorImpl& impl, Tensor grad, const char* op, const Loc& loc);
// The same, but the new gradient is computed from the old one (read and written under one lock,
// so a concurrent update cannot be lost): `update` gets the old handle (maybe undefined).
void update_grad_of(TensorImpl& impl, const std::function<Tensor(const Tensor&)>& update,
                    const char* op, const Loc& loc);
// Whether `impl` requires grad or its value does; setting the leaf flag (dropping the value's
// own mark when turned off).
bool requires_grad_of(const TensorImpl& impl);
void set_requires_grad_of(TensorImpl& impl, bool requires_grad);
// Blocks until `t` is materialized (an implicit sync if pending) and returns its host bytes.
// `api` names the read at its site (debug::sites: "item at f.cpp:12").
std::vector<unsigned char> read_bytes(const Tensor& t, const Loc& loc, const char* api = "read");
// Materializes `t` (implicit sync if pending) and waits; returns its buffer.
std::shared_ptr<Buffer> materialize(const Tensor& t, const Loc& loc, const char* api = "read");

// Registry (tensors.cpp).
void poison(TensorImpl& impl, std::exception_ptr error);
void restore(TensorImpl& impl, ir::NodePtr node, std::exception_ptr poison_state, Tensor grad);
bool has_pending();  // on the calling thread's context
// What a step changed, kept while its programs run (transaction.h).
struct StepRollback;

// Syncs every pending tensor of the calling thread. With `keep_history`, a value that requires
// grad remembers the node it was computed from, so backward can go through it; the step's own
// entry sync cuts that history. `origin` names this sync in messages ("sync at f.cpp:12"),
// `site` the place it is counted under (debug::sites). A step's exit is commit_step
// (transaction.h), from the pieces below.
void sync_all(const std::string& origin, const std::string& site, bool keep_history);
// The calling thread's pending tensors in the order they were created (nullopt: none pending).
std::optional<std::vector<std::shared_ptr<TensorImpl>>> pending_targets(Context& me);
// Builds and compiles the programs that compute `targets` and rebinds the targets to their
// outputs; `closures` (may be null) run after the last of them. Caller holds graph_mutex(), and
// enqueues the jobs once it has dropped its own references to the old values (so the programs
// may update them in place): `targets` is released on return.
struct Job;
std::vector<Job> build_jobs(std::vector<std::shared_ptr<TensorImpl>> targets,
                            const std::string& origin, const std::string& site,
                            std::vector<std::function<void()>>* closures, bool keep_history,
                            Context& me);
void wait_all();
std::string last_graph_text();
bool on_runtime_thread();

}  // namespace lockstep::runtime
