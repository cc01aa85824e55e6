// The graph fuzzer: random valid op graphs (5-40 ops, values of up to a few thousand elements)
// built through the public API from a seed, run on cpu and on ref, compared. Each graph is built
// four times from the same seed (cpu f32, ref f32, cpu f64, ref f64). f64 results must agree
// almost exactly: within the error bound the builder carries, in f64's unit roundoff (cpu's f64
// products and convolutions run on OpenBLAS, in another order than ref's loops).
// f32 values both backends compute bit for bit (elementwise and movement ops but the
// transcendental functions, which cpu computes with glibc's vector math) must be equal;
// the others within the error bound the builder carries for each value (f32 accumulation in
// cpu's reductions, matmuls and convolutions, grown by the derivatives of later ops).
// Discontinuous ops (comparisons, floor, argmax, pooling indices, casts to integers) only take
// bit-exact values, so rounding never flips them.
//
// CI runs a short fixed budget; LOCKSTEP_FUZZ_GRAPHS=20000 (and LOCKSTEP_FUZZ_SEED=first seed)
// run longer by hand. A mismatch prints the seed (rerun it alone with LOCKSTEP_FUZZ_GRAPHS=1
// LOCKSTEP_FUZZ_SEED=seed) and the cpu graph's IR text.
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <random>
#include <sstream>

#include "conformance.h"
#include "fuzz_graph.h"

namespace conformance {
namespace {

const ls::Device kRef{ls::DeviceKind::Ref};
const ls::Device kCpu{ls::DeviceKind::Cpu};

uint64_t env_u64(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : fallback;
}

struct FuzzRun {
  FuzzGraph graph;
  std::string text, error;
};

FuzzRun run_graph(uint64_t seed, ls::DType dtype, ls::Device device) {
  FuzzRun r{FuzzGraph(seed, dtype, device), "", ""};
  const ls::Device saved = ls::default_device();
  ls::set_default_device(device);  // for what the graph creates without naming a device
  ls::manual_seed(seed);
  try {
    r.graph.build();
    ls::set_default_device(saved);
    ls::sync();
    ls::wait();
    r.text = ls::debug::last_graph_text();
    for (const FuzzValue& o : r.graph.outputs()) (void)values_f64(o.t);
  } catch (const std::exception& e) {
    ls::set_default_device(saved);
    r.error = e.what();
    try {
      ls::wait();
    } catch (const std::exception&) {
    }
  }
  return r;
}

constexpr double kUnit = 1.0 / (1 << 24);  // f32's unit roundoff
constexpr double kUnit64 = 0x1p-53;        // f64's

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v)
    if (std::isfinite(x)) m = std::max(m, std::abs(x));
  return m;
}

// "" when the four runs agree (see the file comment), else the first differences.
std::string compare(const FuzzRun& c32, const FuzzRun& r32, const FuzzRun& c64,
                    const FuzzRun& r64) {
  std::ostringstream os;
  for (const FuzzRun* r : {&c32, &r32, &c64, &r64})
    if (!r->error.empty()) os << "  a run failed: " << r->error << "\n";
  if (!os.str().empty()) return os.str();
  const auto& outs = r32.graph.outputs();
  int bad = 0;
  for (size_t o = 0; o < outs.size() && bad < 6; ++o) {
    const FuzzValue& info = outs[o];
    const std::vector<double> a = values_f64(c32.graph.outputs()[o].t);
    const std::vector<double> b = values_f64(r32.graph.outputs()[o].t);
    const std::vector<double> a64 = values_f64(c64.graph.outputs()[o].t);
    const std::vector<double> b64 = values_f64(r64.graph.outputs()[o].t);
    const double scale = max_abs(b64);
    for (size_t i = 0; i < b.size() && bad < 6; ++i) {
      auto same = [](double x, double y, double tol) {
        if (std::isnan(x) || std::isnan(y)) return std::isnan(x) && std::isnan(y);
        if (std::isinf(x) || std::isinf(y)) return x == y;
        return std::abs(x - y) <= tol;
      };
      const char* what = nullptr;
      if (!same(a64[i], b64[i], 1e-12 * (std::abs(b64[i]) + scale) + kUnit64 * 4 * info.err))
        what = "f64 cpu vs ref";
      else if (info.exact && !same(a[i], b[i], 1e-6 * std::abs(b[i])))
        what = "f32 cpu vs ref (exact value)";
      else if (!info.exact && !same(a[i], b[i], kUnit * (4 * info.err + 8 * std::abs(b[i]))))
        what = "f32 cpu vs ref, beyond the error bound";
      if (what) {
        ++bad;
        os << "  output " << o << " (" << str(info.t.dtype()) << str(info.t.shape())
           << (info.exact ? ", exact" : ", error bound " + std::to_string(info.err * kUnit))
           << ") element " << i << ": " << what << ": cpu f32 " << std::setprecision(9) << a[i]
           << ", ref f32 " << b[i] << ", cpu f64 " << a64[i] << ", ref f64 " << b64[i] << "\n";
      }
    }
  }
  return os.str();
}

TEST(Fuzz, RandomGraphsMatchRef) {
  const uint64_t graphs = env_u64("LOCKSTEP_FUZZ_GRAPHS", 200);
  const uint64_t first = env_u64("LOCKSTEP_FUZZ_SEED", 1);
  const auto t0 = std::chrono::steady_clock::now();
  int failures = 0;
  int64_t ops = 0;
  for (uint64_t seed = first; seed < first + graphs && failures < 5; ++seed) {
    const FuzzRun c32 = run_graph(seed, ls::f32, kCpu);
    const FuzzRun r32 = run_graph(seed, ls::f32, kRef);
    const FuzzRun c64 = run_graph(seed, ls::f64, kCpu);
    const FuzzRun r64 = run_graph(seed, ls::f64, kRef);
    ops += r32.graph.num_ops();
    const std::string diff = compare(c32, r32, c64, r64);
    if (!diff.empty()) {
      ++failures;
      ADD_FAILURE() << "fuzz graph with seed " << seed << " (rerun: LOCKSTEP_FUZZ_GRAPHS=1 "
                    << "LOCKSTEP_FUZZ_SEED=" << seed << "): cpu differs from ref\n"
                    << diff << "recorded ops:\n"
                    << r32.graph.log() << "cpu f32 graph:\n"
                    << c32.text;
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("fuzz: %llu graphs from seed %llu, %lld recorded ops, %.1f s\n",
              static_cast<unsigned long long>(graphs), static_cast<unsigned long long>(first),
              static_cast<long long>(ops), s);
}

}  // namespace
}  // namespace conformance
