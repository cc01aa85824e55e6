// The nn pieces a libtorch user reaches for: ModuleList, ModuleDict, named_modules, apply,
// modules whose forward takes several tensors, the activation modules, and nn::init with
// PyTorch's formulas (values below are PyTorch 1.13's, from torch.nn.init).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include <lockstep/lockstep.h>

namespace ls = lockstep;
namespace nn = ls::nn;
using ::testing::HasSubstr;

namespace {

// A module whose forward takes an input and a mask, called like any other.
class Masked : public nn::Module {
 public:
  Masked() { proj = register_module("proj", std::make_shared<nn::Linear>(4, 4)); }
  ls::Tensor forward(const ls::Tensor& x, const ls::Tensor& mask) {
    return ls::masked_fill((*proj)(x), mask, 0.0);
  }
  ls::Tensor forward(const ls::Tensor& x) override { return (*proj)(x); }
  using Module::operator();
  ls::Tensor operator()(const ls::Tensor& x, const ls::Tensor& mask,
                        ls::Loc loc = ls::Loc::current()) {
    return call(loc, [&] { return forward(x, mask); });
  }
  std::shared_ptr<nn::Linear> proj;
};

double sample_std(const std::vector<float>& v) {
  const double m = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  double s = 0;
  for (float x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size() - 1));
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::abs(x)));
  return m;
}

TEST(NnLibtorch, ModuleListAndDictNameChildrenAsPyTorch) {
  auto list = std::make_shared<nn::ModuleList>();
  list->emplace_back<nn::Linear>(3, 4).emplace_back<nn::ReLU>().emplace_back<nn::Linear>(4, 2);
  auto dict = std::make_shared<nn::ModuleDict>();
  dict->insert("encoder", std::make_shared<nn::Linear>(2, 2));
  dict->insert("head", std::make_shared<nn::Identity>());
  struct Root : nn::Module {
    Root(std::shared_ptr<nn::ModuleList> l, std::shared_ptr<nn::ModuleDict> d) {
      register_module("blocks", l);
      register_module("parts", d);
    }
  } model(list, dict);
  std::vector<std::string> names;
  for (const auto& [n, t] : model.named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"blocks.0.weight", "blocks.0.bias", "blocks.2.weight",
                                             "blocks.2.bias", "parts.encoder.weight",
                                             "parts.encoder.bias"}));
  std::vector<std::string> modules;
  for (const auto& [n, m] : model.named_modules()) modules.push_back(n);
  EXPECT_EQ(modules, (std::vector<std::string>{"", "blocks", "blocks.0", "blocks.1", "blocks.2",
                                               "parts", "parts.encoder", "parts.head"}));
  ls::Tensor h = ls::ones({5, 3});
  for (const auto& m : *list) h = (*m)(h);
  EXPECT_EQ(h.shape(), (ls::Shape{5, 2}));
  EXPECT_EQ(list->at<nn::Linear>(2)->weight.shape(), (ls::Shape{2, 4}));
  EXPECT_THROW(list->at<nn::Linear>(1), ls::Error);
  EXPECT_THROW((*list)[3], ls::Error);
  EXPECT_EQ(dict->keys(), (std::vector<std::string>{"encoder", "head"}));
  EXPECT_TRUE(dict->contains("head"));
  try {
    (*dict)["decoder"];
    FAIL() << "no error";
  } catch (const ls::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("decoder"));
    EXPECT_THAT(e.what(), HasSubstr("encoder, head"));
  }
  EXPECT_THROW(dict->insert("a.b", std::make_shared<nn::ReLU>()), ls::Error);
  EXPECT_THROW(dict->insert("head", std::make_shared<nn::ReLU>()), ls::Error);
}

TEST(NnLibtorch, ApplyVisitsChildrenThenSelf) {
  nn::Sequential seq;
  seq.emplace<nn::Linear>(3, 3).emplace<nn::Tanh>().emplace<nn::Linear>(3, 1);
  std::vector<std::string> order;
  seq.apply([&](nn::Module& m) {
    if (auto* l = dynamic_cast<nn::Linear*>(&m)) {
      nn::init::zeros_(l->bias);
      nn::init::constant_(l->weight, 0.5);
      order.push_back("linear");
    } else {
      order.push_back(dynamic_cast<nn::Sequential*>(&m) ? "seq" : "other");
    }
  });
  EXPECT_EQ(order, (std::vector<std::string>{"linear", "other", "linear", "seq"}));
  EXPECT_NEAR(seq(ls::ones({1, 3})).item<double>(), 1.5 * std::tanh(1.5), 1e-6);
}

TEST(NnLibtorch, AModuleWithSeveralInputsIsCalledLikeAnyOther) {
  Masked m;
  const ls::Tensor x = ls::ones({2, 4});
  const ls::Tensor mask = ls::from_vector<float>({1, 0, 0, 1}, {4}) > 0.5;
  const std::vector<float> y = m(x, mask).to_vector<float>();
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[3], 0.0f);
  EXPECT_NE(y[1], 0.0f);
  EXPECT_EQ(m(x).shape(), (ls::Shape{2, 4}));  // the one-input call still works
  // An error inside names the user's line and the module path, as a one-input call's does.
  try {
    m(ls::ones({2, 5}), mask);
    FAIL() << "no error";
  } catch (const ls::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("nn_libtorch_test.cpp:"));
    EXPECT_THAT(e.what(), HasSubstr(" in proj)"));
  }
}

TEST(NnLibtorch, ActivationModulesUseTheirOptions) {
  const ls::Tensor x = ls::from_vector<float>({-2, -0.5, 0, 1.5});
  EXPECT_EQ(nn::LeakyReLU(0.1)(x).to_vector<float>(), nn::leaky_relu(x, 0.1).to_vector<float>());
  EXPECT_EQ(nn::ELU(0.3)(x).to_vector<float>(), nn::elu(x, 0.3).to_vector<float>());
  EXPECT_EQ(nn::Softplus(2, 1)(x).to_vector<float>(), nn::softplus(x, 2, 1).to_vector<float>());
  EXPECT_EQ(nn::GELU(nn::GeluApproximation::Tanh)(x).to_vector<float>(),
            nn::gelu(x, nn::GeluApproximation::Tanh).to_vector<float>());
  EXPECT_EQ(nn::Identity()(x).to_vector<float>(), x.to_vector<float>());
  EXPECT_EQ(nn::SiLU()(x).shape(), x.shape());
  EXPECT_EQ(nn::Mish()(x).shape(), x.shape());
  EXPECT_EQ(nn::Hardswish()(x).to_vector<float>()[0], -2.0f * 1.0f / 6.0f);
  EXPECT_LT(nn::LogSigmoid()(x).to_vector<float>()[3], 0.0f);
  EXPECT_THROW(nn::silu(ls::ones({2}, ls::i64)), ls::Error);
}

TEST(NnLibtorch, InitGainsAndFansAreTorchs) {
  EXPECT_DOUBLE_EQ(nn::init::calculate_gain("linear"), 1.0);
  EXPECT_DOUBLE_EQ(nn::init::calculate_gain("tanh"), 1.6666666666666667);
  EXPECT_DOUBLE_EQ(nn::init::calculate_gain("relu"), 1.4142135623730951);
  EXPECT_DOUBLE_EQ(nn::init::calculate_gain("leaky_relu"), 1.4141428569978354);
  EXPECT_DOUBLE_EQ(nn::init::calculate_gain("leaky_relu", 0.2), 1.3867504905630728);
  EXPECT_DOUBLE_EQ(nn::init::calculate_gain("selu"), 0.75);
  EXPECT_THROW(nn::init::calculate_gain("swish"), ls::Error);
  const auto [in, out] = nn::init::calculate_fan_in_and_fan_out(ls::zeros({64, 32, 3, 3}));
  EXPECT_EQ(in, 288);
  EXPECT_EQ(out, 576);
  EXPECT_THROW(nn::init::calculate_fan_in_and_fan_out(ls::zeros({5})), ls::Error);
  EXPECT_THROW(nn::init::uniform_(ls::zeros({2}, ls::i64)), ls::Error);
}

TEST(NnLibtorch, InitDistributionsHaveTorchsBoundsAndSpread) {
  ls::manual_seed(9);
  ls::Tensor w = ls::zeros({64, 32, 3, 3});  // 18432 values: spreads within ~2%
  // xavier_uniform_: U(-b, b), b = sqrt(6 / (288 + 576)) = 0.08333.
  const double xb = std::sqrt(6.0 / 864);
  std::vector<float> v = nn::init::xavier_uniform_(w).to_vector<float>();
  EXPECT_LE(max_abs(v), xb);
  EXPECT_GT(max_abs(v), 0.99 * xb);
  EXPECT_NEAR(sample_std(v), xb / std::sqrt(3.0), 0.02 * xb);
  // xavier_normal_ with gain 2: std 2 sqrt(2 / 864).
  v = nn::init::xavier_normal_(w, 2.0).to_vector<float>();
  EXPECT_NEAR(sample_std(v), 2 * std::sqrt(2.0 / 864), 0.03 * 2 * std::sqrt(2.0 / 864));
  // kaiming_normal_(fan_out, relu): std sqrt(2) / sqrt(576), torchvision's ResNet init.
  const double ks = std::sqrt(2.0) / std::sqrt(576.0);
  v = nn::init::kaiming_normal_(w, 0, nn::init::FanMode::FanOut, "relu").to_vector<float>();
  EXPECT_NEAR(sample_std(v), ks, 0.03 * ks);
  // kaiming_uniform_(a = sqrt(5)): nn.Linear's default, bound 1 / sqrt(fan_in).
  v = nn::init::kaiming_uniform_(w, std::sqrt(5.0)).to_vector<float>();
  EXPECT_LE(max_abs(v), 1 / std::sqrt(288.0));
  EXPECT_GT(max_abs(v), 0.99 / std::sqrt(288.0));
  // trunc_normal_(0, 1, -2, 2): inside the bounds, std of the truncated normal 0.8796.
  v = nn::init::trunc_normal_(w).to_vector<float>();
  EXPECT_LE(max_abs(v), 2.0);
  EXPECT_GT(max_abs(v), 1.9);
  EXPECT_NEAR(sample_std(v), 0.87962, 0.02);
  // Shifted and one-sided: N(1, 0.5) truncated to [0.5, 3].
  v = nn::init::trunc_normal_(w, 1.0, 0.5, 0.5, 3.0).to_vector<float>();
  EXPECT_GE(*std::min_element(v.begin(), v.end()), 0.5f);
  EXPECT_LE(*std::max_element(v.begin(), v.end()), 3.0f);
  // uniform_ and normal_ as asked; ones_ and zeros_.
  v = nn::init::uniform_(w, -3, -1).to_vector<float>();
  EXPECT_GE(*std::min_element(v.begin(), v.end()), -3.0f);
  EXPECT_LE(*std::max_element(v.begin(), v.end()), -1.0f);
  v = nn::init::normal_(w, 5, 0.1).to_vector<float>();
  EXPECT_NEAR(std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size()), 5, 0.01);
  EXPECT_EQ(nn::init::ones_(w).to_vector<float>()[7], 1.0f);
  EXPECT_EQ(nn::init::zeros_(w).to_vector<float>()[7], 0.0f);
  // Parameters can be re-initialized (they require grad): under NoGrad inside, no error.
  nn::Linear lin(4, 3);
  EXPECT_NO_THROW(nn::init::xavier_uniform_(lin.weight));
  EXPECT_TRUE(lin.weight.requires_grad());
}

}  // namespace

namespace {

TEST(NnSequences, PadSequencesAsPyTorchWithAMaskOfThePadding) {
  const ls::Tensor a = ls::from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2});
  const ls::Tensor b = ls::from_vector<float>({7, 8}, {1, 2});
  const nn::PaddedSequences p = nn::pad_sequences({a, b}, 0, true, -1);
  EXPECT_EQ(p.padded.shape(), (ls::Shape{2, 3, 2}));
  EXPECT_EQ(p.padded.to_vector<float>(),
            (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, -1, -1, -1, -1}));
  EXPECT_EQ(p.padding_mask.to_vector<bool>(),
            (std::vector<bool>{false, false, false, false, true, true}));
  EXPECT_EQ(p.lengths, (std::vector<int64_t>{3, 1}));
  const nn::PaddedSequences t = nn::pad_sequences({a, b}, 4, false);  // [L, N, ...]
  EXPECT_EQ(t.padded.shape(), (ls::Shape{4, 2, 2}));
  EXPECT_THROW(nn::pad_sequences({a, b}, 2), ls::Error);
  EXPECT_THROW(nn::pad_sequences({a, ls::zeros({2, 3})}), ls::Error);
  EXPECT_EQ(nn::bucket_length(9, {8, 16, 32}), 16);
  EXPECT_EQ(nn::bucket_length(8, {8, 16, 32}), 8);
  EXPECT_THROW(nn::bucket_length(33, {8, 16, 32}), ls::Error);
  EXPECT_THROW(nn::bucket_length(3, {16, 8}), ls::Error);
}

TEST(NnSequences, BucketedBatchesCompileOncePerBucket) {
  // A transformer over token lists of 40 different lengths: one program per bucket.
  ls::manual_seed(4);
  nn::Embedding emb(20, 16);
  nn::TransformerEncoderLayer layer({16, 2, 32, 0.0, nn::Activation::ReLU, 1e-5, true});
  nn::Linear head(16, 20);
  std::vector<ls::Tensor> params = emb.parameters();
  for (const auto* m : std::initializer_list<const nn::Module*>{&layer, &head})
    for (const ls::Tensor& p : m->parameters()) params.push_back(p);
  ls::optim::AdamW opt(params, {.lr = 1e-3});
  auto train = [&](int64_t len) {
    std::vector<std::vector<int64_t>> tokens;
    for (int64_t i = 0; i < 4; ++i) tokens.emplace_back(static_cast<size_t>(len - i % 3), 1 + i);
    const nn::PaddedSequences batch = nn::pad_token_batch(tokens, {8, 16, 32, 48});
    ls::step([&] {
      nn::AttentionMasks masks;
      masks.key_padding_mask = batch.padding_mask;
      const ls::Tensor logits = head(layer(emb(batch.padded), masks));
      opt.zero_grad();
      nn::cross_entropy(ls::reshape(logits, {-1, 20}), ls::reshape(batch.padded, {-1})).backward();
      opt.step();
    });
  };
  train(5);  // creates the optimizer state
  ls::wait();
  const int64_t compiles = ls::metrics::counter("compiles");
  for (int64_t len = 3; len < 43; ++len) train(len);
  ls::wait();
  EXPECT_LE(ls::metrics::counter("compiles") - compiles, 5);  // 4 buckets (+ the state's)
}

}  // namespace

namespace {

// Gradient accumulation as docs/cpp.md shows it: the micro-batches' backward calls inside one
// step add into .grad, the update runs once; one program per step, the same update as one big
// batch (losses scaled by 1 / micro-batches).
TEST(NnGradientAccumulation, MicroBatchesInsideOneStepEqualOneBigBatch) {
  ls::manual_seed(8);
  const ls::Tensor x = ls::randn({32, 10}), y = ls::randint(0, 4, {32});
  auto make = [] {
    ls::manual_seed(3);
    return std::make_shared<nn::Linear>(10, 4);
  };
  auto big = make(), acc = make();
  ls::optim::SGD big_opt(big->parameters(), {.lr = 0.1, .momentum = 0.9});
  ls::optim::SGD acc_opt(acc->parameters(), {.lr = 0.1, .momentum = 0.9});
  const int64_t micro = 4, size = 32 / micro;
  const std::vector<ls::Tensor> xs = ls::split(x, size), ys = ls::split(y, size);
  auto big_step = [&] {
    ls::step([&] {
      big_opt.zero_grad();
      nn::cross_entropy((*big)(x), y).backward();
      big_opt.step();
    });
  };
  auto accumulated_step = [&] {
    ls::step([&] {
      acc_opt.zero_grad();
      for (int64_t k = 0; k < micro; ++k)
        (nn::cross_entropy((*acc)(xs[k]), ys[k]) / static_cast<double>(micro)).backward();
      acc_opt.step();
    });
  };
  for (int s = 0; s < 3; ++s) {
    big_step();
    accumulated_step();
  }
  ls::wait();
  const int64_t compiles = ls::metrics::counter("compiles");
  accumulated_step();
  big_step();
  ls::wait();
  EXPECT_EQ(ls::metrics::counter("compiles") - compiles, 0);
  const std::vector<float> a = big->weight.to_vector<float>(), b = acc->weight.to_vector<float>();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-6) << i;
}

}  // namespace
