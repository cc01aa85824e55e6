// Reading the golden files of tests/golden/ (written by its make_*.py scripts with PyTorch) and
// comparing against them: shared by the golden tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>
#include <string>

#include <lockstep/lockstep.h>

namespace golden {

namespace ls = lockstep;

struct Fixture {
  std::map<std::string, ls::Tensor> t;
  const ls::Tensor& operator[](const std::string& k) const {
    auto it = t.find(k);
    if (it == t.end()) throw std::runtime_error("fixture has no " + k);
    return it->second;
  }
  // The tensors named "<prefix>...", without the prefix (a state dict), leaving out names that
  // contain `skip` (when given).
  ls::nn::NamedTensors with_prefix(const std::string& prefix, const std::string& skip = "") const {
    ls::nn::NamedTensors out;
    for (const auto& [k, v] : t)
      if (k.rfind(prefix, 0) == 0 && (skip.empty() || k.find(skip) == std::string::npos))
        out.emplace_back(k.substr(prefix.size()), v);
    return out;
  }
};

inline Fixture load(const std::string& name) {
  Fixture f;
  for (auto& [k, v] :
       ls::io::load_safetensors(std::string(LOCKSTEP_GOLDEN_DIR) + "/" + name).tensors)
    f.t[k] = v;
  return f;
}

// Same shape (and dtype); i64 exactly; floats with max |ours - torch| <= tol * max |torch|.
inline void expect_close(const ls::Tensor& ours, const ls::Tensor& torch, double tol,
                         const std::string& what) {
  ASSERT_EQ(ours.shape(), torch.shape()) << what;
  ASSERT_EQ(ours.dtype(), torch.dtype()) << what;
  if (ours.dtype() == ls::i64) {
    EXPECT_EQ(ours.to_vector<int64_t>(), torch.to_vector<int64_t>()) << what;
    return;
  }
  const std::vector<double> a = ls::cast(ours, ls::f64).to_vector<double>();
  const std::vector<double> b = ls::cast(torch, ls::f64).to_vector<double>();
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  EXPECT_LE(diff, tol * std::max(scale, 1e-12))
      << what << ": max |diff| " << diff << " against max |torch| " << scale;
}

}  // namespace golden
