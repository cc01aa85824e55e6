// ls::multinomial and ls::bernoulli (issue 32, item 1): their distributions over many draws
// against PyTorch 1.13's from a fixed seed (golden frequencies, compared within 5 standard
// deviations of the difference of two independent estimates), PyTorch's shapes and rules, the
// bad calls, and a step's rollback restoring the generator they draw from.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>
#include <vector>

#include <lockstep/lockstep.h>
#include "unit/ops_test_util.h"

namespace ls = lockstep;
using ops_test::error_of;
using ::testing::HasSubstr;

namespace {

// |ours - torch| within 5 sigma of the difference of two frequencies of p over n draws each.
void expect_frequency(double ours, double torch, double p, double n, const char* what) {
  const double sigma = std::sqrt(2 * p * (1 - p) / n);
  EXPECT_LE(std::abs(ours - torch), 5 * sigma + 1e-12)
      << what << ": " << ours << " vs PyTorch's " << torch << " (p " << p << ")";
}

}  // namespace

// /usr/bin/python3: torch.manual_seed(0); p = torch.tensor([0.1, 0.2, 0.0, 0.3, 0.4]);
// s = torch.multinomial(p, 200000, replacement=True); torch.bincount(s, minlength=5) / 200000
TEST(Sampling, MultinomialWithReplacementMatchesPyTorchsFrequencies) {
  ls::manual_seed(11);
  const std::vector<double> torch = {0.09962, 0.200285, 0.0, 0.30032, 0.399775};
  const std::vector<double> p = {0.1, 0.2, 0.0, 0.3, 0.4};
  constexpr int64_t kDraws = 200000;
  // Weights need not sum to 1: scaled by 7, in f32.
  ls::Tensor w = ls::from_vector<float>({0.7f, 1.4f, 0.0f, 2.1f, 2.8f}, {5});
  ls::Tensor s = ls::multinomial(w, kDraws, true);
  EXPECT_EQ(s.dtype(), ls::i64);
  EXPECT_EQ(s.shape(), (ls::Shape{kDraws}));
  std::vector<double> freq(5, 0);
  for (int64_t v : s.to_vector<int64_t>()) {
    ASSERT_TRUE(v >= 0 && v < 5) << v;
    freq[static_cast<size_t>(v)] += 1.0 / kDraws;
  }
  EXPECT_EQ(freq[2], 0.0);  // weight 0: never drawn
  for (size_t c = 0; c < 5; ++c) expect_frequency(freq[c], torch[c], p[c], kDraws, "category");
  // Rows: each its own distribution ([B, K] -> [B, n]).
  ls::Tensor rows = ls::from_vector<double>({0, 0, 1, 1, 0, 0}, {2, 3});
  const std::vector<int64_t> r = ls::multinomial(rows, 50, true).to_vector<int64_t>();
  for (size_t i = 0; i < 50; ++i) EXPECT_EQ(r[i], 2);
  for (size_t i = 50; i < 100; ++i) EXPECT_EQ(r[i], 0);
}

// q = torch.tensor([[1., 2., 3., 4.]]).repeat(50000, 1); s = torch.multinomial(q, 2) (after the
// draw above); the frequencies of (first, second) as first * 4 + second.
TEST(Sampling, MultinomialWithoutReplacementMatchesPyTorchsPairs) {
  ls::manual_seed(12);
  const std::vector<double> torch = {0.0,     0.02218, 0.0335,  0.04462, 0.02408, 0.0,
                                     0.07518, 0.10306, 0.0439,  0.0841,  0.0,     0.1698,
                                     0.06878, 0.13022, 0.20058, 0.0};
  constexpr int64_t kRows = 50000;
  ls::Tensor q = ls::expand(ls::from_vector<float>({1, 2, 3, 4}, {1, 4}), {kRows, 4});
  ls::Tensor s = ls::multinomial(q, 2);
  EXPECT_EQ(s.shape(), (ls::Shape{kRows, 2}));
  std::vector<double> freq(16, 0);
  const std::vector<int64_t> v = s.to_vector<int64_t>();
  for (size_t i = 0; i < v.size(); i += 2)
    freq[static_cast<size_t>(v[i] * 4 + v[i + 1])] += 1.0 / kRows;
  for (size_t c = 0; c < 16; ++c) {
    const double a = static_cast<double>(c / 4 + 1) / 10, b = static_cast<double>(c % 4 + 1) / 10;
    const double p = c / 4 == c % 4 ? 0.0 : a * b / (1 - a);  // the exact probability
    if (p == 0) {
      EXPECT_EQ(freq[c], 0.0) << "a category drawn twice";
    }
    expect_frequency(freq[c], torch[c], p, kRows, "pair");
  }
  // All K: a permutation of each row; zero weights last.
  const std::vector<int64_t> all =
      ls::multinomial(ls::from_vector<float>({0, 5, 1, 0, 2}, {5}), 5).to_vector<int64_t>();
  EXPECT_EQ(std::set<int64_t>(all.begin(), all.end()).size(), 5u);
  EXPECT_EQ(std::set<int64_t>(all.begin(), all.begin() + 3), (std::set<int64_t>{1, 2, 4}));
  // One sample from [B, K].
  EXPECT_EQ(ls::multinomial(ls::from_vector<float>({0, 1, 1, 0}, {2, 2}), 1).to_vector<int64_t>(),
            (std::vector<int64_t>{1, 0}));
}

// torch.bernoulli(torch.full((200000,), 0.3)).mean() = 0.30081 (after the draws above).
TEST(Sampling, BernoulliMatchesPyTorchsMeanAndKeepsTheDtype) {
  ls::manual_seed(13);
  constexpr int64_t kDraws = 200000;
  ls::Tensor b = ls::bernoulli(ls::full({kDraws}, 0.3));
  EXPECT_EQ(b.dtype(), ls::f32);
  const std::vector<float> v = b.to_vector<float>();
  double mean = 0;
  for (float x : v) {
    ASSERT_TRUE(x == 0.0f || x == 1.0f) << x;
    mean += x / kDraws;
  }
  expect_frequency(mean, 0.30081, 0.3, kDraws, "bernoulli");
  // Per-element probabilities, and the scalar form with x's shape.
  EXPECT_EQ(ls::bernoulli(ls::from_vector<double>({0, 1, 0, 1}, {2, 2})).to_vector<double>(),
            (std::vector<double>{0, 1, 0, 1}));
  ls::Tensor c = ls::bernoulli(ls::zeros({3, 2}, ls::f64), 1.0);
  EXPECT_EQ(c.dtype(), ls::f64);
  EXPECT_EQ(c.to_vector<double>(), std::vector<double>(6, 1.0));
}

TEST(Sampling, BadCallsNameTheProblem) {
  ls::Tensor w = ls::ones({4});
  EXPECT_THAT(error_of([&] { ls::multinomial(w, 5); }),
              HasSubstr("cannot draw 5 samples without replacement from 4 categories"));
  EXPECT_THAT(error_of([&] { ls::multinomial(w, 0, true); }),
              HasSubstr("num_samples = 0 must be positive"));
  EXPECT_THAT(error_of([&] {
                ls::multinomial(ls::ones({2, 2, 2}), 1);
              }),
              HasSubstr("weights must be [K] or [B, K]"));
  EXPECT_THAT(error_of([&] { ls::multinomial(ls::ones({4}, ls::i64), 1); }),
              HasSubstr("weights must be floating-point"));
  EXPECT_THAT(error_of([&] { ls::bernoulli(ls::ones({4}), 1.5); }),
              HasSubstr("p = 1.5 is not a probability"));
  EXPECT_THAT(error_of([&] { ls::bernoulli(ls::ones({4}, ls::i64)); }),
              HasSubstr("probabilities must be floating-point"));
}

// Draws in a step that fails are undone with it: the next draw is the one the failed step made.
TEST(Sampling, AFailedStepRestoresTheGeneratorItDrewFrom) {
  ls::manual_seed(21);
  ls::Tensor w = ls::from_vector<float>({1, 2, 3, 4, 5, 6, 7, 8}, {8});
  const std::vector<int64_t> first = ls::multinomial(w, 8).to_vector<int64_t>();
  const std::vector<float> coin = ls::bernoulli(ls::full({16}, 0.5)).to_vector<float>();
  ls::manual_seed(21);
  ls::Tensor kept;
  EXPECT_THROW(ls::step([&] {
                 kept = ls::multinomial(w, 8);
                 ls::bernoulli(ls::full({16}, 0.5));
                 throw std::runtime_error("failed");
               }),
               std::runtime_error);
  EXPECT_EQ(ls::multinomial(w, 8).to_vector<int64_t>(), first);
  EXPECT_EQ(ls::bernoulli(ls::full({16}, 0.5)).to_vector<float>(), coin);
}

// models::GPT::generate (issue 32, item 8): the padded form compiles one program for the whole
// generation, past block_size too (the window slides), and draws what the naive form (a context
// growing one token a time, one compile per length) draws: greedy with top_k = 1, and within
// the top k otherwise.
TEST(Sampling, GptGenerateCompilesOnceAndAgreesWithTheGrowingContext) {
  ls::manual_seed(31);
  ls::models::GPT model({.vocab_size = 13,
                         .block_size = 12,
                         .d_model = 32,
                         .nhead = 4,
                         .num_layers = 2,
                         .dim_feedforward = 64});
  const ls::Tensor prompt = ls::from_vector<int64_t>({1, 2, 3, 4, 5, 6}, {2, 3});
  constexpr int64_t kNew = 20;  // past block_size: the window slides
  // The naive form's next token for a context: the last position's logits.
  auto logits_after = [&](const std::vector<int64_t>& seq2, int64_t len) {
    ls::NoGrad no_grad;
    const int64_t start = std::max<int64_t>(0, len - 12);
    std::vector<int64_t> ctx;
    for (int64_t r = 0; r < 2; ++r)
      for (int64_t t = start; t < len; ++t)
        ctx.push_back(seq2[static_cast<size_t>(r * (3 + kNew) + t)]);
    ls::Tensor logits = model(ls::from_vector(ctx, {2, len - start}));
    return ls::select(logits, 1, -1).to_vector<float>();  // [2, 13]
  };

  ops_test::Delta compiles("compiles");
  const ls::Tensor greedy = model.generate(prompt, kNew, 1.0, 1);
  EXPECT_EQ(greedy.shape(), (ls::Shape{2, 3 + kNew}));
  const std::vector<int64_t> g = greedy.to_vector<int64_t>();
  EXPECT_LE(compiles.get(), 3);      // the prompt's padding, the token step, and the read at most
  EXPECT_TRUE(model.is_training());  // the mode is restored
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t t = 0; t < 3; ++t)
      EXPECT_EQ(g[static_cast<size_t>(r * (3 + kNew) + t)], r * 3 + t + 1);  // the prompt is kept
  model.eval();
  for (int64_t len = 3; len < 3 + kNew; ++len) {
    const std::vector<float> l = logits_after(g, len);
    for (int64_t r = 0; r < 2; ++r) {
      const auto row = l.begin() + r * 13;
      const int64_t best = std::max_element(row, row + 13) - row;
      EXPECT_EQ(g[static_cast<size_t>(r * (3 + kNew) + len)], best) << "row " << r << " at " << len;
    }
  }
  model.train();

  // Sampling among the top 3 at temperature 2: each token is one of the three likeliest.
  compiles = ops_test::Delta("compiles");
  const std::vector<int64_t> s = model.generate(prompt, kNew, 2.0, 3).to_vector<int64_t>();
  EXPECT_LE(compiles.get(), 3);
  model.eval();
  for (int64_t len = 3; len < 3 + kNew; ++len) {
    const std::vector<float> l = logits_after(s, len);
    for (int64_t r = 0; r < 2; ++r) {
      std::vector<float> row(l.begin() + r * 13, l.begin() + r * 13 + 13);
      const float token_logit =
          row[static_cast<size_t>(s[static_cast<size_t>(r * (3 + kNew) + len)])];
      std::sort(row.begin(), row.end(), std::greater<float>());
      EXPECT_GE(token_logit, row[2]) << "row " << r << " at " << len;
    }
  }
  model.train();
  EXPECT_THAT(error_of([&] { model.generate(prompt, 4, 0.0); }),
              HasSubstr("temperature 0 must be finite and > 0"));
  EXPECT_THAT(error_of([&] { model.generate(prompt, 4, 1.0, 14); }),
              HasSubstr("top_k = 14 is outside [0, 13]"));
}
