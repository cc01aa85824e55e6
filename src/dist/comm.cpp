// The MPI world (see comm.h and lockstep/dist.h): init and finalize, collectives with deadlines,
// and the check that the ranks hold the same program. Built without MPI (LOCKSTEP_WITH_MPI 0),
// the world has one rank and init() under a launcher is an Error.
#include "dist/comm.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "ir/random_bits.h"
#include "lockstep/dist.h"
#include "lockstep/runtime.h"
#include "runtime/explain.h"
#include "util/check.h"
#include "util/options.h"

#if LOCKSTEP_WITH_MPI
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace lockstep::dist {

using Clock = std::chrono::steady_clock;
using util::cat;

namespace {

std::chrono::milliseconds timeout_from_env() {
  const char* v = util::option(util::Option::DistTimeout).c_str();
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  if (end == v || *end || !(s > 0) || s > 1e6)
    throw Error(cat("LOCKSTEP_DIST_TIMEOUT='", v,
                    "' is not a number of seconds > 0: set it to e.g. 30 (the default), or unset "
                    "it"));
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000 + 0.5));
}

#if LOCKSTEP_WITH_MPI
std::string seconds(std::chrono::milliseconds t) {
  char text[32];
  std::snprintf(text, sizeof text, "%g s", static_cast<double>(t.count()) / 1000);
  return text;
}
#endif

struct World {
  std::mutex mu;  // init, finalize, broken_why
  std::atomic<bool> initialized{false};
  bool we_init = false, finalized = false;
  int rank = 0, size = 1, local_rank = 0, local_size = 1;
  std::atomic<int64_t> timeout_ms{-1};  // -1: not read from the environment yet
  std::atomic<bool> broken{false};
  std::string broken_why;
  int64_t rounds = 0;  // agreements so far (recording threads, under `control_mu`)
  std::mutex control_mu;
#if LOCKSTEP_WITH_MPI
  MPI_Comm data = MPI_COMM_NULL, control = MPI_COMM_NULL, probe = MPI_COMM_NULL;
#endif
  // Buffers of requests left in flight when a deadline passed: MPI may still write them.
  std::mutex abandoned_mu;
  std::vector<std::shared_ptr<void>> abandoned;
};

World& world() {
  static World* w = new World;  // never destroyed: used at exit
  return *w;
}

#if LOCKSTEP_WITH_MPI
[[noreturn]] void throw_broken() {
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mu);
  throw Error(cat("dist: rank ", w.rank, ": the world is broken (", w.broken_why,
                  "): no collective can run any more. Exit the process (non-zero) and restart "
                  "the job from its last checkpoint"));
}

void break_world(const std::string& why) {
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mu);
  if (!w.broken.exchange(true)) w.broken_why = why;
}

void keep_until_exit(std::shared_ptr<void> p) {
  World& w = world();
  std::lock_guard<std::mutex> lock(w.abandoned_mu);
  w.abandoned.push_back(std::move(p));
}

// Polls `done` until it returns true, the world breaks or `deadline` passes; spins briefly, then
// sleeps between polls so that a waiting thread leaves the core to the others.
template <typename F>
bool poll_until(F&& done, Clock::time_point deadline) {
  for (int polls = 0;; ++polls) {
    if (done()) return true;
    if (world().broken.load() || Clock::now() >= deadline) return false;
    if (polls > 200)
      std::this_thread::sleep_for(std::chrono::microseconds(polls > 5000 ? 500 : 50));
  }
}

// "rank 1", "ranks 1, 3".
std::string ranks_text(const std::vector<int>& ranks) {
  std::string s = ranks.size() > 1 ? "ranks " : "rank ";
  for (size_t k = 0; k < ranks.size(); ++k) s += cat(k ? ", " : "", ranks[k]);
  return s;
}

// What every error after a missed deadline tells the user to do.
constexpr const char* kAfterDeadline =
    "The step's changes are undone; exit the process (non-zero) and restart the job from its "
    "last checkpoint (deadline: ls::dist::set_timeout, LOCKSTEP_DIST_TIMEOUT)";

void check(int rc, const char* call, const std::string& what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw BackendError(cat("dist: ", call, " failed on rank ", world().rank, " (", what,
                         "): ", std::string(msg, static_cast<size_t>(len))));
}

MPI_Datatype mpi_type(DType d, const std::string& what) {
  switch (d) {
    case DType::F32:
      return MPI_FLOAT;
    case DType::F64:
      return MPI_DOUBLE;
    case DType::I32:
      return MPI_INT32_T;
    case DType::I64:
      return MPI_INT64_T;
    case DType::Bool:
    case DType::BF16:  // the kernels widen bf16 to f32 before they sum
      break;
  }
  throw Error(cat("dist: ", what, ": cannot sum ", dtype_name(d),
                  " values over the ranks: cast to ls::i32 or ls::f32 first"));
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

// A message of `bytes` to and from every other rank, point to point on `comm` with `tag`:
// out + r * bytes goes to rank r, rank r's lands at in + r * bytes (the caller keeps both alive,
// also past a missed deadline). Knows which ranks' messages came: those that never send are
// named.
struct Swap {
  std::vector<MPI_Request> recv, send;
  std::vector<int> from;  // the rank of each receive
  std::vector<bool> got;

  Swap(char* in, const char* out, size_t bytes, int tag, MPI_Comm comm, const std::string& what) {
    World& w = world();
    for (int r = 0; r < w.size; ++r) {
      if (r == w.rank) continue;
      const size_t at = static_cast<size_t>(r) * bytes;
      MPI_Request q;
      check(MPI_Irecv(in + at, static_cast<int>(bytes), MPI_BYTE, r, tag, comm, &q), "MPI_Irecv",
            what);
      recv.push_back(q);
      from.push_back(r);
      check(MPI_Isend(out + at, static_cast<int>(bytes), MPI_BYTE, r, tag, comm, &q), "MPI_Isend",
            what);
      send.push_back(q);
    }
    got.assign(recv.size(), false);
  }
  // Tests the receives still open; whether all came. `raise`: an MPI error is a BackendError
  // (else the message counts as not come).
  bool test(bool raise, const std::string& what) {
    bool all = true;
    for (size_t k = 0; k < recv.size(); ++k) {
      int flag = 0;
      if (!got[k]) {
        const int rc = MPI_Test(&recv[k], &flag, MPI_STATUS_IGNORE);
        if (raise) check(rc, "MPI_Test", what);
      }
      got[k] = got[k] || flag;
      all = all && got[k];
    }
    return all;
  }
  std::vector<int> missing() const {
    std::vector<int> m;
    for (size_t k = 0; k < from.size(); ++k)
      if (!got[k]) m.push_back(from[k]);
    return m;
  }
};

// Ranks (other than this one) whose message never came before the deadline of a probe on the
// runtime thread's own communicator: those not in MPI (stuck or dead).
std::vector<int> probe_missing(const std::string& what) {
  World& w = world();
  const auto n = static_cast<size_t>(w.size);
  auto state = std::make_shared<std::vector<int>>(2 * n, w.rank);
  char* buf = reinterpret_cast<char*>(state->data());
  Swap swap(buf, buf + n * sizeof(int), sizeof(int), 21, w.probe, what);
  const auto deadline =
      Clock::now() + std::min<std::chrono::milliseconds>(timeout(), std::chrono::seconds(2));
  while (Clock::now() < deadline && !swap.test(false, what))
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  keep_until_exit(state);
  return swap.missing();
}
#endif

}  // namespace

bool under_launcher() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"})
    if (std::getenv(v)) return true;
  return false;
}

void init() {
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mu);
  if (w.initialized.load()) return;
  if (w.timeout_ms.load() < 0) w.timeout_ms.store(timeout_from_env().count());
#if LOCKSTEP_WITH_MPI
  int already = 0;
  MPI_Initialized(&already);
  if (!already && !under_launcher()) {
    w.initialized.store(true);  // alone: rank 0 of 1, MPI untouched
    return;
  }
  if (!already) {
    // Open MPI's non-blocking all-reduce (libnbc) takes a binomial tree (a reduce, then a
    // broadcast) below 4 ranks and for in-place buffers; its ring (reduce-scatter, then
    // all-gather) moves half as much through each rank, and measured 2.2-2.5x faster for 2 ranks
    // and 4-45 MiB in place (bench/README.md). A choice already made (mpirun --mca, the
    // environment) stands; another MPI ignores the variable.
    setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", 0);
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
      throw BackendError("dist: MPI_Init_thread failed: is this process started by mpirun?");
    w.we_init = true;
    if (provided < MPI_THREAD_MULTIPLE)
      throw BackendError(cat("dist: this MPI provides thread level ", provided,
                             ", lockstep needs MPI_THREAD_MULTIPLE (its runtime thread and the "
                             "recording threads both call MPI)"));
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  check(MPI_Comm_rank(MPI_COMM_WORLD, &w.rank), "MPI_Comm_rank", "init");
  check(MPI_Comm_size(MPI_COMM_WORLD, &w.size), "MPI_Comm_size", "init");
  for (MPI_Comm* c : {&w.data, &w.control, &w.probe}) {
    check(MPI_Comm_dup(MPI_COMM_WORLD, c), "MPI_Comm_dup", "init");
    MPI_Comm_set_errhandler(*c, MPI_ERRORS_RETURN);
  }
  MPI_Comm local;
  check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, w.rank, MPI_INFO_NULL, &local),
        "MPI_Comm_split_type", "init");
  MPI_Comm_rank(local, &w.local_rank);
  MPI_Comm_size(local, &w.local_size);
  MPI_Comm_free(&local);
  w.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", w.local_rank);
  w.initialized.store(true);
  if (w.we_init)
    std::atexit([] {
      try {
        finalize();
      } catch (...) {
      }
    });
#else
  if (under_launcher())
    throw Error(
        "dist: this lockstep was built without MPI, so it cannot join mpirun's job: "
        "install libopenmpi-dev and rebuild");
  w.initialized.store(true);
#endif
}

bool initialized() { return world().initialized.load(); }
int rank() { return world().rank; }
int world_size() { return world().size; }
int local_rank() { return world().local_rank; }
int local_size() { return world().local_size; }
bool broken() { return world().broken.load(); }

std::chrono::milliseconds timeout() {
  World& w = world();
  int64_t t = w.timeout_ms.load();
  if (t < 0) {
    t = timeout_from_env().count();
    w.timeout_ms.store(t);
  }
  return std::chrono::milliseconds(t);
}

void set_timeout(std::chrono::milliseconds t) {
  if (t.count() <= 0)
    throw Error(cat("dist::set_timeout: the deadline must be > 0, got ", t.count(), " ms"));
  world().timeout_ms.store(t.count());
}

namespace detail {

bool active() { return world().size > 1; }

std::shared_ptr<const Agreement> agreement_of(const ir::Graph& graph, const std::string& setting) {
  const size_t n = graph.nodes.size();
  // Nodes are in topological order: first what reads a collective's result (transitively),
  // then, backwards, everything those and the collectives read.
  std::vector<char> in(n, 0);
  bool any = false;
  for (size_t i = 0; i < n; ++i) {
    const ir::GraphNode& node = graph.nodes[i];
    in[i] = ir::is_collective(node.op);
    any = any || in[i];
    for (int32_t o : node.operands) in[i] = in[i] || in[o];
  }
  if (!any) return nullptr;
  for (size_t i = n; i-- > 0;)
    if (in[i])
      for (int32_t o : graph.nodes[i].operands) in[o] = 1;
  auto out = std::make_shared<Agreement>();
  auto part = std::make_shared<ir::Graph>();
  part->device = graph.device;
  std::vector<int32_t> id(n, -1);
  std::vector<char> read(n, 0);
  uint64_t h = 0x6c6f636b73746570ull;
  auto mix = [&h](uint64_t v) { h = ir::mix64(h ^ v); };
  for (size_t i = 0; i < n; ++i) {
    if (!in[i]) continue;
    ir::GraphNode node = graph.nodes[i];
    for (int32_t& o : node.operands) {
      read[o] = 1;
      o = id[o];
    }
    if (node.op == ir::Op::Data) node.input = part->num_buffer_inputs++;
    if (node.op == ir::Op::Scalar) {
      out->scalars.push_back(node.input);
      node.input = part->num_scalar_inputs++;
    }
    mix(static_cast<uint64_t>(node.op) << 8 | static_cast<uint64_t>(node.dtype));
    mix(node.shape.size());
    for (int64_t d : node.shape) mix(static_cast<uint64_t>(d));
    mix(node.attrs.size());
    for (int64_t a : node.attrs) mix(static_cast<uint64_t>(a));
    mix(node.operands.size());
    for (int32_t o : node.operands) mix(static_cast<uint64_t>(o));
    mix(static_cast<uint64_t>(static_cast<int64_t>(node.input)));
    id[i] = static_cast<int32_t>(part->nodes.size());
    part->nodes.push_back(std::move(node));
  }
  for (size_t i = 0; i < n; ++i)
    if (in[i] && !read[i]) part->outputs.push_back(id[i]);
  out->hash = ir::mix64(h ^ std::hash<std::string>{}(setting));
  out->graph = std::move(part);
  out->setting = setting;
  return out;
}

struct InFlight {
#if LOCKSTEP_WITH_MPI
  MPI_Request request = MPI_REQUEST_NULL;
#endif
  bool done = false;
  std::shared_ptr<void> keep;
  std::string what;
};

namespace {
// The runtime thread's collectives in flight. Every MPI_Test of one of their requests is made
// under g_flight_mu (MPI forbids testing one request from two threads at once): by the progress
// thread, by progress() between a program's steps, and by wait().
std::mutex g_flight_mu;
std::condition_variable g_flight_cv;  // a collective started, or the progress thread must stop
std::vector<std::shared_ptr<InFlight>> g_flight;
std::atomic<int> g_flight_count{0};
#if LOCKSTEP_WITH_MPI
bool g_progress_stop = false;
std::thread* g_progress = nullptr;  // started with the first collective; never destroyed
// Whether `op` is done (or failed: rc). Under g_flight_mu.
bool test_locked(InFlight& op, int* rc) {
  if (op.done) return true;
  int flag = 0;
  *rc = MPI_Test(&op.request, &flag, MPI_STATUS_IGNORE);
  if (*rc != MPI_SUCCESS) return true;
  if (flag) op.done = true;
  return op.done;
}

// How often a progress thread calls into MPI while a collective is in flight
// (LOCKSTEP_DIST_PROGRESS_US, microseconds). Default 0: no thread, only the executable's calls
// between its steps. On the 2-core machine the thread (200 us) cost the MLP 16% of its 2-rank
// throughput and hid no more of ResNet-18's all-reduces than the calls between steps: on cores
// that all compute, it only takes their time (scripts/bench-dist).
int64_t progress_interval_us() {
  return std::max<int64_t>(0, std::atoll(util::option(util::Option::DistProgressUs).c_str()));
}

// OpenMPI moves a non-blocking collective along only inside MPI calls: a thread that tests the
// collectives in flight every so often makes them progress while the steps compute (it sleeps in
// between, and waits on a condition while nothing is in flight).
void progress_loop(int64_t interval_us) {
  std::unique_lock<std::mutex> lock(g_flight_mu);
  while (!g_progress_stop) {
    if (g_flight_count.load() == 0) {
      g_flight_cv.wait(lock);
      continue;
    }
    int rc = MPI_SUCCESS;
    for (auto& op : g_flight) test_locked(*op, &rc);
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(interval_us));
    lock.lock();
  }
}

void add_in_flight(std::shared_ptr<InFlight> op) {
  std::lock_guard<std::mutex> lock(g_flight_mu);
  g_flight.push_back(std::move(op));
  ++g_flight_count;
  if (!g_progress && !g_progress_stop) {
    const int64_t us = progress_interval_us();
    if (us > 0) g_progress = new std::thread(progress_loop, us);
  }
  g_flight_cv.notify_all();
}

void stop_progress() {
  {
    std::lock_guard<std::mutex> lock(g_flight_mu);
    g_progress_stop = true;
  }
  g_flight_cv.notify_all();
  if (g_progress && g_progress->joinable()) g_progress->join();
}
#endif
}  // namespace

std::shared_ptr<InFlight> start_all_reduce(void* data, int64_t count, DType dtype,
                                           std::shared_ptr<void> keep, std::string what) {
  auto op = std::make_shared<InFlight>();
  op->keep = std::move(keep);
  op->what = std::move(what);
#if LOCKSTEP_WITH_MPI
  World& w = world();
  if (w.size <= 1) {
    op->done = true;
    return op;
  }
  if (w.broken.load()) throw_broken();
  if (count > INT32_MAX)
    throw Error(cat("dist: ", op->what, ": ", count,
                    " elements in one all-reduce is more than MPI's 2^31 - 1: use smaller "
                    "buckets (DataParallelOptions::bucket_bytes)"));
  check(MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(count), mpi_type(dtype, op->what),
                       MPI_SUM, w.data, &op->request),
        "MPI_Iallreduce", op->what);
  add_in_flight(op);
#else
  (void)data, (void)count, (void)dtype;
  op->done = true;
#endif
  return op;
}

void progress() {
#if LOCKSTEP_WITH_MPI
  std::unique_lock<std::mutex> lock(g_flight_mu, std::try_to_lock);
  if (!lock.owns_lock()) return;  // the progress thread is at it
  int rc = MPI_SUCCESS;
  for (auto& op : g_flight) test_locked(*op, &rc);
#endif
}

bool in_flight() { return g_flight_count.load(std::memory_order_relaxed) > 0; }

void wait(InFlight& op) {
#if LOCKSTEP_WITH_MPI
  World& w = world();
  int rc = MPI_SUCCESS;
  const bool ok = poll_until(
      [&] {
        std::lock_guard<std::mutex> lock(g_flight_mu);
        return test_locked(op, &rc);
      },
      Clock::now() + timeout());
  {
    std::lock_guard<std::mutex> lock(g_flight_mu);
    auto it = std::find_if(g_flight.begin(), g_flight.end(),
                           [&](const std::shared_ptr<InFlight>& p) { return p.get() == &op; });
    if (it != g_flight.end()) {
      if (!ok) keep_until_exit(*it);  // MPI may still write its buffer
      g_flight.erase(it);
      --g_flight_count;
    }
  }
  if (ok) {
    check(rc, "MPI_Iallreduce", op.what);
    op.done = true;
    return;
  }
  if (w.broken.load()) throw_broken();
  const std::vector<int> missing = probe_missing(op.what);
  const std::string why = cat(
      op.what, " did not complete within ", seconds(timeout()), " on rank ", w.rank, " of ", w.size,
      missing.empty() ? std::string(": every rank answered, so they run different programs")
                      : cat(": ", ranks_text(missing), missing.size() > 1 ? " do" : " does",
                            " not answer (stuck or dead)"));
  break_world(why);
  throw Error(cat("dist: ", why, ". ", kAfterDeadline));
#else
  (void)op;
#endif
}

void all_reduce(void* data, int64_t count, DType dtype, const std::string& what) {
  if (!active()) return;
  auto op = start_all_reduce(data, count, dtype, nullptr, what);
  wait(*op);
}

void broadcast(void* data, size_t bytes, int root, const std::string& what) {
#if LOCKSTEP_WITH_MPI
  World& w = world();
  if (w.size <= 1) return;
  if (w.broken.load()) throw_broken();
  if (bytes > static_cast<size_t>(INT32_MAX))
    throw Error(cat("dist: ", what, ": ", bytes, " bytes in one broadcast is more than 2 GiB"));
  auto op = std::make_shared<InFlight>();
  op->what = what;
  check(MPI_Ibcast(data, static_cast<int>(bytes), MPI_BYTE, root, w.data, &op->request),
        "MPI_Ibcast", what);
  add_in_flight(op);
  wait(*op);
#else
  (void)data, (void)bytes, (void)root, (void)what;
#endif
}

#if LOCKSTEP_WITH_MPI
namespace {

struct Record {
  uint64_t hash = 0;
  int64_t round = 0;
  int64_t nodes = 0;
  int64_t kind = 0;      // what the exchange is for: agreement 1, barrier 2, values 3, maximum 4
  uint64_t scalars = 0;  // agreement: a hash of the program's host scalar values
};

// Sends `mine` to every other rank and receives theirs (point to point on the recording threads'
// communicator, so that the ranks that never send are known). Throws Error naming the ranks
// that did not arrive before the deadline (the world is then broken).
std::vector<Record> exchange(const Record& mine, const std::string& what) {
  World& w = world();
  if (w.broken.load()) throw_broken();
  struct Buffers {
    std::vector<Record> in, out;
  };
  auto buf = std::make_shared<Buffers>();
  buf->in.assign(static_cast<size_t>(w.size), Record{});
  buf->out.assign(static_cast<size_t>(w.size), mine);
  buf->in[static_cast<size_t>(w.rank)] = mine;
  Swap swap(reinterpret_cast<char*>(buf->in.data()), reinterpret_cast<const char*>(buf->out.data()),
            sizeof(Record), 11, w.control, what);
  if (!poll_until([&] { return swap.test(true, what); }, Clock::now() + timeout())) {
    keep_until_exit(buf);
    if (w.broken.load()) throw_broken();
    const std::string why = cat(ranks_text(swap.missing()), " did not reach ", what, " within ",
                                seconds(timeout()), " (rank ", w.rank, " of ", w.size, " waited)");
    break_world(why);
    throw Error(cat("dist: ", why, ": they are stuck, dead, or running a different program. ",
                    kAfterDeadline));
  }
  // The sends were received, so they complete.
  check(MPI_Waitall(static_cast<int>(swap.send.size()), swap.send.data(), MPI_STATUSES_IGNORE),
        "MPI_Waitall", what);
  return buf->in;
}

// Every other rank's text (each rank sends its own to all: used only on a mismatch).
std::vector<std::string> exchange_texts(const std::string& mine, const std::string& what) {
  World& w = world();
  auto text = std::make_shared<std::string>(mine);
  std::vector<MPI_Request> send;
  for (int r = 0; r < w.size; ++r) {
    if (r == w.rank) continue;
    MPI_Request q;
    check(MPI_Isend(text->data(), static_cast<int>(text->size()), MPI_CHAR, r, 12, w.control, &q),
          "MPI_Isend", what);
    send.push_back(q);
  }
  std::vector<std::string> all(static_cast<size_t>(w.size));
  all[static_cast<size_t>(w.rank)] = mine;
  const auto deadline = Clock::now() + timeout();
  for (int r = 0; r < w.size; ++r) {
    if (r == w.rank) continue;
    MPI_Status st;
    int flag = 0;
    const bool ok = poll_until(
        [&] {
          check(MPI_Iprobe(r, 12, w.control, &flag, &st), "MPI_Iprobe", what);
          return flag != 0;
        },
        deadline);
    if (!ok) {
      keep_until_exit(text);
      all[static_cast<size_t>(r)] = "(did not arrive)";
      continue;
    }
    int count = 0;
    MPI_Get_count(&st, MPI_CHAR, &count);
    all[static_cast<size_t>(r)].resize(static_cast<size_t>(count));
    check(MPI_Recv(all[static_cast<size_t>(r)].data(), count, MPI_CHAR, r, 12, w.control,
                   MPI_STATUS_IGNORE),
          "MPI_Recv", what);
  }
  MPI_Waitall(static_cast<int>(send.size()), send.data(), MPI_STATUSES_IGNORE);
  return all;
}

// The line of node `id` in a graph's annotated text ("%12 = add(...) ...  # file:line").
std::string node_line(const std::string& text, int64_t id) {
  const std::string key = cat("%", id, " = ");
  size_t at = 0;
  if (text.compare(0, key.size(), key) != 0) {
    at = text.find("\n" + key);
    if (at == std::string::npos) return "(no such node)";
    ++at;
  }
  const size_t eol = text.find('\n', at);
  return text.substr(at, eol == std::string::npos ? std::string::npos : eol - at);
}

std::string hex(uint64_t h) {
  char text[24];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(h));
  return text;
}

}  // namespace
#endif

void agree(const Agreement& agreement, const std::string& origin,
           const std::vector<ir::ScalarValue>& all_scalars) {
#if LOCKSTEP_WITH_MPI
  World& w = world();
  if (w.size <= 1) return;
  std::lock_guard<std::mutex> lock(w.control_mu);
  const ir::Graph& graph = *agreement.graph;
  const uint64_t hash = agreement.hash;
  const std::string& setting = agreement.setting;
  std::vector<ir::ScalarValue> scalars;  // the replicated part's
  scalars.reserve(agreement.scalars.size());
  for (int32_t k : agreement.scalars) scalars.push_back(all_scalars[static_cast<size_t>(k)]);
  Record mine;
  mine.hash = hash;
  mine.round = ++w.rounds;
  mine.nodes = static_cast<int64_t>(graph.nodes.size());
  mine.kind = 1;
  mine.scalars = 1469598103934665603ull;
  for (const ir::ScalarValue& v : scalars) {
    mine.scalars = ir::mix64(mine.scalars ^ std::bit_cast<uint64_t>(v.f));
    mine.scalars = ir::mix64(mine.scalars ^ static_cast<uint64_t>(v.i));
  }
  const std::string what = cat(origin, " (program #", mine.round, " with collectives)");
  const std::vector<Record> all = exchange(mine, what);
  bool same = true, all_here = true, same_scalars = true;
  for (const Record& r : all) {
    same = same && r.hash == hash && r.round == mine.round && r.kind == 1;
    all_here = all_here && r.kind == 1;
    same_scalars = same_scalars && r.scalars == mine.scalars;
  }
  if (same && same_scalars) return;
  if (same) {  // one program, other host values: which scalar, and the values
    std::string values;
    for (const ir::ScalarValue& v : scalars) values += cat(v.f, " ", v.i, "\n");
    const std::vector<std::string> theirs = exchange_texts(values, what);
    int other = 0;
    for (int r = 0; r < w.size; ++r)
      if (all[static_cast<size_t>(r)].scalars != mine.scalars) {
        other = r;
        break;
      }
    std::string where = "a host scalar";
    std::istringstream in(theirs[static_cast<size_t>(other)]);
    for (size_t k = 0; k < scalars.size(); ++k) {
      double f = 0;
      int64_t i = 0;
      in >> f >> i;
      if (f == scalars[k].f && i == scalars[k].i) continue;
      for (const ir::GraphNode& n : graph.nodes)
        if (n.op == ir::Op::Scalar && n.input == static_cast<int64_t>(k)) {
          const bool integral = !is_floating(n.dtype);
          where = cat("the host scalar made at ", util::where(n.origin.loc), ": rank ", other,
                      " has ", integral ? cat(i) : cat(f), ", rank ", w.rank, " has ",
                      integral ? cat(scalars[k].i) : cat(scalars[k].f));
          break;
        }
      break;
    }
    throw Error(cat("dist: the ranks are about to run the same program at ", what,
                    " with other host values: ", where,
                    ". A hyper-parameter (an lr, a weight decay, a loss scale) that differs "
                    "between the ranks trains different models: give every rank the same value "
                    "(a value that must differ per rank goes in a tensor). Nothing of this "
                    "program ran"));
  }
  // Different programs: every rank sees every record, so all of them fail here, before any
  // collective of the program is entered. The texts say where the graphs part.
  const std::string text = ir::to_text(graph, true);
  std::string holders;
  for (int r = 0; r < w.size; ++r) {
    const Record& rec = all[static_cast<size_t>(r)];
    holders +=
        cat(r ? "; " : "", "rank ", r, ": graph ", hex(rec.hash), " (", rec.nodes, " nodes",
            rec.kind != 1 ? ", at a barrier or value check instead" : "",
            rec.round != mine.round ? cat(", its program #", rec.round) : std::string(), ")");
  }
  // Against rank 0 (rank 0 against the first rank that differs).
  int other = 0;
  if (w.rank == 0 || all[0].hash == hash)
    for (int r = 0; r < w.size; ++r)
      if (all[static_cast<size_t>(r)].hash != hash) {
        other = r;
        break;
      }
  std::string where, other_setting;
  if (!all_here) {
    where = ". Some ranks are at a barrier or a value check instead of this program";
  } else
    try {
      const std::vector<std::string> texts = exchange_texts(text, what);
      const ir::Graph theirs = ir::from_text(texts[static_cast<size_t>(other)]);
      const runtime::GraphDifference d = runtime::difference(theirs, graph);
      if (d.node >= 0) {
        where = cat(". First difference (", d.field, "), node %", d.node, ": rank ", other,
                    " has `", node_line(texts[static_cast<size_t>(other)], d.node), "`, rank ",
                    w.rank, " has `", node_line(text, d.node), "`");
      } else {  // the same graph compiled for other settings: the thread count
        other_setting = exchange_texts(setting, what)[static_cast<size_t>(other)];
      }
    } catch (const Error&) {
      where = cat(". Rank ", other, "'s graph could not be compared");
    }
  if (!other_setting.empty())
    throw Error(cat("dist: the ranks are about to run the same graph at ", what,
                    " compiled for other backend settings: rank ", other, " has '", other_setting,
                    "', rank ", w.rank, " has '", setting,
                    "'. Give every rank the same thread count (OMP_NUM_THREADS, "
                    "ls::set_num_threads): a program's reductions follow it, so replicas would "
                    "drift apart. Nothing of this program ran"));
  throw Error(cat("dist: the ranks are about to run different programs at ", what, ": ", holders,
                  where,
                  ". Every rank must record the same ops on the same shapes (the same batch "
                  "size on every rank: drop_last, or pad) in the same order, for everything the "
                  "collectives read and everything that reads their results (a value kept for "
                  "logging on one rank only is free to differ if it is computed before the "
                  "collectives: compute one from their results on every rank). Nothing of this "
                  "program ran"));
#else
  (void)agreement, (void)origin, (void)all_scalars;
#endif
}

}  // namespace detail

void barrier() {
#if LOCKSTEP_WITH_MPI
  World& w = world();
  if (w.size <= 1) return;
  std::lock_guard<std::mutex> lock(w.control_mu);
  detail::Record mine;
  mine.kind = 2;
  mine.round = w.rounds;
  const std::vector<detail::Record> all = detail::exchange(mine, "a barrier");
  std::vector<int> elsewhere;
  for (int r = 0; r < w.size; ++r)
    if (all[static_cast<size_t>(r)].kind != 2) elsewhere.push_back(r);
  if (!elsewhere.empty())
    throw Error(cat("dist: rank ", w.rank, " is at a barrier while ", ranks_text(elsewhere),
                    " run a program with collectives or check values: every rank must call "
                    "barrier() at the same point"));
#endif
}

int64_t max_on_all_ranks(int64_t value, const std::string& what) {
#if LOCKSTEP_WITH_MPI
  World& w = world();
  if (w.size <= 1) return value;
  std::lock_guard<std::mutex> lock(w.control_mu);
  detail::Record mine;
  mine.kind = 4;
  mine.hash = static_cast<uint64_t>(value);
  mine.round = w.rounds;
  const std::vector<detail::Record> all = detail::exchange(mine, cat("the agreement on ", what));
  std::vector<int> elsewhere;
  int64_t most = value;
  for (int r = 0; r < w.size; ++r) {
    const detail::Record& rec = all[static_cast<size_t>(r)];
    if (rec.kind != 4)
      elsewhere.push_back(r);
    else
      most = std::max(most, static_cast<int64_t>(rec.hash));
  }
  if (!elsewhere.empty())
    throw Error(cat("dist: rank ", w.rank, " is at the agreement on ", what, " while ",
                    ranks_text(elsewhere),
                    " run a program with collectives, a barrier or a value check: every rank "
                    "must call max_on_all_ranks at the same point"));
  return most;
#else
  (void)what;
  return value;
#endif
}

void check_same_on_all_ranks(const std::vector<Tensor>& tensors, const std::string& what, Loc loc) {
  const uint64_t h = hash_values(tensors, loc);
#if LOCKSTEP_WITH_MPI
  World& w = world();
  if (w.size <= 1) return;
  std::lock_guard<std::mutex> lock(w.control_mu);
  detail::Record mine;
  mine.kind = 3;
  mine.hash = h;
  mine.round = w.rounds;
  const std::vector<detail::Record> all =
      detail::exchange(mine, cat("the check of ", what, " at ", util::where(loc)));
  std::vector<int> differ;
  std::string hashes;
  for (int r = 0; r < w.size; ++r) {
    const detail::Record& rec = all[static_cast<size_t>(r)];
    if (rec.kind != 3 || rec.hash != all[0].hash) differ.push_back(r);
    hashes += cat(r ? ", " : "", "rank ", r, ": ",
                  rec.kind == 3 ? detail::hex(rec.hash) : std::string("(elsewhere)"));
  }
  if (!differ.empty())
    throw Error(cat("dist: ", what, " differ between the ranks at ", util::where(loc), ": ",
                    ranks_text(differ), " hold other values than rank 0 (hashes: ", hashes,
                    "). Load the same checkpoint on every rank, or build the model through "
                    "dist::DataParallel, which takes rank 0's values"));
#else
  (void)h, (void)what;  // one rank: nothing to compare with
#endif
}

void finalize() {
  World& w = world();
  {
    std::lock_guard<std::mutex> lock(w.mu);
    if (!w.initialized.load() || w.finalized) return;
    w.finalized = true;
    if (!w.we_init) return;
  }
#if LOCKSTEP_WITH_MPI
  try {
    lockstep::wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lockstep: dist: rank %d: %s\n", w.rank, e.what());
  }
  if (!w.broken.load()) {
    try {
      barrier();  // MPI_Finalize would wait forever for a peer that never comes
    } catch (const std::exception& e) {
      std::fprintf(stderr, "lockstep: dist: rank %d: %s\n", w.rank, e.what());
    }
  }
  detail::stop_progress();
  if (w.broken.load()) {
    std::fprintf(stderr,
                 "lockstep: dist: rank %d leaves MPI unfinalized (%s); mpirun ends the job\n",
                 w.rank, w.broken_why.c_str());
    return;
  }
  MPI_Finalize();
#endif
}

}  // namespace lockstep::dist
