// Recording contexts: every thread that records has its own pending tensors, its own step and its
// own execution errors, so independent models train on several threads at once; and the rules,
// checked under a per-tensor lock, that turn one tensor used by two threads at once into an
// ls::Error instead of a crash or a lost update. Not here: the step transaction (step.cpp), the
// runtime thread and the compile cache (runtime.cpp), which all contexts share.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/loc.h"
#include "runtime/lazy.h"

namespace lockstep::runtime {

// Tensors whose value is a pending graph, in a list threaded through them (no allocation per
// recorded op), oldest first. Guarded by its context's mutex.
struct PendingList {
  TensorImpl* head = nullptr;
  TensorImpl* tail = nullptr;
  size_t size = 0;
  void insert(TensorImpl* t);
  void erase(TensorImpl* t);
  bool empty() const { return size == 0; }
};

struct Context {
  // Guards `pending` and the step fields below. Recursive: a tensor may die (and leave the list)
  // while the list is walked on the same thread.
  std::recursive_mutex mu;
  PendingList pending;
  // The step running on this context (0: none), readable by other threads without the lock.
  std::atomic<int64_t> active_step{0};
  Loc step_loc;  // where it was entered (under mu)
  // Implicit syncs made inside step `implicit_step` so far (this context's thread only).
  int64_t implicit_step = 0, implicit_in_step = 0;
  // "thread #2": contexts are numbered in the order threads first record.
  const int ordinal;
  // Runtime thread bookkeeping, under the runtime's queue lock: this context's programs not yet
  // run, the first execution error not yet raised on this context's thread, and the steps whose
  // programs failed, oldest first, with the inputs a failed program overwrote (values lost).
  size_t outstanding = 0;
  std::exception_ptr unreported;
  // Further errors (other closures', other programs') that came before this thread's next
  // blocking point: raised with `unreported`, named in its message (executor.cpp).
  std::vector<std::exception_ptr> unreported_more;
  struct FailedStep {
    std::shared_ptr<StepRollback> rollback;
    std::vector<const Buffer*> lost;
    std::exception_ptr error;
  };
  std::vector<FailedStep> failed;
  // Whether a thread owns this context and frees its steps' spent rollback records (executor.h):
  // set as it queues a program, cleared when the thread ends.
  bool keeps_spent = false;
  // Whether that thread is blocked waiting for the runtime (room in the queue, or its programs
  // to finish): then the runtime thread frees the records itself, with no allocation of the
  // stepping thread to contend with, so that their buffers (the step's previous gradients) are
  // back before the next program allocates its own. Guarded by the executor's lock.
  bool waiting = false;

  explicit Context(int n) : ordinal(n) {}
  std::string name() const;
};

// The calling thread's context (made on first use; returned to a pool when the thread ends), or
// the context the runtime thread is acting for (ActingFor).
Context& current_context();
// Every context made so far (they are never freed).
std::vector<Context*> all_contexts();

// While it lives, the calling thread (the runtime thread, running a step's closures) acts for
// `ctx`: closures read the values of their own step as the step's thread would.
class ActingFor {
 public:
  explicit ActingFor(Context* ctx);
  ~ActingFor();
  ActingFor(const ActingFor&) = delete;
  ActingFor& operator=(const ActingFor&) = delete;

 private:
  Context* previous_;
};

// Holds a tensor's own lock: its value, poison, grad, owner and step marks are read and written
// only under it, so two threads never race on them (the sections are a few instructions long).
class TensorLock {
 public:
  explicit TensorLock(const TensorImpl& t) : t_(t) {
    while (t_.lock.exchange(true, std::memory_order_acquire))
      while (t_.lock.load(std::memory_order_relaxed)) std::this_thread::yield();
  }
  ~TensorLock() { t_.lock.store(false, std::memory_order_release); }
  TensorLock(const TensorLock&) = delete;
  TensorLock& operator=(const TensorLock&) = delete;

 private:
  const TensorImpl& t_;
};

// Under the tensor's lock: throws Error when `t` may not be used by `me` now, because another
// thread's step that is still running changed or created it; the message names the op, both
// threads and the step, and `loc` (the user's line).
void check_use(TensorImpl& t, Context& me, const char* op, const Loc& loc);
// Under the tensor's lock, before `me` gives `t` a value computed from `base` (a node of t's
// value): throws Error when t's value is no longer `base` because another thread changed it
// meanwhile, so the update would be lost.
void check_base(TensorImpl& t, Context& me, const ir::Node* base, const char* op, const Loc& loc);

// Under the tensor's lock: puts `t` on its owner's pending list or takes it off, as its value is
// pending or not; a pending tensor of another context moves to `me`.
void register_pending_locked(TensorImpl& t, Context& me);

// Under the tensor's lock: whether its value is a pending graph (not computed, not poisoned).
inline bool holds_pending_value(const TensorImpl& t) {
  return t.node && t.node->op != ir::Op::Data && !t.poison;
}

// Under the tensor's lock: gives `t` the value `node`, with its poison state and gradient handle
// (a rollback). `node` and `grad` get the old ones, for the caller to release after the lock.
void restore_locked(TensorImpl& t, ir::NodePtr& node, std::exception_ptr poison, Tensor& grad,
                    Context& me);

}  // namespace lockstep::runtime
