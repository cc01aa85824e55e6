// run_pipeline: the passes in order, the plan verifier between them (LOCKSTEP_VERIFY_PLANS), and
// the plan dumps (LOCKSTEP_DUMP, LOCKSTEP_DUMP_PASSES).
#include "plan/pipeline.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "plan/passes.h"
#include "util/check.h"
#include "util/options.h"

namespace lockstep::plan {
namespace {

// A debugging aid: a file that cannot be written never fails the compile.
void write(const std::string& path, const std::string& text) {
  if (std::FILE* f = std::fopen(path.c_str(), "w")) {
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
  }
}

}  // namespace

void run_pipeline(Plan& plan, const std::vector<Pass>& passes, const char* backend) {
  const std::string& dump = util::option(util::Option::Dump);
  const char* dir = dump.empty() ? nullptr : dump.c_str();
  const bool per_pass = dir && util::option_on(util::Option::DumpPasses);
  static std::atomic<int> counter{0};
  const int number = dir ? counter++ : 0;
#ifdef NDEBUG
  const bool verify = util::option_on(util::Option::VerifyPlans);
#else
  const bool verify = true;
#endif
  if (verify) verify_plan(plan, "the graph's lowering into a plan");
  for (size_t k = 0; k < passes.size(); ++k) {
    passes[k].run(plan);
    if (verify) verify_plan(plan, passes[k].name);
    if (per_pass)
      write(util::cat(dir, "/", backend, "-plan-", number, ".", k + 1, "-", passes[k].name, ".txt"),
            to_text(plan, true));
  }
  if (dir) write(util::cat(dir, "/", backend, "-plan-", number, ".txt"), to_text(plan));
}

}  // namespace lockstep::plan
