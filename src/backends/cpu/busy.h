// A busy machine: how many of the threads set a program runs with while other processes keep
// the cores busy. An OpenMP team of as many threads as cores, beside one other runnable process,
// waits at each barrier for whichever of its threads the kernel has not scheduled: beside one
// busy loop on 2 cores, train_bench cnn ran at 1,222-1,250 img/s on 2 threads and 2,401-2,513
// on 1 (mlp 5,666-5,805 and 8,046-8,617; AMD EPYC Zen 4, 2026-12-06).
#pragma once

#include <cstdint>
#include <functional>

namespace lockstep::backends::cpu {

// The threads a program compiled now runs with: `set` (num_threads()), fewer while other
// processes' threads are runnable (at most the CPUs this process may run on less those others,
// at least 1). The others are counted from /proc at most every 20 ms, smoothed, and the count
// moves only when the smoothed figure is 0.75 away from it, so that a moment's work elsewhere
// changes nothing. Off with LOCKSTEP_ADAPT_THREADS=0, and under data parallel with more than one
// rank (the ranks must compile the same programs).
int threads_for_load(int set);

namespace detail {

// Tests: where the count of other processes' runnable threads comes from (an empty function:
// /proc, as by default), how many nanoseconds apart it is read, and whether the adaptation is
// on whatever LOCKSTEP_ADAPT_THREADS says. Resets what was counted so far.
void set_load_probe(std::function<int()> others, int64_t interval_ns, bool on);

}  // namespace detail

}  // namespace lockstep::backends::cpu
