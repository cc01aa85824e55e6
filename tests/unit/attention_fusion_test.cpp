// Fused attention (src/backends/cpu/attention.cpp): attentions written from primitives the way
// users write them (nanoGPT's slices of one product and masked_fill, scaled_dot_product_attention's
// causal and padding masks, an added float mask, a division by sqrt(E)) run on the cpu backend as
// one forward and one backward step, and give the ref backend's values and gradients; where the
// pattern must not fuse (the scores kept, a row that is all masked) the values are still the
// ref backend's.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <lockstep/lockstep.h>

#include "backends/cpu/matmul.h"

namespace ls = lockstep;
namespace cpu = lockstep::backends::cpu;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Result {
  std::vector<std::vector<float>> values;  // the output, then each input's gradient
  int64_t fused = 0;                       // attentions the cpu backend fused
};

// The attention `attend` builds from `inputs` (random, requiring grad) on `dev`, in one step with
// the backward of sum(y cos y); with `grad` false, the forward alone; with `bf16`, under autocast.
Result run(const char* dev, const std::vector<ls::Shape>& shapes,
           const std::function<ls::Tensor(const std::vector<ls::Tensor>&)>& attend,
           bool grad = true, bool bf16 = false) {
  const ls::Device d = ls::parse_device(dev);
  ls::manual_seed(11);
  std::vector<ls::Tensor> inputs;
  for (const ls::Shape& s : shapes) {
    ls::Tensor t = ls::randn(s).to(d);
    if (grad) t.set_requires_grad();
    inputs.push_back(t);
  }
  ls::manual_seed(12);  // dropout's draws on `dev` from the same state on every device
  const int64_t before = ls::metrics::counter("fused_attentions");
  ls::Tensor y;
  ls::step([&] {
    {
      auto scope = ls::autocast(bf16 ? ls::bf16 : ls::f32);
      y = attend(inputs).to(ls::f32);
    }
    if (grad) ls::sum(ls::mul(y, ls::cos(y))).backward();
  });
  Result r;
  r.values.push_back(y.to_vector<float>());
  if (grad)
    for (const ls::Tensor& t : inputs) r.values.push_back(t.grad().to_vector<float>());
  r.fused = ls::metrics::counter("fused_attentions") - before;
  return r;
}

void expect_near(const Result& got, const Result& want, double tolerance = 2e-4) {
  ASSERT_EQ(got.values.size(), want.values.size());
  for (size_t t = 0; t < got.values.size(); ++t) {
    ASSERT_EQ(got.values[t].size(), want.values[t].size());
    for (size_t i = 0; i < got.values[t].size(); ++i) {
      const float g = got.values[t][i], w = want.values[t][i];
      if (std::isnan(w)) {
        ASSERT_TRUE(std::isnan(g)) << "tensor " << t << " element " << i;
        continue;
      }
      ASSERT_NEAR(g, w, tolerance * (1 + std::fabs(w))) << "tensor " << t << " element " << i;
    }
  }
}

// Checks `attend` on the cpu backend against ref; the number of attentions the cpu fused.
int64_t check(const std::vector<ls::Shape>& shapes,
              const std::function<ls::Tensor(const std::vector<ls::Tensor>&)>& attend,
              bool grad = true, bool bf16 = false) {
  const Result want = run("ref", shapes, attend, grad, bf16);
  const Result got = run("cpu", shapes, attend, grad, bf16);
  // bf16: each rounding is the graph's, but a product summed in another order may round to the
  // neighbouring bf16 value (2^-8 apart).
  expect_near(got, want, bf16 ? 4e-3 : 2e-4);
  return got.fused;
}

// nanoGPT's CausalSelfAttention: q, k and v are slices of one product, viewed as heads.
ls::Tensor nanogpt(const ls::Tensor& qkv, int64_t heads, double fill) {
  const int64_t b = qkv.size(0), t = qkv.size(1), d = qkv.size(2) / 3, hd = d / heads;
  const std::vector<ls::Tensor> parts = ls::split(qkv, d, 2);
  auto head = [&](const ls::Tensor& x) {
    return ls::transpose(ls::reshape(x, {b, t, heads, hd}), 1, 2);
  };
  const ls::Tensor q = head(parts[0]), k = head(parts[1]), v = head(parts[2]);
  ls::Tensor att = ls::mul(ls::matmul(q, ls::transpose(k, -2, -1)), 1.0 / std::sqrt(hd));
  const ls::Tensor mask = ls::gt(ls::triu(ls::ones({t, t}), 1), 0.5);
  att = ls::softmax(ls::masked_fill(att, mask.to(qkv.device()), fill), -1);
  return ls::reshape(ls::transpose(ls::matmul(att, v), 1, 2), {b, t, d});
}

TEST(AttentionFusion, NanoGptsCausalSelfAttentionMatchesRef) {
  // 37 queries: blocks of rows that end part way.
  EXPECT_EQ(check({{2, 37, 72}}, [](const auto& in) { return nanogpt(in[0], 3, -kInf); }), 1);
}

// The blocks' products run on the BLAS sgemm this machine suits (matmul.h): each library.
TEST(AttentionFusion, OnEitherBlasLibrary) {
  int64_t queries = 41;  // programs of their own (the counter counts compiles)
  for (const auto choice : {cpu::MatMulChoice::OpenBlas, cpu::MatMulChoice::OneDnnSgemm}) {
    cpu::set_matmul_choice(choice);
    SCOPED_TRACE(cpu::library_name(cpu::blas_library()));
    EXPECT_EQ(check({{2, queries++, 72}}, [](const auto& in) { return nanogpt(in[0], 3, -kInf); }),
              1);
  }
  cpu::set_matmul_choice(cpu::MatMulChoice::Auto);
}

TEST(AttentionFusion, AFiniteFillIsNotSkipped) {
  EXPECT_EQ(check({{2, 21, 24}}, [](const auto& in) { return nanogpt(in[0], 2, -1e4); }), 1);
}

TEST(AttentionFusion, ScaledDotProductAttentionsCausalMaskOverMoreKeysThanQueries) {
  // L 20, S 45, E 8, Ev 5: is_causal keeps key j for query i when j <= i.
  EXPECT_EQ(check({{2, 3, 20, 8}, {2, 3, 45, 8}, {2, 3, 45, 5}},
                  [](const auto& in) {
                    return ls::nn::scaled_dot_product_attention(in[0], in[1], in[2], {}, 0, true);
                  }),
            1);
}

// Scores divided by sqrt(E) = 2 plus an f32 mask: -inf above the diagonal, random finite values
// elsewhere (under autocast the sum is f32: the bf16 scores widened, as PyTorch's
// MultiheadAttention adds its float mask).
ls::Tensor added_mask(const std::vector<ls::Tensor>& in) {
  const ls::Device d = in[0].device();
  ls::manual_seed(5);
  const ls::Tensor causal = ls::gt(ls::triu(ls::ones({16, 16}), 1), 0.5);
  const ls::Tensor mask = ls::masked_fill(ls::randn({16, 16}), causal, -kInf).to(d);
  const ls::Tensor s = ls::div(ls::matmul(in[0], ls::transpose(in[1], -2, -1)), 2.0);
  return ls::matmul(ls::softmax(ls::add(s, mask), -1), in[2]);
}

}  // namespace

TEST(AttentionFusion, AnAddedFloatMaskAndADivisionBySqrtE) {
  EXPECT_EQ(check({{3, 2, 16, 4}, {3, 2, 16, 4}, {3, 2, 16, 4}}, added_mask), 1);
}

TEST(AttentionFusion, APaddingMaskWithABatchEntryThatKeepsNoKey) {
  // Keys kept per batch entry: 0 (every row NaN, as the graph's), 3, all 9.
  EXPECT_EQ(
      check({{3, 2, 7, 4}, {3, 2, 9, 4}, {3, 2, 9, 4}},
            [](const auto& in) {
              std::vector<float> keep(27, 0);
              for (int j = 0; j < 3; ++j) keep[9 + j] = 1;
              for (int j = 0; j < 9; ++j) keep[18 + j] = 1;
              const ls::Tensor allowed = ls::gt(ls::from_vector<float>(keep, {3, 1, 1, 9}), 0.5);
              return ls::nn::scaled_dot_product_attention(in[0], in[1], in[2],
                                                          allowed.to(in[0].device()));
            }),
      1);
}

TEST(AttentionFusion, TheForwardAloneFusesToo) {
  EXPECT_EQ(check(
                {{4, 33, 16}, {4, 50, 16}, {4, 50, 16}},
                [](const auto& in) {
                  return ls::nn::scaled_dot_product_attention(in[0], in[1], in[2], {}, 0, true);
                },
                false),
            1);
}

TEST(AttentionFusion, AnUnmaskedAttentionKeepsItsPrimitives) {
  // Nothing to skip: the fused steps would do one product more than the primitives.
  EXPECT_EQ(check({{4, 33, 16}, {4, 50, 16}, {4, 50, 16}},
                  [](const auto& in) {
                    return ls::nn::scaled_dot_product_attention(in[0], in[1], in[2]);
                  }),
            0);
}

TEST(AttentionFusion, ScoresKeptByTheProgramAreNotFused) {
  // The softmax is returned besides the output: its values must exist, so nothing fuses.
  ls::Tensor kept_ref, kept_cpu;
  auto attend = [](ls::Tensor* kept) {
    return [kept](const std::vector<ls::Tensor>& in) {
      const ls::Tensor s = ls::mul(ls::matmul(in[0], ls::transpose(in[1], -2, -1)), 0.5);
      const ls::Tensor mask = ls::gt(ls::triu(ls::ones({10, 10}), 1), 0.5).to(in[0].device());
      *kept = ls::softmax(ls::masked_fill(s, mask, -kInf), -1);
      return ls::matmul(*kept, in[2]);
    };
  };
  const ls::Shape s{2, 10, 4};
  const Result want = run("ref", {s, s, s}, attend(&kept_ref));
  const Result got = run("cpu", {s, s, s}, attend(&kept_cpu));
  expect_near(got, want);
  EXPECT_EQ(got.fused, 0);
  const std::vector<float> a = kept_cpu.to_vector<float>(), b = kept_ref.to_vector<float>();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5);
}

TEST(AttentionFusion, UnderAutocastTheBf16AttentionMatchesRef) {
  // bf16 products with the softmax in f32 (autocast's casts in between), each rounding emulated.
  EXPECT_EQ(check(
                {{2, 37, 48}}, [](const auto& in) { return nanogpt(in[0], 2, -kInf); }, true, true),
            1);
  EXPECT_EQ(check(
                {{2, 3, 20, 8}, {2, 3, 45, 8}, {2, 3, 45, 5}},
                [](const auto& in) {
                  return ls::nn::scaled_dot_product_attention(in[0], in[1], in[2], {}, 0, true);
                },
                true, true),
            1);
  EXPECT_EQ(check({{3, 2, 16, 4}, {3, 2, 16, 4}, {3, 2, 16, 4}}, added_mask, true, true), 1);
}

TEST(AttentionFusion, AnOutputReadThroughAPermuteByElementwiseOps) {
  // The heads' permute back is read by a tree (a view, not a value): the output is written as
  // the product, and the tree reads it through the permute.
  EXPECT_EQ(check({{2, 3, 12, 16}, {2, 3, 12, 16}, {2, 3, 12, 16}},
                  [](const auto& in) {
                    const ls::Tensor y =
                        ls::nn::scaled_dot_product_attention(in[0], in[1], in[2], {}, 0, true);
                    return ls::mul(ls::transpose(y, 1, 2), 2.0);
                  }),
            1);
}

TEST(AttentionFusion, OneAttentionsOutputIsTheNextOnesQueries) {
  // Two attentions over the same keys and values (one transpose of the keys, read by both), the
  // second's queries the first's output (the permutes and reshapes between simplify away).
  EXPECT_EQ(check({{2, 3, 10, 16}, {2, 3, 10, 16}, {2, 3, 10, 16}},
                  [](const auto& in) {
                    const ls::Tensor y =
                        ls::nn::scaled_dot_product_attention(in[0], in[1], in[2], {}, 0, true);
                    const ls::Tensor rows = ls::reshape(ls::transpose(y, 1, 2), {2, 10, 48});
                    const ls::Tensor q = ls::transpose(ls::reshape(rows, {2, 10, 3, 16}), 1, 2);
                    return ls::nn::scaled_dot_product_attention(q, in[1], in[2], {}, 0, true);
                  }),
            2);
}

TEST(AttentionFusion, DropoutOnTheProbabilities) {
  // scaled_dot_product_attention's dropout (the random numbers are every backend's alike): the
  // product reads where(keep, P / (1 - p), 0); the causal mask's columns are still skipped.
  EXPECT_EQ(check({{2, 3, 20, 8}, {2, 3, 20, 8}, {2, 3, 20, 8}},
                  [](const auto& in) {
                    return ls::nn::scaled_dot_product_attention(in[0], in[1], in[2], {}, 0.25,
                                                                true);
                  }),
            1);
  EXPECT_EQ(check(
                {{2, 37, 72}},
                [](const auto& in) {
                  // nanoGPT's attention with its dropout, forward alone (evaluation of a
                  // model left in training mode).
                  const ls::Tensor qkv = in[0];
                  const std::vector<ls::Tensor> parts = ls::split(qkv, 24, 2);
                  auto head = [](const ls::Tensor& x) {
                    return ls::transpose(ls::reshape(x, {2, 37, 3, 8}), 1, 2);
                  };
                  ls::Tensor att = ls::mul(
                      ls::matmul(head(parts[0]), ls::transpose(head(parts[1]), -2, -1)), 0.35);
                  const ls::Tensor mask = ls::gt(ls::triu(ls::ones({37, 37}), 1), 0.5);
                  att = ls::masked_fill(att, mask.to(qkv.device()), -kInf);
                  att = ls::nn::dropout(ls::softmax(att, -1), 0.1, true);
                  return ls::matmul(att, head(parts[2]));
                },
                false),
            1);
}
