// Embedding's padding_idx (the row starts at zero, gets no gradient and so stays as it is under
// optimizer steps; negative counts from the end; out of range is an Error) and the Transformer
// stacks' names, shapes and gradients. Values against PyTorch: python/tests/test_transformer.py.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <lockstep/lockstep.h>

namespace ls = lockstep;
namespace nn = ls::nn;

namespace {

std::vector<float> row(const ls::Tensor& w, int64_t i) {
  return ls::select(w, 0, i).to_vector<float>();
}

TEST(NnEmbedding, PaddingRowStartsAtZeroAndStaysThereUnderSgdAndAdam) {
  ls::manual_seed(3);
  for (int opt_kind = 0; opt_kind < 2; ++opt_kind) {
    nn::Embedding emb(6, 4, /*padding_idx=*/-2);  // row 4
    ASSERT_TRUE(emb.padding_idx.has_value());
    EXPECT_EQ(*emb.padding_idx, 4);
    EXPECT_EQ(row(emb.weight, 4), std::vector<float>(4, 0.0f));
    const std::vector<float> other = row(emb.weight, 1);
    std::unique_ptr<ls::optim::Optimizer> opt;
    if (opt_kind == 0)
      opt = std::make_unique<ls::optim::SGD>(emb.parameters(),
                                             ls::optim::SGDOptions{.lr = 0.5, .momentum = 0.9});
    else
      opt = std::make_unique<ls::optim::Adam>(emb.parameters(), ls::optim::AdamOptions{.lr = 0.1});
    const ls::Tensor ids = ls::from_vector(std::vector<int64_t>{4, 1, 4, 0, 4, 1}, {2, 3});
    // The padding row's gradient is zero; the others' are not.
    ls::sum(ls::mul(emb(ids), 3.0)).backward();
    EXPECT_EQ(row(emb.weight.grad(), 4), std::vector<float>(4, 0.0f));
    EXPECT_EQ(row(emb.weight.grad(), 1), std::vector<float>(4, 6.0f));
    for (int s = 0; s < 4; ++s)
      ls::step([&] {
        opt->zero_grad();
        ls::sum(ls::mul(emb(ids), 3.0)).backward();
        opt->step();
      });
    EXPECT_EQ(row(emb.weight, 4), std::vector<float>(4, 0.0f)) << "optimizer " << opt_kind;
    EXPECT_NE(row(emb.weight, 1), other);
  }
}

TEST(NnEmbedding, LookupsOfThePaddingRowReturnItsValue) {
  // A loaded (non-zero) padding row is still what a lookup returns, as PyTorch's.
  nn::Embedding emb(5, 3, 0);
  {
    ls::NoGrad no_grad;
    emb.weight.copy_(ls::ones({5, 3}));
  }
  EXPECT_EQ(emb(ls::zeros({2}, ls::DType::I64)).to_vector<float>(), std::vector<float>(6, 1.0f));
  EXPECT_THROW(nn::Embedding(5, 3, 5), ls::Error);
  EXPECT_THROW(nn::Embedding(5, 3, -6), ls::Error);
  EXPECT_NO_THROW(nn::Embedding(5, 3, -5));
}

TEST(NnTransformer, DecoderLayerShapesNamesAndGradients) {
  ls::manual_seed(5);
  for (bool batch_first : {false, true}) {
    nn::TransformerDecoderLayer layer({.d_model = 8,
                                       .nhead = 2,
                                       .dim_feedforward = 16,
                                       .dropout = 0.0,
                                       .batch_first = batch_first});
    std::vector<std::string> names;
    for (const auto& [n, t] : layer.state_dict()) names.push_back(n);
    const std::vector<std::string> expected{"self_attn.in_proj_weight",
                                            "self_attn.in_proj_bias",
                                            "self_attn.out_proj.weight",
                                            "self_attn.out_proj.bias",
                                            "multihead_attn.in_proj_weight",
                                            "multihead_attn.in_proj_bias",
                                            "multihead_attn.out_proj.weight",
                                            "multihead_attn.out_proj.bias",
                                            "linear1.weight",
                                            "linear1.bias",
                                            "linear2.weight",
                                            "linear2.bias",
                                            "norm1.weight",
                                            "norm1.bias",
                                            "norm2.weight",
                                            "norm2.bias",
                                            "norm3.weight",
                                            "norm3.bias"};
    EXPECT_EQ(names, expected);
    const ls::Shape tgt_shape = batch_first ? ls::Shape{3, 5, 8} : ls::Shape{5, 3, 8};
    const ls::Shape mem_shape = batch_first ? ls::Shape{3, 7, 8} : ls::Shape{7, 3, 8};
    ls::Tensor tgt = ls::randn(tgt_shape), memory = ls::randn(mem_shape);
    tgt.set_requires_grad();
    memory.set_requires_grad();
    nn::AttentionMasks tgt_masks, memory_masks;
    tgt_masks.attn_mask = nn::Transformer::generate_square_subsequent_mask(5);
    memory_masks.key_padding_mask =
        ls::from_vector(std::vector<int64_t>(21, 0), {3, 7}).to(ls::DType::Bool);
    const ls::Tensor out = layer(tgt, memory, tgt_masks, memory_masks);
    EXPECT_EQ(out.shape(), tgt_shape);
    ls::sum(ls::mul(out, out)).backward();
    EXPECT_EQ(memory.grad().shape(), mem_shape);
    for (const auto& [n, p] : layer.named_parameters()) {
      ASSERT_TRUE(p.grad().defined()) << n;
      const std::vector<float> g = p.grad().to_vector<float>();
      double norm = 0;
      for (float v : g) norm += std::abs(v);
      EXPECT_TRUE(std::isfinite(norm)) << n;
      EXPECT_GT(norm, 0) << n;
    }
  }
}

TEST(NnTransformer, StacksCopyTheLayerAndNameItsCopies) {
  ls::manual_seed(6);
  nn::TransformerEncoderLayer layer({.d_model = 8, .nhead = 2, .dim_feedforward = 16});
  nn::TransformerEncoder encoder(layer, 3, std::make_shared<nn::LayerNorm>(ls::Shape{8}, 1e-5));
  const auto state = encoder.state_dict();
  EXPECT_EQ(state.size(), 3 * layer.state_dict().size() + 2);
  EXPECT_EQ(state.front().first, "layers.0.self_attn.in_proj_weight");
  EXPECT_EQ(state.back().first, "norm.bias");
  // The copies start from the layer's values (PyTorch's deep copy), each its own parameters.
  const ls::Tensor w0 = encoder.layers->at<nn::TransformerEncoderLayer>(0)->linear1->weight;
  const ls::Tensor w2 = encoder.layers->at<nn::TransformerEncoderLayer>(2)->linear1->weight;
  EXPECT_EQ(w0.to_vector<float>(), layer.linear1->weight.to_vector<float>());
  EXPECT_FALSE(w0.is_same(w2));
  EXPECT_EQ(encoder.parameters().size(), 3 * layer.parameters().size() + 2);

  nn::Transformer t({.d_model = 8,
                     .nhead = 2,
                     .num_encoder_layers = 2,
                     .num_decoder_layers = 1,
                     .dim_feedforward = 16,
                     .dropout = 0.0});
  const ls::Tensor y = t(ls::randn({6, 2, 8}), ls::randn({4, 2, 8}));
  EXPECT_EQ(y.shape(), (ls::Shape{4, 2, 8}));
  EXPECT_THROW(t(ls::randn({6, 3, 8}), ls::randn({4, 2, 8})), ls::Error);
  const std::vector<float> m =
      nn::Transformer::generate_square_subsequent_mask(3).to_vector<float>();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(m, (std::vector<float>{0, -inf, -inf, 0, 0, -inf, 0, 0, 0}));
}

}  // namespace
