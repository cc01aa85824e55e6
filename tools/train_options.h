// lockstep-train's command line: its options, their defaults and ranges, and the usage text.
// Not here: what the program does with them (lockstep-train.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

namespace lockstep_train {

extern const char* const kUsage;

// A bad command line (exit code 2), its message naming the flag.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The command line, parsed.
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
  int64_t zero = 0;  // ZeRO stage: 0 (none), 1 (optimizer state sharded) or 2 (gradients too)
  int64_t workers = 2;
  int64_t log_steps = 20;
  uint64_t seed = 0;
  std::string checkpoint;
  bool resume = false;
  bool metrics = false;
  bool strict = false;
  std::string metrics_json;
  std::string tensorboard;
  std::string trace;
  std::string device = "cpu";
  std::string precision = "f32";
  bool help = false;
};

bool is_resnet(const std::string& model);

// Parses argv; throws UsageError naming the flag and what was wrong.
Options parse_args(int argc, char** argv);

}  // namespace lockstep_train
