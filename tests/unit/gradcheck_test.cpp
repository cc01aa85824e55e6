// Gradient checks generated over the op table: for every differentiable primitive, the gradient
// from backward() matches central finite differences in float64 on the ref backend. The test
// fails if a differentiable op has no case here (and so, no checked rule); an elementwise op
// without one is checked as the table records it (elementwise_case).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <random>

#include <lockstep/lockstep.h>
#include "ir/ir.h"
#include "runtime/lazy.h"
#include "tensor/frontend.h"

namespace ls = lockstep;
using ls::ir::Op;

namespace {

struct Case {
  std::vector<ls::Shape> shapes;
  // Inputs are spread evenly over [lo, hi) and shuffled, so max/min/pooling have no ties and
  // relu/abs/floor stay away from their kinks.
  double lo = -1, hi = 1;
  std::function<ls::Tensor(const std::vector<ls::Tensor>&)> fn;
  double step = 1e-6;
  double tol = 1e-6;
};

std::vector<double> sample(const ls::Shape& s, double lo, double hi, std::mt19937& rng) {
  std::vector<double> v(static_cast<size_t>(ls::shape_numel(s)));
  // Distinct, well separated values, shuffled: no ties, no values near 0 or integers.
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = lo + (hi - lo) * (static_cast<double>(i) + 0.37) / static_cast<double>(v.size());
  std::shuffle(v.begin(), v.end(), rng);
  return v;
}

ls::Tensor f64(const std::vector<double>& v, const ls::Shape& s) {
  return ls::from_vector<double>(v, s);
}

std::map<Op, Case> cases() {
  using V = const std::vector<ls::Tensor>&;
  const ls::Conv2dOptions conv{{2, 1}, {1, 0}, {1, 2}, 2};
  const ls::Pool2dOptions pool{{2, 3}, {1, 2}, {1, 1}, true};
  std::map<Op, Case> c;
  c[Op::Neg] = {{{3, 4}}, -1, 1, [](V x) { return ls::neg(x[0]); }};
  c[Op::Abs] = {{{3, 4}}, -1, 1, [](V x) { return ls::abs(x[0]); }};
  c[Op::Exp] = {{{3, 4}}, -1, 1, [](V x) { return ls::exp(x[0]); }};
  c[Op::Log] = {{{3, 4}}, 0.5, 2, [](V x) { return ls::log(x[0]); }};
  c[Op::Sqrt] = {{{3, 4}}, 0.5, 2, [](V x) { return ls::sqrt(x[0]); }};
  c[Op::Rsqrt] = {{{3, 4}}, 0.5, 2, [](V x) { return ls::rsqrt(x[0]); }};
  c[Op::Tanh] = {{{3, 4}}, -2, 2, [](V x) { return ls::tanh(x[0]); }};
  c[Op::Sigmoid] = {{{3, 4}}, -2, 2, [](V x) { return ls::sigmoid(x[0]); }};
  c[Op::Relu] = {{{3, 4}}, -1, 1, [](V x) { return ls::relu(x[0]); }};
  c[Op::Sin] = {{{3, 4}}, -2, 2, [](V x) { return ls::sin(x[0]); }};
  c[Op::Cos] = {{{3, 4}}, -2, 2, [](V x) { return ls::cos(x[0]); }};
  c[Op::Erf] = {{{3, 4}}, -2, 2, [](V x) { return ls::erf(x[0]); }};
  c[Op::Gelu] = {{{3, 4}}, -3, 3, [](V x) { return ls::nn::gelu(x[0]); }};
  c[Op::GeluDerivative] = {{{3, 4}}, -3, 3, [](V x) {
                             return ls::frontend::record(
                                 Op::GeluDerivative,
                                 {ls::runtime::node_of(x[0], "test", ls::Loc::current())}, {},
                                 ls::Loc::current());
                           }};
  c[Op::Floor] = {{{3, 4}}, -2, 2, [](V x) { return ls::floor(x[0]); }};
  c[Op::Ceil] = {{{3, 4}}, -2, 2, [](V x) { return ls::ceil(x[0]); }};
  c[Op::Sign] = {{{3, 4}}, -2, 2, [](V x) { return ls::sign(x[0]); }};
  // f64 -> f32 rounds; a wide step keeps the rounding error small against it.
  c[Op::Cast] = {{{3, 4}}, -2,  2, [](V x) { return ls::cast(ls::cast(x[0], ls::f32), ls::f64); },
                 1e-2,     1e-4};
  c[Op::Add] = {{{3, 4}, {4}}, -1, 1, [](V x) { return ls::add(x[0], x[1]); }};
  c[Op::Sub] = {{{3, 1}, {4}}, -1, 1, [](V x) { return ls::sub(x[0], x[1]); }};
  c[Op::Mul] = {{{2, 3, 4}, {3, 1}}, -1, 1, [](V x) { return ls::mul(x[0], x[1]); }};
  c[Op::Div] = {{{3, 4}, {3, 4}}, 0.5, 2, [](V x) { return ls::div(x[0], x[1]); }};
  c[Op::Pow] = {{{3, 4}, {3, 4}}, 0.5, 2, [](V x) { return ls::pow(x[0], x[1]); }};
  // a / b in (2.29, 2.54): away from fmod's jumps, with a quotient (2) to differentiate by b.
  c[Op::Fmod] = {
      {{3, 4}, {3, 4}}, 0.5, 2, [](V x) { return ls::fmod(x[0] * 0.1 + 5.0, x[1] * 0.1 + 2.0); }};
  c[Op::Maximum] = {{{3, 4}, {3, 4}}, -1, 1, [](V x) { return ls::maximum(x[0], x[1] + 0.013); }};
  c[Op::Minimum] = {{{3, 4}, {3, 4}}, -1, 1, [](V x) { return ls::minimum(x[0], x[1] + 0.013); }};
  c[Op::Where] = {
      {{3, 4}, {3, 4}}, -1, 1, [](V x) { return ls::where(x[0] > 0.1, x[0], x[1] * 3.0); }};
  c[Op::Sum] = {{{2, 3, 4}}, -1, 1, [](V x) { return ls::sum(x[0], {0, 2}); }};
  c[Op::Max] = {{{2, 3, 4}}, -1, 1, [](V x) { return ls::max(x[0], {1}); }};
  c[Op::Min] = {{{2, 3, 4}}, -1, 1, [](V x) { return ls::min(x[0], {-1}, true); }};
  c[Op::Reshape] = {{{2, 6}}, -1, 1, [](V x) { return ls::reshape(x[0], {3, 4}); }};
  c[Op::Permute] = {{{2, 3, 4}}, -1, 1, [](V x) { return ls::permute(x[0], {2, 0, 1}); }};
  c[Op::Expand] = {{{3, 1}}, -1, 1, [](V x) { return ls::expand(x[0], {2, 3, 5}); }};
  c[Op::Slice] = {{{3, 7}}, -1, 1, [](V x) { return ls::slice(x[0], 1, 1, 6, 2); }};
  c[Op::Concat] = {{{2, 3}, {2, 1}}, -1, 1, [](V x) { return ls::concat({x[0], x[1], x[0]}, 1); }};
  c[Op::Pad] = {{{2, 3}}, -1, 1, [](V x) { return ls::pad(x[0], {{1, 0}, {2, 1}}, 0.5); }};
  c[Op::Gather] = {
      {{3, 4}}, -1, 1, [](V x) {
        return ls::gather(x[0], 1, ls::from_vector<int64_t>({0, 3, 3, 1, 2, 2}, {3, 2}));
      }};
  c[Op::ScatterAdd] = {
      {{3, 4}, {3, 3}}, -1, 1, [](V x) {
        return ls::scatter_add(x[0], 1, ls::from_vector<int64_t>({0, 3, 0, 1, 2, 2}, {3, 2}), x[1]);
      }};
  c[Op::MatMul] = {{{2, 3, 4}, {4, 5}}, -1, 1, [](V x) { return ls::matmul(x[0], x[1]); }};
  c[Op::Conv2d] = {
      {{2, 4, 5, 6}, {4, 2, 3, 2}}, -1, 1, [conv](V x) { return ls::conv2d(x[0], x[1], conv); }};
  c[Op::Conv2dBackwardInput] = {{{2, 4, 3, 4}, {4, 2, 3, 2}}, -1, 1, [conv](V x) {
                                  return ls::conv2d_backward_input(x[0], x[1], {2, 4, 5, 6}, conv);
                                }};
  c[Op::Conv2dBackwardWeight] = {
      {{2, 4, 5, 6}, {2, 4, 3, 4}}, -1, 1, [conv](V x) {
        return ls::conv2d_backward_weight(x[0], x[1], {4, 2, 3, 2}, conv);
      }};
  // One layer in reverse, with every operand's gradient (x, h0, c0, both weights, the bias).
  c[Op::Lstm] = {{{3, 2, 2}, {2, 3}, {2, 3}, {12, 2}, {12, 3}, {12}}, -1, 1, [](V x) {
                   return ls::lstm_layer(x[0], x[1], x[2], x[3], x[4], x[5], true);
                 }};
  c[Op::Gru] = {{{3, 2, 2}, {2, 3}, {9, 2}, {9, 3}, {12}}, -1, 1, [](V x) {
                  return ls::gru_layer(x[0], x[1], x[2], x[3], x[4], true);
                }};
  c[Op::MaxPool2d] = {{{2, 2, 5, 6}}, -1, 1, [pool](V x) { return ls::max_pool2d(x[0], pool); }};
  c[Op::MaxPool2dBackward] = {
      {{2, 2, 6, 3}}, -1, 1, [pool](V x) {
        // Indices from a fixed input whose maxima are spread over the windows.
        ls::Tensor in =
            ls::cos(ls::cast(ls::reshape(ls::arange(120), {2, 2, 5, 6}), ls::f64) * 1.7);
        ls::Tensor idx = ls::max_pool2d_with_indices(in, pool).second;
        return ls::max_pool2d_backward(x[0], idx, {2, 2, 5, 6}, pool);
      }};
  // One process: the sum over the ranks is x itself, times the scale.
  c[Op::AllReduce] = {{{3, 4}}, -1, 1, [](V x) { return ls::dist::all_reduce(x[0], 0.25); }};
  c[Op::AvgPool2d] = {{{2, 2, 5, 6}}, -1, 1, [pool](V x) { return ls::avg_pool2d(x[0], pool); }};
  c[Op::AvgPool2dBackward] = {{{2, 2, 6, 3}}, -1, 1, [pool](V x) {
                                return ls::avg_pool2d_backward(x[0], {2, 2, 5, 6}, pool);
                              }};
  return c;
}

// sum(f(x) * weights): a scalar whose gradient exercises every output element differently.
double objective(const Case& c, const std::vector<std::vector<double>>& values,
                 const std::vector<double>& weights, std::vector<ls::Tensor>* leaves) {
  std::vector<ls::Tensor> xs;
  for (size_t i = 0; i < values.size(); ++i) {
    xs.push_back(f64(values[i], c.shapes[i]));
    if (leaves) xs.back().set_requires_grad();
  }
  ls::Tensor y = c.fn(xs);
  ls::Tensor w = ls::from_vector<double>(weights, y.shape());
  ls::Tensor loss = ls::sum(y * w);
  if (leaves) {
    loss.backward();
    *leaves = xs;
  }
  return loss.item<double>();
}

// An elementwise op with no case of its own (a new one, say) is checked as the table records it,
// on operands of one shape spread over [0.5, 2): inside the domain of every float formula (log,
// sqrt, pow). An op whose domain or kinks need other inputs gets a case in cases().
std::optional<Case> elementwise_case(Op op) {
  const ls::ir::OpInfo& info = ls::ir::op_info(op);
  if (info.family != ls::ir::OpFamily::Unary && info.family != ls::ir::OpFamily::Binary)
    return std::nullopt;
  return Case{std::vector<ls::Shape>(static_cast<size_t>(info.arity), ls::Shape{3, 4}), 0.5, 2,
              [op](const std::vector<ls::Tensor>& x) {
                const ls::Loc loc = ls::Loc::current();
                std::vector<ls::ir::NodePtr> operands;
                for (const ls::Tensor& t : x)
                  operands.push_back(ls::frontend::node(t, "test", loc));
                return ls::frontend::record(op, operands, {}, loc, x[0].shape(), x[0].dtype());
              }};
}

// Every input's analytic gradient (from backward) against central differences of objective().
void expect_matches_finite_differences(const Case& c,
                                       const std::vector<std::vector<double>>& values,
                                       const std::vector<double>& weights) {
  std::vector<ls::Tensor> leaves;
  objective(c, values, weights, &leaves);
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_TRUE(leaves[i].grad().defined()) << "input " << i << " got no gradient";
    const std::vector<double> analytic = leaves[i].grad().to_vector<double>();
    for (size_t j = 0; j < values[i].size(); ++j) {
      auto plus = values, minus = values;
      plus[i][j] += c.step;
      minus[i][j] -= c.step;
      const double numeric =
          (objective(c, plus, weights, nullptr) - objective(c, minus, weights, nullptr)) /
          (2 * c.step);
      EXPECT_NEAR(analytic[j], numeric, c.tol * std::max(1.0, std::abs(numeric)))
          << "input " << i << " element " << j;
    }
  }
}

}  // namespace

TEST(GradCheck, EveryDifferentiableOpHasACheckedRule) {
  const std::map<Op, Case> all = cases();
  for (int k = 0; k < ls::ir::kNumOps; ++k) {
    const Op op = static_cast<Op>(k);
    if (!ls::ir::op_info(op).differentiable) continue;
    SCOPED_TRACE(ls::ir::op_info(op).name);
    auto it = all.find(op);
    const std::optional<Case> generated = elementwise_case(op);
    ASSERT_TRUE(it != all.end() || generated)
        << "no gradient check for differentiable op " << ls::ir::op_info(op).name;
    const Case& c = it != all.end() ? it->second : *generated;
    std::mt19937 rng(static_cast<unsigned>(k + 1));
    std::vector<std::vector<double>> values;
    for (const ls::Shape& s : c.shapes) values.push_back(sample(s, c.lo, c.hi, rng));
    // The case must really record the op under test as its result.
    {
      std::vector<ls::Tensor> probe;
      for (size_t i = 0; i < values.size(); ++i) probe.push_back(f64(values[i], c.shapes[i]));
      ls::Tensor y = c.fn(probe);
      ASSERT_EQ(ls::runtime::node_of(y, "test", ls::Loc::current())->op, op);
    }
    std::vector<double> weights;
    {
      std::vector<ls::Tensor> probe;
      for (size_t i = 0; i < values.size(); ++i) probe.push_back(f64(values[i], c.shapes[i]));
      ls::Shape ys = c.fn(probe).shape();
      std::uniform_real_distribution<double> u(0.5, 1.5);
      for (int64_t i = 0; i < ls::shape_numel(ys); ++i) weights.push_back(u(rng));
    }
    expect_matches_finite_differences(c, values, weights);
  }
}

// Batch norm in training brings its own backward (two reductions instead of the primitives'
// chain): it must agree with finite differences too, for x, weight and bias, with and without
// the affine parameters, over [N, C] and [N, C, H, W].
TEST(GradCheck, BatchNormsOwnGradientMatchesFiniteDifferences) {
  using V = const std::vector<ls::Tensor>&;
  auto stats = [](int64_t c) { return std::pair{ls::zeros({c}, ls::f64), ls::ones({c}, ls::f64)}; };
  const std::vector<Case> bn_cases = {
      {{{3, 2, 4, 5}, {2}, {2}},
       -1,
       1,
       [&](V x) {
         auto [m, v] = stats(2);
         return ls::nn::batch_norm(x[0], m, v, x[1], x[2], true, 0.1, 1e-5);
       }},
      {{{6, 3}},
       -1,
       1,
       [&](V x) {
         auto [m, v] = stats(3);
         return ls::nn::batch_norm(x[0], m, v, ls::Tensor(), ls::Tensor(), true);
       }},
      {{{2, 3, 3, 2}, {3}},
       -1,
       1,
       [&](V x) {
         return ls::nn::batch_norm(x[0], ls::Tensor(), ls::Tensor(), x[1], ls::Tensor(), true);
       }},
  };
  std::mt19937 rng(77);
  for (size_t ci = 0; ci < bn_cases.size(); ++ci) {
    SCOPED_TRACE("case " + std::to_string(ci));
    const Case& c = bn_cases[ci];
    std::vector<std::vector<double>> values;
    for (const ls::Shape& s : c.shapes) values.push_back(sample(s, c.lo, c.hi, rng));
    std::vector<double> weights;
    std::uniform_real_distribution<double> u(0.5, 1.5);
    for (int64_t i = 0; i < ls::shape_numel(c.shapes[0]); ++i) weights.push_back(u(rng));
    expect_matches_finite_differences(c, values, weights);
  }
}

// The composite ops of the libtorch-style surface (composites.cpp, nn activations): their
// gradients come from the primitives' rules, and must still match finite differences.
TEST(GradCheck, CompositeOpsMatchFiniteDifferences) {
  using V = const std::vector<ls::Tensor>&;
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<std::pair<std::string, Case>> composite = {
      {"cumsum", {{{3, 5}}, -1, 1, [](V x) { return ls::cumsum(x[0], 1); }}},
      {"cumprod", {{{3, 5}}, -1, 1, [](V x) { return ls::cumprod(x[0], 1); }}},
      {"prod", {{{3, 5}}, -1, 1, [](V x) { return ls::prod(x[0], {1}); }}},
      {"var", {{{3, 5}}, -1, 1, [](V x) { return ls::var(x[0], {1}); }}},
      {"std", {{{3, 5}}, -1, 1, [](V x) { return ls::std(x[0], {0}, 0); }}},
      {"norm2", {{{3, 5}}, -1, 1, [](V x) { return ls::norm(x[0], 2, {1}); }}},
      {"norm3", {{{3, 5}}, -1, 1, [](V x) { return ls::norm(x[0], 3, {1}); }}},
      {"norm_inf", {{{3, 5}}, -1, 1, [inf](V x) { return ls::norm(x[0], inf, {1}); }}},
      {"remainder",
       {{{3, 4}, {3, 4}},
        0.5,
        2,
        [](V x) { return ls::remainder(x[0] * 0.1 - 5.0, x[1] * 0.1 + 2.0); }}},
      {"einsum", {{{2, 3}, {3, 4}, {4}}, -1, 1, [](V x) { return ls::einsum("ij,jk,k->i", x); }}},
      {"sort_values", {{{3, 5}}, -1, 1, [](V x) { return ls::sort(x[0], 1).values; }}},
      {"topk_values", {{{3, 5}}, -1, 1, [](V x) { return ls::topk(x[0], 2, 1).values; }}},
      {"flip_roll", {{{3, 4}}, -1, 1, [](V x) { return ls::roll(ls::flip(x[0], {1}), {1}, {0}); }}},
      {"index_select",
       {{{4, 3}},
        -1,
        1,
        [](V x) {
          return ls::index_select(x[0], 0, ls::from_vector<int64_t>({2, 0, 2}));
        }}},
      {"tril_repeat",
       {{{3, 4}},
        -1,
        1,
        [](V x) {
          return ls::repeat(ls::tril(x[0]), {2, 1});
        }}},
      {"log1p", {{{3, 4}}, -0.5, 2, [](V x) { return ls::log1p(x[0]); }}},
      {"softplus", {{{3, 4}}, -3, 3, [](V x) { return ls::nn::softplus(x[0] * 8.0); }}},
      {"log_sigmoid", {{{3, 4}}, -3, 3, [](V x) { return ls::nn::log_sigmoid(x[0]); }}},
      {"elu_silu_mish",
       {{{3, 4}},
        -3,
        3,
        [](V x) { return ls::nn::elu(x[0]) + ls::nn::silu(x[0]) + ls::nn::mish(x[0]); }}},
      {"gelu_tanh",
       {{{3, 4}}, -3, 3, [](V x) { return ls::nn::gelu(x[0], ls::nn::GeluApproximation::Tanh); }}},
      {"hardswish_leaky",
       {{{3, 4}},
        -4,
        4,
        [](V x) { return ls::nn::hardswish(x[0]) + ls::nn::leaky_relu(x[0], 0.2); }}},
  };
  std::mt19937 rng(2026);
  for (const auto& [name, c] : composite) {
    SCOPED_TRACE(name);
    std::vector<std::vector<double>> values;
    for (const ls::Shape& s : c.shapes) values.push_back(sample(s, c.lo, c.hi, rng));
    std::vector<ls::Tensor> probe;
    for (size_t i = 0; i < values.size(); ++i) probe.push_back(f64(values[i], c.shapes[i]));
    const ls::Shape ys = c.fn(probe).shape();
    std::vector<double> weights;
    std::uniform_real_distribution<double> u(0.5, 1.5);
    for (int64_t i = 0; i < ls::shape_numel(ys); ++i) weights.push_back(u(rng));
    expect_matches_finite_differences(c, values, weights);
  }
}
