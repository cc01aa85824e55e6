// The MPI world (see comm.h and lockstep/dist.h): init and finalize, the ranks, the deadline, and
// the world's state shared by the collectives (comm_collectives.cpp) and the agreement and checks
// (comm_agree.cpp), which are not here. Built without MPI (LOCKSTEP_WITH_MPI 0), the world has one
// rank and init() under a launcher is an Error.
#include "dist/comm.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "dist/comm_world.h"
#include "lockstep/dist.h"
#include "lockstep/runtime.h"
#include "util/check.h"
#include "util/options.h"

namespace lockstep::dist {

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
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}
#endif

}  // namespace

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

std::string ranks_text(const std::vector<int>& ranks) {
  std::string s = ranks.size() > 1 ? "ranks " : "rank ";
  for (size_t k = 0; k < ranks.size(); ++k) s += cat(k ? ", " : "", ranks[k]);
  return s;
}

std::string seconds(std::chrono::milliseconds t) {
  char text[32];
  std::snprintf(text, sizeof text, "%g s", static_cast<double>(t.count()) / 1000);
  return text;
}

void check(int rc, const char* call, const std::string& what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw BackendError(cat("dist: ", call, " failed on rank ", world().rank, " (", what,
                         "): ", std::string(msg, static_cast<size_t>(len))));
}
#endif

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
    // Its non-blocking reduce (ZeRO stage 2's) defaults to a segmented chain, whose many rounds
    // each wait for a call into MPI: ResNet-18's reduces left 150 ms of each 1.3 s step exposed
    // on 2 ranks; the binomial tree moves each message whole and hid them all (bench/README.md).
    setenv("OMPI_MCA_coll_libnbc_ireduce_algorithm", "2", 0);
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
  for (MPI_Comm* c : {&w.data, &w.control, &w.probe, &w.saves}) {
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

}  // namespace detail

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
  try {
    wait_for_save();  // an asynchronous save in flight is committed before MPI ends
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
