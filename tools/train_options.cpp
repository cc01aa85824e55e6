// lockstep-train's command line (train_options.h).
#include "train_options.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <vector>

namespace lockstep_train {

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
  --zero S           with --nprocs: 1 shards the optimizer's state over the replicas (ZeRO
                     stage 1, ls::dist::ZeroRedundancyOptimizer), 2 the gradients as well
                     (stage 2), 3 the parameters too (ls::dist::fully_shard), 0 keeps a whole
                     copy on each (default: 0); --checkpoint PATH is
                     then a directory of one file per replica (ls::dist::save_sharded; after
                     an epoch written while the next one trains), which --resume loads at any
                     --nprocs
  --threads N        compute threads (default: 0, every core; per replica)
  --workers N        data loading threads (default: 2)
  --log-steps N      print a line every N steps (default: 20)
  --seed N           seed for initialisation, shuffling and augmentation (default: 0)
  --checkpoint PATH  save model and optimizer to PATH after every epoch, at the end and on Ctrl-C
  --resume           load --checkpoint PATH first and continue from its epoch and step
  --metrics          print lockstep's metrics report at the end
  --metrics-json FILE  write lockstep's metrics as JSON (ls::metrics::report_json) to FILE
  --tensorboard DIR  also log loss, learning rate, images/s, compiles and cache hits every
                     --log-steps steps, and the test accuracy, as TensorBoard event files in DIR
                     (ls::SummaryWriter; with --nprocs, rank 0 writes)
  --trace DIR        write the run's step timeline (ls::profiler) to DIR as Chrome Trace Event
                     JSON, one file per process (per rank with --nprocs): open it in
                     https://ui.perfetto.dev
  --strict           after the first epoch (the warm-up), a recompile is an error that names
                     what changed (ls::debug::expect_steady)
  --device D         cpu or ref (default: cpu)
  --precision P      f32, or bf16: mixed precision (ls::autocast: matmuls and convolutions in
                     bf16 with f32 accumulation, f32 master weights; checkpoints stay f32)
                     (default: f32)
  --help             print this help and exit

Fake data: random 3xNxN images with 1000 classes for resnets (10 otherwise), 60000 per epoch,
as the seed's ResNet example; no test split. Ctrl-C (SIGINT), SIGTERM, SIGHUP and SIGPIPE stop
after the current step (saving the checkpoint first) and exit with 128 + the signal (130 for
Ctrl-C).
)";

bool is_resnet(const std::string& model) { return model.rfind("resnet", 0) == 0; }

namespace {

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

}  // namespace

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
    } else if (arg == "--zero") {
      o.zero = parse_int(arg, value(), 0, 3);
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
    } else if (arg == "--tensorboard") {
      o.tensorboard = value();
      if (o.tensorboard.empty()) throw UsageError("--tensorboard needs a non-empty directory");
    } else if (arg == "--trace") {
      o.trace = value();
      if (o.trace.empty()) throw UsageError("--trace needs a non-empty directory");
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

}  // namespace lockstep_train
