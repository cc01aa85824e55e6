// The conformance harness (see conformance.h): host inputs, the two runs, the comparison and
// the bookkeeping of which ops the compared graphs contained.
#include "conformance.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "runtime/lazy.h"

namespace conformance {
namespace {

const ls::Device kRef{ls::DeviceKind::Ref};
const ls::Device kCpu{ls::DeviceKind::Cpu};
constexpr uint64_t kSeed = 1234;
int g_checks = 0;  // check() calls in the current test

// The two backends are compared in IEEE arithmetic: the ref backend keeps denormal floats, and
// the hostile inputs hold some, on which comparisons, casts and sorts are exact. The cpu
// backend's default, denormals flushed to zero (ls::set_flush_denormal), is tested by
// Denormals.FlushedToZeroByDefaultAndKeptWhenAsked among the unit tests.
const bool g_ieee_denormals = [] {
  ls::set_flush_denormal(false);
  return true;
}();

uint64_t fnv(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::vector<double> fill_values(const In& in, std::mt19937_64& rng) {
  const size_t n = static_cast<size_t>(ls::shape_numel(in.shape));
  std::vector<double> v(n);
  const bool fl = ls::is_floating(in.dtype);
  const bool boolean = in.dtype == ls::DType::Bool;
  std::normal_distribution<double> normal(0, 1);
  auto int_in = [&](int64_t lo, int64_t hi) {
    return static_cast<double>(std::uniform_int_distribution<int64_t>(lo, hi - 1)(rng));
  };
  switch (in.fill) {
    case Fill::Normal:
      for (double& x : v) x = boolean ? int_in(0, 2) : fl ? normal(rng) : int_in(-9, 10);
      break;
    case Fill::Positive:
      for (double& x : v)
        x = boolean ? 1 : fl ? std::uniform_real_distribution<double>(0.25, 3)(rng) : int_in(1, 10);
      break;
    case Fill::Range:
      for (double& x : v) x = int_in(in.lo, in.hi);
      break;
    case Fill::Distinct:
      for (size_t i = 0; i < n; ++i)
        v[i] = fl ? (static_cast<double>(i) - static_cast<double>(n) / 2) * 0.37
                  : static_cast<double>(i) - static_cast<double>(n / 2);
      std::shuffle(v.begin(), v.end(), rng);
      break;
    case Fill::NonFinite:
    case Fill::Special: {
      const double inf = std::numeric_limits<double>::infinity();
      const bool f32 = in.dtype == ls::DType::F32;
      const std::vector<double> fs = {std::nan(""), inf,   -inf,  0.0,    -0.0,
                                      1e30,         -1e30, 1e-40, -1e-39, f32 ? 3e38 : 1e300,
                                      0.5,          -0.5,  1.5,   -2.5,   f32 ? 1e-45 : 1e-310};
      const bool i32 = in.dtype == ls::DType::I32;
      const std::vector<double> is = {i32 ? -2147483648.0 : -9223372036854775807.0 - 1,
                                      i32 ? 2147483647.0 : 9.2e18, -1, 0, 1};
      for (double& x : v) {
        if (std::uniform_int_distribution<int>(0, 3)(rng) == 0) {
          const auto& pool = fl ? fs : is;
          x = pool[std::uniform_int_distribution<size_t>(0, pool.size() - 1)(rng)];
          if (in.fill == Fill::NonFinite && std::isfinite(x) && std::abs(x) > 1e3) x = 0.5;
          if (boolean) x = int_in(0, 2);
        } else {
          x = boolean ? int_in(0, 2) : fl ? normal(rng) * 3 : int_in(-9, 10);
        }
      }
      break;
    }
  }
  return v;
}

ls::Tensor make_tensor(const std::vector<double>& v, const In& in, ls::Device device) {
  std::vector<unsigned char> bytes(v.size() * ls::dtype_size(in.dtype) + 1);
  for (size_t i = 0; i < v.size(); ++i) {
    void* at = bytes.data() + i * ls::dtype_size(in.dtype);
    switch (in.dtype) {
      case ls::DType::F32:
        *static_cast<float*>(at) = static_cast<float>(v[i]);
        break;
      case ls::DType::BF16:
        *static_cast<ls::bfloat16*>(at) = ls::bfloat16(static_cast<float>(v[i]));
        break;
      case ls::DType::F64:
        *static_cast<double*>(at) = v[i];
        break;
      case ls::DType::I32:
        *static_cast<int32_t*>(at) = static_cast<int32_t>(v[i]);
        break;
      case ls::DType::I64:
        *static_cast<int64_t*>(at) =
            v[i] >= 9.2e18 ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(v[i]);
        break;
      case ls::DType::U8:  // the value mod 256, as a cast of an integer
        *static_cast<uint8_t*>(at) = static_cast<uint8_t>(static_cast<int64_t>(v[i]));
        break;
      case ls::DType::Bool:
        *static_cast<bool*>(at) = v[i] != 0;
        break;
    }
  }
  return ls::from_blob(bytes.data(), in.shape, in.dtype, device);
}

void collect_ops(const ls::Tensor& t, std::set<const ls::ir::Node*>* visited) {
  std::vector<const ls::ir::Node*> stack = {
      ls::runtime::node_of(t, "conformance", ls::Loc::current()).get()};
  while (!stack.empty()) {
    const ls::ir::Node* n = stack.back();
    stack.pop_back();
    if (!visited->insert(n).second) continue;
    seen_ops()[static_cast<size_t>(n->op)] = true;
    for (const auto& o : n->operands) stack.push_back(o.get());
  }
}

std::string index_str(int64_t flat, const ls::Shape& s) {
  std::vector<int64_t> idx(s.size());
  for (size_t d = s.size(); d-- > 0;) {
    idx[d] = s[d] ? flat % s[d] : 0;
    flat = s[d] ? flat / s[d] : 0;
  }
  return str(idx);
}

// Exact integer values (bools and integers), compared without going through double.
std::vector<int64_t> values_i64(const ls::Tensor& t) {
  switch (t.dtype()) {
    case ls::DType::I64:
      return t.to_vector<int64_t>();
    case ls::DType::I32: {
      auto v = t.to_vector<int32_t>();
      return {v.begin(), v.end()};
    }
    case ls::DType::Bool: {
      auto v = t.to_vector<bool>();
      return {v.begin(), v.end()};
    }
    case ls::DType::U8: {
      auto v = t.to_vector<uint8_t>();
      return {v.begin(), v.end()};
    }
    case ls::DType::F32:
    case ls::DType::F64:
    case ls::DType::BF16:
      break;
  }
  return {};
}

// "" when `got` matches `want`, else a description of the first mismatches.
std::string compare(const ls::Tensor& got, const ls::Tensor& want, double k) {
  std::ostringstream os;
  if (got.shape() != want.shape() || got.dtype() != want.dtype()) {
    os << "cpu gives " << str(got.dtype()) << str(got.shape()) << ", ref " << str(want.dtype())
       << str(want.shape());
    return os.str();
  }
  int bad = 0;
  if (!ls::is_floating(want.dtype())) {
    const auto g = values_i64(got), w = values_i64(want);
    for (size_t i = 0; i < w.size(); ++i)
      if (g[i] != w[i] && bad++ < 5)
        os << "  at " << index_str(static_cast<int64_t>(i), want.shape()) << ": cpu " << g[i]
           << ", ref " << w[i] << "\n";
  } else {
    // bf16: one unit in the last place (both sides round f32 values to nearest; summation
    // order or a libm ulp may put them on either side of a tie).
    const ls::DType d = want.dtype();
    const bool f32 = d == ls::DType::F32, bf16 = d == ls::DType::BF16;
    const double atol = (bf16 ? 1e-5 : f32 ? 1e-6 : 1e-12) * std::max(1.0, k);
    const double rtol = bf16 ? 0x1p-7 : f32 ? 1e-5 : 1e-12;
    const auto g = values_f64(got), w = values_f64(want);
    for (size_t i = 0; i < w.size(); ++i) {
      bool ok;
      if (std::isnan(w[i]) || std::isnan(g[i]))
        ok = std::isnan(w[i]) && std::isnan(g[i]);
      else if (std::isinf(w[i]) || std::isinf(g[i]))
        ok = g[i] == w[i];
      else
        ok = std::abs(g[i] - w[i]) <= atol + rtol * std::abs(w[i]);
      if (!ok && bad++ < 5)
        os << "  at " << index_str(static_cast<int64_t>(i), want.shape()) << ": cpu "
           << std::setprecision(9) << g[i] << ", ref " << w[i] << "\n";
    }
  }
  if (bad)
    return "  " + std::to_string(bad) + " of " + std::to_string(want.numel()) +
           " elements differ\n" + os.str();
  return "";
}

}  // namespace

std::string str(const ls::Shape& s) { return ls::shape_str(s); }
std::string str(ls::DType d) { return ls::dtype_name(d); }

std::vector<double> values_f64(const ls::Tensor& t) {
  switch (t.dtype()) {
    case ls::DType::F32:
    case ls::DType::BF16: {
      auto v = t.to_vector<float>();
      return {v.begin(), v.end()};
    }
    case ls::DType::F64:
      return t.to_vector<double>();
    case ls::DType::I32:
    case ls::DType::I64:
    case ls::DType::U8:
    case ls::DType::Bool: {
      auto v = values_i64(t);
      return {v.begin(), v.end()};
    }
  }
  return {};
}

bool check(const std::string& what, const std::vector<In>& inputs, const Fn& fn, double k) {
  ++g_checks;
  const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::mt19937_64 rng(fnv(test + "/" + what));
  std::vector<std::vector<double>> host;
  std::string desc = what + " on";
  for (const In& in : inputs) {
    host.push_back(fill_values(in, rng));
    desc += ' ';
    desc += str(in.dtype);
    desc += str(in.shape);
  }
  auto run = [&](ls::Device device, std::string* graph, std::string* error) {
    Tensors xs;
    for (size_t i = 0; i < inputs.size(); ++i)
      xs.push_back(make_tensor(host[i], inputs[i], device));
    // New tensors the computation creates itself (arange, rand, zeros) go to `device` too.
    const ls::Device saved = ls::default_device();
    ls::set_default_device(device);
    ls::manual_seed(kSeed);
    Tensors ys;
    try {
      ys = fn(xs);
    } catch (...) {
      ls::set_default_device(saved);
      throw;
    }
    ls::set_default_device(saved);
    std::set<const ls::ir::Node*> visited;
    for (const ls::Tensor& y : ys) collect_ops(y, &visited);
    try {
      ls::sync();
      ls::wait();
      if (graph) *graph = ls::debug::last_graph_text();
      for (const ls::Tensor& y : ys) (void)values_f64(y);  // surfaces execution errors here
    } catch (const std::exception& e) {
      *error = e.what();
      try {
        ls::wait();
      } catch (const std::exception&) {
      }
      // The failed work stays pending while its tensors live (a failed sync loses nothing):
      // dropped here, or the other backend's sync would compile it again and fail the same way,
      // which would read as the two agreeing.
      ys.clear();
    }
    return ys;
  };
  std::string graph, cpu_error, ref_error;
  const Tensors got = run(kCpu, &graph, &cpu_error);
  const Tensors want = run(kRef, nullptr, &ref_error);
  std::string report;
  if (!cpu_error.empty() || !ref_error.empty()) {
    if (cpu_error.empty() || ref_error.empty()) {
      std::ostringstream os;
      os << "  cpu: " << (cpu_error.empty() ? "ok" : cpu_error)
         << "\n  ref: " << (ref_error.empty() ? "ok" : ref_error) << "\n";
      report = os.str();
    }
  } else if (got.size() != want.size()) {
    report = "  output counts differ\n";
  } else {
    for (size_t i = 0; i < got.size(); ++i) {
      const std::string r = compare(got[i], want[i], k);
      if (!r.empty()) report += "  output " + std::to_string(i) + ":\n" + r;
    }
  }
  if (report.empty()) return true;
  ADD_FAILURE() << desc << ": cpu differs from ref\n" << report << "cpu graph:\n" << graph;
  return false;
}

bool check1(const std::string& what, const std::vector<In>& inputs, const Fn1& fn, double k) {
  return check(
      what, inputs, [&](const Tensors& xs) { return Tensors{fn(xs)}; }, k);
}

std::vector<ls::Shape> shapes_small() {
  return {{},        {1},       {0},        {7},          {3, 1},         {1, 17},
          {2, 0, 3}, {3, 5, 7}, {2, 1, 33}, {1, 3, 1, 5}, {4, 3, 2, 5, 3}};
}

std::vector<ls::Shape> shapes_all() {
  std::vector<ls::Shape> s = shapes_small();
  s.push_back({129, 33});
  s.push_back({1031, 131});  // 135k elements: the parallel, multi-tile paths
  return s;
}

bool declare(const char* test, std::initializer_list<Op> ops) {
  auto& d = const_cast<std::vector<std::pair<std::string, std::vector<Op>>>&>(declared());
  d.emplace_back(test, std::vector<Op>(ops));
  return true;
}

const std::vector<std::pair<std::string, std::vector<Op>>>& declared() {
  static auto* d = new std::vector<std::pair<std::string, std::vector<Op>>>;
  return *d;
}

std::vector<bool>& seen_ops() {
  static auto* s = new std::vector<bool>(ls::ir::kNumOps, false);
  return *s;
}

void Conformance::SetUp() {
  seen_ops().assign(ls::ir::kNumOps, false);
  g_checks = 0;
}

void Conformance::TearDown() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string name = std::string(info->test_suite_name()) + "." + info->name();
  RecordProperty("compared_programs", g_checks);  // in --gtest_output=xml reports
  if (IsSkipped()) return;  // this machine cannot run it (said in the skip's message)
  for (const auto& [test, ops] : declared()) {
    if (test != name) continue;
    for (Op op : ops)
      EXPECT_TRUE(seen_ops()[static_cast<size_t>(op)])
          << name << " declares " << ls::ir::op_info(op).name
          << " but no compared graph contained it";
  }
}

}  // namespace conformance
