// The runtime core: pending-tensor registry, sync (graph -> cache -> enqueue), the runtime
// thread that executes programs in order, blocking reads and error reporting.
// Not here: the step transaction (step.cpp), metrics (metrics.cpp).
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <iostream>
#include <list>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "lockstep/runtime.h"
#include "runtime/graph_builder.h"
#include "util/check.h"

namespace lockstep::runtime {
namespace {

using util::cat;

struct CacheEntry {
  uint64_t hash;
  std::vector<uint64_t> key;
  std::shared_ptr<const ir::Graph> graph;
  std::shared_ptr<backends::Executable> exe;
};

struct Job {
  std::shared_ptr<backends::Executable> exe;  // null: only closures to run
  std::vector<std::shared_ptr<Buffer>> inputs;
  std::vector<ir::ScalarValue> scalars;
  std::vector<std::shared_ptr<Buffer>> outputs;
  std::string origin;  // "step 3" or "sync at file:line"
  int64_t num_nodes = 0;
  std::vector<std::function<void()>> closures;
};

struct Runtime {
  // Registry and compile cache. Recursive: a tensor may die (and unregister) while the registry
  // is being walked on the same thread.
  std::recursive_mutex mu;
  // Tensors whose value is a pending graph, in a list threaded through them (no allocation per
  // recorded op), oldest first.
  struct PendingList {
    TensorImpl* head = nullptr;
    TensorImpl* tail = nullptr;
    size_t size = 0;
    void insert(TensorImpl* t) {
      t->pending_prev = tail;
      t->pending_next = nullptr;
      (tail ? tail->pending_next : head) = t;
      tail = t;
      ++size;
    }
    void erase(TensorImpl* t) {
      (t->pending_prev ? t->pending_prev->pending_next : head) = t->pending_next;
      (t->pending_next ? t->pending_next->pending_prev : tail) = t->pending_prev;
      t->pending_prev = t->pending_next = nullptr;
      --size;
    }
    bool empty() const { return size == 0; }
  } pending;
  std::list<CacheEntry> lru;  // front: most recently used
  std::unordered_map<uint64_t, std::list<CacheEntry>::iterator> cache;
  size_t cache_capacity = 64;
  std::shared_ptr<const ir::Graph> last_graph;
  bool debug = std::getenv("LOCKSTEP_DEBUG") && std::string(std::getenv("LOCKSTEP_DEBUG")) != "0";
  const char* dump_dir = std::getenv("LOCKSTEP_DUMP");

  // Runtime thread. `qmu` also guards buffer completion and the unreported error.
  std::mutex qmu;
  std::condition_variable work_cv;
  std::condition_variable done_cv;
  std::condition_variable space_cv;  // a program left the queue
  size_t max_queued = 2;             // programs waiting behind the running one (see enqueue)
  std::deque<Job> queue;
  bool busy = false;
  std::thread worker;
  std::thread::id worker_id;
  std::exception_ptr unreported;

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
        busy = true;
      }
      space_cv.notify_all();
      run_job(job);
      {
        std::lock_guard<std::mutex> lock(qmu);
        busy = false;
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

std::exception_ptr wrap_error(const std::string& origin, std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const BackendError& err) {
    return std::make_exception_ptr(BackendError(cat(origin, ": execution failed: ", err.what())));
  } catch (const std::exception& err) {
    return std::make_exception_ptr(Error(cat(origin, ": execution failed: ", err.what())));
  } catch (...) {
    return std::make_exception_ptr(Error(cat(origin, ": execution failed: unknown exception")));
  }
}

void Runtime::run_job(Job& job) {
  std::exception_ptr err;
  for (const auto& in : job.inputs)
    if (in->error) {
      err = in->error;  // an input lost to an earlier failure poisons this program too
      break;
    }
  std::vector<std::shared_ptr<backends::Storage>> results;
  if (!err && job.exe) {
    std::vector<std::shared_ptr<backends::Storage>> storages;
    storages.reserve(job.inputs.size());
    // An input only this job still references (no tensor, node or journal holds its buffer:
    // e.g. a parameter's previous value, after the step rebound the parameter) may be
    // overwritten by the program. References only ever drop, so the check cannot go stale.
    std::vector<bool> donatable(job.inputs.size());
    for (size_t k = 0; k < job.inputs.size(); ++k)
      donatable[k] = job.inputs[k].use_count() == 1 && job.inputs[k]->storage.use_count() == 1;
    for (const auto& in : job.inputs) storages.push_back(in->storage);
    const int64_t t0 = now_ns();
    try {
      results = job.exe->run(storages, job.scalars, donatable);
      if (results.size() != job.outputs.size())
        util::internal_fail(__FILE__, __LINE__, "executable returned the wrong number of outputs");
    } catch (...) {
      err = wrap_error(job.origin, std::current_exception());
      count("execution_errors");
    }
    time_ns("execute", now_ns() - t0);
    count("executions");
    count("executed_nodes", job.num_nodes);
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
    if (err && !unreported) unreported = err;
  }
  done_cv.notify_all();
  if (err) return;  // the step's values are not there: its closures do not run
  for (auto& fn : job.closures) {
    try {
      fn();
    } catch (...) {
      std::lock_guard<std::mutex> lock(qmu);
      if (!unreported) unreported = std::current_exception();
    }
  }
}

// Hands a program to the runtime thread. Backpressure: with max_queued programs already
// waiting, the caller waits for room (never the runtime thread itself, and never a caller that
// holds the registry lock, which the runtime thread may need), so a loop that traces faster
// than it runs does not pile up programs and the inputs they hold.
void enqueue(Job job) {
  Runtime& r = rt();
  {
    std::unique_lock<std::mutex> lock(r.qmu);
    if (!r.worker.joinable() && r.worker_id == std::thread::id()) r.start_worker();
    if (std::this_thread::get_id() != r.worker_id && r.queue.size() >= r.max_queued) {
      count("queue_waits");
      r.space_cv.wait(lock, [&] { return r.queue.size() < r.max_queued; });
    }
    r.queue.push_back(std::move(job));
  }
  r.work_cv.notify_one();
}

void wait_buffer(Buffer& b) {
  if (b.done.load()) return;
  Runtime& r = rt();
  std::unique_lock<std::mutex> lock(r.qmu);
  r.done_cv.wait(lock, [&] { return b.done.load(); });
}

const CacheEntry& lookup_or_compile(BuiltGraph& built, const std::string& origin) {
  Runtime& r = rt();
  auto it = r.cache.find(built.hash);
  if (it != r.cache.end() && it->second->key == built.key) {
    r.lru.splice(r.lru.begin(), r.lru, it->second);
    count("cache_hits");
    return *it->second;
  }
  const int64_t t0 = now_ns();
  materialize_graph(built);
  std::shared_ptr<backends::Executable> exe =
      backends::backend_for(built.graph.device).compile(built.graph);
  time_ns("compile", now_ns() - t0);
  count("compiles");
  if (r.debug)
    std::cerr << "lockstep: compile #" << metrics::counter("compiles") << " for " << origin
              << ": graph " << std::hex << built.hash << std::dec << " with "
              << built.graph.nodes.size() << " nodes on " << device_name(built.graph.device)
              << ", not in the cache (" << r.lru.size() << " programs cached)\n";
  if (r.dump_dir) {
    std::ofstream f(cat(r.dump_dir, "/graph-", std::hex, built.hash, ".txt"));
    f << ir::to_text(built.graph);
  }
  if (it != r.cache.end()) {  // a hash collision: the new program replaces the old one
    r.lru.erase(it->second);
    r.cache.erase(it);
  }
  r.lru.push_front({built.hash, std::move(built.key),
                    std::make_shared<const ir::Graph>(built.graph), std::move(exe)});
  r.cache[built.hash] = r.lru.begin();
  while (r.lru.size() > r.cache_capacity) {
    r.cache.erase(r.lru.back().hash);
    r.lru.pop_back();
  }
  return r.lru.front();
}

// Computes the given pending tensors. Caller holds rt().mu.
// Builds and compiles the programs that compute `targets` and rebinds the targets to their
// outputs; the jobs go to `ready`, for the caller to enqueue once it has dropped its own
// references to the old values (so the programs may update them in place).
void sync_impls(const std::vector<std::shared_ptr<TensorImpl>>& targets, const std::string& origin,
                std::vector<std::function<void()>>* closures, bool keep_history,
                std::vector<Job>* ready) {
  Runtime& r = rt();
  // One program per device, in the order devices first appear.
  std::vector<Device> devices;
  for (const auto& t : targets) {
    bool seen = false;
    for (Device d : devices) seen = seen || d == t->node->device;
    if (!seen) devices.push_back(t->node->device);
  }
  for (size_t di = 0; di < devices.size(); ++di) {
    const Device device = devices[di];
    std::vector<std::shared_ptr<TensorImpl>> group;
    std::vector<ir::NodePtr> roots;
    for (const auto& t : targets)
      if (t->node->device == device) {
        group.push_back(t);
        roots.push_back(t->node);
      }
    const int64_t t0 = now_ns();
    BuiltGraph built = build_graph(roots, device);
    time_ns("graph", now_ns() - t0);
    const CacheEntry& entry = lookup_or_compile(built, origin);
    r.last_graph = entry.graph;
    Job job;
    job.exe = entry.exe;
    job.inputs = std::move(built.buffers);
    job.scalars = std::move(built.scalars);
    job.origin = origin;
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
      ir::NodePtr data =
          ir::make_data(job.outputs[built.root_output[k]], t.node->shape, t.node->dtype, device);
      if (t.requires_grad)
        data = ir::annotated(data, true, t.weak_from_this(), nullptr);
      else if (keep_history && t.node->requires_grad)
        data = ir::annotated(data, true, {}, t.node);
      t.node = std::move(data);
      if (t.pending_registered) r.pending.erase(&t);
      t.pending_registered = false;
    }
    if (closures && di + 1 == devices.size()) job.closures = std::move(*closures);
    ready->push_back(std::move(job));
  }
  if (closures && !closures->empty()) {  // nothing to compute: closures still run in order
    Job job;
    job.origin = origin;
    job.closures = std::move(*closures);
    ready->push_back(std::move(job));
  }
}

void throw_unreported() {
  Runtime& r = rt();
  std::exception_ptr e;
  {
    std::lock_guard<std::mutex> lock(r.qmu);
    std::swap(e, r.unreported);
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
    : node(std::move(n)), creation_index(g_creation_counter.fetch_add(1)) {}

lockstep::detail::TensorImpl::~TensorImpl() {
  if (pending_registered) {
    auto& r = runtime::rt();
    std::lock_guard<std::recursive_mutex> lock(r.mu);
    r.pending.erase(this);
  }
}

namespace lockstep::runtime {

void register_pending(TensorImpl& impl) {
  const bool pending = impl.node && impl.node->op != ir::Op::Data && !impl.poison;
  if (pending == impl.pending_registered) return;
  Runtime& r = rt();
  std::lock_guard<std::recursive_mutex> lock(r.mu);
  if (pending)
    r.pending.insert(&impl);
  else
    r.pending.erase(&impl);
  impl.pending_registered = pending;
}

Tensor new_tensor(ir::NodePtr node, bool of_step) {
  auto impl = std::make_shared<TensorImpl>(std::move(node));
  register_pending(*impl);
  if (of_step) note_created(*impl);
  return Tensor(std::move(impl));
}

const ir::NodePtr& node_of(const Tensor& t, const char* op, const std::source_location& loc) {
  if (!t.defined())
    util::fail(loc, op, "got an empty tensor handle (default-constructed ls::Tensor)",
               "Assign it a value first, e.g. ls::zeros({2, 3})");
  TensorImpl& impl = *t.impl();
  if (impl.poison) std::rethrow_exception(impl.poison);
  // A leaf that requires grad is seen by ops through a node marked as its own, so backward
  // knows where to deliver the gradient. The value is unchanged: no journal entry.
  if (impl.requires_grad && ir::grad_enabled() && impl.node->grad_leaf.lock().get() != &impl)
    impl.node = ir::annotated(impl.node, true, impl.weak_from_this(), nullptr);
  return impl.node;
}

void set_value(TensorImpl& impl, ir::NodePtr node) {
  journal(impl);
  impl.node = std::move(node);
  impl.poison = nullptr;
  register_pending(impl);
}

void poison(TensorImpl& impl, std::exception_ptr error) {
  impl.poison = std::move(error);
  register_pending(impl);
}

void restore(TensorImpl& impl, ir::NodePtr node, std::exception_ptr poison_state, Tensor grad) {
  impl.node = std::move(node);
  impl.poison = std::move(poison_state);
  impl.grad = std::move(grad);
  register_pending(impl);
}

std::shared_ptr<Buffer> upload(Device device, const void* data, size_t bytes) {
  backends::Backend& be = backends::backend_for(device);
  auto b = std::make_shared<Buffer>();
  b->device = device;
  b->bytes = bytes;
  b->storage = be.alloc(bytes);
  if (bytes) be.copy_in(*b->storage, data, bytes);
  b->done.store(true);
  count("bytes_to_device", static_cast<int64_t>(bytes));
  return b;
}

// ---- sync and reads -----------------------------------------------------------------------

bool has_pending() {
  Runtime& r = rt();
  std::lock_guard<std::recursive_mutex> lock(r.mu);
  return !r.pending.empty();
}

void sync_all(const std::string& origin, std::vector<std::function<void()>>* closures,
              bool keep_history, const std::function<void()>& before_enqueue) {
  Runtime& r = rt();
  std::vector<std::shared_ptr<TensorImpl>> targets;
  std::vector<Job> jobs;
  {
    std::lock_guard<std::recursive_mutex> lock(r.mu);
    if (r.pending.empty() && (!closures || closures->empty())) {  // nothing to do: free
      if (before_enqueue) before_enqueue();
      return;
    }
    count("syncs");
    targets.reserve(r.pending.size);
    for (TensorImpl* impl = r.pending.head; impl; impl = impl->pending_next)
      if (auto sp = impl->weak_from_this().lock()) targets.push_back(std::move(sp));
    // The list's order is that of becoming pending; the order tensors were created in is the
    // same every time a loop body runs, so it makes the program (and its hash) the same.
    std::sort(targets.begin(), targets.end(),
              [](const auto& a, const auto& b) { return a->creation_index < b->creation_index; });
    sync_impls(targets, origin, closures, keep_history, &jobs);
    targets.clear();  // the pending graphs die here: only the jobs hold the old values now
  }
  if (before_enqueue) before_enqueue();
  for (Job& job : jobs) enqueue(std::move(job));
}

std::shared_ptr<Buffer> materialize(const Tensor& t, const std::source_location& loc) {
  node_of(t, "read", loc);
  std::shared_ptr<TensorImpl> impl = t.impl_ptr();
  Runtime& r = rt();
  std::vector<Job> jobs;
  {
    std::lock_guard<std::recursive_mutex> lock(r.mu);
    if (impl->node->op != ir::Op::Data) {
      if (std::this_thread::get_id() == r.worker_id)
        util::fail(loc, "read",
                   "a step closure read a value that is not computed yet (closures run on the "
                   "runtime thread, which cannot run another program)",
                   "Read only tensors of the finished step in a closure, or read after the step");
      count("implicit_syncs");
      count("syncs");
      sync_impls({impl}, cat("implicit sync at ", util::where(loc)), nullptr, true, &jobs);
    }
  }
  for (Job& job : jobs) enqueue(std::move(job));  // not under the registry lock: it may wait
  std::shared_ptr<Buffer> b = impl->node->buffer;
  wait_buffer(*b);
  if (b->error) {
    {
      std::lock_guard<std::mutex> lock(r.qmu);
      if (r.unreported == b->error) r.unreported = nullptr;
    }
    std::rethrow_exception(b->error);
  }
  if (std::this_thread::get_id() != r.worker_id) throw_unreported();
  return b;
}

std::vector<unsigned char> read_bytes(const Tensor& t, const std::source_location& loc) {
  std::shared_ptr<Buffer> b = materialize(t, loc);
  std::vector<unsigned char> host(b->bytes);
  if (b->bytes) backends::backend_for(b->device).copy_out(*b->storage, host.data(), b->bytes);
  count("bytes_from_device", static_cast<int64_t>(b->bytes));
  return host;
}

void wait_all() {
  Runtime& r = rt();
  if (std::this_thread::get_id() == r.worker_id)
    throw Error("ls::wait() called from a step closure: closures run on the runtime thread");
  {
    std::unique_lock<std::mutex> lock(r.qmu);
    r.done_cv.wait(lock, [&] { return r.queue.empty() && !r.busy; });
  }
  throw_unreported();
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
  return r.last_graph ? ir::to_text(*r.last_graph) : std::string();
}

bool on_runtime_thread() { return std::this_thread::get_id() == rt().worker_id; }

}  // namespace lockstep::runtime

namespace lockstep {
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
