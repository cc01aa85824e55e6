// Conformance in bf16: the cpu backend's bf16 kernels (fused trees that read and write bf16,
// sums into bf16, oneDNN's bf16 matmul, convolutions and average pooling, max pooling, activations
// held blocked between convolutions) against ref, which computes each bf16 op as its definition
// says (widened to f32, computed, rounded once). Tolerance: one bf16 unit in the last place.
#include <string>
#include <vector>

#include "conformance.h"

namespace conformance {
namespace {

class Bf16 : public Conformance {};

const ls::DType bf = ls::bf16;

LS_COVERS(Bf16, Elementwise, Op::Add, Op::Sub, Op::Mul, Op::Div, Op::Exp, Op::Tanh, Op::Relu,
          Op::Maximum, Op::Where, Op::Gt, Op::Cast, Op::Sqrt, Op::Neg, Op::Abs);
TEST_F(Bf16, Elementwise) {
  for (const ls::Shape& s : shapes_small()) {
    check("bf16 elementwise " + str(s), {{s, bf, Fill::NonFinite}, {s, bf}}, [](const Tensors& x) {
      const ls::Tensor& a = x[0];
      const ls::Tensor& b = x[1];
      return Tensors{a + b,
                     a * b - a,
                     a / (ls::abs(b) + 1),
                     ls::exp(b),
                     ls::tanh(a),
                     ls::relu(a),
                     ls::maximum(a, b),
                     ls::where(a > b, a, -b),
                     ls::sqrt(ls::abs(a)),
                     ls::cast(a, ls::f32) * 3.0,  // f32 from bf16: exact
                     ls::cast(ls::cast(b, ls::f32) / 3.0, bf),
                     a > 0.5};
    });
  }
  // Broadcasts and one-value operands, as batch norm's scale and shift.
  check("bf16 broadcasts", {{{4, 32, 5, 5}, bf}, {{1, 32, 1, 1}}, {{}, bf}}, [](const Tensors& x) {
    const ls::Tensor xf = ls::cast(x[0], ls::f32);
    return Tensors{ls::cast((xf - x[1]) * x[1] + 1.0, bf) + x[2], x[0] * x[2]};
  });
  // Row values over short rows (a softmax's backward under autocast): read run by run.
  check("bf16 row values", {{{64, 4, 32, 32}, bf}, {{64, 4, 32, 1}}, {{64, 4, 32, 1}, bf}},
        [](const Tensors& x) {
          const ls::Tensor xf = ls::cast(x[0], ls::f32);
          return Tensors{ls::cast(ls::exp(xf - x[1]), bf) * x[2], x[0] - x[2]};
        });
}

LS_COVERS(Bf16, Sums, Op::Sum, Op::Cast);
TEST_F(Bf16, Sums) {
  for (const auto& [s, axes] :
       std::vector<std::pair<ls::Shape, std::vector<int64_t>>>{{{37}, {}},
                                                               {{8, 300}, {1}},
                                                               {{8, 300}, {0}},
                                                               {{4, 32, 7, 7}, {0, 2, 3}},
                                                               {{2, 64, 33}, {0, 2}},
                                                               {{3, 2000}, {1}},
                                                               // Over leading and middle axes
                                                               // (bias gradients), threaded.
                                                               {{64, 32, 130}, {0, 1}},
                                                               {{6, 50, 24}, {1}}}) {
    int64_t k = 1;
    for (int64_t a : axes) k *= s[a];
    if (axes.empty()) k = s[0];
    check(
        "bf16 sums " + str(s), {{s, bf}},
        [axes](const Tensors& x) {
          return Tensors{ls::sum(x[0], axes),                     // bf16, summed in f32
                         ls::sum(ls::cast(x[0], ls::f32), axes),  // f32 from bf16
                         ls::sum(ls::relu(x[0]) * x[0], axes, true)};
        },
        static_cast<double>(k));
  }
}

LS_COVERS(Bf16, MatMul, Op::MatMul, Op::Permute);
TEST_F(Bf16, MatMul) {
  for (const auto& [a, b] :
       std::vector<std::pair<ls::Shape, ls::Shape>>{{{1, 1}, {1, 1}},
                                                    {{33, 47}, {47, 29}},
                                                    {{2, 3, 17, 9}, {1, 3, 9, 5}},
                                                    {{128, 256}, {256, 64}}})
    check1(
        "bf16 matmul " + str(a), {{a, bf}, {b, bf}},
        [](const Tensors& x) { return ls::matmul(x[0], x[1]); }, static_cast<double>(a.back()));
  check(
      "bf16 transposed operands", {{{47, 33}, bf}, {{29, 47}, bf}},
      [](const Tensors& x) {
        return Tensors{
            ls::matmul(ls::transpose(x[0], 0, 1), ls::transpose(x[1], 0, 1)),
            ls::transpose(ls::matmul(ls::transpose(x[0], 0, 1), ls::transpose(x[1], 0, 1)), 0, 1)};
      },
      47);
  // Attention's heads: over a sequence-first [T, N, E] as [N * H, T, hd] (batches interleaved
  // with rows: where that costs oneDNN its brgemm kernel the operands and result are copied),
  // over a batch-first [N, T, E] as [N, H, T, hd] views, and a linear layer's transposed weight
  // given a leading 1 ([1, in, out] against [N, T, in]) with the gradient's transpose of that.
  check(
      "bf16 attention head layouts", {{{40, 3, 64}, bf}, {{3, 40, 64}, bf}, {{48, 64}, bf}},
      [](const Tensors& x) {
        const ls::Tensor q = ls::transpose(ls::reshape(x[0], {40, 12, 16}), 0, 1);  // [12, 40, 16]
        const ls::Tensor qk = ls::matmul(q, ls::transpose(q, 1, 2));                // [12, 40, 40]
        const ls::Tensor o = ls::transpose(ls::matmul(qk, q), 0, 1);                // [40, 12, 16]
        const ls::Tensor h = ls::permute(ls::reshape(x[1], {3, 40, 4, 16}), {0, 2, 1, 3});
        const ls::Tensor hk = ls::matmul(h, ls::transpose(h, 2, 3));  // [3, 4, 40, 40]
        const ls::Tensor ho = ls::permute(ls::matmul(hk, h), {0, 2, 1, 3});
        const ls::Tensor wt = ls::reshape(ls::transpose(x[2], 0, 1), {1, 64, 48});
        const ls::Tensor y = ls::matmul(x[1], wt);                    // [3, 40, 48]
        const ls::Tensor g = ls::matmul(y, ls::transpose(wt, 1, 2));  // [3, 40, 64]
        return Tensors{qk, o * 1.0f, hk, ho * 1.0f, y, g};
      },
      64 * 40);
}

LS_COVERS(Bf16, Convolutions, Op::Conv2d, Op::Conv2dBackwardInput, Op::Conv2dBackwardWeight);
TEST_F(Bf16, Convolutions) {
  struct Case {
    ls::Shape x, w;
    ls::Conv2dOptions o;
  };
  const std::vector<Case> cases = {
      {{2, 3, 9, 9}, {16, 3, 3, 3}, {.padding = {1, 1}}},
      {{2, 16, 8, 8}, {32, 16, 3, 3}, {.stride = {2, 2}, .padding = {1, 1}}},
      {{2, 32, 7, 7}, {32, 32, 1, 1}, {}},
      {{1, 8, 6, 6}, {8, 4, 3, 3}, {.padding = {1, 1}, .groups = 2}},
  };
  for (const Case& c : cases) {
    const double k = static_cast<double>(c.w[1] * c.w[2] * c.w[3]);
    const ls::Conv2dOptions o = c.o;
    const ls::Shape xs = c.x, ws = c.w;
    check(
        "bf16 conv2d " + str(c.x) + " * " + str(c.w), {{c.x, bf}, {c.w, bf}},
        [o, xs, ws](const Tensors& x) {
          const ls::Tensor y = ls::conv2d(x[0], x[1], o);
          const ls::Tensor g = ls::cast(ls::tanh(y), bf);
          return Tensors{y, ls::conv2d_backward_input(g, x[1], xs, o),
                         ls::conv2d_backward_weight(x[0], g, ws, o)};
        },
        k * static_cast<double>(c.x[0]) * 16);
  }
}

LS_COVERS(Bf16, PoolingAndBlockedChains, Op::MaxPool2d, Op::MaxPool2dIndices, Op::MaxPool2dBackward,
          Op::AvgPool2d, Op::AvgPool2dBackward);
TEST_F(Bf16, PoolingAndBlockedChains) {
  // Pooling alone (plain layout) and between convolutions (activations held blocked).
  check("bf16 pooling", {{{2, 16, 9, 9}, bf, Fill::Distinct}, {{2, 16, 10, 10}, bf}},
        [](const Tensors& x) {
          auto [v, i] = ls::max_pool2d_with_indices(x[0], {.kernel = {3, 3}, .stride = {2, 2}});
          const ls::Tensor a = ls::avg_pool2d(x[1], {.kernel = {2, 2}});
          return Tensors{v, i,
                         ls::max_pool2d_backward(v * v, i, {2, 16, 9, 9},
                                                 {.kernel = {3, 3}, .stride = {2, 2}}),
                         a, ls::avg_pool2d_backward(a, {2, 16, 10, 10}, {.kernel = {2, 2}})};
        });
  const int64_t before = ls::metrics::counter("blocked_activations");
  check(
      "bf16 conv relu pool conv chain",
      {{{4, 16, 12, 12}, bf}, {{32, 16, 3, 3}, bf}, {{32, 32, 3, 3}, bf}},
      [](const Tensors& x) {
        const ls::Tensor h = ls::relu(ls::conv2d(x[0], x[1], {.padding = {1, 1}}));
        auto [p, i] = ls::max_pool2d_with_indices(h, {.kernel = {2, 2}});
        const ls::Tensor y = ls::conv2d(p, x[2], {.padding = {1, 1}});
        const ls::Tensor gy = ls::cast(ls::sigmoid(y), bf);
        const ls::Tensor gp = ls::conv2d_backward_input(gy, x[2], p.shape(), {.padding = {1, 1}});
        const ls::Tensor gh = ls::max_pool2d_backward(gp, i, h.shape(), {.kernel = {2, 2}});
        // Read only by convolutions, pooling, trees and per-channel sums (into f32 and into
        // bf16, of a tree and of a stored value, as a bias's gradient under autocast), h, p, gy
        // and gh are held blocked.
        return Tensors{ls::sum(ls::cast(y, ls::f32), {0, 2, 3}),
                       ls::sum(ls::where(h > 0, gh, 0.0), {0, 2, 3}), ls::sum(gh, {0, 2, 3}),
                       ls::sum(gy, {0, 2, 3}, true)};
      },
      32 * 9 * 4 * 36);
  EXPECT_GT(ls::metrics::counter("blocked_activations"), before)
      << "no activation was blocked: the chain checks nothing new";
}

}  // namespace
}  // namespace conformance
