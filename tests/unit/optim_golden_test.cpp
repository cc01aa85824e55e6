// Optimizers and schedules against PyTorch: tests/golden/make_optim_fixtures.py wrote a small
// model's state after 5 steps of RMSprop, Adagrad, Adadelta, Lion (its paper's rule), and SGD and
// AdamW with two parameter groups, on one batch; and the learning rates (and momenta) of
// OneCycleLR, LinearLR, ExponentialLR and ReduceLROnPlateau over their first steps.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <memory>

#include <lockstep/lockstep.h>

namespace ls = lockstep;
namespace optim = ls::optim;

namespace {

const std::map<std::string, ls::Tensor>& fixture() {
  static const std::map<std::string, ls::Tensor> f = [] {
    std::map<std::string, ls::Tensor> out;
    for (auto& [k, v] :
         ls::io::load_safetensors(std::string(LOCKSTEP_GOLDEN_DIR) + "/optim.safetensors").tensors)
      out[k] = v;
    return out;
  }();
  return f;
}

const ls::Tensor& at(const std::string& k) { return fixture().at(k); }

ls::nn::NamedTensors with_prefix(const std::string& prefix) {
  ls::nn::NamedTensors out;
  for (const auto& [k, v] : fixture())
    if (k.rfind(prefix, 0) == 0) out.emplace_back(k.substr(prefix.size()), v);
  return out;
}

struct Model {
  ls::nn::Sequential net;
  Model() {
    net.emplace<ls::nn::Linear>(6, 5).emplace<ls::nn::Tanh>().emplace<ls::nn::Linear>(5, 3);
    net.load_state_dict(with_prefix("init."));
  }
  std::vector<ls::Tensor> weights() const {
    return {net.state_dict()[0].second, net.state_dict()[2].second};
  }
  std::vector<ls::Tensor> biases() const {
    return {net.state_dict()[1].second, net.state_dict()[3].second};
  }
};

using MakeOpt = std::function<std::unique_ptr<optim::Optimizer>(Model&)>;

void expect_state(const Model& m, const std::string& name) {
  for (const auto& [k, v] : m.net.state_dict()) {
    const std::vector<float> a = v.to_vector<float>(), b = at(name + "." + k).to_vector<float>();
    double diff = 0, scale = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
      scale = std::max(scale, std::abs(static_cast<double>(b[i])));
    }
    EXPECT_LE(diff, 1e-5 * scale) << name << " " << k << ": max |diff| " << diff;
  }
}

TEST(OptimGolden, StatesAfterFiveStepsMatchPyTorch) {
  const std::map<std::string, MakeOpt> configs = {
      {"rmsprop",
       [](Model& m) {
         return std::make_unique<optim::RMSprop>(m.net.parameters(),
                                                 optim::RMSpropOptions{.lr = 1e-2});
       }},
      {"rmsprop_centered",
       [](Model& m) {
         return std::make_unique<optim::RMSprop>(
             m.net.parameters(),
             optim::RMSpropOptions{
                 .lr = 1e-2, .weight_decay = 0.01, .momentum = 0.9, .centered = true});
       }},
      {"adagrad",
       [](Model& m) {
         return std::make_unique<optim::Adagrad>(
             m.net.parameters(), optim::AdagradOptions{.lr = 0.1,
                                                       .lr_decay = 0.01,
                                                       .weight_decay = 0.02,
                                                       .initial_accumulator_value = 0.1});
       }},
      {"adadelta",
       [](Model& m) {
         return std::make_unique<optim::Adadelta>(m.net.parameters(), optim::AdadeltaOptions{});
       }},
      {"adadelta_decay",
       [](Model& m) {
         return std::make_unique<optim::Adadelta>(
             m.net.parameters(),
             optim::AdadeltaOptions{.lr = 0.5, .rho = 0.8, .eps = 1e-5, .weight_decay = 0.02});
       }},
      {"lion",
       [](Model& m) {
         return std::make_unique<optim::Lion>(m.net.parameters(),
                                              optim::LionOptions{.lr = 1e-3, .weight_decay = 0.1});
       }},
      {"sgd_groups",
       [](Model& m) {
         auto o = std::make_unique<optim::SGD>(
             m.weights(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01});
         o->add_param_group({m.biases(), 0.05, 0.0});
         return o;
       }},
      {"adamw_groups",
       [](Model& m) {
         auto o = std::make_unique<optim::AdamW>(
             m.weights(), optim::AdamOptions{.lr = 1e-2, .weight_decay = 0.1});
         o->add_param_group({m.biases(), 5e-3, 0.0});
         return std::unique_ptr<optim::Optimizer>(std::move(o));
       }},
  };
  const ls::Tensor x = at("x"), y = at("y");
  for (const auto& [name, make] : configs) {
    SCOPED_TRACE(name);
    Model m;
    auto opt = make(m);
    auto one = [&] {
      ls::step([&] {
        opt->zero_grad();
        ls::nn::cross_entropy(m.net(x), y).backward();
        opt->step();
      });
    };
    one();  // also computes the optimizer state it creates
    ls::wait();
    const int64_t compiles = ls::metrics::counter("compiles");
    for (int s = 1; s < 5; ++s) one();
    ls::wait();
    // The second step's program reads the state as data; from then on every step hits.
    EXPECT_LE(ls::metrics::counter("compiles") - compiles, 1);
    expect_state(m, name);
  }
}

TEST(OptimGolden, AGroupsLearningRateChangesWithoutARecompile) {
  Model m;
  optim::SGD opt(m.weights(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01});
  opt.add_param_group({m.biases(), 0.05, 0.0});
  EXPECT_EQ(opt.num_param_groups(), 2u);
  EXPECT_EQ(opt.group_weight_decay(1), 0.0);
  EXPECT_EQ(opt.group_weight_decay(0), 0.01);
  const ls::Tensor x = at("x"), y = at("y");
  auto one = [&] {
    ls::step([&] {
      opt.zero_grad();
      ls::nn::cross_entropy(m.net(x), y).backward();
      opt.step();
    });
  };
  one();
  ls::wait();
  const int64_t compiles = ls::metrics::counter("compiles");
  for (int i = 0; i < 5; ++i) {
    opt.set_group_lr(1, 0.01 * (i + 1));
    one();
  }
  ls::wait();
  EXPECT_EQ(ls::metrics::counter("compiles") - compiles, 0);
  EXPECT_THROW(opt.add_param_group({m.biases()}), ls::Error);  // already in group 1
  EXPECT_THROW(opt.set_group_lr(2, 0.1), ls::Error);
  EXPECT_THROW(opt.add_param_group({{ls::zeros({2})}, -1.0}), ls::Error);
}

std::vector<double> f64s(const std::string& k) { return at(k).to_vector<double>(); }

void expect_near_all(const std::vector<double>& got, const std::vector<double>& want,
                     const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-12 * std::max(1.0, std::abs(want[i])))
        << what << " [" << i << "]";
}

TEST(OptimGolden, SchedulesGiveTorchsLearningRatesAndMomenta) {
  ls::Tensor p = ls::zeros({1}).set_requires_grad();
  auto record = [&](optim::Optimizer& opt, auto& sched, int n, std::vector<double>* lrs,
                    std::vector<double>* ms) {
    for (int i = 0; i < n; ++i) {
      lrs->push_back(opt.lr());
      if (ms) ms->push_back(opt.momentum());
      sched.step();
    }
  };
  {
    optim::SGD opt({p}, {.lr = 0.1, .momentum = 0.9});
    optim::OneCycleLR s(opt, {.max_lr = 0.5, .total_steps = 30});
    std::vector<double> lrs, ms;
    record(opt, s, 30, &lrs, &ms);
    expect_near_all(lrs, f64s("sched.onecycle.lr"), "onecycle lr");
    expect_near_all(ms, f64s("sched.onecycle.momentum"), "onecycle momentum");
    EXPECT_THROW(s.step(), ls::Error);  // past total_steps, as PyTorch
  }
  {
    optim::Adam opt({p}, {.lr = 0.1});
    optim::OneCycleLR s(
        opt, {.max_lr = 0.2, .total_steps = 20, .cos_anneal = false, .three_phase = true});
    std::vector<double> lrs, ms;
    record(opt, s, 20, &lrs, &ms);
    expect_near_all(lrs, f64s("sched.onecycle3.lr"), "three-phase lr");
    expect_near_all(ms, f64s("sched.onecycle3.momentum"), "three-phase beta1");
  }
  {
    optim::SGD opt({p}, {.lr = 0.1});
    optim::LinearLR s(opt);
    std::vector<double> lrs;
    record(opt, s, 8, &lrs, nullptr);
    expect_near_all(lrs, f64s("sched.linear.lr"), "linear");
  }
  {
    optim::SGD opt({p}, {.lr = 0.1});
    optim::ExponentialLR s(opt, 0.8);
    std::vector<double> lrs;
    record(opt, s, 8, &lrs, nullptr);
    expect_near_all(lrs, f64s("sched.exponential.lr"), "exponential");
  }
  {
    optim::SGD opt({p}, {.lr = 1.0});
    optim::ReduceLROnPlateau s(opt, {.factor = 0.5, .patience = 2, .cooldown = 1, .min_lr = 0.1});
    std::vector<double> lrs;
    for (double metric : f64s("sched.plateau.metrics")) {
      s.step(metric);
      lrs.push_back(opt.lr());
    }
    expect_near_all(lrs, f64s("sched.plateau.lr"), "plateau");
  }
  {
    // Schedules scale each group from its own base lr.
    ls::Tensor q = ls::zeros({1}).set_requires_grad();
    optim::SGD opt({p}, {.lr = 0.1});
    opt.add_param_group({{q}, 0.02});
    optim::ExponentialLR s(opt, 0.5);
    s.step();
    EXPECT_DOUBLE_EQ(opt.group_lr(0), 0.05);
    EXPECT_DOUBLE_EQ(opt.group_lr(1), 0.01);
  }
  optim::Adagrad adagrad({p}, {});
  EXPECT_THROW(optim::OneCycleLR(adagrad, {.max_lr = 0.1, .total_steps = 10}), ls::Error);
  EXPECT_NO_THROW(
      optim::OneCycleLR(adagrad, {.max_lr = 0.1, .total_steps = 10, .cycle_momentum = false}));
  optim::SGD plain({p}, {.lr = 0.1});
  EXPECT_THROW(optim::OneCycleLR(plain, {.max_lr = 0.1, .total_steps = 10}), ls::Error);
}

}  // namespace
