// The seed's experiment: does wrapping the training step in ls::step (sync on entry *and* exit)
// cost anything against the classic loop with one manual sync at the end of the body? And does
// logging through ls::add_step_closure cost anything? The workload is the seed's fake-data
// ResNet loop (ResNet-18, small stem, 32x32 images, a fixed batch), run three ways:
//   (a) step:          ls::step([&] { body(); })
//   (b) sync:          body(); ls::sync();
//   (c) step+closure:  (a), plus every 10th step a closure that computes a smoothed rate and
//                      formats the seed's log line (written to /dev/null)
// The three alternate (rotating which goes first) for several rounds; each prints its median
// images/second and the ratio a/b (the seed measured 1752.4 vs 1747.1, i.e. +0.3%).
//   step_overhead [rounds=5] [steps=20] [batch=8] [threads=0 (all)]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <lockstep/lockstep.h>

namespace ls = lockstep;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int arg_or(int argc, char** argv, int i, int fallback) {
  return argc > i ? std::atoi(argv[i]) : fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = arg_or(argc, argv, 1, 5);
  const int steps = arg_or(argc, argv, 2, 20);
  const int64_t batch = arg_or(argc, argv, 3, 8);
  const int threads = arg_or(argc, argv, 4, 0);
  const int warmup = 3, log_steps = 10;
  if (rounds < 1 || steps < 1 || batch < 1 || threads < 0) {
    std::fprintf(stderr, "usage: step_overhead [rounds=5] [steps=20] [batch=8] [threads=0]\n");
    return 2;
  }
  if (threads > 0) ls::set_num_threads(threads);
  ls::manual_seed(0);

  auto model = ls::models::resnet18({.num_classes = 1000, .stem = ls::models::ResNetStem::Small});
  ls::optim::SGD opt(model.parameters(), {.lr = 0.01, .momentum = 0.9});
  // The seed's fake data: the same batch every step, so input costs nothing.
  const ls::Tensor images = ls::randn({batch, 3, 32, 32});
  const ls::Tensor labels = ls::randint(0, 1000, {batch});
  ls::sync();
  ls::Tensor loss;
  auto body = [&] {
    opt.zero_grad();
    loss = ls::nn::cross_entropy(model(images), labels);
    loss.backward();
    opt.step();
  };

  std::FILE* sink = std::fopen("/dev/null", "w");
  if (!sink) sink = stderr;
  double smoothed = 0;  // touched by closures only (they run one at a time, in step order)
  auto last = std::chrono::steady_clock::now();

  struct Mode {
    const char* name;
    std::function<void(int)> run_step;
    std::vector<double> rates;
  };
  std::vector<Mode> modes = {
      {"(a) ls::step", [&](int) { ls::step(body); }, {}},
      {"(b) manual ls::sync", [&](int) { body(), ls::sync(); }, {}},
      {"(c) ls::step + closure log",
       [&](int i) {
         ls::step([&] {
           body();
           if (i % log_steps == 0)
             ls::add_step_closure([&, i, l = loss] {
               const auto now = std::chrono::steady_clock::now();
               const double dt = std::chrono::duration<double>(now - last).count();
               const double rate = static_cast<double>(batch * log_steps) / dt;
               smoothed = smoothed == 0 ? rate : 0.6 * rate + 0.4 * smoothed;
               last = now;
               std::fprintf(sink, "epoch: 1, step: %d, loss: %.4f, rate: %.2f\n", i,
                            static_cast<double>(l.item<float>()), smoothed);
             });
         });
       },
       {}},
  };

  std::printf(
      "step_overhead: resnet18 (small stem) 32x32, batch %lld, %d threads, %d rounds of "
      "%d warm-up + %d timed steps per mode\n",
      static_cast<long long>(batch), ls::num_threads(), rounds, warmup, steps);
  std::vector<double> ratios;
  for (int r = 0; r < rounds; ++r) {
    double rate_a = 0, rate_b = 0;
    for (size_t k = 0; k < modes.size(); ++k) {
      Mode& m = modes[(k + static_cast<size_t>(r)) % modes.size()];
      for (int i = 0; i < warmup; ++i) m.run_step(i);
      ls::wait();
      const auto t0 = std::chrono::steady_clock::now();
      last = t0;
      for (int i = 0; i < steps; ++i) m.run_step(i);
      ls::wait();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double rate = static_cast<double>(batch * steps) / s;
      m.rates.push_back(rate);
      if (&m == &modes[0]) rate_a = rate;
      if (&m == &modes[1]) rate_b = rate;
      std::printf("  round %d  %-28s %8.2f images/s\n", r + 1, m.name, rate);
      std::fflush(stdout);
    }
    ratios.push_back(rate_a / rate_b);
  }
  if (sink != stderr) std::fclose(sink);

  std::printf("median images/s:\n");
  for (const Mode& m : modes) std::printf("  %-28s %8.2f\n", m.name, median(m.rates));
  const double ratio = median(modes[0].rates) / median(modes[1].rates);
  std::printf("ratio a/b (medians): %.4f (%+.2f%%); median of per-round ratios: %.4f\n", ratio,
              100 * (ratio - 1), median(ratios));
  std::printf("compiles %lld, cache_hits %lld, implicit_syncs %lld\n",
              static_cast<long long>(ls::metrics::counter("compiles")),
              static_cast<long long>(ls::metrics::counter("cache_hits")),
              static_cast<long long>(ls::metrics::counter("implicit_syncs")));
  return 0;
}
