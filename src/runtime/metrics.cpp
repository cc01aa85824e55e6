// Counters and timers that make the runtime's behaviour visible (compiles, cache hits, implicit
// syncs, transfers, time spent tracing, compiling, executing).
#include <algorithm>
#include <chrono>
#include <iomanip>
#include <map>
#include <mutex>
#include <sstream>

#include "io/json.h"
#include "lockstep/runtime.h"
#include "runtime/lazy.h"
#include "runtime/metrics.h"
#include "runtime/sites.h"
#include "util/check.h"

namespace lockstep {
namespace runtime {
namespace {

struct TimerValue {
  int64_t total_ns = 0;
  int64_t count = 0;
};

struct Metrics {
  std::mutex mu;
  std::map<std::string, int64_t, std::less<>> counters;
  std::map<std::string, TimerValue, std::less<>> timers;
};

Metrics& m() {
  static Metrics* p = new Metrics;  // used by the runtime thread until the process ends
  return *p;
}

struct Declared {
  const char* name;
  bool shown;  // report() lists it even while 0
};

const Declared kCounters[] = {
#define LS_COUNTER(id, name, shown, meaning) {name, shown},
#define LS_GAUGE(id, name, meaning)
#define LS_TIMER(id, name, shown, meaning)
#include "runtime/metrics.def"
#undef LS_COUNTER
#undef LS_GAUGE
#undef LS_TIMER
};
const char* const kGauges[] = {
#define LS_COUNTER(id, name, shown, meaning)
#define LS_GAUGE(id, name, meaning) name,
#define LS_TIMER(id, name, shown, meaning)
#include "runtime/metrics.def"
#undef LS_COUNTER
#undef LS_GAUGE
#undef LS_TIMER
};
const Declared kTimers[] = {
#define LS_COUNTER(id, name, shown, meaning)
#define LS_GAUGE(id, name, meaning)
#define LS_TIMER(id, name, shown, meaning) {name, shown},
#include "runtime/metrics.def"
#undef LS_COUNTER
#undef LS_GAUGE
#undef LS_TIMER
};

// Whether `name` is a declared counter or gauge (max_<gauge> included).
bool known_counter(std::string_view name) {
  for (const Declared& c : kCounters)
    if (name == c.name) return true;
  for (const char* g : kGauges)
    if (name == g || (name.size() > 4 && name.substr(0, 4) == "max_" && name.substr(4) == g))
      return true;
  return false;
}

std::string known_counters() {
  std::string s;
  for (const Declared& c : kCounters) s += util::cat(s.empty() ? "" : ", ", c.name);
  for (const char* g : kGauges) s += util::cat(", ", g, ", max_", g);
  return s;
}

}  // namespace

void count(Counter counter, int64_t delta) {
  std::lock_guard<std::mutex> lock(m().mu);
  m().counters[kCounters[static_cast<int>(counter)].name] += delta;
}

void gauge(Gauge gauge, int64_t v) {
  const char* name = kGauges[static_cast<int>(gauge)];
  std::lock_guard<std::mutex> lock(m().mu);
  m().counters[name] = v;
  int64_t& most = m().counters[std::string("max_") + name];
  most = std::max(most, v);
}

void time_ns(Timer timer, int64_t ns) {
  std::lock_guard<std::mutex> lock(m().mu);
  TimerValue& t = m().timers[kTimers[static_cast<int>(timer)].name];
  t.total_ns += ns;
  t.count += 1;
}

void time_kernel_ns(std::string_view label, int64_t ns) {
  std::lock_guard<std::mutex> lock(m().mu);
  auto it = m().timers.find(label);
  if (it == m().timers.end()) it = m().timers.emplace(std::string(label), TimerValue{}).first;
  it->second.total_ns += ns;
  it->second.count += 1;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace runtime

namespace metrics {

int64_t counter(const std::string& name) {
  if (!runtime::known_counter(name))
    throw Error(util::cat("ls::metrics::counter: no counter named '", name,
                          "'. The counters are: ", runtime::known_counters()));
  auto& mm = runtime::m();
  std::lock_guard<std::mutex> lock(mm.mu);
  auto it = mm.counters.find(name);
  return it == mm.counters.end() ? 0 : it->second;
}

namespace {
// A declared timer (0 until it runs), or a kernel's timer that has run (LOCKSTEP_PROFILE).
runtime::TimerValue timer(const std::string& name) {
  auto& mm = runtime::m();
  std::lock_guard<std::mutex> lock(mm.mu);
  auto it = mm.timers.find(name);
  if (it != mm.timers.end()) return it->second;
  std::string declared;
  for (const runtime::Declared& t : runtime::kTimers) {
    if (name == t.name) return {};
    declared += util::cat(declared.empty() ? "" : ", ", t.name);
  }
  throw Error(util::cat("ls::metrics: no timer named '", name, "'. The timers are: ", declared,
                        ", and under LOCKSTEP_PROFILE one per kind of kernel that has run"));
}
}  // namespace

int64_t timer_total_ns(const std::string& name) { return timer(name).total_ns; }

int64_t timer_count(const std::string& name) { return timer(name).count; }

void reset() {
  auto& mm = runtime::m();
  std::lock_guard<std::mutex> lock(mm.mu);
  mm.counters.clear();
  mm.timers.clear();
  runtime::reset_sites();
}

std::string report() {
  auto& mm = runtime::m();
  std::lock_guard<std::mutex> lock(mm.mu);
  std::ostringstream os;
  os << std::left << std::setw(20) << "counter" << std::right << std::setw(16) << "value"
     << "\n";
  auto row = [&](const std::string& name, int64_t v) {
    os << std::left << std::setw(20) << name << std::right << std::setw(16) << v << "\n";
  };
  for (const runtime::Declared& c : runtime::kCounters) {
    if (!c.shown) continue;
    auto it = mm.counters.find(c.name);
    row(c.name, it == mm.counters.end() ? 0 : it->second);
  }
  for (const auto& [name, v] : mm.counters) {
    bool shown = false;
    for (const runtime::Declared& c : runtime::kCounters)
      shown = shown || (c.shown && name == c.name);
    if (!shown) row(name, v);
  }
  os << "\n"
     << std::left << std::setw(20) << "timer" << std::right << std::setw(10) << "count"
     << std::setw(14) << "total ms" << std::setw(14) << "mean ms"
     << "\n";
  std::vector<std::string> names;
  for (const runtime::Declared& t : runtime::kTimers)
    if (t.shown) names.push_back(t.name);
  for (const auto& [name, t] : mm.timers)
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  for (const std::string& name : names) {
    auto it = mm.timers.find(name);
    const runtime::TimerValue t = it == mm.timers.end() ? runtime::TimerValue{} : it->second;
    os << std::left << std::setw(20) << name << std::right << std::setw(10) << t.count
       << std::setw(14) << std::fixed << std::setprecision(3) << t.total_ns / 1e6 << std::setw(14)
       << (t.count ? t.total_ns / 1e6 / static_cast<double>(t.count) : 0.0) << "\n";
  }
  const std::vector<debug::SiteStats> sites = debug::sites();
  if (!sites.empty()) {
    os << "\n"
       << std::left << std::setw(10) << "syncs" << std::setw(10) << "compiles" << std::setw(10)
       << "hits" << std::setw(10) << "in step" << std::setw(12) << "nodes" << std::setw(14)
       << "planned MiB"
       << "site\n";
    for (const debug::SiteStats& s : sites)
      os << std::left << std::setw(10) << s.syncs << std::setw(10) << s.compiles << std::setw(10)
         << s.cache_hits << std::setw(10) << s.in_step << std::setw(12) << s.nodes << std::setw(14)
         << std::fixed << std::setprecision(2) << static_cast<double>(s.planned_bytes) / (1 << 20)
         << s.site << "\n";
    // Per site and phase: median and 90th percentile of the last samples, in ms.
    os << "\n"
       << std::left << std::setw(10) << "phase" << std::setw(10) << "count" << std::right
       << std::setw(12) << "median ms" << std::setw(12) << "p90 ms"
       << "  site\n";
    for (const debug::SiteStats& s : sites) {
      const auto timings = runtime::site_timings(s.site);
      for (int k = 0; k < runtime::kSitePhases; ++k) {
        if (!timings[k].count) continue;
        os << std::left << std::setw(10) << runtime::phase_name(static_cast<runtime::SitePhase>(k))
           << std::setw(10) << timings[k].count << std::right << std::setw(12) << std::fixed
           << std::setprecision(3) << timings[k].median_ms << std::setw(12) << timings[k].p90_ms
           << "  " << s.site << "\n";
      }
    }
  }
  return os.str();
}

std::string report_json() {
  using io::json::append_string;
  std::string out = "{\"schema\": \"lockstep-metrics/1\", \"counters\": {";
  {
    auto& mm = runtime::m();
    std::lock_guard<std::mutex> lock(mm.mu);
    std::map<std::string, int64_t, std::less<>> counters(mm.counters.begin(), mm.counters.end());
    for (const runtime::Declared& c : runtime::kCounters)
      if (c.shown) counters.try_emplace(c.name, 0);
    bool first = true;
    for (const auto& [name, v] : counters) {
      if (!first) out += ", ";
      first = false;
      append_string(out, name);
      out += ": " + std::to_string(v);
    }
    out += "}, \"timers\": {";
    first = true;
    for (const auto& [name, t] : mm.timers) {
      if (!first) out += ", ";
      first = false;
      append_string(out, name);
      out += ": {\"count\": " + std::to_string(t.count) +
             ", \"total_ns\": " + std::to_string(t.total_ns) + "}";
    }
  }
  out += "}, \"sites\": [";
  bool first = true;
  for (const debug::SiteStats& s : debug::sites()) {
    if (!first) out += ", ";
    first = false;
    out += "{\"site\": ";
    append_string(out, s.site);
    for (const auto& [key, v] : {std::pair<const char*, int64_t>{"syncs", s.syncs},
                                 {"compiles", s.compiles},
                                 {"cache_hits", s.cache_hits},
                                 {"nodes", s.nodes},
                                 {"graphs", s.graphs},
                                 {"in_step", s.in_step},
                                 {"planned_bytes", s.planned_bytes}})
      out += std::string(", \"") + key + "\": " + std::to_string(v);
    out += ", \"misses\": {";
    bool first_miss = true;
    for (const auto& [reason, n] : s.misses) {
      if (!first_miss) out += ", ";
      first_miss = false;
      append_string(out, reason);
      out += ": " + std::to_string(n);
    }
    out += "}, \"timers\": {";
    const auto timings = runtime::site_timings(s.site);
    for (int k = 0; k < runtime::kSitePhases; ++k) {
      char text[128];
      std::snprintf(
          text, sizeof text, "%s\"%s\": {\"count\": %lld, \"median_ms\": %.6f, \"p90_ms\": %.6f}",
          k ? ", " : "", runtime::phase_name(static_cast<runtime::SitePhase>(k)),
          static_cast<long long>(timings[k].count), timings[k].median_ms, timings[k].p90_ms);
      out += text;
    }
    out += "}}";
  }
  out += "], \"last_cache_miss\": ";
  const debug::CacheMiss m = debug::last_cache_miss();
  if (m.site.empty()) {
    out += "null";
  } else {
    out += "{\"site\": ";
    append_string(out, m.site);
    out += std::string(", \"first\": ") + (m.first ? "true" : "false");
    out += ", \"node\": " + std::to_string(m.node);
    for (const auto& [key, v] : {std::pair<const char*, const std::string*>{"op", &m.op},
                                 {"field", &m.field},
                                 {"before", &m.before},
                                 {"after", &m.after},
                                 {"where", &m.where},
                                 {"module", &m.module}}) {
      out += std::string(", \"") + key + "\": ";
      append_string(out, *v);
    }
    out += ", \"more\": " + std::to_string(m.more) + ", \"hint\": ";
    append_string(out, m.hint);
    out += ", \"text\": ";
    append_string(out, m.text);
    out += "}";
  }
  return out + "}";
}

}  // namespace metrics
}  // namespace lockstep
