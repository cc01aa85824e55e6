// The runtime's view of tensors: the TensorImpl behind each handle, device buffers that fill
// asynchronously, the pending-tensor registry, and the entry points the frontend calls to
// record, mutate and read values. Not here: op semantics (ir/) and kernels (backends/).
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <source_location>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "ir/ir.h"
#include "lockstep/tensor.h"

namespace lockstep::runtime {

// A value on a device. Created empty when a program is enqueued and filled (or poisoned) by the
// runtime thread when it has run; host uploads are filled at once.
struct Buffer {
  Device device;
  size_t bytes = 0;
  std::shared_ptr<backends::Storage> storage;  // valid once ready without error
  std::exception_ptr error;                    // set when its program failed
  std::atomic<bool> done{false};               // storage or error is set
  // The module parameter or buffer it holds a value of ("layer1.0.conv1.weight"), for dumps.
  std::shared_ptr<const std::string> name;
  // Graph builder scratch (under the runtime's lock): the Data node that stands for this
  // buffer in the graph being built, valid while build_epoch is current.
  uint64_t build_epoch = 0;
  int32_t build_id = -1;
};

// A buffer already filled with `bytes` copied from host memory.
std::shared_ptr<Buffer> upload(Device device, const void* data, size_t bytes);

}  // namespace lockstep::runtime

namespace lockstep::runtime {
struct Context;
}

namespace lockstep::detail {

// The mutable fields below are read and written under `lock` (runtime::TensorLock), except by
// a thread that just made the tensor and has not shared it yet.
struct TensorImpl : std::enable_shared_from_this<TensorImpl> {
  mutable std::atomic<bool> lock{false};
  // The context (thread) that last gave the tensor a value; when pending, it is on that
  // context's list of pending tensors.
  runtime::Context* owner = nullptr;
  // What every value of the tensor has (set_value checks; its device may change, Module::to), so
  // Tensor::shape() may hand out a reference that stays valid across syncs.
  const Shape shape;
  const DType dtype;
  // Current value: a Data node (materialized) or any other node (pending).
  ir::NodePtr node;
  // The node `node` stands for when a sync (or a read) computed it, or an annotation for autograd
  // replaced it: the same value, so an update computed from it is not lost (context.h).
  const ir::Node* same_value_as = nullptr;
  // Set when the value was lost (rolled back, or its program failed): every use rethrows it.
  std::exception_ptr poison;
  // Step transaction bookkeeping (see runtime/step.cpp).
  int64_t touched_in_step = 0;  // step id in which it was journaled or created
  bool pending_registered = false;
  // Links of the owner's list of pending tensors (valid while pending_registered).
  TensorImpl* pending_prev = nullptr;
  TensorImpl* pending_next = nullptr;
  // Order of creation: sorts a sync's outputs the same way every time a loop body runs.
  const uint64_t creation_index;
  // Autograd: a leaf that collects gradients in `grad` (see autograd/backward.cpp).
  bool requires_grad = false;
  Tensor grad;
  // A module's parameter or buffer: its path from the outermost module that holds it (set by
  // nn::Module's registration); the buffers of its values carry it into graph dumps.
  std::shared_ptr<const std::string> name;

  explicit TensorImpl(ir::NodePtr n);
  ~TensorImpl();
  TensorImpl(const TensorImpl&) = delete;
  TensorImpl& operator=(const TensorImpl&) = delete;
};

}  // namespace lockstep::detail

namespace lockstep::runtime {

using detail::TensorImpl;

// A new tensor holding `node`; registered as pending when node is not Data, and (unless
// `of_step` is false) as created in the current step, if any.
Tensor new_tensor(ir::NodePtr node, bool of_step = true);
// The node to use as an operand for `t`; throws Error if t is empty or poisoned, or in use by
// another thread's step (see context.h).
ir::NodePtr node_of(const Tensor& t, const char* op, const std::source_location& loc);
// The node of a defined tensor's current value, for its metadata (no checks).
ir::NodePtr current_node(const TensorImpl& impl);
// In-place update of a tensor's value: journaled for rollback when inside a step. Throws Error
// when another thread's running step holds the tensor, or when `node` was computed from `base`
// and another thread has replaced that value meanwhile (see context.h); `op` and `loc` name the
// update.
void set_value(TensorImpl& impl, ir::NodePtr node, const char* op = "in-place update",
               const std::source_location& loc = std::source_location::current(),
               const ir::Node* base = nullptr);
// A tensor's gradient handle, and replacing it (journaled, with the same checks as set_value).
Tensor grad_of(const TensorImpl& impl);
void set_grad_of(TensorImpl& impl, Tensor grad, const char* op, const std::source_location& loc);
// The same, but the new gradient is computed from the old one (read and written under one lock,
// so a concurrent update cannot be lost): `update` gets the old handle (maybe undefined).
void update_grad_of(TensorImpl& impl, const std::function<Tensor(const Tensor&)>& update,
                    const char* op, const std::source_location& loc);
// Whether `impl` requires grad or its value does; setting the leaf flag (dropping the value's
// own mark when turned off).
bool requires_grad_of(const TensorImpl& impl);
void set_requires_grad_of(TensorImpl& impl, bool requires_grad);
// Blocks until `t` is materialized (an implicit sync if pending) and returns its host bytes.
// `api` names the read at its site (debug::sites: "item at f.cpp:12").
std::vector<unsigned char> read_bytes(const Tensor& t, const std::source_location& loc,
                                      const char* api = "read");
// Materializes `t` (implicit sync if pending) and waits; returns its buffer.
std::shared_ptr<Buffer> materialize(const Tensor& t, const std::source_location& loc,
                                    const char* api = "read");

// Registry (runtime.cpp).
void poison(TensorImpl& impl, std::exception_ptr error);
void restore(TensorImpl& impl, ir::NodePtr node, std::exception_ptr poison_state, Tensor grad);
bool has_pending();  // on the calling thread's context
// What a step changed, kept while its programs run: if one fails, every tensor that still holds
// the value the step gave it (`after`) goes back to its value at step entry (`before`), so a
// step that fails while it runs leaves the model as one that fails while it is traced.
struct StepRollback {
  struct Entry {
    std::weak_ptr<TensorImpl> tensor;
    ir::NodePtr before;
    std::exception_ptr before_poison;
    Tensor before_grad;
    ir::NodePtr after;
  };
  std::vector<Entry> entries;
};

// Syncs every pending tensor of the calling thread; `closures` (may be null) run after the
// program(s). With `keep_history`, a value that requires grad remembers the node it was computed
// from, so backward can go through it; the step's own entry and exit syncs cut that history.
// `before_enqueue` (optional) runs once the programs are built, before they are handed to the
// runtime thread (also when there is nothing to run): where a caller drops references to old
// values that a program may then update in place, and may return the step's rollback record.
// `origin` names this sync in messages ("step 3 (entered at f.cpp:12)"), `site` the place it is
// counted under (debug::sites: "step at f.cpp:12").
void sync_all(const std::string& origin, const std::string& site,
              std::vector<std::function<void()>>* closures, bool keep_history,
              const std::function<std::shared_ptr<StepRollback>()>& before_enqueue = {});
void wait_all();
void set_cache_capacity(size_t capacity);
void set_max_queued(size_t n);
std::string last_graph_text();
bool on_runtime_thread();

// Step hooks (step.cpp): record a tensor's pre-step value before its first change in a step
// (the caller holds the tensor's lock), and tensors created in a step.
void journal(TensorImpl& impl);
void note_created(TensorImpl& impl);

// Metrics (metrics.cpp).
void count(const char* name, int64_t delta = 1);
// A gauge: `name` takes the value `v`, and `max_<name>` the largest value since the last reset.
void gauge(const char* name, int64_t v);
void time_ns(const char* name, int64_t ns);
int64_t now_ns();

}  // namespace lockstep::runtime
