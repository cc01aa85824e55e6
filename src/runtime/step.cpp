// The step transaction: sync on entry and exit, a journal of every tensor changed in the step
// (its value at entry), rollback on an exception, step closures, and the public sync/wait.
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "lockstep/autocast.h"
#include "lockstep/runtime.h"
#include "runtime/context.h"
#include "runtime/lazy.h"
#include "runtime/metrics.h"
#include "runtime/sites.h"
#include "util/check.h"

namespace lockstep {
namespace runtime {
namespace {

using util::cat;

struct JournalEntry {
  std::weak_ptr<TensorImpl> tensor;
  ir::NodePtr node;
  std::exception_ptr poison;
  Tensor grad;
};

struct StepState {
  int64_t id = 0;
  std::source_location loc;
  std::vector<JournalEntry> journal;
  std::vector<std::weak_ptr<TensorImpl>> created;
  std::vector<std::function<void()>> closures;
  int64_t trace_start_ns = 0;
};

// A step belongs to the thread that entered it: tensors made meanwhile by data-loading threads
// are not part of it, and other threads may not use what it changed until it ends (context.h).
thread_local StepState* t_active = nullptr;
std::atomic<int64_t> g_step_counter{0};

std::string step_origin(const StepState& s) {
  return cat("step ", s.id, " (entered at ", util::where(s.loc), ")");
}

void begin(StepState& s, const std::source_location& loc) {
  if (t_active)
    util::fail(loc, "step", cat("steps do not nest: ", step_origin(*t_active), " is still running"),
               "End the outer step before starting another");
  if (on_runtime_thread())
    util::fail(loc, "step", "a step cannot start inside a step closure", "Start it after the step");
  const std::string entry = cat("sync on entry to the step at ", util::where(loc));
  sync_all(entry, entry, nullptr, false);
  s.id = g_step_counter.fetch_add(1) + 1;
  s.loc = loc;
  count(Counter::Steps);
  s.trace_start_ns = now_ns();
  Context& me = current_context();
  {
    std::lock_guard<std::recursive_mutex> lock(me.mu);
    me.step_loc = loc;
  }
  me.active_step.store(s.id);
  t_active = &s;
}

void end_step() {
  t_active = nullptr;
  current_context().active_step.store(0);
}

void rollback(StepState& s, const std::string& reason) {
  t_active = nullptr;  // restoring is not journaled; other threads wait for end_step() below
  auto lost = std::make_exception_ptr(
      Error(cat("this tensor was created in ", step_origin(s),
                ", which was rolled back because an exception left it: ", reason)));
  for (auto it = s.journal.rbegin(); it != s.journal.rend(); ++it)
    if (auto t = it->tensor.lock()) restore(*t, it->node, it->poison, it->grad);
  for (auto& w : s.created)
    if (auto t = w.lock()) poison(*t, lost);
  end_step();
  count(Counter::Rollbacks);
}

// Autograd history ends with the step: values computed by a read inside it stop standing for
// the step's graph (which would keep the graph and its buffers alive).
void end_history(StepState& s) {
  auto cut = [](TensorImpl& t) {
    TensorLock lock(t);
    if (t.node && t.node->grad.alias) {
      t.same_value_as = t.node.get();
      t.node = ir::annotated(t.node, {t.requires_grad, t.node->grad.leaf, nullptr, nullptr});
    }
  };
  for (auto& w : s.created)
    if (auto t = w.lock()) cut(*t);
  for (auto& e : s.journal)
    if (auto t = e.tensor.lock()) cut(*t);
}

// Once the step's programs are built: its journal becomes their rollback record (the values at
// step entry, kept until the programs have run, and what the step gave each tensor), and the
// step's own references go, so the programs may update those values in place.
std::shared_ptr<StepRollback> hand_over(StepState& s) {
  end_history(s);
  std::shared_ptr<StepRollback> rollback;
  if (!s.journal.empty()) {
    rollback = std::make_shared<StepRollback>();
    rollback->entries.reserve(s.journal.size());
    for (JournalEntry& e : s.journal) {
      std::shared_ptr<TensorImpl> t = e.tensor.lock();
      if (!t) continue;
      ir::NodePtr after = current_node(*t);
      rollback->entries.push_back({std::move(e.tensor), std::move(e.node), std::move(e.poison),
                                   std::move(e.grad), std::move(after)});
    }
  }
  s.journal.clear();
  s.created.clear();
  return rollback;
}

void commit(StepState& s) {
  const std::string site = cat("step at ", util::where(s.loc));
  time_ns(Timer::Trace, now_ns() - s.trace_start_ns);
  site_time(site, SitePhase::Trace, now_ns() - s.trace_start_ns);
  try {
    // Past the build nothing can fail here; a failure while the programs run is undone by the
    // runtime from the rollback record (runtime.cpp).
    sync_all(step_origin(s), site, &s.closures, false, [&] { return hand_over(s); });
  } catch (const std::exception& e) {
    rollback(s, e.what());
    throw;
  }
  end_step();
}

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

void journal(TensorImpl& impl) {
  StepState* s = t_active;
  if (!s || impl.touched_in_step == s->id) return;
  impl.touched_in_step = s->id;
  s->journal.push_back({impl.weak_from_this(), impl.node, impl.poison, impl.grad});
}

void note_created(TensorImpl& impl) {
  StepState* s = t_active;
  if (!s) return;
  impl.touched_in_step = s->id;
  s->created.push_back(impl.weak_from_this());
}

}  // namespace runtime

void sync(Loc loc) {
  const std::string at = util::cat("sync at ", util::where(loc));
  runtime::sync_all(at, at, nullptr, true);
}

void wait() { runtime::wait_all(); }

void step(const std::function<void()>& fn, Loc loc) {
  runtime::StepState s;
  runtime::begin(s, loc);
  try {
    fn();
  } catch (...) {
    runtime::rollback(s, runtime::current_reason());
    throw;
  }
  runtime::commit(s);
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

// The guard keeps its state on the heap so that Step stays a small, stable public type.
namespace {
struct GuardState {
  runtime::StepState step;
  std::optional<AutocastScope> autocast;
};
thread_local std::vector<std::unique_ptr<GuardState>> t_guard_states;
}  // namespace

Step::Step(Loc loc) : Step(StepOptions{}, loc) {}

Step::Step(const StepOptions& options, Loc loc)
    : uncaught_at_entry_(std::uncaught_exceptions()), context_(&runtime::current_context()) {
  auto s = std::make_unique<GuardState>();
  if (options.autocast) s->autocast.emplace(*options.autocast, loc);  // refused: no step begun
  runtime::begin(s->step, loc);
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

void Step::commit() {
  if (done_) return;
  if (!on_entering_thread(context_)) fail_other_thread(context_);
  done_ = true;
  runtime::commit(pop_guard_state()->step);
}

Step::~Step() noexcept(false) {
  if (done_) return;
  if (std::uncaught_exceptions() > uncaught_at_entry_) {
    done_ = true;
    if (on_entering_thread(context_))
      runtime::rollback(pop_guard_state()->step, "an exception left the ls::Step scope");
    return;  // on another thread nothing can be done while unwinding
  }
  commit();
}

int64_t current_step() { return runtime::g_step_counter.load(); }

bool in_step() { return runtime::t_active != nullptr; }

void add_step_closure(std::function<void()> fn, Loc loc) {
  if (!runtime::t_active)
    util::fail(loc, "add_step_closure", "called outside a step",
               "Call it inside ls::step(...) or an ls::Step scope");
  runtime::t_active->closures.push_back(std::move(fn));
}

void set_compile_cache_capacity(size_t capacity) { runtime::set_cache_capacity(capacity); }

void set_max_queued_programs(size_t n) {
  if (n == 0)
    throw Error(
        "set_max_queued_programs: n must be at least 1 (a step's program must be able to "
        "wait while the previous one runs)");
  runtime::set_max_queued(n);
}

namespace debug {
std::string last_graph_text() { return runtime::last_graph_text(); }
}  // namespace debug

}  // namespace lockstep
