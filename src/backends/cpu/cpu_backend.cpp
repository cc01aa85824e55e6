// The cpu backend: its compiler, a pipeline of passes over a plan::Plan (the cpu's own passes in
// passes.h, the backend-neutral ones in plan/passes.h), and the executable that runs the result
// (executable.h).
#include "backends/cpu/cpu_backend.h"

#include <omp.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>

#include "backends/cpu/busy.h"
#include "backends/cpu/executable.h"
#include "backends/cpu/parallel.h"
#include "backends/cpu/passes.h"
#include "lockstep/runtime.h"
#include "passes/passes.h"
#include "plan/pipeline.h"
#include "util/check.h"

namespace lockstep::backends::cpu {
namespace {

std::atomic<int> g_threads{0};
// The count the last compile_setting gave (the set count, or fewer on a busy machine:
// threads_for_load), which the compile right after it builds for.
std::atomic<int> g_run_threads{0};
// What a setting of fewer threads than set says (compile_setting), and how it is recognised
// (setting_follows_load).
constexpr const char* kBusy = " set; other processes busy the cores)";

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  std::shared_ptr<Storage> alloc(size_t bytes) override { return alloc_host(bytes); }
  void copy_in(Storage& dst, const void* src, size_t bytes) override {
    std::memcpy(dst.data(), src, bytes);
  }
  void copy_out(Storage& src, void* dst, size_t bytes) override {
    std::memcpy(dst, src.data(), bytes);
  }
  // oneDNN builds each primitive for the OpenMP thread count of the thread that creates it, and
  // runs it on that many threads whatever the thread running it is set to: the passes run with
  // the compiling thread set to the count the program will run with (and the cache key holds
  // it: compile_setting, which the cache asks right before it compiles).
  std::unique_ptr<Executable> compile(const ir::Graph& graph) override {
    const int set = g_run_threads.load();
    const int threads = set > 0 ? set : num_threads();
    const ThreadCount count(threads);
    plan::Plan p(passes::regather(passes::cse(passes::simplify(graph))));
    plan::run_pipeline(p, pipeline(), "cpu");
    return std::make_unique<CpuExecutable>(std::move(p), threads);
  }
  std::string compile_setting() const override {
    const int set = num_threads(), n = threads_for_load(set);
    g_run_threads.store(n);
    std::string s = std::to_string(n) + (n == 1 ? " thread" : " threads");
    if (n != set) s += util::cat(" (", set, kBusy);
    return s;
  }
  bool setting_follows_load(const std::string& setting) const override {
    return setting.find(kBusy) != std::string::npos;
  }
};

// OpenMP's default for a thread lockstep has not set (OMP_NUM_THREADS, else every core), as
// the first caller saw it.
int default_threads() {
  static const int n = omp_get_max_threads();
  return n;
}

}  // namespace

const std::vector<plan::Pass>& pipeline() {
  static const std::vector<plan::Pass> passes = [] {
    const plan::FusionRules rules = fusion_rules();
    return std::vector<plan::Pass>{
        {"fold_constants", fold_constants},
        {"choose_fusion", [rules](plan::Plan& p) { plan::choose_fusion(p, rules); }},
        {"choose_layouts", choose_layouts},
        {"choose_conv_algorithms", choose_conv_algorithms},
        {"fuse_attention", fuse_attention},
        {"lower", lower},
        {"drop_unread_steps", plan::drop_unread_steps},
        {"merge_row_steps", merge_row_steps},
        {"merge_sums", merge_sums},
        {"merge_fused_steps", merge_fused_steps},
        {"schedule", plan::schedule},
        {"add_checks", plan::add_checks},
        {"bucket_all_reduces", bucket_all_reduces},
        {"prefetch_gathers", prefetch_gathers},
        {"join_broadcasts", join_broadcasts},
        {"overlap_broadcasts", overlap_broadcasts},
        {"share_conv_copies", share_conv_copies},
        {"plan_memory", plan::plan_memory},
    };
  }();
  return passes;
}

Backend& backend() {
  static CpuBackend* b = new CpuBackend;
  return *b;
}

void set_num_threads(int n) { g_threads.store(n < 0 ? 0 : n); }
int num_threads() {
  const int n = g_threads.load();
  return n > 0 ? n : default_threads();
}

}  // namespace lockstep::backends::cpu

namespace lockstep {

namespace {
constexpr int kMaxThreads = 1024;
}

// The thread count is the cpu backend's setting (the ref backend runs on one thread).
void set_num_threads(int n) {
  if (n < 0)
    throw Error(util::cat("set_num_threads: n must be >= 0, got ", n,
                          ". Pass a thread count, or 0 for the default"));
  // Each thread has a stack and per-thread buffers in every kernel: a count far beyond any
  // machine's cores ends the process at the next program instead of failing here.
  if (n > kMaxThreads)
    throw Error(util::cat("set_num_threads: n = ", n, " is above the limit of ", kMaxThreads,
                          " threads (this machine has ", std::thread::hardware_concurrency(),
                          " cores). Pass at most ", kMaxThreads, ", or 0 for the default"));
  backends::cpu::set_num_threads(n);
}
int num_threads() { return backends::cpu::num_threads(); }

}  // namespace lockstep
