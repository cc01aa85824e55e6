// Syncs and reads: pending tensors -> graph -> compiled program (compile_cache.cpp) -> the
// runtime thread's queue (executor.cpp), the tensors rebound to the program's outputs; blocking
// reads, which raise a failed program's error; the default device. A step's commit uses the same
// pieces (pending_targets, build_jobs, enqueue) in its own order (transaction.cpp).
// Not here: the tensor registry (tensors.cpp), the contexts (context.cpp), the step transaction
// (transaction.cpp), metrics (metrics.cpp).
#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "backends/backend.h"
#include "dist/comm.h"
#include "ir/attrs.h"
#include "lockstep/runtime.h"
#include "runtime/compile_cache.h"
#include "runtime/context.h"
#include "runtime/executor.h"
#include "runtime/graph_builder.h"
#include "runtime/metrics.h"
#include "runtime/sites.h"
#include "runtime/transaction.h"
#include "util/check.h"

namespace lockstep::runtime {
namespace {

using util::cat;

}  // namespace

std::vector<Job> build_jobs(std::vector<std::shared_ptr<TensorImpl>> targets,
                            const std::string& origin, const std::string& site,
                            std::vector<std::function<void()>>* closures, bool keep_history,
                            Context& me) {
  std::vector<Job> ready;
  // Each target's value as of now (a tensor no longer pending is left alone).
  std::vector<ir::NodePtr> values;
  values.reserve(targets.size());
  for (const auto& t : targets) {
    TensorLock lock(*t);
    values.push_back(holds_pending_value(*t) ? t->node : nullptr);
  }
  // One program per device, in the order devices first appear.
  std::vector<Device> devices;
  for (const auto& v : values) {
    if (!v) continue;
    bool seen = false;
    for (Device d : devices) seen = seen || d == v->device;
    if (!seen) devices.push_back(v->device);
  }
  for (size_t di = 0; di < devices.size(); ++di) {
    const Device device = devices[di];
    std::vector<std::shared_ptr<TensorImpl>> group;
    std::vector<ir::NodePtr> roots;
    // Anchors first and what this rank alone computes (ir::RankLocal) last: the graph's order
    // of the collectives is then the same on every rank (TensorImpl::anchor).
    auto rank_of = [&](size_t k) {
      return targets[k]->anchor ? 0 : values[k]->origin.rank_local ? 2 : 1;
    };
    for (const int pass : {0, 1, 2})
      for (size_t k = 0; k < targets.size(); ++k)
        if (values[k] && values[k]->device == device && rank_of(k) == pass) {
          group.push_back(targets[k]);
          roots.push_back(values[k]);
        }
    const int64_t t0 = now_ns();
    BuiltGraph built = build_graph(roots, device);
    const int64_t graph_ns = now_ns() - t0;
    time_ns(Timer::Graph, graph_ns);
    const CacheEntry& entry = lookup_or_compile(built, origin, site, graph_ns);
    // The memory preflight: before the program is queued (the limit may have changed since it
    // was compiled), so that nothing runs.
    try {
      entry.exe->check_memory(memory_limit());
    } catch (const Error& e) {
      throw Error(cat(origin, ": ", e.what()));
    }
    // Replicas must agree before any of them enters the program's collectives.
    if (entry.agreement && dist::detail::active())
      dist::detail::agree(*entry.agreement, origin, built.scalars);
    Job job;
    job.ctx = &me;
    job.exe = entry.exe;
    gauge(Gauge::PlannedBytes, static_cast<int64_t>(entry.exe->planned_bytes()));
    job.inputs = std::move(built.buffers);
    job.scalars = std::move(built.scalars);
    job.origin = origin;
    job.site = site;
    job.num_nodes = static_cast<int64_t>(built.order.size());
    for (int32_t id : built.outputs) {
      const ir::Node& gn = *built.order[id];
      auto b = std::make_shared<Buffer>();
      b->device = device;
      b->bytes = static_cast<size_t>(shape_numel(gn.shape)) * dtype_size(gn.dtype);
      job.outputs.push_back(std::move(b));
    }
    for (size_t k = 0; k < group.size(); ++k) {
      TensorImpl& t = *group[k];
      const ir::NodePtr& value = roots[k];
      ir::NodePtr data = ir::make_data(job.outputs[built.root_output[k]], value->shape,
                                       value->dtype, device, value->origin.loc);
      TensorLock lock(t);
      if (t.node != value) continue;  // given another value meanwhile (by a closure's thread)
      if (t.name && !job.outputs[built.root_output[k]]->name)
        job.outputs[built.root_output[k]]->name = t.name;
      if (t.requires_grad)
        data = ir::annotated(data, {true, t.weak_from_this(), nullptr, nullptr});
      else if (keep_history && value->grad.requires_grad)
        data = ir::annotated(data, {true, {}, value, nullptr});
      t.same_value_as = t.node.get();
      t.node = std::move(data);
      register_pending_locked(t, me);
    }
    if (closures && di + 1 == devices.size()) job.closures = std::move(*closures);
    ready.push_back(std::move(job));
  }
  if (closures && !closures->empty()) {  // nothing to compute: closures still run in order
    Job job;
    job.ctx = &me;
    job.origin = origin;
    job.closures = std::move(*closures);
    ready.push_back(std::move(job));
  }
  return ready;  // `targets` dies here: only the jobs hold the old values now
}

// ---- sync and reads -----------------------------------------------------------------------

bool has_pending() {
  Context& me = current_context();
  std::lock_guard<std::recursive_mutex> lock(me.mu);
  return !me.pending.empty();
}

std::optional<std::vector<std::shared_ptr<TensorImpl>>> pending_targets(Context& me) {
  ir::recorded_nodes() = 0;
  std::vector<std::shared_ptr<TensorImpl>> targets;
  {
    std::lock_guard<std::recursive_mutex> lock(me.mu);
    if (me.pending.empty()) return std::nullopt;
    targets.reserve(me.pending.size);
    for (TensorImpl* impl = me.pending.head; impl; impl = impl->pending_next)
      if (auto sp = impl->weak_from_this().lock()) targets.push_back(std::move(sp));
  }
  // The list's order is that of becoming pending; the order tensors were created in is the
  // same every time a loop body runs, so it makes the program (and its hash) the same.
  std::sort(targets.begin(), targets.end(),
            [](const auto& a, const auto& b) { return a->creation_index < b->creation_index; });
  return targets;
}

void sync_all(const std::string& origin, const std::string& site, bool keep_history) {
  Context& me = current_context();
  std::optional<std::vector<std::shared_ptr<TensorImpl>>> targets = pending_targets(me);
  if (!targets) return;  // nothing to do: free
  count(Counter::Syncs);
  wait_for_room(me);
  std::lock_guard<std::recursive_mutex> lock(graph_mutex());
  std::vector<Job> jobs = build_jobs(std::move(*targets), origin, site, nullptr, keep_history, me);
  enqueue(jobs);
}

namespace {

// Reads of a few elements of a value, through slices and reshapes (a loop over a tensor's
// elements, each read as an index: nanoGPT's get_batch slices its data at each of `ix`), get
// these: the elements copied on the host from the value once it is computed, with no program
// compiled or run for each.
constexpr int64_t kHostViewElements = 64;

// The node a chain of slices and reshapes from `n` starts from.
const ir::Node* view_base(const ir::Node* n) {
  while (n->op == ir::Op::Slice || n->op == ir::Op::Reshape) n = n->operands[0].get();
  return n;
}

// Whether Data node `n` holds a computed value in host memory (cpu or ref), plain: its bytes
// those of its shape.
bool computed_on_host(const ir::Node& n) {
  const std::shared_ptr<Buffer>& b = n.binding.buffer;
  return b && b->done.load() && !b->error && b->storage &&
         (b->device.kind == DeviceKind::Cpu || b->device.kind == DeviceKind::Ref) &&
         b->bytes == static_cast<size_t>(shape_numel(n.shape)) * dtype_size(n.dtype);
}

// `value`, a few elements viewed through slices and reshapes of a computed value in host memory,
// as a buffer of its own; null where it is not one.
std::shared_ptr<Buffer> host_view_copy(const ir::NodePtr& value) {
  const int64_t numel = shape_numel(value->shape);
  if (numel == 0 || numel > kHostViewElements || value->grad.requires_grad) return nullptr;
  const ir::Node* base = view_base(value.get());
  if (base == value.get() || base->op != ir::Op::Data || !computed_on_host(*base)) return nullptr;
  const std::shared_ptr<Buffer>& b = base->binding.buffer;
  const size_t elem = dtype_size(value->dtype);
  const auto* src = static_cast<const unsigned char*>(b->storage->data());
  std::vector<unsigned char> out(static_cast<size_t>(numel) * elem);
  std::vector<int64_t> idx;
  for (int64_t f = 0; f < numel; ++f) {
    // Element f of the value, row-major, back to its place in the base: a reshape keeps the
    // row-major place, a slice moves the index along its axis.
    int64_t at = f;
    for (const ir::Node* v = value.get(); v != base; v = v->operands[0].get()) {
      if (v->op != ir::Op::Slice) continue;
      const ir::SliceAttrs sl = ir::SliceAttrs::of(v->attrs);
      const Shape& in = v->operands[0]->shape;
      idx.assign(v->shape.size(), 0);
      for (size_t d = v->shape.size(); d-- > 0;) idx[d] = at % v->shape[d], at /= v->shape[d];
      idx[static_cast<size_t>(sl.axis)] = sl.start + idx[static_cast<size_t>(sl.axis)] * sl.step;
      at = 0;
      for (size_t d = 0; d < in.size(); ++d) at = at * in[d] + idx[d];
    }
    std::memcpy(out.data() + static_cast<size_t>(f) * elem, src + static_cast<size_t>(at) * elem,
                elem);
  }
  return upload(b->device, out.data(), out.size());
}

// Whether node `n` may be computed on the host by the ref backend (host_eval). Its value must be
// the one a program would give, bit for bit, whenever the read happens, so only ops exact on every
// backend qualify (movements of any dtype; integer and bool arithmetic, comparisons and reductions
// that cannot fail), on a value small enough that computing it costs less than a program.
bool host_evaluable(const ir::Node& n) {
  if (shape_numel(n.shape) > kHostViewElements || n.grad.requires_grad) return false;
  const ir::OpFamily family = ir::op_info(n.op).family;
  switch (family) {
    case ir::OpFamily::Leaf:
    case ir::OpFamily::Movement:
      return true;
    case ir::OpFamily::Unary:
    case ir::OpFamily::Binary:
    case ir::OpFamily::Comparison:
    case ir::OpFamily::Select:
    case ir::OpFamily::Reduction:
      if (is_floating(n.dtype) || ir::may_fail(n.op, n.dtype)) return false;
      for (const ir::NodePtr& o : n.operands)
        if (is_floating(o->dtype)) return false;
      return true;
    default:
      return false;
  }
}

// `value`, a few elements computed by a small graph of host-evaluable ops (above) from computed
// values in host memory (nanoGPT's get_batch reads `i + 1` for each `i` of its indices), computed
// on this thread by the ref backend, as a buffer of its own; null where it is not one. Caller holds
// no lock; this takes the graph lock to number the graph. (host_view_copy, tried first, covers the
// views alone without a graph, and also through reshapes of a large value, which ref would copy.)
std::shared_ptr<Buffer> host_eval(const ir::NodePtr& value) {
  constexpr size_t kMaxNodes = 32;  // computed nodes; a larger graph is left to a program
  if (value->op == ir::Op::Data || !host_evaluable(*value)) return nullptr;
  if (value->device.kind != DeviceKind::Cpu && value->device.kind != DeviceKind::Ref)
    return nullptr;
  std::unordered_set<const ir::Node*> seen{value.get()};
  std::vector<const ir::Node*> todo{value.get()};
  while (!todo.empty()) {
    const ir::Node* n = todo.back();
    todo.pop_back();
    if (n->device != value->device) return nullptr;
    if (n->op == ir::Op::Data) {
      if (!computed_on_host(*n)) return nullptr;
      continue;
    }
    if (!host_evaluable(*n)) return nullptr;
    for (const ir::NodePtr& o : n->operands)
      if (seen.insert(o.get()).second) {
        if (seen.size() > kMaxNodes) return nullptr;
        todo.push_back(o.get());
      }
  }
  std::shared_ptr<backends::Storage> out;
  try {
    std::lock_guard<std::recursive_mutex> lock(graph_mutex());
    BuiltGraph built = build_graph({value}, value->device);
    materialize_graph(built);
    std::vector<std::shared_ptr<backends::Storage>> inputs;
    inputs.reserve(built.buffers.size());
    for (const std::shared_ptr<Buffer>& b : built.buffers) inputs.push_back(b->storage);
    out = backends::backend_for(Device{DeviceKind::Ref, 0})
              .compile(built.graph)
              ->run(inputs, built.scalars, {}, {})
              .at(0);
  } catch (const InternalError&) {
    throw;
  } catch (const std::exception&) {
    return nullptr;  // left to a program, which reports what failed as any program does
  }
  return upload(value->device, out->data(),
                static_cast<size_t>(shape_numel(value->shape)) * dtype_size(value->dtype));
}

// The pending tensor of `me` whose value is `node`, else null.
std::shared_ptr<TensorImpl> pending_holder(Context& me, const ir::Node* node) {
  if (auto pending = pending_targets(me))
    for (std::shared_ptr<TensorImpl>& t : *pending)
      if (current_node(*t).get() == node) return std::move(t);
  return nullptr;
}

// The pending tensors whose values share a computed node with `value` (the one `impl` holds),
// `impl` among them, in pending_targets' order.
std::vector<std::shared_ptr<TensorImpl>> sharing_history(Context& me,
                                                         const std::shared_ptr<TensorImpl>& impl,
                                                         const ir::NodePtr& value) {
  std::optional<std::vector<std::shared_ptr<TensorImpl>>> pending = pending_targets(me);
  if (!pending || pending->size() < 2) return {impl};
  std::unordered_set<const ir::Node*> read;  // what computing `value` computes
  std::vector<const ir::Node*> todo{value.get()};
  while (!todo.empty()) {
    const ir::Node* n = todo.back();
    todo.pop_back();
    if (n->op == ir::Op::Data || !read.insert(n).second) continue;
    for (const ir::NodePtr& o : n->operands) todo.push_back(o.get());
  }
  // Nodes whose whole history was walked without meeting `read`: later walks stop there.
  std::unordered_set<const ir::Node*> apart;
  std::vector<std::shared_ptr<TensorImpl>> out;
  for (std::shared_ptr<TensorImpl>& t : *pending) {
    std::unordered_set<const ir::Node*> seen;
    bool shares = t == impl;
    todo.assign(1, current_node(*t).get());
    while (!todo.empty() && !shares) {
      const ir::Node* n = todo.back();
      todo.pop_back();
      if (n->op == ir::Op::Data || apart.count(n) || !seen.insert(n).second) continue;
      shares = read.count(n) > 0;
      for (const ir::NodePtr& o : n->operands) todo.push_back(o.get());
    }
    if (shares)
      out.push_back(std::move(t));
    else
      apart.insert(seen.begin(), seen.end());
  }
  if (std::find(out.begin(), out.end(), impl) == out.end()) out.push_back(impl);
  return out;
}

}  // namespace

std::shared_ptr<Buffer> materialize(const Tensor& t, const Loc& loc, const char* api) {
  if (t.defined() && t.impl()->sharded() && reads_gathered()) {
    // A sharded parameter: its whole value, from its owner (a collective: every rank reads it).
    const Tensor whole = new_tensor(node_of(t, "read", loc), false);
    return materialize(whole, loc, api);
  }
  node_of(t, "read", loc);
  std::shared_ptr<TensorImpl> impl = t.impl_ptr();
  Context& me = current_context();
  // The value as of this read, taken once: another thread's step may give the tensor a new
  // (pending) value at any moment after the ownership check, and the read must not then chase
  // a value that has no buffer.
  ir::NodePtr value = closure_value(*impl, current_node(*impl));
  // A few elements viewed from a computed value are copied on the host, or computed there from
  // computed values by exact integer ops: no program (in a step too, where a read that computes
  // runs all of the step's work so far, below).
  if (value->op != ir::Op::Data && !on_runtime_thread()) {
    std::shared_ptr<Buffer> own = host_view_copy(value);
    if (!own) own = host_eval(value);
    if (own) {
      count(Counter::HostReads);
      set_value(*impl, ir::make_data(own, impl->shape, impl->dtype, own->device, loc), api, loc);
      value = current_node(*impl);
    }
  }
  if (value->op != ir::Op::Data) {
    if (on_runtime_thread())
      util::fail(loc, "read",
                 "a step closure read a value that is not computed yet (closures run on the "
                 "runtime thread, which cannot run another program)",
                 "Read only tensors of the finished step in a closure, or read after the step");
    count(Counter::ImplicitSyncs);
    count(Counter::Syncs);
    wait_for_room(me);
    std::lock_guard<std::recursive_mutex> lock(graph_mutex());
    const std::string at = util::where(loc);
    const std::string site = cat(api, " at ", at);
    std::vector<std::shared_ptr<TensorImpl>> targets{impl};
    if (const int64_t step = me.active_step.load(); step != 0) {
      if (me.implicit_step != step) me.implicit_step = step, me.implicit_in_step = 0;
      site_in_step(site, ++me.implicit_in_step, cat("step ", step));
      // Inside a step the read computes all of the step's work so far, not only the value read:
      // what the rest of the step uses (the forward behind a loss already differentiated, the
      // gradients) is then computed once, here, instead of again by the step's program (a
      // DCGAN step reading five values ran 2.4x slower). The step's journal still holds every
      // value at entry, so its rollback is unchanged. Not in data parallel: a read on one rank
      // (rank 0 printing its loss) must not take the step's collectives into a program the
      // other ranks never run.
      if (auto pending = dist::detail::active() ? std::nullopt : pending_targets(me)) {
        targets = std::move(*pending);
        if (std::find(targets.begin(), targets.end(), impl) == targets.end())
          targets.push_back(impl);
      }
    } else if (const ir::Node* base = view_base(value.get());
               base != value.get() && shape_numel(value->shape) <= kHostViewElements &&
               base->op != ir::Op::Data) {
      // A few elements viewed from a pending value another tensor holds: that tensor is computed
      // too, so that reads of its other elements are copies on the host (host_view_copy).
      if (std::shared_ptr<TensorImpl> holder = pending_holder(me, base))
        if (holder != impl) targets.push_back(std::move(holder));
    } else if (!dist::detail::active() && site_grows(site)) {
      // Outside a step, at a read that recomputed a growing history (a loop without a step: an
      // evaluation carrying an LSTM's state, a training loop's pending parameters), the read
      // also computes the pending values that share its history: nothing else computes them,
      // and the next read then starts from their values, in a program of one size.
      targets = sharing_history(me, impl, value);
    }
    std::vector<Job> jobs =
        build_jobs(std::move(targets), cat("implicit sync at ", at), site, nullptr, true, me);
    enqueue(jobs);
    value = current_node(*impl);
  }
  std::shared_ptr<Buffer> b = value->binding.buffer;
  if (!b) {  // computed by this sync, then given another value by a step on another thread
    std::string other = "another thread";
    {
      TensorLock lock(*impl);
      if (impl->owner && impl->owner != &me) other = impl->owner->name();
    }
    util::fail(
        loc, api,
        cat("the step of ", other, " gave this tensor a new value while ", me.name(), " read it"),
        "A tensor belongs to one thread's step at a time: give each thread its own "
        "tensors, or read it once the other thread's step has ended");
  }
  if (on_runtime_thread() && !b->done.load())  // never wait on a program queued behind the closure
    util::fail(loc, api,
               "a step closure read a value that a program queued after its step computes, and "
               "no step recorded its value as of the closure's step (it changed outside a step)",
               "Read it in a closure of the step that computes it, or after ls::wait()");
  wait_buffer(*b);
  if (b->error) {
    settle_failures(me);
    forget_unreported(me, b->error);
    std::rethrow_exception(b->error);
  }
  if (!on_runtime_thread()) throw_unreported(me);
  return b;
}

std::vector<unsigned char> read_bytes(const Tensor& t, const Loc& loc, const char* api) {
  std::shared_ptr<Buffer> b = materialize(t, loc, api);
  std::vector<unsigned char> host(b->bytes);
  if (b->bytes) backends::backend_for(b->device).copy_out(*b->storage, host.data(), b->bytes);
  count(Counter::BytesFromDevice, static_cast<int64_t>(b->bytes));
  return host;
}

void wait_all() {
  if (on_runtime_thread())
    throw Error("ls::wait() called from a step closure: closures run on the runtime thread");
  Context& me = current_context();
  wait_idle(me);
  throw_unreported(me);
}

}  // namespace lockstep::runtime

namespace lockstep {

HostMemory host_memory(const Tensor& t, Loc loc) {
  std::shared_ptr<runtime::Buffer> b = runtime::materialize(t, loc, "host_memory");
  if (b->device.kind != DeviceKind::Cpu && b->device.kind != DeviceKind::Ref)
    util::fail(loc, "host_memory",
               util::cat("the tensor lives on ", device_name(b->device), ", not in host memory"),
               "Copy it to the cpu device first (t.to(ls::parse_device(\"cpu\")))");
  // An export is of this handle's value alone: where the value is shared (another handle holds
  // it, as a clone or a cat of one does, or an op recorded but not run yet reads it), the handle
  // first takes a copy of its own, so that writes through the export change it alone.
  if (b->bytes != 0 && runtime::current_node(*t.impl()).use_count() > 2) {  // its and ours
    std::shared_ptr<runtime::Buffer> own = runtime::upload(b->device, b->storage->data(), b->bytes);
    own->name = b->name;
    runtime::set_value(*t.impl(), ir::make_data(own, t.shape(), t.dtype(), b->device, loc),
                       "host_memory", loc);
    b = std::move(own);
  }
  // The owner shares the storage: the executor donates an input's storage to an in-place update
  // only while nothing else holds it (runtime::donatable_inputs).
  std::shared_ptr<backends::Storage> storage = b->storage;
  void* data = b->bytes != 0 ? storage->data() : nullptr;
  // The caller may write through the memory: no program of this thread queued so far may still
  // read it then (a closure cannot wait for the programs queued after its own).
  if (!runtime::on_runtime_thread()) runtime::wait_idle(runtime::current_context());
  return {data, std::shared_ptr<void>(storage, data)};
}

namespace {
std::atomic<uint16_t> g_default_device{
    static_cast<uint16_t>(static_cast<unsigned>(DeviceKind::Cpu) << 8)};  // kind << 8 | index
}

Device default_device() {
  const uint16_t v = g_default_device.load();
  return {static_cast<DeviceKind>(v >> 8), v & 0xff};
}

void set_default_device(Device device) {
  backends::backend_for(device);  // refuses a device this build or machine lacks
  g_default_device.store(static_cast<uint16_t>(static_cast<unsigned>(device.kind) << 8 |
                                               (static_cast<unsigned>(device.index) & 0xff)));
}

}  // namespace lockstep
