// lockstep-train: the project's main program. Trains an MLP, the Fashion-MNIST CNN or a ResNet on
// fake data, Fashion-MNIST, MNIST or CIFAR-10 with the seed's loop (torch_xla's
// train_resnet_base.py with `torch_xla.step()`): every iteration is one ls::step over a batch that
// a DeviceLoader uploaded in the background, and every --log-steps steps a step closure prints
//
//   epoch: 1, step: 290, loss: 6.6086, rate: 1747.09
//
// so that logging never forces a sync. On real data each epoch ends with the test loss and
// accuracy; the run ends with the throughput and the compile-cache counters. Checkpoints are
// written every epoch (and on Ctrl-C) and --resume continues one exactly.
//
// Exit codes: 0 done, 1 an error (a missing or corrupt data file, a bad checkpoint, ...), 2 a bad
// command line, 128 + the signal when stopped by one (130 SIGINT, 143 SIGTERM, 129 SIGHUP, 141
// SIGPIPE), after saving the checkpoint.
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <lockstep/lockstep.h>

#include "train_options.h"

namespace ls = lockstep;
using lockstep_train::is_resnet;
using lockstep_train::kUsage;
using lockstep_train::Options;
using lockstep_train::parse_args;
using lockstep_train::UsageError;

namespace {

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;

// ---- signals --------------------------------------------------------------------------------
// Ctrl-C (SIGINT), SIGTERM (what schedulers, systemd and container runtimes send), SIGHUP (the
// terminal went away) and SIGPIPE (stdout's reader left, as `| head` does) all stop the run the
// same way: the handler only records the signal; the loop checks it between steps, saves the
// checkpoint and exits with 128 + the signal. SA_RESETHAND makes a second one kill the process at
// once, should a step hang; SIGPIPE keeps its handler (every later write to the closed pipe
// raises it again), and those writes fail quietly instead.
std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);

void on_signal(int sig) {
  int none = 0;
  g_signal.compare_exchange_strong(none, sig, std::memory_order_relaxed);
}

void install_sigint_handler() {
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) {
    struct sigaction sa = {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | (sig == SIGPIPE ? 0 : SA_RESETHAND);
    sigaction(sig, &sa, nullptr);
  }
}

// Data parallel: a signal reaches the ranks at different moments (mpirun forwards SIGTERM to
// each rank in turn; a scheduler may signal one rank only), so the ranks agree on it at every
// poll, one exchange per step (ls::dist::max_on_all_ranks): all stop after the same step, rank 0
// saves once, and every rank exits with the same status. Alone, the signal is read directly.
bool g_data_parallel = false;
int g_agreed_signal = 0;  // data parallel: the signal the ranks agreed on (main thread only)

int stop_signal() {
  return g_data_parallel ? g_agreed_signal : g_signal.load(std::memory_order_relaxed);
}

bool interrupted() { return stop_signal() != 0; }

// Called at the same point of every step on every rank: whether to stop now.
bool stop_requested() {
  if (g_data_parallel && g_agreed_signal == 0)
    g_agreed_signal = static_cast<int>(ls::dist::max_on_all_ranks(
        g_signal.load(std::memory_order_relaxed), "stopping on a signal"));
  return interrupted();
}

// ---- output ---------------------------------------------------------------------------------
// Log lines come from step closures (the runtime thread) and from the main thread; one mutex
// keeps lines and the progress bar from interleaving.
std::mutex g_console;

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
  char buf[512];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, args);
  va_end(args);
  return buf;
}

// A progress bar on stderr, drawn only when stderr is a terminal. Updated from the per-step
// closure (after the step ran), at most ten times a second.
class Progress {
 public:
  Progress() : enabled_(isatty(STDERR_FILENO) == 1) {}
  bool enabled() const { return enabled_; }

  void start(const std::string& label, int64_t total) {
    std::lock_guard<std::mutex> lock(g_console);
    label_ = label;
    total_ = total;
    start_ = std::chrono::steady_clock::now();
    last_draw_ = {};
  }
  // Step `done` of `total` has run, `images` images since start().
  void update(int64_t done, int64_t images) {
    if (!enabled_) return;
    std::lock_guard<std::mutex> lock(g_console);
    const auto now = std::chrono::steady_clock::now();
    if (done < total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    done_ = done;
    const double seconds = std::chrono::duration<double>(now - start_).count();
    rate_ = seconds > 0 ? static_cast<double>(images) / seconds : 0.0;
    draw_locked();
  }
  // Prints a line to stdout, above the bar.
  void line(const std::string& text) {
    std::lock_guard<std::mutex> lock(g_console);
    if (enabled_ && shown_) std::fputs("\r\033[K", stderr);
    std::fputs(text.c_str(), stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
    if (enabled_ && shown_) draw_locked();
  }
  void clear() {
    std::lock_guard<std::mutex> lock(g_console);
    if (enabled_ && shown_) std::fputs("\r\033[K", stderr);
    std::fflush(stderr);
    shown_ = false;
  }

 private:
  void draw_locked() {
    constexpr int kWidth = 30;
    const int filled =
        total_ > 0 ? static_cast<int>(kWidth * std::min(done_, total_) / total_) : kWidth;
    std::string bar(static_cast<size_t>(filled), '=');
    bar.resize(kWidth, ' ');
    std::fprintf(stderr, "\r\033[K%s [%s] %lld/%lld  %.1f images/s", label_.c_str(), bar.c_str(),
                 static_cast<long long>(done_), static_cast<long long>(total_), rate_);
    std::fflush(stderr);
    shown_ = true;
  }

  bool enabled_;
  bool shown_ = false;
  std::string label_;
  int64_t total_ = 0, done_ = 0;
  double rate_ = 0;
  std::chrono::steady_clock::time_point start_{}, last_draw_{};
};

// ---- rate -----------------------------------------------------------------------------------
// torch_xla's metrics.RateTracker (smooth_factor 0.4): each report is the rate since the
// previous report, blended with the previous report as 0.6 * current + 0.4 * previous (the first
// report is the plain rate since the start). One difference: torch_xla counts the images the
// Python loop has *issued* (tracker.add in the loop); here the count is that of the images whose
// step has *run*, because rate() is called from the step's closure with the count of that step.
// Used from closures only, which run one at a time in step order.
class RateTracker {
 public:
  explicit RateTracker(double smooth_factor = 0.4) : smooth_(smooth_factor) { reset(); }
  void reset() {
    last_time_ = std::chrono::steady_clock::now();
    last_count_ = 0;
    rate_.reset();
  }
  // `count`: images processed since reset(), up to now.
  double rate(int64_t count) {
    const auto now = std::chrono::steady_clock::now();
    const double dt = std::chrono::duration<double>(now - last_time_).count();
    if (dt <= 0) return rate_.value_or(0.0);
    const double current = static_cast<double>(count - last_count_) / dt;
    rate_ = rate_ ? (1 - smooth_) * current + smooth_ * *rate_ : current;
    last_time_ = now;
    last_count_ = count;
    return *rate_;
  }

 private:
  double smooth_;
  std::chrono::steady_clock::time_point last_time_;
  int64_t last_count_ = 0;
  std::optional<double> rate_;
};

// ---- pacing ---------------------------------------------------------------------------------
// ls::sync returns as soon as a step is enqueued, and tracing is much faster than running. The
// library bounds its queue (ls::set_max_queued_programs), but only once a step's program is
// built, after its batch was taken and uploaded; pacing before the batch keeps the loader, the
// uploads and the progress counts in step with execution. Each step adds a closure that counts
// it done; before taking a batch the loop waits until at most kMaxInFlight earlier steps are
// still queued. Waiting here is not a sync: no value is read.
class Pacer {
 public:
  static constexpr int64_t kMaxInFlight = 2;
  // Outside a step: waits for room. A step that failed (a peer missed a collective's deadline)
  // never runs its closure: the library's error is raised here instead of waiting for good.
  void wait_for_room() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::milliseconds(50),
                         [&] { return issued_ - done_ < kMaxInFlight; })) {
      lock.unlock();
      ls::check_errors();
      lock.lock();
    }
  }
  // Inside the step: counts it, and calls `then` (on the runtime thread) once it has run.
  void track(std::function<void()> then = {}) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++issued_;
    }
    ls::add_step_closure([this, then = std::move(then)] {
      if (then) then();
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++done_;
      }
      cv_.notify_all();
    });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t issued_ = 0, done_ = 0;
};

// ---- model, data, optimizer -----------------------------------------------------------------

// --stem auto: the small stem for images of 64x64 or less, as CIFAR-sized inputs need.
ls::models::ResNetStem resolve_stem(const std::string& stem, const ls::Shape& chw) {
  if (stem == "imagenet") return ls::models::ResNetStem::ImageNet;
  if (stem == "small") return ls::models::ResNetStem::Small;
  return std::max(chw[1], chw[2]) <= 64 ? ls::models::ResNetStem::Small
                                        : ls::models::ResNetStem::ImageNet;
}

// What the header line says of a resnet's stem, so that a user sees what will run.
std::string describe_stem(const Options& o, ls::models::ResNetStem stem) {
  std::string s = stem == ls::models::ResNetStem::ImageNet
                      ? "imagenet stem: 7x7/2 conv, 3x3/2 max-pool"
                      : "small stem: 3x3/1 conv, no max-pool";
  if (o.stem == "auto") s += ", --stem auto";
  return s;
}

std::shared_ptr<ls::nn::Module> make_model(const std::string& name, const ls::Shape& chw,
                                           int64_t classes, ls::models::ResNetStem stem) {
  const int64_t c = chw[0], h = chw[1], w = chw[2];
  if (name == "mlp")
    return std::make_shared<ls::models::MLP>(std::vector<int64_t>{c * h * w, 1024, 1024, classes});
  if (name == "cnn") {
    if (h != w)
      throw ls::Error(format("the cnn needs square images, got %lldx%lld",
                             static_cast<long long>(h), static_cast<long long>(w)));
    return std::make_shared<ls::models::FashionCNN>(classes, c, h);
  }
  ls::models::ResNetOptions ro;
  ro.num_classes = classes;
  ro.in_channels = c;
  ro.stem = stem;
  if (name == "resnet18") return std::make_shared<ls::models::ResNet>(ls::models::resnet18(ro));
  if (name == "resnet34") return std::make_shared<ls::models::ResNet>(ls::models::resnet34(ro));
  return std::make_shared<ls::models::ResNet>(ls::models::resnet50(ro));
}

std::string dataset_name(const std::string& spec) { return spec.substr(0, spec.find(':')); }

// Normalisation (and, for CIFAR-10 training, augmentation) of each dataset.
ls::data::TransformList transforms_for(const std::string& spec, bool train) {
  const std::string name = dataset_name(spec);
  if (name == "fashion-mnist") return {ls::data::normalize({0.2860f}, {0.3530f})};
  if (name == "mnist") return {ls::data::normalize({0.1307f}, {0.3081f})};
  if (name == "cifar10") {
    auto norm = ls::data::normalize({0.4914f, 0.4822f, 0.4465f}, {0.2470f, 0.2435f, 0.2616f});
    if (!train) return {norm};
    return {ls::data::random_crop(32, 4), ls::data::random_horizontal_flip(0.5), norm};
  }
  return {};  // fake
}

struct EvalResult {
  double loss = 0, accuracy = 0;
};

// The test split in eval mode, without gradients, one step per batch. The sums stay on the device
// and are read once, after the last step (a read of computed values, not an implicit sync).
std::optional<EvalResult> evaluate(ls::nn::Module& model, ls::data::DeviceLoader& loader,
                                   Pacer& pacer, const ls::StepOptions& step_options) {
  model.eval();
  ls::NoGrad no_grad;
  ls::Tensor loss_sum = ls::zeros({});
  ls::Tensor correct = ls::zeros({});
  int64_t count = 0;
  loader.set_epoch(0);
  while (!stop_requested()) {
    std::optional<ls::data::Batch> batch = loader.next();
    if (!batch) break;
    pacer.wait_for_room();
    const int64_t n = batch->labels.size(0);
    ls::step(
        [&] {
          ls::Tensor logits = model(batch->images);
          loss_sum.add_(
              ls::nn::cross_entropy(logits, batch->labels, {.reduction = ls::nn::Reduction::Sum}));
          correct.add_(ls::nn::accuracy(logits, batch->labels) * static_cast<double>(n));
          pacer.track();
        },
        step_options);
    count += n;
  }
  model.train();
  if (interrupted() || count == 0) return std::nullopt;
  // Data parallel: every rank evaluated its shard (all of the same size): the sums over ranks.
  if (ls::dist::world_size() > 1) {
    loss_sum = ls::dist::all_reduce(loss_sum);
    correct = ls::dist::all_reduce(correct);
    count *= ls::dist::world_size();
  }
  ls::wait();
  return EvalResult{loss_sum.item<float>() / static_cast<double>(count),
                    correct.item<float>() / static_cast<double>(count)};
}

int64_t metadata_int(const ls::io::Metadata& meta, const std::string& key,
                     const std::string& path) {
  auto it = meta.find(key);
  int64_t v = -1;
  if (it != meta.end()) {
    const std::string& s = it->second;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || p != s.data() + s.size()) v = -1;
  }
  if (it == meta.end() || v < 0)
    throw ls::Error("checkpoint '" + path + "' has no valid '" + key +
                    "' in its metadata (was it written by lockstep-train?)");
  // Epochs and steps far past any run (an edited or damaged file) would overflow as it goes on.
  if (v > (int64_t{1} << 40))
    throw ls::Error("checkpoint '" + path + "' has '" + key + "' = " + it->second +
                    " in its metadata, past any real run (at most 2^40): the file was edited or "
                    "damaged");
  return v;
}

// --tensorboard: what a log line says, and the compile-cache counters, at the run's step. Called
// from the step's closure: the values are ready, and the writer only queues them.
void log_to_board(ls::SummaryWriter& board, int64_t step, float loss, double lr, double rate) {
  board.add_scalar("train/loss", loss, step);
  board.add_scalar("train/learning_rate", lr, step);
  board.add_scalar("train/images_per_second", rate, step);
  board.add_scalar("runtime/compiles", static_cast<double>(ls::metrics::counter("compiles")), step);
  board.add_scalar("runtime/cache_hits", static_cast<double>(ls::metrics::counter("cache_hits")),
                   step);
}

// ---- data parallel --------------------------------------------------------------------------

// Cores this process may run on (mpirun may bind it to fewer than the machine has).
long allowed_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return sysconf(_SC_NPROCESSORS_ONLN);
  return CPU_COUNT(&set);
}

// --nprocs N outside mpirun: this process becomes `mpirun -np N lockstep-train <the same
// arguments>`, as xmp.spawn starts its processes. Unbound (--bind-to none: with 2 ranks or fewer
// mpirun would bind each to one core, and --threads would silently mean 1), oversubscribing when
// there are more ranks than cores, and as root when run as root (a container's default).
[[noreturn]] void launch_replicas(int argc, char** argv, int64_t n) {
  std::vector<std::string> args = {"mpirun",          "-np",       std::to_string(n),
                                   "--oversubscribe", "--bind-to", "none"};
  if (geteuid() == 0) args.push_back("--allow-run-as-root");
  char exe[4096];
  const ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  args.push_back(len > 0 ? std::string(exe, static_cast<size_t>(len)) : std::string(argv[0]));
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  std::vector<char*> cargs;
  for (std::string& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  std::fflush(stdout);
  execvp("mpirun", cargs.data());
  throw ls::Error(std::string("--nprocs: cannot start mpirun (") + std::strerror(errno) +
                  "): install openmpi-bin (scripts/install-deps), or start the replicas with "
                  "mpirun -np N yourself");
}

// ---- the run --------------------------------------------------------------------------------

int run(const Options& o) {
  ls::dist::init();
  const int rank = ls::dist::rank(), world = ls::dist::world_size();
  g_data_parallel = world > 1;
  if (o.nprocs > 1 && world != o.nprocs)
    throw ls::Error(
        format("--nprocs %lld, but mpirun started %d processes: pass the same number "
               "to both, or only one of them",
               static_cast<long long>(o.nprocs), world));
  std::optional<ls::profiler::Trace> trace;  // written when run() ends, however it ends
  if (!o.trace.empty()) trace.emplace(o.trace);
  ls::set_default_device(ls::parse_device(o.device));
  const long cores = allowed_cores();
  if (o.threads > 0)
    ls::set_num_threads(static_cast<int>(o.threads));
  else if (world > 1)  // the cores shared among the replicas on this host
    ls::set_num_threads(static_cast<int>(std::max<long>(1, cores / ls::dist::local_size())));
  ls::manual_seed(o.seed);

  // Data. Fake data mirrors the seed's ResNet example: 60000 images an epoch.
  const bool fake = o.data == "fake";
  const bool resnet = is_resnet(o.model);
  const int64_t side = o.image_size.value_or(resnet ? 224 : 28);
  ls::data::FakeDataOptions fake_options{.shape = {3, side, side},
                                         .num_classes = resnet ? 1000 : 10,
                                         .size = 60000,
                                         .seed = o.seed,
                                         .fixed = false};
  auto train_set = ls::data::make_dataset(o.data, /*train=*/true, fake_options);
  std::shared_ptr<ls::data::Dataset> test_set;
  if (!fake) test_set = ls::data::make_dataset(o.data, /*train=*/false, fake_options);
  // The test split is evaluated by the model the train split shapes: a mismatch is refused now,
  // naming both, not after an epoch of training (whose checkpoint would never be written).
  if (test_set && (test_set->example_shape() != train_set->example_shape() ||
                   test_set->num_classes() != train_set->num_classes()))
    throw ls::Error(format(
        "the test split %s has examples of shape %s and %lld classes, the train split %s has %s "
        "and %lld: both splits must have the same image size and classes (check --data)",
        test_set->name().c_str(), ls::shape_str(test_set->example_shape()).c_str(),
        static_cast<long long>(test_set->num_classes()), train_set->name().c_str(),
        ls::shape_str(train_set->example_shape()).c_str(),
        static_cast<long long>(train_set->num_classes())));

  ls::data::DeviceLoader train_loader(
      ls::data::DataLoader(train_set, {.batch_size = o.batch_size,
                                       .shuffle = true,
                                       .seed = o.seed,
                                       .drop_last = true,  // one batch shape: one compiled program
                                       .num_workers = static_cast<int>(o.workers),
                                       .transforms = transforms_for(o.data, true),
                                       .num_replicas = world,
                                       .rank = rank,
                                       .shard_drop_last = true}));
  std::unique_ptr<ls::data::DeviceLoader> test_loader;
  if (test_set)
    test_loader = std::make_unique<ls::data::DeviceLoader>(
        ls::data::DataLoader(test_set, {.batch_size = std::max<int64_t>(o.batch_size, 256),
                                        .num_workers = static_cast<int>(o.workers),
                                        .transforms = transforms_for(o.data, false),
                                        .num_replicas = world,
                                        .rank = rank}));
  const int64_t batches = train_loader.batches_per_epoch();
  if (batches == 0)
    throw ls::Error(format("%s has %lld examples, fewer than one batch of %lld",
                           train_set->name().c_str(), static_cast<long long>(train_set->size()),
                           static_cast<long long>(o.batch_size)));
  const int64_t steps_per_epoch = o.num_steps > 0 ? std::min(o.num_steps, batches) : batches;

  // Model and optimizer.
  const ls::models::ResNetStem stem = resolve_stem(o.stem, train_set->example_shape());
  auto model = make_model(o.model, train_set->example_shape(), train_set->num_classes(), stem);
  // Data parallel: rank 0's initial weights on every rank; gradients averaged every step.
  ls::dist::DataParallel dp(*model);
  const bool sgd = o.optimizer == "sgd";
  // The defaults (AdamW, peak lr 3e-3, 100 warm-up steps, cosine decay, batch 64) take the cnn
  // past 90% test accuracy on Fashion-MNIST in one epoch (measured: 90.30%, 90.48%, 90.27% with
  // seeds 0, 1, 2); with SGD (momentum 0.9, lr 0.05) one epoch gives 89.6%.
  const double lr = o.lr.value_or(sgd ? 0.05 : 3e-3);
  const double weight_decay = o.weight_decay.value_or(sgd ? 0.0 : 0.01);
  auto make_optimizer =
      [&](std::vector<ls::Tensor> params) -> std::shared_ptr<ls::optim::Optimizer> {
    if (sgd)
      return std::make_shared<ls::optim::SGD>(
          std::move(params),
          ls::optim::SGDOptions{.lr = lr, .momentum = o.momentum, .weight_decay = weight_decay});
    return std::make_shared<ls::optim::AdamW>(
        std::move(params), ls::optim::AdamOptions{.lr = lr, .weight_decay = weight_decay});
  };
  // --zero 1: each replica keeps and updates its shard of the optimizer's state; 2: and keeps
  // the gradients of its shard alone; 3: and holds its shard of the parameters alone.
  std::shared_ptr<ls::optim::Optimizer> opt;
  if (o.zero == 3)
    opt = ls::dist::fully_shard(*model, make_optimizer);
  else if (o.zero > 0)
    opt = std::make_shared<ls::dist::ZeroRedundancyOptimizer>(
        model->parameters(), make_optimizer,
        ls::dist::ZeroOptions{.stage = static_cast<int>(o.zero)});
  else
    opt = make_optimizer(model->parameters());
  // Cosine decay over the whole run, after a linear warm-up.
  const int64_t total_steps = o.num_epochs * steps_per_epoch;
  const int64_t warmup =
      std::min(o.warmup_steps.value_or(std::min<int64_t>(100, total_steps / 5)), total_steps - 1);
  std::unique_ptr<ls::optim::LRScheduler> schedule;
  if (o.lr_schedule == "cosine")
    schedule = std::make_unique<ls::optim::CosineWarmupLR>(*opt, warmup, total_steps);

  // Where to start: a checkpoint's metadata says which epoch it was saved in, how many steps of
  // that epoch were done and whether the epoch was complete.
  int64_t epoch = 1, step = 0, global_step = 0;
  // A directory is a sharded checkpoint (--zero writes one), loaded at any --nprocs.
  std::error_code fs_error;
  const bool sharded_checkpoint =
      o.zero > 0 || std::filesystem::is_directory(o.checkpoint, fs_error);
  if (o.resume) {
    const ls::io::Metadata meta = sharded_checkpoint
                                      ? ls::dist::load_sharded(o.checkpoint, *model, opt.get())
                                      : ls::load_checkpoint(o.checkpoint, *model, opt.get());
    auto it = meta.find("model");
    if (it != meta.end() && it->second != o.model)
      throw ls::Error("checkpoint '" + o.checkpoint + "' holds a " + it->second + ", not a " +
                      o.model);
    // Every rank loaded the same model (and, without --zero, the same optimizer state).
    if (world > 1) dp.check_replicas_agree();
    if (world > 1 && o.zero == 0) {
      std::vector<ls::Tensor> opt_state;
      for (const auto& kv : opt->state_dict()) opt_state.push_back(kv.second);
      ls::dist::check_same_on_all_ranks(opt_state, "the optimizer's state from " + o.checkpoint);
    }
    epoch = metadata_int(meta, "epoch", o.checkpoint);
    step = metadata_int(meta, "step", o.checkpoint);
    global_step = metadata_int(meta, "global_step", o.checkpoint);
    if (metadata_int(meta, "epoch_done", o.checkpoint) != 0 || step >= steps_per_epoch) {
      ++epoch;
      step = 0;
    }
  }
  if (schedule) schedule->set_count(global_step);
  // Files written late are checked now: a FIFO, a device (/dev/null), a directory or a symbolic
  // link there is refused before any training, not after an epoch or by a write that blocks.
  if (!o.checkpoint.empty() && o.zero == 0) ls::io::check_save_path(o.checkpoint);
  if (!o.metrics_json.empty()) ls::io::check_save_path(o.metrics_json);

  const ls::DType precision = o.precision == "bf16" ? ls::bf16 : ls::f32;
  ls::StepOptions step_options;
  if (precision == ls::bf16) step_options.autocast = ls::bf16;
  const std::string model_name = resnet ? o.model + " (" + describe_stem(o, stem) + ")" : o.model;
  const std::string batch_text =
      world == 1
          ? format("batch %lld", static_cast<long long>(o.batch_size))
          : format("batch %lld (%d replicas x %lld)", static_cast<long long>(o.batch_size * world),
                   world, static_cast<long long>(o.batch_size));
  // The precision, and on the cpu the oneDNN kernels (and so the instruction set) it runs.
  const std::string precision_text =
      o.precision + (o.device == "cpu" ? " [" + ls::cpu_kernels(precision) + "]" : "");
  if (rank == 0)
    std::printf(
        "lockstep-train: %s on %s, %s, %lld steps/epoch, %s lr %g (%s), %s (%d threads%s, %s), "
        "%s\n",
        model_name.c_str(), train_set->name().c_str(), batch_text.c_str(),
        static_cast<long long>(steps_per_epoch), o.optimizer.c_str(), lr,
        schedule ? format("cosine, %lld warm-up steps", static_cast<long long>(warmup)).c_str()
                 : "constant",
        o.device.c_str(), ls::num_threads(), world > 1 ? " per replica" : "",
        ls::thread_wait_setting().c_str(), precision_text.c_str());
  if (world > 1) {
    // What each rank really has: mpirun may bind a rank to one core (see --nprocs).
    std::printf("replica %d of %d: %d threads on %ld cores it may run on\n", rank, world,
                ls::num_threads(), cores);
    if (ls::num_threads() > cores)
      std::fprintf(stderr,
                   "lockstep-train: warning: replica %d runs %d threads on %ld cores: mpirun "
                   "bound it (its default with 2 ranks or fewer binds each to one core); start it "
                   "with --bind-to none, or use --nprocs, which does\n",
                   rank, ls::num_threads(), cores);
  }
  if (o.resume && rank == 0)
    std::printf("resuming from %s at epoch %lld, step %lld\n", o.checkpoint.c_str(),
                static_cast<long long>(epoch), static_cast<long long>(step));
  std::fflush(stdout);

  auto save = [&](int64_t at_epoch, int64_t at_step, bool epoch_done) {
    if (o.checkpoint.empty()) return;
    const ls::io::Metadata meta{{"epoch", std::to_string(at_epoch)},
                                {"step", std::to_string(at_step)},
                                {"epoch_done", epoch_done ? "1" : "0"},
                                {"global_step", std::to_string(global_step)},
                                {"model", o.model},
                                {"data", o.data}};
    // --zero: every rank writes its shard, asynchronously after an epoch (the next epoch trains
    // while the writers write; the next save and the exit wait for them). Otherwise the
    // replicas are identical: rank 0 writes.
    if (o.zero > 0 && epoch_done)
      ls::dist::save_sharded_async(o.checkpoint, *model, opt.get(), schedule.get(), meta);
    else if (o.zero > 0)
      ls::dist::save_sharded(o.checkpoint, *model, opt.get(), schedule.get(), meta);
    else if (rank == 0)
      ls::save_checkpoint(o.checkpoint, *model, opt.get(), schedule.get(), meta);
  };

  // The replicas train the same model: rank 0 logs. A resumed run replaces the events of the
  // steps it redoes (purge_step).
  std::unique_ptr<ls::SummaryWriter> board;
  if (!o.tensorboard.empty() && rank == 0)
    board = std::make_unique<ls::SummaryWriter>(ls::SummaryWriterOptions{
        .log_dir = o.tensorboard,
        .purge_step = o.resume ? std::optional<int64_t>(global_step) : std::nullopt});
  Progress progress;
  Pacer pacer;
  RateTracker tracker;  // touched by closures only
  // The closures of queued steps refer to the three objects above: should an error leave this
  // function, wait for those steps before the objects go (an execution error is reported
  // already, by whatever threw).
  struct WaitForQueuedSteps {
    ~WaitForQueuedSteps() {
      try {
        ls::wait();
      } catch (...) {
      }
    }
  } wait_for_queued_steps;
  ls::Tensor loss;
  int64_t images = 0;  // images trained on in this run
  double train_seconds = 0;
  bool unsaved = false;  // steps trained since the last checkpoint
  // The first non-finite loss a step closure saw ("epoch E, step S: nan"): the model is no longer
  // finite, so the run stops there and never saves it over a good checkpoint.
  std::mutex nonfinite_mu;
  std::string nonfinite;
  auto check_finite = [&] {
    std::lock_guard<std::mutex> lock(nonfinite_mu);
    if (nonfinite.empty()) return;
    throw ls::Error(
        "the loss is not finite at " + nonfinite +
        ": the model's weights are no longer finite, so training stops here" +
        (o.checkpoint.empty()
             ? std::string()
             : " without saving (" + o.checkpoint + " keeps the last good state)") +
        ". Lower the learning rate (--lr), add warm-up (--warmup-steps), or check the data");
  };

  const int64_t first_epoch = epoch;
  for (; epoch <= o.num_epochs && !interrupted(); ++epoch, step = 0) {
    // Every program the run needs was compiled in its first epoch (training and test steps):
    // from here on a compile means something changed that should not have.
    if (o.strict && epoch == first_epoch + 1)
      ls::debug::expect_steady(0, ls::debug::OnRecompile::Throw, /*implicit_syncs_per_step=*/0);
    model->train();
    train_loader.set_epoch(epoch - 1);
    // Resuming mid-epoch: the epoch's order is a function of (seed, epoch), so skipping the
    // batches already trained on gives exactly the batches an uninterrupted run would see.
    for (int64_t i = 0; i < step; ++i) train_loader.next();
    progress.start(format("epoch %lld", static_cast<long long>(epoch)), steps_per_epoch);
    const auto epoch_start = std::chrono::steady_clock::now();
    int64_t epoch_images = 0;
    tracker.reset();
    for (; step < steps_per_epoch && !stop_requested(); ++step) {
      check_finite();
      std::optional<ls::data::Batch> batch = train_loader.next();
      if (!batch) break;
      pacer.wait_for_room();
      const int64_t n = batch->labels.size(0);
      const int64_t images_after = epoch_images + n;
      ls::step(
          [&] {
            opt->zero_grad();
            loss = ls::nn::cross_entropy((*model)(batch->images), batch->labels,
                                         {.label_smoothing = o.label_smoothing});
            loss.backward();
            dp.average_gradients();
            opt->step();
            // Runs on the runtime thread once this step's program has run: the loss is computed,
            // so reading it waits for nothing and is no implicit sync.
            const bool log = step % o.log_steps == 0;
            pacer.track([&, log, e = epoch, s = step, l = loss, images_after, g = global_step,
                         lr_now = opt->lr()] {
              if (const float v = l.item<float>(); !std::isfinite(v)) {
                std::lock_guard<std::mutex> lock(nonfinite_mu);
                if (nonfinite.empty())
                  nonfinite = format("epoch %lld, step %lld (%g)", static_cast<long long>(e),
                                     static_cast<long long>(s), static_cast<double>(v));
              }
              if (log) {
                const double rate = tracker.rate(images_after);
                progress.line(format("epoch: %lld, step: %lld, loss: %.4f, rate: %.2f",
                                     static_cast<long long>(e), static_cast<long long>(s),
                                     static_cast<double>(l.item<float>()), rate));
                if (board) log_to_board(*board, g, l.item<float>(), lr_now, rate);
              }
              progress.update(s + 1, images_after);
            });
          },
          step_options);
      epoch_images = images_after;
      unsaved = true;
      ++global_step;
      if (schedule) schedule->step();
    }
    ls::wait();
    progress.clear();
    check_finite();
    images += epoch_images;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start).count();
    train_seconds += seconds;
    if (interrupted()) break;
    std::printf("epoch: %lld, train_time: %.1fs, images/s: %.2f\n", static_cast<long long>(epoch),
                seconds, static_cast<double>(epoch_images) / seconds);
    std::fflush(stdout);
    if (test_loader) {
      if (std::optional<EvalResult> r = evaluate(*model, *test_loader, pacer, step_options)) {
        std::printf("epoch: %lld, test_loss: %.4f, test_accuracy: %.4f\n",
                    static_cast<long long>(epoch), r->loss, r->accuracy);
        std::fflush(stdout);
        if (board) {
          board->add_scalar("test/loss", r->loss, global_step);
          board->add_scalar("test/accuracy", r->accuracy, global_step);
        }
      }
    }
    save(epoch, step, /*epoch_done=*/true);
    unsaved = false;
  }
  ls::wait();
  check_finite();
  ls::dist::wait_for_save();  // the last epoch's checkpoint is committed (or its error thrown)

  if (interrupted()) {
    // `step` steps of `epoch` are done (every traced step ran: ls::wait above).
    if (unsaved) save(epoch, step, /*epoch_done=*/false);
    std::fprintf(
        stderr, "lockstep-train: interrupted (%s) at epoch %lld, step %lld%s\n",
        (std::string("SIG") + sigabbrev_np(stop_signal())).c_str(), static_cast<long long>(epoch),
        static_cast<long long>(step),
        o.checkpoint.empty() || rank != 0 ? "" : ("; checkpoint saved to " + o.checkpoint).c_str());
  }
  std::printf("total: images/s %.2f, compiles %lld, cache_hits %lld, implicit_syncs %lld\n",
              train_seconds > 0 ? static_cast<double>(images) / train_seconds : 0.0,
              static_cast<long long>(ls::metrics::counter("compiles")),
              static_cast<long long>(ls::metrics::counter("cache_hits")),
              static_cast<long long>(ls::metrics::counter("implicit_syncs")));
  if (board) board->close();  // a write that failed is an error of the run
  if (o.metrics) std::printf("%s", ls::metrics::report().c_str());
  if (!o.metrics_json.empty()) {
    std::FILE* f = std::fopen(o.metrics_json.c_str(), "w");
    const std::string json = ls::metrics::report_json() + "\n";
    if (!f || std::fwrite(json.data(), 1, json.size(), f) != json.size() || std::fclose(f) != 0)
      throw ls::Error("--metrics-json: cannot write '" + o.metrics_json + "'");
  }
  std::fflush(stdout);
  return interrupted() ? 128 + stop_signal() : 0;
}

}  // namespace

int main(int argc, char** argv) {
  ls::apply_thread_wait_default(argv);
  Options options;
  try {
    options = parse_args(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "lockstep-train: error: %s\n%s", e.what(), kUsage);
    return kExitUsage;
  }
  if (options.help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  install_sigint_handler();
  try {
    if (options.nprocs > 1 && !ls::dist::under_launcher())
      launch_replicas(argc, argv, options.nprocs);
    return run(options);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "lockstep-train: error: %s\n", e.what());
    return kExitError;
  }
}
