// The cpu backend's OpenMP thread control: a scoped thread count, and parallel loops and regions
// for its own kernels that stay on the calling thread when the work is small. OpenMP's `parallel
// ... if (false)` still builds a team of one thread, about a microsecond in libgomp (an allocation
// among it), which every small kernel of a small step would pay; these skip OpenMP altogether
// instead.
#pragma once

#include <omp.h>

#include <cstdint>

namespace lockstep::backends::cpu {

// While alive, the calling thread's OpenMP thread count is `n`; then it is what it was. (oneDNN
// builds a primitive for the count of the thread that creates it, and its gemm kernels split by
// the count of the thread that runs them.)
class ThreadCount {
 public:
  explicit ThreadCount(int n) : before_(omp_get_max_threads()), changed_(n != before_) {
    if (changed_) omp_set_num_threads(n);
  }
  ~ThreadCount() {
    if (changed_) omp_set_num_threads(before_);
  }
  ThreadCount(const ThreadCount&) = delete;
  ThreadCount& operator=(const ThreadCount&) = delete;

 private:
  int before_;
  bool changed_;
};

// body() on the threads of a parallel region if `threaded`, else once on the calling thread,
// where omp_get_thread_num() is 0, omp_get_num_threads() 1, and an `omp for` inside takes the
// whole loop: the body runs as in a team of one. Called by a thread of a team of several (a
// kernel run inside another's parallel loop), the body gets a team of one of its own, so that
// its `omp for` does not bind to the enclosing team and share out that team's work.
template <typename Body>
void parallel_region(bool threaded, Body&& body) {
  if (omp_get_num_threads() > 1) {
#pragma omp parallel num_threads(1)
    body();
    return;
  }
  if (!threaded || omp_get_max_threads() == 1) {
    body();
    return;
  }
#pragma omp parallel
  body();
}

// body(i) for i in [0, n): split statically over the threads if `threaded`, else in order on
// the calling thread.
template <typename Body>
void parallel_for(bool threaded, int64_t n, Body&& body) {
  if (!threaded || omp_get_max_threads() == 1) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) body(i);
}

}  // namespace lockstep::backends::cpu
