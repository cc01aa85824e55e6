// The cpu backend's denormal flushing (denormals.h).
#include "backends/cpu/denormals.h"

#include <omp.h>

#include <atomic>

#include "lockstep/runtime.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LS_HAVE_MXCSR 1
#endif

namespace lockstep::backends::cpu {
namespace {

std::atomic<bool> g_flush{true};

#ifdef LS_HAVE_MXCSR
constexpr unsigned kFlushBits = 0x8040;  // FTZ (bit 15) and DAZ (bit 6)
unsigned read_mode() { return _mm_getcsr(); }
void write_mode(unsigned m) { _mm_setcsr(m); }
#else
constexpr unsigned kFlushBits = 0;
unsigned read_mode() { return 0; }
void write_mode(unsigned) {}
#endif

unsigned with_setting(unsigned mode, bool flush) {
  return flush ? (mode | kFlushBits) : (mode & ~kFlushBits);
}

}  // namespace

bool flush_denormal() { return g_flush.load(std::memory_order_relaxed); }

DenormalScope::DenormalScope(int threads) : before_(read_mode()) {
  const bool flush = flush_denormal();
  write_mode(with_setting(before_, flush));
  // The team's threads: a thread OpenMP starts inherits its creator's setting (POSIX threads
  // inherit the floating-point environment), so a team started inside a scope has it. Only a
  // change of the setting sends it to threads already running; a first scope on a thread starts
  // no team (a program compiled on a user's thread must not leave a team there).
  thread_local int team_flush = -1;
  if (team_flush == -1) {
    team_flush = flush;
  } else if (team_flush != static_cast<int>(flush)) {
    if (threads > 1) {
#pragma omp parallel num_threads(threads)
      write_mode(with_setting(read_mode(), flush));
    }
    team_flush = flush;
  }
}

DenormalScope::~DenormalScope() { write_mode(before_); }

}  // namespace lockstep::backends::cpu

namespace lockstep {

bool set_flush_denormal(bool on) {
  backends::cpu::g_flush.store(on);
  return backends::cpu::kFlushBits != 0;
}
bool flush_denormal() { return backends::cpu::flush_denormal(); }

}  // namespace lockstep
