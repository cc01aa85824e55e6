// Transposed convolution (torch.nn.functional.conv_transpose2d, torch.nn.ConvTranspose2d) as a
// composite: its forward is conv2d's input gradient, so both backends and the gradient rules
// serve it as they serve conv2d. Not a primitive and not a lowering.
#include <algorithm>
#include <cmath>

#include "lockstep/autograd.h"
#include "lockstep/nn.h"
#include "util/check.h"

namespace lockstep {

using util::cat;

namespace {

// The output's extent along one axis, before output_padding.
int64_t transposed_extent(int64_t in, int64_t kernel, int64_t stride, int64_t padding,
                          int64_t dilation) {
  return (in - 1) * stride - 2 * padding + dilation * (kernel - 1) + 1;
}

}  // namespace

Tensor conv_transpose2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
                        const ConvTranspose2dOptions& o, Loc loc) {
  const char* op = "conv_transpose2d";
  if (x.dim() != 4 || weight.dim() != 4)
    util::fail(loc, op,
               cat("input ", shape_str(x.shape()), " and weight ", shape_str(weight.shape()),
                   " must both have rank 4"),
               "Use input [N, C, H, W] and weight [C, out_channels / groups, kh, kw]");
  if (o.groups <= 0 || weight.size(0) != x.size(1) || x.size(1) % o.groups != 0)
    util::fail(loc, op,
               cat("input ", shape_str(x.shape()), " has ", x.size(1), " channels; weight ",
                   shape_str(weight.shape()), " expects ", weight.size(0), " and groups=", o.groups,
                   " must divide them"),
               "Make weight.size(0) == input channels, divisible by groups");
  Shape out{x.size(0), weight.size(1) * o.groups, 0, 0};
  bool padding_below_stride = true;
  for (int d = 0; d < 2; ++d) {
    const int64_t s = o.stride[d], p = o.padding[d], dl = o.dilation[d], op_ = o.output_padding[d];
    if (s <= 0 || dl <= 0 || p < 0 || op_ < 0)
      util::fail(loc, op,
                 cat("bad stride/padding/dilation/output_padding ", s, "/", p, "/", dl, "/", op_),
                 "Strides and dilations must be >= 1, paddings >= 0");
    if (op_ >= s && op_ >= dl)
      util::fail(loc, op,
                 cat("output padding ", op_, " must be smaller than either stride ", s,
                     " or dilation ", dl),
                 "Lower output_padding");
    out[2 + d] = transposed_extent(x.size(2 + d), weight.size(2 + d), s, p, dl) + op_;
    if (out[2 + d] <= 0)
      util::fail(loc, op,
                 cat("output size along axis ", 2 + d, " would be ", out[2 + d], " for input ",
                     shape_str(x.shape())),
                 "Use less padding or a larger input");
    padding_below_stride = padding_below_stride && op_ < s;
  }
  const Conv2dOptions co{o.stride, o.padding, o.dilation, o.groups};
  Tensor y;
  if (padding_below_stride) {
    // Any output of these sizes is the input of a conv2d whose output has x's size.
    y = conv2d_backward_input(x, weight, out, co, loc);
  } else {
    // output_padding >= stride (a dilation above the stride allows it): that conv2d's output
    // would be larger than x. Compute the whole unpadded output, then take PyTorch's window:
    // rows [padding, padding + size), zeros beyond the unpadded output.
    const Conv2dOptions full{o.stride, {0, 0}, o.dilation, o.groups};
    Shape whole = out;
    for (int d = 0; d < 2; ++d)
      whole[2 + d] =
          transposed_extent(x.size(2 + d), weight.size(2 + d), o.stride[d], 0, o.dilation[d]);
    y = conv2d_backward_input(x, weight, whole, full, loc);
    for (int d = 0; d < 2; ++d) {
      const int64_t start = o.padding[d], end = start + out[2 + d];
      y = slice(y, 2 + d, start, std::min(end, whole[2 + d]), 1, loc);
      if (end > whole[2 + d]) {
        std::vector<std::pair<int64_t, int64_t>> pads(4, {0, 0});
        pads[2 + d] = {0, end - whole[2 + d]};
        y = pad(y, pads, 0, loc);
      }
    }
  }
  // Under autocast the bias joins the convolution's dtype (bf16), as conv2d's.
  if (bias.defined()) y = add(y, cast(reshape(bias, {1, out[1], 1, 1}, loc), y.dtype(), loc), loc);
  return y;
}

namespace nn {

namespace {

// U(-bound, bound): kaiming_uniform_(a=sqrt(5)) and PyTorch's bias init.
Tensor uniform(const Shape& shape, double bound) {
  NoGrad no_grad;
  return rand(shape) * (2 * bound) - bound;
}

}  // namespace

ConvTranspose2d::ConvTranspose2d(const ConvTranspose2dSpec& s) : spec(s) {
  if (s.in_channels <= 0 || s.out_channels <= 0 || s.groups <= 0 || s.in_channels % s.groups != 0 ||
      s.out_channels % s.groups != 0)
    throw Error(cat("ConvTranspose2d: channels in=", s.in_channels, " out=", s.out_channels,
                    " must be positive and divisible by groups=", s.groups));
  // PyTorch's fan_in of a [in, out / groups, kh, kw] weight is its dim 1 times the kernel.
  const int64_t fan_in = s.out_channels / s.groups * s.kernel[0] * s.kernel[1];
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  weight = register_parameter(
      "weight",
      uniform({s.in_channels, s.out_channels / s.groups, s.kernel[0], s.kernel[1]}, bound));
  if (s.bias) bias = register_parameter("bias", uniform({s.out_channels}, bound));
}

Tensor ConvTranspose2d::forward(const Tensor& x) {
  return conv_transpose2d(
      x, weight, bias,
      {spec.stride, spec.padding, spec.output_padding, spec.groups, spec.dilation});
}

Tensor ConvTranspose2d::forward(const Tensor& x, const std::vector<int64_t>& output_size) {
  const Loc loc = Loc::current();
  if (x.dim() != 4)
    util::fail(loc, "ConvTranspose2d",
               cat("input must be [N, C, H, W], got ", shape_str(x.shape())), "");
  if (output_size.size() != 2 && output_size.size() != 4)
    util::fail(loc, "ConvTranspose2d",
               cat("output_size must have 2 or 4 elements, got ", output_size.size()), "");
  const size_t first = output_size.size() - 2;
  std::array<int64_t, 2> output_padding{};
  for (int d = 0; d < 2; ++d) {
    // PyTorch's _output_padding: any size from the smallest output up to stride - 1 more.
    const int64_t smallest = transposed_extent(x.size(2 + d), spec.kernel[d], spec.stride[d],
                                               spec.padding[d], spec.dilation[d]);
    const int64_t want = output_size[first + d];
    if (want < smallest || want > smallest + spec.stride[d] - 1)
      util::fail(
          loc, "ConvTranspose2d",
          cat("requested an output size of ", want, " along axis ", 2 + d,
              ", but valid sizes range from ", smallest, " to ", smallest + spec.stride[d] - 1,
              " (for an input of ", shape_str(x.shape()), ")"),
          "");
    output_padding[d] = want - smallest;
  }
  return conv_transpose2d(x, weight, bias,
                          {spec.stride, spec.padding, output_padding, spec.groups, spec.dilation});
}

Tensor* ConvTranspose2d::tensor_member(const std::string& name) {
  return name == "weight" ? &weight : name == "bias" ? &bias : nullptr;
}

}  // namespace nn

}  // namespace lockstep
