// The runtime core: sync (pending tensors -> graph -> cache -> enqueue), the runtime thread that
// executes every context's programs in order, blocking reads and error reporting.
// Not here: the per-thread contexts and their pending lists (context.cpp), the step transaction
// (step.cpp), metrics (metrics.cpp).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <iostream>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "dist/comm.h"
#include "ir/random_bits.h"
#include "lockstep/runtime.h"
#include "runtime/context.h"
#include "runtime/graph_builder.h"
#include "runtime/metrics.h"
#include "runtime/sites.h"
#include "util/check.h"
#include "util/options.h"

namespace lockstep::runtime {
namespace {

// The pending-graph guard (see check_growth).
std::atomic<int64_t> g_largest_program{0};  // nodes of the largest graph compiled so far
std::atomic<int64_t> g_pending_limit{0};    // debug::set_pending_graph_limit (0: the rule)
std::atomic<bool> g_growth_warned{false};

using util::cat;

struct CacheEntry {
  uint64_t hash;  // cache_hash: the graph's, with the backend's compile setting
  std::vector<uint64_t> key;
  std::string setting;  // Backend::compile_setting when it was compiled
  std::shared_ptr<const ir::Graph> graph;
  std::shared_ptr<backends::Executable> exe;
  bool collectives = false;  // the ranks check they run the same program before it runs
};

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

struct Runtime {
  // Graph building and the compile cache, shared by every context: one sync builds (and, on a
  // miss, compiles) at a time. Building numbers nodes in scratch fields, which two threads
  // sharing a node would otherwise race on. Recursive: a tensor may die while it is held.
  std::recursive_mutex mu;
  std::list<CacheEntry> lru;  // front: most recently used
  std::unordered_map<uint64_t, std::list<CacheEntry>::iterator> cache;
  size_t cache_capacity = 64;
  std::shared_ptr<const ir::Graph> last_graph;
  bool debug = util::option_on(util::Option::Debug);
  const char* dump_dir =
      util::option(util::Option::Dump).empty() ? nullptr : util::option(util::Option::Dump).c_str();

  // Runtime thread. `qmu` also guards buffer completion and each context's outstanding
  // programs and unreported error.
  std::mutex qmu;
  std::condition_variable work_cv;
  std::condition_variable done_cv;
  std::condition_variable space_cv;  // a program left the queue
  size_t max_queued = 2;             // programs waiting behind the running one (see enqueue)
  std::deque<Job> queue;
  std::thread worker;
  std::thread::id worker_id;

  void start_worker() {
    worker = std::thread([this] { loop(); });
    worker_id = worker.get_id();
    worker.detach();  // lives as long as the process; the Runtime is never destroyed
  }

  void loop() {
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(qmu);
        work_cv.wait(lock, [&] { return !queue.empty(); });
        job = std::move(queue.front());
        queue.pop_front();
      }
      space_cv.notify_all();
      Context* ctx = job.ctx;
      run_job(job);
      {
        std::lock_guard<std::mutex> lock(qmu);
        --ctx->outstanding;
      }
      done_cv.notify_all();
    }
  }

  void run_job(Job& job);
};

Runtime& rt() {
  static Runtime* r = new Runtime;  // never destroyed: the runtime thread may outlive main()
  return *r;
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

// Inputs of `job` that only it and its step's rollback record hold: the record's pre-step values
// do not stop an in-place update, since a program that fails leaves its donated inputs as they
// were (or names them lost).
std::vector<bool> donatable_inputs(const Job& job) {
  std::vector<const Buffer*> held;  // each buffer once per record entry that alone holds it
  if (job.rollback)
    for (const StepRollback::Entry& e : job.rollback->entries)
      if (e.before && e.before->op == ir::Op::Data && e.before.use_count() == 1 &&
          e.before->binding.buffer)
        held.push_back(e.before->binding.buffer.get());
  std::sort(held.begin(), held.end());
  std::vector<bool> donatable(job.inputs.size());
  for (size_t k = 0; k < job.inputs.size(); ++k) {
    const Buffer* b = job.inputs[k].get();
    const auto [lo, hi] = std::equal_range(held.begin(), held.end(), b);
    donatable[k] =
        job.inputs[k].use_count() == 1 + (hi - lo) && job.inputs[k]->storage.use_count() == 1;
  }
  return donatable;
}

void Runtime::run_job(Job& job) {
  std::exception_ptr err;
  std::vector<const Buffer*> lost;  // inputs a failed program overwrote
  for (const auto& in : job.inputs)
    if (in->error) {
      err = in->error;  // an input lost to an earlier failure poisons this program too
      break;
    }
  std::vector<std::shared_ptr<backends::Storage>> results;
  if (!err && job.exe) {
    std::vector<std::shared_ptr<backends::Storage>> storages;
    storages.reserve(job.inputs.size());
    // An input only this job still references (no tensor or node holds its buffer: e.g. a
    // parameter's previous value, after the step rebound the parameter) may be overwritten by
    // the program. References only ever drop, so the check cannot go stale.
    const std::vector<bool> donatable = donatable_inputs(job);
    for (const auto& in : job.inputs) storages.push_back(in->storage);
    const int64_t t0 = now_ns();
    try {
      // Once the program is past its data checks, the step's record of values to restore goes:
      // a later failure (a fault, not the data) poisons what the step changed instead.
      results = job.exe->run(storages, job.scalars, donatable, [&job] { job.rollback.reset(); });
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
    std::lock_guard<std::mutex> lock(qmu);
    for (size_t i = 0; i < job.outputs.size(); ++i) {
      if (err)
        job.outputs[i]->error = err;
      else
        job.outputs[i]->storage = std::move(results[i]);
      job.outputs[i]->done.store(true);
    }
    if (err && !job.ctx->unreported) job.ctx->unreported = err;
    if (err && job.rollback) {  // undone on the step's thread (settle_failures)
      auto& failed = job.ctx->failed;
      if (failed.empty() || failed.back().rollback != job.rollback)
        failed.push_back({job.rollback, {}, err});
      failed.back().lost.insert(failed.back().lost.end(), lost.begin(), lost.end());
    }
  }
  done_cv.notify_all();
  if (err) return;  // the step's values are not there: its closures do not run
  ActingFor acting(job.ctx);
  for (auto& fn : job.closures) {
    try {
      fn();
    } catch (...) {
      std::lock_guard<std::mutex> lock(qmu);
      if (!job.ctx->unreported) job.ctx->unreported = std::current_exception();
    }
  }
}

// Backpressure: with max_queued programs already waiting, a sync waits for room before it
// builds its programs (never on the runtime thread itself), so a loop that traces faster than it
// runs does not pile up programs and the inputs they hold. Several threads that all found room
// may each add theirs: at most one more per thread.
void wait_for_room() {
  Runtime& r = rt();
  std::unique_lock<std::mutex> lock(r.qmu);
  if (std::this_thread::get_id() != r.worker_id && r.queue.size() >= r.max_queued) {
    count(Counter::QueueWaits);
    r.space_cv.wait(lock, [&] { return r.queue.size() < r.max_queued; });
  }
}

// Hands programs to the runtime thread. Called under the graph lock, in the order they were
// built: a program may read the outputs of one built just before it on another thread, so the
// queue's order must be the order of building.
void enqueue(std::vector<Job>& jobs) {
  if (jobs.empty()) return;
  Runtime& r = rt();
  {
    std::lock_guard<std::mutex> lock(r.qmu);
    if (!r.worker.joinable() && r.worker_id == std::thread::id()) r.start_worker();
    for (Job& job : jobs) {
      ++job.ctx->outstanding;
      r.queue.push_back(std::move(job));
    }
  }
  jobs.clear();
  r.work_cv.notify_one();
}

void wait_buffer(Buffer& b) {
  if (b.done.load()) return;
  Runtime& r = rt();
  std::unique_lock<std::mutex> lock(r.qmu);
  r.done_cv.wait(lock, [&] { return b.done.load(); });
}

// The compile cache's key for a graph: its hash, with what the backend's programs also depend on
// (Backend::compile_setting).
uint64_t cache_hash(uint64_t graph_hash, const std::string& setting) {
  return setting.empty() ? graph_hash
                         : graph_hash ^ ir::mix64(std::hash<std::string>{}(setting) + 1);
}

// `graph_ns`: how long building and hashing the graph took (a sample of the site's timer).
const CacheEntry& lookup_or_compile(BuiltGraph& built, const std::string& origin,
                                    const std::string& site, int64_t graph_ns) {
  Runtime& r = rt();
  backends::Backend& backend = backends::backend_for(built.graph.device);
  std::string setting = backend.compile_setting();
  const uint64_t hash = cache_hash(built.hash, setting);
  auto it = r.cache.find(hash);
  if (it != r.cache.end() && it->second->key == built.key && it->second->setting == setting) {
    r.lru.splice(r.lru.begin(), r.lru, it->second);
    count(Counter::CacheHits);
    site_sync(site, static_cast<int64_t>(built.order.size()), true, graph_ns);
    return *it->second;
  }
  // The same graph compiled for another setting (a thread count since changed): said as such.
  std::string setting_change;
  for (const CacheEntry& e : r.lru)
    if (e.setting != setting && e.key == built.key) {
      setting_change = cat(backend.name(), ": ", e.setting, " before, ", setting, " now");
      break;
    }
  const int64_t t0 = now_ns();
  site_sync(site, static_cast<int64_t>(built.order.size()), false, graph_ns);
  materialize_graph(built);
  // Why: against the site's earlier graphs (and the steady-state contract, which may refuse).
  site_miss(site, built.graph, r.debug, setting_change);
  std::shared_ptr<backends::Executable> exe;
  try {
    exe = backend.compile(built.graph);
  } catch (const BackendError& e) {
    throw BackendError(cat(origin, ": compile failed: ", e.what()));
  } catch (const Error& e) {
    throw Error(cat(origin, ": compile failed: ", e.what()));
  }
  const int64_t took = now_ns() - t0;
  time_ns(Timer::Compile, took);
  site_time(site, SitePhase::Compile, took);
  count(Counter::Compiles);
  const auto nodes = static_cast<int64_t>(built.graph.nodes.size());
  for (int64_t seen = g_largest_program.load(); nodes > seen;)
    if (g_largest_program.compare_exchange_weak(seen, nodes)) break;
  if (r.debug)
    std::cerr << "lockstep: compile #" << metrics::counter("compiles") << " for " << origin
              << ": graph " << std::hex << built.hash << std::dec << " with "
              << built.graph.nodes.size() << " nodes on " << device_name(built.graph.device)
              << ", not in the cache (" << r.lru.size() << " programs cached)\n";
  if (r.dump_dir) {
    std::ofstream f(cat(r.dump_dir, "/graph-", std::hex, built.hash, ".txt"));
    f << ir::to_text(built.graph, true);
  }
  if (it != r.cache.end()) {  // a hash collision: the new program replaces the old one
    r.lru.erase(it->second);
    r.cache.erase(it);
  }
  auto graph = std::make_shared<const ir::Graph>(built.graph);
  site_compiled(site, graph, static_cast<int64_t>(exe->planned_bytes()));
  const bool collectives = dist::detail::has_collectives(*graph);
  r.lru.push_front({hash, std::move(built.key), std::move(setting), std::move(graph),
                    std::move(exe), collectives});
  r.cache[hash] = r.lru.begin();
  while (r.lru.size() > r.cache_capacity) {
    r.cache.erase(r.lru.back().hash);
    r.lru.pop_back();
  }
  return r.lru.front();
}

// Computes the given pending tensors for context `me`. Caller holds rt().mu.
// Builds and compiles the programs that compute `targets` and rebinds the targets to their
// outputs; the jobs go to `ready`, for the caller to enqueue once it has dropped its own
// references to the old values (so the programs may update them in place).
void sync_impls(const std::vector<std::shared_ptr<TensorImpl>>& targets, const std::string& origin,
                const std::string& site, std::vector<std::function<void()>>* closures,
                bool keep_history, std::vector<Job>* ready, Context& me) {
  Runtime& r = rt();
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
    for (size_t k = 0; k < targets.size(); ++k)
      if (values[k] && values[k]->device == device) {
        group.push_back(targets[k]);
        roots.push_back(values[k]);
      }
    const int64_t t0 = now_ns();
    BuiltGraph built = build_graph(roots, device);
    const int64_t graph_ns = now_ns() - t0;
    time_ns(Timer::Graph, graph_ns);
    const CacheEntry& entry = lookup_or_compile(built, origin, site, graph_ns);
    r.last_graph = entry.graph;
    // The memory preflight: before the program is queued (the limit may have changed since it
    // was compiled), so that nothing runs.
    try {
      entry.exe->check_memory(memory_limit());
    } catch (const Error& e) {
      throw Error(cat(origin, ": ", e.what()));
    }
    // Replicas must agree before any of them enters the program's collectives.
    if (entry.collectives && dist::detail::active())
      dist::detail::agree(entry.hash, *entry.graph, origin);
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
    ready->push_back(std::move(job));
  }
  if (closures && !closures->empty()) {  // nothing to compute: closures still run in order
    Job job;
    job.ctx = &me;
    job.origin = origin;
    job.closures = std::move(*closures);
    ready->push_back(std::move(job));
  }
}

// On the thread whose steps failed while they ran, once all its programs have run: every tensor
// a failed step changed that still holds the value the step gave it goes back to its value at
// step entry, the latest step first (a later step that failed because it read a failed step's
// output restores to that output, which the earlier step's record then takes back further). A
// value that a failed program had already overwritten in place is lost: that tensor is poisoned.
void settle_failures(Context& me) {
  Runtime& r = rt();
  if (std::this_thread::get_id() == r.worker_id) return;  // it cannot wait for itself
  std::vector<Context::FailedStep> failed;
  {
    std::unique_lock<std::mutex> lock(r.qmu);
    if (me.failed.empty()) return;
    r.done_cv.wait(lock, [&] { return me.outstanding == 0; });
    failed.swap(me.failed);
  }
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
  Runtime& r = rt();
  std::exception_ptr e;
  {
    std::lock_guard<std::mutex> lock(r.qmu);
    std::swap(e, me.unreported);
  }
  if (e) std::rethrow_exception(e);
}

}  // namespace

// ---- registry -----------------------------------------------------------------------------

}  // namespace lockstep::runtime

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

// ---- the pending-graph guard -------------------------------------------------------------------

namespace {

int64_t pending_limit() {
  const int64_t set = g_pending_limit.load(std::memory_order_relaxed);
  return set > 0 ? set : std::max<int64_t>(100000, 10 * g_largest_program.load());
}

// Recording far past any compiled program without a sync: once per process, the warning names
// the lines that recorded most of the pending nodes (a missing step boundary).
void warn_growth(Context& me) {
  if (g_growth_warned.exchange(true)) return;
  std::map<std::string, int64_t> by_line;
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
      ++by_line[util::where(n->origin.loc)];
      for (const ir::NodePtr& o : n->operands) stack.push_back(o.get());
    }
  }
  std::vector<std::pair<int64_t, std::string>> top;
  for (const auto& [line, n] : by_line) top.emplace_back(-n, line);
  std::sort(top.begin(), top.end());
  std::string lines;
  for (size_t k = 0; k < top.size() && k < 3; ++k)
    lines += cat(k ? ", " : "", top[k].second, " (", -top[k].first, " nodes)");
  count(Counter::PendingGraphWarnings);
  std::cerr << "lockstep: warning: " << ir::recorded_nodes()
            << " nodes recorded on this thread since its last sync, far past the largest program "
               "compiled ("
            << g_largest_program.load()
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

ir::NodePtr node_of(const Tensor& t, const char* op, const std::source_location& loc) {
  if (!t.defined())
    util::fail(loc, op, "got an empty tensor handle (default-constructed ls::Tensor)",
               "Assign it a value first, e.g. ls::zeros({2, 3})");
  TensorImpl& impl = *t.impl();
  TensorLock lock(impl);
  check_use(impl, current_context(), op, loc);
  if (impl.poison) std::rethrow_exception(impl.poison);
  // A leaf that requires grad is seen by ops through a node marked as its own, so backward
  // knows where to deliver the gradient. The value is unchanged: no journal entry.
  if (impl.requires_grad && ir::grad_enabled() && impl.node->grad.leaf.lock().get() != &impl) {
    impl.same_value_as = impl.node.get();
    impl.node = ir::annotated(impl.node, {true, impl.weak_from_this(), nullptr, nullptr});
  }
  return impl.node;
}

ir::NodePtr current_node(const TensorImpl& impl) {
  TensorLock lock(impl);
  return impl.node;
}

void set_value(TensorImpl& impl, ir::NodePtr node, const char* op, const std::source_location& loc,
               const ir::Node* base) {
  LS_INTERNAL_CHECK(node->shape == impl.shape && node->dtype == impl.dtype,
                    "a new value of another shape or dtype for ", op);
  Context& me = current_context();
  check_growth(me);
  TensorLock lock(impl);
  check_use(impl, me, op, loc);
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

void set_grad_of(TensorImpl& impl, Tensor grad, const char* op, const std::source_location& loc) {
  TensorLock lock(impl);
  check_use(impl, current_context(), op, loc);
  journal(impl);  // the step's rollback restores the previous grad handle too
  std::swap(impl.grad, grad);
}

void update_grad_of(TensorImpl& impl, const std::function<Tensor(const Tensor&)>& update,
                    const char* op, const std::source_location& loc) {
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

// ---- sync and reads -----------------------------------------------------------------------

bool has_pending() {
  Context& me = current_context();
  std::lock_guard<std::recursive_mutex> lock(me.mu);
  return !me.pending.empty();
}

void sync_all(const std::string& origin, const std::string& site,
              std::vector<std::function<void()>>* closures, bool keep_history,
              const std::function<std::shared_ptr<StepRollback>()>& before_enqueue) {
  Runtime& r = rt();
  Context& me = current_context();
  ir::recorded_nodes() = 0;
  std::vector<std::shared_ptr<TensorImpl>> targets;
  {
    std::lock_guard<std::recursive_mutex> lock(me.mu);
    if (me.pending.empty() && (!closures || closures->empty())) {  // nothing to do: free
      if (before_enqueue) before_enqueue();
      return;
    }
    targets.reserve(me.pending.size);
    for (TensorImpl* impl = me.pending.head; impl; impl = impl->pending_next)
      if (auto sp = impl->weak_from_this().lock()) targets.push_back(std::move(sp));
  }
  count(Counter::Syncs);
  // The list's order is that of becoming pending; the order tensors were created in is the
  // same every time a loop body runs, so it makes the program (and its hash) the same.
  std::sort(targets.begin(), targets.end(),
            [](const auto& a, const auto& b) { return a->creation_index < b->creation_index; });
  wait_for_room();
  std::vector<Job> jobs;
  std::lock_guard<std::recursive_mutex> lock(r.mu);
  sync_impls(targets, origin, site, closures, keep_history, &jobs, me);
  targets.clear();  // the pending graphs die here: only the jobs hold the old values now
  if (before_enqueue) {
    std::shared_ptr<StepRollback> rollback = before_enqueue();
    for (Job& job : jobs) job.rollback = rollback;
  }
  enqueue(jobs);
}

std::shared_ptr<Buffer> materialize(const Tensor& t, const std::source_location& loc,
                                    const char* api) {
  node_of(t, "read", loc);
  std::shared_ptr<TensorImpl> impl = t.impl_ptr();
  Runtime& r = rt();
  Context& me = current_context();
  std::vector<Job> jobs;
  if (current_node(*impl)->op != ir::Op::Data) {
    if (std::this_thread::get_id() == r.worker_id)
      util::fail(loc, "read",
                 "a step closure read a value that is not computed yet (closures run on the "
                 "runtime thread, which cannot run another program)",
                 "Read only tensors of the finished step in a closure, or read after the step");
    count(Counter::ImplicitSyncs);
    count(Counter::Syncs);
    wait_for_room();
    std::lock_guard<std::recursive_mutex> lock(r.mu);
    const std::string at = util::where(loc);
    const std::string site = cat(api, " at ", at);
    if (const int64_t step = me.active_step.load(); step != 0) {
      if (me.implicit_step != step) me.implicit_step = step, me.implicit_in_step = 0;
      site_in_step(site, ++me.implicit_in_step, cat("step ", step));
    }
    sync_impls({impl}, cat("implicit sync at ", at), site, nullptr, true, &jobs, me);
    enqueue(jobs);
  }
  std::shared_ptr<Buffer> b = current_node(*impl)->binding.buffer;
  wait_buffer(*b);
  if (b->error) {
    settle_failures(me);
    {
      std::lock_guard<std::mutex> lock(r.qmu);
      if (me.unreported == b->error) me.unreported = nullptr;
    }
    std::rethrow_exception(b->error);
  }
  if (std::this_thread::get_id() != r.worker_id) throw_unreported(me);
  return b;
}

std::vector<unsigned char> read_bytes(const Tensor& t, const std::source_location& loc,
                                      const char* api) {
  std::shared_ptr<Buffer> b = materialize(t, loc, api);
  std::vector<unsigned char> host(b->bytes);
  if (b->bytes) backends::backend_for(b->device).copy_out(*b->storage, host.data(), b->bytes);
  count(Counter::BytesFromDevice, static_cast<int64_t>(b->bytes));
  return host;
}

void wait_all() {
  Runtime& r = rt();
  if (std::this_thread::get_id() == r.worker_id)
    throw Error("ls::wait() called from a step closure: closures run on the runtime thread");
  Context& me = current_context();
  {
    std::unique_lock<std::mutex> lock(r.qmu);
    r.done_cv.wait(lock, [&] { return me.outstanding == 0; });
  }
  throw_unreported(me);
}

void set_max_queued(size_t n) {
  Runtime& r = rt();
  {
    std::lock_guard<std::mutex> lock(r.qmu);
    r.max_queued = n;
  }
  r.space_cv.notify_all();
}

void set_cache_capacity(size_t capacity) {
  Runtime& r = rt();
  std::lock_guard<std::recursive_mutex> lock(r.mu);
  r.cache_capacity = capacity == 0 ? 1 : capacity;
  while (r.lru.size() > r.cache_capacity) {
    r.cache.erase(r.lru.back().hash);
    r.lru.pop_back();
  }
}

std::string last_graph_text() {
  Runtime& r = rt();
  std::lock_guard<std::recursive_mutex> lock(r.mu);
  return r.last_graph ? ir::to_text(*r.last_graph, true) : std::string();
}

bool on_runtime_thread() { return std::this_thread::get_id() == rt().worker_id; }

}  // namespace lockstep::runtime

namespace lockstep {

namespace debug {
void set_pending_graph_limit(int64_t nodes) {
  runtime::g_pending_limit.store(nodes < 0 ? 0 : nodes);
  runtime::g_growth_warned.store(false);
}
}  // namespace debug
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
