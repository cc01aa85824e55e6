// Uses an installed lockstep: records ops, runs a step, reads the result back.
#include <cstdio>
#include <vector>

#include <lockstep/lockstep.h>

namespace ls = lockstep;

int main() {
  try {
    ls::Tensor w = ls::from_vector<float>({1, 2, 3});
    ls::step([&] { w.mul_(2.0).add_(1.0); });
    const std::vector<float> got = w.to_vector<float>();
    const std::vector<float> want = {3, 5, 7};
    if (got != want) {
      std::fprintf(stderr, "consumer: wrong values after the step: %s\n", w.to_string().c_str());
      return 1;
    }
    const float total = ls::sum(w).item<float>();
    if (total != 15.0f) {
      std::fprintf(stderr, "consumer: sum is %g, expected 15\n", static_cast<double>(total));
      return 1;
    }
    std::printf("consumer: ok (%s)\n", w.to_string().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
}
