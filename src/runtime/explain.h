// Why a program was compiled: the difference between a new graph and the nearest graph compiled
// before at the same site (a step or sync's source line), node by node in the canonical order
// the graph builder numbers them in. Only computed on a cache miss.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ir/ir.h"
#include "lockstep/runtime.h"

namespace lockstep::runtime {

// The first difference between `before` and `now` (both canonical), and how many nodes differ.
struct GraphDifference {
  int64_t node = -1;  // index in `now` (or `before` when `now` is shorter); -1: equal
  std::string field;  // "op", "dtype", "shape", "attributes", "operands", "input", "nodes"
  std::string before, after;
  int64_t common_prefix = 0;  // equal nodes before the first difference
  int64_t differing = 0;      // nodes that differ (including extra ones)
};
GraphDifference difference(const ir::Graph& before, const ir::Graph& now);

// The nearest of `candidates` to `now`: the longest common prefix, then the fewest differing
// nodes, then the most recent (the last). -1 when there are none.
int nearest(const std::vector<std::shared_ptr<const ir::Graph>>& candidates, const ir::Graph& now,
            GraphDifference* diff);

// The explanation of a miss at `site` (the site's `compiles_before` earlier graphs are
// `candidates`), with the debug::CacheMiss fields filled and its text. `setting_change`: when
// the compile cache holds this graph compiled for another backend setting, what changed
// (Backend::compile_setting, "cpu: 2 threads before, 1 thread now").
debug::CacheMiss explain_miss(const std::string& site, int64_t compiles_before,
                              const std::vector<std::shared_ptr<const ir::Graph>>& candidates,
                              const ir::Graph& now, const std::string& setting_change = "");

}  // namespace lockstep::runtime
