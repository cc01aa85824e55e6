// The tests' defaults for the library's switches that ctest's properties cannot carry
// (tests/CMakeLists.txt), set before main() in every test binary, and inherited by the processes
// the tests start (mpirun's ranks, lockstep-train). A value already in the environment stands.
#include <cstdlib>

namespace {

// Programs run on the threads set whatever else runs (LOCKSTEP_ADAPT_THREADS=0): the tests
// running beside them (ctest -j) would otherwise change the thread count, and compile again, at
// any step; unit/explain_test.cpp tests the adaptation with its own count of other processes.
// Every attention the cpu backend finds is fused (LOCKSTEP_FUSED_ATTENTION=1), however few its
// keys: unit/attention_fusion_test.cpp checks the fused steps on small shapes; the default rule
// (at least 64 keys) is python/tests/test_transformer.py's.
const bool kSet = [] {
  return ::setenv("LOCKSTEP_ADAPT_THREADS", "0", 0) == 0 &&
         ::setenv("LOCKSTEP_FUSED_ATTENTION", "1", 0) == 0;
}();

}  // namespace
