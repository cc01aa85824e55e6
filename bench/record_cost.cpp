// The cost of recording one op from C++: `x + 1.0`, `x + x`, `neg(x)` and a Linear(64, 64) call
// on a batch of 8, each timed over a loop that drops the recorded result at once (so a node is
// made and freed per op, as in a user's loop). bench/record_cost.py times the same four from
// Python; scripts/bench-binding prints the two side by side as a ratio.
//   record_cost [ops=20000] [repeats=7]   prints "<name>\t<best ns per op>" per line
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <lockstep/lockstep.h>

namespace ls = lockstep;

namespace {

// The best of `repeats` loops of `ops` calls, in nanoseconds per call (timeit's convention: the
// best loop is the one least disturbed by the rest of the machine).
double best_ns(const std::function<void()>& op, int ops, int repeats) {
  double best = 1e300;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < ops; ++i) op();
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double, std::nano>(t1 - t0).count() / ops);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int ops = argc > 1 ? std::atoi(argv[1]) : 20000;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 7;
  if (ops < 1 || repeats < 1) {
    std::fprintf(stderr, "usage: record_cost [ops=20000] [repeats=7]\n");
    return 2;
  }
  ls::manual_seed(0);
  const ls::Tensor x = ls::randn({64, 64});
  const ls::Tensor batch = ls::randn({8, 64});
  ls::nn::Linear linear(64, 64);
  ls::sync();
  ls::Tensor sink;
  const std::vector<std::pair<std::string, std::function<void()>>> cases = {
      {"x + 1.0", [&] { sink = x + 1.0; }},
      {"x + x", [&] { sink = x + x; }},
      {"neg(x)", [&] { sink = ls::neg(x); }},
      {"Linear", [&] { sink = linear(batch); }},
  };
  for (const auto& [name, op] : cases)
    std::printf("%s\t%.0f\n", name.c_str(), best_ns(op, ops, repeats));
  return 0;
}
