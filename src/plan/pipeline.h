// A compiler as a list of named passes over a Plan, run in order. With LOCKSTEP_DUMP=DIR the
// final plan goes to DIR/<backend>-plan-<n>.txt; with LOCKSTEP_DUMP_PASSES=1 as well, the plan
// after each pass goes to DIR/<backend>-plan-<n>.<k>-<pass>.txt (with every node's decisions), so
// that a decision can be traced to the pass that made it.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "plan/plan.h"

namespace lockstep::plan {

struct Pass {
  const char* name;
  std::function<void(Plan&)> run;
};

void run_pipeline(Plan& plan, const std::vector<Pass>& passes, const char* backend);

}  // namespace lockstep::plan
