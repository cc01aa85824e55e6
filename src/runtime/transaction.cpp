// The step transaction (transaction.h): the journal and trace-time rollback, the hand-over of a
// step's journal to its programs as their rollback record, which inputs a program may donate, and
// the settlement of steps whose programs failed while they ran.
#include "runtime/transaction.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/error.h"
#include "runtime/compile_cache.h"
#include "runtime/executor.h"
#include "runtime/metrics.h"
#include "runtime/profiler.h"
#include "runtime/sites.h"
#include "util/check.h"

namespace lockstep::runtime {
namespace {

using util::cat;

// A step belongs to the thread that entered it: tensors made meanwhile by data-loading threads
// are not part of it, and other threads may not use what it changed until it ends (context.h).
thread_local StepState* t_active = nullptr;
std::atomic<int64_t> g_step_counter{0};

std::string step_origin(const StepState& s) {
  return cat("step ", s.id, " (entered at ", util::where(s.loc), ")");
}

}  // namespace

void begin_step(StepState& s, const Loc& loc) {
  if (t_active)
    util::fail(loc, "step", cat("steps do not nest: ", step_origin(*t_active), " is still running"),
               "End the outer step before starting another");
  if (on_runtime_thread())
    util::fail(loc, "step", "a step cannot start inside a step closure", "Start it after the step");
  s.begin_ns = prof::now_if_on();
  const std::string entry = cat("sync on entry to the step at ", util::where(loc));
  sync_all(entry, entry, false);
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

namespace {

void end_step() {
  t_active = nullptr;
  current_context().active_step.store(0);
}

}  // namespace

void rollback_step(StepState& s, const std::string& reason) {
  t_active = nullptr;  // restoring is not journaled; other threads wait for end_step() below
  if (s.begin_ns)
    prof::step_done(s.id, cat("step at ", util::where(s.loc)), s.begin_ns, s.trace_start_ns, 0,
                    reason);
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

namespace {

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
    for (StepState::JournalEntry& e : s.journal) {
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

}  // namespace

// The commit, top to bottom: build the programs that compute what the step left pending, hand
// the step's journal over to them as their rollback record, queue them. A failure to build them
// rolls the step back; past the build nothing fails here, and a failure while the programs run
// is undone from the record (settle_failures below).
void commit_step(StepState& s) {
  const std::string site = cat("step at ", util::where(s.loc));
  prof::StepEnd traced(s.id, site, s.begin_ns, s.trace_start_ns);
  time_ns(Timer::Trace, now_ns() - s.trace_start_ns);
  site_time(site, SitePhase::Trace, now_ns() - s.trace_start_ns);
  Context& me = current_context();
  std::optional<std::vector<std::shared_ptr<TensorImpl>>> targets = pending_targets(me);
  if (!targets && s.closures.empty()) {  // nothing to run: free
    hand_over(s);
    return end_step();
  }
  count(Counter::Syncs);
  std::unique_lock<std::recursive_mutex> lock(graph_mutex(), std::defer_lock);
  std::vector<Job> jobs;
  try {
    wait_for_room(me);
    lock.lock();
    jobs = build_jobs(targets ? std::move(*targets) : std::vector<std::shared_ptr<TensorImpl>>{},
                      step_origin(s), site, &s.closures, false, me);
  } catch (const std::exception& e) {
    if (lock.owns_lock()) lock.unlock();
    rollback_step(s, e.what());
    throw;
  }
  // The step's own references go, so the programs may update those values in place.
  const std::shared_ptr<StepRollback> record = hand_over(s);
  for (Job& job : jobs) job.rollback = record;
  enqueue(jobs);
  lock.unlock();
  end_step();
}

StepState* active_step() { return t_active; }
int64_t steps_begun() { return g_step_counter.load(); }

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

std::vector<bool> donatable_inputs(const std::vector<std::shared_ptr<Buffer>>& inputs,
                                   const StepRollback* rollback) {
  std::vector<const Buffer*> held;  // each buffer once per record entry that alone holds it
  if (rollback)
    for (const StepRollback::Entry& e : rollback->entries)
      if (e.before && e.before->op == ir::Op::Data && e.before.use_count() == 1 &&
          e.before->binding.buffer)
        held.push_back(e.before->binding.buffer.get());
  std::sort(held.begin(), held.end());
  std::vector<bool> donatable(inputs.size());
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Buffer* b = inputs[k].get();
    const auto [lo, hi] = std::equal_range(held.begin(), held.end(), b);
    // An input only this program still references (no tensor or node holds its buffer: e.g. a
    // parameter's previous value, after the step rebound the parameter). References only ever
    // drop, so the check cannot go stale.
    donatable[k] = inputs[k].use_count() == 1 + (hi - lo) && inputs[k]->storage.use_count() == 1;
  }
  return donatable;
}

// On the thread whose steps failed while they ran, once all its programs have run: every tensor
// a failed step changed that still holds the value the step gave it goes back to its value at
// step entry, the latest step first (a later step that failed because it read a failed step's
// output restores to that output, which the earlier step's record then takes back further). A
// value that a failed program had already overwritten in place is lost: that tensor is poisoned.
void settle_failures(Context& me) {
  if (on_runtime_thread()) return;  // it cannot wait for itself
  std::vector<Context::FailedStep> failed = take_failed_steps(me);
  for (auto f = failed.rbegin(); f != failed.rend(); ++f) {
    for (auto e = f->rollback->entries.rbegin(); e != f->rollback->entries.rend(); ++e) {
      std::shared_ptr<TensorImpl> t = e->tensor.lock();
      if (!t) continue;
      ir::NodePtr node = e->before;  // then the step's value and gradient handle, released
      Tensor grad = e->before_grad;  // after the lock
      TensorLock lock(*t);
      if (t->node != e->after) continue;  // changed since (by a step that went through)
      const bool lost = e->before && e->before->binding.buffer &&
                        std::find(f->lost.begin(), f->lost.end(),
                                  e->before->binding.buffer.get()) != f->lost.end();
      if (lost) {
        std::string why = "a step failed";
        try {
          std::rethrow_exception(f->error);
        } catch (const std::exception& err) {
          why = err.what();
        }
        t->poison = std::make_exception_ptr(
            Error(cat("this tensor's value was lost: the failed program had already updated it "
                      "in place (",
                      why, ")")));
        t->same_value_as = nullptr;
        register_pending_locked(*t, me);
      } else {
        restore_locked(*t, node, e->before_poison, grad, me);
      }
    }
    count(Counter::RunTimeRollbacks);
  }
}

void throw_unreported(Context& me) {
  settle_failures(me);
  if (std::exception_ptr e = take_unreported(me)) std::rethrow_exception(e);
}

}  // namespace lockstep::runtime
