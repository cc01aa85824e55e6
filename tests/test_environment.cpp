// The tests' defaults for the library's switches that ctest's properties cannot carry
// (tests/CMakeLists.txt), set before main() in every test binary, and inherited by the processes
// the tests start (mpirun's ranks, lockstep-train). A value already in the environment stands.
#include <cstdlib>

namespace {

// Programs run on the threads set whatever else runs (LOCKSTEP_ADAPT_THREADS=0): the tests
// running beside them (ctest -j) would otherwise change the thread count, and compile again, at
// any step; unit/explain_test.cpp tests the adaptation with its own count of other processes.
const bool kSet = [] { return ::setenv("LOCKSTEP_ADAPT_THREADS", "0", 0) == 0; }();

}  // namespace
