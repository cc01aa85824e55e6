// The executor: the one runtime thread that runs every context's programs (jobs) in the order
// they were built, its bounded queue, and the waits on it (a buffer filled, a context idle).
// Not here: building and compiling programs (runtime.cpp, compile_cache.cpp), and what a failed
// step's program leaves to undo (transaction.cpp).
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/context.h"

namespace lockstep::runtime {

// A program to run, with what it reads and writes, and the closures that run after it.
struct Job {
  std::shared_ptr<backends::Executable> exe;  // null: only closures to run
  std::vector<std::shared_ptr<Buffer>> inputs;
  std::vector<ir::ScalarValue> scalars;
  std::vector<std::shared_ptr<Buffer>> outputs;
  Context* ctx = nullptr;                  // whose program: its errors are raised on that thread
  std::shared_ptr<StepRollback> rollback;  // a step's: what to restore if the program fails
  std::string origin;                      // "step 3" or "sync at file:line"
  std::string site;                        // where it was built (sites.h)
  int64_t num_nodes = 0;
  std::vector<std::function<void()>> closures;
};

// Hands programs to the runtime thread (started on first use). Called under the graph lock, in
// the order they were built: a program may read the outputs of one built just before it on
// another thread, so the queue's order must be the order of building.
void enqueue(std::vector<Job>& jobs);
// Backpressure: with set_max_queued programs already waiting, waits for room (never on the
// runtime thread itself), so a loop that traces faster than it runs does not pile up programs
// and the inputs they hold. Frees the spent rollback records of `ctx` (the caller's) first.
void wait_for_room(Context& ctx);
// Waits until the buffer's program has run (or failed).
void wait_buffer(Buffer& b);
// Waits until every program of `ctx` has run.
void wait_idle(Context& ctx);
// The rollback records of `ctx`'s steps whose programs no longer need them are freed by its own
// thread as it queues programs or waits for them to be idle: their nodes and tensors were
// allocated there, and the allocator's per-thread caches take them back without a lock shared
// with the runtime thread. This frees them now and stops keeping them (the thread is ending).
void release_spent(Context& ctx);
// Once `ctx` is idle: its steps whose programs failed, oldest first (and forgets them).
std::vector<Context::FailedStep> take_failed_steps(Context& ctx);
// The first execution error not yet raised on `ctx`'s thread (and forgets it); null if none.
std::exception_ptr take_unreported(Context& ctx);
// Forgets `error` as `ctx`'s unreported error (a read raising it itself).
void forget_unreported(Context& ctx, const std::exception_ptr& error);
// For a step closure (on the runtime thread): `t`'s value as of the closure's step when a step
// queued after it changed `t` (the value that step's journal holds as its entry value; its
// program has not run, since the closure runs first); null when no queued step changed `t`.
ir::NodePtr value_at_closure_step(const TensorImpl& t);

}  // namespace lockstep::runtime
