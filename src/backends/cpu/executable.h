// The cpu backend's executable: a finished plan (passes.h) and what runs it.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "backends/backend.h"
#include "backends/cpu/passes.h"
#include "util/options.h"

namespace lockstep::backends::cpu {

class CpuExecutable final : public Executable {
 public:
  // `threads`: the OpenMP threads to run with, those its oneDNN primitives were built for.
  CpuExecutable(plan::Plan plan, int threads);

  std::vector<std::shared_ptr<Storage>> run(const std::vector<std::shared_ptr<Storage>>& inputs,
                                            const std::vector<ir::ScalarValue>& scalars,
                                            const std::vector<bool>& donatable,
                                            const std::function<void()>& past_checks) override;
  size_t planned_bytes() const override { return p_.planned.total(); }
  void check_memory(size_t limit) const override;
  void release_idle_memory() override;

 private:
  // A fine trace's event for a step that ran from `start_ns` for `took` ns (ls::profiler).
  void trace_step(const plan::Step& step, int64_t start_ns, int64_t took) const;

  plan::Plan p_;
  const int threads_;
  const bool profile_ = util::option_on(util::Option::Profile);
  const bool profile_steps_ = util::option(util::Option::Profile) == "steps";
  std::mutex mu_;                    // held by a run, so that its arena is not released under it
  std::shared_ptr<Storage> arena_;   // allocated at a run, kept for the next (unless released)
  std::shared_ptr<Storage> copies_;  // the convolutions' shared operand copies
};

}  // namespace lockstep::backends::cpu
