// The sequence workloads of the suite, trained the way a libtorch user writes them, on a fixed
// random batch; bench/peers/seq_peer.py is each model in PyTorch eager, with the same layers,
// sizes, optimizer and loss:
//   gpt_tiny:  character-level GPT (ls::models::GPT: token and position embeddings, pre-norm
//              TransformerEncoderLayers, exact GELU, causal mask), vocab 65, d 128, 4 heads,
//              3 layers, feed-forward 512, block 64, batch 32; AdamW, gradient clipping
//   gpt_small: the same at d 384, 6 heads, 6 layers, feed-forward 1536, block 256, batch 16
//   encoder:   a classifier over token sequences: embedding (vocab 1000, d 256) and position
//              embedding, 2 post-norm TransformerEncoderLayers (MultiheadAttention, 4 heads,
//              ReLU, feed-forward 1024) with a key padding mask (a quarter of the sequences
//              padded by a quarter), mean over the sequence, a linear layer to 4 classes;
//              sequence 128, batch 32; Adam
//   lstm:      a character-level LSTM language model: embedding 65 -> 128, LSTM 2 layers of
//              256 (batch first), a linear layer to the vocabulary; sequence 64, batch 32;
//              Adam, gradient clipping
// With `bf16`, each step runs under bf16 autocast (PyTorch: torch.autocast("cpu", bfloat16)).
// Prints one line (and under LOCKSTEP_PROFILE=1 the metrics report, with each kernel kind's
// time): "result <workload> lockstep ms_per_step <x> first_step_ms <x> loss <x> peak_mib <x>".
//   seq_bench <gpt_tiny|gpt_small|encoder|lstm> [timed_steps=20] [threads] [f32|bf16]
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>

#include <lockstep/lockstep.h>

namespace ls = lockstep;

namespace {

class Encoder : public ls::nn::Module {
 public:
  Encoder() {
    tok = register_module("tok", std::make_shared<ls::nn::Embedding>(1000, 256));
    pos = register_module("pos", std::make_shared<ls::nn::Embedding>(128, 256));
    layers = register_module("layers", std::make_shared<ls::nn::ModuleList>());
    ls::nn::TransformerEncoderLayerOptions o{256, 4, 1024, 0.0, ls::nn::Activation::ReLU};
    o.batch_first = true;
    for (int i = 0; i < 2; ++i) layers->emplace_back<ls::nn::TransformerEncoderLayer>(o);
    head = register_module("head", std::make_shared<ls::nn::Linear>(256, 4));
  }
  ls::Tensor forward(const ls::Tensor& tokens) override { return forward(tokens, ls::Tensor()); }
  ls::Tensor forward(const ls::Tensor& tokens, const ls::Tensor& padding) {
    ls::Tensor x = (*tok)(tokens) + (*pos)(ls::arange(tokens.size(1)));
    ls::nn::AttentionMasks masks;
    masks.key_padding_mask = padding;
    for (size_t i = 0; i < layers->size(); ++i)
      x = std::static_pointer_cast<ls::nn::TransformerEncoderLayer>((*layers)[i])
              ->forward(x, masks);
    return (*head)(ls::mean(x, {1}));
  }
  std::shared_ptr<ls::nn::Embedding> tok, pos;
  std::shared_ptr<ls::nn::ModuleList> layers;
  std::shared_ptr<ls::nn::Linear> head;
};

class CharLstm : public ls::nn::Module {
 public:
  CharLstm() {
    emb = register_module("emb", std::make_shared<ls::nn::Embedding>(65, 128));
    lstm = register_module(
        "lstm", std::make_shared<ls::nn::LSTM>(ls::nn::RNNOptions{
                    .input_size = 128, .hidden_size = 256, .num_layers = 2, .batch_first = true}));
    head = register_module("head", std::make_shared<ls::nn::Linear>(256, 65));
  }
  ls::Tensor forward(const ls::Tensor& tokens) override {
    return (*head)(lstm->forward((*emb)(tokens), ls::Tensor(), ls::Tensor()).output);
  }
  std::shared_ptr<ls::nn::Embedding> emb;
  std::shared_ptr<ls::nn::LSTM> lstm;
  std::shared_ptr<ls::nn::Linear> head;
};

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

}  // namespace

int main(int argc, char** argv) {
  ls::apply_thread_wait_default(argv);  // how OpenMP threads wait, before they start
  const std::string name = argc > 1 ? argv[1] : "gpt_tiny";
  const int steps = argc > 2 ? std::atoi(argv[2]) : 20;
  if (argc > 3) ls::set_num_threads(std::atoi(argv[3]));
  const bool bf16 = argc > 4 && std::string(argv[4]) == "bf16";
  ls::manual_seed(0);
  std::shared_ptr<ls::nn::Module> model;
  std::unique_ptr<ls::optim::Optimizer> opt;
  std::function<ls::Tensor()> loss_of;
  bool clip = false;
  if (name == "gpt_tiny" || name == "gpt_small") {
    ls::models::GPTOptions o;
    int64_t batch = 32;
    o.vocab_size = 65;
    if (name == "gpt_tiny") {
      o.block_size = 64, o.d_model = 128, o.nhead = 4, o.num_layers = 3, o.dim_feedforward = 512;
    } else {
      o.block_size = 256, o.d_model = 384, o.nhead = 6, o.num_layers = 6, o.dim_feedforward = 1536;
      batch = 16;
    }
    auto gpt = std::make_shared<ls::models::GPT>(o);
    model = gpt;
    opt = std::make_unique<ls::optim::AdamW>(model->parameters(),
                                             ls::optim::AdamOptions{3e-4, 0.9, 0.999, 1e-8, 0.01});
    const ls::Tensor tokens = ls::randint(0, o.vocab_size, {batch, o.block_size + 1});
    const ls::Tensor x = ls::slice(tokens, 1, 0, o.block_size);
    const ls::Tensor y = ls::reshape(ls::slice(tokens, 1, 1, o.block_size + 1), {-1});
    loss_of = [gpt, x, y, o] {
      return ls::nn::cross_entropy(ls::reshape((*gpt)(x), {-1, o.vocab_size}), y);
    };
    clip = true;
  } else if (name == "encoder") {
    auto enc = std::make_shared<Encoder>();
    model = enc;
    opt = std::make_unique<ls::optim::Adam>(model->parameters(), ls::optim::AdamOptions{1e-4});
    const ls::Tensor x = ls::randint(0, 1000, {32, 128});
    // Sequences 0, 4, 8, ... end at 96: their last 32 positions are padding.
    const ls::Tensor padded = ls::eq(ls::fmod(ls::arange(32), 4), 0);
    const ls::Tensor padding =
        ls::logical_and(ls::unsqueeze(padded, 1), ls::unsqueeze(ls::ge(ls::arange(128), 96), 0));
    const ls::Tensor y = ls::randint(0, 4, {32});
    loss_of = [enc, x, padding, y] { return ls::nn::cross_entropy(enc->forward(x, padding), y); };
  } else if (name == "lstm") {
    auto net = std::make_shared<CharLstm>();
    model = net;
    opt = std::make_unique<ls::optim::Adam>(model->parameters(), ls::optim::AdamOptions{1e-3});
    const ls::Tensor tokens = ls::randint(0, 65, {32, 65});
    const ls::Tensor x = ls::slice(tokens, 1, 0, 64);
    const ls::Tensor y = ls::reshape(ls::slice(tokens, 1, 1, 65), {-1});
    loss_of = [net, x, y] { return ls::nn::cross_entropy(ls::reshape((*net)(x), {-1, 65}), y); };
    clip = true;
  } else {
    std::fprintf(stderr,
                 "usage: seq_bench <gpt_tiny|gpt_small|encoder|lstm> [timed_steps] [threads] "
                 "[f32|bf16]\n");
    return 2;
  }
  ls::Tensor loss;
  ls::StepOptions options;
  if (bf16) options.autocast = ls::bf16;
  auto step = [&] {
    ls::step(
        [&] {
          opt->zero_grad();
          loss = loss_of();
          loss.backward();
          if (clip) ls::optim::clip_grad_norm_(model->parameters(), 1.0);
          opt->step();
        },
        options);
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
  std::printf("result %s%s lockstep ms_per_step %.2f first_step_ms %.1f loss %.4f peak_mib %.1f\n",
              name.c_str(), bf16 ? "_bf16" : "", 1e3 * s / steps, 1e3 * first, loss.item<float>(),
              peak_rss_mib());
  // Where the steps went, kernel kind by kernel kind (run with LOCKSTEP_PROFILE=1).
  if (std::getenv("LOCKSTEP_PROFILE")) std::printf("%s", ls::metrics::report().c_str());
  return 0;
}
