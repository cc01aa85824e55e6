// The tensor registry: TensorImpl's lifetime, the values tensors hold and their changes (each
// journaled for the step transaction), gradients' handles, uploads, and the pending-graph guard
// (a thread recording far past any compiled program without a sync gets one warning).
// Not here: computing values (runtime.cpp), the contexts' pending lists (context.cpp).
#include <algorithm>
#include <atomic>
#include <iostream>
#include <map>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "ir/attrs.h"
#include "lockstep/autograd.h"
#include "lockstep/runtime.h"
#include "runtime/compile_cache.h"
#include "runtime/context.h"
#include "runtime/executor.h"
#include "runtime/metrics.h"
#include "runtime/sites.h"
#include "runtime/transaction.h"
#include "util/check.h"

namespace {
std::atomic<uint64_t> g_creation_counter{0};
}

lockstep::detail::TensorImpl::TensorImpl(ir::NodePtr n)
    : shape(n->shape),
      dtype(n->dtype),
      node(std::move(n)),
      creation_index(g_creation_counter.fetch_add(1)) {}

lockstep::detail::TensorImpl::~TensorImpl() {
  // No other thread holds this tensor any more; its owner's list still points at it.
  if (pending_registered) {
    std::lock_guard<std::recursive_mutex> lock(owner->mu);
    owner->pending.erase(this);
  }
}

namespace lockstep::runtime {
namespace {

using util::cat;

std::atomic<int64_t> g_pending_limit{0};  // debug::set_pending_graph_limit (0: the rule)
std::atomic<bool> g_growth_warned{false};

int64_t pending_limit() {
  const int64_t set = g_pending_limit.load(std::memory_order_relaxed);
  return set > 0 ? set : std::max<int64_t>(100000, 10 * largest_program());
}

// Recording far past any compiled program without a sync: once per process, the warning names
// the lines that recorded most of the pending nodes (a missing step boundary). The count of nodes
// recorded since the last sync only triggers a look: what reads computed meanwhile (one value a
// step, as a generation loop does) is no longer pending, and only what is pending counts.
void warn_growth(Context& me) {
  if (g_growth_warned.load()) return;
  std::map<std::string, int64_t> by_line;
  int64_t pending = 0;
  {
    std::lock_guard<std::recursive_mutex> lock(me.mu);
    std::unordered_set<const ir::Node*> seen;
    std::vector<const ir::Node*> stack;
    for (TensorImpl* t = me.pending.head; t; t = t->pending_next)
      if (t->node) stack.push_back(t->node.get());
    while (!stack.empty()) {
      const ir::Node* n = stack.back();
      stack.pop_back();
      if (n->op == ir::Op::Data || !seen.insert(n).second) continue;
      ++pending;
      ++by_line[util::where(n->origin.loc)];
      for (const ir::NodePtr& o : n->operands) stack.push_back(o.get());
    }
  }
  if (pending <= pending_limit()) {
    ir::recorded_nodes() = pending;  // look again once as many more are recorded
    return;
  }
  if (g_growth_warned.exchange(true)) return;
  const std::string lines = most_nodes_text(by_line);
  count(Counter::PendingGraphWarnings);
  std::cerr
      << "lockstep: warning: " << pending
      << " nodes pending on this thread (recorded and not yet computed), far past the largest "
         "program compiled ("
      << largest_program()
      << " nodes): is a step boundary (ls::step, ls::sync) missing? Most pending nodes come "
         "from "
      << lines << "\n";
}

void check_growth(Context& me) {
  if (ir::recorded_nodes() > pending_limit()) warn_growth(me);
}

}  // namespace

Tensor new_tensor(ir::NodePtr node, bool of_step) {
  check_growth(current_context());
  auto impl = std::make_shared<TensorImpl>(std::move(node));
  register_pending_locked(*impl, current_context());  // not shared yet: no lock needed
  if (of_step) note_created(*impl);
  return Tensor(std::move(impl));
}

namespace {
thread_local bool t_own_values = false;

// A split parameter's (TensorImpl::gather_runs): each rank's run from it, joined and shaped as
// the parameter; of this rank's run's value `own` (every rank's program the same but for it).
ir::NodePtr gathered_runs(const TensorImpl& impl, const ir::NodePtr& own, const Loc& loc) {
  using Gather = ir::BroadcastAttrs::Gather;
  const TensorImpl::GatherRuns& g = *impl.gather_runs;
  std::vector<ir::NodePtr> runs;
  int64_t total = 0;
  for (size_t r = 0; r < g.runs.size(); ++r) {
    const int64_t n = g.runs[r].second;
    if (n == 0) continue;
    const ir::BroadcastAttrs attrs{static_cast<int64_t>(r),
                                   impl.gather_kept ? Gather::Kept : Gather::Again};
    runs.push_back(ir::make_node(ir::Op::Broadcast, {g.others[r] ? g.others[r] : own},
                                 attrs.encode(), {n}, impl.dtype, loc));
    total += n;
  }
  ir::NodePtr joined = runs.size() == 1 ? runs[0]
                                        : ir::make_node(ir::Op::Concat, std::move(runs), {0},
                                                        {total}, impl.dtype, loc);
  return ir::make_node(ir::Op::Reshape, {std::move(joined)}, {}, impl.shape, impl.dtype, loc);
}

// The value of sharded `impl` (locked) as ops read it: the broadcast from its owner, recorded
// once per value and step, with the parameter's leaf mark, so that backward delivers the
// gradient to the parameter as through its own value. A gather: the backend may run it again for
// the backward's reads rather than keep it (passes::regather).
ir::NodePtr gathered_locked(TensorImpl& impl, const Loc& loc) {
  // A split parameter's gather is of its runs: this rank's changes as the optimizer updates it.
  ir::NodePtr own;
  if (impl.gather_runs && impl.gather_runs->own.defined())
    own = node_of(impl.gather_runs->own, "read", loc);
  const ir::Node* of = own ? own.get() : impl.node.get();
  if (!impl.gathered || impl.gathered_of != of) {
    const NoGrad no_grad;  // the broadcast itself has no gradient: the mark gives it one
    using Gather = ir::BroadcastAttrs::Gather;
    const ir::BroadcastAttrs attrs{impl.gather_root,
                                   impl.gather_kept ? Gather::Kept : Gather::Again};
    impl.gathered = impl.gather_runs ? gathered_runs(impl, own, loc)
                                     : ir::make_node(ir::Op::Broadcast, {impl.node}, attrs.encode(),
                                                     impl.shape, impl.dtype, loc);
    impl.gathered_of = of;
  }
  if (impl.requires_grad && ir::grad_enabled() && impl.gathered->grad.leaf.lock().get() != &impl)
    impl.gathered = ir::annotated(impl.gathered, {true, impl.weak_from_this(), nullptr, nullptr});
  return impl.gathered;
}
}  // namespace

OwnValues::OwnValues() : previous_(t_own_values) { t_own_values = true; }
OwnValues::~OwnValues() { t_own_values = previous_; }
bool reads_gathered() { return !t_own_values; }

void drop_gathered(TensorImpl& impl) {
  TensorLock lock(impl);
  impl.gathered.reset();
  impl.gathered_of = nullptr;
}

ir::NodePtr node_of(const Tensor& t, const char* op, const Loc& loc) {
  if (!t.defined())
    util::fail(loc, op, "got an empty tensor handle (default-constructed ls::Tensor)",
               "Assign it a value first, e.g. ls::zeros({2, 3})");
  TensorImpl& impl = *t.impl();
  if (impl.gather_runs && !t_own_values) impl.gather_runs->adopt(t);
  ir::NodePtr node;
  {
    TensorLock lock(impl);
    check_use(impl, current_context(), op, loc);
    if (impl.poison) std::rethrow_exception(impl.poison);
    if (impl.sharded() && !t_own_values) return gathered_locked(impl, loc);
    // A leaf that requires grad is seen by ops through a node marked as its own, so backward
    // knows where to deliver the gradient. The value is unchanged: no journal entry.
    if (impl.requires_grad && ir::grad_enabled() && impl.node->grad.leaf.lock().get() != &impl) {
      impl.same_value_as = impl.node.get();
      impl.node = ir::annotated(impl.node, {true, impl.weak_from_this(), nullptr, nullptr});
    }
    node = impl.node;
  }
  return closure_value(impl, std::move(node));
}

ir::NodePtr closure_value(const TensorImpl& impl, ir::NodePtr value) {
  if (value->op != ir::Op::Data || !value->binding.buffer || value->binding.buffer->done.load() ||
      !on_runtime_thread())
    return value;
  ir::NodePtr before = value_at_closure_step(impl);
  return before ? before : value;
}

ir::NodePtr current_node(const TensorImpl& impl) {
  TensorLock lock(impl);
  return impl.node;
}

void set_value(TensorImpl& impl, ir::NodePtr node, const char* op, const Loc& loc,
               const ir::Node* base) {
  LS_INTERNAL_CHECK(node->shape == impl.shape && node->dtype == impl.dtype,
                    "a new value of another shape or dtype for ", op);
  Context& me = current_context();
  check_growth(me);
  TensorLock lock(impl);
  check_use(impl, me, op, loc);
  if (impl.node->op == ir::Op::Data && impl.node->binding.buffer &&
      !impl.node->binding.buffer->done.load() && on_runtime_thread())
    util::fail(loc, op,
               "a step closure changed a tensor that a step queued after the closure's own "
               "changes too (the closure sees its own step's values; the later step's would be "
               "lost)",
               "Change it inside a step, or in a closure of the last step that changes it");
  check_base(impl, me, base, op, loc);
  journal(impl);
  std::swap(impl.node, node);  // the old value dies after the lock is released
  impl.same_value_as = nullptr;
  impl.poison = nullptr;
  register_pending_locked(impl, me);
}

Tensor grad_of(const TensorImpl& impl) {
  TensorLock lock(impl);
  return impl.grad;
}

void set_grad_of(TensorImpl& impl, Tensor grad, const char* op, const Loc& loc) {
  TensorLock lock(impl);
  check_use(impl, current_context(), op, loc);
  journal(impl);  // the step's rollback restores the previous grad handle too
  std::swap(impl.grad, grad);
}

void update_grad_of(TensorImpl& impl, const std::function<Tensor(const Tensor&)>& update,
                    const char* op, const Loc& loc) {
  TensorLock lock(impl);
  check_use(impl, current_context(), op, loc);
  journal(impl);
  impl.grad = update(impl.grad);
}

bool requires_grad_of(const TensorImpl& impl) {
  TensorLock lock(impl);
  return impl.requires_grad || impl.node->grad.requires_grad;
}

void set_requires_grad_of(TensorImpl& impl, bool requires_grad) {
  TensorLock lock(impl);
  impl.requires_grad = requires_grad;
  if (!requires_grad && impl.node->grad.requires_grad) {
    impl.same_value_as = impl.node.get();
    impl.node = ir::annotated(impl.node, {});
  }
}

void poison(TensorImpl& impl, std::exception_ptr error) {
  TensorLock lock(impl);
  impl.poison = std::move(error);
  register_pending_locked(impl, current_context());
}

void restore(TensorImpl& impl, ir::NodePtr node, std::exception_ptr poison_state, Tensor grad) {
  TensorLock lock(impl);  // released before the old node and grad (the parameters) die
  restore_locked(impl, node, std::move(poison_state), grad, current_context());
}

std::shared_ptr<Buffer> upload(Device device, const void* data, size_t bytes) {
  backends::Backend& be = backends::backend_for(device);
  auto b = std::make_shared<Buffer>();
  b->device = device;
  b->bytes = bytes;
  b->storage = be.alloc(bytes);
  if (bytes) be.copy_in(*b->storage, data, bytes);
  b->done.store(true);
  count(Counter::BytesToDevice, static_cast<int64_t>(bytes));
  return b;
}

}  // namespace lockstep::runtime

namespace lockstep::debug {
void set_pending_graph_limit(int64_t nodes) {
  runtime::g_pending_limit.store(nodes < 0 ? 0 : nodes);
  runtime::g_growth_warned.store(false);
}
}  // namespace lockstep::debug
