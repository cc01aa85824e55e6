// The compile cache (compile_cache.h).
#include "runtime/compile_cache.h"

#include <atomic>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <list>
#include <unordered_map>

#include "dist/comm.h"
#include "ir/random_bits.h"
#include "lockstep/runtime.h"
#include "runtime/metrics.h"
#include "runtime/profiler.h"
#include "runtime/sites.h"
#include "util/check.h"
#include "util/options.h"

namespace lockstep::runtime {
namespace {

using util::cat;

struct Cache {
  std::recursive_mutex mu;    // graph_mutex()
  std::list<CacheEntry> lru;  // front: most recently used
  std::unordered_map<uint64_t, std::list<CacheEntry>::iterator> cache;
  size_t capacity = 1024;  // see set_compile_cache_capacity
  std::shared_ptr<const ir::Graph> last_graph;
  std::atomic<int64_t> largest{0};  // nodes of the largest graph compiled so far
  bool debug = util::option_on(util::Option::Debug);
  const char* dump_dir =
      util::option(util::Option::Dump).empty() ? nullptr : util::option(util::Option::Dump).c_str();

  void trim() {
    while (lru.size() > capacity) {
      cache.erase(lru.back().hash);
      lru.pop_back();
    }
  }
};

// Programs cached but not run lately keep no arena: the one a compile or a hit pushes past the
// kArenasKept most recently used gives its arena back (its next run takes one again, from the
// host memory kept for reuse). The 64 programs of a loop over many batch sizes held 64 arenas.
constexpr size_t kArenasKept = 8;

void release_past_recent(Cache& r) {
  if (r.lru.size() > kArenasKept) std::next(r.lru.begin(), kArenasKept)->exe->release_idle_memory();
}

Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: programs may run after main() returns
  return *c;
}

// The compile cache's key for a graph: its hash, with what the backend's programs also depend on
// (Backend::compile_setting).
uint64_t cache_hash(uint64_t graph_hash, const std::string& setting) {
  return setting.empty() ? graph_hash
                         : graph_hash ^ ir::mix64(std::hash<std::string>{}(setting) + 1);
}

}  // namespace

std::recursive_mutex& graph_mutex() { return cache().mu; }

int64_t largest_program() { return cache().largest.load(); }

// `graph_ns`: how long building and hashing the graph took (a sample of the site's timer).
const CacheEntry& lookup_or_compile(BuiltGraph& built, const std::string& origin,
                                    const std::string& site, int64_t graph_ns) {
  Cache& r = cache();
  prof::Span span("compile", "cache hit");
  if (span) span.arg("site", site), span.arg("nodes", built.order.size());
  backends::Backend& backend = backends::backend_for(built.graph.device);
  std::string setting = backend.compile_setting();
  const uint64_t hash = cache_hash(built.hash, setting);
  auto it = r.cache.find(hash);
  if (it != r.cache.end() && it->second->key == built.key && it->second->setting == setting) {
    r.lru.splice(r.lru.begin(), r.lru, it->second);
    release_past_recent(r);
    count(Counter::CacheHits);
    site_sync(site, static_cast<int64_t>(built.order.size()), true, graph_ns);
    r.last_graph = it->second->graph;
    return *it->second;
  }
  // The same graph compiled for another setting (a thread count since changed): said as such.
  std::string setting_change;
  bool load_follows = false;
  for (const CacheEntry& e : r.lru)
    if (e.setting != setting && e.key == built.key) {
      setting_change = cat(backend.name(), ": ", e.setting, " before, ", setting, " now");
      load_follows =
          backend.setting_follows_load(setting) || backend.setting_follows_load(e.setting);
      break;
    }
  const int64_t t0 = now_ns();
  site_sync(site, static_cast<int64_t>(built.order.size()), false, graph_ns);
  materialize_graph(built);
  // Why: against the site's earlier graphs (and the steady-state contract, which may refuse).
  const debug::CacheMiss miss = site_miss(site, built.graph, r.debug, setting_change, load_follows);
  if (span) span.rename("compile"), span.arg("reason", miss.text);
  std::shared_ptr<backends::Executable> exe;
  try {
    exe = backend.compile(built.graph);
  } catch (const BackendError& e) {
    throw BackendError(cat(origin, ": compile failed: ", e.what()));
  } catch (const Error& e) {
    throw Error(cat(origin, ": compile failed: ", e.what()));
  }
  const int64_t took = now_ns() - t0;
  time_ns(Timer::Compile, took);
  site_time(site, SitePhase::Compile, took);
  count(Counter::Compiles);
  const auto nodes = static_cast<int64_t>(built.graph.nodes.size());
  for (int64_t seen = r.largest.load(); nodes > seen;)
    if (r.largest.compare_exchange_weak(seen, nodes)) break;
  if (r.debug)
    std::cerr << "lockstep: compile #" << metrics::counter("compiles") << " for " << origin
              << ": graph " << std::hex << built.hash << std::dec << " with "
              << built.graph.nodes.size() << " nodes on " << device_name(built.graph.device)
              << ", not in the cache (" << r.lru.size() << " programs cached)\n";
  if (r.dump_dir) {
    std::ofstream f(cat(r.dump_dir, "/graph-", std::hex, built.hash, ".txt"));
    f << ir::to_text(built.graph, true);
  }
  if (it != r.cache.end()) {  // a hash collision: the new program replaces the old one
    r.lru.erase(it->second);
    r.cache.erase(it);
  }
  auto graph = std::make_shared<const ir::Graph>(std::move(built.graph));  // no longer needed
  site_compiled(site, graph, static_cast<int64_t>(exe->planned_bytes()));
  auto agreement = dist::detail::agreement_of(*graph, setting);
  r.lru.push_front({hash, std::move(built.key), std::move(setting), std::move(graph),
                    std::move(exe), std::move(agreement)});
  r.cache[hash] = r.lru.begin();
  r.last_graph = r.lru.front().graph;
  r.trim();
  release_past_recent(r);
  return r.lru.front();
}

}  // namespace lockstep::runtime

void lockstep::set_compile_cache_capacity(size_t capacity) {
  runtime::Cache& r = runtime::cache();
  std::lock_guard<std::recursive_mutex> lock(r.mu);
  r.capacity = capacity == 0 ? 1 : capacity;
  r.trim();
}

namespace lockstep::runtime {

std::string last_graph_text() {
  Cache& r = cache();
  std::lock_guard<std::recursive_mutex> lock(r.mu);
  return r.last_graph ? ir::to_text(*r.last_graph, true) : std::string();
}

}  // namespace lockstep::runtime
