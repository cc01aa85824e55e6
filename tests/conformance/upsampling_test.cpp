// Conformance of the composites of transposed convolution and upsampling: conv_transpose2d
// (stride, padding, output padding, groups, dilation) and interpolate (nearest, bilinear,
// bicubic) with the gradients backward() records for them, cpu against ref.
#include <string>

#include "conformance.h"

namespace conformance {
namespace {

class ConvTranspose : public Conformance {};
class Interpolate : public Conformance {};

struct TransposedCase {
  ls::Shape x, w;
  ls::ConvTranspose2dOptions o;
};

LS_COVERS(ConvTranspose, ForwardAndGradients, Op::Conv2dBackwardInput, Op::Conv2d,
          Op::Conv2dBackwardWeight);
TEST_F(ConvTranspose, ForwardAndGradients) {
  const std::vector<TransposedCase> cases = {
      {{2, 3, 5, 6}, {3, 4, 3, 3}, {}},
      {{2, 4, 5, 4}, {4, 3, 3, 3}, {{2, 2}, {1, 1}, {1, 1}, 1, {1, 1}}},
      {{1, 4, 4, 5}, {4, 3, 3, 2}, {{2, 3}, {1, 0}, {1, 2}, 2, {1, 1}}},
      {{2, 2, 6, 5}, {2, 2, 3, 3}, {{1, 1}, {1, 1}, {0, 0}, 2, {2, 2}}},
      {{1, 3, 5, 5},
       {3, 2, 3, 3},
       {{1, 1}, {2, 2}, {1, 1}, 1, {2, 2}}},  // output_padding >= stride
      {{2, 16, 4, 4}, {16, 1, 4, 4}, {{2, 2}, {1, 1}, {0, 0}, 16, {1, 1}}},
      {{2, 32, 4, 4}, {32, 16, 4, 4}, {{2, 2}, {1, 1}, {0, 0}, 1, {1, 1}}},
  };
  for (ls::DType dt : {ls::f32, ls::f64})
    for (const TransposedCase& c : cases) {
      const double taps = static_cast<double>(c.w[0] * c.w[2] * c.w[3]);
      check(
          "conv_transpose2d x " + str(c.x) + " w " + str(c.w) + " " + str(dt),
          {{c.x, dt}, {c.w, dt}, {{c.w[1] * c.o.groups}, dt}},
          [&](const Tensors& in) {
            const ls::Tensor x = in[0].detach().set_requires_grad();
            const ls::Tensor w = in[1].detach().set_requires_grad();
            const ls::Tensor b = in[2].detach().set_requires_grad();
            const ls::Tensor y = ls::conv_transpose2d(x, w, b, c.o);
            ls::backward(ls::sum(y * y * 0.5));
            return Tensors{y, x.grad(), w.grad(), b.grad()};
          },
          taps * taps * 4);
    }
}

LS_COVERS(Interpolate, ModesAndGradients, Op::Gather, Op::MatMul);
TEST_F(Interpolate, ModesAndGradients) {
  struct Case {
    std::string mode;
    std::optional<bool> align_corners;
    std::vector<int64_t> size;
    std::vector<double> scale;
  };
  const std::vector<Case> cases = {
      {"nearest", {}, {}, {2}},         {"nearest", {}, {7, 3}, {}},
      {"nearest", {}, {}, {0.6, 1.7}},  {"nearest-exact", {}, {}, {1.5}},
      {"bilinear", false, {}, {2}},     {"bilinear", true, {9, 4}, {}},
      {"bilinear", {}, {}, {0.5, 1.3}}, {"bicubic", false, {}, {2.5}},
      {"bicubic", true, {3, 11}, {}},
  };
  for (ls::DType dt : {ls::f32, ls::f64})
    for (const Case& c : cases) {
      ls::nn::InterpolateOptions o;
      o.mode = c.mode;
      o.align_corners = c.align_corners;
      o.size = c.size;
      o.scale_factor = c.scale;
      check(
          "interpolate " + c.mode + " " + str(dt), {{{2, 3, 6, 5}, dt}},
          [&](const Tensors& in) {
            const ls::Tensor x = in[0].detach().set_requires_grad();
            const ls::Tensor y = ls::nn::interpolate(x, o);
            ls::backward(ls::sum(y * y * 0.5));
            return Tensors{y, x.grad()};
          },
          64);
    }
}

}  // namespace
}  // namespace conformance
