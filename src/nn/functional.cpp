// Functional forms and losses, composed from primitive ops (so they differentiate through the
// primitives' gradient rules and never reach a backend as themselves).
#include <cmath>
#include <numbers>

#include "lockstep/nn.h"
#include "util/check.h"

namespace lockstep::nn {

using util::cat;

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Loc loc) {
  if (weight.dim() != 2)
    util::fail(loc, "linear", cat("weight must be [out, in], got ", shape_str(weight.shape())),
               "Pass a 2-d weight");
  Tensor y = matmul(x, transpose(weight, 0, 1, loc), loc);
  if (bias.defined()) y = add(y, bias, loc);
  return y;
}

Tensor erf(const Tensor& x, Loc loc) {
  // Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7): erf(x) = sign(x) (1 - poly(t) e^{-x^2}),
  // t = 1 / (1 + p |x|).
  const double p = 0.3275911, a1 = 0.254829592, a2 = -0.284496736, a3 = 1.421413741,
               a4 = -1.453152027, a5 = 1.061405429;
  Tensor ax = abs(x, loc);
  Tensor t = div(1.0, add(mul(ax, p, loc), 1.0, loc), loc);
  Tensor poly = mul(
      t,
      add(mul(t,
              add(mul(t, add(mul(t, add(mul(t, a5, loc), a4, loc), loc), a3, loc), loc), a2, loc),
              loc),
          a1, loc),
      loc);
  Tensor r = sub(1.0, mul(poly, exp(neg(mul(x, x, loc), loc), loc), loc), loc);
  return where(lt(x, 0.0, loc), neg(r, loc), r, loc);
}

Tensor gelu(const Tensor& x, Loc loc) {
  return mul(mul(x, 0.5, loc), add(erf(mul(x, 1.0 / std::numbers::sqrt2, loc), loc), 1.0, loc),
             loc);
}

Tensor dropout(const Tensor& x, double p, bool training, Loc loc) {
  if (p < 0 || p >= 1) util::fail(loc, "dropout", cat("p must be in [0, 1), got ", p), "");
  if (!training || p == 0) return x;
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

Tensor nll_loss(const Tensor& log_probs, const Tensor& targets, const CrossEntropyOptions& o,
                Loc loc) {
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
  check_class_targets("cross_entropy", logits, targets, loc);
  if (o.label_smoothing < 0 || o.label_smoothing > 1)
    util::fail(loc, "cross_entropy",
               cat("label_smoothing must be in [0, 1], got ", o.label_smoothing), "");
  return nll_loss(log_softmax(logits, 1, loc), targets, o, loc);
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction r, Loc loc) {
  Tensor d = sub(input, target, loc);
  return reduce(mul(d, d, loc), r, Tensor(), loc);
}

Tensor binary_cross_entropy_with_logits(const Tensor& x, const Tensor& y, Reduction r, Loc loc) {
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

Tensor accuracy(const Tensor& logits, const Tensor& targets, Loc loc) {
  check_class_targets("accuracy", logits, targets, loc);
  return mean(cast(eq(argmax(logits, {1}, false, loc), targets, loc), DType::F32, loc), {}, false,
              loc);
}

}  // namespace lockstep::nn
