// Recording contexts (one per thread that records), the pool they return to when their thread
// ends, and the checks that refuse one tensor used by two threads at once. See context.h.
#include "runtime/context.h"

#include <memory>
#include <vector>

#include "runtime/executor.h"
#include "util/check.h"

namespace lockstep::runtime {
namespace {

using util::cat;

struct ContextPool {
  std::mutex mu;
  std::vector<std::unique_ptr<Context>> all;  // never freed: tensors point at their owner
  std::vector<Context*> free;                 // detached, with no pending tensors
};

ContextPool& pool() {
  static ContextPool* p = new ContextPool;  // used by threads that end after main()
  return *p;
}

}  // namespace

std::vector<Context*> all_contexts() {
  ContextPool& p = pool();
  std::lock_guard<std::mutex> lock(p.mu);
  std::vector<Context*> out;
  for (const auto& c : p.all) out.push_back(c.get());
  return out;
}

namespace {

Context* acquire_context() {
  ContextPool& p = pool();
  std::lock_guard<std::mutex> lock(p.mu);
  while (!p.free.empty()) {
    Context* c = p.free.back();
    p.free.pop_back();
    std::lock_guard<std::recursive_mutex> cl(c->mu);
    if (!c->pending.empty()) continue;  // got pending tensors meanwhile (a closure): keep aside
    return c;
  }
  p.all.push_back(std::make_unique<Context>(static_cast<int>(p.all.size()) + 1));
  return p.all.back().get();
}

// Gives the thread's context back when the thread ends. Its pending tensors (work recorded but
// never synced) stay with it; a context is reused only once it has none.
struct ContextHandle {
  Context* ctx = nullptr;
  ~ContextHandle() {
    if (!ctx) return;
    release_spent(*ctx);
    bool empty;
    {
      std::lock_guard<std::recursive_mutex> cl(ctx->mu);
      ctx->active_step.store(0);
      empty = ctx->pending.empty();
    }
    if (!empty) return;
    ContextPool& p = pool();
    std::lock_guard<std::mutex> lock(p.mu);
    p.free.push_back(ctx);
  }
};

// The fast path reads a plain pointer; the handle (a thread_local with a destructor, slower to
// reach) is touched once per thread.
thread_local Context* t_context = nullptr;
thread_local Context* t_acting = nullptr;
thread_local ContextHandle t_handle;

Context& attach_context() {
  t_handle.ctx = acquire_context();
  t_context = t_handle.ctx;
  return *t_context;
}

}  // namespace

ActingFor::ActingFor(Context* ctx) : previous_(t_acting) { t_acting = ctx; }
ActingFor::~ActingFor() { t_acting = previous_; }

void PendingList::insert(TensorImpl* t) {
  t->pending_prev = tail;
  t->pending_next = nullptr;
  (tail ? tail->pending_next : head) = t;
  tail = t;
  ++size;
}

void PendingList::erase(TensorImpl* t) {
  (t->pending_prev ? t->pending_prev->pending_next : head) = t->pending_next;
  (t->pending_next ? t->pending_next->pending_prev : tail) = t->pending_prev;
  t->pending_prev = t->pending_next = nullptr;
  --size;
}

std::string Context::name() const { return cat("thread #", ordinal); }

Context& current_context() {
  if (t_acting) return *t_acting;
  return t_context ? *t_context : attach_context();
}

void check_use(TensorImpl& t, Context& me, const char* op, const Loc& loc) {
  Context* owner = t.owner;
  if (!owner || owner == &me) return;
  const int64_t step = owner->active_step.load();
  if (step != 0 && t.touched_in_step == step) {
    std::string entered;
    {
      std::lock_guard<std::recursive_mutex> cl(owner->mu);
      entered = util::where(owner->step_loc);
    }
    util::fail(loc, op,
               cat("the tensor is in use by step ", step, " (entered at ", entered, ") on ",
                   owner->name(), ", which changed or created it and is still running; ", me.name(),
                   " used it at the same time"),
               "A tensor belongs to one thread's step at a time: give each thread its own "
               "tensors, or hand a tensor over once the other thread's step has ended");
  }
}

void check_base(TensorImpl& t, Context& me, const ir::Node* base, const char* op, const Loc& loc) {
  if (!base || t.node.get() == base || t.same_value_as == base) return;
  util::fail(loc, op,
             cat("the tensor was changed by ", t.owner ? t.owner->name() : std::string("a thread"),
                 " while ", me.name(),
                 " computed an update from its previous value; that update "
                 "would be lost"),
             "Two threads updating one tensor must take turns: give each thread its own tensors, "
             "or serialize the updates (e.g. under a mutex, or one step after the other)");
}

void register_pending_locked(TensorImpl& t, Context& me) {
  const bool pending = holds_pending_value(t);
  Context* const target = pending ? &me : nullptr;
  if (t.pending_registered && t.owner != target) {
    std::lock_guard<std::recursive_mutex> cl(t.owner->mu);
    t.owner->pending.erase(&t);
    t.pending_registered = false;
  }
  if (pending && !t.pending_registered) {
    std::lock_guard<std::recursive_mutex> cl(me.mu);
    me.pending.insert(&t);
    t.pending_registered = true;
  }
  t.owner = &me;
}

void restore_locked(TensorImpl& t, ir::NodePtr& node, std::exception_ptr poison, Tensor& grad,
                    Context& me) {
  std::swap(t.node, node);
  t.same_value_as = nullptr;
  t.poison = std::move(poison);
  std::swap(t.grad, grad);
  register_pending_locked(t, me);
}

}  // namespace lockstep::runtime
