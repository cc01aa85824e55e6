// lockstep's side of the framework comparison (scripts/bench runs it against
// bench/peers/torch_train.cpp, alternating): trains one workload of workloads.h on fake data
// and prints first-step latency, images/second over the timed steps, peak memory, achieved
// GFLOP/s and the host time spent tracing and hashing a step.
//   train_bench <mlp|cnn|cnn256|resnet18|resnet50|resnet50_96|resnet50_224> [timed_steps] [threads]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <unordered_set>

#include <lockstep/lockstep.h>
#include "ir/ir.h"
#include "runtime/lazy.h"
#include "workload_models.h"

namespace ls = lockstep;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// FLOPs of the matmuls and convolutions in the graph behind `roots` (multiply-adds count 2).
double graph_gflop(const std::vector<ls::Tensor>& roots) {
  using ls::ir::Op;
  std::unordered_set<const ls::ir::Node*> seen;
  std::vector<const ls::ir::Node*> stack;
  for (const ls::Tensor& t : roots) stack.push_back(t.impl()->node.get());
  double flop = 0;
  while (!stack.empty()) {
    const ls::ir::Node* n = stack.back();
    stack.pop_back();
    if (!seen.insert(n).second) continue;
    for (const auto& o : n->operands) stack.push_back(o.get());
    switch (n->op) {
      case Op::MatMul: {
        const auto& a = n->operands[0]->shape;
        flop +=
            2.0 * static_cast<double>(ls::shape_numel(n->shape)) * static_cast<double>(a.back());
        break;
      }
      case Op::Conv2d:
      case Op::Conv2dBackwardInput:
      case Op::Conv2dBackwardWeight: {
        // Every variant does the forward's multiply-adds: out elements x (C/g * kh * kw).
        const ls::Shape& y = n->op == Op::Conv2d                ? n->shape
                             : n->op == Op::Conv2dBackwardInput ? n->operands[0]->shape
                                                                : n->operands[1]->shape;
        const ls::Shape& w = n->op == Op::Conv2d                ? n->operands[1]->shape
                             : n->op == Op::Conv2dBackwardInput ? n->operands[1]->shape
                                                                : n->shape;
        flop +=
            2.0 * static_cast<double>(ls::shape_numel(y)) * static_cast<double>(w[1] * w[2] * w[3]);
        break;
      }
      default:
        break;
    }
  }
  return flop / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  ls::apply_thread_wait_default(argv);  // how OpenMP threads wait, before they start
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: train_bench <mlp|cnn|cnn256|resnet18|resnet50|resnet50_96|resnet50_224> "
                 "[timed_steps] [threads] "
                 "[f32|bf16]\n");
    return 2;
  }
  const Workload w = workload_by_name(argv[1]);
  const int steps = argc > 2 ? std::atoi(argv[2]) : 20;
  if (argc > 3) ls::set_num_threads(std::atoi(argv[3]));
  // bf16: every step under autocast (lockstep/autocast.h).
  const std::string precision = argc > 4 ? argv[4] : "f32";
  if (precision != "f32" && precision != "bf16") {
    std::fprintf(stderr, "train_bench: precision must be f32 or bf16, got '%s'\n",
                 precision.c_str());
    return 2;
  }
  ls::StepOptions step_options;
  if (precision == "bf16") step_options.autocast = ls::bf16;
  ls::manual_seed(0);
  const std::shared_ptr<ls::nn::Module> model = make_model(w);
  ls::optim::SGD opt(model->parameters(), {.lr = 0.01, .momentum = 0.9});
  const FixedBatch batch = fixed_batch(w);
  const ls::Tensor &images = batch.images, &labels = batch.labels;
  ls::sync();
  ls::wait();

  ls::Tensor loss;
  double gflop = 0;
  auto body = [&] {
    opt.zero_grad();
    loss = ls::nn::cross_entropy((*model)(images), labels);
    loss.backward();
    opt.step();
    if (gflop == 0) gflop = graph_gflop(model->parameters());  // the updated parameters
  };
  // First step: trace + compile + run, until its values are ready.
  auto t0 = std::chrono::steady_clock::now();
  ls::step(body, step_options);
  ls::wait();
  const double first_ms = seconds_since(t0) * 1e3;
  for (int i = 0; i < 2; ++i)
    ls::step(body, step_options);  // the steady-state program compiles here
  ls::wait();
  const int64_t trace0 =
      ls::metrics::timer_total_ns("trace") + ls::metrics::timer_total_ns("graph");
  t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) ls::step(body, step_options);
  ls::wait();
  const double s = seconds_since(t0);
  const double trace_ms =
      (ls::metrics::timer_total_ns("trace") + ls::metrics::timer_total_ns("graph") - trace0) / 1e6 /
      steps;
  // Tracing and hashing with idle cores: each step waits for the previous one first.
  constexpr int kIdleSteps = 5;
  int64_t idle_ns = 0;
  for (int i = 0; i < kIdleSteps; ++i) {
    ls::wait();
    const int64_t before =
        ls::metrics::timer_total_ns("trace") + ls::metrics::timer_total_ns("graph");
    ls::step(body, step_options);
    idle_ns += ls::metrics::timer_total_ns("trace") + ls::metrics::timer_total_ns("graph") - before;
  }
  ls::wait();
  std::printf("kernels %s\n", ls::cpu_kernels(precision == "bf16" ? ls::bf16 : ls::f32).c_str());
  std::printf("loss %.4f compiles %ld\n", static_cast<double>(loss.item<float>()),
              static_cast<long>(ls::metrics::counter("compiles")));
  if (std::getenv("LOCKSTEP_PROFILE")) std::printf("%s", ls::metrics::report().c_str());
  const std::string framework = precision == "f32" ? "lockstep" : "lockstep-bf16";
  print_result(w.name, framework.c_str(), first_ms, steps * w.batch / s, gflop, s / steps, trace_ms,
               idle_ns / 1e6 / kIdleSteps);
  return 0;
}
