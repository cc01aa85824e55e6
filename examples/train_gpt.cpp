// Trains a small GPT-style model (ls::models::GPT: nn::TransformerEncoderLayer blocks under a
// causal mask) on a synthetic next-token task, the way a libtorch program would: arithmetic
// sequences mod 16, x_t = (a + b t) mod 16 with a random start a and stride b in {1, 2, 3} per
// sequence, so the model must read the stride from the context to predict the next token.
// Batches are drawn inside the step from lockstep's generator (no host data, no recompiles).
// Prints "epoch, step, loss, rate" every 25 steps, then the next-token accuracy on fresh batches
// from the third position on (where the stride is visible), and samples continuations of fresh
// 3-token prompts with GPT::generate (the padded form: one compile for the whole generation,
// where a context growing one token a time would compile once per length). Exit status 0 when it
// learned (accuracy >= 0.9).
//   train_gpt [steps=300]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <lockstep/lockstep.h>

namespace ls = lockstep;

namespace {

constexpr int64_t kBatch = 32, kLen = 24;

// tokens [N, T + 1] of (a + b t) mod V.
ls::Tensor sequences(int64_t vocab) {
  const ls::Tensor a = ls::randint(0, vocab, {kBatch, 1});
  const ls::Tensor b = ls::randint(1, 4, {kBatch, 1});
  return ls::remainder(a + b * ls::arange(kLen + 1), vocab);
}

}  // namespace

int main(int argc, char** argv) {
  ls::apply_thread_wait_default(argv);  // how OpenMP threads wait, before they start
  const int64_t steps = argc > 1 ? std::atoll(argv[1]) : 300;
  ls::manual_seed(2026);
  ls::models::GPT model;  // vocab 16, d_model 64, 4 heads, 2 layers
  const int64_t vocab = model.options.vocab_size;
  ls::optim::AdamW opt(model.parameters(), {3e-3, 0.9, 0.999, 1e-8, 0.01});
  ls::optim::CosineWarmupLR schedule(opt, 20, steps, 1e-4);
  int64_t parameters = 0;
  for (const ls::Tensor& p : model.parameters()) parameters += p.numel();
  std::printf("GPT: %ld parameters, batch %ld x %ld tokens, %ld steps\n",
              static_cast<long>(parameters), static_cast<long>(kBatch), static_cast<long>(kLen),
              static_cast<long>(steps));
  const auto start = std::chrono::steady_clock::now();
  ls::Tensor loss;
  for (int64_t step = 1; step <= steps; ++step) {
    ls::step([&] {
      const ls::Tensor seq = sequences(vocab);
      const ls::Tensor x = ls::narrow(seq, 1, 0, kLen), y = ls::narrow(seq, 1, 1, kLen);
      const ls::Tensor logits = model(x);
      loss = ls::nn::cross_entropy(ls::reshape(logits, {-1, vocab}), ls::reshape(y, {-1}));
      opt.zero_grad();
      loss.backward();
      ls::optim::clip_grad_norm_(model.parameters(), 1.0);
      opt.step();
      if (step % 25 == 0 || step == steps) {
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const double rate = static_cast<double>(step * kBatch) / seconds;
        ls::add_step_closure([=, l = loss] {
          std::printf("epoch: 1, step: %ld, loss: %.4f, rate: %.1f sequences/s\n",
                      static_cast<long>(step), l.item<double>(), rate);
          std::fflush(stdout);
        });
      }
    });
    schedule.step();
  }
  // Next-token accuracy on fresh sequences, from the third position on.
  model.eval();
  ls::Tensor correct, total;
  {
    ls::NoGrad no_grad;
    const ls::Tensor seq = sequences(vocab);
    const ls::Tensor x = ls::narrow(seq, 1, 0, kLen), y = ls::narrow(seq, 1, 1, kLen);
    const ls::Tensor pred = ls::argmax(model(x), {-1});
    const ls::Tensor hit = ls::narrow(pred == y, 1, 2, kLen - 2);
    correct = ls::sum(hit);
    total = ls::scalar_tensor(hit.numel(), ls::i64);
  }
  const double accuracy = correct.item<double>() / total.item<double>();
  std::printf("final loss: %.4f, next-token accuracy: %.3f\n", loss.item<double>(), accuracy);
  model.train();

  // Sampling: continue 3-token prompts by 13 tokens (temperature 0.8, among the top 3), and count
  // the sampled tokens that follow the sequence's rule.
  const ls::Tensor prompts = ls::narrow(sequences(vocab), 1, 0, 3);
  const int64_t compiles_before = ls::metrics::counter("compiles");
  const std::vector<int64_t> text = model.generate(prompts, 13, 0.8, 3).to_vector<int64_t>();
  int64_t follows = 0;
  for (int64_t r = 0; r < 4; ++r) {
    const int64_t* row = text.data() + r * 16;
    std::printf("sample %ld:", static_cast<long>(r));
    for (int64_t t = 0; t < 16; ++t)
      std::printf(t == 3 ? " | %ld" : " %ld", static_cast<long>(row[t]));
    std::printf("\n");
  }
  for (int64_t r = 0; r < kBatch; ++r) {
    const int64_t* row = text.data() + r * 16;
    const int64_t stride = (row[1] - row[0] + vocab) % vocab;
    for (int64_t t = 3; t < 16; ++t) follows += row[t] == (row[t - 1] + stride) % vocab;
  }
  std::printf("sampled tokens that follow the rule: %ld of %ld (%ld compiles for 13 tokens)\n",
              static_cast<long>(follows), static_cast<long>(kBatch * 13),
              static_cast<long>(ls::metrics::counter("compiles") - compiles_before));
  std::printf("compiles: %ld, cache hits: %ld\n",
              static_cast<long>(ls::metrics::counter("compiles")),
              static_cast<long>(ls::metrics::counter("cache_hits")));
  return accuracy >= 0.9 ? 0 : 1;
}
