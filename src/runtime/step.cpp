// The public face of steps and syncs: ls::step, the ls::Step guard, step closures, ls::sync and
// ls::wait. The transaction itself is transaction.cpp; the runtime's settings are defined beside
// what they set (compile_cache.cpp, executor.cpp).
#include <atomic>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "lockstep/autocast.h"
#include "lockstep/runtime.h"
#include "runtime/context.h"
#include "runtime/lazy.h"
#include "runtime/metrics.h"
#include "runtime/transaction.h"
#include "util/check.h"

namespace lockstep {
namespace runtime {
namespace {

std::string current_reason() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "a non-standard exception";
  }
}

}  // namespace
}  // namespace runtime

// The guard keeps its state on the heap so that Step stays a small, stable public type.
namespace {
struct GuardState {
  runtime::StepState step;
  std::optional<AutocastScope> autocast;
  std::atomic<bool> abandoned{false};  // dropped on another thread: this thread rolls it back
};
thread_local std::vector<std::unique_ptr<GuardState>> t_guard_states;

constexpr const char* kAbandoned =
    "the step was dropped without being ended (its scope object collected, or an interrupt "
    "between its end and its commit): rolled back, as an exception leaving it would";

// Rolls back this thread's innermost guarded steps that another thread abandoned.
void settle_abandoned() {
  while (!t_guard_states.empty() && t_guard_states.back()->abandoned.load()) {
    std::unique_ptr<GuardState> s = std::move(t_guard_states.back());
    t_guard_states.pop_back();
    s->autocast.reset();
    runtime::rollback_step(s->step, kAbandoned);
  }
}
}  // namespace

void sync(Loc loc) {
  settle_abandoned();
  const std::string at = util::cat("sync at ", util::where(loc));
  runtime::sync_all(at, at, true);
}

void wait() { runtime::wait_all(); }

void check_errors() {
  if (runtime::on_runtime_thread()) return;  // a closure: its thread raises them
  runtime::throw_unreported(runtime::current_context());
}

void step(const std::function<void()>& fn, Loc loc) {
  settle_abandoned();
  runtime::StepState s;
  runtime::begin_step(s, loc);
  try {
    fn();
  } catch (...) {
    runtime::rollback_step(s, runtime::current_reason());
    throw;
  }
  runtime::commit_step(s);
}

void step(const std::function<void()>& fn, const StepOptions& options, Loc loc) {
  step(
      [&] {
        std::optional<AutocastScope> scope;
        if (options.autocast) scope.emplace(*options.autocast, loc);
        fn();
      },
      loc);
}

Step::Step(Loc loc) : Step(StepOptions{}, loc) {}

Step::Step(const StepOptions& options, Loc loc)
    : uncaught_at_entry_(std::uncaught_exceptions()), context_(&runtime::current_context()) {
  settle_abandoned();
  auto s = std::make_unique<GuardState>();
  if (options.autocast) s->autocast.emplace(*options.autocast, loc);  // refused: no step begun
  runtime::begin_step(s->step, loc);
  state_ = s.get();
  t_guard_states.push_back(std::move(s));
}

namespace {
// The step's state, its autocast scope ended.
std::unique_ptr<GuardState> pop_guard_state() {
  std::unique_ptr<GuardState> s = std::move(t_guard_states.back());
  t_guard_states.pop_back();
  s->autocast.reset();
  return s;
}

// The guard's state lives with the thread that entered it.
bool on_entering_thread(const void* context) {
  return context == &runtime::current_context() && !t_guard_states.empty();
}

[[noreturn]] void fail_other_thread(const void* context) {
  const auto* entered = static_cast<const runtime::Context*>(context);
  throw Error(util::cat("ls::Step: the step was entered on ", entered->name(), " and ended on ",
                        runtime::current_context().name(),
                        "; a step belongs to the thread that entered it. End it there"));
}
}  // namespace

void Step::abandon() noexcept {
  if (done_) return;
  done_ = true;
  if (!on_entering_thread(context_)) {
    static_cast<GuardState*>(state_)->abandoned.store(true);
    return;
  }
  // The innermost step of this thread (steps do not nest: it is this one).
  try {
    runtime::rollback_step(pop_guard_state()->step, kAbandoned);
  } catch (...) {  // restoring does not throw; never let a destructor's caller see it
  }
}

void Step::commit() {
  if (done_) return;
  if (!on_entering_thread(context_)) fail_other_thread(context_);
  done_ = true;
  runtime::commit_step(pop_guard_state()->step);
}

void Step::rollback(const std::string& reason) {
  if (done_) return;
  if (!on_entering_thread(context_)) fail_other_thread(context_);
  done_ = true;
  runtime::rollback_step(pop_guard_state()->step, reason);
}

Step::~Step() noexcept(false) {
  if (done_) return;
  if (std::uncaught_exceptions() > uncaught_at_entry_) {
    done_ = true;
    if (on_entering_thread(context_))
      runtime::rollback_step(pop_guard_state()->step, "an exception left the ls::Step scope");
    return;  // on another thread nothing can be done while unwinding
  }
  commit();
}

int64_t current_step() { return runtime::steps_begun(); }

bool in_step() { return runtime::active_step() != nullptr; }

void add_step_closure(std::function<void()> fn, Loc loc) {
  runtime::StepState* s = runtime::active_step();
  if (!s)
    util::fail(loc, "add_step_closure", "called outside a step",
               "Call it inside ls::step(...) or an ls::Step scope");
  s->closures.push_back(std::move(fn));
}

namespace debug {
std::string last_graph_text() { return runtime::last_graph_text(); }
}  // namespace debug

}  // namespace lockstep
