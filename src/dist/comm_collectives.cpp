// The runtime thread's collectives (see comm.h): non-blocking all-reduces and broadcasts on the
// data communicator, the progress made on them between steps (or by a thread), and the waits
// with their deadline. Not the world's setup (comm.cpp) nor the agreement between programs
// (comm_agree.cpp).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dist/comm.h"
#include "dist/comm_world.h"
#include "lockstep/dist.h"
#include "runtime/profiler.h"
#include "util/check.h"
#include "util/options.h"

namespace lockstep::dist {

using util::cat;

#if LOCKSTEP_WITH_MPI
namespace {

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
    case DType::U8:  // wraps mod 256, as PyTorch's all_reduce of uint8
      return MPI_UINT8_T;
    case DType::Bool:
    case DType::BF16:  // the kernels widen bf16 to f32 before they sum
      break;
  }
  throw Error(cat("dist: ", what, ": cannot sum ", dtype_name(d),
                  " values over the ranks: cast to ls::i32 or ls::f32 first"));
}

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

}  // namespace
#endif

namespace detail {

struct InFlight {
#if LOCKSTEP_WITH_MPI
  MPI_Request request = MPI_REQUEST_NULL;
#endif
  bool done = false;
  std::shared_ptr<void> keep;
  std::string what;
  int64_t bytes = 0;
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
// (LOCKSTEP_DIST_PROGRESS_US, microseconds; 0: no thread). The default, `auto`: no thread for
// all-reduces, only the executable's calls between its steps (on the 2-core machine a thread at
// 200 us cost the MLP 16% of its 2-rank throughput and hid no more of ResNet-18's all-reduces than
// those calls); a thread at kGatherProgressUs once fully_shard's prefetched gathers are in
// flight: a parameter's gather spans several steps of the program, and with a call only between
// steps the ResNet-18 ZeRO-3 step hid a median 40% of its gathers' time behind compute, with the
// thread 83% (bench/dist_bench resnet18 zero3, 2 ranks, five runs each).
constexpr int64_t kGatherProgressUs = 1000;

int64_t progress_interval_us(bool prefetched) {
  const std::string& v = util::option(util::Option::DistProgressUs);
  if (v == "auto") return prefetched ? kGatherProgressUs : 0;
  return std::max<int64_t>(0, std::atoll(v.c_str()));
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

void add_in_flight(std::shared_ptr<InFlight> op, bool prefetched = false) {
  std::lock_guard<std::mutex> lock(g_flight_mu);
  g_flight.push_back(std::move(op));
  ++g_flight_count;
  if (!g_progress && !g_progress_stop) {
    const int64_t us = progress_interval_us(prefetched);
    if (us > 0) g_progress = new std::thread(progress_loop, us);
  }
  g_flight_cv.notify_all();
}
#endif
}  // namespace

#if LOCKSTEP_WITH_MPI
void stop_progress() {
  {
    std::lock_guard<std::mutex> lock(g_flight_mu);
    g_progress_stop = true;
  }
  g_flight_cv.notify_all();
  if (g_progress && g_progress->joinable()) g_progress->join();
}
#endif

std::shared_ptr<InFlight> start_all_reduce(void* data, int64_t count, DType dtype,
                                           std::shared_ptr<void> keep, std::string what, int root) {
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
  op->bytes = count * static_cast<int64_t>(dtype_size(dtype));
  runtime::prof::Span span("collective", root < 0 ? "all_reduce start" : "reduce start");
  if (span) span.arg("what", op->what), span.arg("bytes", op->bytes);
  if (count > INT32_MAX)
    throw Error(cat("dist: ", op->what, ": ", count,
                    " elements in one all-reduce is more than MPI's 2^31 - 1: use smaller "
                    "buckets (DataParallelOptions::bucket_bytes)"));
  const MPI_Datatype type = mpi_type(dtype, op->what);
  if (root < 0)
    check(MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(count), type, MPI_SUM, w.data,
                         &op->request),
          "MPI_Iallreduce", op->what);
  else if (root == w.rank)
    check(MPI_Ireduce(MPI_IN_PLACE, data, static_cast<int>(count), type, MPI_SUM, root, w.data,
                      &op->request),
          "MPI_Ireduce", op->what);
  else
    check(MPI_Ireduce(data, nullptr, static_cast<int>(count), type, MPI_SUM, root, w.data,
                      &op->request),
          "MPI_Ireduce", op->what);
  add_in_flight(op);
#else
  (void)data, (void)count, (void)dtype, (void)root;
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
  runtime::prof::Span span("collective", "collective wait");
  if (span) span.arg("what", op.what), span.arg("bytes", op.bytes);
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
    check(rc, "MPI_Test", op.what);
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

void all_reduce(void* data, int64_t count, DType dtype, const std::string& what, int root) {
  if (!active()) return;
  auto op = start_all_reduce(data, count, dtype, nullptr, what, root);
  wait(*op);
}

std::shared_ptr<InFlight> start_broadcast(void* data, const void* from, size_t bytes, int root,
                                          std::shared_ptr<void> keep, std::string what,
                                          bool prefetched) {
  if (bytes && data != from && rank() == root) std::memcpy(data, from, bytes);
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
  if (bytes > static_cast<size_t>(INT32_MAX))
    throw Error(cat("dist: ", op->what, ": ", bytes, " bytes in one broadcast is more than 2 GiB"));
  op->bytes = static_cast<int64_t>(bytes);
  runtime::prof::Span span("collective", "broadcast start");
  if (span) span.arg("what", op->what), span.arg("bytes", op->bytes);
  check(MPI_Ibcast(data, static_cast<int>(bytes), MPI_BYTE, root, w.data, &op->request),
        "MPI_Ibcast", op->what);
  add_in_flight(op, prefetched);
#else
  (void)data, (void)bytes, (void)root, (void)prefetched;
  op->done = true;
#endif
  return op;
}

void broadcast(void* data, const void* from, size_t bytes, int root, const std::string& what) {
  const std::shared_ptr<InFlight> op = start_broadcast(data, from, bytes, root, nullptr, what);
  if (active()) wait(*op);
}

}  // namespace detail

}  // namespace lockstep::dist
