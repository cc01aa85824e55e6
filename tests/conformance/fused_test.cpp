// Conformance of what the cpu backend fuses: deep elementwise expressions with broadcast
// operands, bool masks (comparisons, logical ops, where), shared subexpressions and intermediate
// values that are also outputs, composite ops (softmax, layer norm, clamp), and trees feeding
// reductions and matmuls. Tensors up to > 100k elements, so tiles and threads are exercised.
#include <cmath>
#include <limits>
#include <string>

#include "conformance.h"

namespace conformance {
namespace {

class Fused : public Conformance {};

// A deep expression over x [.., C, H, W]-like shapes with a per-channel, a per-column and a 0-d
// operand; returns the result and some intermediates (so they must be kept in memory too).
Tensors deep_expression(const Tensors& v) {
  const ls::Tensor& x = v[0];
  const ls::Tensor& channel = v[1];
  const ls::Tensor& column = v[2];
  const ls::Tensor& s = v[3];
  ls::Tensor a = x * channel + column;
  ls::Tensor b = ls::tanh(a) - ls::sigmoid(x) * s;
  const ls::Tensor mask = (a > 0.25f) && !(ls::abs(b) < 0.1f);
  ls::Tensor c = ls::where(mask, ls::exp(-ls::square(b)), ls::relu(a - column) / (1.0f + s * s));
  c = ls::maximum(c, ls::minimum(ls::sin(a), ls::cos(b))) * ls::sign(x);
  const ls::Tensor d = ls::sqrt(ls::abs(c) + 1e-3f) + ls::rsqrt(ls::square(a) + 0.5f);
  const ls::Tensor e = ls::pow(ls::abs(d) + 0.1f, ls::clamp(b, -2.0f, 2.0f)) - ls::log(d + 1.0f);
  const ls::DType dt = x.dtype();
  const ls::Tensor f = ls::floor(e * 4.0f) * 0.25f + ls::ceil(ls::neg(e)) * ls::cast(mask, dt);
  const ls::Tensor g = ls::where(ls::isfinite(f / a), f / a, ls::cast(mask || (x == column), dt));
  const ls::Tensor flags = ls::logical_or(ls::logical_and(mask, g >= 0.0f), ls::ne(a, b));
  return {g, c, mask, flags, e * e, ls::cast(ls::cast(g, ls::boolean), dt) + a};
}

LS_COVERS(Fused, DeepExpressions, Op::Where, Op::Expand, Op::Scalar, Op::Pow, Op::IsFinite,
          Op::LogicalAnd, Op::LogicalOr, Op::LogicalNot, Op::Cast, Op::Floor, Op::Ceil, Op::Sign);
TEST_F(Fused, DeepExpressions) {
  const std::vector<ls::Shape> shapes = {{2, 3, 4, 5},   {1, 1, 1, 1},    {3, 5, 0, 7},
                                         {2, 7, 33, 17}, {4, 16, 40, 41}, {1, 3, 129, 257}};
  for (ls::DType dt : {ls::f32, ls::f64})
    for (const ls::Shape& s : shapes) {
      check("deep expression " + str(dt) + " x " + str(s),
            {{s, dt}, {{s[1], 1, 1}, dt}, {{s[3]}, dt}, {{}, dt, Fill::Positive}}, deep_expression);
      check(
          "deep expression of special values " + str(dt),
          {{{2, 3, 4, 5}, dt, Fill::Special}, {{3, 1, 1}, dt}, {{5}, dt, Fill::Special}, {{}, dt}},
          deep_expression);
    }
}

LS_COVERS(Fused, PermutedLeaves, Op::Permute, Op::Reshape, Op::Add, Op::Mul, Op::Div, Op::Conv2d);
TEST_F(Fused, PermutedLeaves) {
  // Permutes keeping the last axis last are read by the trees that consume them, through
  // strides, instead of copied: [T, B, C] <-> [B, T, C], attention's heads, a permute whose
  // shape is its operand's (read beside the operand itself: no update in place), one with two
  // consumers, one that is also an output, and short rows (copied instead).
  for (ls::DType dt : {ls::f32, ls::bf16}) {
    check("[T, B, C] to [B, T, C] " + str(dt), {{{33, 5, 48}, dt}, {{5, 33, 48}, dt}, {{48}, dt}},
          [](const Tensors& v) {
            const ls::Tensor x = ls::permute(v[0], {1, 0, 2});
            return Tensors{(x + v[2]) * v[1], ls::relu(x) - v[1]};
          });
    check("attention heads " + str(dt), {{{64, 6, 128}, dt}, {{128}, dt}}, [](const Tensors& v) {
      const ls::Tensor q = ls::reshape(v[0] + v[1], {64, 6 * 4, 32});  // [T, B * H, D]
      const ls::Tensor heads = ls::permute(q, {1, 0, 2});              // [B * H, T, D]
      return Tensors{heads / 8.0f, ls::permute(ls::exp(heads) * 0.5f, {1, 0, 2})};
    });
    check("permute of its own shape beside its operand " + str(dt), {{{16, 16, 3, 32}, dt}},
          [](const Tensors& v) {
            const ls::Tensor t = ls::permute(v[0], {1, 0, 2, 3});
            return Tensors{v[0] * 2.0f + t, t, ls::permute(v[0] - 1.0f, {2, 1, 0, 3}) * 3.0f};
          });
    check("short rows " + str(dt), {{{40, 30, 4}, dt}, {{30, 40, 4}, dt}}, [](const Tensors& v) {
      return Tensors{ls::permute(v[0], {1, 0, 2}) + v[1]};
    });
  }
  // A convolution's output (held blocked between convolutions) read through a permute: plain.
  ls::Conv2dOptions conv;
  conv.padding = {1, 1};
  check(
      "permuted convolution output", {{{2, 3, 6, 16}}, {{16, 3, 3, 3}}},
      [&](const Tensors& v) {
        const ls::Tensor y = ls::relu(ls::conv2d(v[0], v[1], conv));
        const ls::Tensor z = ls::conv2d(y, ls::ones({16, 16, 1, 1}), {});
        return Tensors{ls::permute(y, {0, 2, 1, 3}) + 1.0f, z * 2.0f};
      },
      27);
}

LS_COVERS(Fused, BroadcastLeaves, Op::Expand, Op::Add, Op::Mul, Op::Where, Op::Gt);
TEST_F(Fused, BroadcastLeaves) {
  // Leaves broadcast along inner, outer and middle dims of a large tensor, bools included.
  const ls::Shape big = {3, 129, 257};
  const std::vector<ls::Shape> leaves = {{},          {257},         {129, 1},   {3, 1, 1},
                                         {3, 1, 257}, {1, 129, 257}, {3, 129, 1}};
  for (const ls::Shape& l : leaves)
    check("broadcast " + str(l) + " into " + str(big), {{big}, {l}, {l, ls::boolean}},
          [](const Tensors& v) {
            const ls::Tensor t = v[0] * v[1] + v[1];
            return Tensors{t, ls::where(v[2], t, v[0]), ls::where(v[2], v[1], v[1] * 2.0f),
                           ls::logical_and(v[2], v[0] > 0.0f)};
          });
  // The same leaf read directly and broadcast in one tree; an expand that is also an output.
  check("one leaf, two layouts", {{{1, 5}}, {{4, 5}}}, [](const Tensors& v) {
    const ls::Tensor e = ls::expand(v[0], {4, 5});
    return Tensors{e, e * v[1] + ls::exp(e), v[0] * 3.0f, ls::sum(v[0]) + ls::sum(e)};
  });
  // Per-channel values over small feature maps (short broadcast runs, read from one expanded
  // period whose length does not divide the tile), in elementwise trees and in the sums and max
  // that read them; the largest runs on several threads.
  for (const ls::Shape& x : {ls::Shape{5, 37, 3, 3}, ls::Shape{7, 19, 2, 2}, ls::Shape{2, 3, 1, 5},
                             ls::Shape{32, 64, 8, 8}}) {
    const ls::Shape c = {x[1], 1, 1};
    check("per-channel leaves over " + str(x), {{x}, {c}, {c}, {c, ls::boolean}},
          [](const Tensors& v) {
            const ls::Tensor t = (v[0] - v[1]) * v[2];
            return Tensors{ls::where(v[3], ls::relu(t), t + v[1]), ls::sum(t * v[0], {0, 2, 3}),
                           ls::sum(t, {0, 2, 3}), ls::max(t + v[2], {1})};
          });
  }
  // Row values over short rows (a softmax's max and sum over [B, H, T, T]'s rows): one period
  // would be the whole tree, so they are read run by run (runs under 16 values inline), in
  // trees and in the sums that read them.
  for (const auto& [x, row] : {std::pair{ls::Shape{64, 4, 32, 32}, ls::Shape{64, 4, 32, 1}},
                               std::pair{ls::Shape{700, 3}, ls::Shape{700, 1}},
                               std::pair{ls::Shape{9, 130, 40}, ls::Shape{9, 130, 1}}})
    check("row values over " + str(x), {{x}, {row}, {row, ls::f32, Fill::Positive}},
          [](const Tensors& v) {
            const ls::Tensor p = ls::exp(v[0] - v[1]) / v[2];
            return Tensors{p, ls::sum(p * v[0], {-1}), ls::max(v[0] * v[2], {-1})};
          });
  // Broadcast of a computed (non-leaf) value, and of a bool comparison result.
  check("broadcast computed values", {{{6, 1, 9}}, {{6, 7, 9}}}, [](const Tensors& v) {
    const ls::Tensor m = ls::exp(v[0]) > 1.0f;
    return Tensors{ls::where(m, v[1], -v[1]), ls::exp(v[0]) + v[1], ls::cast(m, ls::f32) * v[1]};
  });
}

LS_COVERS(Fused, SharedSubexpressions, Op::Add, Op::Mul, Op::Exp, Op::Sub);
TEST_F(Fused, SharedSubexpressions) {
  for (const ls::Shape& s : {ls::Shape{7, 9}, ls::Shape{}, ls::Shape{300, 411}})
    check("shared subexpressions " + str(s), {{s}, {s}}, [](const Tensors& v) {
      const ls::Tensor a = ls::exp(v[0]) + v[1];  // used by three consumers
      const ls::Tensor b = a * a;                 // one consumer, twice
      const ls::Tensor same1 = ls::sin(v[0]) * 2.0f;
      const ls::Tensor same2 = ls::sin(v[0]) * 2.0f;  // CSE merges it with same1
      return Tensors{b - a, a / (b + 1.0f), same1 - same2, same2, ls::sum(a) + ls::sum(b)};
    });
  // Many outputs of one chain, in reverse order of creation. Kept well conditioned (no squaring
  // of a value near its cancellation point): the two sides' tanh differ by a few ulp (libmvec
  // against the scalar libm), which an ill-conditioned chain would amplify past the tolerance.
  check("chain with every value an output", {{{33, 65}}}, [](const Tensors& v) {
    Tensors outs;
    ls::Tensor t = v[0];
    for (int i = 0; i < 12; ++i) {
      t = i % 3 == 0 ? ls::tanh(t) * 1.5f : i % 3 == 1 ? t * 0.75f - 0.5f : ls::relu(t) + t;
      outs.push_back(t);
    }
    return Tensors(outs.rbegin(), outs.rend());
  });
}

LS_COVERS(Fused, LongChainsReuseScratchTiles, Op::Add, Op::Mul, Op::Where, Op::Cast, Op::Exp);
TEST_F(Fused, LongChainsReuseScratchTiles) {
  // A tree keeps a scratch tile per value live at once, not per instruction: long chains over
  // many tiles with more one-value operands (host scalars, 0-d tensors) than keep their tile
  // from tile to tile, values read again far down the chain, and one-value `where`s and
  // widening casts that pass a tile on.
  check("long chain of host scalars", {{{37, 301}}, {{}}}, [](const Tensors& v) {
    ls::Tensor t = v[0];
    for (int i = 0; i < 90; ++i)
      t = i % 3 == 0   ? t * (1.0f + 0.001f * static_cast<float>(i)) + v[1]
          : i % 3 == 1 ? t - 0.01f * static_cast<float>(i)
                       : t * 0.999f;
    return Tensors{t};
  });
  for (ls::DType dt : {ls::f32, ls::bf16})
    check("long chain " + str(dt), {{{37, 301}, dt}, {{}, dt}, {{37, 301}, dt}, {{}, dt}},
          [](const Tensors& v) {
            ls::Tensor t = v[0];
            const ls::Tensor early = ls::exp(v[2]) * 0.25f;  // read again at the end
            for (int i = 0; i < 90; ++i) {
              t = i % 3 == 0   ? t * (1.0f + 0.001f * static_cast<float>(i)) + v[1]
                  : i % 3 == 1 ? t - 0.01f * static_cast<float>(i)
                               : ls::where(v[3] > 0.0f, t, t + early) * 0.999f;
              if (i % 17 == 0) t = (ls::cast(t, ls::f32) + 0.5f).to(v[0].dtype());
            }
            return Tensors{t + early, t * v[3]};
          });
}

LS_COVERS(Fused, ScalarOperands, Op::Add, Op::Sub, Op::Mul, Op::Div, Op::Pow, Op::Maximum,
          Op::Minimum, Op::Lt, Op::Ge, Op::Eq, Op::Ne, Op::LogicalAnd, Op::LogicalOr, Op::Where);
TEST_F(Fused, ScalarOperands) {
  // A one-value operand of a larger tree (0-d, or [1, 1, 1] broadcast) is read once instead of
  // from a tile of copies, on either side of each binary op; a one-value condition picks one side
  // whole, and a multiply (by one value or element by element) that only an add or subtract
  // reads is folded into it, as is a relu of such a sum.
  // Special values on both sides; the large shape runs on several threads, and the where
  // outputs are trees' roots, written to memory from the side they pick.
  const double inf = std::numeric_limits<double>::infinity();
  for (const ls::Shape& s : {ls::Shape{3, 129, 257}, ls::Shape{5, 7}})
    for (const ls::Shape& one : {ls::Shape{}, ls::Shape{1, 1, 1}})
      for (double v : {2.5, -0.0, std::nan(""), inf, -inf, -3.0})
        for (bool cond : {true, false})
          check("scalar operand " + std::to_string(v) + " " + str(one) + " with " + str(s),
                {{s, ls::f32, Fill::Special}, {s, ls::boolean}, {s, ls::f32, Fill::Special}},
                [&](const Tensors& in) {
                  const ls::Tensor& x = in[0];
                  const ls::Tensor c = ls::full(one, v);
                  const ls::Tensor b = ls::full(one, cond ? 1 : 0, ls::boolean);
                  return Tensors{
                      x + c, c - x, x - c, c / x, x / c * x, ls::pow(c, x), ls::pow(x, c),
                      ls::maximum(c, x) + ls::maximum(x, c), ls::minimum(c, x) - ls::minimum(x, c),
                      ls::logical_or(c < x, x >= c), ls::logical_and(x == c, c != x),
                      ls::logical_and(b, in[1]), ls::logical_or(in[1], b),
                      ls::where(b, x * c, c - x), ls::where(b, x, c), ls::where(b, c, ls::exp(x)),
                      // Inside a tree (not its root), a tile and a leaf picked.
                      ls::where(b, x * c, c - x) * x, ls::where(b, x, in[2]) - x,
                      ls::where(in[1], c, x) * c,
                      // Sums of scaled tiles, folded into one pass each.
                      x * c + in[2], c * x - in[2] * c, in[2] - x * c, (x * c + in[2]) * c - x,
                      ls::where(b, x * c - in[2], in[2]), x * in[2] + x, in[2] - x * in[2],
                      x * in[2] - in[2] * c,
                      // Relus of sums, applied by the sum; one read twice is not.
                      ls::relu(x * in[2] + x), ls::relu(in[2] - x * c), ls::relu(x + in[2]) * c,
                      ls::relu(x - in[2]) * (x - in[2]),
                      // Products read twice, or summed with one value: not folded.
                      x * c + ls::exp(x * c), x * c - c};
                });
}

LS_COVERS(Fused, Composites, Op::Sum, Op::Max, Op::Exp, Op::Log, Op::Sub, Op::Div, Op::Rsqrt);
TEST_F(Fused, Composites) {
  for (ls::DType dt : {ls::f32, ls::f64})
    for (const ls::Shape& s : {ls::Shape{4, 10}, ls::Shape{2, 3, 65}, ls::Shape{1031, 131},
                               ls::Shape{3, 1, 7}, ls::Shape{0, 5}}) {
      const double k = static_cast<double>(s.back());
      check(
          "softmax and friends " + str(dt) + " " + str(s), {{s, dt, Fill::Special}},
          [](const Tensors& v) {
            const ls::Tensor x = ls::where(ls::isfinite(v[0]), v[0], ls::zeros_like(v[0]));
            return Tensors{ls::softmax(x, -1), ls::log_softmax(x, 0), ls::logsumexp(x, {-1}),
                           ls::clamp(v[0], -1.5, 2.0)};
          },
          k);
      check(
          "layer norm " + str(dt) + " " + str(s), {{s, dt}, {{s.back()}, dt}},
          [](const Tensors& v) {
            const ls::Tensor mean = ls::mean(v[0], {-1}, true);
            const ls::Tensor var = ls::mean(ls::square(v[0] - mean), {-1}, true);
            return Tensors{(v[0] - mean) * ls::rsqrt(var + 1e-5) * v[1] + v[1]};
          },
          k);
    }
}

// Backward passes whose sums depend on one another: softmax's gradient sums a value divided by
// the forward's sum, so the two sums, over the same layout, must not share one walk (a merge
// that did read the second's input before the first was written).
LS_COVERS(Fused, DependentSumsOfBackwardPasses, Op::Sum, Op::Max, Op::Exp, Op::Div, Op::MatMul);
TEST_F(Fused, DependentSumsOfBackwardPasses) {
  for (const ls::Shape& s : {ls::Shape{1, 1, 6}, ls::Shape{8, 6, 6}, ls::Shape{3, 5, 17},
                             ls::Shape{2, 64, 64}, ls::Shape{6, 1031}})
    check(
        "softmax backward " + str(s), {{s}, {s}, {{s[s.size() - 1], 4}}},
        [](const Tensors& v) {
          ls::Tensor x = v[0].detach().set_requires_grad();
          ls::Tensor w = v[2].detach().set_requires_grad();
          const ls::Tensor e = ls::exp(x - 1.0);
          const ls::Tensor a = ls::sum(e / ls::sum(e, {-1}, true) * v[1]);
          const ls::Tensor b = ls::sum(ls::matmul(ls::softmax(x, -1), w));
          ls::backward(a + b);
          return Tensors{x.grad(), w.grad()};
        },
        static_cast<double>(s.back()));
}

// Reductions over rows and the trees that read them along those rows run as one staged program,
// tile by tile of whole rows (merge_row_steps): a masked softmax forward and backward, a layer
// norm forward and backward (its weight read from a tile of copies), log-softmax, a reduction
// over the last two dims, rows of 16 to 768 (a tile of whole rows, or one row, or rows that leave
// part of a tile), NaN and infinite rows, f32 and bf16 (autocast's f32 softmax of bf16 scores).
// Rows longer than a row tile (FusedTree::kRowTile), and a reduction over other dims of the same
// values, stay separate steps.
LS_COVERS(Fused, RowPrograms, Op::Max, Op::Sum, Op::Exp, Op::Sub, Op::Div, Op::Where, Op::Rsqrt);
TEST_F(Fused, RowPrograms) {
  for (ls::DType dt : {ls::f32, ls::bf16})
    for (const ls::Shape& s : {ls::Shape{6, 16, 16}, ls::Shape{4, 33, 64}, ls::Shape{7, 100},
                               ls::Shape{3, 9, 256}, ls::Shape{5, 512}, ls::Shape{2, 600},
                               ls::Shape{5, 768}, ls::Shape{2, 2100}, ls::Shape{2, 5, 8, 16}}) {
      const int64_t t = s.back();
      check(
          "masked softmax forward and backward " + str(dt) + " " + str(s),
          {{s, dt}, {s, dt}, {{t, t}, ls::f32, Fill::Range, 0, 2}},
          [&](const Tensors& v) {
            ls::Tensor x = ls::cast(v[0], ls::f32).detach().set_requires_grad();
            // A mask of -inf where v[2] is 0 (a whole row of them in some shapes: NaN rows).
            const ls::Tensor mask =
                ls::where(v[2] > 0.5f, ls::zeros({t, t}), ls::full({t, t}, -INFINITY));
            const ls::Tensor scores =
                s.size() >= 2 && s[s.size() - 2] == t ? x * 0.125f + mask : x * 0.125f;
            const ls::Tensor p = ls::softmax(scores, -1);
            ls::backward(ls::sum(ls::cast(p, dt) * v[1]));
            return Tensors{p, x.grad(), ls::log_softmax(x, -1)};
          },
          static_cast<double>(t));
      check(
          "layer norm forward and backward " + str(dt) + " " + str(s),
          {{s, dt}, {{t}, dt}, {s, dt, Fill::NonFinite}},
          [&](const Tensors& v) {
            ls::Tensor x = ls::cast(v[0], ls::f32).detach().set_requires_grad();
            const ls::Tensor mean = ls::mean(x, {-1}, true);
            const ls::Tensor var = ls::mean(ls::square(x - mean), {-1}, true);
            const ls::Tensor y = (x - mean) * ls::rsqrt(var + 1e-5) * ls::cast(v[1], ls::f32);
            ls::backward(ls::sum(y * ls::cast(v[0], ls::f32)));
            const ls::Tensor special = ls::cast(v[2], ls::f32);
            return Tensors{y,
                           x.grad(),
                           special - ls::max(special, {-1}, true),
                           ls::sum(ls::exp(x), {-2, -1}, true),
                           ls::sum(x, {-1}, true),
                           ls::sum(x - ls::min(x, {0}, true), {-1})};
          },
          static_cast<double>(t));
    }
}

LS_COVERS(Fused, TreesAroundHeavyOps, Op::MatMul, Op::Conv2d, Op::MaxPool2d, Op::AvgPool2d,
          Op::Relu, Op::Add);
TEST_F(Fused, TreesAroundHeavyOps) {
  // Linear layer: matmul with a transposed weight, bias, activation, loss-like reduction. Errors
  // of f32 accumulation compound over the three matmuls of a chain: k covers them.
  check(
      "linear layers", {{{17, 33}}, {{65, 33}}, {{65}}, {{9, 65}}},
      [](const Tensors& v) {
        const ls::Tensor h = ls::relu(ls::matmul(v[0], ls::transpose(v[1], 0, 1)) + v[2]);
        const ls::Tensor y = ls::matmul(h, ls::transpose(v[3], 0, 1));
        const ls::Tensor gh = ls::matmul(y, v[3]) * ls::cast(h > 0.0f, ls::f32);
        const ls::Tensor gw = ls::matmul(ls::transpose(gh, 0, 1), v[0]);
        return Tensors{y, gh, gw, ls::sum(gh, {0}), ls::mean(ls::square(y))};
      },
      65 * 9 * 17);
  // Conv block: conv, per-channel batch-norm-like scaling, relu, pools.
  ls::Conv2dOptions conv;
  conv.padding = {1, 1};
  conv.stride = {2, 2};
  ls::Pool2dOptions pool;
  pool.kernel = {3, 3};
  pool.stride = {2, 2};
  pool.padding = {1, 1};
  // 8 channels (plain layout), 16 (one block of the blocked layout: its per-channel sums walk
  // whole tiles of blocks) and 48 (three blocks).
  for (int64_t c : {8, 16, 48}) {
    auto block = [&](const Tensors& v) {
      const ls::Tensor y = ls::conv2d(v[0], v[1], conv);
      const ls::Tensor mean = ls::mean(y, {0, 2, 3}, true);
      const ls::Tensor var = ls::mean(ls::square(y - mean), {0, 2, 3}, true);
      return std::pair{y, ls::relu((y - mean) * ls::rsqrt(var + 1e-5f) * v[2])};
    };
    const std::vector<In> in{{{2, 3, 23, 19}}, {{c, 3, 3, 3}}, {{c, 1, 1}}};
    check(
        "conv block " + std::to_string(c), in,
        [&](const Tensors& v) {
          const ls::Tensor h = block(v).second;
          return Tensors{ls::max_pool2d(h, pool), ls::avg_pool2d(h + 1.0f, pool), h};
        },
        27);
    check(
        "conv block's per-channel sums " + std::to_string(c), in,
        [&](const Tensors& v) {
          const auto [y, h] = block(v);
          return Tensors{ls::sum(h * y, {0, 2, 3}), ls::sum(y, {0, 2, 3})};
        },
        2 * 12 * 10 * 27);
  }
}

}  // namespace
}  // namespace conformance
