// Tests of optim.h: SGD and Adam/AdamW against PyTorch's update formulas computed here in double,
// no recompiles when the learning rate changes, the schedules, gradient clipping, skipping
// non-finite updates, rollback of a failed step, optimizer state dicts and bad hyper-parameters.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <numbers>
#include <stdexcept>

#include "unit/ops_test_util.h"
#include "unit/train_test_util.h"

namespace {

using ops_test::f32;
using ops_test::f64;
using train_test::as_double;
using train_test::Delta;
using train_test::differences;
using train_test::expect_all_near;
using train_test::full_snapshot;
using train_test::raw;
using train_test::snapshot;

// The quadratic f(p) = 0.5 sum a (p - c)^2, gradient a (p - c).
const std::vector<double> kP0{1.0, -2.0, 0.5}, kA{1.0, 3.0, 0.5}, kC{0.2, 0.1, -1.0};

std::vector<double> grad_at(const std::vector<double>& p) {
  std::vector<double> g(p.size());
  for (size_t i = 0; i < p.size(); ++i) g[i] = kA[i] * (p[i] - kC[i]);
  return g;
}

ls::Tensor quadratic(const ls::Tensor& p) {
  const ls::Tensor a = ls::from_vector<double>(kA).to(p.dtype());
  const ls::Tensor c = ls::from_vector<double>(kC).to(p.dtype());
  ls::Tensor d = p - c;
  return ls::sum(a * d * d) * 0.5;
}

// torch.optim.SGD, step by step.
std::vector<double> sgd_ref(const ls::optim::SGDOptions& o, int steps,
                            const std::vector<double>& lrs = {}) {
  std::vector<double> p = kP0, buf;
  for (int s = 0; s < steps; ++s) {
    const double lr = lrs.empty() ? o.lr : lrs[s];
    std::vector<double> d = grad_at(p);
    for (size_t i = 0; i < p.size(); ++i) d[i] += o.weight_decay * p[i];
    if (o.momentum != 0) {
      if (buf.empty()) {
        buf = d;
      } else {
        for (size_t i = 0; i < p.size(); ++i)
          buf[i] = o.momentum * buf[i] + (1 - o.dampening) * d[i];
      }
      for (size_t i = 0; i < p.size(); ++i) d[i] = o.nesterov ? d[i] + o.momentum * buf[i] : buf[i];
    }
    for (size_t i = 0; i < p.size(); ++i) p[i] -= lr * d[i];
  }
  return p;
}

// torch.optim.Adam / AdamW, step by step.
std::vector<double> adam_ref(const ls::optim::AdamOptions& o, bool decoupled, int steps) {
  std::vector<double> p = kP0, m(3, 0), v(3, 0);
  for (int t = 1; t <= steps; ++t) {
    std::vector<double> g = grad_at(p);
    for (size_t i = 0; i < p.size(); ++i) {
      if (decoupled)
        p[i] *= 1 - o.lr * o.weight_decay;
      else
        g[i] += o.weight_decay * p[i];
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g[i];
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g[i] * g[i];
      const double bc1 = 1 - std::pow(o.beta1, t), bc2 = 1 - std::pow(o.beta2, t);
      p[i] -= o.lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + o.eps);
    }
  }
  return p;
}

// Runs `steps` training steps of the quadratic with `opt` on `p`.
void train(ls::Tensor& p, ls::optim::Optimizer& opt, int steps,
           const std::function<void(int)>& before_step = {}) {
  for (int s = 0; s < steps; ++s) {
    if (before_step) before_step(s);
    ls::step([&] {
      opt.zero_grad();
      quadratic(p).backward();
      opt.step();
    });
  }
}

ls::Tensor param(ls::DType dt = ls::f64) {
  ls::Tensor p = ls::from_vector<double>(kP0).to(dt);
  p.set_requires_grad();
  return p;
}

}  // namespace

TEST(OptimSgd, MatchesPyTorchFormulas) {
  const std::vector<ls::optim::SGDOptions> configs{
      {.lr = 0.1},
      {.lr = 0.1, .momentum = 0.9},
      {.lr = 0.05, .momentum = 0.8, .dampening = 0.3},
      {.lr = 0.1, .momentum = 0.9, .nesterov = true},
      {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.1},
      {.lr = 0.2, .weight_decay = 0.5},
      {.lr = 0.1, .momentum = 0.5, .weight_decay = 0.05, .nesterov = true},
  };
  for (size_t k = 0; k < configs.size(); ++k) {
    SCOPED_TRACE(::testing::Message() << "config " << k);
    ls::Tensor p = param();
    ls::optim::SGD opt({p}, configs[k]);
    train(p, opt, 3);
    expect_all_near(p.to_vector<double>(), sgd_ref(configs[k], 3), 1e-14);
    EXPECT_EQ(opt.step_count().item<int64_t>(), 3);
    // Float32 parameters follow the same formulas.
    ls::Tensor q = param(ls::f32);
    ls::optim::SGD opt32({q}, configs[k]);
    train(q, opt32, 3);
    expect_all_near(as_double(q), sgd_ref(configs[k], 3), 1e-6);
  }
}

TEST(OptimAdam, AdamAndAdamWMatchPyTorchFormulas) {
  const std::vector<ls::optim::AdamOptions> configs{
      {.lr = 0.1},
      {.lr = 0.05, .beta1 = 0.8, .beta2 = 0.9, .eps = 1e-3},
      {.lr = 0.1, .weight_decay = 0.1},
  };
  for (size_t k = 0; k < configs.size(); ++k) {
    for (bool decoupled : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "config " << k << (decoupled ? " AdamW" : " Adam"));
      ls::Tensor p = param();
      ls::optim::Adam opt({p}, configs[k], decoupled);
      train(p, opt, 3);
      expect_all_near(p.to_vector<double>(), adam_ref(configs[k], decoupled, 3), 1e-13);
      ls::Tensor q = param(ls::f32);
      ls::optim::Adam opt32({q}, configs[k], decoupled);
      train(q, opt32, 3);
      expect_all_near(as_double(q), adam_ref(configs[k], decoupled, 3), 2e-6);
    }
  }
  // The AdamW class is Adam with decoupled weight decay.
  ls::Tensor p = param();
  ls::optim::AdamW opt({p}, configs[2]);
  train(p, opt, 3);
  expect_all_near(p.to_vector<double>(), adam_ref(configs[2], true, 3), 1e-13);
  EXPECT_THAT(train_test::snapshot(opt.state_dict()),
              ::testing::ElementsAre(::testing::Key("step"), ::testing::Key("skipped_updates"),
                                     ::testing::Key("0.step"), ::testing::Key("0.exp_avg"),
                                     ::testing::Key("0.exp_avg_sq")));
}

TEST(OptimAdam, ParametersWithoutGradientsAreLeftAlone) {
  ls::Tensor p = param(), unused = param();
  const auto before = raw(unused);
  ls::optim::Adam opt({p, unused}, {.lr = 0.1, .weight_decay = 0.1});
  train(p, opt, 2);
  EXPECT_EQ(raw(unused), before);  // no gradient: no update and no weight decay (as PyTorch)
  for (const auto& [name, t] : opt.state_dict()) {
    if (name == "1.step") {
      EXPECT_EQ(t.item<int64_t>(), 0);
    } else if (name.rfind("1.", 0) == 0) {
      EXPECT_EQ(as_double(t), std::vector<double>(3, 0.0)) << name;
    }
  }
}

TEST(OptimAdam, AParameterFirstUpdatedLaterCountsItsOwnSteps) {
  // As PyTorch: each parameter's step count (Adam's bias correction, SGD's first momentum
  // step) starts at its own first update, not at the optimizer's.
  const ls::optim::AdamOptions ao{.lr = 0.1, .beta1 = 0.8, .beta2 = 0.9};
  const ls::optim::SGDOptions so{.lr = 0.1, .momentum = 0.9, .dampening = 0.5};
  for (bool adam : {true, false}) {
    SCOPED_TRACE(adam ? "Adam" : "SGD");
    ls::Tensor p = param(), q = param();
    std::unique_ptr<ls::optim::Optimizer> opt;
    if (adam)
      opt = std::make_unique<ls::optim::Adam>(std::vector<ls::Tensor>{p, q}, ao);
    else
      opt = std::make_unique<ls::optim::SGD>(std::vector<ls::Tensor>{p, q}, so);
    for (int s = 0; s < 3; ++s)
      ls::step([&] {
        opt->zero_grad();
        (s == 0 ? quadratic(p) : quadratic(p) + quadratic(q)).backward();
        opt->step();
      });
    EXPECT_EQ(opt->step_count().item<int64_t>(), 3);
    expect_all_near(p.to_vector<double>(), adam ? adam_ref(ao, false, 3) : sgd_ref(so, 3), 1e-14);
    expect_all_near(q.to_vector<double>(), adam ? adam_ref(ao, false, 2) : sgd_ref(so, 2), 1e-14);
    std::map<std::string, int64_t> steps;
    for (const auto& [name, t] : opt->state_dict())
      if (t.dtype() == ls::i64) steps[name] = t.item<int64_t>();
    EXPECT_EQ(steps, (std::map<std::string, int64_t>{
                         {"step", 3}, {"skipped_updates", 0}, {"0.step", 3}, {"1.step", 2}}));
  }
}

TEST(OptimSgd, ChangingTheLearningRateEveryStepNeverRecompiles) {
  ls::manual_seed(4);
  ls::models::MLP model({6, 16, 3});
  ls::optim::SGD opt(model.parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-4});
  ls::optim::CosineWarmupLR sched(opt, 5, 21, 0.001);
  ls::Tensor x = ls::randn({8, 6});
  ls::Tensor y = ls::from_vector<int64_t>({0, 1, 2, 0, 1, 2, 0, 1});
  ls::sync();
  ls::wait();
  auto one_step = [&] {
    ls::step([&] {
      opt.zero_grad();
      ls::nn::cross_entropy(model(x), y).backward();
      opt.step();
    });
    sched.step();
  };
  one_step();
  ls::wait();
  Delta compiles("compiles"), hits("cache_hits");
  std::vector<double> lrs;
  for (int i = 0; i < 20; ++i) {
    lrs.push_back(opt.lr());
    one_step();
  }
  ls::wait();
  EXPECT_EQ(compiles.get(), 0);
  EXPECT_GE(hits.get(), 20);
  EXPECT_GT(*std::max_element(lrs.begin(), lrs.end()), 5 * lrs.back());  // it did change

  // The same for Adam, with lr set by hand.
  ls::optim::Adam adam(model.parameters(), {.lr = 1e-3});
  auto adam_step = [&](int i) {
    adam.set_lr(1e-3 / (1 + i));
    ls::step([&] {
      adam.zero_grad();
      ls::nn::cross_entropy(model(x), y).backward();
      adam.step();
    });
  };
  adam_step(0);
  ls::wait();
  Delta adam_compiles("compiles");
  for (int i = 1; i <= 20; ++i) adam_step(i);
  ls::wait();
  EXPECT_EQ(adam_compiles.get(), 0);
}

TEST(OptimSgd, LearningRatesFromTheScheduleAreTheOnesUsed) {
  // lr changes per step; the result matches the reference fed the same lrs.
  ls::Tensor p = param();
  ls::optim::SGD opt({p}, {.lr = 0.2, .momentum = 0.9});
  ls::optim::StepLR sched(opt, 1, 0.5);
  std::vector<double> lrs;
  for (int s = 0; s < 3; ++s) {
    lrs.push_back(opt.lr());
    train(p, opt, 1);
    sched.step();
  }
  EXPECT_EQ(lrs, (std::vector<double>{0.2, 0.1, 0.05}));
  expect_all_near(p.to_vector<double>(), sgd_ref({.lr = 0.2, .momentum = 0.9}, 3, lrs), 1e-14);
}

TEST(OptimSchedulers, StepMultiStepAndCosineWarmupValues) {
  ls::Tensor p = param();
  {
    ls::optim::SGD opt({p}, {.lr = 0.1});
    ls::optim::StepLR s(opt, 3, 0.5);
    EXPECT_DOUBLE_EQ(opt.lr(), 0.1);
    for (int k = 1; k <= 10; ++k) {
      s.step();
      EXPECT_DOUBLE_EQ(opt.lr(), 0.1 * std::pow(0.5, k / 3)) << k;
      EXPECT_EQ(s.count(), k);
    }
  }
  {
    ls::optim::SGD opt({p}, {.lr = 1.0});
    ls::optim::MultiStepLR s(opt, {2, 5, 5}, 0.1);
    const std::vector<double> want{1, 1, 0.1, 0.1, 0.1, 0.001, 0.001};  // counts 0..6
    for (int k = 0; k <= 6; ++k) {
      EXPECT_NEAR(s.lr_at(k), want[k], 1e-15) << k;
      if (k) {
        s.step();
        EXPECT_NEAR(opt.lr(), want[k], 1e-15) << k;
      }
    }
  }
  {
    ls::optim::SGD opt({p}, {.lr = 0.5});
    ls::optim::CosineWarmupLR s(opt, 4, 14, 0.05);
    EXPECT_DOUBLE_EQ(opt.lr(), 0.0);  // warm-up starts from 0
    for (int k = 1; k <= 20; ++k) {
      s.step();
      double want;
      if (k < 4)
        want = 0.5 * k / 4;
      else if (k >= 14)
        want = 0.05;
      else
        want = 0.05 + 0.45 * 0.5 * (1 + std::cos(std::numbers::pi * (k - 4) / 10.0));
      EXPECT_NEAR(opt.lr(), want, 1e-15) << k;
    }
    s.set_count(4);
    EXPECT_NEAR(opt.lr(), 0.5, 1e-15);
    s.set_count(9);
    EXPECT_NEAR(opt.lr(), 0.05 + 0.45 * 0.5, 1e-15);
  }
}

TEST(OptimClip, ClipGradNormReturnsThePreClipNormAndScales) {
  ls::Tensor a = f32({3, 0, 4}), b = f32({0, 12}, {2, 1}), c = f32({1});
  for (ls::Tensor* t : {&a, &b, &c}) t->set_requires_grad();
  a.set_grad(f32({3, 0, 4}));
  b.set_grad(f32({0, 12}, {2, 1}));  // c has no gradient: skipped
  ls::Tensor norm;
  Delta implicit("implicit_syncs");
  ls::step([&] { norm = ls::optim::clip_grad_norm_({a, b, c}, 6.5); });
  EXPECT_EQ(implicit.get(), 0);  // recorded, no host round trip
  EXPECT_NEAR(norm.item<float>(), 13, 1e-6);
  const std::vector<float> ga = a.grad().to_vector<float>(), gb = b.grad().to_vector<float>();
  double sq = 0;
  for (float v : ga) sq += double(v) * v;
  for (float v : gb) sq += double(v) * v;
  EXPECT_NEAR(std::sqrt(sq), 6.5, 1e-5);
  EXPECT_NEAR(ga[2], 2, 1e-6);
  EXPECT_FALSE(c.grad().defined());
  // Below max_norm: gradients unchanged.
  const auto before = raw(a.grad());
  ls::step([&] { norm = ls::optim::clip_grad_norm_({a, b, c}, 100); });
  EXPECT_NEAR(norm.item<float>(), 6.5, 1e-5);
  EXPECT_EQ(raw(a.grad()), before);
  EXPECT_THROW(ls::optim::clip_grad_norm_({a}, 0), ls::Error);
  EXPECT_THROW(ls::optim::clip_grad_norm_({a}, std::nan("")), ls::Error);
}

TEST(OptimClip, Float64GradientsKeepFloat64Precision) {
  ls::Tensor p = f64({1e-3, 2e-3, 1.0 + 1e-12});
  p.set_requires_grad();
  p.set_grad(f64({3e-9, 4e-9, 0}));
  ls::Tensor norm = ls::optim::clip_grad_norm_({p}, 1e-9);
  EXPECT_EQ(norm.dtype(), ls::f64);
  EXPECT_NEAR(norm.item<double>(), 5e-9, 1e-22);
  const std::vector<double> g = p.grad().to_vector<double>();
  EXPECT_NEAR(g[0], 3e-9 * 1e-9 / (5e-9 + 1e-6), 1e-24);
}

TEST(OptimSkip, NonFiniteLossOrGradientSkipsTheWholeUpdate) {
  ls::Tensor p = f32({1.0f, -2.0f, 0.5f});
  p.set_requires_grad();
  ls::optim::SGD opt({p}, {.lr = 0.1, .momentum = 0.9, .skip_nonfinite = true});
  auto step = [&](float s, bool pass_loss, float loss_offset = 0) {
    ls::step([&] {
      opt.zero_grad();
      ls::Tensor loss = ls::sum(p * p) * ls::full({}, s);
      loss.backward();
      opt.step(pass_loss ? loss + ls::full({}, loss_offset) : ls::Tensor());
    });
  };
  step(1, true);
  ls::wait();
  const auto after_first = full_snapshot(ls::nn::Sequential(), &opt);
  const auto p1 = raw(p);
  Delta metric("skipped_updates");
  step(std::numeric_limits<float>::infinity(), true);      // inf loss, inf gradients
  step(std::nanf(""), false);                              // NaN gradients, no loss given
  step(1, true, std::numeric_limits<float>::quiet_NaN());  // finite gradients, NaN loss
  ls::wait();
  EXPECT_EQ(metric.get(), 3);
  EXPECT_EQ(opt.skipped_updates().item<int64_t>(), 3);
  EXPECT_EQ(raw(p), p1);
  auto now = full_snapshot(ls::nn::Sequential(), &opt);
  // Everything but the skipped-updates counter is bit-identical.
  EXPECT_THAT(differences(after_first, now), ::testing::ElementsAre("optimizer.skipped_updates"));
  EXPECT_EQ(opt.step_count().item<int64_t>(), 1);
  // A later finite step updates normally: as if the skipped ones never happened.
  step(1, true);
  ls::Tensor q = f32({1.0f, -2.0f, 0.5f});
  q.set_requires_grad();
  ls::optim::SGD ref({q}, {.lr = 0.1, .momentum = 0.9});
  for (int i = 0; i < 2; ++i)
    ls::step([&] {
      ref.zero_grad();
      ls::sum(q * q).backward();
      ref.step();
    });
  EXPECT_EQ(raw(p), raw(q));
  EXPECT_EQ(opt.step_count().item<int64_t>(), 2);
  ls::wait();
  EXPECT_EQ(metric.get(), 3);
}

TEST(OptimSkip, LargeButFiniteGradientsAreNotSkipped) {
  ls::Tensor p = f32({1e20f, -3e19f});
  p.set_requires_grad();
  ls::optim::SGD opt({p}, {.lr = 0.5, .skip_nonfinite = true});
  ls::step([&] {
    ls::sum(p * p * 0.5f).backward();  // gradient = p: finite, though its square is not in f32
    opt.step();
  });
  EXPECT_EQ(opt.skipped_updates().item<int64_t>(), 0);
  EXPECT_EQ(p.to_vector<float>(), (std::vector<float>{5e19f, -1.5e19f}));
}

TEST(OptimRollback, ExceptionAfterTheUpdateRestoresEverythingBitForBit) {
  ls::manual_seed(8);
  ls::models::FashionCNN model(10, 1, 8);
  ls::optim::SGD opt(model.parameters(), {.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-4});
  ls::Tensor y = ls::from_vector<int64_t>({1, 3, 5, 7});
  auto body = [&] {
    opt.zero_grad();
    ls::Tensor x = ls::randn({4, 1, 8, 8});
    ls::nn::cross_entropy(model(x), y).backward();
    opt.step();
  };
  ls::step(body);  // momentum buffers and running stats are non-trivial now
  const auto before = full_snapshot(model, &opt);
  const auto grads = snapshot({{"g", model.conv1->weight.grad()}});
  EXPECT_THROW(ls::step([&] {
                 body();
                 throw std::runtime_error("after opt.step()");
               }),
               std::runtime_error);
  EXPECT_EQ(differences(before, full_snapshot(model, &opt)), std::vector<std::string>{});
  EXPECT_EQ(opt.step_count().item<int64_t>(), 1);
  EXPECT_EQ(snapshot({{"g", model.conv1->weight.grad()}}), grads);
  // The same with Adam, and the next step works.
  ls::optim::AdamW adam(model.parameters(), {.lr = 1e-3, .weight_decay = 0.01});
  ls::step([&] {
    adam.zero_grad();
    ls::nn::cross_entropy(model(ls::randn({4, 1, 8, 8})), y).backward();
    adam.step();
  });
  const auto before_adam = full_snapshot(model, &adam);
  EXPECT_THROW(ls::step([&] {
                 adam.zero_grad();
                 ls::nn::cross_entropy(model(ls::randn({4, 1, 8, 8})), y).backward();
                 adam.step();
                 throw std::runtime_error("after adam.step()");
               }),
               std::runtime_error);
  EXPECT_EQ(differences(before_adam, full_snapshot(model, &adam)), std::vector<std::string>{});
  ls::step(body);
  EXPECT_EQ(opt.step_count().item<int64_t>(), 2);
  EXPECT_FALSE(differences(before_adam, full_snapshot(model, &adam)).empty());
}

TEST(OptimStateDict, RoundTripContinuesIdentically) {
  ls::Tensor p = param(ls::f32), q = param(ls::f32);
  ls::optim::Adam a({p}, {.lr = 0.05});
  train(p, a, 2);
  const ls::nn::NamedTensors saved = train_test::host_copies(a.state_dict());
  {
    ls::NoGrad ng;
    q.copy_(p);
  }
  ls::optim::Adam b({q}, {.lr = 0.05});
  b.load_state_dict(saved);
  EXPECT_EQ(differences(snapshot(a.state_dict()), snapshot(b.state_dict())),
            std::vector<std::string>{});
  train(p, a, 2);
  train(q, b, 2);
  EXPECT_EQ(raw(p), raw(q));
  EXPECT_EQ(b.step_count().item<int64_t>(), 4);
  // Mismatches are errors naming the entry, and load nothing.
  const auto b_state = snapshot(b.state_dict());
  ls::nn::NamedTensors bad = saved;
  for (auto& [name, t] : bad)
    if (name == "0.exp_avg") t = ls::zeros({4});
  EXPECT_LS_ERROR(b.load_state_dict(bad), "0.exp_avg", "[4]");
  bad = saved;
  const std::string dropped = bad.back().first;
  bad.pop_back();
  bad.emplace_back("0.not_a_state", ls::zeros({4}));
  EXPECT_LS_ERROR(b.load_state_dict(bad), "optimizer load_state_dict", "missing: " + dropped,
                  "unexpected: 0.not_a_state", "Nothing was loaded");
  ls::optim::SGD sgd({q}, {.lr = 0.1, .momentum = 0.9});
  EXPECT_THROW(sgd.load_state_dict(saved), ls::Error);
  EXPECT_THROW(b.check_state_dict(sgd.state_dict()), ls::Error);
  EXPECT_EQ(differences(b_state, snapshot(b.state_dict())), std::vector<std::string>{});
}

TEST(OptimErrors, BadHyperParameters) {
  ls::Tensor p = param();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THROW(ls::optim::SGD({p}, {.lr = -0.1}), ls::Error);
  EXPECT_THROW(ls::optim::SGD({p}, {.lr = nan}), ls::Error);
  EXPECT_THROW(ls::optim::SGD({p}, {.momentum = -0.5}), ls::Error);
  EXPECT_THROW(ls::optim::SGD({p}, {.momentum = nan}), ls::Error);
  EXPECT_THROW(ls::optim::SGD({p}, {.dampening = -1}), ls::Error);
  EXPECT_THROW(ls::optim::SGD({p}, {.weight_decay = -1e-4}), ls::Error);
  EXPECT_THROW(ls::optim::SGD({p}, {.weight_decay = nan}), ls::Error);
  EXPECT_THROW(ls::optim::SGD({p}, {.nesterov = true}), ls::Error);
  EXPECT_THROW(ls::optim::SGD({p}, {.momentum = 0.9, .dampening = 0.1, .nesterov = true}),
               ls::Error);
  EXPECT_THROW(ls::optim::Adam({p}, {.lr = -1}), ls::Error);
  EXPECT_THROW(ls::optim::Adam({p}, {.beta1 = 1.0}), ls::Error);
  EXPECT_THROW(ls::optim::Adam({p}, {.beta2 = -0.1}), ls::Error);
  EXPECT_THROW(ls::optim::Adam({p}, {.beta1 = nan}), ls::Error);
  EXPECT_THROW(ls::optim::Adam({p}, {.eps = -1e-8}), ls::Error);
  EXPECT_THROW(ls::optim::AdamW({p}, {.weight_decay = -0.01}), ls::Error);
  EXPECT_THROW(ls::optim::AdamW({p}, {.eps = nan}), ls::Error);
  EXPECT_THROW(ls::optim::SGD({}, {}), ls::Error);
  EXPECT_THROW(ls::optim::SGD({ls::Tensor()}, {}), ls::Error);
  EXPECT_THROW(ls::optim::SGD({ls::from_vector<int64_t>({1})}, {}), ls::Error);
  ls::optim::SGD opt({p}, {.lr = 0.1});
  EXPECT_THROW(ls::optim::StepLR(opt, 0), ls::Error);
  EXPECT_THROW(ls::optim::MultiStepLR(opt, {5, 2}), ls::Error);
  EXPECT_THROW(ls::optim::CosineWarmupLR(opt, 10, 10), ls::Error);
  EXPECT_THROW(ls::optim::CosineWarmupLR(opt, -1, 10), ls::Error);
  EXPECT_DOUBLE_EQ(opt.lr(), 0.1);  // failed schedulers leave the lr alone
}
