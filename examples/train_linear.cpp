// Trains a linear regression model with lockstep steps, the seed's loop in miniature: each
// iteration is one ls::step (sync on entry and exit), data moves to the device explicitly,
// and a line "epoch, step, loss, rate" is printed every few steps from a step closure.
// Gradients are written by hand here (the loss is 0.5 * mean((x w + b - y)^2)).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <lockstep/lockstep.h>

namespace ls = lockstep;

int main(int argc, char** argv) {
  ls::apply_thread_wait_default(argv);  // how OpenMP threads wait, before they start
  const int64_t features = 16, batch = 64, steps_per_epoch = 50;
  // train_linear [EPOCHS] [--metrics]: --metrics prints ls::metrics::report() at the end.
  const int epochs = argc > 1 && std::string(argv[1]) != "--metrics" ? std::atoi(argv[1]) : 3;
  const bool metrics = std::string(argv[argc - 1]) == "--metrics";
  ls::manual_seed(1234);

  // The "true" model the data comes from.
  const ls::Tensor true_w = ls::randn({features, 1});
  const ls::Tensor true_b = ls::full({1}, 0.5);

  ls::Tensor w = ls::zeros({features, 1});
  ls::Tensor b = ls::zeros({1});
  ls::Tensor w_velocity = ls::zeros({features, 1});
  ls::Tensor b_velocity = ls::zeros({1});
  const double lr = 0.1, momentum = 0.9;
  ls::Tensor loss;

  auto start = std::chrono::steady_clock::now();
  int64_t images = 0;
  for (int epoch = 1; epoch <= epochs; ++epoch) {
    for (int64_t step = 0; step < steps_per_epoch; ++step) {
      ls::step([&] {
        ls::Tensor x = ls::randn({batch, features});
        ls::Tensor y = ls::matmul(x, true_w) + true_b + 0.01 * ls::randn({batch, 1});
        ls::Tensor err = ls::matmul(x, w) + b - y;  // [batch, 1]
        loss = 0.5 * ls::mean(err * err);
        ls::Tensor grad_w = ls::matmul(ls::transpose(x, 0, 1), err) / static_cast<double>(batch);
        ls::Tensor grad_b = ls::mean(err, {0});
        w_velocity.mul_(momentum).add_(grad_w);
        b_velocity.mul_(momentum).add_(grad_b);
        w.sub_(lr * w_velocity);
        b.sub_(lr * b_velocity);
        images += batch;
        if (step % 10 == 0) {
          const double seconds =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          const double rate = static_cast<double>(images) / seconds;
          ls::add_step_closure([=, l = loss] {
            std::printf("epoch: %d, step: %ld, loss: %.6f, rate: %.2f\n", epoch,
                        static_cast<long>(step), static_cast<double>(l.item<float>()), rate);
            std::fflush(stdout);
          });
        }
      });
    }
  }
  ls::wait();
  const float final_loss = loss.item<float>();
  const float w_error = ls::max(ls::abs(w - true_w)).item<float>();
  std::printf("final loss: %.6f, max |w - w_true|: %.4f\n", static_cast<double>(final_loss),
              static_cast<double>(w_error));
  std::printf("compiles: %ld, cache hits: %ld, implicit syncs: %ld\n",
              static_cast<long>(ls::metrics::counter("compiles")),
              static_cast<long>(ls::metrics::counter("cache_hits")),
              static_cast<long>(ls::metrics::counter("implicit_syncs")));
  if (metrics) std::printf("%s", ls::metrics::report().c_str());
  return w_error < 0.05f ? 0 : 1;
}
