// lockstep.nn's transposed convolution and upsampling: ConvTranspose2d, Upsample (and
// UpsamplingNearest2d/UpsamplingBilinear2d in nn/__init__.py), functional.conv_transpose2d and
// functional.interpolate, with torch's arguments. Registered by init_nn (nn.cpp).
#include "common.h"

namespace lockstep::python {
namespace {

std::array<int64_t, 2> pair_arg(const py::object& v) {
  if (py::isinstance<py::int_>(v)) return {v.cast<int64_t>(), v.cast<int64_t>()};
  auto s = v.cast<std::vector<int64_t>>();
  if (s.size() != 2)
    throw Error("expected an int or a pair of ints, got " + py::repr(v).cast<std::string>());
  return {s[0], s[1]};
}

// size, scale_factor (an int/float or a sequence of them), mode, align_corners and
// recompute_scale_factor as torch.nn.functional.interpolate takes them.
nn::InterpolateOptions interpolate_options(const py::object& size, const py::object& scale,
                                           const std::string& mode, const py::object& align,
                                           const py::object& recompute) {
  nn::InterpolateOptions o;
  if (!size.is_none())
    o.size = py::isinstance<py::int_>(size) ? std::vector<int64_t>{size.cast<int64_t>()}
                                            : size.cast<std::vector<int64_t>>();
  if (!scale.is_none())
    o.scale_factor = py::isinstance<py::sequence>(scale)
                         ? scale.cast<std::vector<double>>()
                         : std::vector<double>{scale.cast<double>()};
  o.mode = mode;
  if (!align.is_none()) o.align_corners = align.cast<bool>();
  if (!recompute.is_none()) o.recompute_scale_factor = recompute.cast<bool>();
  return o;
}

ConvTranspose2dOptions transposed_options(const py::object& stride, const py::object& padding,
                                          const py::object& output_padding, int64_t groups,
                                          const py::object& dilation) {
  return {pair_arg(stride), pair_arg(padding), pair_arg(output_padding), groups,
          pair_arg(dilation)};
}

}  // namespace

void init_nn_extra(py::module_& nnm, py::module_& F) {
  using py::arg;
  using Layer = py::class_<nn::ConvTranspose2d, nn::Module, std::shared_ptr<nn::ConvTranspose2d>>;
  const auto none = py::none();
  Layer conv(nnm, "ConvTranspose2d");
  conv.def(py::init([](int64_t in, int64_t out, const py::object& k, const py::object& stride,
                       const py::object& padding, const py::object& output_padding, int64_t groups,
                       bool bias, const py::object& dilation) {
             nn::ConvTranspose2dSpec s;
             s.in_channels = in;
             s.out_channels = out;
             s.kernel = pair_arg(k);
             s.stride = pair_arg(stride);
             s.padding = pair_arg(padding);
             s.output_padding = pair_arg(output_padding);
             s.groups = groups;
             s.bias = bias;
             s.dilation = pair_arg(dilation);
             return std::make_shared<nn::ConvTranspose2d>(s);
           }),
           arg("in_channels"), arg("out_channels"), arg("kernel_size"), arg("stride") = 1,
           arg("padding") = 0, arg("output_padding") = 0, arg("groups") = 1, arg("bias") = true,
           arg("dilation") = 1)
      .def(
          "forward",
          [](nn::ConvTranspose2d& m, const Tensor& x, const py::object& output_size) {
            if (output_size.is_none()) return m.forward(x);
            return m.forward(x, output_size.cast<std::vector<int64_t>>());
          },
          arg("input"), arg("output_size") = none);
  conv.def_property(
      "weight", [](const nn::ConvTranspose2d& m) { return m.weight; },
      [](nn::ConvTranspose2d& m, const Tensor& t) { m.set_parameter("weight", t); });
  conv.def_property(
      "bias",
      [](const nn::ConvTranspose2d& m) {
        return m.bias.defined() ? py::cast(m.bias) : py::object(py::none());
      },
      [](nn::ConvTranspose2d& m, const py::object& t) {
        m.set_parameter("bias", t.is_none() ? Tensor() : t.cast<Tensor>());
      });

  py::class_<nn::Upsample, nn::Module, std::shared_ptr<nn::Upsample>>(nnm, "Upsample")
      .def(py::init([](const py::object& size, const py::object& scale, const std::string& mode,
                       const py::object& align, const py::object& recompute) {
             return std::make_shared<nn::Upsample>(
                 interpolate_options(size, scale, mode, align, recompute));
           }),
           arg("size") = none, arg("scale_factor") = none, arg("mode") = "nearest",
           arg("align_corners") = none, arg("recompute_scale_factor") = none);

  F.def(
      "conv_transpose2d",
      [](const Tensor& x, const Tensor& w, const py::object& b, const py::object& stride,
         const py::object& padding, const py::object& output_padding, int64_t groups,
         const py::object& dilation) {
        return conv_transpose2d(
            x, w, b.is_none() ? Tensor() : b.cast<Tensor>(),
            transposed_options(stride, padding, output_padding, groups, dilation));
      },
      arg("input"), arg("weight"), arg("bias") = none, arg("stride") = 1, arg("padding") = 0,
      arg("output_padding") = 0, arg("groups") = 1, arg("dilation") = 1);
  F.def(
      "interpolate",
      [](const Tensor& x, const py::object& size, const py::object& scale, const std::string& mode,
         const py::object& align, const py::object& recompute) {
        return nn::interpolate(x, interpolate_options(size, scale, mode, align, recompute));
      },
      arg("input"), arg("size") = none, arg("scale_factor") = none, arg("mode") = "nearest",
      arg("align_corners") = none, arg("recompute_scale_factor") = none);
}

}  // namespace lockstep::python
