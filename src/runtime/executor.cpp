// The runtime thread and its queue (executor.h).
#include "runtime/executor.h"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "lockstep/error.h"
#include "lockstep/runtime.h"
#include "runtime/metrics.h"
#include "runtime/profiler.h"
#include "runtime/sites.h"
#include "runtime/transaction.h"
#include "util/check.h"

namespace lockstep::runtime {
namespace {

using util::cat;

struct Executor {
  // `mu` also guards buffer completion and each context's outstanding programs, unreported
  // error and failed steps.
  std::mutex mu;
  std::condition_variable work_cv;
  std::condition_variable done_cv;
  std::condition_variable space_cv;  // a program left the queue
  size_t max_queued = 2;             // programs waiting behind the running one
  std::deque<Job> queue;
  size_t in_flight = 0;  // jobs queued or running (their closures included)
  std::thread worker;
  std::thread::id worker_id;
  // Programs queued once, and run once: compiling each (before its first queueing) and its
  // first run may create static state in the libraries it calls (oneDNN's kernels, its CPU
  // dispatch), to be destroyed at exit before a drain registered earlier would run it.
  std::unordered_set<const backends::Executable*> queued, ran;
  // Rollback records their programs no longer need, kept for their step's thread to free
  // (take_spent_locked): their nodes and tensors were allocated there, and freeing them on the
  // runtime thread would make the two threads contend for the allocator's lock on every step.
  // Only for contexts whose thread lives (Context::keeps_spent).
  std::unordered_map<const Context*, std::vector<std::shared_ptr<StepRollback>>> spent;

  void start_worker() {
    // Registered before the first program runs, again as each program is first queued (after
    // its compilation) and after its first run: so that it runs before the static state that
    // compiling or running it created is destroyed (exit runs handlers and static destructors in
    // reverse order of registration; a program queued at exit and never run before would
    // otherwise run into oneDNN's torn-down kernels).
    std::atexit(drain_at_exit);
    worker = std::thread([this] { loop(); });
    worker_id = worker.get_id();
    worker.detach();  // lives as long as the process; the Executor is never destroyed
  }

  static void drain_at_exit();

  void loop() {
    prof::name_thread("lockstep runtime");
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mu);
        work_cv.wait(lock, [&] { return !queue.empty(); });
        job = std::move(queue.front());
        queue.pop_front();
      }
      space_cv.notify_all();
      Context* ctx = job.ctx;
      std::shared_ptr<StepRollback> record = run_job(job);
      bool register_drain = false;
      {
        std::lock_guard<std::mutex> lock(mu);
        --ctx->outstanding;
        --in_flight;
        register_drain = job.exe && ran.insert(job.exe.get()).second;
        if (record && ctx->keeps_spent && !ctx->waiting) spent[ctx].push_back(std::move(record));
      }
      record.reset();  // a record its thread will not free (it waits, or has ended): freed here
      if (register_drain) std::atexit(drain_at_exit);
      done_cv.notify_all();
    }
  }

  std::shared_ptr<StepRollback> run_job(Job& job);
};

// Swaps out `ctx`'s spent records (caller holds the queue lock), for the caller to free once it
// has dropped the lock (a record's tensors take other locks as they die).
std::vector<std::shared_ptr<StepRollback>> take_spent_locked(Executor& e, Context& ctx) {
  std::vector<std::shared_ptr<StepRollback>> out;
  if (auto it = e.spent.find(&ctx); it != e.spent.end()) out.swap(it->second);
  return out;
}

Executor& ex() {
  static Executor* e = new Executor;  // never destroyed: the runtime thread may outlive main()
  return *e;
}

// An error for `ctx`'s thread to raise (caller holds the queue lock): the first is raised, the
// others after it are named in its message (take_unreported), none is dropped.
void add_unreported_locked(Context& ctx, const std::exception_ptr& error) {
  if (!ctx.unreported) {
    ctx.unreported = error;
  } else if (error != ctx.unreported &&
             std::find(ctx.unreported_more.begin(), ctx.unreported_more.end(), error) ==
                 ctx.unreported_more.end()) {
    ctx.unreported_more.push_back(error);
  }
}

std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

// `ctx`'s unreported errors as one (caller holds the queue lock; forgets them): the first as it
// is when it is alone, else an Error (BackendError when the first is one) naming them all.
std::exception_ptr take_unreported_locked(Context& ctx) {
  std::exception_ptr first = std::exchange(ctx.unreported, nullptr);
  std::vector<std::exception_ptr> more = std::exchange(ctx.unreported_more, {});
  if (!first || more.empty()) return first;
  std::string what = what_of(first);
  what += util::cat("\n(and ", more.size(), more.size() == 1 ? " more error" : " more errors",
                    " before this blocking point:");
  for (const std::exception_ptr& e : more) what += "\n  - " + what_of(e);
  what += ")";
  try {
    std::rethrow_exception(first);
  } catch (const BackendError&) {
    return std::make_exception_ptr(BackendError(what));
  } catch (...) {
    return std::make_exception_ptr(Error(what));
  }
}

// The process is exiting (main returned, or exit was called): the queued programs and closures
// run now, while the libraries they use still exist (a step's log line or checkpoint is not
// lost, and no program runs into torn-down state). Then an error that nothing raised (a closure
// or a program that failed after its thread's last blocking point) is printed and the process
// exits with status 1 instead of reporting success. From the runtime thread itself (exit called
// in a closure) nothing can be waited for.
void Executor::drain_at_exit() {
  Executor& e = ex();
  if (std::this_thread::get_id() == e.worker_id) return;
  std::vector<std::string> errors;
  {
    std::unique_lock<std::mutex> lock(e.mu);
    e.done_cv.wait(lock, [&] { return e.in_flight == 0; });
    for (Context* c : all_contexts())
      if (std::exception_ptr error = take_unreported_locked(*c))
        errors.push_back(cat(c->name(), ": ", what_of(error)));
  }
  if (errors.empty()) return;
  std::fflush(stdout);
  for (const std::string& what : errors)
    std::fprintf(stderr,
                 "lockstep: error: %s\nlockstep: raised after the last blocking point of its "
                 "thread (a read, ls::wait, a sync), so nothing reported it: the process exits "
                 "with status 1\n",
                 what.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

// `rolled_back`: a step's program, whose changes the runtime undoes (see settle_failures).
std::exception_ptr wrap_error(const std::string& origin, std::exception_ptr e, bool rolled_back) {
  const char* after = rolled_back
                          ? "; the step was rolled back: every tensor it changed is back at its "
                            "value before the step, and the tensors it made are poisoned"
                          : "";
  try {
    std::rethrow_exception(e);
  } catch (const BackendError& err) {
    return std::make_exception_ptr(
        BackendError(cat(origin, ": execution failed: ", err.what(), after)));
  } catch (const std::exception& err) {
    return std::make_exception_ptr(Error(cat(origin, ": execution failed: ", err.what(), after)));
  } catch (...) {
    return std::make_exception_ptr(
        Error(cat(origin, ": execution failed: unknown exception", after)));
  }
}

// Runs the job; returns its step's rollback record if the program no longer needs it and nothing
// else holds it, for the step's thread to free.
std::shared_ptr<StepRollback> Executor::run_job(Job& job) {
  std::exception_ptr err;
  std::vector<const Buffer*> lost;  // inputs a failed program overwrote
  for (const auto& in : job.inputs)
    if (in->error) {
      err = in->error;  // an input lost to an earlier failure poisons this program too
      break;
    }
  std::vector<std::shared_ptr<backends::Storage>> results;
  std::shared_ptr<StepRollback> dropped;  // the record, once the program is past its data checks
  std::vector<bool> donatable;
  if (!err && job.exe) {
    std::vector<std::shared_ptr<backends::Storage>> storages;
    storages.reserve(job.inputs.size());
    donatable = donatable_inputs(job.inputs, job.rollback.get());
    for (const auto& in : job.inputs) storages.push_back(in->storage);
    const int64_t t0 = now_ns();
    prof::Span span("execute", "execute");
    if (span)
      span.arg("origin", job.origin), span.arg("site", job.site), span.arg("nodes", job.num_nodes);
    try {
      // Once the program is past its data checks, the step's record of values to restore goes:
      // a later failure (a fault, not the data) poisons what the step changed instead.
      results = job.exe->run(storages, job.scalars, donatable,
                             [&] { dropped = std::move(job.rollback); });
      if (results.size() != job.outputs.size())
        util::internal_fail(__FILE__, __LINE__, "executable returned the wrong number of outputs");
    } catch (const backends::RunError& e) {
      for (int32_t k : e.overwritten_inputs()) lost.push_back(job.inputs.at(k).get());
      err = wrap_error(job.origin, std::current_exception(), job.rollback != nullptr);
      count(Counter::ExecutionErrors);
    } catch (...) {
      err = wrap_error(job.origin, std::current_exception(), job.rollback != nullptr);
      count(Counter::ExecutionErrors);
    }
    const int64_t took = now_ns() - t0;
    time_ns(Timer::Execute, took);
    site_time(job.site, SitePhase::Execute, took);
    count(Counter::Executions);
    count(Counter::ExecutedNodes, job.num_nodes);
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    for (size_t i = 0; i < job.outputs.size(); ++i) {
      if (err)
        job.outputs[i]->error = err;
      else
        job.outputs[i]->storage = std::move(results[i]);
      job.outputs[i]->done.store(true);
    }
    // A donated input's value is gone (overwritten, or freed here): nothing reads it again, and
    // its storage, which the program's output may now hold, must not look shared to a later
    // program's donation check while the record still holds the input.
    if (!err)
      for (size_t k = 0; k < donatable.size(); ++k)
        if (donatable[k]) job.inputs[k]->storage.reset();
    if (err) add_unreported_locked(*job.ctx, err);
    if (err && job.rollback) {  // undone on the step's thread (settle_failures)
      auto& failed = job.ctx->failed;
      if (failed.empty() || failed.back().rollback != job.rollback)
        failed.push_back({job.rollback, {}, err});
      failed.back().lost.insert(failed.back().lost.end(), lost.begin(), lost.end());
    }
  }
  done_cv.notify_all();
  // The spent record goes to the step's thread without the step's values (`after`): the tensors
  // hold them, and a later program that reads one may update it in place only if nothing else
  // does (donatable_inputs).
  std::shared_ptr<StepRollback> spent_record;
  if (dropped && dropped.use_count() == 1) {
    for (StepRollback::Entry& e : dropped->entries) e.after.reset();
    spent_record = std::move(dropped);
  }
  if (err) return spent_record;  // the step's values are not there: its closures do not run
  ActingFor acting(job.ctx);
  prof::Span closures("closure", job.closures.empty() ? nullptr : "step closures");
  for (auto& fn : job.closures) {
    try {
      fn();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      add_unreported_locked(*job.ctx, std::current_exception());
    }
  }
  return spent_record;
}

}  // namespace

void wait_for_room(Context& ctx) {
  Executor& e = ex();
  std::vector<std::shared_ptr<StepRollback>> spent;  // freed after the lock
  std::unique_lock<std::mutex> lock(e.mu);
  if (std::this_thread::get_id() == e.worker_id) return;
  // Before the program is built: its records' buffers back before the next program allocates.
  spent = take_spent_locked(e, ctx);
  if (e.queue.size() >= e.max_queued) {
    count(Counter::QueueWaits);
    ctx.waiting = true;
    e.space_cv.wait(lock, [&] { return e.queue.size() < e.max_queued; });
    ctx.waiting = false;
  }
}

void enqueue(std::vector<Job>& jobs) {
  if (jobs.empty()) return;
  Executor& e = ex();
  bool register_drain = false;
  std::vector<std::shared_ptr<StepRollback>> spent;  // freed after the lock
  {
    std::lock_guard<std::mutex> lock(e.mu);
    if (!e.worker.joinable() && e.worker_id == std::thread::id()) e.start_worker();
    if (std::this_thread::get_id() != e.worker_id) {
      Context& ctx = *jobs.front().ctx;
      spent = take_spent_locked(e, ctx);
      ctx.keeps_spent = true;
    }
    for (Job& job : jobs) {
      ++job.ctx->outstanding;
      ++e.in_flight;
      if (job.exe && e.queued.insert(job.exe.get()).second) register_drain = true;
      e.queue.push_back(std::move(job));
    }
  }
  if (register_drain) std::atexit(Executor::drain_at_exit);
  jobs.clear();
  e.work_cv.notify_one();
}

void wait_buffer(Buffer& b) {
  if (b.done.load()) return;
  Executor& e = ex();
  std::unique_lock<std::mutex> lock(e.mu);
  e.done_cv.wait(lock, [&] { return b.done.load(); });
}

void wait_idle(Context& ctx) {
  Executor& e = ex();
  std::vector<std::shared_ptr<StepRollback>> spent;  // freed after the lock
  std::unique_lock<std::mutex> lock(e.mu);
  const bool mine = std::this_thread::get_id() != e.worker_id;
  if (mine) ctx.waiting = true;
  e.done_cv.wait(lock, [&] { return ctx.outstanding == 0; });
  if (mine) ctx.waiting = false, spent = take_spent_locked(e, ctx);
}

void release_spent(Context& ctx) {
  Executor& e = ex();
  std::vector<std::shared_ptr<StepRollback>> spent;  // freed after the lock
  std::lock_guard<std::mutex> lock(e.mu);
  ctx.keeps_spent = false;
  spent = take_spent_locked(e, ctx);
}

std::vector<Context::FailedStep> take_failed_steps(Context& ctx) {
  Executor& e = ex();
  std::vector<Context::FailedStep> failed;
  std::unique_lock<std::mutex> lock(e.mu);
  if (ctx.failed.empty()) return failed;
  e.done_cv.wait(lock, [&] { return ctx.outstanding == 0; });
  failed.swap(ctx.failed);
  return failed;
}

std::exception_ptr take_unreported(Context& ctx) {
  std::lock_guard<std::mutex> lock(ex().mu);
  return take_unreported_locked(ctx);
}

void forget_unreported(Context& ctx, const std::exception_ptr& error) {
  std::lock_guard<std::mutex> lock(ex().mu);
  if (ctx.unreported != error) return;
  ctx.unreported = nullptr;
  if (!ctx.unreported_more.empty()) {  // the next one moves up
    ctx.unreported = ctx.unreported_more.front();
    ctx.unreported_more.erase(ctx.unreported_more.begin());
  }
}

ir::NodePtr value_at_closure_step(const TensorImpl& t) {
  Executor& e = ex();
  std::lock_guard<std::mutex> lock(e.mu);
  for (const Job& job : e.queue) {
    if (!job.rollback) continue;
    for (const StepRollback::Entry& entry : job.rollback->entries)
      if (entry.tensor.lock().get() == &t) return entry.before;
  }
  return nullptr;
}

bool on_runtime_thread() { return std::this_thread::get_id() == ex().worker_id; }

}  // namespace lockstep::runtime

void lockstep::set_max_queued_programs(size_t n) {
  if (n == 0)
    throw Error(
        "set_max_queued_programs: n must be at least 1 (a step's program must be able to "
        "wait while the previous one runs)");
  runtime::Executor& e = runtime::ex();
  {
    std::lock_guard<std::mutex> lock(e.mu);
    e.max_queued = n;
  }
  e.space_cv.notify_all();
}
