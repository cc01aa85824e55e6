// lockstep against PyTorch: golden files written by tests/golden/make_training_fixtures.py hold,
// for an MLP and the small CNN, the initial state, one batch, the loss and every gradient of one
// step, and the state after 5 SGD-momentum and 5 AdamW steps. Everything must match within
// 1e-5 relative (max |ours - torch| <= 1e-5 * max |torch| per tensor).
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include <lockstep/lockstep.h>

namespace ls = lockstep;

namespace {

struct Fixture {
  std::map<std::string, ls::Tensor> t;
  const ls::Tensor& operator[](const std::string& k) const {
    auto it = t.find(k);
    if (it == t.end()) throw std::runtime_error("fixture has no " + k);
    return it->second;
  }
  ls::nn::NamedTensors with_prefix(const std::string& prefix) const {
    ls::nn::NamedTensors out;
    for (const auto& [k, v] : t)
      if (k.rfind(prefix, 0) == 0 && k.find(".losses") == std::string::npos)
        out.emplace_back(k.substr(prefix.size()), v);
    return out;
  }
};

Fixture load(const std::string& name) {
  Fixture f;
  for (auto& [k, v] :
       ls::io::load_safetensors(std::string(LOCKSTEP_GOLDEN_DIR) + "/" + name).tensors)
    f.t[k] = v;
  return f;
}

void expect_close(const ls::Tensor& ours, const ls::Tensor& torch, const std::string& what) {
  ASSERT_EQ(ours.shape(), torch.shape()) << what;
  ASSERT_EQ(ours.dtype(), torch.dtype()) << what;
  if (ours.dtype() == ls::i64) {
    EXPECT_EQ(ours.to_vector<int64_t>(), torch.to_vector<int64_t>()) << what;
    return;
  }
  const std::vector<float> a = ours.to_vector<float>(), b = torch.to_vector<float>();
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  EXPECT_LE(diff, 1e-5 * std::max(scale, 1e-12))
      << what << ": max |diff| " << diff << " against max |torch| " << scale;
}

template <typename Model>
void check(const std::string& file, const std::function<Model()>& make) {
  const Fixture f = load(file);
  const ls::Tensor x = f["x"], y = f["y"];

  // One forward and backward.
  {
    Model model = make();
    model.load_state_dict(f.with_prefix("init."));
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
    model.load_state_dict(f.with_prefix("init."));
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
