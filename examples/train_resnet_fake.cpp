// The seed's ResNet fake-data loop (torch_xla's examples/train_resnet_base.py with
// `torch_xla.step()`), in lockstep: each iteration is one ls::step over a batch that a
// DeviceLoader uploaded in the background, and every few steps a step closure prints
//
//   epoch: 1, step: 10, loss: 6.9012, rate: 9.53
//
// once the step has run, so logging never forces a sync. tools/lockstep-train.cpp is the full
// program (real datasets, checkpoints, evaluation, Ctrl-C); this is the loop alone.
//   train_resnet_fake [steps=30] [batch=8] [image_size=32]
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include <lockstep/lockstep.h>

namespace ls = lockstep;

int main(int argc, char** argv) {
  ls::apply_thread_wait_default(argv);  // how OpenMP threads wait, before they start
  const int64_t steps = argc > 1 ? std::atoll(argv[1]) : 30;
  const int64_t batch = argc > 2 ? std::atoll(argv[2]) : 8;
  const int64_t side = argc > 3 ? std::atoll(argv[3]) : 32;
  const int64_t log_steps = 10;
  if (steps < 1 || batch < 1 || side < 8) {
    std::fprintf(stderr, "usage: train_resnet_fake [steps >= 1] [batch >= 1] [image_size >= 8]\n");
    return 2;
  }
  ls::manual_seed(0);

  // Fake ImageNet-like data: random images, 1000 classes.
  auto dataset = std::make_shared<ls::data::FakeData>(ls::data::FakeDataOptions{
      .shape = {3, side, side}, .num_classes = 1000, .size = steps * batch});
  ls::data::DeviceLoader loader(
      ls::data::DataLoader(dataset, {.batch_size = batch, .drop_last = true, .num_workers = 1}));

  auto model = ls::models::resnet18(
      {.num_classes = 1000,
       .stem = side <= 64 ? ls::models::ResNetStem::Small : ls::models::ResNetStem::ImageNet});
  ls::optim::SGD opt(model.parameters(), {.lr = 0.01, .momentum = 0.9});

  // torch_xla's RateTracker: a rate since the last report, smoothed as 0.6 new + 0.4 old. Only
  // the closures touch it, and they run one at a time, in step order.
  auto last = std::chrono::steady_clock::now();
  double rate = -1;
  int64_t done = 0, reported = 0;

  const int epoch = 1;
  int64_t step = 0;
  ls::Tensor loss;
  for (auto& [images, labels] : loader) {
    ls::step([&] {
      opt.zero_grad();
      loss = ls::nn::cross_entropy(model(images), labels);
      loss.backward();
      opt.step();
      const bool log = step % log_steps == 0;
      ls::add_step_closure([&, log, s = step, l = loss] {  // runs after this step's program
        done += batch;
        if (!log) return;
        const auto now = std::chrono::steady_clock::now();
        const double current = static_cast<double>(done - reported) /
                               std::chrono::duration<double>(now - last).count();
        rate = rate < 0 ? current : 0.6 * current + 0.4 * rate;
        last = now;
        reported = done;
        std::printf("epoch: %d, step: %lld, loss: %.4f, rate: %.2f\n", epoch,
                    static_cast<long long>(s), static_cast<double>(l.item<float>()), rate);
        std::fflush(stdout);
      });
    });
    ++step;
  }
  ls::wait();
  std::printf("compiles: %lld, cache hits: %lld, implicit syncs: %lld\n",
              static_cast<long long>(ls::metrics::counter("compiles")),
              static_cast<long long>(ls::metrics::counter("cache_hits")),
              static_cast<long long>(ls::metrics::counter("implicit_syncs")));
  return ls::metrics::counter("implicit_syncs") == 0 ? 0 : 1;
}
