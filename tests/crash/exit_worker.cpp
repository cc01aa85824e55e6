// A program that returns from main with lockstep work still queued (issue 30, items 4 and 17):
//   exit_worker queued     a CNN's steps with a log closure each, main returns 3 at once: every
//                          closure still prints, and the exit status stays 3 (no crash in
//                          torn-down oneDNN state)
//   exit_worker throws     the last step's closure throws and nothing reads after it: the error
//                          is printed and the process exits with status 1, not 0
//   exit_worker fails      the last step's program fails at run time (an index out of range)
//                          and nothing reads after it: the same
#include <lockstep/lockstep.h>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace ls = lockstep;

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  ls::manual_seed(1);
  ls::models::FashionCNN model(10, 1, 28);
  ls::optim::SGD opt(model.parameters(), {.lr = 0.01});
  for (int s = 0; s < 6; ++s) {
    ls::step([&] {
      opt.zero_grad();
      ls::Tensor y = ls::randint(0, 10, {32});
      if (mode == "fails" && s == 5) y = y + 100;  // labels out of range
      ls::Tensor loss = ls::nn::cross_entropy(model(ls::randn({32, 1, 28, 28})), y);
      loss.backward();
      opt.step();
      ls::add_step_closure([s, mode, loss] {
        std::printf("step %d loss %.4f\n", s, loss.item<double>());
        std::fflush(stdout);
        if (mode == "throws" && s == 5) throw std::runtime_error("the log file is gone");
      });
    });
  }
  std::printf("main returns\n");
  std::fflush(stdout);
  return mode == "queued" ? 3 : 0;
}
