// ls::apply_thread_wait_default: how the OpenMP threads wait, set before libgomp reads it (see
// lockstep/runtime.h for the measurement behind the default). Not here: thread counts
// (backends/cpu/parallel.h).
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "lockstep/runtime.h"

namespace lockstep {
namespace {

constexpr const char* kSpinCount = "10000";

}  // namespace

void apply_thread_wait_default(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") || std::getenv("GOMP_SPINCOUNT")) return;
  if (!argv || !argv[0] || ::setenv("GOMP_SPINCOUNT", kSpinCount, 0) != 0) return;
  ::execv("/proc/self/exe", argv);
  // Not executed again (no /proc, say): libgomp keeps the default it read at start. The variable
  // goes, so that what this process starts is not told otherwise.
  ::unsetenv("GOMP_SPINCOUNT");
}

std::string thread_wait_setting() {
  std::string s;
  for (const char* name : {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"})
    if (const char* v = std::getenv(name))
      s += (s.empty() ? "" : ", ") + std::string(name) + "=" + v;
  return s.empty() ? "libgomp's default" : s;
}

}  // namespace lockstep
