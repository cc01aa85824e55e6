// Conformance of the heavy ops: matmul (odd sizes, 1-d operands, broadcast batch dims, empty
// dims, transposed operands the cpu backend reads through strides, transposed results), conv2d
// and both gradients (stride, padding, dilation, groups, strides that do not divide evenly), and
// max/avg pooling forward and backward.
#include <array>
#include <random>
#include <string>

#include "backends/cpu/dnnl_ops.h"
#include "conformance.h"

namespace conformance {
namespace {

class MatMul : public Conformance {};
class Conv : public Conformance {};
class Pool : public Conformance {};

LS_COVERS(MatMul, Shapes, Op::MatMul, Op::Reshape);
TEST_F(MatMul, Shapes) {
  struct Case {
    ls::Shape a, b;
  };
  const std::vector<Case> cases = {{{1, 1}, {1, 1}},
                                   {{3, 7}, {7, 17}},
                                   {{33, 129}, {129, 1}},
                                   {{1, 5}, {5, 9}},
                                   {{7}, {7, 3}},
                                   {{4, 7}, {7}},
                                   {{7}, {7}},
                                   {{3, 0}, {0, 4}},
                                   {{0, 5}, {5, 3}},
                                   {{4, 5}, {5, 0}},
                                   {{2, 3, 4}, {4, 5}},
                                   {{5}, {2, 5, 3}},
                                   {{2, 3, 4, 5}, {1, 3, 5, 6}},
                                   {{5, 1, 4, 3}, {1, 2, 3, 7}},
                                   {{1, 4, 3}, {6, 3, 2}},
                                   {{2, 1, 3, 17, 9}, {4, 1, 9, 5}},
                                   {{256, 300}, {300, 129}},
                                   {{0, 3, 4}, {4, 2}},
                                   // one right-hand matrix for the batch: a single product
                                   {{4, 5, 6}, {1, 6, 7}},
                                   {{3, 4, 5, 6}, {1, 1, 6, 7}},
                                   {{64, 32, 128}, {1, 128, 128}}};
  for (ls::DType dt : {ls::f32, ls::f64, ls::bf16, ls::i32, ls::i64})
    for (const Case& c : cases)
      check1(
          "matmul " + str(dt), {{c.a, dt}, {c.b, dt}},
          [](const Tensors& x) { return ls::matmul(x[0], x[1]); }, static_cast<double>(c.a.back()));
  check1(
      "matmul special", {{{6, 5}, ls::f32, Fill::Special}, {{5, 4}}},
      [](const Tensors& x) { return ls::matmul(x[0], x[1]); }, 5);
}

LS_COVERS(MatMul, TransposedOperands, Op::MatMul, Op::Permute);
TEST_F(MatMul, TransposedOperands) {
  // Operands stored as [k, m], [k, n], [m, k], [n, k]: every combination of transposes.
  for (ls::DType dt : {ls::f32, ls::f64, ls::bf16}) {
    for (const auto& [m, k, n] : std::vector<std::array<int64_t, 3>>{
             {1, 1, 1}, {3, 7, 5}, {17, 33, 1}, {1, 129, 7}, {65, 3, 130}, {200, 300, 100}}) {
      const double kk = static_cast<double>(k);
      check(
          "transposed operands " + str(dt),
          {{{k, m}, dt}, {{k, n}, dt}, {{m, k}, dt}, {{n, k}, dt}},
          [](const Tensors& x) {
            return Tensors{ls::matmul(ls::transpose(x[0], 0, 1), x[1]),
                           ls::matmul(x[2], ls::transpose(x[3], 0, 1)),
                           ls::matmul(ls::transpose(x[0], 0, 1), ls::transpose(x[3], 0, 1)),
                           ls::transpose(ls::matmul(x[2], x[1]), 0, 1),
                           ls::transpose(ls::matmul(ls::transpose(x[0], 0, 1), x[1]), 0, 1)};
          },
          kk);
    }
    // Batched, with broadcast batch dims; the transpose also used elsewhere (so it is kept).
    check(
        "batched transposed operands " + str(dt),
        {{{2, 3, 7, 5}, dt}, {{1, 3, 7, 4}, dt}, {{1, 3, 6, 5}, dt}},
        [](const Tensors& x) {
          const ls::Tensor at = ls::transpose(x[0], -1, -2);  // [2, 3, 5, 7]
          return Tensors{ls::matmul(at, x[1]), at * 2.0,
                         ls::matmul(x[2], ls::transpose(x[2], -1, -2)),
                         ls::transpose(ls::matmul(x[2], at), -1, -2),
                         ls::matmul(ls::transpose(x[1], 2, 3), x[0])};
        },
        7);
  }
  // One right-hand matrix for a batch, read transposed; a left operand that is not contiguous
  // across the batch (a transpose of its last two axes, or a permute of its batch) stays batched.
  check(
      "batch over one matrix", {{{3, 5, 6}}, {{1, 7, 6}}, {{3, 6, 5}}, {{5, 3, 6}}},
      [](const Tensors& x) {
        return Tensors{ls::matmul(x[0], ls::transpose(x[1], -1, -2)),
                       ls::matmul(ls::transpose(x[2], -1, -2), ls::transpose(x[1], -1, -2)),
                       ls::matmul(ls::permute(x[3], {1, 0, 2}), ls::transpose(x[1], -1, -2)),
                       ls::transpose(ls::matmul(x[0], ls::transpose(x[1], -1, -2)), -1, -2)};
      },
      6);
  // A permute that is not a last-two swap, and matmuls of the same transpose twice.
  check(
      "other permutes into matmul", {{{4, 5, 6}}, {{6, 3}}},
      [](const Tensors& x) {
        const ls::Tensor p = ls::permute(x[0], {1, 0, 2});  // [5, 4, 6]
        const ls::Tensor t = ls::transpose(x[1], 0, 1);     // [3, 6]
        return Tensors{ls::matmul(p, x[1]), ls::matmul(t, ls::transpose(t, 0, 1)),
                       ls::matmul(ls::transpose(t, 0, 1), t)};
      },
      6);
  // Attention's layouts: heads split by permutes read in place ([T, N H, d] as [N H, T, d], the
  // keys transposed on top), products written straight into a permuted layout, 4-d batches, a
  // permute that moves the contiguous axis into the batch (copied: no matrix axis contiguous),
  // and a permuted product read by something else too (computed, then permuted).
  for (ls::DType dt : {ls::f32, ls::bf16})
    check(
        "attention layouts " + str(dt),
        {{{7, 6, 5}, dt}, {{7, 6, 5}, dt}, {{2, 7, 3, 5}, dt}, {{5, 6, 7}, dt}},
        [](const Tensors& x) {
          const ls::Tensor q = ls::permute(x[0], {1, 0, 2});  // [6, 7, 5]
          const ls::Tensor k = ls::permute(x[1], {1, 0, 2});
          const ls::Tensor s = ls::matmul(q, ls::transpose(k, -2, -1));   // [6, 7, 7]
          const ls::Tensor o = ls::matmul(s, k);                          // [6, 7, 5]
          const ls::Tensor h = ls::permute(x[2], {0, 2, 1, 3});           // [2, 3, 7, 5]
          const ls::Tensor hh = ls::matmul(h, ls::transpose(h, -1, -2));  // [2, 3, 7, 7]
          const ls::Tensor m = ls::permute(x[3], {2, 1, 0});              // [7, 6, 5]
          const ls::Tensor kept = ls::matmul(q, ls::transpose(q, -1, -2));
          return Tensors{ls::permute(o, {1, 0, 2}),
                         ls::permute(ls::matmul(hh, h), {0, 2, 1, 3}),
                         ls::matmul(m, ls::transpose(x[0], 1, 2)),
                         ls::permute(kept, {1, 0, 2}),
                         kept * 2.0f,
                         s};
        },
        7);
}

struct ConvCase {
  ls::Shape x, w;
  ls::Conv2dOptions o;
};

std::vector<ConvCase> conv_cases() {
  auto opts = [](int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw,
                 int64_t g) {
    ls::Conv2dOptions o;
    o.stride = {sh, sw};
    o.padding = {ph, pw};
    o.dilation = {dh, dw};
    o.groups = g;
    return o;
  };
  return {
      {{1, 1, 1, 1}, {1, 1, 1, 1}, opts(1, 1, 0, 0, 1, 1, 1)},
      {{2, 3, 7, 9}, {4, 3, 3, 3}, opts(1, 1, 1, 1, 1, 1, 1)},
      {{2, 3, 8, 8}, {5, 3, 3, 3}, opts(2, 2, 1, 1, 1, 1, 1)},  // stride does not divide evenly
      {{1, 4, 9, 7}, {6, 2, 3, 2}, opts(2, 3, 0, 1, 1, 1, 2)},
      {{2, 6, 11, 10}, {6, 1, 3, 3}, opts(1, 2, 1, 1, 2, 2, 6)},  // depthwise, dilated
      {{1, 3, 17, 5}, {2, 3, 5, 2}, opts(3, 1, 2, 0, 1, 2, 1)},
      {{2, 4, 6, 6}, {4, 2, 2, 2}, opts(1, 1, 2, 2, 2, 2, 2)},  // padding beyond "same"
      {{1, 2, 8, 8}, {3, 2, 1, 1}, opts(3, 3, 0, 0, 1, 1, 1)},  // 1x1, right padding < 0
      {{3, 6, 5, 5}, {9, 2, 5, 5}, opts(1, 1, 2, 2, 1, 1, 3)},
      {{0, 3, 5, 5}, {2, 3, 3, 3}, opts(1, 1, 0, 0, 1, 1, 1)},       // empty batch
      {{4, 16, 32, 32}, {32, 16, 3, 3}, opts(1, 1, 1, 1, 1, 1, 1)},  // > 100k elements
      {{2, 8, 33, 17}, {8, 4, 7, 7}, opts(2, 2, 3, 3, 1, 1, 2)},
      {{1, 3, 5, 5}, {4, 3, 3, 3}, opts(2, 2, 3, 2, 1, 1, 1)},  // padding beyond the kernel
      {{2, 2, 9, 9}, {2, 1, 3, 3}, opts(4, 4, 0, 0, 1, 1, 2)},  // stride skips input rows
      {{1, 2, 4, 4}, {2, 2, 4, 4}, opts(1, 1, 0, 0, 1, 1, 1)},  // kernel covers the input
  };
}

LS_COVERS(Conv, ForwardAndGradients, Op::Conv2d, Op::Conv2dBackwardInput, Op::Conv2dBackwardWeight);
TEST_F(Conv, ForwardAndGradients) {
  for (ls::DType dt : {ls::f32, ls::f64})
    for (const ConvCase& c : conv_cases()) {
      const std::string name = "x " + str(c.x) + " w " + str(c.w) + " stride " +
                               str({c.o.stride[0], c.o.stride[1]}) + " padding " +
                               str({c.o.padding[0], c.o.padding[1]}) + " dilation " +
                               str({c.o.dilation[0], c.o.dilation[1]}) + " groups " +
                               std::to_string(c.o.groups) + " " + str(dt);
      // The output shape, from a recorded (never computed) conv.
      const ls::Shape y = ls::conv2d(ls::zeros(c.x, {dt, ls::Device{ls::DeviceKind::Ref}}),
                                     ls::zeros(c.w, {dt, ls::Device{ls::DeviceKind::Ref}}), c.o)
                              .shape();
      const double taps = static_cast<double>(c.w[1] * c.w[2] * c.w[3]);
      check1(
          "conv2d " + name, {{c.x, dt}, {c.w, dt}},
          [&](const Tensors& x) { return ls::conv2d(x[0], x[1], c.o); }, taps);
      check1(
          "conv2d_backward_input " + name, {{y, dt}, {c.w, dt}},
          [&](const Tensors& x) { return ls::conv2d_backward_input(x[0], x[1], c.x, c.o); },
          static_cast<double>(c.w[0]) * taps);
      check1(
          "conv2d_backward_weight " + name, {{c.x, dt}, {y, dt}},
          [&](const Tensors& x) { return ls::conv2d_backward_weight(x[0], x[1], c.w, c.o); },
          static_cast<double>(y[0] * y[2] * y[3]));
    }
}

LS_COVERS(Conv, SpecialValues, Op::Conv2d, Op::Conv2dBackwardInput, Op::Conv2dBackwardWeight);
TEST_F(Conv, SpecialValues) {
  // NaN, inf, signed zeros and denormals in the inputs and output gradients (not the weights:
  // see the report on padded taps). No huge finite values: their sums overflow in f32 but not
  // in ref's f64 accumulators.
  for (const ConvCase& c : conv_cases()) {
    if (c.x[0] == 0 || ls::shape_numel(c.x) > 20000) continue;
    const ls::Shape y = ls::conv2d(ls::zeros(c.x, {ls::f32, ls::Device{ls::DeviceKind::Ref}}),
                                   ls::zeros(c.w, {ls::f32, ls::Device{ls::DeviceKind::Ref}}), c.o)
                            .shape();
    check(
        "conv special " + str(c.x) + " " + str(c.w),
        {{c.x, ls::f32, Fill::NonFinite}, {c.w}, {y, ls::f32, Fill::NonFinite}, {y}},
        [&](const Tensors& v) {
          return Tensors{ls::conv2d(v[0], v[1], c.o),
                         ls::conv2d_backward_input(v[2], v[1], c.x, c.o),
                         ls::conv2d_backward_weight(v[0], v[3], c.w, c.o)};
        },
        static_cast<double>(c.w[0] * c.w[1] * c.w[2] * c.w[3] * y[0] * y[2] * y[3]));
  }
}

LS_COVERS(Conv, WinogradMatchesRef, Op::Conv2d, Op::Conv2dBackwardInput, Op::Conv2dBackwardWeight);
TEST_F(Conv, WinogradMatchesRef) {
  // The cpu backend runs big 3x3 stride-1 convolutions as oneDNN's Winograd (small ones direct);
  // forced here, forward and both gradients must still match ref. Shapes no other test uses, so
  // no program compiled with direct convolutions is reused from the cache.
  namespace cpu = lockstep::backends::cpu;
  // oneDNN's Winograd kernels are AVX-512 ones (jit_avx512_core_f32_wino_conv_*); elsewhere, asked
  // for Winograd everywhere, the convolutions run lockstep's own (backends/cpu/winograd.h).
  struct Restore {
    cpu::ConvAlgo was = cpu::conv_algo();
    ~Restore() { cpu::set_conv_algo(was); }
  } restore;
  cpu::set_conv_algo(cpu::ConvAlgo::Winograd);
  const int64_t before = ls::metrics::counter("winograd_convolutions");
  struct Case {
    ls::Shape x, w;
    int64_t pad;
  };
  for (const Case& c :
       {Case{{2, 16, 12, 12}, {16, 16, 3, 3}, 1}, Case{{3, 32, 9, 11}, {24, 32, 3, 3}, 0},
        Case{{1, 16, 21, 19}, {32, 16, 3, 3}, 1}}) {
    ls::Conv2dOptions o;
    o.padding = {c.pad, c.pad};
    const ls::Shape y = ls::conv2d(ls::zeros(c.x, {ls::f32, ls::Device{ls::DeviceKind::Ref}}),
                                   ls::zeros(c.w, {ls::f32, ls::Device{ls::DeviceKind::Ref}}), o)
                            .shape();
    check(
        "winograd " + str(c.x) + " " + str(c.w), {{c.x}, {c.w}, {y}},
        [&](const Tensors& v) {
          return Tensors{ls::conv2d(v[0], v[1], o), ls::conv2d_backward_input(v[2], v[1], c.x, o),
                         ls::conv2d_backward_weight(v[0], v[2], c.w, o)};
        },
        static_cast<double>(c.w[1] * 9 * y[0] * y[2] * y[3]));
  }
  EXPECT_GT(ls::metrics::counter("winograd_convolutions"), before)
      << "no convolution ran as Winograd: the test checks nothing";
}

LS_COVERS(Conv, InNetworks, Op::Conv2d, Op::Conv2dBackwardInput, Op::Conv2dBackwardWeight, Op::Relu,
          Op::Sum);
TEST_F(Conv, InNetworks) {
  // conv -> bias -> relu -> conv, with both gradients, as one graph (shared operands).
  ls::Conv2dOptions o;
  o.padding = {1, 1};
  check(
      "two conv layers", {{{2, 3, 12, 10}}, {{8, 3, 3, 3}}, {{8, 1, 1}}, {{4, 8, 3, 3}}},
      [o](const Tensors& x) {
        const ls::Tensor h = ls::relu(ls::conv2d(x[0], x[1], o) + x[2]);
        const ls::Tensor y = ls::conv2d(h, x[3], o);
        const ls::Tensor gy = y * 0.5f;
        const ls::Tensor gh = ls::conv2d_backward_input(gy, x[3], h.shape(), o);
        const ls::Tensor gw = ls::conv2d_backward_weight(h, gy, x[3].shape(), o);
        const ls::Tensor gx =
            ls::conv2d_backward_input(gh * ls::cast(h > 0, ls::f32), x[1], x[0].shape(), o);
        return Tensors{y, gh, gw, gx, ls::sum(gh, {0, 2, 3})};
      },
      8 * 9 * 4 * 9);
  // Channels in multiples of 16 (oneDNN's blocked layouts): an activation read by two
  // convolutions (a bottleneck and its shortcut), every one with both gradients, so copies in
  // oneDNN's layout are made once and shared (forward input with weight gradient, output
  // gradient between the two backward convolutions).
  const int64_t before = ls::metrics::counter("shared_conv_copies");
  ls::Conv2dOptions one;
  check(
      "shared layout copies",
      {{{2, 16, 8, 8}}, {{32, 16, 3, 3}}, {{32, 16, 1, 1}}, {{16, 32, 1, 1}}},
      [o, one](const Tensors& x) {
        const ls::Tensor a = ls::relu(ls::conv2d(x[0], x[1], o));
        const ls::Tensor s = ls::conv2d(x[0], x[2], one);
        const ls::Tensor h = a + s;
        const ls::Tensor y = ls::conv2d(h, x[3], one);
        const ls::Tensor gy = y * 0.25f;
        const ls::Tensor gh = ls::conv2d_backward_input(gy, x[3], h.shape(), one);
        const ls::Tensor gw3 = ls::conv2d_backward_weight(h, gy, x[3].shape(), one);
        const ls::Tensor ga = gh * ls::cast(a > 0, ls::f32);
        const ls::Tensor gx = ls::conv2d_backward_input(ga, x[1], x[0].shape(), o) +
                              ls::conv2d_backward_input(gh, x[2], x[0].shape(), one);
        return Tensors{y, gx, gw3, ls::conv2d_backward_weight(x[0], ga, x[1].shape(), o),
                       ls::conv2d_backward_weight(x[0], gh, x[2].shape(), one)};
      },
      16 * 9 * 32);
  EXPECT_GT(ls::metrics::counter("shared_conv_copies"), before)
      << "no copy was shared: the case checks nothing new";
}

LS_COVERS(Conv, BlockedActivations, Op::Conv2d, Op::Conv2dBackwardInput, Op::Conv2dBackwardWeight,
          Op::Sum, Op::Expand);
TEST_F(Conv, BlockedActivations) {
  // A bottleneck block with batch norm in training and its shortcut, differentiated by autograd:
  // activations between the convolutions stay in oneDNN's blocked layout, read by elementwise
  // trees (with per-channel leaves), per-channel and per-map sums, and the convolutions'
  // gradients. Maps of 2x2 to 16x16: a block's channels repeat in runs of 64 to 4,096 values,
  // shorter and longer than a tile; the largest case's 128-channel values run on both threads.
  for (const ls::Shape& xs :
       std::vector<ls::Shape>{{2, 32, 6, 5}, {3, 16, 2, 2}, {2, 48, 4, 4}, {4, 64, 16, 16}}) {
    const int64_t c = xs[1];
    const int64_t before = ls::metrics::counter("blocked_activations");
    check(
        "bottleneck " + str(xs),
        {{xs},
         {{c, c, 1, 1}},
         {{c, c, 3, 3}},
         {{2 * c, c, 1, 1}},
         {{2 * c, c, 1, 1}},
         {{c}},
         {{c}},
         {{2 * c, 1, 1}}},
        [](const Tensors& in) {
          Tensors x;
          for (const ls::Tensor& t : in) x.push_back(t.detach().set_requires_grad());
          ls::Conv2dOptions one, three;
          three.padding = {1, 1};
          auto bn = [](const ls::Tensor& v, const ls::Tensor& w, const ls::Tensor& b) {
            return ls::nn::batch_norm(v, ls::Tensor(), ls::Tensor(), w, b, true);
          };
          const ls::Tensor a = ls::relu(bn(ls::conv2d(x[0], x[1], one), x[5], x[6]));
          const ls::Tensor h = ls::relu(ls::conv2d(a, x[2], three) * 0.5f);
          const ls::Tensor y =
              ls::relu(ls::conv2d(h, x[3], one) + x[7] + ls::conv2d(x[0], x[4], one));
          const ls::Tensor pooled = ls::mean(y, {2, 3});
          const ls::Tensor loss = ls::sum(pooled * pooled) + ls::sum(y, {1}).sum();
          ls::backward(loss);
          Tensors out{loss, pooled};
          for (const ls::Tensor& t : x) out.push_back(t.grad());
          return out;
        },
        xs[0] * xs[2] * xs[3] * c * 9);
    EXPECT_GT(ls::metrics::counter("blocked_activations"), before)
        << "no activation was blocked: the case checks nothing new";
  }
}

LS_COVERS(Conv, BlockedLayoutReaders, Op::Conv2d, Op::Conv2dBackwardInput, Op::Conv2dBackwardWeight,
          Op::Sum, Op::Max, Op::Expand, Op::Where);
TEST_F(Conv, BlockedLayoutReaders) {
  // Every kind of reader of a value held in the blocked layout: trees with broadcast leaves of
  // each shape ([C], [1, C, 1, 1], [N, C, 1, 1], [H, W], a scalar) and bool values, sums over
  // each set of axes a blocked walk takes (and one it does not), convolutions in all three
  // directions; and a value that a max reads, which keeps its whole class plain.
  for (const ls::Shape& xs : std::vector<ls::Shape>{
           {2, 16, 5, 7}, {1, 32, 3, 3}, {3, 16, 1, 2}, {2, 16, 1, 1}, {2, 48, 9, 9}}) {
    const int64_t n = xs[0], c = xs[1], h = xs[2], w = xs[3];
    const int64_t before = ls::metrics::counter("blocked_activations");
    check(
        "blocked readers " + str(xs),
        {{xs},
         {{c, c, 1, 1}},
         {{c, c, 3, 3}},
         {{c}},
         {{1, c, 1, 1}},
         {{n, c, 1, 1}},
         {{h, w}},
         {{c, c, 1, 1}}},
        [&](const Tensors& x) {
          ls::Conv2dOptions one, three;
          three.padding = {1, 1};
          const ls::Tensor a = ls::conv2d(x[0], x[1], one);
          const ls::Tensor t = ls::relu(a * x[3].reshape({c, 1, 1}) + x[4]) - x[6] + x[5] * 0.5f;
          const ls::Tensor u = ls::where(t > 0.1f, t, a * 0.5f);
          const ls::Tensor y = ls::conv2d(u, x[2], three);
          const ls::Tensor gu = ls::conv2d_backward_input(y * 0.25f, x[2], u.shape(), three);
          // A second branch whose values a max and a sum over the batch read: plain, next to
          // blocked ones.
          const ls::Tensor p = ls::conv2d(x[0], x[7], one) * 2.0f;
          // A mask of three values that three trees read: stored (blocked too) rather than
          // recomputed in each.
          const ls::Tensor mask = (a + t + u) > 0.0f;
          return Tensors{y,
                         ls::conv2d(ls::where(mask, a, u), x[2], three),
                         ls::sum(ls::where(mask, t, a), {0, 2, 3}),
                         ls::sum(ls::where(mask, u * 2.0f, a), {1}),
                         ls::sum(gu * u, {0, 2, 3}),
                         ls::conv2d_backward_weight(u, ls::relu(y), x[2].shape(), three),
                         ls::sum(u, {0, 2, 3}),
                         ls::sum(u * u, {2, 3}, true),
                         ls::sum(t, {1}),
                         ls::sum(a),
                         ls::sum(u - a, {1, 2, 3}),
                         ls::sum(p, {0}),
                         ls::max(p + 1.0f, {2, 3}),
                         ls::conv2d(p, x[2], three)};
        },
        static_cast<double>(n * c * h * w * 9));
    if (h * w > 1) {
      EXPECT_GT(ls::metrics::counter("blocked_activations"), before)
          << "no activation was blocked: the case checks nothing new";
    }
  }
}

LS_COVERS(Conv, BlockedRandomChains, Op::Conv2d, Op::Conv2dBackwardInput, Op::Sum, Op::Expand,
          Op::Where, Op::Maximum);
TEST_F(Conv, BlockedRandomChains) {
  // Random chains of convolutions, elementwise ops with broadcast operands of every shape, batch-
  // norm-like centring and sums, over 16 or 32 channels: which values end up blocked depends on
  // every reader, so the layout choice meets mixes that hand-written cases do not. Seeded.
  for (uint32_t seed = 1; seed <= 24; ++seed) {
    std::mt19937 rng(seed);
    auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    const int64_t n = uni(1, 3), c = 16 * uni(1, 2), h = uni(1, 7), w = uni(2, 6);
    const int steps = uni(4, 9);
    std::vector<In> inputs{{{n, c, h, w}}};
    // Per step: the kind of op, and its operand's shape when it reads a new input.
    std::vector<int> kinds, picks;
    for (int k = 0; k < steps; ++k) {
      const int kind = uni(0, 7), pick = uni(0, 99);
      kinds.push_back(kind);
      picks.push_back(pick);
      if (kind == 0 || kind == 6) inputs.push_back({{c, c, pick % 2 ? 3 : 1, pick % 2 ? 3 : 1}});
      if (kind == 2) {
        const std::array<ls::Shape, 6> shapes = {ls::Shape{c, 1, 1},    ls::Shape{1, c, 1, 1},
                                                 ls::Shape{n, c, 1, 1}, ls::Shape{h, w},
                                                 ls::Shape{1, 1, 1, w}, ls::Shape{n, 1, h, w}};
        inputs.push_back({shapes[pick % shapes.size()]});
      }
    }
    check(
        "random blocked chain, seed " + std::to_string(seed) + " x " + str({n, c, h, w}), inputs,
        [&](const Tensors& x) {
          std::vector<ls::Tensor> v{x[0]};
          Tensors out;
          size_t next = 1;
          auto conv = [&](const ls::Tensor& a, const ls::Tensor& wt) {
            ls::Conv2dOptions o;
            o.padding = {wt.shape()[2] / 2, wt.shape()[3] / 2};
            return ls::conv2d(a, wt, o);
          };
          for (int k = 0; k < steps; ++k) {
            const ls::Tensor a = v[static_cast<size_t>(picks[k]) % v.size()];
            const ls::Tensor b = v.back();
            switch (kinds[k]) {
              case 0:
                v.push_back(conv(a, x[next++]) * 0.25f);
                break;
              case 1:
                v.push_back(ls::tanh(a) + ls::relu(b));
                break;
              case 2:
                v.push_back(ls::maximum(a, x[next++]) - b * 0.5f);
                break;
              case 3:
                v.push_back(ls::where(a > 0.0f, b, ls::sigmoid(a)));
                break;
              case 4: {  // batch-norm-like: centre per channel
                const ls::Tensor m = ls::mean(a, {0, 2, 3}, true);
                v.push_back(a - m);
                out.push_back(ls::sum((a - m) * (a - m), {0, 2, 3}));
                break;
              }
              case 5:
                out.push_back(ls::sum(
                    a, picks[k] % 2 ? std::vector<int64_t>{1} : std::vector<int64_t>{2, 3}));
                v.push_back(ls::relu(a));
                break;
              case 6: {
                ls::Conv2dOptions o;
                o.padding = {x[next].shape()[2] / 2, x[next].shape()[3] / 2};
                v.push_back(ls::conv2d_backward_input(a, x[next], a.shape(), o) * 0.25f);
                ++next;
                break;
              }
              default:
                if (picks[k] % 3 == 0) out.push_back(a);  // a program output: plain
                v.push_back(ls::sigmoid(a) * b);
            }
          }
          out.push_back(ls::sum(v.back(), {0, 2, 3}));
          out.push_back(ls::sum(v.back() * v.back()));
          return out;
        },
        static_cast<double>(n * c * h * w * 9));
  }
}

struct PoolCase {
  ls::Shape x;
  ls::Pool2dOptions o;
};

std::vector<PoolCase> pool_cases() {
  auto opts = [](int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                 bool include) {
    ls::Pool2dOptions o;
    o.kernel = {kh, kw};
    o.stride = {sh, sw};
    o.padding = {ph, pw};
    o.count_include_pad = include;
    return o;
  };
  return {
      {{1, 1, 1, 1}, opts(1, 1, 1, 1, 0, 0, true)},   {{2, 3, 8, 8}, opts(2, 2, 0, 0, 0, 0, true)},
      {{2, 3, 9, 7}, opts(3, 3, 2, 2, 1, 1, true)},   {{2, 3, 9, 7}, opts(3, 3, 2, 2, 1, 1, false)},
      {{1, 2, 10, 5}, opts(3, 2, 1, 2, 1, 0, false)}, {{3, 1, 5, 11}, opts(2, 3, 2, 1, 0, 1, true)},
      {{1, 4, 7, 7}, opts(7, 7, 1, 1, 3, 3, false)},  {{0, 2, 6, 6}, opts(2, 2, 2, 2, 0, 0, true)},
      {{2, 2, 11, 13}, opts(3, 4, 3, 3, 1, 2, true)},    // a stride other than 1 and 2
      {{4, 16, 44, 44}, opts(3, 3, 2, 2, 1, 1, true)}};  // > 100k elements
}

LS_COVERS(Pool, MaxForwardAndBackward, Op::MaxPool2d, Op::MaxPool2dIndices, Op::MaxPool2dBackward);
TEST_F(Pool, MaxForwardAndBackward) {
  for (ls::DType dt : {ls::f32, ls::f64, ls::i32, ls::i64})
    for (const PoolCase& c : pool_cases())
      for (Fill fill : {Fill::Distinct, Fill::Range, Fill::Special}) {
        if (fill == Fill::Special && !ls::is_floating(dt)) continue;
        In x{c.x, dt, fill, -2, 3};  // Range: many ties (the first index wins)
        const ls::Shape y =
            ls::max_pool2d(ls::zeros(c.x, {dt, ls::Device{ls::DeviceKind::Ref}}), c.o).shape();
        const std::string name = "max pool " + str(dt) + " x " + str(c.x) + " kernel " +
                                 str({c.o.kernel[0], c.o.kernel[1]});
        check(name, {x, {y, ls::is_floating(dt) ? dt : ls::f32}}, [&](const Tensors& v) {
          const auto [values, indices] = ls::max_pool2d_with_indices(v[0], c.o);
          Tensors out = {values, indices, ls::max_pool2d(v[0], c.o)};
          out.push_back(ls::max_pool2d_backward(v[1], indices, c.x, c.o));
          return out;
        });
      }
  // Separate value and index requests of one pooling, and an index out of range.
  check("max pool values only", {{{2, 3, 9, 9}}}, [](const Tensors& x) {
    ls::Pool2dOptions o;
    o.kernel = {3, 3};
    return Tensors{ls::max_pool2d(x[0], o), ls::max_pool2d(ls::exp(x[0]), o)};
  });
  check1("max pool backward out of range",
         {{{1, 1, 2, 2}}, {{1, 1, 2, 2}, ls::i64, Fill::Range, 1, 9}}, [](const Tensors& x) {
           ls::Pool2dOptions o;
           o.kernel = {1, 1};
           return ls::max_pool2d_backward(x[0], x[1], {1, 1, 2, 2}, o);
         });
}

LS_COVERS(Pool, MaxBlocked, Op::MaxPool2d, Op::MaxPool2dIndices, Op::MaxPool2dBackward, Op::Conv2d,
          Op::Conv2dBackwardInput, Op::Floor, Op::Log);
TEST_F(Pool, MaxBlocked) {
  // Max pooling between convolutions, whose values stay in the blocked layout: the pooled
  // values, the indices and the gradient that uses them (explicitly and through autograd), with
  // distinct inputs, many ties (whole numbers: the first index must win) and NaNs (log of
  // negative values: the first NaN must win), for windows with and without padding, strided and
  // not, over maps of odd sizes too.
  auto opts = [](int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
    ls::Pool2dOptions o;
    o.kernel = {kh, kw};
    o.stride = {sh, sw};
    o.padding = {ph, pw};
    return o;
  };
  const std::vector<std::pair<ls::Shape, ls::Pool2dOptions>> cases = {
      {{2, 16, 8, 8}, opts(3, 3, 2, 2, 1, 1)},
      {{1, 32, 7, 9}, opts(2, 2, 2, 2, 0, 0)},
      {{3, 16, 5, 5}, opts(3, 3, 1, 1, 1, 1)},
      {{2, 16, 6, 7}, opts(3, 2, 1, 2, 1, 0)}};
  for (const auto& [xs, o] : cases)
    for (int values = 0; values < 3; ++values) {
      const int64_t c = xs[1];
      const int64_t before = ls::metrics::counter("blocked_max_pooling");
      check(
          "blocked max pool " + str(xs) + " kernel " + str({o.kernel[0], o.kernel[1]}) +
              " values " + std::to_string(values),
          {{xs}, {{c, c, 3, 3}}, {{c, c, 1, 1}}, {{c, c, 3, 3}}},
          [&](const Tensors& in) {
            Tensors x;
            for (const ls::Tensor& t : in) x.push_back(t.detach().set_requires_grad());
            ls::Conv2dOptions same, one;
            same.padding = {1, 1};
            const ls::Tensor a = ls::conv2d(x[0], x[1], same);
            const ls::Tensor t = values == 0   ? ls::relu(a) + a * 0.25f
                                 : values == 1 ? ls::floor(a * 2.0f)
                                               : ls::log(a);
            const auto [v, idx] = ls::max_pool2d_with_indices(t, o);
            // Through autograd: the pooling's gradient goes back to the first convolution.
            const ls::Tensor p = ls::max_pool2d(ls::relu(a) * 2.0f, o);
            const ls::Tensor loss = ls::sum(ls::conv2d(p, x[2], one) * 0.5f);
            ls::backward(loss);
            // The indices used explicitly, with a finite output gradient (non-finite values
            // through convolutions compare poorly: f32 overflows where ref's f64 does not).
            const ls::Tensor gx =
                ls::max_pool2d_backward(ls::conv2d(p.detach(), x[2], one), idx, t.shape(), o);
            const ls::Tensor z = ls::conv2d(gx * 0.5f + a, x[3], same);
            Tensors out{ls::sum(z, {1}), ls::sum(v * v, {0, 2, 3}), loss, x[0].grad(), x[1].grad(),
                        x[2].grad()};
            if (values != 2) out.push_back(ls::sum(ls::conv2d(v, x[2], one), {0, 2, 3}));
            return out;
          },
          static_cast<double>(xs[0] * xs[2] * xs[3] * c * 9));
      EXPECT_GT(ls::metrics::counter("blocked_max_pooling"), before)
          << "no max pooling ran in the blocked layout: the case checks nothing new";
    }
}

LS_COVERS(Pool, AvgForwardAndBackward, Op::AvgPool2d, Op::AvgPool2dBackward);
TEST_F(Pool, AvgForwardAndBackward) {
  for (ls::DType dt : {ls::f32, ls::f64})
    for (const PoolCase& c : pool_cases()) {
      const ls::Shape y =
          ls::avg_pool2d(ls::zeros(c.x, {dt, ls::Device{ls::DeviceKind::Ref}}), c.o).shape();
      const double k = static_cast<double>(c.o.kernel[0] * c.o.kernel[1]);
      check(
          "avg pool " + str(dt) + " x " + str(c.x), {{c.x, dt}, {y, dt}},
          [&](const Tensors& v) {
            return Tensors{ls::avg_pool2d(v[0], c.o), ls::avg_pool2d_backward(v[1], c.x, c.o)};
          },
          k);
    }
}

}  // namespace
}  // namespace conformance
