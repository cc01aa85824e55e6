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
  // Graph builder scratch (under the runtime's lock): the Data node that stands for this
  // buffer in the graph being built, valid while build_epoch is current.
  uint64_t build_epoch = 0;
  int32_t build_id = -1;
};

// A buffer already filled with `bytes` copied from host memory.
std::shared_ptr<Buffer> upload(Device device, const void* data, size_t bytes);

}  // namespace lockstep::runtime

namespace lockstep::detail {

struct TensorImpl : std::enable_shared_from_this<TensorImpl> {
  // Current value: a Data node (materialized) or any other node (pending).
  ir::NodePtr node;
  // Set when the value was lost (rolled back, or its program failed): every use rethrows it.
  std::exception_ptr poison;
  // Step transaction bookkeeping (see runtime/step.cpp).
  int64_t touched_in_step = 0;  // step id in which it was journaled or created
  bool pending_registered = false;
  // Links of the runtime's list of pending tensors (valid while pending_registered).
  TensorImpl* pending_prev = nullptr;
  TensorImpl* pending_next = nullptr;
  // Order of creation: sorts a sync's outputs the same way every time a loop body runs.
  const uint64_t creation_index;
  // Autograd: a leaf that collects gradients in `grad` (see autograd/backward.cpp).
  bool requires_grad = false;
  Tensor grad;

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
// The node to use as an operand for `t`; throws Error if t is empty or poisoned.
const ir::NodePtr& node_of(const Tensor& t, const char* op, const std::source_location& loc);
// In-place update of a tensor's value: journaled for rollback when inside a step.
void set_value(TensorImpl& impl, ir::NodePtr node);
// Blocks until `t` is materialized (an implicit sync if pending) and returns its host bytes.
std::vector<unsigned char> read_bytes(const Tensor& t, const std::source_location& loc);
// Materializes `t` (implicit sync if pending) and waits; returns its buffer.
std::shared_ptr<Buffer> materialize(const Tensor& t, const std::source_location& loc);

// Registry (runtime.cpp).
void register_pending(TensorImpl& impl);  // after node/poison changed
void poison(TensorImpl& impl, std::exception_ptr error);
void restore(TensorImpl& impl, ir::NodePtr node, std::exception_ptr poison_state, Tensor grad);
bool has_pending();
// Syncs every pending tensor; `closures` (may be null) run after the program(s). With
// `keep_history`, a value that requires grad remembers the node it was computed from, so
// backward can go through it; the step's own entry and exit syncs cut that history.
// `before_enqueue` (optional) runs once the programs are built, before they are handed to the
// runtime thread (also when there is nothing to run): where a caller drops references to old
// values that a program may then update in place.
void sync_all(const std::string& origin, std::vector<std::function<void()>>* closures,
              bool keep_history, const std::function<void()>& before_enqueue = {});
void wait_all();
void set_cache_capacity(size_t capacity);
void set_max_queued(size_t n);
std::string last_graph_text();
bool on_runtime_thread();

// Step hooks (step.cpp): record a tensor's pre-step value before its first change in a step,
// and tensors created in a step.
void journal(TensorImpl& impl);
void note_created(TensorImpl& impl);

// Metrics (metrics.cpp).
void count(const char* name, int64_t delta = 1);
void time_ns(const char* name, int64_t ns);
int64_t now_ns();

}  // namespace lockstep::runtime
