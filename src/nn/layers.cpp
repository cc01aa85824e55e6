// Layers with PyTorch's default initialisation (same distributions, so results are
// comparable) and PyTorch's parameter names.
#include <cmath>

#include "lockstep/autograd.h"
#include "lockstep/nn.h"
#include "util/check.h"
#include "util/frames.h"

namespace lockstep::nn {

using util::cat;

namespace {

// U(-bound, bound): what kaiming_uniform_(a=sqrt(5)) and PyTorch's bias init reduce to.
Tensor uniform(const Shape& shape, double bound) {
  NoGrad no_grad;
  return rand(shape) * (2 * bound) - bound;
}

}  // namespace

Linear::Linear(int64_t in_features, int64_t out_features, bool has_bias) {
  if (in_features <= 0 || out_features <= 0)
    throw Error(cat("Linear: sizes must be positive, got in=", in_features, " out=", out_features));
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
  weight = register_parameter("weight", uniform({out_features, in_features}, bound));
  if (has_bias) bias = register_parameter("bias", uniform({out_features}, bound));
}

Tensor Linear::forward(const Tensor& x) { return linear(x, weight, bias); }

Conv2d::Conv2d(const Conv2dSpec& s) : spec(s) {
  if (s.in_channels <= 0 || s.out_channels <= 0 || s.groups <= 0 || s.in_channels % s.groups != 0 ||
      s.out_channels % s.groups != 0)
    throw Error(cat("Conv2d: channels in=", s.in_channels, " out=", s.out_channels,
                    " must be positive and divisible by groups=", s.groups));
  const int64_t fan_in = s.in_channels / s.groups * s.kernel[0] * s.kernel[1];
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  weight = register_parameter(
      "weight",
      uniform({s.out_channels, s.in_channels / s.groups, s.kernel[0], s.kernel[1]}, bound));
  if (s.bias) bias = register_parameter("bias", uniform({s.out_channels}, bound));
}

Tensor Conv2d::forward(const Tensor& x) {
  Tensor y = conv2d(x, weight, {spec.stride, spec.padding, spec.dilation, spec.groups});
  // Under autocast the bias joins the convolution's dtype (bf16), as PyTorch's conv2d.
  if (bias.defined()) y = y + cast(reshape(bias, {1, spec.out_channels, 1, 1}), y.dtype());
  return y;
}

BatchNorm::BatchNorm(int64_t n, double e, double m, bool affine)
    : num_features(n), eps(e), momentum(m) {
  if (n <= 0) throw Error(cat("BatchNorm: num_features must be positive, got ", n));
  if (affine) {
    weight = register_parameter("weight", ones({n}));
    bias = register_parameter("bias", zeros({n}));
  }
  running_mean = register_buffer("running_mean", zeros({n}));
  running_var = register_buffer("running_var", ones({n}));
  num_batches_tracked = register_buffer("num_batches_tracked", zeros({}, DType::I64));
}

Tensor BatchNorm::forward(const Tensor& x) {
  const Loc loc = Loc::current();
  // The messages name the caller's line and this module (util::fail, util/frames.h).
  if (x.dim() != 2 && x.dim() != 4)
    util::fail(loc, "BatchNorm",
               cat("input must be [N, C] or [N, C, H, W], got ", shape_str(x.shape())), "");
  if (x.size(1) != num_features)
    util::fail(loc, "BatchNorm",
               cat("input ", shape_str(x.shape()), " has ", x.size(1),
                   " channels, the layer expects ", num_features),
               "Give the layer as many features as the input has channels");
  Tensor y =
      batch_norm(x, running_mean, running_var, weight, bias, is_training(), momentum, eps, loc);
  if (is_training()) {
    NoGrad no_grad;
    num_batches_tracked += 1;
  }
  return y;
}

LayerNorm::LayerNorm(Shape shape, double e, bool affine, bool has_bias)
    : normalized_shape(std::move(shape)), eps(e) {
  if (affine) {
    weight = register_parameter("weight", ones(normalized_shape));
    if (has_bias) bias = register_parameter("bias", zeros(normalized_shape));
  }
}

Tensor LayerNorm::forward(const Tensor& x) {
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  const Shape& xs = x.shape();
  if (x.dim() < k || !std::equal(normalized_shape.begin(), normalized_shape.end(), xs.end() - k))
    util::fail(Loc::current(), "LayerNorm",
               cat("input ", shape_str(xs), " does not end with the normalized shape ",
                   shape_str(normalized_shape)),
               "");
  std::vector<int64_t> axes;
  for (int64_t d = x.dim() - k; d < x.dim(); ++d) axes.push_back(d);
  Tensor mu = mean(x, axes, true);
  Tensor c = x - mu;
  Tensor y = c * rsqrt(mean(c * c, axes, true) + eps);
  if (weight.defined()) y = y * weight;
  if (bias.defined()) y = y + bias;
  return y;
}

Embedding::Embedding(int64_t num, int64_t dim, std::optional<int64_t> pad) {
  if (num <= 0 || dim <= 0)
    throw Error(cat("Embedding: sizes must be positive, got ", num, "x", dim));
  if (pad && (*pad < -num || *pad >= num))
    throw Error(cat("Embedding: padding_idx ", *pad, " is out of range for ", num,
                    " embeddings; pass one in [", -num, ", ", num - 1, "]"));
  if (pad) padding_idx = *pad < 0 ? *pad + num : *pad;
  NoGrad no_grad;
  Tensor w = randn({num, dim});
  if (padding_idx) w = where(ne(reshape(arange(num, DType::I64), {num, 1}), *padding_idx), w, 0.0);
  weight = register_parameter("weight", w);
}

Tensor Embedding::forward(const Tensor& indices) {
  const util::UserOp user_op("Embedding");
  if (indices.dtype() != DType::I64)
    util::fail(Loc::current(), "Embedding",
               cat("indices must be i64, got ", dtype_name(indices.dtype())),
               "Convert them with .to(ls::i64)");
  const int64_t dim = weight.size(1);
  Tensor flat = reshape(indices, {-1, 1});
  Tensor rows = gather(weight, 0, expand(flat, {flat.size(0), dim}));
  // The padding row's lookups pass its value and no gradient: a where over the gathered rows,
  // inside the graph (no read of the indices).
  if (padding_idx) rows = where(ne(flat, *padding_idx), rows, rows.detach());
  Shape out = indices.shape();
  out.push_back(dim);
  return reshape(rows, out);
}

Dropout::Dropout(double prob) : p(prob) {
  if (p < 0 || p >= 1) throw Error(cat("Dropout: p must be in [0, 1), got ", p));
}
Tensor Dropout::forward(const Tensor& x) { return dropout(x, p, is_training()); }

Tensor ReLU::forward(const Tensor& x) { return relu(x); }
Tensor GELU::forward(const Tensor& x) { return gelu(x, approximate); }
Tensor LeakyReLU::forward(const Tensor& x) { return leaky_relu(x, negative_slope); }
Tensor ELU::forward(const Tensor& x) { return elu(x, alpha); }
Tensor Softplus::forward(const Tensor& x) { return softplus(x, beta, threshold); }
Tensor SiLU::forward(const Tensor& x) { return silu(x); }
Tensor Hardswish::forward(const Tensor& x) { return hardswish(x); }
Tensor Mish::forward(const Tensor& x) { return mish(x); }
Tensor LogSigmoid::forward(const Tensor& x) { return log_sigmoid(x); }
Tensor Identity::forward(const Tensor& x) { return clone(x); }
Tensor Sigmoid::forward(const Tensor& x) { return sigmoid(x); }
Tensor Tanh::forward(const Tensor& x) { return tanh(x); }

Flatten::Flatten(int64_t s, int64_t e) : start_axis(s), end_axis(e) {}
Tensor Flatten::forward(const Tensor& x) { return flatten(x, start_axis, end_axis); }

MaxPool2d::MaxPool2d(Pool2dOptions o) : options(o) {}
Tensor MaxPool2d::forward(const Tensor& x) { return max_pool2d(x, options); }
AvgPool2d::AvgPool2d(Pool2dOptions o) : options(o) {}
Tensor AvgPool2d::forward(const Tensor& x) { return avg_pool2d(x, options); }

AdaptiveAvgPool2d::AdaptiveAvgPool2d(std::array<int64_t, 2> size) : output_size(size) {
  if (size[0] <= 0 || size[1] <= 0)
    throw Error(
        cat("AdaptiveAvgPool2d: output size must be positive, got ", size[0], "x", size[1]));
}

namespace {
// [o, n]: row i averages PyTorch's window [floor(i*n/o), ceil((i+1)*n/o)) of an axis of n,
// computed on x's device from iotas (nothing of size o * n on the host).
Tensor window_weights(int64_t n, int64_t o, const Tensor& x) {
  const TensorOptions i64(DType::I64, x.device());
  const Tensor i = reshape(arange(o, i64), {o, 1});
  const Tensor h = arange(n, i64);
  const Tensor start = floor_divide(mul(i, n), o);
  const Tensor end = floor_divide(add(mul(i, n), n + o - 1), o);
  const DType t = x.dtype() == DType::F64 ? DType::F64 : DType::F32;
  const Tensor weight = div(1.0, cast(sub(end, start), t));
  return cast(where(ge(h, start), where(lt(h, end), weight, 0.0), 0.0), x.dtype());
}
}  // namespace

Tensor AdaptiveAvgPool2d::forward(const Tensor& x) {
  if (x.dim() != 4)
    util::fail(Loc::current(), "AdaptiveAvgPool2d",
               cat("input must be [N, C, H, W], got ", shape_str(x.shape())), "");
  const int64_t H = x.size(2), W = x.size(3), oh = output_size[0], ow = output_size[1];
  if (oh == 1 && ow == 1) return mean(x, {2, 3}, true);
  if (H % oh == 0 && W % ow == 0) {
    Pool2dOptions o;
    o.kernel = {H / oh, W / ow};
    o.stride = o.kernel;
    return avg_pool2d(x, o);
  }
  // Each axis' windows as a matrix of weights, so the ops recorded do not grow with the output
  // size: Y = A_h X A_w^T.
  return matmul(matmul(window_weights(H, oh, x), x), transpose(window_weights(W, ow, x), 0, 1));
}

// The members the layers compute with, by registered name (Module::set_parameter).
Tensor* Linear::tensor_member(const std::string& name) {
  return name == "weight" ? &weight : name == "bias" ? &bias : nullptr;
}
Tensor* Conv2d::tensor_member(const std::string& name) {
  return name == "weight" ? &weight : name == "bias" ? &bias : nullptr;
}
Tensor* BatchNorm::tensor_member(const std::string& name) {
  if (name == "weight") return &weight;
  if (name == "bias") return &bias;
  if (name == "running_mean") return &running_mean;
  if (name == "running_var") return &running_var;
  return name == "num_batches_tracked" ? &num_batches_tracked : nullptr;
}
Tensor* LayerNorm::tensor_member(const std::string& name) {
  return name == "weight" ? &weight : name == "bias" ? &bias : nullptr;
}
Tensor* Embedding::tensor_member(const std::string& name) {
  return name == "weight" ? &weight : nullptr;
}

}  // namespace lockstep::nn
