// Transformers against PyTorch: tests/golden/make_gpt_fixture.py wrote a small GPT-style model's
// initial state, 5 batches of a synthetic task and PyTorch's losses over 5 AdamW steps, plus a
// MultiheadAttention with both kinds of masks and a post-norm TransformerEncoderLayer with key
// padding (outputs and gradients). lockstep loads the same weights by PyTorch's names.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include <lockstep/lockstep.h>
#include "unit/golden_util.h"

namespace ls = lockstep;

namespace {

using golden::expect_close;
using golden::Fixture;

const Fixture& fixture() {
  static const Fixture f = golden::load("gpt_training.safetensors");
  return f;
}

TEST(GoldenTransformer, GptLossesMatchPyTorchOverFiveAdamWSteps) {
  const Fixture& f = fixture();
  ls::models::GPT model;
  model.load_state_dict(f.with_prefix("init."));
  ls::optim::AdamW opt(model.parameters(), {1e-3, 0.9, 0.999, 1e-8, 0.01});
  const ls::Tensor xs = f["x"], ys = f["y"];
  const std::vector<double> want = f["losses"].to_vector<double>();
  const int64_t compiles = ls::metrics::counter("compiles");
  const std::vector<ls::Tensor> batches = ls::unbind(xs, 0), targets = ls::unbind(ys, 0);
  for (size_t s = 0; s < batches.size(); ++s) {
    ls::Tensor loss;
    // Each batch is its own (materialized) input: the step's graph is the same every time.
    const ls::Tensor x = batches[s].to(ls::default_device()),
                     y = targets[s].to(ls::default_device());
    ls::step([&] {
      const ls::Tensor logits = model(x);
      loss = ls::nn::cross_entropy(ls::reshape(logits, {-1, model.options.vocab_size}),
                                   ls::reshape(y, {-1}));
      opt.zero_grad();
      loss.backward();
      opt.step();
    });
    const double got = loss.item<double>();
    EXPECT_NEAR(got, want[s], 1e-4 * std::abs(want[s])) << "step " << s + 1;
  }
  // The same step every time: compiled once (plus the first step's optimizer-state creation).
  EXPECT_LE(ls::metrics::counter("compiles") - compiles, 2);
}

TEST(GoldenTransformer, MultiheadAttentionMatchesPyTorchWithBothMasks) {
  const Fixture& f = fixture();
  ls::nn::MultiheadAttention mha(16, 4);
  mha.load_state_dict(f.with_prefix("mha.init."));
  ls::Tensor q = f["mha.q"].detach().set_requires_grad(),
             k = f["mha.k"].detach().set_requires_grad(),
             v = f["mha.v"].detach().set_requires_grad();
  ls::nn::AttentionMasks masks;
  masks.attn_mask = f["mha.attn_mask"];
  masks.key_padding_mask = f["mha.key_padding_mask"];
  const auto out = mha(q, k, v, masks);
  expect_close(out.output, f["mha.out"], 1e-5, "output");
  expect_close(out.weights, f["mha.weights"], 1e-5, "weights");
  ls::backward(ls::sum(out.output * f["mha.w_out"]) + ls::sum(out.weights * f["mha.w_weights"]));
  expect_close(q.grad(), f["mha.grad_q"], 1e-5, "grad q");
  expect_close(k.grad(), f["mha.grad_k"], 1e-5, "grad k");
  expect_close(v.grad(), f["mha.grad_v"], 1e-5, "grad v");
  expect_close(mha.in_proj_weight.grad(), f["mha.grad_in_proj_weight"], 1e-5,
               "grad in_proj_weight");
  // The same against PyTorch's values with both masks given as one per batch and head
  // ([N * H, L, S]), and batch-first (inputs and output [N, L, E]; the heads are other views).
  const ls::Tensor& am = f["mha.attn_mask"];
  const ls::Tensor& kpm = f["mha.key_padding_mask"];
  const ls::Tensor both =
      ls::logical_or(ls::reshape(am, {1, 1, 5, 7}), ls::reshape(kpm, {3, 1, 1, 7}));
  masks.attn_mask = ls::reshape(ls::expand(both, {3, 4, 5, 7}), {12, 5, 7});
  masks.key_padding_mask = ls::Tensor();
  const auto per_head = mha(q, k, v, masks);
  expect_close(per_head.output, f["mha.out"], 1e-5, "output, per-head mask");
  expect_close(per_head.weights, f["mha.weights"], 1e-5, "weights, per-head mask");
  ls::nn::MultiheadAttention first(16, 4, 0.0, true, /*batch_first=*/true);
  first.load_state_dict(f.with_prefix("mha.init."));
  masks.attn_mask = am;
  masks.key_padding_mask = kpm;
  const auto bf =
      first(ls::transpose(q, 0, 1), ls::transpose(k, 0, 1), ls::transpose(v, 0, 1), masks);
  expect_close(ls::transpose(bf.output, 0, 1), f["mha.out"], 1e-5, "output, batch first");
  expect_close(bf.weights, f["mha.weights"], 1e-5, "weights, batch first");
  // State dicts load both ways: ours has PyTorch's names, in PyTorch's order.
  std::vector<std::string> names;
  for (const auto& [n, t] : mha.state_dict()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"in_proj_weight", "in_proj_bias", "out_proj.weight",
                                             "out_proj.bias"}));
}

TEST(GoldenTransformer, PostNormEncoderLayerWithKeyPaddingMatchesPyTorch) {
  const Fixture& f = fixture();
  ls::nn::TransformerEncoderLayer layer({16, 4, 32, 0.0});
  layer.load_state_dict(f.with_prefix("enc.init."));
  ls::Tensor src = f["enc.src"].detach().set_requires_grad();
  ls::nn::AttentionMasks masks;
  masks.key_padding_mask = f["enc.pad"];
  const ls::Tensor y = layer(src, masks);
  expect_close(y, f["enc.out"], 1e-5, "output");
  ls::backward(ls::sum(y * f["enc.w"]));
  expect_close(src.grad(), f["enc.grad_src"], 1e-5, "grad src");
  expect_close(layer.linear1->weight.grad(), f["enc.grad_linear1.weight"], 1e-5,
               "grad linear1.weight");
}

TEST(GoldenTransformer, ScaledDotProductAttentionFollowsItsDefinition) {
  // Against the formula written out: softmax(q k^T / sqrt(E) masked) v, bool mask true = attend.
  ls::manual_seed(5);
  const ls::Tensor q = ls::randn({2, 3, 4, 8}), k = ls::randn({2, 3, 6, 8}),
                   v = ls::randn({2, 3, 6, 5});
  const ls::Tensor allowed = ls::rand({4, 6}) < 0.7 || ls::eq(ls::arange(6), 0);
  const ls::Tensor got = ls::nn::scaled_dot_product_attention(q, k, v, allowed);
  const ls::Tensor s = ls::matmul(q, ls::transpose(k, -2, -1)) / std::sqrt(8.0);
  const ls::Tensor want =
      ls::matmul(ls::softmax(ls::where(allowed, s, -1e30), -1), v);  // -1e30: exp underflows
  expect_close(got, want, 1e-6, "masked");
  const ls::Tensor causal =
      ls::nn::scaled_dot_product_attention(q, q, ls::slice(v, 2, 0, 4), {}, 0, true);
  const ls::Tensor sc = ls::matmul(q, ls::transpose(q, -2, -1)) / std::sqrt(8.0);
  const ls::Tensor tri = ls::tril(ls::ones({4, 4}, ls::boolean));
  expect_close(causal,
               ls::matmul(ls::softmax(ls::where(tri, sc, -1e30), -1), ls::slice(v, 2, 0, 4)), 1e-6,
               "causal");
  EXPECT_THROW(ls::nn::scaled_dot_product_attention(q, k, v, allowed, 0, true), ls::Error);
  EXPECT_THROW(ls::nn::scaled_dot_product_attention(q, v, v), ls::Error);
}

}  // namespace

namespace {

TEST(GoldenRecurrent, BidirectionalTwoLayerLstmMatchesPyTorch) {
  const Fixture& f = fixture();
  ls::nn::LSTM lstm({.input_size = 5, .hidden_size = 7, .num_layers = 2, .bidirectional = true});
  lstm.load_state_dict(f.with_prefix("lstm.init."));  // PyTorch's names, both ways
  ls::Tensor x = f["lstm.x"].detach().set_requires_grad();
  const auto out = lstm(x, f["lstm.h0"], f["lstm.c0"]);
  expect_close(out.output, f["lstm.out"], 1e-5, "output");
  expect_close(out.h_n, f["lstm.h_n"], 1e-5, "h_n");
  expect_close(out.c_n, f["lstm.c_n"], 1e-5, "c_n");
  ls::backward(ls::sum(out.output * f["lstm.w_out"]) + ls::sum(out.h_n * f["lstm.w_h"]) +
               ls::sum(out.c_n * f["lstm.w_c"]));
  expect_close(x.grad(), f["lstm.grad_x"], 1e-5, "grad x");
  ls::Tensor w;
  for (const auto& [n, t] : lstm.named_parameters())
    if (n == "weight_hh_l1_reverse") w = t;
  expect_close(w.grad(), f["lstm.grad_weight_hh_l1_reverse"], 1e-5, "grad weight_hh_l1_reverse");
}

TEST(GoldenRecurrent, BatchFirstGruMatchesPyTorch) {
  const Fixture& f = fixture();
  ls::nn::GRU gru({.input_size = 4, .hidden_size = 6, .batch_first = true});
  gru.load_state_dict(f.with_prefix("gru.init."));
  ls::Tensor x = f["gru.x"].detach().set_requires_grad();
  const auto out = gru(x, ls::Tensor());
  expect_close(out.output, f["gru.out"], 1e-5, "output");
  expect_close(out.h_n, f["gru.h_n"], 1e-5, "h_n");
  ls::backward(ls::sum(out.output * f["gru.w_out"]) + ls::sum(out.h_n * f["gru.w_h"]));
  expect_close(x.grad(), f["gru.grad_x"], 1e-5, "grad x");
  expect_close(gru.named_parameters()[0].second.grad(), f["gru.grad_weight_ih_l0"], 1e-5,
               "grad weight_ih_l0");
}

TEST(GoldenRecurrent, AnLstmStepCompilesOncePerSequenceLength) {
  ls::manual_seed(1);
  ls::nn::LSTM lstm({.input_size = 3, .hidden_size = 4});
  ls::nn::Linear head(4, 1);
  std::vector<ls::Tensor> params = lstm.parameters();
  for (const ls::Tensor& p : head.parameters()) params.push_back(p);
  ls::optim::Adam opt(params, {.lr = 1e-2});
  auto train = [&](int64_t len) {
    ls::step([&] {
      const ls::Tensor x = ls::randn({len, 2, 3});
      opt.zero_grad();
      ls::mean(ls::square(head(lstm(x)) - 1.0)).backward();
      opt.step();
    });
  };
  train(5);
  train(5);
  ls::wait();
  const int64_t compiles = ls::metrics::counter("compiles");
  for (int i = 0; i < 3; ++i) train(5);
  train(7);
  train(7);
  ls::wait();
  EXPECT_EQ(ls::metrics::counter("compiles") - compiles, 1);  // only the new length
  EXPECT_THROW(lstm(ls::zeros({4, 3})), ls::Error);           // unbatched: 2-d
  EXPECT_THROW(lstm(ls::zeros({4, 2, 5})), ls::Error);        // wrong feature size
  EXPECT_THROW(lstm(ls::zeros({4, 2, 3}), ls::zeros({2, 2, 4}), ls::Tensor()), ls::Error);
}

}  // namespace
