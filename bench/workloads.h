// The three training workloads lockstep is measured on, shared by the lockstep benchmark and
// its libtorch twin (bench/peers/torch_train.cpp) so both run the same shapes and steps:
// MLP 784-1024-1024-10 batch 128; ResNet-18 (32x32, small stem) batch 64; ResNet-50 64x64
// batch 16; and for the bf16 benchmark (scripts/bench-bf16) ResNet-50 96x96 (ImageNet stem)
// batch 16. SGD with momentum 0.9, lr 0.01, fake data (a fixed random batch), 10 classes.
#pragma once

#include <sys/resource.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

struct Workload {
  std::string name;
  int64_t batch, channels, image;  // image 0: flat 784-feature input (the MLP)
};

inline Workload workload_by_name(const std::string& name) {
  if (name == "mlp") return {"mlp", 128, 1, 0};
  if (name == "resnet18") return {"resnet18", 64, 3, 32};
  if (name == "resnet50") return {"resnet50", 16, 3, 64};
  if (name == "resnet50_96") return {"resnet50_96", 16, 3, 96};
  if (name == "resnet50_224") return {"resnet50_224", 32, 3, 224};  // ImageNet's shape
  // lockstep-train's Fashion-MNIST CNN ((conv 3x3, batch norm, relu, max pool) x 2, two linear
  // layers) at two batch sizes.
  if (name == "cnn") return {"cnn", 64, 1, 28};
  if (name == "cnn256") return {"cnn256", 256, 1, 28};
  std::fprintf(stderr,
               "unknown workload '%s' (mlp, cnn, cnn256, resnet18, resnet50, resnet50_96, "
               "resnet50_224)\n",
               name.c_str());
  std::exit(2);
}

// Peak resident memory of this process, in MiB.
inline double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

// One result line, parsed by scripts/bench:
//   result <workload> <framework> first_step_ms <x> img_per_s <x> peak_mib <x> gflops <x>
// trace_ms: host time per step tracing and hashing while the previous step runs (competing
// for the cores); trace_idle_ms: the same with the cores idle (the work itself).
inline void print_result(const std::string& workload, const char* framework, double first_ms,
                         double img_per_s, double gflop_per_step, double step_s, double trace_ms,
                         double trace_idle_ms) {
  std::printf(
      "result %s %s first_step_ms %.1f img_per_s %.2f peak_mib %.1f gflops %.2f trace_ms %.3f "
      "trace_idle_ms %.3f\n",
      workload.c_str(), framework, first_ms, img_per_s, peak_rss_mib(), gflop_per_step / step_s,
      trace_ms, trace_idle_ms);
  std::fflush(stdout);
}
