// lockstep against PyTorch: golden files written by tests/golden/make_training_fixtures.py hold,
// for an MLP and the small CNN, the initial state, one batch, the loss and every gradient of one
// step, and the state after 5 SGD-momentum and 5 AdamW steps. Everything must match within
// 1e-5 relative (max |ours - torch| <= 1e-5 * max |torch| per tensor).
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include <lockstep/lockstep.h>
#include "unit/golden_util.h"

namespace ls = lockstep;

namespace {

using golden::Fixture;

Fixture load(const std::string& name) { return golden::load(name); }

void expect_close(const ls::Tensor& ours, const ls::Tensor& torch, const std::string& what) {
  golden::expect_close(ours, torch, 1e-5, what);
}

template <typename Model>
void check(const std::string& file, const std::function<Model()>& make) {
  const Fixture f = load(file);
  const ls::Tensor x = f["x"], y = f["y"];

  // One forward and backward.
  {
    Model model = make();
    model.load_state_dict(f.with_prefix("init.", ".losses"));
    ls::Tensor loss;
    ls::step([&] {
      loss = ls::nn::cross_entropy(model(x), y);
      loss.backward();
    });
    expect_close(loss, f["loss"], "loss");
    for (auto& [name, p] : model.named_parameters()) {
      ASSERT_TRUE(p.grad().defined()) << name;
      expect_close(p.grad(), f["grad." + name], "grad of " + name);
    }
  }

  // Five steps of each optimizer from the same start, same batch.
  auto train = [&](const std::string& prefix, auto make_opt) {
    Model model = make();
    model.load_state_dict(f.with_prefix("init.", ".losses"));
    auto opt = make_opt(model.parameters());
    std::vector<float> losses;
    for (int i = 0; i < 5; ++i) {
      ls::Tensor loss;
      ls::step([&] {
        opt.zero_grad();
        loss = ls::nn::cross_entropy(model(x), y);
        loss.backward();
        opt.step();
      });
      losses.push_back(loss.item<float>());
    }
    expect_close(ls::from_vector<float>(losses), f[prefix + "losses"], prefix + "losses");
    for (auto& [name, t] : model.state_dict()) expect_close(t, f[prefix + name], prefix + name);
  };
  train("sgd.", [](std::vector<ls::Tensor> params) {
    return ls::optim::SGD(params, {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-4});
  });
  train("adamw.", [](std::vector<ls::Tensor> params) {
    return ls::optim::AdamW(
        params, {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01});
  });
}

}  // namespace

TEST(Golden, MlpMatchesPyTorch) {
  check<ls::models::MLP>("mlp_training.safetensors", [] {
    return ls::models::MLP({20, 32, 16, 5});
  });
}

TEST(Golden, CnnMatchesPyTorch) {
  check<ls::models::FashionCNN>("cnn_training.safetensors",
                                [] { return ls::models::FashionCNN(10, 1, 8); });
}
