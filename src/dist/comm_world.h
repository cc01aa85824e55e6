// The MPI world's state and what the three parts of its implementation share: comm.cpp (init,
// finalize, ranks, deadlines), comm_collectives.cpp (the runtime thread's collectives) and
// comm_agree.cpp (the recording threads' agreement and checks). Private to those three; the rest
// of lockstep goes through comm.h, which has no MPI types.
#pragma once

// 0 or 1, set for each file that includes this one (CMakeLists.txt): a file left out would be
// silently built without MPI.
#ifndef LOCKSTEP_WITH_MPI
#error "LOCKSTEP_WITH_MPI is not set for this file: add it to the dist files in CMakeLists.txt"
#endif

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#if LOCKSTEP_WITH_MPI
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace lockstep::dist {

using Clock = std::chrono::steady_clock;

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
  // `saves`: the asynchronous sharded saves' writer threads (their barriers before the commit).
  MPI_Comm data = MPI_COMM_NULL, control = MPI_COMM_NULL, probe = MPI_COMM_NULL,
           saves = MPI_COMM_NULL;
#endif
  // Buffers of requests left in flight when a deadline passed: MPI may still write them.
  std::mutex abandoned_mu;
  std::vector<std::shared_ptr<void>> abandoned;
};

World& world();

#if LOCKSTEP_WITH_MPI
[[noreturn]] void throw_broken();
void break_world(const std::string& why);
// Keeps `p` alive until the process exits: a request still in flight may write it.
void keep_until_exit(std::shared_ptr<void> p);

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
std::string ranks_text(const std::vector<int>& ranks);
// "2.5 s".
std::string seconds(std::chrono::milliseconds t);

// What every error after a missed deadline tells the user to do.
inline constexpr const char* kAfterDeadline =
    "The step's changes are undone; exit the process (non-zero) and restart the job from its "
    "last checkpoint (deadline: ls::dist::set_timeout, LOCKSTEP_DIST_TIMEOUT)";

// A BackendError naming `call`, this rank and `what` unless `rc` is MPI_SUCCESS.
void check(int rc, const char* call, const std::string& what);

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

namespace detail {
// Stops the progress thread, if one runs (before MPI_Finalize).
void stop_progress();
}  // namespace detail
#endif

}  // namespace lockstep::dist
