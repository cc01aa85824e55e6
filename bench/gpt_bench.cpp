// A character-level GPT trained the way a libtorch user writes it (ls::models::GPT: token and
// position embeddings, pre-norm TransformerEncoderLayers with the exact GELU under a causal mask,
// AdamW, gradient clipping, cross-entropy), on a fixed random batch; bench/peers/gpt_peer.py is
// the same model in PyTorch eager. Sizes (issue 29's suite):
//   tiny:  vocab 65, d 128, 4 heads, 3 layers, feed-forward 512, block 64, batch 32
//   small: vocab 65, d 384, 6 heads, 6 layers, feed-forward 1536, block 256, batch 16
// Prints one line (and under LOCKSTEP_PROFILE=1 the metrics report, with each kernel kind's
// time): "result gpt_<size> lockstep ms_per_step <x> first_step_ms <x> loss <x>".
//   gpt_bench <tiny|small> [timed_steps=20] [threads]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <lockstep/lockstep.h>

namespace ls = lockstep;

int main(int argc, char** argv) {
  const std::string size = argc > 1 ? argv[1] : "tiny";
  const int steps = argc > 2 ? std::atoi(argv[2]) : 20;
  if (argc > 3) ls::set_num_threads(std::atoi(argv[3]));
  ls::models::GPTOptions o;
  int64_t batch = 32;
  o.vocab_size = 65;
  if (size == "tiny") {
    o.block_size = 64, o.d_model = 128, o.nhead = 4, o.num_layers = 3, o.dim_feedforward = 512;
  } else if (size == "small") {
    o.block_size = 256, o.d_model = 384, o.nhead = 6, o.num_layers = 6, o.dim_feedforward = 1536;
    batch = 16;
  } else {
    std::fprintf(stderr, "usage: gpt_bench <tiny|small> [timed_steps] [threads]\n");
    return 2;
  }
  ls::manual_seed(0);
  ls::models::GPT model(o);
  ls::optim::AdamW opt(model.parameters(), {3e-4, 0.9, 0.999, 1e-8, 0.01});
  const ls::Tensor tokens = ls::randint(0, o.vocab_size, {batch, o.block_size + 1});
  const ls::Tensor x = ls::slice(tokens, 1, 0, o.block_size);
  const ls::Tensor y = ls::slice(tokens, 1, 1, o.block_size + 1);
  ls::Tensor loss;
  auto step = [&] {
    ls::step([&] {
      opt.zero_grad();
      loss = ls::nn::cross_entropy(ls::reshape(model(x), {-1, o.vocab_size}), ls::reshape(y, {-1}));
      loss.backward();
      ls::optim::clip_grad_norm_(model.parameters(), 1.0);
      opt.step();
    });
  };
  auto t0 = std::chrono::steady_clock::now();
  step();
  ls::wait();
  const double first = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int i = 0; i < 3; ++i) step();  // warm-up
  ls::wait();
  t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) step();
  ls::wait();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("result gpt_%s lockstep ms_per_step %.2f first_step_ms %.1f loss %.4f\n",
              size.c_str(), 1e3 * s / steps, 1e3 * first, loss.item<float>());
  // Where the steps went, kernel kind by kernel kind (run with LOCKSTEP_PROFILE=1).
  if (std::getenv("LOCKSTEP_PROFILE")) std::printf("%s", ls::metrics::report().c_str());
  return 0;
}
