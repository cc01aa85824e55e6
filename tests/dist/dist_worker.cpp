// One rank of the data parallel tests (dist_test.cpp starts it under mpirun). Trains a small
// model on deterministic synthetic data, rank r taking samples [r*B, (r+1)*B) of each global
// batch of N*B, so that N ranks with batch B see what one process with batch N*B sees:
//   dist_worker train MODEL OPTIM STEPS BATCH OUT [zero1|zero2|zero3]
//                                                   MODEL mlp|linear|wide|deep|cnn|bn, OPTIM
//                                                   sgd|adamw; rank 0 writes the final parameters
//                                                   to OUT; zero1, zero2: the optimizer sharded
//                                                   (ZeroRedundancyOptimizer of that stage; zero3:
//                                                   fully_shard), each rank printing "rank R zero
//                                                   state N of M" and "rank R zero grads N of M"
//                                                   (the gradient elements it holds after the last
//                                                   step). CLIP=C: gradients clipped to global norm
//                                                   C (clip_grad_norm_, or the option). NAN_AT=S:
//                                                   rank 1's loss is NaN at step S, the optimizers
//                                                   skip non-finite steps. AUTOCAST=1: the
//                                                   forward under bf16 autocast. KEEP_GATHERS=1:
//                                                   zero3 without reshard_after_forward.
//                                                   BUCKET_BYTES=B: ZeroOptions::bucket_bytes.
//                                                   MEMORY_LIMIT=B:
//                                                   ls::set_memory_limit(B). ZERO_RANK1=Z:
//                                                   rank 1 takes Z for the zero argument.
//                                                   CKPT_LOAD=DIR:
//                                                   start from load_sharded(DIR), at the step
//                                                   after the one saved; CKPT_SAVE=DIR, CKPT_AT=S:
//                                                   save_sharded(DIR) after step S (CKPT_AT=0:
//                                                   after every step; CKPT_ASYNC=1:
//                                                   save_sharded_async); KILL_AFTER_MS=T: rank 1
//                                                   kills itself (SIGKILL) T ms after it starts
//   dist_worker diverge-op|diverge-batch STEPS      rank 1 records another graph at step 3
//   dist_worker diverge-queued STEPS                 the same without a read per step: the error
//                                                   leaves programs queued when main returns
//   dist_worker diverge-lr|threads STEPS            rank 1 has lr 0.2 (the others 0.1), or runs 2
//                                                   threads (the others OMP_NUM_THREADS=1)
//   dist_worker sleep STEPS SECONDS                 rank 1 sleeps before step 3
//   dist_worker kill STEPS                          rank 1 kills itself (SIGKILL) in step 3
//   dist_worker exchange-cost N                     N barriers (the exchange the graph check makes
//                                                   before each program): microseconds per call
//   dist_worker stall STEPS SECONDS                 rank 1's runtime thread sleeps after step 3
//                                                   (a step closure): stuck mid-program
// Prints "rank R step S loss L" per step (the loss averaged over the ranks) and
// "rank R final hash H" at the end; an Error is printed as "rank R error: ..." and exits 1.
#include <lockstep/dist.h>
#include <lockstep/io.h>
#include <lockstep/lockstep.h>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace ls = lockstep;

namespace {

// Sample i: 16 features (or a 1x8x8 image) from a generator seeded by i; its class is the
// argmax of a fixed linear map of the features, so the task is learnable.
void sample(int64_t i, float* x, int64_t* y) {
  std::mt19937 rng(static_cast<uint32_t>(1000 + i));
  float best = -1e30f;
  int64_t label = 0;
  for (int k = 0; k < 64; ++k) x[k] = static_cast<float>(rng() % 2001) / 1000.0f - 1.0f;
  for (int c = 0; c < 4; ++c) {
    float s = 0;
    for (int k = 0; k < 64; ++k) s += x[k] * static_cast<float>(((k * 7 + c * 13) % 5) - 2);
    if (s > best) best = s, label = c;
  }
  *y = label;
}

struct Batch {
  ls::Tensor x, y;
};

Batch batch_at(int64_t first, int64_t n, bool image) {
  std::vector<float> xs(static_cast<size_t>(n) * 64);
  std::vector<int64_t> ys(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) sample(first + i, &xs[static_cast<size_t>(i) * 64], &ys[i]);
  ls::Shape shape = image ? ls::Shape{n, 1, 8, 8} : ls::Shape{n, 64};
  return {ls::from_vector<float>(xs, shape), ls::from_vector<int64_t>(ys, {n})};
}

std::shared_ptr<ls::nn::Module> make_model(const std::string& name) {
  auto m = std::make_shared<ls::nn::Sequential>();
  if (name == "mlp") {
    m->emplace<ls::nn::Linear>(64, 32);
    m->emplace<ls::nn::ReLU>();
    m->emplace<ls::nn::Linear>(32, 4);
  } else if (name == "linear") {  // two parameters: fewer than 4 ranks
    m->emplace<ls::nn::Linear>(64, 4);
  } else if (name == "wide") {  // one weight larger than an even share (8,000 of 8,629)
    m->emplace<ls::nn::Linear>(64, 125);
    m->emplace<ls::nn::ReLU>();
    m->emplace<ls::nn::Linear>(125, 4);
  } else if (name == "deep") {  // parameters far more than activations (2.2 MB of them)
    m->emplace<ls::nn::Linear>(64, 256);
    for (int k = 0; k < 8; ++k) {
      m->emplace<ls::nn::ReLU>();
      m->emplace<ls::nn::Linear>(256, 256);
    }
    m->emplace<ls::nn::ReLU>();
    m->emplace<ls::nn::Linear>(256, 4);
  } else {
    m->emplace<ls::nn::Conv2d>(ls::nn::Conv2dSpec{
        .in_channels = 1, .out_channels = 8, .kernel = {3, 3}, .padding = {1, 1}});
    if (name == "bn") m->emplace<ls::nn::BatchNorm>(8);  // running statistics per rank's batch
    m->emplace<ls::nn::ReLU>();
    m->emplace<ls::nn::MaxPool2d>(ls::Pool2dOptions{});
    m->emplace<ls::nn::Flatten>();
    m->emplace<ls::nn::Linear>(8 * 4 * 4, 4);
  }
  return m;
}

int run(int argc, char** argv) {
  ls::dist::init();
  const int rank = ls::dist::rank(), world = ls::dist::world_size();
  if (const char* ms = std::getenv("KILL_AFTER_MS"); ms && rank == 1)
    std::thread([t = std::atoi(ms)] {
      std::this_thread::sleep_for(std::chrono::milliseconds(t));
      std::raise(SIGKILL);
    }).detach();
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "exchange-cost") {
    const int n = std::atoi(argv[2]);
    ls::dist::barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < n; ++k) ls::dist::barrier();
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    std::printf("rank %d exchange %.2f us\n", rank, us / n);
    ls::dist::finalize();
    return 0;
  }
  const bool train = mode == "train";
  const std::string model_name = train ? argv[2] : "mlp";
  const std::string optim_name = train ? argv[3] : "sgd";
  const int steps = std::atoi(argv[train ? 4 : 2]);
  const int64_t per_rank = train ? std::atoll(argv[5]) : 8;
  const std::string out = train ? argv[6] : "";
  // Every rank starts from other weights: DataParallel must give them rank 0's.
  ls::manual_seed(7 + static_cast<uint64_t>(rank));
  std::shared_ptr<ls::nn::Module> model = make_model(model_name);
  ls::dist::DataParallel dp(*model);
  // diverge-lr: rank 1 was started with another learning rate.
  const double lr = mode == "diverge-lr" && rank == 1 ? 0.2 : 0.1;
  if (mode == "threads" && rank == 1) ls::set_num_threads(2);  // the others run 1
  const int nan_at = train && std::getenv("NAN_AT") ? std::atoi(std::getenv("NAN_AT")) : 0;
  const bool skip = nan_at > 0;
  auto make_optimizer =
      [&](std::vector<ls::Tensor> params) -> std::unique_ptr<ls::optim::Optimizer> {
    if (optim_name == "sgd")
      return std::make_unique<ls::optim::SGD>(
          std::move(params),
          ls::optim::SGDOptions{.lr = lr, .momentum = 0.9, .skip_nonfinite = skip});
    return std::make_unique<ls::optim::AdamW>(
        std::move(params), ls::optim::AdamOptions{.lr = 0.01, .skip_nonfinite = skip});
  };
  std::string zero_arg = train && argc > 7 ? argv[7] : "";
  if (const char* other = std::getenv("ZERO_RANK1"); other && rank == 1) zero_arg = other;
  const bool zero = zero_arg == "zero1" || zero_arg == "zero2" || zero_arg == "zero3";
  const double clip = std::getenv("CLIP") ? std::atof(std::getenv("CLIP")) : 0.0;
  ls::dist::ZeroOptions zero_options{.stage = zero_arg == "zero2" ? 2 : 1,
                                     .max_grad_norm = clip,
                                     .skip_nonfinite = skip,
                                     .reshard_after_forward = !std::getenv("KEEP_GATHERS")};
  if (const char* bytes = std::getenv("BUCKET_BYTES"))
    zero_options.bucket_bytes = std::atoll(bytes);
  std::shared_ptr<ls::optim::Optimizer> opt;
  if (zero_arg == "zero3")
    opt = ls::dist::fully_shard(*model, make_optimizer, zero_options);
  else if (zero)
    opt = std::make_unique<ls::dist::ZeroRedundancyOptimizer>(model->parameters(), make_optimizer,
                                                              zero_options);
  else
    opt = make_optimizer(model->parameters());
  const bool image = model_name == "cnn" || model_name == "bn";
  int first_step = 1;
  if (const char* dir = std::getenv("CKPT_LOAD"); dir && train)
    first_step = std::stoi(ls::dist::load_sharded(dir, *model, opt.get()).at("step")) + 1;
  const char* save_dir = std::getenv("CKPT_SAVE");
  const int save_at = std::getenv("CKPT_AT") ? std::atoi(std::getenv("CKPT_AT")) : 0;
  if (const char* limit = std::getenv("MEMORY_LIMIT"))  // bytes: the preflight's, per rank
    ls::set_memory_limit(static_cast<size_t>(std::atoll(limit)));
  int64_t planned = 0;  // the most a step's program planned to take
  for (int s = first_step; s <= steps; ++s) {
    int64_t n = per_rank;
    if (mode == "diverge-batch" && rank == 1 && s == 3) n = per_rank / 2;
    if (mode == "sleep" && rank == 1 && s == 3)
      std::this_thread::sleep_for(std::chrono::duration<double>(std::atof(argv[3])));
    const Batch b = batch_at((s - 1) * per_rank * world + rank * per_rank, n, image);
    ls::Tensor loss;
    ls::step([&] {
      opt->zero_grad();
      std::optional<ls::AutocastScope> bf16;
      if (std::getenv("AUTOCAST")) bf16.emplace(ls::DType::BF16);
      ls::Tensor logits = (*model)(b.x);
      if ((mode == "diverge-op" || mode == "diverge-queued") && rank == 1 && s == 3)
        logits = ls::mul(logits, 2.0);
      loss = ls::nn::cross_entropy(logits, b.y);
      bf16.reset();      // the backward and the update as autocast leaves them (outside the scope)
      if (nan_at > 0) {  // the same program on every rank: only the values differ
        const float f = rank == 1 && s == nan_at ? std::numeric_limits<float>::quiet_NaN() : 1.0f;
        loss = loss * ls::from_vector(std::vector<float>{f});
      }
      loss.backward();
      if (mode == "diverge-queued" && s == 1)  // the runtime thread lags: step 2 stays queued
        ls::add_step_closure([] { std::this_thread::sleep_for(std::chrono::seconds(2)); });
      if (mode == "kill" && rank == 1 && s == 3) std::raise(SIGKILL);
      if (mode == "stall" && rank == 1 && s == 3) {
        const double seconds = std::atof(argv[3]);
        ls::add_step_closure(
            [seconds] { std::this_thread::sleep_for(std::chrono::duration<double>(seconds)); });
      }
      if (mode == "log-rank0" && rank == 0) {  // values only rank 0 keeps, for its log
        const ls::Tensor local_loss = loss;
        const ls::Tensor accuracy =
            ls::mean(ls::eq(ls::argmax(logits, {1}), b.y).to(ls::DType::F32));
        ls::add_step_closure([local_loss, accuracy, s] {
          std::printf("rank 0 step %d local loss %.6g accuracy %.3f\n", s, local_loss.item<float>(),
                      accuracy.item<float>());
        });
      }
      dp.average_gradients();
      if (mode == "read-rank0" && rank == 0)  // a read inside the step, on one rank only
        std::printf("rank 0 step %d local logits %.6g\n", s, ls::sum(logits).item<float>());
      if (clip > 0 && !zero) ls::optim::clip_grad_norm_(model->parameters(), clip);
      opt->step();
      loss = ls::dist::all_reduce(loss, 1.0 / world);
    });
    if (mode == "diverge-queued") continue;  // no read: the steps' programs stay queued
    planned = std::max(planned, ls::metrics::counter("planned_bytes"));  // the step's program
    std::printf("rank %d step %d loss %.9g\n", rank, s, loss.item<float>());
    std::fflush(stdout);
    if (save_dir && train && (s == save_at || save_at == 0)) {
      if (std::getenv("CKPT_ASYNC"))
        ls::dist::save_sharded_async(save_dir, *model, opt.get(), nullptr,
                                     {{"step", std::to_string(s)}});
      else
        ls::dist::save_sharded(save_dir, *model, opt.get(), nullptr, {{"step", std::to_string(s)}});
    }
  }
  if (zero) {
    // The state of the unsharded optimizer: a momentum buffer per parameter element (SGD), or
    // two moments (AdamW).
    int64_t whole = 0;
    for (const ls::Tensor& p : model->parameters()) whole += p.numel();
    if (optim_name != "sgd") whole *= 2;
    std::printf("rank %d zero state %lld of %lld\n", rank,
                static_cast<long long>(
                    static_cast<ls::dist::ZeroRedundancyOptimizer&>(*opt).local_state_numel()),
                static_cast<long long>(whole));
    int64_t params = 0;
    for (const ls::Tensor& p : model->parameters()) params += p.numel();
    const int64_t grads = static_cast<ls::dist::ZeroRedundancyOptimizer&>(*opt).local_grad_numel();
    std::printf("rank %d zero grads %lld of %lld\n", rank, static_cast<long long>(grads),
                static_cast<long long>(params));
  }
  std::printf("rank %d final hash %016llx\n", rank,
              static_cast<unsigned long long>(dp.state_hash()));
  dp.check_replicas_agree();
  std::printf("rank %d planned bytes %lld\n", rank, static_cast<long long>(planned));
  // Sharded parameters are gathered by every rank's reads (rank 0 alone cannot read them): every
  // rank takes a copy of each, which rank 0 saves.
  ls::nn::NamedTensors final_params = model->named_parameters();
  if (zero_arg == "zero3") {
    for (auto& [name, p] : final_params) p = ls::clone(p.detach());
    ls::sync();
  }
  if (rank == 0 && !out.empty()) ls::io::save_safetensors(out, final_params);
  ls::dist::finalize();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const ls::Error& e) {
    std::fprintf(stderr, "rank %d error: %s\n", ls::dist::rank(), e.what());
    return 1;
  }
}
