// Stress of the deep-graph crash class (issue 30, item 2): programs of random depth made of random
// ops (fused elementwise runs, reductions, matmuls, transposes, reshapes, one-value `where`s)
// recorded without a sync, computed plain, inside a step and through backward, checked against
// the same ops in double on the host and the gradients against the ref backend. Every walk of a
// graph (recording, building, fusing, planning, running, freeing, backward) sees them.
// Briefly in scripts/test; by hand: LOCKSTEP_RANDOM_GRAPH_DEPTH (the largest depth, default
// 3,000) and LOCKSTEP_RANDOM_GRAPH_ROUNDS (default 3), e.g. 1000000 and 5.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include <lockstep/lockstep.h>

namespace ls = lockstep;

namespace {

constexpr int64_t kN = 4;  // values are [4, 4]

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

struct RandomOp {
  int kind;
  double a, b;
};

// The chain's ops: each keeps values bounded (|x| stays below a few units at any depth).
std::vector<RandomOp> random_ops(std::mt19937_64& rng, int depth) {
  std::uniform_int_distribution<int> kind(0, 7);
  std::uniform_real_distribution<double> u(0.5, 0.9), v(-1.0, 1.0);
  std::vector<RandomOp> ops;
  ops.reserve(static_cast<size_t>(depth));
  for (int i = 0; i < depth; ++i) ops.push_back({kind(rng), u(rng), v(rng)});
  return ops;
}

const std::vector<double>& weight() {
  static const std::vector<double> w = [] {
    std::vector<double> m(kN * kN);
    for (size_t i = 0; i < m.size(); ++i) m[i] = std::sin(static_cast<double>(i) + 1.0);
    return m;
  }();
  return w;
}

ls::Tensor record_op(const RandomOp& op, const ls::Tensor& x, const ls::Tensor& w) {
  switch (op.kind) {
    case 0:
      return x * op.a + op.b;
    case 1:
      return ls::tanh(x);
    case 2:
      return ls::relu(x) - 0.25;
    case 3:
      return x + ls::mean(x, {1}, true) * 0.5 - 0.1;
    case 4:
      return ls::transpose(x, 0, 1);
    case 5:
      return ls::matmul(x, w) * 0.25;
    case 6:
      return ls::where(x > 0.0, x, x * 0.5);
    default:
      return ls::reshape(ls::reshape(x, {kN * kN}) * op.a, {kN, kN});
  }
}

std::vector<double> host_apply(const RandomOp& op, const std::vector<double>& x) {
  std::vector<double> y(x.size());
  auto at = [](int64_t i, int64_t j) { return static_cast<size_t>(i * kN + j); };
  for (int64_t i = 0; i < kN; ++i) {
    double mean = 0;
    for (int64_t j = 0; j < kN; ++j) mean += x[at(i, j)] / kN;
    for (int64_t j = 0; j < kN; ++j) {
      const double v = x[at(i, j)];
      double dot = 0;
      for (int64_t k = 0; k < kN; ++k) dot += x[at(i, k)] * weight()[at(k, j)];
      switch (op.kind) {
        case 0:
          y[at(i, j)] = v * op.a + op.b;
          break;
        case 1:
          y[at(i, j)] = std::tanh(v);
          break;
        case 2:
          y[at(i, j)] = std::max(v, 0.0) - 0.25;
          break;
        case 3:
          y[at(i, j)] = v + mean * 0.5 - 0.1;
          break;
        case 4:
          y[at(j, i)] = v;
          break;
        case 5:
          y[at(i, j)] = dot * 0.25;
          break;
        case 6:
          y[at(i, j)] = v > 0 ? v : v * 0.5;
          break;
        default:
          y[at(i, j)] = v * op.a;
          break;
      }
    }
  }
  return y;
}

std::vector<float> start_values() {
  std::vector<float> x(kN * kN);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::cos(static_cast<float>(i));
  return x;
}

void expect_near_all(const std::vector<float>& got, const std::vector<double>& want, double tol,
                     const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1.0 + std::abs(want[i]))) << what << " at " << i;
}

TEST(Graphs, RandomDeepGraphsMatchTheHostAndRef) {
  const int max_depth = env_int("LOCKSTEP_RANDOM_GRAPH_DEPTH", 3000);
  const int rounds = env_int("LOCKSTEP_RANDOM_GRAPH_ROUNDS", 3);
  std::mt19937_64 rng(20261203);
  const std::vector<float> w_host(weight().begin(), weight().end());
  for (int round = 0; round < rounds; ++round) {
    // Depths from shallow to the largest, spread on a log scale.
    const int depth = std::max(
        1, static_cast<int>(std::exp(std::uniform_real_distribution<double>(
               std::log(16.0), std::log(static_cast<double>(std::max(max_depth, 17))))(rng))));
    const std::vector<RandomOp> ops = random_ops(rng, depth);
    const std::string what = "round " + std::to_string(round) + ", depth " + std::to_string(depth);
    const std::vector<float> start = start_values();
    std::vector<double> want(start.begin(), start.end());
    for (const RandomOp& op : ops) want = host_apply(op, want);

    // Plain (one implicit sync at the read).
    const ls::Tensor w = ls::from_vector(w_host, {kN, kN});
    ls::Tensor x = ls::from_vector(start_values(), {kN, kN});
    for (const RandomOp& op : ops) x = record_op(op, x, w);
    expect_near_all(x.to_vector<float>(), want, 2e-4, "plain, " + what);

    // Inside a step.
    ls::Tensor y = ls::from_vector(start_values(), {kN, kN});
    ls::step([&] {
      for (const RandomOp& op : ops) y = record_op(op, y, w);
    });
    expect_near_all(y.to_vector<float>(), want, 2e-4, "in a step, " + what);

    // Through backward, on the cpu and on the ref backend: the same gradient.
    std::vector<std::vector<float>> grads;
    for (ls::Device device : {ls::default_device(), ls::Device{ls::DeviceKind::Ref, 0}}) {
      const ls::Tensor wd = ls::from_vector(w_host, {kN, kN}, device);
      ls::Tensor p = ls::from_vector(start_values(), {kN, kN}, device);
      p.set_requires_grad();
      ls::step([&] {
        ls::Tensor h = p;
        for (size_t k = 0; k < ops.size() / 4 + 1; ++k) h = record_op(ops[k], h, wd);
        ls::sum(h).backward();
      });
      grads.push_back(p.grad().to_vector<float>());
    }
    std::vector<double> ref(grads[1].begin(), grads[1].end());
    expect_near_all(grads[0], ref, 2e-4, "gradient against ref, " + what);
    std::printf("%s: passed\n", what.c_str());
  }
}

}  // namespace
