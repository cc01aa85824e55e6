// What a tensor handle points at (TensorImpl) and the device buffers values live in. Shared by
// the runtime's files and the frontend; the operations on them are lazy.h's.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <utility>
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
  // A parameter ls::dist::fully_shard sharded: rank `gather_root` holds its value, the others a
  // stand-in. Ops read it through a broadcast from that rank (runtime::node_of), the same one
  // until the tensor's value changes or the step ends (`gathered`, of the value `gathered_of`).
  int gather_root = -1;
  // A parameter fully_shard split over the ranks instead (one run of its flat elements on each,
  // ZeroRedundancyOptimizer's layout): the parameter holds a stand-in, this rank's run a tensor
  // of its own that the optimizer updates; ops read it through the runs' broadcasts joined.
  struct GatherRuns {
    std::vector<std::pair<int64_t, int64_t>> runs;  // per rank: {offset, numel}
    Tensor own;                                     // this rank's run (none when it has none)
    std::vector<ir::NodePtr> others;  // per rank: a stand-in of its run (null for this rank's)
    // Before each gathered read: a value written to the parameter itself (a load) becomes its
    // runs again (this rank's part into `own`, the parameter a stand-in).
    std::function<void(const Tensor& param)> adopt;
  };
  std::shared_ptr<const GatherRuns> gather_runs;
  bool sharded() const { return gather_root >= 0 || gather_runs != nullptr; }
  // Its gather is kept for the backward (fully_shard without reshard_after_forward), not gathered
  // again (passes::regather).
  bool gather_kept = false;
  // Its value's graph is built first, before the other targets' (ZeRO-3's broadcast after every
  // reduce): the order of its collectives is then the same on every rank, whatever other values
  // one rank alone keeps (the gradients it owns).
  bool anchor = false;
  ir::NodePtr gathered;
  const ir::Node* gathered_of = nullptr;

  explicit TensorImpl(ir::NodePtr n);
  ~TensorImpl();
  TensorImpl(const TensorImpl&) = delete;
  TensorImpl& operator=(const TensorImpl&) = delete;
};

}  // namespace lockstep::detail
