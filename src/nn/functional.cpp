// Functional forms and losses, composed from primitive ops (so they differentiate through the
// primitives' gradient rules and never reach a backend as themselves).
#include <cmath>
#include <initializer_list>
#include <numbers>
#include <vector>

#include "autograd/grad_rules.h"
#include "lockstep/autocast.h"
#include "lockstep/autograd.h"
#include "lockstep/nn.h"
#include "tensor/frontend.h"
#include "util/check.h"
#include "util/frames.h"

namespace lockstep::nn {

using util::cat;

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Loc loc) {
  if (weight.dim() != 2)
    util::fail(loc, "linear", cat("weight must be [out, in], got ", shape_str(weight.shape())),
               "Pass a 2-d weight");
  Tensor y = matmul(x, transpose(weight, 0, 1, loc), loc);
  // Under autocast the bias joins the product's dtype (bf16), as PyTorch's linear.
  if (bias.defined()) y = add(y, cast(bias, y.dtype(), loc), loc);
  return y;
}

namespace {
// A bf16 input normalized with f32 parameters and statistics (autocast's batch norm).
bool mixed_bf16(DType input, DType param) { return input == DType::BF16 && param == DType::F32; }
}  // namespace

Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight, const Tensor& bias, bool training, double momentum,
                  double eps, Loc loc) {
  if (!x.defined() || x.dim() < 2)
    util::fail(loc, "batch_norm",
               cat("input must be [N, C, ...], got ",
                   x.defined() ? shape_str(x.shape()) : std::string("an empty handle")),
               "Pass a batch with the channels on axis 1");
  const int64_t c = x.size(1);
  for (auto [t, what] : {std::pair{&running_mean, "running_mean"},
                         {&running_var, "running_var"},
                         {&weight, "weight"},
                         {&bias, "bias"}})
    if (t->defined() &&
        (t->shape() != Shape{c} || (t->dtype() != x.dtype() && !mixed_bf16(x.dtype(), t->dtype()))))
      util::fail(loc, "batch_norm",
                 cat(what, " is ", dtype_name(t->dtype()), shape_str(t->shape()), " but input ",
                     dtype_name(x.dtype()), shape_str(x.shape()), " has ", c, " channels"),
                 cat("Pass a ", dtype_name(x.dtype()), "[", c, "] ", what));
  // A bf16 input is normalized in f32 (statistics, scale and shift) and the result rounded to
  // bf16 once: activations stay bf16 between convolutions, their statistics do not.
  const bool low = x.dtype() == DType::BF16;
  auto f32 = [&](const Tensor& t) { return low && t.defined() ? cast(t, DType::F32, loc) : t; };
  std::vector<int64_t> axes{0};
  Shape per_channel(x.dim(), 1);
  per_channel[1] = c;
  for (int64_t d = 2; d < x.dim(); ++d) axes.push_back(d);
  auto channel = [&](const Tensor& t) { return reshape(f32(t), per_channel, loc); };
  auto affine = [&](Tensor y) {
    if (weight.defined()) y = mul(y, channel(weight), loc);
    if (bias.defined()) y = add(y, channel(bias), loc);
    return low ? cast(y, DType::BF16, loc) : y;
  };
  if (!training) {
    if (!running_mean.defined() || !running_var.defined())
      util::fail(loc, "batch_norm", "eval mode needs running_mean and running_var",
                 "Pass the running statistics, or training = true");
    return affine(mul(sub(f32(x), channel(running_mean), loc),
                      rsqrt(add(channel(running_var), eps, loc), loc), loc));
  }
  const int64_t n = x.numel() / c;
  if (n <= 1)
    util::fail(
        loc, "batch_norm",
        cat("training needs more than one value per channel, got input ", shape_str(x.shape())),
        "Use a batch of at least 2, or eval mode");
  Tensor xhat, rstd, y;
  {
    NoGrad no_grad;  // the gradient is the formula below; running statistics get none
    const Tensor xf = f32(x);
    const Tensor mean_c = mean(xf, axes, true, loc);
    const Tensor centered = sub(xf, mean_c, loc);
    const Tensor var_c = mean(mul(centered, centered, loc), axes, true, loc);
    rstd = rsqrt(add(var_c, eps, loc), loc);
    xhat = mul(centered, rstd, loc);
    y = affine(xhat);
    Tensor rm = running_mean, rv = running_var;  // handles: copy_ updates the caller's tensors
    if (rm.defined())
      rm.copy_(cast(add(mul(f32(running_mean), 1 - momentum, loc),
                        mul(reshape(mean_c, {c}, loc), momentum, loc), loc),
                    rm.dtype(), loc),
               loc);
    if (rv.defined())
      rv.copy_(cast(add(mul(f32(running_var), 1 - momentum, loc),
                        mul(reshape(var_c, {c}, loc), momentum * n / (n - 1.0), loc), loc),
                    rv.dtype(), loc),
               loc);
  }
  std::vector<Tensor> inputs{x};
  if (weight.defined()) inputs.push_back(weight);
  if (bias.defined()) inputs.push_back(bias);
  const autograd::SavedValue xhat_s(xhat, "batch_norm", loc), rstd_s(rstd, "batch_norm", loc),
      weight_s(weight, "batch_norm", loc);
  const DType x_dtype = x.dtype();
  const DType bias_dtype = bias.defined() ? bias.dtype() : DType::F32;
  const bool has_bias = bias.defined();
  auto grad = [xhat_s, rstd_s, weight_s, has_bias, axes, per_channel, n, c, x_dtype, bias_dtype,
               loc](const Tensor& g_in) {
    // PyTorch's formula: dx = w rstd (g - mean(g) - xhat mean(g xhat)), dw = sum(g xhat),
    // db = sum(g): two reductions and one elementwise pass; in f32 for a bf16 input.
    const Tensor g = cast(g_in, x_dtype == DType::BF16 ? DType::F32 : x_dtype, loc);
    const Tensor xh = xhat_s.get();
    const Tensor db = sum(g, axes, true, loc);
    const Tensor dw = sum(mul(g, xh, loc), axes, true, loc);
    Tensor scale = rstd_s.get();
    if (weight_s.defined())
      scale = mul(scale, reshape(cast(weight_s.get(), scale.dtype(), loc), per_channel, loc), loc);
    const double inv_n = 1.0 / static_cast<double>(n);
    const Tensor dx = mul(
        sub(sub(g, mul(db, inv_n, loc), loc), mul(xh, mul(dw, inv_n, loc), loc), loc), scale, loc);
    std::vector<Tensor> gs{cast(dx, x_dtype, loc)};
    if (weight_s.defined()) gs.push_back(cast(reshape(dw, {c}, loc), weight_s.dtype(), loc));
    if (has_bias) gs.push_back(cast(reshape(db, {c}, loc), bias_dtype, loc));
    return gs;
  };
  return autograd::with_grad_fn(y, inputs, grad, loc);
}

// The primitive (ls::erf), under F.erf's name.
Tensor erf(const Tensor& x, Loc loc) { return lockstep::erf(x, loc); }

namespace {
void check_activation(const Tensor& x, const char* op, const Loc& loc) {
  if (!x.defined())
    util::fail(loc, op, "the input is an empty tensor handle", "Pass a defined tensor");
  if (!is_floating(x.dtype()))
    util::fail(loc, op, cat("needs a floating-point tensor, got ", dtype_name(x.dtype())),
               "Cast it first, e.g. ls::cast(x, ls::f32)");
}

// An activation built from several primitives computes a bf16 input in f32 and rounds its result
// once, as PyTorch's kernels do (in their "opmath" type): rounding after each primitive would
// lose precision at each, and cost a pass over each fused tile. Forward and backward alike: the
// gradient goes through the two casts.
template <typename F>
Tensor in_f32(const Tensor& x, const Loc& loc, F f) {
  if (x.dtype() != DType::BF16) return f(x);
  return cast(f(cast(x, DType::F32, loc)), DType::BF16, loc);
}
}  // namespace

Tensor gelu(const Tensor& x_in, GeluApproximation approximate, Loc loc) {
  check_activation(x_in, "gelu", loc);
  return in_f32(x_in, loc, [&](const Tensor& x) {
    if (approximate == GeluApproximation::Tanh) {
      // 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
      const double k = std::numbers::sqrt2 / std::sqrt(std::numbers::pi);
      const Tensor inner =
          mul(add(x, mul(mul(mul(x, x, loc), x, loc), 0.044715, loc), loc), k, loc);
      return mul(mul(x, 0.5, loc), add(tanh(inner, loc), 1.0, loc), loc);
    }
    return frontend::record(ir::Op::Gelu, {frontend::node(x, "gelu", loc)}, {}, loc);
  });
}

Tensor leaky_relu(const Tensor& x, double negative_slope, Loc loc) {
  check_activation(x, "leaky_relu", loc);
  return where(gt(x, 0, loc), x, mul(x, negative_slope, loc), loc);
}

Tensor elu(const Tensor& x_in, double alpha, Loc loc) {
  check_activation(x_in, "elu", loc);
  return in_f32(x_in, loc, [&](const Tensor& x) {
    // exp of min(x, 0) so the branch not taken stays finite.
    const Tensor neg_part = mul(sub(exp(minimum(x, 0, loc), loc), 1, loc), alpha, loc);
    return where(gt(x, 0, loc), x, neg_part, loc);
  });
}

Tensor silu(const Tensor& x_in, Loc loc) {
  check_activation(x_in, "silu", loc);
  return in_f32(x_in, loc, [&](const Tensor& x) { return mul(x, sigmoid(x, loc), loc); });
}

Tensor softplus(const Tensor& x_in, double beta, double threshold, Loc loc) {
  check_activation(x_in, "softplus", loc);
  return in_f32(x_in, loc, [&](const Tensor& x) {
    const Tensor z = mul(x, beta, loc);
    const Tensor soft = div(log1p(exp(minimum(z, threshold, loc), loc), loc), beta, loc);
    return where(gt(z, threshold, loc), x, soft, loc);
  });
}

Tensor hardswish(const Tensor& x_in, Loc loc) {
  check_activation(x_in, "hardswish", loc);
  return in_f32(x_in, loc, [&](const Tensor& x) {
    return div(mul(x, clamp(add(x, 3, loc), 0, 6, loc), loc), 6, loc);
  });
}

Tensor mish(const Tensor& x_in, Loc loc) {
  check_activation(x_in, "mish", loc);
  return in_f32(x_in, loc, [&](const Tensor& x) {
    return mul(x, tanh(softplus(x, 1.0, 20.0, loc), loc), loc);
  });
}

Tensor log_sigmoid(const Tensor& x_in, Loc loc) {
  check_activation(x_in, "log_sigmoid", loc);
  return in_f32(x_in, loc, [&](const Tensor& x) {
    // min(x, 0) - log1p(exp(-|x|)): no overflow either way (PyTorch's formula).
    return sub(minimum(x, 0, loc), log1p(exp(neg(abs(x, loc), loc), loc), loc), loc);
  });
}

Tensor dropout(const Tensor& x, double p, bool training, Loc loc) {
  if (p < 0 || p >= 1) util::fail(loc, "dropout", cat("p must be in [0, 1), got ", p), "");
  if (!training || p == 0) return clone(x, loc);
  Tensor keep = ge(rand(x.shape(), TensorOptions(x.dtype(), x.device()), loc), p, loc);
  return where(keep, div(x, 1.0 - p, loc), 0.0, loc);
}

namespace {

void check_class_targets(const char* op, const Tensor& scores, const Tensor& targets,
                         const Loc& loc) {
  if (scores.dim() != 2)
    util::fail(loc, op, cat("expected [batch, classes] scores, got ", shape_str(scores.shape())),
               "Flatten the input to 2-d");
  if (targets.dtype() != DType::I64)
    util::fail(loc, op, cat("targets must be i64 class indices, got ", dtype_name(targets.dtype())),
               "Cast them with ls::cast(targets, ls::i64)");
  if (targets.dim() != 1 || targets.size(0) != scores.size(0))
    util::fail(loc, op,
               cat("targets ", shape_str(targets.shape()), " do not match scores ",
                   shape_str(scores.shape())),
               "Pass one class index per row");
}

Tensor reduce(const Tensor& per_row, Reduction r, const Tensor& weight_sum, const Loc& loc) {
  switch (r) {
    case Reduction::None:
      return per_row;
    case Reduction::Sum:
      return sum(per_row, {}, false, loc);
    case Reduction::Mean:
      return weight_sum.defined() ? div(sum(per_row, {}, false, loc), weight_sum, loc)
                                  : mean(per_row, {}, false, loc);
  }
  return per_row;
}

}  // namespace

namespace {
// Autocast computes the losses in f32.
Tensor f32_under_autocast(const Tensor& t, const Loc& loc) {
  const std::optional<DType> low = autocast_dtype();
  return low && t.dtype() == *low ? cast(t, DType::F32, loc) : t;
}
}  // namespace

Tensor nll_loss(const Tensor& log_probs_in, const Tensor& targets, const CrossEntropyOptions& o,
                Loc loc) {
  const util::UserOp user_op("nll_loss");
  const Tensor log_probs = f32_under_autocast(log_probs_in, loc);
  check_class_targets("nll_loss", log_probs, targets, loc);
  // Ignored rows pick class 0 and are masked out; the mean is over the rest.
  Tensor valid = ne(targets, o.ignore_index, loc);
  Tensor safe = where(valid, targets, 0, loc);
  Tensor picked = squeeze(gather(log_probs, 1, unsqueeze(safe, 1, loc), loc), 1, loc);
  Tensor mask = cast(valid, log_probs.dtype(), loc);
  Tensor nll = mul(neg(picked, loc), mask, loc);
  if (o.label_smoothing > 0) {
    const double eps = o.label_smoothing;
    const double classes = static_cast<double>(log_probs.size(1));
    Tensor smooth = mul(neg(sum(log_probs, {1}, false, loc), loc), mask, loc);
    nll = add(mul(nll, 1.0 - eps, loc), mul(smooth, eps / classes, loc), loc);
  }
  return reduce(nll, o.reduction, sum(mask, {}, false, loc), loc);
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, const CrossEntropyOptions& o,
                     Loc loc) {
  const util::UserOp user_op("cross_entropy");
  check_class_targets("cross_entropy", logits, targets, loc);
  if (o.label_smoothing < 0 || o.label_smoothing > 1)
    util::fail(loc, "cross_entropy",
               cat("label_smoothing must be in [0, 1], got ", o.label_smoothing), "");
  return nll_loss(log_softmax(logits, 1, loc), targets, o, loc);
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction r, Loc loc) {
  Tensor d = sub(f32_under_autocast(input, loc), f32_under_autocast(target, loc), loc);
  return reduce(mul(d, d, loc), r, Tensor(), loc);
}

Tensor binary_cross_entropy_with_logits(const Tensor& x_in, const Tensor& y_in, Reduction r,
                                        Loc loc) {
  const Tensor x = f32_under_autocast(x_in, loc), y = f32_under_autocast(y_in, loc);
  if (x.shape() != y.shape())
    util::fail(
        loc, "binary_cross_entropy_with_logits",
        cat("logits ", shape_str(x.shape()), " and targets ", shape_str(y.shape()), " differ"),
        "Pass targets of the logits' shape");
  // max(x, 0) - x y + log(1 + e^{-|x|}): stable for large |x|.
  Tensor l = add(sub(relu(x, loc), mul(x, y, loc), loc),
                 log(add(exp(neg(abs(x, loc), loc), loc), 1.0, loc), loc), loc);
  return reduce(l, r, Tensor(), loc);
}

Tensor binary_cross_entropy(const Tensor& x_in, const Tensor& y_in, const Tensor& weight,
                            Reduction r, Loc loc) {
  const util::UserOp user_op("binary_cross_entropy");
  const Tensor x = f32_under_autocast(x_in, loc), y = f32_under_autocast(y_in, loc);
  if (x.shape() != y.shape())
    util::fail(loc, "binary_cross_entropy",
               cat("input ", shape_str(x.shape()), " and target ", shape_str(y.shape()), " differ"),
               "Pass a target of the input's shape");
  if (!is_floating(x.dtype()) || !is_floating(y.dtype()))
    util::fail(loc, "binary_cross_entropy",
               cat("input and target must be floating, got ", dtype_name(x.dtype()), " and ",
                   dtype_name(y.dtype())),
               "Cast them to a floating dtype");
  // PyTorch clamps each log at -100, so that x = 0 or 1 gives a finite loss. The log reads 1
  // where its argument is 0, so that the clamped side passes a gradient of 0, not 0 / 0.
  auto clamped_log = [&](const Tensor& v) {
    const Tensor positive = gt(v, 0.0, loc);
    return where(positive, clamp_min(log(where(positive, v, 1.0, loc), loc), -100.0, loc), -100.0,
                 loc);
  };
  const Tensor log_x = clamped_log(x);
  const Tensor log_1mx = clamped_log(sub(1.0, x, loc));
  Tensor l = neg(add(mul(y, log_x, loc), mul(sub(1.0, y, loc), log_1mx, loc), loc), loc);
  if (weight.defined()) l = mul(l, f32_under_autocast(weight, loc), loc);
  if (l.shape() != x.shape())
    util::fail(loc, "binary_cross_entropy",
               cat("weight ", shape_str(weight.shape()), " does not broadcast to the input ",
                   shape_str(x.shape())),
               "Pass a weight that broadcasts to the input's shape");
  return reduce(l, r, Tensor(), loc);
}

Tensor accuracy(const Tensor& logits, const Tensor& targets, Loc loc) {
  check_class_targets("accuracy", logits, targets, loc);
  return mean(cast(eq(argmax(logits, {1}, false, loc), targets, loc), DType::F32, loc), {}, false,
              loc);
}

}  // namespace lockstep::nn
