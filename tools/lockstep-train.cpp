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
// command line, 130 interrupted (SIGINT).
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
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <lockstep/lockstep.h>

namespace ls = lockstep;

namespace {

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;
constexpr int kExitInterrupted = 130;  // 128 + SIGINT, as a shell reports it

// ---- Ctrl-C ---------------------------------------------------------------------------------
// The handler only sets this flag; the loop checks it between steps. SA_RESETHAND makes a second
// Ctrl-C kill the process at once, should a step hang.
std::atomic<bool> g_interrupted{false};
static_assert(std::atomic<bool>::is_always_lock_free);

void on_sigint(int) { g_interrupted.store(true, std::memory_order_relaxed); }

void install_sigint_handler() {
  struct sigaction sa = {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND | SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
}

bool interrupted() { return g_interrupted.load(std::memory_order_relaxed); }

// ---- command line ---------------------------------------------------------------------------

const char* const kUsage = R"(usage: lockstep-train [options]

Trains a model with lockstep's transactional steps and prints, every --log-steps steps,
  epoch: E, step: S, loss: L, rate: R        (R: images/second, smoothed)
then, on real data, the test loss and accuracy after each epoch, and at the end
  total: images/s X, compiles N, cache_hits N, implicit_syncs N

options:
  --model M          mlp, cnn, resnet18, resnet34 or resnet50 (default: cnn)
  --data D           fake, fashion-mnist[:DIR], mnist:DIR or cifar10:DIR
                     (default: fashion-mnist, DIR /usr/share/datasets/fashion-mnist)
  --batch-size N     examples per step (default: 64)
  --num-epochs N     epochs to train (default: 1)
  --num-steps N      at most N steps per epoch (default: 0, the whole epoch)
  --optimizer O      adamw or sgd (default: adamw)
  --lr X             peak learning rate (default: 0.003 with adamw, 0.05 with sgd)
  --momentum X       SGD momentum, in [0, 1) (default: 0.9)
  --weight-decay X   weight decay (default: 0 with sgd, 0.01 with adamw)
  --lr-schedule S    cosine (to 0 over the run) or constant (default: cosine)
  --warmup-steps N   linear warm-up steps of the cosine schedule
                     (default: 100, at most a fifth of the run)
  --label-smoothing X  label smoothing of the training loss, in [0, 1) (default: 0)
  --image-size N     side of fake images (default: 224 for resnets, 28 otherwise)
  --stem S           a resnet's first layers: imagenet (7x7 stride-2 conv, 3x3 stride-2
                     max-pool: torchvision's), small (3x3 stride-1 conv, no max-pool: for
                     CIFAR-sized images; 16x the convolution work of imagenet at the same size)
                     or auto (small for images of 64x64 or less, else imagenet) (default: auto)
  --nprocs N         train N replicas in data parallel, one process each (started through
                     mpirun; `mpirun -np N lockstep-train ...` works too). --batch-size is per
                     replica; each replica trains on its shard of every epoch (default: 1)
  --threads N        compute threads (default: 0, every core; per replica)
  --workers N        data loading threads (default: 2)
  --log-steps N      print a line every N steps (default: 20)
  --seed N           seed for initialisation, shuffling and augmentation (default: 0)
  --checkpoint PATH  save model and optimizer to PATH after every epoch, at the end and on Ctrl-C
  --resume           load --checkpoint PATH first and continue from its epoch and step
  --metrics          print lockstep's metrics report at the end
  --metrics-json FILE  write lockstep's metrics as JSON (ls::metrics::report_json) to FILE
  --strict           after the first epoch (the warm-up), a recompile is an error that names
                     what changed (ls::debug::expect_steady)
  --device D         cpu or ref (default: cpu)
  --precision P      f32, or bf16: mixed precision (ls::autocast: matmuls and convolutions in
                     bf16 with f32 accumulation, f32 master weights; checkpoints stay f32)
                     (default: f32)
  --help             print this help and exit

Fake data: random 3xNxN images with 1000 classes for resnets (10 otherwise), 60000 per epoch,
as the seed's ResNet example; no test split. Ctrl-C stops after the current step (saving the
checkpoint first) and exits with 130.
)";

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Options {
  std::string model = "cnn";
  std::string data = "fashion-mnist";
  int64_t batch_size = 64;
  int64_t num_epochs = 1;
  int64_t num_steps = 0;
  std::string optimizer = "adamw";
  std::optional<double> lr;
  double momentum = 0.9;
  std::optional<double> weight_decay;
  std::string lr_schedule = "cosine";
  std::optional<int64_t> warmup_steps;
  double label_smoothing = 0;
  std::optional<int64_t> image_size;
  std::string stem = "auto";
  int64_t threads = 0;
  int64_t nprocs = 1;
  int64_t workers = 2;
  int64_t log_steps = 20;
  uint64_t seed = 0;
  std::string checkpoint;
  bool resume = false;
  bool metrics = false;
  bool strict = false;
  std::string metrics_json;
  std::string device = "cpu";
  std::string precision = "f32";
  bool help = false;
};

bool is_resnet(const std::string& model) { return model.rfind("resnet", 0) == 0; }

int64_t parse_int(const std::string& flag, const std::string& text, int64_t lo, int64_t hi) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  if (ec == std::errc::result_out_of_range || (ec == std::errc() && p == end && (v < lo || v > hi)))
    throw UsageError(flag + " " + text + " is out of range [" + std::to_string(lo) + ", " +
                     std::to_string(hi) + "]");
  if (ec != std::errc() || p != end || text.empty())
    throw UsageError(flag + " needs an integer, got '" + text + "'");
  return v;
}

uint64_t parse_uint64(const std::string& flag, const std::string& text) {
  uint64_t v = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  if (ec == std::errc::result_out_of_range)
    throw UsageError(flag + " " + text + " is out of range [0, 2^64)");
  if (ec != std::errc() || p != end || text.empty())
    throw UsageError(flag + " needs a non-negative integer, got '" + text + "'");
  return v;
}

// [lo, hi], or [lo, hi) when `hi_open`.
double parse_double(const std::string& flag, const std::string& text, double lo, double hi,
                    bool lo_open = false, bool hi_open = false) {
  double v = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || p != end || text.empty() || !std::isfinite(v))
    throw UsageError(flag + " needs a number, got '" + text + "'");
  if ((lo_open ? v <= lo : v < lo) || (hi_open ? v >= hi : v > hi)) {
    char range[96];
    std::snprintf(range, sizeof range, "%c%g, %g%c", lo_open ? '(' : '[', lo, hi,
                  hi_open ? ')' : ']');
    throw UsageError(flag + " " + text + " is out of range " + range);
  }
  return v;
}

std::string parse_choice(const std::string& flag, const std::string& text,
                         const std::vector<std::string>& choices) {
  if (std::find(choices.begin(), choices.end(), text) != choices.end()) return text;
  std::string list;
  for (const std::string& c : choices) list += (list.empty() ? "" : ", ") + c;
  throw UsageError(flag + ": unknown choice '" + text + "' (expected one of " + list + ")");
}

// The dataset spec is checked here as far as it can be without touching the file system; a
// directory that does not exist or a bad file is an ls::Error later (exit code 1).
std::string parse_data(const std::string& text) {
  const size_t colon = text.find(':');
  const std::string name = text.substr(0, colon);
  const bool has_dir = colon != std::string::npos;
  if (name == "fake" && !has_dir) return text;
  if (name == "fake") throw UsageError("--data fake takes no directory, got '" + text + "'");
  if (name != "fashion-mnist" && name != "mnist" && name != "cifar10")
    throw UsageError("--data: unknown dataset '" + name +
                     "' (expected fake, fashion-mnist[:DIR], mnist:DIR or cifar10:DIR)");
  if (has_dir && colon + 1 == text.size())
    throw UsageError("--data " + text + ": the directory after ':' is empty");
  if (!has_dir && name != "fashion-mnist")
    throw UsageError("--data " + name + " needs a directory: " + name + ":DIR");
  return text;
}

Options parse_args(int argc, char** argv) {
  Options o;
  bool stem_given = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::optional<std::string> inline_value;
    if (arg.rfind("--", 0) == 0) {
      const size_t eq = arg.find('=');
      if (eq != std::string::npos) {
        inline_value = arg.substr(eq + 1);
        arg = arg.substr(0, eq);
      }
    }
    auto flag_only = [&] {
      if (inline_value) throw UsageError(arg + " takes no value");
    };
    auto value = [&]() -> std::string {
      if (inline_value) return *inline_value;
      if (i + 1 >= argc) throw UsageError(arg + " needs a value");
      return argv[++i];
    };
    constexpr int64_t kBig = int64_t{1} << 40;
    if (arg == "--help" || arg == "-h") {
      flag_only();
      o.help = true;
    } else if (arg == "--model") {
      o.model = parse_choice(arg, value(), {"mlp", "cnn", "resnet18", "resnet34", "resnet50"});
    } else if (arg == "--data") {
      o.data = parse_data(value());
    } else if (arg == "--batch-size") {
      o.batch_size = parse_int(arg, value(), 1, 1 << 16);
    } else if (arg == "--num-epochs") {
      o.num_epochs = parse_int(arg, value(), 1, 1000000);
    } else if (arg == "--num-steps") {
      o.num_steps = parse_int(arg, value(), 0, kBig);
    } else if (arg == "--optimizer") {
      o.optimizer = parse_choice(arg, value(), {"sgd", "adamw"});
    } else if (arg == "--lr") {
      o.lr = parse_double(arg, value(), 0, 10, /*lo_open=*/true);
    } else if (arg == "--momentum") {
      o.momentum = parse_double(arg, value(), 0, 1, false, /*hi_open=*/true);
    } else if (arg == "--weight-decay") {
      o.weight_decay = parse_double(arg, value(), 0, 1);
    } else if (arg == "--lr-schedule") {
      o.lr_schedule = parse_choice(arg, value(), {"cosine", "constant"});
    } else if (arg == "--warmup-steps") {
      o.warmup_steps = parse_int(arg, value(), 0, kBig);
    } else if (arg == "--label-smoothing") {
      o.label_smoothing = parse_double(arg, value(), 0, 1, false, /*hi_open=*/true);
    } else if (arg == "--image-size") {
      o.image_size = parse_int(arg, value(), 8, 1024);
    } else if (arg == "--stem") {
      o.stem = parse_choice(arg, value(), {"auto", "imagenet", "small"});
      stem_given = true;
    } else if (arg == "--nprocs") {
      o.nprocs = parse_int(arg, value(), 1, 1024);
    } else if (arg == "--threads") {
      o.threads = parse_int(arg, value(), 0, 1024);
    } else if (arg == "--workers") {
      o.workers = parse_int(arg, value(), 0, 64);
    } else if (arg == "--log-steps") {
      o.log_steps = parse_int(arg, value(), 1, kBig);
    } else if (arg == "--seed") {
      o.seed = parse_uint64(arg, value());
    } else if (arg == "--checkpoint") {
      o.checkpoint = value();
      if (o.checkpoint.empty()) throw UsageError("--checkpoint needs a non-empty path");
    } else if (arg == "--resume") {
      flag_only();
      o.resume = true;
    } else if (arg == "--metrics") {
      flag_only();
      o.metrics = true;
    } else if (arg == "--metrics-json") {
      o.metrics_json = value();
      if (o.metrics_json.empty()) throw UsageError("--metrics-json needs a non-empty path");
    } else if (arg == "--strict") {
      flag_only();
      o.strict = true;
    } else if (arg == "--device") {
      o.device = parse_choice(arg, value(), {"cpu", "ref"});
    } else if (arg == "--precision") {
      o.precision = parse_choice(arg, value(), {"f32", "bf16"});
    } else if (arg.rfind("-", 0) == 0) {
      throw UsageError("unknown option '" + arg + "'");
    } else {
      throw UsageError("unexpected argument '" + arg + "'");
    }
  }
  if (o.resume && o.checkpoint.empty()) throw UsageError("--resume needs --checkpoint PATH");
  if (stem_given && !is_resnet(o.model))
    throw UsageError("--stem applies to the resnets only, not to --model " + o.model);
  const bool fake = o.data == "fake";
  if (o.image_size && !fake)
    throw UsageError("--image-size applies to --data fake only (real images keep their size)");
  if (fake && o.model == "cnn" && o.image_size && *o.image_size % 4 != 0)
    throw UsageError("--image-size " + std::to_string(*o.image_size) +
                     ": the cnn needs a multiple of 4");
  return o;
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
  // Outside a step: waits for room.
  void wait_for_room() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return issued_ - done_ < kMaxInFlight; });
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
  while (!interrupted()) {
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
  if (v < 0)
    throw ls::Error("checkpoint '" + path + "' has no valid '" + key +
                    "' in its metadata (was it written by lockstep-train?)");
  return v;
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
  if (o.nprocs > 1 && world != o.nprocs)
    throw ls::Error(
        format("--nprocs %lld, but mpirun started %d processes: pass the same number "
               "to both, or only one of them",
               static_cast<long long>(o.nprocs), world));
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
  std::unique_ptr<ls::optim::Optimizer> opt;
  if (sgd)
    opt = std::make_unique<ls::optim::SGD>(
        model->parameters(),
        ls::optim::SGDOptions{.lr = lr, .momentum = o.momentum, .weight_decay = weight_decay});
  else
    opt = std::make_unique<ls::optim::AdamW>(
        model->parameters(), ls::optim::AdamOptions{.lr = lr, .weight_decay = weight_decay});
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
  if (o.resume) {
    const ls::io::Metadata meta = ls::load_checkpoint(o.checkpoint, *model, opt.get());
    auto it = meta.find("model");
    if (it != meta.end() && it->second != o.model)
      throw ls::Error("checkpoint '" + o.checkpoint + "' holds a " + it->second + ", not a " +
                      o.model);
    if (world > 1) {  // every rank loaded the file: they must hold the same state
      dp.check_replicas_agree();
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
        "lockstep-train: %s on %s, %s, %lld steps/epoch, %s lr %g (%s), %s (%d threads%s), %s\n",
        model_name.c_str(), train_set->name().c_str(), batch_text.c_str(),
        static_cast<long long>(steps_per_epoch), o.optimizer.c_str(), lr,
        schedule ? format("cosine, %lld warm-up steps", static_cast<long long>(warmup)).c_str()
                 : "constant",
        o.device.c_str(), ls::num_threads(), world > 1 ? " per replica" : "",
        precision_text.c_str());
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
    if (o.checkpoint.empty() || rank != 0) return;  // replicas are identical: rank 0 writes
    ls::save_checkpoint(o.checkpoint, *model, opt.get(),
                        {{"epoch", std::to_string(at_epoch)},
                         {"step", std::to_string(at_step)},
                         {"epoch_done", epoch_done ? "1" : "0"},
                         {"global_step", std::to_string(global_step)},
                         {"model", o.model},
                         {"data", o.data}});
  };

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
    for (; step < steps_per_epoch && !interrupted(); ++step) {
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
            pacer.track([&, log, e = epoch, s = step, l = loss, images_after] {
              if (log)
                progress.line(format("epoch: %lld, step: %lld, loss: %.4f, rate: %.2f",
                                     static_cast<long long>(e), static_cast<long long>(s),
                                     static_cast<double>(l.item<float>()),
                                     tracker.rate(images_after)));
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
      }
    }
    save(epoch, step, /*epoch_done=*/true);
    unsaved = false;
  }
  ls::wait();

  if (interrupted()) {
    // `step` steps of `epoch` are done (every traced step ran: ls::wait above).
    if (unsaved) save(epoch, step, /*epoch_done=*/false);
    std::fprintf(stderr, "lockstep-train: interrupted at epoch %lld, step %lld%s\n",
                 static_cast<long long>(epoch), static_cast<long long>(step),
                 o.checkpoint.empty() ? "" : ("; checkpoint saved to " + o.checkpoint).c_str());
  }
  std::printf("total: images/s %.2f, compiles %lld, cache_hits %lld, implicit_syncs %lld\n",
              train_seconds > 0 ? static_cast<double>(images) / train_seconds : 0.0,
              static_cast<long long>(ls::metrics::counter("compiles")),
              static_cast<long long>(ls::metrics::counter("cache_hits")),
              static_cast<long long>(ls::metrics::counter("implicit_syncs")));
  if (o.metrics) std::printf("%s", ls::metrics::report().c_str());
  if (!o.metrics_json.empty()) {
    std::FILE* f = std::fopen(o.metrics_json.c_str(), "w");
    const std::string json = ls::metrics::report_json() + "\n";
    if (!f || std::fwrite(json.data(), 1, json.size(), f) != json.size() || std::fclose(f) != 0)
      throw ls::Error("--metrics-json: cannot write '" + o.metrics_json + "'");
  }
  std::fflush(stdout);
  return interrupted() ? kExitInterrupted : 0;
}

}  // namespace

int main(int argc, char** argv) {
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
