// RMSprop, Adagrad and Adadelta as torch.optim defines them, and Lion as its paper (and
// lion-pytorch) does; recorded in place like SGD and Adam, every state change conditional on `ok`.
#include <cmath>

#include "lockstep/autograd.h"
#include "lockstep/optim.h"
#include "util/check.h"

namespace lockstep::optim {

using util::cat;

namespace {

Tensor state_full(const Tensor& like, double value) {
  NoGrad no_grad;
  return full(like.shape(), value, TensorOptions(like.dtype(), like.device()));
}

void check_finite_nonneg(const char* who, std::initializer_list<std::pair<const char*, double>> v) {
  for (const auto& [name, x] : v)
    if (!(x >= 0) || !std::isfinite(x))
      throw Error(cat(who, ": ", name, " must be finite and >= 0, got ", x));
}

}  // namespace

// ---- RMSprop --------------------------------------------------------------------------------

RMSprop::RMSprop(std::vector<Tensor> params, RMSpropOptions o)
    : Optimizer(std::move(params), o.lr, o.skip_nonfinite), options(o) {
  check_finite_nonneg("RMSprop", {{"alpha", o.alpha},
                                  {"eps", o.eps},
                                  {"weight_decay", o.weight_decay},
                                  {"momentum", o.momentum}});
  set_default_weight_decay(o.weight_decay);
  for (size_t i = 0; i < params_.size(); ++i) add_state(i);
}

void RMSprop::add_state(size_t i) {
  square_avg_.push_back(state_full(params_[i], 0));
  if (options.centered) grad_avg_.push_back(state_full(params_[i], 0));
  if (options.momentum > 0) momentum_.push_back(state_full(params_[i], 0));
}

double RMSprop::momentum() const { return options.momentum; }
void RMSprop::set_momentum(double m) {
  if (momentum_.size() != params_.size() || !(m >= 0) || !std::isfinite(m))
    throw Error(cat("RMSprop: cannot set momentum ", m,
                    ": it must be >= 0, and the optimizer made with momentum > 0"));
  options.momentum = m;
}

void RMSprop::update(size_t i, const Tensor& grad, const Tensor&, const Tensor& ok) {
  Tensor& p = params_[i];
  Tensor g = grad;
  const double wd = weight_decay_of(i), lr = lr_of(i), a = options.alpha;
  if (wd != 0) g = g + wd * p;
  const Tensor sq = square_avg_[i] * a + g * g * (1 - a);
  Tensor avg;
  if (options.centered) {
    const Tensor ga = grad_avg_[i] * a + g * (1 - a);
    avg = sqrt(sq - ga * ga) + options.eps;
    grad_avg_[i].copy_(select(ok, ga, grad_avg_[i]));
  } else {
    avg = sqrt(sq) + options.eps;
  }
  square_avg_[i].copy_(select(ok, sq, square_avg_[i]));
  Tensor fresh;
  if (options.momentum > 0) {
    const Tensor buf = momentum_[i] * options.momentum + g / avg;
    momentum_[i].copy_(select(ok, buf, momentum_[i]));
    fresh = p - buf * lr;
  } else {
    fresh = p - (g / avg) * lr;
  }
  p.copy_(select(ok, fresh, p));
}

nn::NamedTensors RMSprop::state() const {
  nn::NamedTensors out;
  for (size_t i = 0; i < square_avg_.size(); ++i) {
    out.emplace_back(cat(i, ".square_avg"), square_avg_[i]);
    if (options.centered) out.emplace_back(cat(i, ".grad_avg"), grad_avg_[i]);
    if (options.momentum > 0) out.emplace_back(cat(i, ".momentum_buffer"), momentum_[i]);
  }
  return out;
}

// ---- Adagrad --------------------------------------------------------------------------------

Adagrad::Adagrad(std::vector<Tensor> params, AdagradOptions o)
    : Optimizer(std::move(params), o.lr, o.skip_nonfinite), options(o) {
  check_finite_nonneg("Adagrad", {{"lr_decay", o.lr_decay},
                                  {"weight_decay", o.weight_decay},
                                  {"initial_accumulator_value", o.initial_accumulator_value},
                                  {"eps", o.eps}});
  set_default_weight_decay(o.weight_decay);
  for (size_t i = 0; i < params_.size(); ++i) add_state(i);
}

void Adagrad::add_state(size_t i) {
  sum_.push_back(state_full(params_[i], options.initial_accumulator_value));
}

void Adagrad::update(size_t i, const Tensor& grad, const Tensor& t, const Tensor& ok) {
  Tensor& p = params_[i];
  Tensor g = grad;
  const double wd = weight_decay_of(i), lr = lr_of(i);
  if (wd != 0) g = g + wd * p;
  // clr = lr / (1 + (t - 1) lr_decay), t this parameter's update count (a tensor: no recompile).
  const Tensor clr = lr / ((t - 1.0) * options.lr_decay + 1.0);
  const Tensor s = sum_[i] + g * g;
  sum_[i].copy_(select(ok, s, sum_[i]));
  p.copy_(select(ok, p - g / (sqrt(s) + options.eps) * clr, p));
}

nn::NamedTensors Adagrad::state() const {
  nn::NamedTensors out;
  for (size_t i = 0; i < sum_.size(); ++i) out.emplace_back(cat(i, ".sum"), sum_[i]);
  return out;
}

// ---- Adadelta -------------------------------------------------------------------------------

Adadelta::Adadelta(std::vector<Tensor> params, AdadeltaOptions o)
    : Optimizer(std::move(params), o.lr, o.skip_nonfinite), options(o) {
  if (!(o.rho >= 0 && o.rho <= 1)) throw Error(cat("Adadelta: rho must be in [0, 1], got ", o.rho));
  check_finite_nonneg("Adadelta", {{"lr", o.lr}, {"eps", o.eps}, {"weight_decay", o.weight_decay}});
  set_default_weight_decay(o.weight_decay);
  for (size_t i = 0; i < params_.size(); ++i) add_state(i);
}

void Adadelta::add_state(size_t i) {
  square_avg_.push_back(state_full(params_[i], 0));
  acc_delta_.push_back(state_full(params_[i], 0));
}

void Adadelta::update(size_t i, const Tensor& grad, const Tensor&, const Tensor& ok) {
  Tensor& p = params_[i];
  Tensor g = grad;
  const double wd = weight_decay_of(i), lr = lr_of(i), rho = options.rho, eps = options.eps;
  if (wd != 0) g = g + wd * p;
  const Tensor sq = square_avg_[i] * rho + g * g * (1 - rho);
  const Tensor delta = sqrt(acc_delta_[i] + eps) / sqrt(sq + eps) * g;
  const Tensor acc = acc_delta_[i] * rho + delta * delta * (1 - rho);
  square_avg_[i].copy_(select(ok, sq, square_avg_[i]));
  acc_delta_[i].copy_(select(ok, acc, acc_delta_[i]));
  p.copy_(select(ok, p - delta * lr, p));
}

nn::NamedTensors Adadelta::state() const {
  nn::NamedTensors out;
  for (size_t i = 0; i < square_avg_.size(); ++i) {
    out.emplace_back(cat(i, ".square_avg"), square_avg_[i]);
    out.emplace_back(cat(i, ".acc_delta"), acc_delta_[i]);
  }
  return out;
}

// ---- Lion -----------------------------------------------------------------------------------

Lion::Lion(std::vector<Tensor> params, LionOptions o)
    : Optimizer(std::move(params), o.lr, o.skip_nonfinite), options(o) {
  if (!(o.beta1 >= 0 && o.beta1 < 1) || !(o.beta2 >= 0 && o.beta2 < 1))
    throw Error(cat("Lion: betas must be in [0, 1), got ", o.beta1, ", ", o.beta2));
  check_finite_nonneg("Lion", {{"weight_decay", o.weight_decay}});
  set_default_weight_decay(o.weight_decay);
  for (size_t i = 0; i < params_.size(); ++i) add_state(i);
}

void Lion::add_state(size_t i) { m_.push_back(state_full(params_[i], 0)); }

double Lion::momentum() const { return options.beta1; }
void Lion::set_momentum(double b1) {
  if (!(b1 >= 0 && b1 < 1)) throw Error(cat("Lion: beta1 must be in [0, 1), got ", b1));
  options.beta1 = b1;
}

void Lion::update(size_t i, const Tensor& grad, const Tensor&, const Tensor& ok) {
  Tensor& p = params_[i];
  const double wd = weight_decay_of(i), lr = lr_of(i);
  const Tensor base = wd != 0 ? p * (1 - lr * wd) : p;
  const Tensor direction = sign(m_[i] * options.beta1 + grad * (1 - options.beta1));
  const Tensor m = m_[i] * options.beta2 + grad * (1 - options.beta2);
  m_[i].copy_(select(ok, m, m_[i]));
  p.copy_(select(ok, base - direction * lr, p));
}

nn::NamedTensors Lion::state() const {
  nn::NamedTensors out;
  for (size_t i = 0; i < m_.size(); ++i) out.emplace_back(cat(i, ".exp_avg"), m_[i]);
  return out;
}

}  // namespace lockstep::optim
