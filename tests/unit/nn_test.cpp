// Tests of nn.h and models.h: module names and counts as torchvision's, train/eval, every layer
// against its formula computed here with plain loops, state dicts, devices and default
// initialisation. The losses are in nn_loss_test.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <numbers>
#include <set>

#include "unit/ops_test_util.h"
#include "unit/train_test_util.h"

namespace {

using ops_test::f32;
using ops_test::f64;
using ops_test::i64;
using train_test::as_double;
using train_test::Delta;
using train_test::differences;
using train_test::expect_all_near;
using train_test::snapshot;
using train_test::values;

std::vector<std::string> names(const ls::nn::NamedTensors& t) {
  std::vector<std::string> out;
  for (const auto& [n, v] : t) out.push_back(n);
  return out;
}

int64_t count_params(const ls::nn::Module& m) {
  int64_t n = 0;
  for (const ls::Tensor& p : m.parameters()) n += p.numel();
  return n;
}

}  // namespace

// ---- modules and models ---------------------------------------------------------------------

TEST(NnModule, ResNet18HasTorchvisionNames) {
  ls::models::ResNet m = ls::models::resnet18();
  const std::vector<std::string> params = names(m.named_parameters());
  const std::vector<std::string> buffers = names(m.named_buffers());
  EXPECT_EQ(params.size(), 62u);   // torchvision: 62 parameters ...
  EXPECT_EQ(buffers.size(), 60u);  // ... and 60 buffers (20 BatchNorms)
  const std::vector<std::string> first{
      "conv1.weight",          "bn1.weight",          "bn1.bias",
      "layer1.0.conv1.weight", "layer1.0.bn1.weight", "layer1.0.bn1.bias",
      "layer1.0.conv2.weight", "layer1.0.bn2.weight"};
  EXPECT_EQ(std::vector<std::string>(params.begin(), params.begin() + 8), first);
  EXPECT_EQ(params[params.size() - 2], "fc.weight");
  EXPECT_EQ(params.back(), "fc.bias");
  for (const char* n : {"layer2.0.downsample.0.weight", "layer2.0.downsample.1.weight",
                        "layer4.1.conv2.weight", "layer3.0.conv1.weight"})
    EXPECT_THAT(params, ::testing::Contains(std::string(n)));
  EXPECT_THAT(params,
              ::testing::Not(::testing::Contains(std::string("layer1.0.downsample.0.weight"))));
  for (const char* n : {"bn1.running_mean", "bn1.running_var", "bn1.num_batches_tracked",
                        "layer2.0.downsample.1.running_var", "layer4.1.bn2.running_mean"})
    EXPECT_THAT(buffers, ::testing::Contains(std::string(n)));
  std::map<std::string, ls::Shape> shapes;
  for (const auto& [n, t] : m.state_dict()) shapes[n] = t.shape();
  EXPECT_EQ(shapes.size(), 122u);
  EXPECT_EQ(shapes["conv1.weight"], (ls::Shape{64, 3, 7, 7}));
  EXPECT_EQ(shapes["layer2.0.downsample.0.weight"], (ls::Shape{128, 64, 1, 1}));
  EXPECT_EQ(shapes["layer3.1.conv2.weight"], (ls::Shape{256, 256, 3, 3}));
  EXPECT_EQ(shapes["fc.weight"], (ls::Shape{1000, 512}));
  EXPECT_EQ(shapes["bn1.num_batches_tracked"], (ls::Shape{}));
  // Parameters require grad, buffers do not.
  for (const ls::Tensor& p : m.parameters()) EXPECT_TRUE(p.requires_grad());
  for (const ls::Tensor& b : m.buffers()) EXPECT_FALSE(b.requires_grad());
}

TEST(NnModule, ResNetParameterCountsMatchTorchvision) {
  EXPECT_EQ(count_params(ls::models::resnet18()), 11689512);
  EXPECT_EQ(count_params(ls::models::resnet34()), 21797672);
  ls::models::ResNet r50 = ls::models::resnet50();
  EXPECT_EQ(count_params(r50), 25557032);
  const std::vector<std::string> p = names(r50.named_parameters());
  EXPECT_EQ(p.size(), 161u);
  for (const char* n : {"layer1.0.conv3.weight", "layer1.0.bn3.bias",
                        "layer1.0.downsample.0.weight", "layer4.2.conv3.weight"})
    EXPECT_THAT(p, ::testing::Contains(std::string(n)));
  EXPECT_EQ(count_params(ls::models::resnet18({.num_classes = 10})), 11689512 - 990 * 513);
}

TEST(NnModule, ResNet18SmallStemRunsOnATinyInput) {
  ls::manual_seed(1);
  ls::models::ResNet m =
      ls::models::resnet18({.num_classes = 10, .stem = ls::models::ResNetStem::Small});
  ls::Tensor x = ls::randn({2, 3, 8, 8});
  ls::Tensor y;
  ls::step([&] {
    y = m(x);
    ls::nn::cross_entropy(y, i64({1, 7})).backward();
  });
  EXPECT_EQ(y.shape(), (ls::Shape{2, 10}));
  for (float v : y.to_vector<float>()) EXPECT_TRUE(std::isfinite(v));
  for (const auto& [n, p] : m.named_parameters()) EXPECT_TRUE(p.grad().defined()) << n;
  EXPECT_EQ(m.bn1->num_batches_tracked.item<int64_t>(), 1);
  m.eval();
  ls::step([&] { y = m(x); });
  EXPECT_EQ(y.shape(), (ls::Shape{2, 10}));
  EXPECT_EQ(m.bn1->num_batches_tracked.item<int64_t>(), 1);  // eval leaves the buffers alone
}

TEST(NnModule, TrainAndEvalReachEveryDescendant) {
  ls::models::FashionCNN cnn(10, 1, 8);
  ls::nn::Sequential seq;
  seq.emplace<ls::nn::Linear>(4, 4).emplace<ls::nn::Dropout>(0.5);
  auto inner = std::make_shared<ls::nn::Sequential>();
  inner->emplace<ls::nn::BatchNorm1d>(4);
  seq.add(inner);
  EXPECT_TRUE(seq.is_training());
  seq.eval();
  EXPECT_FALSE(seq.is_training());
  EXPECT_FALSE(seq[1]->is_training());
  EXPECT_FALSE((*inner)[0]->is_training());
  seq.train();
  EXPECT_TRUE((*inner)[0]->is_training());
  cnn.eval();
  EXPECT_FALSE(cnn.bn2->is_training());
  cnn.train(true);
  EXPECT_TRUE(cnn.bn2->is_training());
  EXPECT_EQ(names(seq.named_parameters()),
            (std::vector<std::string>{"0.weight", "0.bias", "2.0.weight", "2.0.bias"}));
  EXPECT_EQ(
      names(seq.named_buffers()),
      (std::vector<std::string>{"2.0.running_mean", "2.0.running_var", "2.0.num_batches_tracked"}));
  EXPECT_EQ(seq.named_children().size(), 3u);
  EXPECT_EQ(seq.named_children()[2].first, "2");
}

TEST(NnModule, ASharedModuleIsListedOnceAndUpdatedOncePerStep) {
  auto lin = std::make_shared<ls::nn::Linear>(2, 2);
  ls::nn::Sequential seq;
  seq.add(lin).emplace<ls::nn::Tanh>().add(lin);  // the same layer applied twice
  EXPECT_EQ(names(seq.named_parameters()), (std::vector<std::string>{"0.weight", "0.bias"}));
  EXPECT_EQ(seq.parameters().size(), 2u);
  // The state dict names it at both places, as PyTorch's, and loads back.
  EXPECT_EQ(names(seq.state_dict()),
            (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
  seq.load_state_dict(seq.state_dict());
  // One SGD step moves each weight by exactly -lr * its (accumulated) gradient.
  ls::optim::SGD opt(seq.parameters(), {.lr = 0.5});
  const std::vector<float> w0 = lin->weight.to_vector<float>();
  std::vector<float> g;
  ls::step([&] {
    ls::sum(seq(ls::ones({3, 2}))).backward();
    g = lin->weight.grad().to_vector<float>();
    opt.step();
  });
  const std::vector<float> w1 = lin->weight.to_vector<float>();
  for (size_t i = 0; i < w0.size(); ++i) EXPECT_FLOAT_EQ(w1[i], w0[i] - 0.5f * g[i]) << i;
}

// Weight tying (PyTorch's `out.weight = tok.weight`): set_parameter makes the embedding's weight
// the output layer's too: one parameter, computed with by both, saved under both names.
TEST(NnModule, ATiedWeightIsOneParameterComputedWithByBothLayers) {
  struct Tied : ls::nn::Module {
    std::shared_ptr<ls::nn::Embedding> tok =
        register_module("tok", std::make_shared<ls::nn::Embedding>(5, 3));
    std::shared_ptr<ls::nn::Linear> out =
        register_module("out", std::make_shared<ls::nn::Linear>(3, 5, false));
  } m;
  m.set_parameter("out.weight", m.tok->weight);
  EXPECT_TRUE(m.out->weight.is_same(m.tok->weight));
  EXPECT_EQ(names(m.named_parameters()), (std::vector<std::string>{"tok.weight"}));
  EXPECT_EQ(names(m.state_dict()), (std::vector<std::string>{"tok.weight", "out.weight"}));
  // The output layer computes with the embedding: out(e_i) = E e_i.
  const ls::Tensor e = m.tok->weight;
  const std::vector<float> got = (*m.out)(ls::slice(e, 0, 1, 2)).to_vector<float>();
  const std::vector<float> want =
      ls::matmul(ls::slice(e, 0, 1, 2), ls::transpose(e, 0, 1)).to_vector<float>();
  EXPECT_EQ(got, want);
  // A name that is not registered is an Error listing those that are.
  try {
    m.set_parameter("out.weights", e);
    FAIL() << "an unknown name was accepted";
  } catch (const ls::Error& err) {
    EXPECT_NE(std::string(err.what()).find("no parameter 'weights'; it has: weight"),
              std::string::npos)
        << err.what();
  }
  EXPECT_THROW(m.set_parameter("nope.weight", e), ls::Error);
}

// A subclass that registers a child under a name its base registered replaces it in its place, as
// PyTorch's `self.decoder = nn.Linear(...)` in a subclass of nn.Transformer does.
TEST(NnModule, RegisteringANameAgainReplacesThatChildInItsPlace) {
  struct Base : ls::nn::Module {
    Base() {
      register_module("encoder", std::make_shared<ls::nn::Linear>(2, 2));
      register_module("decoder", std::make_shared<ls::nn::Linear>(2, 3));
      register_module("norm", std::make_shared<ls::nn::LayerNorm>(ls::Shape{3}));
    }
  };
  struct Sub : Base {
    std::shared_ptr<ls::nn::Linear> decoder =
        register_module("decoder", std::make_shared<ls::nn::Linear>(2, 3, false));
  } m;
  EXPECT_EQ(names(m.named_parameters()),
            (std::vector<std::string>{"encoder.weight", "encoder.bias", "decoder.weight",
                                      "norm.weight", "norm.bias"}));
  EXPECT_EQ(m.named_children().size(), 3u);
  EXPECT_TRUE(m.named_children()[1].second == m.decoder);
}

// ---- BatchNorm ------------------------------------------------------------------------------

TEST(NnBatchNorm, TrainingUsesBatchStatsAndUpdatesRunningStatsInTheStep) {
  // x [N=3, C=2, 2, 2]; weight and bias set to non-trivial values.
  const std::vector<double> xv = values(24, 7);
  ls::nn::BatchNorm2d bn(2, 1e-5, 0.1);
  {
    ls::NoGrad ng;
    bn.weight.copy_(f32({1.5f, -0.5f}));
    bn.bias.copy_(f32({0.25f, 2.0f}));
  }
  const double w[2] = {1.5, -0.5}, b[2] = {0.25, 2.0};
  auto x_of = [&](double scale) {
    std::vector<float> v;
    for (double e : xv) v.push_back(static_cast<float>(e * scale + scale));
    return v;
  };
  double rm[2] = {0, 0}, rv[2] = {1, 1};
  for (int s = 1; s <= 2; ++s) {
    const std::vector<float> xs = x_of(s);
    ls::Tensor x = f32(xs, {3, 2, 2, 2}), y;
    ls::step([&] {
      y = bn(x);
      EXPECT_TRUE(bn.running_mean.is_pending());  // recorded in the step's graph
    });
    std::vector<double> want(24);
    for (int c = 0; c < 2; ++c) {
      double mean = 0, var = 0;
      for (int n = 0; n < 3; ++n)
        for (int k = 0; k < 4; ++k) mean += xs[n * 8 + c * 4 + k] / 12.0;
      for (int n = 0; n < 3; ++n)
        for (int k = 0; k < 4; ++k) var += std::pow(xs[n * 8 + c * 4 + k] - mean, 2) / 12.0;
      for (int n = 0; n < 3; ++n)
        for (int k = 0; k < 4; ++k) {
          const int i = n * 8 + c * 4 + k;
          want[i] = (xs[i] - mean) / std::sqrt(var + 1e-5) * w[c] + b[c];
        }
      rm[c] = 0.9 * rm[c] + 0.1 * mean;
      rv[c] = 0.9 * rv[c] + 0.1 * var * 12.0 / 11.0;  // unbiased variance for the running one
    }
    expect_all_near(as_double(y), want, 2e-5);
    expect_all_near(as_double(bn.running_mean), {rm[0], rm[1]}, 1e-6);
    expect_all_near(as_double(bn.running_var), {rv[0], rv[1]}, 1e-6);
    EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), s);
  }
  // Eval: the running statistics normalize, and nothing is updated.
  bn.eval();
  const auto before = snapshot(bn.named_buffers());
  const std::vector<float> xs = x_of(3);
  ls::Tensor y;
  ls::step([&] { y = bn(f32(xs, {3, 2, 2, 2})); });
  std::vector<double> want(24);
  for (int i = 0; i < 24; ++i) {
    const int c = (i / 4) % 2;
    want[i] = (xs[i] - rm[c]) / std::sqrt(rv[c] + 1e-5) * w[c] + b[c];
  }
  expect_all_near(as_double(y), want, 2e-5);
  EXPECT_TRUE(differences(before, snapshot(bn.named_buffers())).empty());
}

TEST(NnBatchNorm, OneDimensionalInputAndErrors) {
  ls::nn::BatchNorm1d bn(3, 1e-5, 0.5, /*affine=*/false);
  EXPECT_TRUE(bn.named_parameters().empty());
  EXPECT_LS_ERROR(bn(f32({1, 2, 3, 4}, {2, 2})), "BatchNorm", "3");
  // batch_norm checks the batch (its message names the fix); the layer adds no check of its own.
  EXPECT_LS_ERROR(bn(f32({1, 2, 3}, {1, 3})), "batch_norm", "more than one value", "at least 2");
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 0);  // nothing counted
  EXPECT_LS_ERROR(bn(f32({1, 2, 3}, {3})), "BatchNorm", "[3]");
  ls::Tensor y;
  ls::Tensor xf = f32({1, 2, 3, 3, 2, 7}, {2, 3});
  ls::step([&] { y = bn(xf); });
  // Per channel: values (1, 3), (2, 2), (3, 7): means 2, 2, 5; biased variances 1, 0, 4.
  expect_all_near(as_double(y), {-1, 0, -1, 1, 0, 1}, 1e-4);
  expect_all_near(as_double(bn.running_mean), {1, 1, 2.5}, 1e-6);
  expect_all_near(as_double(bn.running_var), {0.5 + 0.5 * 2, 0.5, 0.5 + 0.5 * 8}, 1e-6);
}

TEST(NnBatchNorm, FunctionalFormChecksItsInputs) {
  const ls::Tensor x = f32({1, 2, 3, 4, 5, 6}, {3, 2});
  const ls::Tensor stat2 = f32({0, 0}, {2}), stat3 = f32({0, 0, 0}, {3});
  EXPECT_LS_ERROR(ls::nn::batch_norm(f32({1, 2}, {2}), stat2, stat2), "batch_norm", "[N, C, ...]");
  EXPECT_LS_ERROR(ls::nn::batch_norm(ls::Tensor(), stat2, stat2), "batch_norm", "empty");
  EXPECT_LS_ERROR(ls::nn::batch_norm(x, stat3, stat2), "batch_norm", "running_mean", "2 channels");
  EXPECT_LS_ERROR(ls::nn::batch_norm(x, stat2, stat2, stat3), "batch_norm", "weight");
  EXPECT_LS_ERROR(ls::nn::batch_norm(x, stat2, ls::cast(stat2, ls::f64)), "batch_norm",
                  "running_var", "f64");
  EXPECT_LS_ERROR(ls::nn::batch_norm(x, ls::Tensor(), ls::Tensor()), "batch_norm",
                  "running_mean and running_var");
  EXPECT_LS_ERROR(ls::nn::batch_norm(f32({1, 2}, {1, 2}), stat2, stat2, {}, {}, true), "batch_norm",
                  "more than one value");
  // Eval mode normalizes with the given statistics: (x - mean) / sqrt(var + eps).
  const ls::Tensor y = ls::nn::batch_norm(x, f32({1, 2}, {2}), f32({4, 1}, {2}), ls::Tensor(),
                                          ls::Tensor(), false, 0.1, 0.0);
  expect_all_near(as_double(y), {0, 0, 1, 2, 2, 4}, 1e-6);
}

TEST(NnBatchNorm, RunningStatsRollBackWithTheStep) {
  ls::nn::BatchNorm2d bn(2);
  ls::Tensor x = f32(std::vector<float>(16, 0.0f), {2, 2, 2, 2}) + ls::randn({2, 2, 2, 2});
  ls::step([&] { bn(x); });
  const auto before = snapshot(bn.named_buffers());
  EXPECT_THROW(ls::step([&] {
                 bn(x * 3.0f);
                 throw std::runtime_error("after forward");
               }),
               std::runtime_error);
  EXPECT_TRUE(differences(before, snapshot(bn.named_buffers())).empty());
}

// ---- Dropout --------------------------------------------------------------------------------

TEST(NnDropout, TrainingDropsAndScalesWithFreshMasksAndNoRecompiles) {
  ls::manual_seed(11);
  ls::nn::Dropout drop(0.3);
  ls::Tensor x = ls::ones({40, 50});
  x.set_requires_grad();
  std::vector<std::vector<float>> masks;
  ls::Tensor y;
  std::unique_ptr<Delta> compiles;
  for (int s = 0; s < 5; ++s) {
    if (s == 1) {
      ls::wait();
      compiles = std::make_unique<Delta>("compiles");  // the first step may compile, no other
    }
    x.set_grad(ls::Tensor());
    ls::step([&] {
      y = drop(x);
      ls::sum(y).backward();
    });
    const std::vector<float> v = y.to_vector<float>();
    int zeros = 0;
    for (float e : v) {
      if (e == 0) {
        ++zeros;
      } else {
        EXPECT_FLOAT_EQ(e, 1 / 0.7f);
      }
    }
    EXPECT_NEAR(zeros / 2000.0, 0.3, 0.05);
    EXPECT_EQ(x.grad().to_vector<float>(), v);  // the gradient is the same mask, scaled
    masks.push_back(v);
  }
  ls::wait();
  EXPECT_EQ(compiles->get(), 0);
  for (size_t i = 1; i < masks.size(); ++i) EXPECT_NE(masks[i], masks[0]);
  drop.eval();
  ls::Tensor e = drop(x);
  EXPECT_EQ(e.to_vector<float>(), std::vector<float>(2000, 1.0f));
  EXPECT_EQ(ls::nn::dropout(x, 0.0, true).to_vector<float>(), std::vector<float>(2000, 1.0f));
  EXPECT_THROW(ls::nn::Dropout(1.0), ls::Error);
  EXPECT_THROW(ls::nn::Dropout(-0.1), ls::Error);
  EXPECT_LS_ERROR(ls::nn::dropout(x, 1.5, true), "dropout", "1.5");
}

// ---- other layers ---------------------------------------------------------------------------

TEST(NnLayers, LayerNormMatchesFormula) {
  const std::vector<double> xv = values(24, 3);
  const std::vector<float> xf(xv.begin(), xv.end());
  ls::Tensor x = f32(xf, {2, 3, 4});
  for (const ls::Shape& ns : {ls::Shape{4}, ls::Shape{3, 4}}) {
    ls::nn::LayerNorm ln(ns, 1e-5);
    const int64_t k = ls::shape_numel(ns);
    const std::vector<double> wd = values(k, 5), bd = values(k, 6);
    const std::vector<float> wv(wd.begin(), wd.end()), bv(bd.begin(), bd.end());
    {
      ls::NoGrad ng;
      ln.weight.copy_(f32(wv, ns));
      ln.bias.copy_(f32(bv, ns));
    }
    std::vector<double> want(24);
    for (int64_t g = 0; g < 24 / k; ++g) {
      double mean = 0, var = 0;
      for (int64_t i = 0; i < k; ++i) mean += xf[g * k + i] / static_cast<double>(k);
      for (int64_t i = 0; i < k; ++i)
        var += std::pow(xf[g * k + i] - mean, 2) / static_cast<double>(k);
      for (int64_t i = 0; i < k; ++i)
        want[g * k + i] = (xf[g * k + i] - mean) / std::sqrt(var + 1e-5) * wv[i] + bv[i];
    }
    expect_all_near(as_double(ln(x)), want, 2e-6);
  }
  ls::nn::LayerNorm ln({5});
  EXPECT_THAT(names(ln.named_parameters()), ::testing::ElementsAre("weight", "bias"));
  EXPECT_LS_ERROR(ln(x), "LayerNorm", "[2, 3, 4]", "[5]");
}

TEST(NnLayers, EmbeddingLooksUpRowsAndAccumulatesRowGradients) {
  ls::manual_seed(2);
  ls::nn::Embedding emb(5, 3);
  ASSERT_EQ(emb.weight.shape(), (ls::Shape{5, 3}));
  const std::vector<float> w = emb.weight.to_vector<float>();
  ls::Tensor idx = i64({0, 4, 2, 2}, {2, 2});
  ls::Tensor out;
  ls::step([&] {
    out = emb(idx);
    ls::sum(out).backward();
  });
  ASSERT_EQ(out.shape(), (ls::Shape{2, 2, 3}));
  const std::vector<float> o = out.to_vector<float>();
  const int rows[4] = {0, 4, 2, 2};
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 3; ++c) EXPECT_EQ(o[r * 3 + c], w[rows[r] * 3 + c]);
  ops_test::expect_tensor<float>(emb.weight.grad(), {5, 3},
                                 {1, 1, 1, 0, 0, 0, 2, 2, 2, 0, 0, 0, 1, 1, 1});
  EXPECT_LS_ERROR(emb(ops_test::i32({1})), "Embedding", "i64");
}

TEST(NnLayers, GeluMatchesTheErfFormulaInFloat32) {
  std::vector<float> xs;
  for (int i = -80; i <= 80; ++i) xs.push_back(static_cast<float>(i) / 10.0f);
  for (float v : {1e-4f, -1e-4f, 0.0f, 12.5f, -12.5f}) xs.push_back(v);
  const std::vector<float> y = ls::nn::GELU()(f32(xs)).to_vector<float>();
  for (size_t i = 0; i < xs.size(); ++i) {
    const double x = xs[i], want = 0.5 * x * (1 + std::erf(x / std::numbers::sqrt2));
    EXPECT_NEAR(y[i], want, 1e-6 + 1e-6 * std::abs(want)) << "x = " << x;
  }
}

TEST(NnLayers, GeluAndItsGradientMatchTheErfFormulaInFloat64) {
  std::vector<double> xs;
  for (int i = -90; i <= 90; ++i) xs.push_back(i / 10.0 + 0.013);
  for (double v : {1e-6, -1e-6, 0.3, -0.7, 2.5}) xs.push_back(v);
  ls::Tensor x = f64(xs);
  x.set_requires_grad();
  ls::Tensor y;
  ls::step([&] {
    y = ls::nn::gelu(x);
    ls::sum(y).backward();
  });
  const std::vector<double> got = y.to_vector<double>(), g = x.grad().to_vector<double>();
  for (size_t i = 0; i < xs.size(); ++i) {
    const double v = xs[i];
    const double cdf = 0.5 * (1 + std::erf(v / std::numbers::sqrt2));
    const double pdf = std::exp(-v * v / 2) / std::sqrt(2 * std::numbers::pi);
    EXPECT_NEAR(got[i], v * cdf, 1e-13 * (1 + std::abs(v))) << "x = " << v;
    EXPECT_NEAR(g[i], cdf + v * pdf, 1e-12) << "x = " << v;
  }
}

TEST(NnLayers, ErfIsAccurateOnEveryRangeAndAtSpecialValues) {
  std::vector<double> xs;
  for (int i = -700; i <= 700; ++i) xs.push_back(i / 100.0 + 0.0031);
  for (double v : {0.0, 1e-300, -1e-20, 0.84375, -0.84375, 1.25, -1.25, 1 / 0.35, 6.0, -6.0, 30.0})
    xs.push_back(v);
  const std::vector<double> got = ls::nn::erf(f64(xs)).to_vector<double>();
  for (size_t i = 0; i < xs.size(); ++i)
    EXPECT_NEAR(got[i], std::erf(xs[i]), 4e-16 + 4e-16 * std::abs(std::erf(xs[i])))
        << "x = " << xs[i];
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> special =
      ls::nn::erf(f64({inf, -inf, std::nan(""), 1e300})).to_vector<double>();
  EXPECT_EQ(special[0], 1);
  EXPECT_EQ(special[1], -1);
  EXPECT_TRUE(std::isnan(special[2]));
  EXPECT_EQ(special[3], 1);
  // Float32: within a few ulp, and the gradient stays finite far out.
  std::vector<float> xf;
  for (int i = -40; i <= 40; ++i) xf.push_back(static_cast<float>(i) / 8.0f + 0.01f);
  for (float v : {1e4f, -1e4f, 1e30f}) xf.push_back(v);
  ls::Tensor x = f32(xf);
  x.set_requires_grad();
  ls::Tensor y;
  ls::step([&] {
    y = ls::nn::gelu(x);
    ls::sum(ls::nn::erf(x)).backward();
  });
  const std::vector<float> ef = y.to_vector<float>(), gf = x.grad().to_vector<float>();
  for (size_t i = 0; i < xf.size(); ++i) {
    EXPECT_TRUE(std::isfinite(ef[i]) && std::isfinite(gf[i])) << "x = " << xf[i];
    const double d = 2 / std::sqrt(std::numbers::pi) * std::exp(-double(xf[i]) * xf[i]);
    EXPECT_NEAR(gf[i], d, 1e-6) << "x = " << xf[i];
  }
}

TEST(NnLayers, AdaptiveAvgPool2dUsesPyTorchWindows) {
  auto check = [](int64_t H, int64_t W, int64_t oh, int64_t ow) {
    SCOPED_TRACE(::testing::Message() << H << "x" << W << " -> " << oh << "x" << ow);
    const std::vector<double> xv = values(2 * 3 * H * W, static_cast<uint32_t>(H * 31 + W));
    ls::Tensor x = f64(xv, {2, 3, H, W});
    ls::Tensor y = ls::nn::AdaptiveAvgPool2d({oh, ow})(x);
    ASSERT_EQ(y.shape(), (ls::Shape{2, 3, oh, ow}));
    std::vector<double> want;
    for (int64_t p = 0; p < 6; ++p)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          const int64_t h0 = i * H / oh, h1 = ((i + 1) * H + oh - 1) / oh;
          const int64_t w0 = j * W / ow, w1 = ((j + 1) * W + ow - 1) / ow;
          double s = 0;
          for (int64_t h = h0; h < h1; ++h)
            for (int64_t w = w0; w < w1; ++w) s += xv[(p * H + h) * W + w];
          want.push_back(s / static_cast<double>((h1 - h0) * (w1 - w0)));
        }
    expect_all_near(y.to_vector<double>(), want, 1e-12);
  };
  check(5, 7, 3, 4);  // not divisible
  check(6, 8, 3, 4);  // divisible
  check(5, 5, 1, 1);  // global
  check(2, 3, 3, 4);  // larger than the input: overlapping windows
  EXPECT_THROW(ls::nn::AdaptiveAvgPool2d({0, 2}), ls::Error);
  EXPECT_THROW(ls::nn::AdaptiveAvgPool2d({2, 2})(f32({1, 2, 3, 4}, {2, 2})), ls::Error);
}

TEST(NnLayers, FlattenActivationsAndSequential) {
  ls::Tensor x = ops_test::iota<float>({2, 3, 2, 2});
  EXPECT_EQ(ls::nn::Flatten()(x).shape(), (ls::Shape{2, 12}));
  EXPECT_EQ(ls::nn::Flatten(0, 1)(x).shape(), (ls::Shape{6, 2, 2}));
  EXPECT_EQ(ls::nn::Flatten(2)(x).shape(), (ls::Shape{2, 3, 4}));
  ls::Tensor v = f32({-2, -0.5, 0, 1.5});
  EXPECT_EQ(ls::nn::ReLU()(v).to_vector<float>(), (std::vector<float>{0, 0, 0, 1.5}));
  expect_all_near(as_double(ls::nn::Sigmoid()(v)),
                  {1 / (1 + std::exp(2.0)), 1 / (1 + std::exp(0.5)), 0.5, 1 / (1 + std::exp(-1.5))},
                  1e-6);
  expect_all_near(as_double(ls::nn::Tanh()(v)),
                  {std::tanh(-2.0), std::tanh(-0.5), 0, std::tanh(1.5)}, 1e-6);
  // Sequential applies its layers in order: Linear(2 -> 1) with set weights, then ReLU.
  ls::nn::Sequential seq;
  auto lin = std::make_shared<ls::nn::Linear>(2, 1);
  seq.add(lin).emplace<ls::nn::ReLU>();
  {
    ls::NoGrad ng;
    lin->weight.copy_(f32({2, -1}, {1, 2}));
    lin->bias.copy_(f32({0.5}));
  }
  EXPECT_EQ(seq(f32({1, 1, 0, 3}, {2, 2})).to_vector<float>(), (std::vector<float>{1.5, 0}));
  EXPECT_EQ(seq.size(), 2u);
  EXPECT_THROW(seq.add(nullptr), ls::Error);
  EXPECT_THROW(ls::nn::Module().forward(v), ls::Error);
}

// ---- state dicts, devices, initialisation ---------------------------------------------------

TEST(NnStateDict, RoundTripCopiesEveryValue) {
  ls::manual_seed(5);
  ls::models::FashionCNN a(10, 1, 8), b(10, 1, 8);
  ls::step([&] { a(ls::randn({4, 1, 8, 8})); });  // running stats of a move
  ls::Tensor b_fc1 = b.fc1->weight;
  b.load_state_dict(a.state_dict());
  EXPECT_TRUE(differences(snapshot(a.state_dict()), snapshot(b.state_dict())).empty());
  EXPECT_TRUE(b.fc1->weight.is_same(b_fc1));  // copied into the existing tensors
  EXPECT_FALSE(b.fc1->weight.is_same(a.fc1->weight));
  EXPECT_TRUE(b.fc1->weight.requires_grad());
  EXPECT_EQ(b.bn1->num_batches_tracked.item<int64_t>(), 1);
  a.eval();
  b.eval();
  ls::Tensor x = ls::randn({2, 1, 8, 8});
  EXPECT_EQ(a(x).to_vector<float>(), b(x).to_vector<float>());
}

TEST(NnStateDict, StrictMismatchListsNamesAndLoadsNothing) {
  ls::models::MLP a({4, 8, 3}), b({4, 8, 3});
  const auto before = snapshot(b.state_dict());
  ls::nn::NamedTensors state = a.state_dict();
  state.erase(state.begin() + 1);  // "layers.0.bias" missing
  state.emplace_back("layers.9.weight", ls::zeros({1}));
  EXPECT_LS_ERROR(b.load_state_dict(state), "missing: layers.0.bias", "unexpected: layers.9.weight",
                  "Nothing was loaded");
  EXPECT_TRUE(differences(before, snapshot(b.state_dict())).empty());
  // Non-strict skips those names but still refuses a shape or dtype mismatch, loading nothing.
  ls::nn::NamedTensors bad = a.state_dict();
  bad[0].second = ls::zeros({8, 5});
  bad[2].second = ls::zeros({3, 8}, ls::f64);
  EXPECT_LS_ERROR(b.load_state_dict(bad, /*strict=*/false),
                  "layers.0.weight (expected f32[8, 4], got f32[8, 5])", "layers.2.weight");
  EXPECT_TRUE(differences(before, snapshot(b.state_dict())).empty());
  EXPECT_THROW(b.check_state_dict(state), ls::Error);
  EXPECT_TRUE(differences(before, snapshot(b.state_dict())).empty());
  b.load_state_dict(state, /*strict=*/false);  // loads the three that match
  const auto after = snapshot(b.state_dict()), from = snapshot(a.state_dict());
  EXPECT_EQ(after[0], from[0]);
  EXPECT_EQ(after[1], before[1]);  // layers.0.bias was not given
  EXPECT_EQ(after[3], from[3]);
}

TEST(NnModule, ToAnotherDeviceKeepsHandlesValuesAndGradients) {
  ls::models::MLP m({3, 4, 2});
  const ls::Device home = ls::default_device(), ref{ls::DeviceKind::Ref};
  ls::step([&] { ls::sum(m(ls::ones({2, 3}))).backward(); });
  const ls::nn::NamedTensors before = m.state_dict();
  const auto bits = snapshot(before);
  const auto grad_bits = train_test::raw(before[0].second.grad());
  for (const ls::Device d : {ref, home}) {  // there and back (the same device when home is ref)
    m.to(d);
    const ls::nn::NamedTensors after = m.state_dict();
    ASSERT_EQ(after.size(), before.size());
    for (size_t i = 0; i < after.size(); ++i) {
      EXPECT_TRUE(after[i].second.is_same(before[i].second));
      EXPECT_EQ(after[i].second.device(), d);
      EXPECT_TRUE(after[i].second.requires_grad());
      ASSERT_TRUE(after[i].second.grad().defined()) << after[i].first;
      EXPECT_EQ(after[i].second.grad().device(), d);
    }
    EXPECT_TRUE(differences(bits, snapshot(after)).empty());
    EXPECT_EQ(train_test::raw(before[0].second.grad()), grad_bits);
    EXPECT_EQ(m(ls::ones({1, 3}, ls::TensorOptions(ls::f32, d))).shape(), (ls::Shape{1, 2}));
  }
  EXPECT_THROW(m.to(ls::Device{ls::DeviceKind::Cuda, 3}), ls::Error);
  EXPECT_TRUE(differences(bits, snapshot(m.state_dict())).empty());
  for (const auto& [n, t] : m.state_dict()) EXPECT_EQ(t.device(), home) << n;
}

TEST(NnInit, LinearAndConvDrawWithinOneOverSqrtFanIn) {
  ls::manual_seed(9);
  auto check = [](const ls::Tensor& t, double bound, bool spread = true) {
    const std::vector<float> v = t.to_vector<float>();
    double lo = 1, hi = -1, mean = 0;
    for (float e : v) {
      lo = std::min<double>(lo, e);
      hi = std::max<double>(hi, e);
      mean += e / static_cast<double>(v.size());
    }
    EXPECT_GE(lo, -bound);
    EXPECT_LE(hi, bound);
    if (!spread) return;
    EXPECT_LT(lo, -0.8 * bound);  // spread over the range, not a constant
    EXPECT_GT(hi, 0.8 * bound);
    EXPECT_NEAR(mean, 0, 0.2 * bound);
  };
  ls::nn::Linear lin(50, 40);
  check(lin.weight, 1 / std::sqrt(50.0));
  check(lin.bias, 1 / std::sqrt(50.0), false);
  ls::nn::Conv2d conv({.in_channels = 8, .out_channels = 12, .kernel = {3, 2}, .groups = 2});
  EXPECT_EQ(conv.weight.shape(), (ls::Shape{12, 4, 3, 2}));
  check(conv.weight, 1 / std::sqrt(4.0 * 3 * 2));
  check(conv.bias, 1 / std::sqrt(4.0 * 3 * 2), false);
  ls::nn::Linear other(50, 40);
  EXPECT_NE(other.weight.to_vector<float>(), lin.weight.to_vector<float>());
  EXPECT_FALSE(ls::nn::Linear(3, 2, false).bias.defined());
  EXPECT_THROW(ls::nn::Linear(0, 2), ls::Error);
  EXPECT_THROW(ls::nn::Conv2d({.in_channels = 3, .out_channels = 4, .groups = 2}), ls::Error);
}
