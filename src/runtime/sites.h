// Per-site records of the runtime (lockstep/runtime.h, debug::sites): counts, the graphs
// compiled at each site (for cache-miss explanations), churn hints and the steady-state
// contract. Every function is called with the runtime's graph lock held.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "ir/ir.h"
#include "lockstep/runtime.h"

namespace lockstep::runtime {

// A program of `nodes` nodes was built at `site` in `graph_ns` (a sample of its graph timer);
// `hit`: found in the compile cache (one lock and lookup per program on the hot path).
void site_sync(const std::string& site, int64_t nodes, bool hit, int64_t graph_ns);
// An implicit sync at `site` is about to cut the recording of step `step_origin` short, its
// `nth` in that step: counted, and checked against the steady contract's bound on implicit syncs
// per step (throws Error, before anything is synced, under the Throw policy).
void site_in_step(const std::string& site, int64_t nth, const std::string& step_origin);
// A cache miss at `site` for graph `now`: the explanation (recorded as the last miss, printed
// with `print`). Throws Error, before anything is compiled, when expect_steady forbids it.
// `setting_change`: as explain_miss's; `load_follows`: the setting changed for the machine's load
// (Backend::setting_follows_load), which the steady contract does not count.
debug::CacheMiss site_miss(const std::string& site, const ir::Graph& now, bool print,
                           const std::string& setting_change = "", bool load_follows = false);
// Whether `site` was warned of a program growing from read to read (a loop without a step): its
// reads outside a step then also compute the pending values that share their history
// (materialize), so that the next one starts from computed values.
bool site_grows(const std::string& site);
// The graph compiled for the miss, kept as a candidate for later explanations at `site`.
// `planned_bytes`: what its program plans to take when it runs (Executable::planned_bytes).
void site_compiled(const std::string& site, std::shared_ptr<const ir::Graph> graph,
                   int64_t planned_bytes);
// Per-site timers: a step's tracing, building and hashing a program's graph, compiling it,
// running it (on the runtime thread). The last kTimingSamples samples of each are kept.
enum class SitePhase { Trace, Graph, Compile, Execute };
inline constexpr int kSitePhases = 4;
inline constexpr size_t kTimingSamples = 1024;
const char* phase_name(SitePhase phase);
void site_time(const std::string& site, SitePhase phase, int64_t ns);
struct PhaseTiming {
  int64_t count = 0;                 // samples since metrics::reset()
  double median_ms = 0, p90_ms = 0;  // over the last kTimingSamples
};
std::array<PhaseTiming, kSitePhases> site_timings(const std::string& site);

// "train.cpp:42 (120 nodes), ...": the three lines that recorded the most nodes, most first.
std::string most_nodes_text(const std::map<std::string, int64_t>& by_line);

// metrics::reset(): counts restart; compiled graphs are kept (the cache keeps its programs).
void reset_sites();

}  // namespace lockstep::runtime
