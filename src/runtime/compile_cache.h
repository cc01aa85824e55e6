// The compile cache: built graphs (graph_builder.h) to compiled programs, keyed by the graph's
// hash and the backend's compile setting, least recently used first out; each compile explained
// (sites.h) and, with LOCKSTEP_DEBUG / LOCKSTEP_DUMP, printed and dumped.
// Not here: building graphs, or running programs (executor.h).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "dist/comm.h"
#include "runtime/graph_builder.h"

namespace lockstep::runtime {

struct CacheEntry {
  uint64_t hash;  // cache_hash: the graph's, with the backend's compile setting
  std::vector<uint64_t> key;
  std::string setting;  // Backend::compile_setting when it was compiled
  std::shared_ptr<const ir::Graph> graph;
  std::shared_ptr<backends::Executable> exe;
  // With collectives: what the ranks check they run the same of before it runs.
  std::shared_ptr<const dist::detail::Agreement> agreement;
};

// The graph lock. Graph building and the compile cache are shared by every context: one sync
// builds (and, on a miss, compiles) at a time. Building numbers nodes in scratch fields, which
// two threads sharing a node would otherwise race on. Recursive: a tensor may die while it is
// held.
std::recursive_mutex& graph_mutex();

// Under graph_mutex(): the program for `built`, from the cache or compiled now (the cache's last
// graph, for debug::last_graph_text, is then its graph). `origin` names the sync in errors,
// `site` where it is counted; `graph_ns`: how long building and hashing the graph took.
const CacheEntry& lookup_or_compile(BuiltGraph& built, const std::string& origin,
                                    const std::string& site, int64_t graph_ns);

// Nodes of the largest graph compiled so far.
int64_t largest_program();

}  // namespace lockstep::runtime
