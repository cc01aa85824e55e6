// Helpers shared by the training-stack tests (autograd, nn, optim, checkpoint): metric deltas,
// bit-exact snapshots of tensors and of whole state dicts, and host copies of tensors.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <lockstep/lockstep.h>

namespace ls = lockstep;

namespace train_test {

// Change of a metrics counter since construction.
struct Delta {
  std::string name;
  int64_t start;
  explicit Delta(const char* n) : name(n), start(ls::metrics::counter(n)) {}
  int64_t get() const { return ls::metrics::counter(name) - start; }
};

// A tensor's value as raw bytes: "unchanged" means bit for bit, not approximately.
inline std::vector<unsigned char> raw(const ls::Tensor& t) {
  auto bytes = [](const auto& v) {
    std::vector<unsigned char> b(v.size() * sizeof(v[0]));
    if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
    return b;
  };
  switch (t.dtype()) {
    case ls::DType::F32:
    case ls::DType::BF16:  // widened to f32 exactly: bit for bit still
      return bytes(t.to_vector<float>());
    case ls::DType::F64:
      return bytes(t.to_vector<double>());
    case ls::DType::I32:
      return bytes(t.to_vector<int32_t>());
    case ls::DType::I64:
      return bytes(t.to_vector<int64_t>());
    case ls::DType::Bool: {
      std::vector<bool> v = t.to_vector<bool>();
      return std::vector<unsigned char>(v.begin(), v.end());
    }
    case ls::DType::U8:
      return bytes(t.to_vector<uint8_t>());
  }
  return {};
}

using Snapshot = std::vector<std::pair<std::string, std::vector<unsigned char>>>;

inline Snapshot snapshot(const ls::nn::NamedTensors& tensors) {
  Snapshot s;
  for (const auto& [name, t] : tensors) s.emplace_back(name, raw(t));
  return s;
}

// Every tensor a training step may change: parameters, buffers, optimizer state, the generator.
inline Snapshot full_snapshot(const ls::nn::Module& model, const ls::optim::Optimizer* opt) {
  Snapshot s = snapshot(model.state_dict());
  if (opt) {
    Snapshot o = snapshot(opt->state_dict());
    for (auto& kv : o) s.emplace_back("optimizer." + kv.first, std::move(kv.second));
  }
  s.emplace_back("generator", raw(ls::generator_state()));
  return s;
}

// Names whose bytes differ (or a note when the lists differ): empty when bit-identical.
inline std::vector<std::string> differences(const Snapshot& a, const Snapshot& b) {
  std::vector<std::string> out;
  if (a.size() != b.size()) out.push_back("different number of tensors");
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    if (a[i].first != b[i].first || a[i].second != b[i].second) out.push_back(a[i].first);
  return out;
}

// A copy of the value that shares nothing with `t` (later in-place updates of t do not show).
inline ls::Tensor host_copy(const ls::Tensor& t) {
  if (t.dtype() == ls::DType::Bool) {
    std::vector<bool> v = t.to_vector<bool>();
    std::vector<unsigned char> b(v.begin(), v.end());
    return ls::from_blob(b.data(), t.shape(), t.dtype(), t.device());
  }
  const std::vector<unsigned char> b = raw(t);
  return ls::from_blob(b.data(), t.shape(), t.dtype(), t.device());
}

inline ls::nn::NamedTensors host_copies(const ls::nn::NamedTensors& tensors) {
  ls::nn::NamedTensors out;
  for (const auto& [name, t] : tensors) out.emplace_back(name, host_copy(t));
  return out;
}

// Each got[i] within tol * (1 + |want[i]|) of want[i].
inline void expect_all_near(const std::vector<double>& got, const std::vector<double>& want,
                            double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << "element " << i;
}

inline std::vector<double> as_double(const ls::Tensor& t) {
  if (t.dtype() == ls::f64) return t.to_vector<double>();
  std::vector<float> f = t.to_vector<float>();
  return {f.begin(), f.end()};
}

// Deterministic pseudo-random values in [-1, 1).
inline std::vector<double> values(size_t n, uint32_t seed) {
  std::vector<double> v(n);
  uint32_t s = seed * 2654435761u + 12345u;
  for (double& x : v) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<double>(s >> 8) / static_cast<double>(1u << 23) - 1.0;
  }
  return v;
}

}  // namespace train_test
