// Sites (sites.h): what was built where, why it compiled, churn hints, the steady contract.
#include "runtime/sites.h"

#include <algorithm>
#include <iostream>
#include <map>
#include <mutex>
#include <string_view>
#include <unordered_map>

#include "ir/random_bits.h"
#include "runtime/explain.h"
#include "runtime/metrics.h"
#include "util/check.h"
#include "util/frames.h"

namespace lockstep {
namespace runtime {
namespace {

using util::cat;

// Earlier graphs kept per site for explanations (the most recent ones).
constexpr size_t kKeptGraphs = 16;
// Misses in a row that differ in the same node's same field before the churn hint.
constexpr int kChurnRepeats = 3;
// Compiles in a row at one site, each larger than the one before with the same outputs, before
// the warning of a loop without a step boundary.
constexpr size_t kGrowingCompiles = 4;

struct Site {
  debug::SiteStats stats;
  std::vector<std::shared_ptr<const ir::Graph>> graphs;
  std::string last_key;  // the last miss's node, field and line
  int repeats = 0;
  std::vector<std::string> hinted;  // keys already given a hint
  std::vector<int64_t> growing;     // node counts of the last compiles, each larger than the last
  bool growth_warned = false;
  int64_t steady_base = 0;  // syncs when expect_steady was called
  // Per phase: the last kTimingSamples durations (a ring), and how many were taken.
  std::array<std::vector<int64_t>, kSitePhases> samples;
  std::array<int64_t, kSitePhases> taken{};
};

struct Sites {
  std::mutex mu;  // for the readers of debug::sites() and last_cache_miss() on other threads
  std::map<std::string, Site> by_name;
  std::vector<std::string> order;
  debug::CacheMiss last;
  bool steady = false;
  int64_t steady_after = 0;
  debug::OnRecompile policy = debug::OnRecompile::Throw;
  int64_t implicit_per_step = -1;  // the contract's bound on implicit syncs per step (-1: none)
};

Sites& sites() {
  static Sites* s = new Sites;
  return *s;
}

Site& site(Sites& s, const std::string& name) {
  auto [it, fresh] = s.by_name.try_emplace(name);
  if (fresh) {
    it->second.stats.site = name;
    s.order.push_back(name);
  }
  return it->second;
}

// A sample of the site's timer for `phase`, into its ring of the last kTimingSamples.
void record_time(Site& st, SitePhase phase, int64_t ns) {
  const auto k = static_cast<size_t>(phase);
  std::vector<int64_t>& ring = st.samples[k];
  if (ring.size() < kTimingSamples)
    ring.push_back(ns);
  else
    ring[static_cast<size_t>(st.taken[k]) % kTimingSamples] = ns;
  ++st.taken[k];
}

std::string hint_for(const debug::CacheMiss& m) {
  const std::string at = m.where.empty() ? "" : cat(" of the ", m.op, " at ", m.where);
  if (m.field == "shape")
    return cat("the shape", at,
               " changes from step to step: each new shape compiles a new "
               "program. Keep shapes fixed (pad to one size, drop the last smaller batch)");
  if (m.field == "attributes")
    return cat("an attribute", at,
               " changes from step to step: a value baked into the graph. "
               "Pass it as a tensor or a host scalar (a runtime input) instead");
  if (m.field == "dtype") return cat("the dtype", at, " changes from step to step: cast once");
  return cat("the graph's structure", at, " changes from step to step (", m.field,
             "): record the same ops every step");
}

// Whether every node of `before` has one in `now` with its op, dtype, shape and line (as
// multisets): `now` computes what `before` did and more.
bool contains(const ir::Graph& now, const ir::Graph& before) {
  auto signature = [](const ir::GraphNode& n) {
    uint64_t h = ir::mix64(static_cast<uint64_t>(n.op) * 131 + static_cast<uint64_t>(n.dtype));
    for (int64_t d : n.shape) h = ir::mix64(h ^ static_cast<uint64_t>(d));
    h = ir::mix64(h ^ std::hash<std::string_view>{}(n.origin.loc.file_name()));
    return ir::mix64(h ^ n.origin.loc.line());
  };
  std::unordered_map<uint64_t, int64_t> have;
  for (const ir::GraphNode& n : now.nodes) ++have[signature(n)];
  for (const ir::GraphNode& n : before.nodes)
    if (--have[signature(n)] < 0) return false;
  return true;
}

// A loop without a step boundary: values updated in place each iteration (parameters,
// optimizer state) stay pending, so each read at the site computes every iteration so far and
// compiles a program larger than the last. Once per site, after kGrowingCompiles such compiles
// in a row, the warning's text (empty otherwise).
std::string growth_warning(Site& st, const ir::Graph& now, const std::string& name) {
  const auto nodes = static_cast<int64_t>(now.nodes.size());
  const bool grew =
      !st.graphs.empty() && nodes > static_cast<int64_t>(st.graphs.back()->nodes.size()) &&
      now.outputs.size() == st.graphs.back()->outputs.size() && contains(now, *st.graphs.back());
  if (!grew) st.growing.clear();
  st.growing.push_back(nodes);
  if (st.growth_warned || st.growing.size() < kGrowingCompiles) return "";
  st.growth_warned = true;
  std::string sizes;
  for (size_t i = st.growing.size() - kGrowingCompiles; i < st.growing.size(); ++i)
    sizes += cat(i + kGrowingCompiles == st.growing.size() ? "" : ", ", st.growing[i]);
  std::map<std::string, int64_t> by_line;
  for (bool library : {false, true}) {  // the user's lines; lockstep's only when none is
    for (const ir::GraphNode& n : now.nodes)
      if (n.op != ir::Op::Data && n.op != ir::Op::Scalar &&
          (library || !util::in_library(n.origin.loc)))
        ++by_line[util::where(n.origin.loc)];
    if (!by_line.empty()) break;
  }
  const std::string lines = most_nodes_text(by_line);
  return cat(name, " compiled a larger program at each of its last ", kGrowingCompiles, " syncs (",
             sizes,
             " nodes): values updated in place each iteration (parameters, optimizer state) "
             "are never computed on their own, so each sync here computes every iteration so "
             "far again and compiles anew. Wrap each iteration in ls::step (or end it with "
             "ls::sync()). Most nodes come from ",
             lines,
             ". From now on each read here also computes the pending values that share its "
             "history, so that the next starts from them");
}

}  // namespace

std::string most_nodes_text(const std::map<std::string, int64_t>& by_line) {
  std::vector<std::pair<int64_t, std::string>> top;
  for (const auto& [line, n] : by_line) top.emplace_back(-n, line);
  std::sort(top.begin(), top.end());
  std::string lines;
  for (size_t k = 0; k < top.size() && k < 3; ++k)
    lines += cat(k ? ", " : "", top[k].second, " (", -top[k].first, " nodes)");
  return lines;
}

void site_sync(const std::string& name, int64_t nodes, bool hit, int64_t graph_ns) {
  Sites& s = sites();
  std::lock_guard<std::mutex> lock(s.mu);
  Site& st = site(s, name);
  ++st.stats.syncs;
  st.stats.nodes += nodes;
  if (hit) ++st.stats.cache_hits;
  record_time(st, SitePhase::Graph, graph_ns);
}

void site_in_step(const std::string& name, int64_t nth, const std::string& step_origin) {
  Sites& s = sites();
  std::lock_guard<std::mutex> lock(s.mu);
  ++site(s, name).stats.in_step;
  if (!s.steady || s.implicit_per_step < 0 || nth <= s.implicit_per_step) return;
  const std::string text =
      cat("steady state broken: ", name, " is implicit sync number ", nth, " inside ", step_origin,
          ", more than the ", s.implicit_per_step,
          " per step ls::debug::expect_steady allows: each one cuts the step's program in two "
          "and waits for the first part. Read the value after the step, or in a step closure "
          "(ls::add_step_closure)");
  if (s.policy == debug::OnRecompile::Throw) throw Error(text);
  std::cerr << "lockstep: warning: " << text << "\n";
}

bool site_grows(const std::string& name) {
  Sites& s = sites();
  std::lock_guard<std::mutex> lock(s.mu);
  const auto it = s.by_name.find(name);
  return it != s.by_name.end() && it->second.growth_warned;
}

debug::CacheMiss site_miss(const std::string& name, const ir::Graph& now, bool print,
                           const std::string& setting_change, bool load_follows) {
  Sites& s = sites();
  std::unique_lock<std::mutex> lock(s.mu);
  Site& st = site(s, name);
  debug::CacheMiss m = explain_miss(name, st.stats.compiles, st.graphs, now, setting_change);
  // Churn: the same node's same field, missing again and again.
  const std::string key = m.first ? "" : cat(m.node, " ", m.field, " ", m.where);
  st.repeats = !key.empty() && key == st.last_key ? st.repeats + 1 : 1;
  st.last_key = key;
  bool quiet = false;
  if (!key.empty() && st.repeats >= kChurnRepeats) {
    if (std::find(st.hinted.begin(), st.hinted.end(), key) == st.hinted.end()) {
      st.hinted.push_back(key);
      m.hint = hint_for(m);
      m.text += cat(". Hint: ", m.hint);
    } else {
      quiet = true;  // hinted once; the same report again says nothing new
    }
  }
  ++st.stats.misses[m.first ? "first" : m.field];
  s.last = m;
  const std::string growth = growth_warning(st, now, name);
  const bool broken = s.steady && st.stats.syncs - st.steady_base > s.steady_after && !load_follows;
  const debug::OnRecompile policy = s.policy;
  lock.unlock();
  if (print && !quiet) std::cerr << "lockstep: " << m.text << "\n";
  if (!growth.empty()) {
    count(Counter::GrowingProgramWarnings);
    std::cerr << "lockstep: warning: " << growth << "\n";
  }
  if (broken) {
    const std::string what = cat("expect_steady: a compile past the steady state: ", m.text,
                                 ". Nothing was compiled or run");
    if (policy == debug::OnRecompile::Throw) throw Error(what);
    std::cerr << "lockstep: warning: " << what << "\n";
  }
  return m;
}

void site_compiled(const std::string& name, std::shared_ptr<const ir::Graph> graph,
                   int64_t planned_bytes) {
  Sites& s = sites();
  std::lock_guard<std::mutex> lock(s.mu);
  Site& st = site(s, name);
  st.stats.planned_bytes = std::max(st.stats.planned_bytes, planned_bytes);
  ++st.stats.compiles;
  ++st.stats.graphs;
  st.graphs.push_back(std::move(graph));
  if (st.graphs.size() > kKeptGraphs) st.graphs.erase(st.graphs.begin());
}

const char* phase_name(SitePhase phase) {
  switch (phase) {
    case SitePhase::Trace:
      return "trace";
    case SitePhase::Graph:
      return "graph";
    case SitePhase::Compile:
      return "compile";
    case SitePhase::Execute:
      return "execute";
  }
  return "?";
}

void site_time(const std::string& name, SitePhase phase, int64_t ns) {
  Sites& s = sites();
  std::lock_guard<std::mutex> lock(s.mu);
  record_time(site(s, name), phase, ns);
}

std::array<PhaseTiming, kSitePhases> site_timings(const std::string& name) {
  std::array<PhaseTiming, kSitePhases> out{};
  std::array<std::vector<int64_t>, kSitePhases> samples;
  {
    Sites& s = sites();
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.by_name.find(name);
    if (it == s.by_name.end()) return out;
    samples = it->second.samples;
    for (int k = 0; k < kSitePhases; ++k) out[k].count = it->second.taken[k];
  }
  // Nearest-rank percentiles of the kept samples.
  auto at = [](std::vector<int64_t>& v, double q) {
    const size_t i = static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(i), v.end());
    return static_cast<double>(v[i]) / 1e6;
  };
  for (int k = 0; k < kSitePhases; ++k) {
    if (samples[k].empty()) continue;
    out[k].median_ms = at(samples[k], 0.5);
    out[k].p90_ms = at(samples[k], 0.9);
  }
  return out;
}

void reset_sites() {
  Sites& s = sites();
  std::lock_guard<std::mutex> lock(s.mu);
  for (auto& [name, st] : s.by_name) {
    const int64_t graphs = st.stats.graphs;
    st.stats = {};
    st.stats.site = name;
    st.stats.graphs = graphs;
    st.steady_base = 0;
    for (auto& v : st.samples) v.clear();
    st.taken = {};
  }
  s.last = {};
}

}  // namespace runtime

namespace debug {

std::vector<SiteStats> sites() {
  runtime::Sites& s = runtime::sites();
  std::lock_guard<std::mutex> lock(s.mu);
  std::vector<SiteStats> out;
  for (const std::string& name : s.order) out.push_back(s.by_name.at(name).stats);
  return out;
}

CacheMiss last_cache_miss() {
  runtime::Sites& s = runtime::sites();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.last;
}

void expect_steady(int64_t after_syncs, OnRecompile policy, int64_t implicit_syncs_per_step) {
  if (after_syncs < 0)
    throw Error(util::cat("expect_steady: after_syncs must be >= 0, got ", after_syncs));
  if (implicit_syncs_per_step < -1)
    throw Error(
        util::cat("expect_steady: implicit_syncs_per_step must be >= 0 (or -1: no bound), "
                  "got ",
                  implicit_syncs_per_step));
  runtime::Sites& s = runtime::sites();
  std::lock_guard<std::mutex> lock(s.mu);
  s.steady = true;
  s.steady_after = after_syncs;
  s.policy = policy;
  s.implicit_per_step = implicit_syncs_per_step;
  for (auto& [name, st] : s.by_name) st.steady_base = st.stats.syncs;
}

void stop_expecting_steady() {
  runtime::Sites& s = runtime::sites();
  std::lock_guard<std::mutex> lock(s.mu);
  s.steady = false;
}

}  // namespace debug
}  // namespace lockstep
