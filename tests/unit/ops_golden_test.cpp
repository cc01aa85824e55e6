// The libtorch-style ops against PyTorch: tests/golden/make_ops_fixtures.py wrote each case's
// inputs, PyTorch's outputs and the gradients of sum_k sum(out_k * w_k). Each case below is the
// same computation written with lockstep, run on `ref` and on `cpu`; outputs must have PyTorch's
// shape and dtype, integers and bools exactly, floats within 1e-5 of the largest |value| (plus
// 1e-6 relative per element).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <set>

#include <lockstep/lockstep.h>

namespace ls = lockstep;

namespace {

using Tensors = std::vector<ls::Tensor>;
using Case = std::function<Tensors(const Tensors&)>;

const std::map<std::string, Case>& cases() {
  static const std::map<std::string, Case> c = {
      {"chunk", [](const Tensors& x) { return ls::chunk(x[0], 3, 0); }},
      {"split_size", [](const Tensors& x) { return ls::split(x[0], 2, 1); }},
      {"split_sizes",
       [](const Tensors& x) {
         return ls::split(x[0], {3, 4}, 0);
       }},
      {"stack",
       [](const Tensors& x) {
         return Tensors{ls::stack({x[0], x[1]}, 1)};
       }},
      {"unbind", [](const Tensors& x) { return ls::unbind(x[0], 1); }},
      {"repeat",
       [](const Tensors& x) {
         return Tensors{ls::repeat(x[0], {2, 1, 3})};
       }},
      {"flip",
       [](const Tensors& x) {
         return Tensors{ls::flip(x[0], {0, 2})};
       }},
      {"roll",
       [](const Tensors& x) {
         return Tensors{ls::roll(x[0], {1, -2}, {0, 1})};
       }},
      {"roll_flat", [](const Tensors& x) { return Tensors{ls::roll(x[0], {3})}; }},
      {"index_select", [](const Tensors& x) { return Tensors{ls::index_select(x[0], 0, x[1])}; }},
      {"take_along_dim",
       [](const Tensors& x) { return Tensors{ls::take_along_dim(x[0], x[1], 1)}; }},
      {"narrow", [](const Tensors& x) { return Tensors{ls::narrow(x[0], 0, -4, 2)}; }},
      {"movedim", [](const Tensors& x) { return Tensors{ls::movedim(x[0], 0, 2)}; }},
      {"tril",
       [](const Tensors& x) {
         return Tensors{ls::tril(x[0], 1), ls::tril(x[0], -1)};
       }},
      {"triu",
       [](const Tensors& x) {
         return Tensors{ls::triu(x[0]), ls::triu(x[0], 2)};
       }},
      {"masked_fill", [](const Tensors& x) { return Tensors{ls::masked_fill(x[0], x[1], -1.5)}; }},
      {"where_scalars", [](const Tensors& x) { return Tensors{ls::where(x[0], 1.5, -2.0)}; }},
      {"fmod", [](const Tensors& x) { return Tensors{ls::fmod(x[0], x[1])}; }},
      {"remainder",
       [](const Tensors& x) {
         return Tensors{ls::remainder(x[0], x[1]), x[0] % 1.5};
       }},
      {"fmod_int",
       [](const Tensors& x) {
         return Tensors{ls::fmod(x[0], x[1]), ls::remainder(x[0], x[1]), x[0] % 4};
       }},
      {"floor_divide", [](const Tensors& x) { return Tensors{ls::floor_divide(x[0], x[1])}; }},
      {"floor_divide_int", [](const Tensors& x) { return Tensors{ls::floor_divide(x[0], x[1])}; }},
      {"clamp_tensor", [](const Tensors& x) { return Tensors{ls::clamp(x[0], x[1], x[2])}; }},
      {"cumsum",
       [](const Tensors& x) {
         return Tensors{ls::cumsum(x[0], 1), ls::cumsum(x[0], 0)};
       }},
      {"cumsum_int", [](const Tensors& x) { return Tensors{ls::cumsum(x[0], 1)}; }},
      {"cumprod", [](const Tensors& x) { return Tensors{ls::cumprod(x[0], 1)}; }},
      {"cumprod_zero", [](const Tensors& x) { return Tensors{ls::cumprod(x[0], 0)}; }},
      {"var_std",
       [](const Tensors& x) {
         return Tensors{ls::var(x[0], {1}), ls::var(x[0], {1}, 0), ls::std(x[0]),
                        ls::std(x[0], {0}, 1, true)};
       }},
      {"norm",
       [](const Tensors& x) {
         const double inf = std::numeric_limits<double>::infinity();
         return Tensors{ls::norm(x[0], 2, {1}), ls::norm(x[0], 1, {1}), ls::norm(x[0], 3, {1}),
                        ls::norm(x[0], inf, {1}), ls::norm(x[0])};
       }},
      {"prod",
       [](const Tensors& x) {
         return Tensors{ls::prod(x[0], {1}), ls::prod(x[0])};
       }},
      {"any_all",
       [](const Tensors& x) {
         return Tensors{ls::any(x[0], {1}), ls::all(x[0], {0}), ls::any(x[0])};
       }},
      {"sort",
       [](const Tensors& x) {
         const ls::ValuesIndices a = ls::sort(x[0], 1), b = ls::sort(x[0], 0, true);
         return Tensors{a.values, a.indices, b.values, b.indices};
       }},
      {"sort_ties",
       [](const Tensors& x) {
         const ls::ValuesIndices a = ls::sort(x[0]), b = ls::sort(x[0], -1, true);
         return Tensors{a.values, a.indices, b.values, b.indices};
       }},
      {"argsort", [](const Tensors& x) { return Tensors{ls::argsort(x[0], 1, true)}; }},
      {"topk",
       [](const Tensors& x) {
         const ls::ValuesIndices a = ls::topk(x[0], 3, 1), b = ls::topk(x[0], 2, 0, false);
         return Tensors{a.values, a.indices, b.values, b.indices};
       }},
      {"einsum_bmm", [](const Tensors& x) { return Tensors{ls::einsum("bij,bjk->bik", x)}; }},
      {"einsum_transpose", [](const Tensors& x) { return Tensors{ls::einsum("ij->ji", x)}; }},
      {"einsum_dot", [](const Tensors& x) { return Tensors{ls::einsum("i,i->", x)}; }},
      {"einsum_outer", [](const Tensors& x) { return Tensors{ls::einsum("i,j->ij", x)}; }},
      {"einsum_attention",
       [](const Tensors& x) { return Tensors{ls::einsum("bhqd,bhkd->bhqk", x)}; }},
      {"einsum_ellipsis",
       [](const Tensors& x) { return Tensors{ls::einsum("...ij,jk->...ik", x)}; }},
      {"einsum_sum",
       [](const Tensors& x) {
         return Tensors{ls::einsum("ijk->", x), ls::einsum("ijk->ki", x)};
       }},
      {"einsum_chain", [](const Tensors& x) { return Tensors{ls::einsum("ij,jk,kl->il", x)}; }},
      {"einsum_implicit", [](const Tensors& x) { return Tensors{ls::einsum("ij,jk", x)}; }},
      {"one_hot", [](const Tensors& x) { return Tensors{ls::one_hot(x[0], 4)}; }},
      {"linspace",
       [](const Tensors&) {
         return Tensors{ls::linspace(-1, 2, 7), ls::linspace(0, 1, 10), ls::linspace(3, 3, 1)};
       }},
      {"log1p", [](const Tensors& x) { return Tensors{ls::log1p(x[0])}; }},
      {"activations",
       [](const Tensors& x) {
         namespace nn = ls::nn;
         const ls::Tensor& v = x[0];
         return Tensors{nn::leaky_relu(v),
                        nn::leaky_relu(v, 0.2),
                        nn::elu(v),
                        nn::elu(v, 0.5),
                        nn::silu(v),
                        nn::softplus(v),
                        nn::softplus(v * 10, 2.0, 15.0),
                        nn::hardswish(v),
                        nn::mish(v),
                        nn::log_sigmoid(v),
                        nn::gelu(v, nn::GeluApproximation::Tanh),
                        nn::gelu(v)};
       }},
      {"promote",
       [](const Tensors& x) {
         const ls::Tensor &i = x[0], &f = x[1], &i32 = x[2], &b = x[3];
         const ls::Tensor f64_0d = ls::scalar_tensor(2.0, {ls::f64, i.device()});
         const ls::Tensor f64_0d_b = ls::scalar_tensor(1.5, {ls::f64, i.device()});
         return Tensors{i + f, i * 2.5, i / 2,      i / i32,     i + i32,
                        b + 1, b * 0.5, f + f64_0d, i + f64_0d_b};
       }},
  };
  return c;
}

struct Golden {
  std::map<std::string, ls::Tensor> t;
  std::set<std::string> names;
};

const Golden& golden() {
  static const Golden g = [] {
    Golden out;
    for (auto& [k, v] :
         ls::io::load_safetensors(std::string(LOCKSTEP_GOLDEN_DIR) + "/ops.safetensors",
                                  ls::parse_device("ref"))
             .tensors) {
      out.names.insert(k.substr(0, k.find('.')));
      out.t[k] = v;
    }
    return out;
  }();
  return g;
}

const ls::Tensor* find(const std::string& key) {
  auto it = golden().t.find(key);
  return it == golden().t.end() ? nullptr : &it->second;
}

std::vector<double> as_f64(const ls::Tensor& t) {
  std::vector<double> v;
  const ls::Tensor d = ls::cast(t, ls::f64);
  return d.to_vector<double>();
}

void expect_match(const ls::Tensor& ours, const ls::Tensor& torch, const std::string& what) {
  ASSERT_EQ(ours.shape(), torch.shape()) << what;
  ASSERT_EQ(ours.dtype(), torch.dtype()) << what;
  const std::vector<double> a = as_f64(ours.to(torch.device())), b = as_f64(torch);
  if (!ls::is_floating(torch.dtype())) {
    EXPECT_EQ(a, b) << what;
    return;
  }
  double scale = 0;
  for (double v : b)
    if (std::isfinite(v)) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(b[i]) || std::isinf(b[i])) {
      EXPECT_TRUE(std::isnan(b[i]) ? std::isnan(a[i]) : a[i] == b[i])
          << what << " [" << i << "]: " << a[i] << " vs torch " << b[i];
      continue;
    }
    EXPECT_LE(std::abs(a[i] - b[i]), 1e-5 * std::max(scale, 1e-12) + 1e-6 * std::abs(b[i]))
        << what << " [" << i << "]: " << a[i] << " vs torch " << b[i];
  }
}

void run_case(const std::string& name, ls::Device device) {
  SCOPED_TRACE(name + " on " + ls::device_name(device));
  Tensors inputs;
  for (int i = 0;; ++i) {
    const ls::Tensor* in = find(name + ".in" + std::to_string(i));
    if (!in) break;
    ls::Tensor x = in->to(device).detach();
    if (ls::is_floating(x.dtype()) && find(name + ".grad" + std::to_string(i)))
      x.set_requires_grad();
    inputs.push_back(x);
  }
  const Tensors outs = cases().at(name)(inputs);
  int expected = 0;
  while (find(name + ".out" + std::to_string(expected))) ++expected;
  ASSERT_EQ(static_cast<int>(outs.size()), expected) << name << ": number of outputs";
  ls::Tensor loss;
  for (int k = 0; k < expected; ++k) {
    const std::string key = name + ".out" + std::to_string(k);
    expect_match(outs[k], *find(key), key);
    if (const ls::Tensor* w = find(name + ".w" + std::to_string(k))) {
      const ls::Tensor term = ls::sum(outs[k] * w->to(device));
      loss = loss.defined() ? loss + term : term;
    }
  }
  if (!loss.defined()) return;
  loss.backward();
  for (size_t i = 0; i < inputs.size(); ++i)
    if (const ls::Tensor* g = find(name + ".grad" + std::to_string(i))) {
      ASSERT_TRUE(inputs[i].grad().defined()) << name << ": no gradient for input " << i;
      expect_match(inputs[i].grad(), *g, name + ".grad" + std::to_string(i));
    }
}

TEST(OpsGolden, EveryFixtureCaseHasALockstepCase) {
  for (const std::string& n : golden().names) EXPECT_TRUE(cases().count(n)) << n;
  for (const auto& [n, fn] : cases()) EXPECT_TRUE(golden().names.count(n)) << n;
}

TEST(OpsGolden, MatchPyTorchOnRef) {
  for (const auto& [name, fn] : cases()) run_case(name, ls::parse_device("ref"));
}

TEST(OpsGolden, MatchPyTorchOnCpu) {
  for (const auto& [name, fn] : cases()) run_case(name, ls::parse_device("cpu"));
}

}  // namespace
