// SGD, Adam and AdamW as PyTorch defines them, recorded in place; gradient clipping; the
// in-graph skip of non-finite updates. All state (buffers, the step count) lives in tensors, so
// a step's rollback restores it and the first step records the same program as the next ones.
#include <cmath>

#include "lockstep/autograd.h"
#include "lockstep/optim.h"
#include "lockstep/runtime.h"
#include "nn/state_match.h"
#include "optim/clip.h"
#include "runtime/lazy.h"
#include "runtime/metrics.h"
#include "util/check.h"

namespace lockstep::optim {

using util::cat;

namespace {

thread_local int t_no_params_allowed = 0;  // detail::NoParamsAllowed's alive on this thread

void check_params(const std::vector<Tensor>& params, const char* who) {
  if (params.empty() && t_no_params_allowed == 0)
    throw Error(cat(who, ": no parameters to optimize"));
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].defined()) throw Error(cat(who, ": parameter ", i, " is an empty tensor"));
    if (!is_floating(params[i].dtype()))
      throw Error(cat(who, ": parameter ", i, " is ", dtype_name(params[i].dtype()),
                      "; only floating-point tensors can be optimized"));
  }
}

Tensor state_zeros(const Tensor& like) {
  NoGrad no_grad;
  return zeros(like.shape(), TensorOptions(like.dtype(), like.device()));
}

void check_lr(double lr, const char* who) {
  if (!(lr >= 0) || !std::isfinite(lr))
    throw Error(cat(who, ": learning rate must be finite and >= 0, got ", lr));
}

void check_weight_decay(double wd, const char* who) {
  if (!(wd >= 0) || !std::isfinite(wd))
    throw Error(cat(who, ": weight decay must be finite and >= 0, got ", wd));
}

}  // namespace

detail::NoParamsAllowed::NoParamsAllowed() { ++t_no_params_allowed; }
detail::NoParamsAllowed::~NoParamsAllowed() { --t_no_params_allowed; }

Optimizer::Optimizer(std::vector<Tensor> params, double lr, bool skip_nonfinite)
    : params_(std::move(params)), skip_nonfinite_(skip_nonfinite) {
  check_params(params_, "optimizer");
  check_lr(lr, "optimizer");
  groups_.push_back({lr, 0.0, false, std::nullopt});
  group_of_.assign(params_.size(), 0);
  const Device d = params_.empty() ? Device{} : params_[0].device();
  step_ = zeros({}, TensorOptions(DType::I64, d));
  skipped_ = zeros({}, TensorOptions(DType::I64, d));
  for (const Tensor& p : params_)
    param_steps_.push_back(zeros({}, TensorOptions(DType::I64, p.device())));
}

void Optimizer::set_default_weight_decay(double wd) {
  for (Group& g : groups_)
    if (!g.weight_decay_set) g.weight_decay = wd;
}

void Optimizer::add_param_group(const ParamGroup& group) {
  check_params(group.params, "add_param_group");
  for (size_t k = 0; k < group.params.size(); ++k) {
    for (const Tensor& p : params_)
      if (p.is_same(group.params[k]))
        throw Error(
            cat("add_param_group: parameter ", k,
                " is already in a group (as in PyTorch, a parameter belongs to one group)"));
    for (size_t j = 0; j < k; ++j)
      if (group.params[j].is_same(group.params[k]))
        throw Error(cat("add_param_group: parameter ", k, " is listed twice"));
  }
  const double lr = group.lr.value_or(groups_[0].lr);
  check_lr(lr, "add_param_group");
  if (group.weight_decay) check_weight_decay(*group.weight_decay, "add_param_group");
  groups_.push_back({lr, group.weight_decay.value_or(groups_[0].weight_decay),
                     group.weight_decay.has_value(), std::nullopt});
  for (const Tensor& p : group.params) {
    params_.push_back(p);
    group_of_.push_back(groups_.size() - 1);
    param_steps_.push_back(zeros({}, TensorOptions(DType::I64, p.device())));
    add_state(params_.size() - 1);
  }
}

void Optimizer::set_lr(double lr) {
  check_lr(lr, "set_lr");
  for (Group& g : groups_) g.lr = lr;
}

namespace {
void check_group(size_t g, size_t n, const char* who) {
  if (g >= n) throw Error(cat(who, ": group ", g, " is out of range (", n, " groups)"));
}
}  // namespace

double Optimizer::group_lr(size_t g) const {
  check_group(g, groups_.size(), "group_lr");
  return groups_[g].lr;
}

double Optimizer::group_initial_lr(size_t g) {
  check_group(g, groups_.size(), "group_initial_lr");
  if (!groups_[g].initial_lr) groups_[g].initial_lr = groups_[g].lr;
  return *groups_[g].initial_lr;
}

void Optimizer::set_group_lr(size_t g, double lr) {
  check_group(g, groups_.size(), "set_group_lr");
  check_lr(lr, "set_group_lr");
  groups_[g].lr = lr;
}

double Optimizer::group_weight_decay(size_t g) const {
  check_group(g, groups_.size(), "group_weight_decay");
  return groups_[g].weight_decay;
}

void Optimizer::set_group_weight_decay(size_t g, double wd) {
  check_group(g, groups_.size(), "set_group_weight_decay");
  check_weight_decay(wd, "set_group_weight_decay");
  groups_[g].weight_decay = wd;
  groups_[g].weight_decay_set = true;
}

double Optimizer::momentum() const {
  throw Error("this optimizer has no momentum (cycle_momentum needs SGD, Adam, RMSprop or Lion)");
}
void Optimizer::set_momentum(double) { momentum(); }

Tensor Optimizer::select(const Tensor& ok, const Tensor& fresh, const Tensor& old) {
  return ok.defined() ? where(ok, fresh, old) : fresh;
}

std::vector<Tensor> Optimizer::step_gradients() {
  std::vector<Tensor> grads;
  grads.reserve(params_.size());
  for (const Tensor& p : params_) grads.push_back(p.grad());
  return grads;
}

Tensor Optimizer::count_nonfinite(const std::vector<Tensor>& grads, const Tensor& loss) {
  // Counts non-finite elements rather than squaring: large but finite gradients (whose squares
  // overflow) are not a reason to skip.
  Tensor bad = zeros({}, TensorOptions(DType::I64, params_[0].device()));
  for (const Tensor& g : grads)
    if (g.defined()) bad = bad + sum(logical_not(isfinite(g)));
  if (loss.defined()) bad = bad + sum(logical_not(isfinite(loss)));
  return bad;
}

void Optimizer::step(const Tensor& loss) {
  NoGrad no_grad;
  const std::vector<Tensor> grads = step_gradients();
  Tensor ok;
  if (skip_nonfinite_) {
    ok = eq(count_nonfinite(grads, loss), 0);
    skipped_ += cast(logical_not(ok), DType::I64);
    if (in_step())
      add_step_closure([ok] {
        if (!ok.item<bool>()) runtime::count(runtime::Counter::SkippedUpdates);
      });
  }
  step_ += ok.defined() ? cast(ok, DType::I64)
                        : scalar_tensor(1, TensorOptions(DType::I64, step_.device()));
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& g = grads[i];
    if (!g.defined()) continue;  // as PyTorch: no gradient, no update and no state change
    // Each parameter counts its own updates (PyTorch's state["step"]): one first updated
    // later starts its bias correction and momentum from its own first step.
    Tensor& n = param_steps_[i];
    if (ok.defined())
      n += cast(ok, DType::I64);
    else
      n += 1;
    update(i, g, cast(n, params_[i].dtype()), ok);
  }
  end_step();
}

void Optimizer::zero_grad() {
  for (Tensor& p : params_) p.set_grad(Tensor());
}

nn::NamedTensors Optimizer::state_dict() const {
  nn::NamedTensors out{{"step", step_}, {"skipped_updates", skipped_}};
  for (size_t i = 0; i < param_steps_.size(); ++i)
    out.emplace_back(cat(i, ".step"), param_steps_[i]);
  for (auto& kv : state()) out.push_back(kv);
  return out;
}

namespace {

const char* const kOptimizerHint =
    "Check that the state comes from the same optimizer over the same parameters";

}  // namespace

void Optimizer::check_state_dict(const nn::NamedTensors& state_in) const {
  nn::match_state(state_dict(), state_in, true, "optimizer load_state_dict", kOptimizerHint);
}

void Optimizer::load_state_dict(const nn::NamedTensors& state_in) {
  const std::vector<std::pair<Tensor, Tensor>> copies =
      nn::match_state(state_dict(), state_in, true, "optimizer load_state_dict", kOptimizerHint);
  NoGrad no_grad;
  for (const auto& [dst, src] : copies) {
    Tensor d = dst;
    d.copy_(src.device() == d.device() ? src : src.to(d.device()));
  }
}

// ---- SGD ------------------------------------------------------------------------------------

SGD::SGD(std::vector<Tensor> params, SGDOptions o)
    : Optimizer(std::move(params), o.lr, o.skip_nonfinite), options(o) {
  if (!(o.momentum >= 0) || !(o.weight_decay >= 0) || !(o.dampening >= 0) ||
      !std::isfinite(o.momentum + o.weight_decay + o.dampening))
    throw Error(cat("SGD: momentum, dampening and weight_decay must be finite and >= 0, got ",
                    o.momentum, ", ", o.dampening, ", ", o.weight_decay));
  if (o.nesterov && (o.momentum <= 0 || o.dampening != 0))
    throw Error("SGD: nesterov needs momentum > 0 and dampening 0");
  set_default_weight_decay(o.weight_decay);
  for (size_t i = 0; i < params_.size(); ++i) add_state(i);
}

void SGD::add_state(size_t i) {
  if (options.momentum != 0) momentum_.push_back(state_zeros(params_[i]));
}

double SGD::momentum() const { return options.momentum; }
void SGD::set_momentum(double m) {
  if (momentum_.size() != params_.size() || !(m >= 0) || !std::isfinite(m))
    throw Error(cat("SGD: cannot set momentum ", m,
                    ": it must be >= 0, and the optimizer made with momentum > 0 (so it has "
                    "momentum buffers)"));
  options.momentum = m;
}

void SGD::update(size_t i, const Tensor& grad, const Tensor& t, const Tensor& ok) {
  Tensor& p = params_[i];
  Tensor d = grad;
  const double wd = weight_decay_of(i), lr = lr_of(i);
  if (wd != 0) d = d + wd * p;
  if (options.momentum != 0) {
    Tensor& buf = momentum_[i];
    // PyTorch: the first step sets buf = d; later ones buf = momentum * buf + (1 - dampening) d.
    Tensor first = t == 1;
    Tensor fresh = where(first, d, buf * options.momentum + d * (1 - options.dampening));
    buf.copy_(select(ok, fresh, buf));
    d = options.nesterov ? d + buf * options.momentum : buf;
  }
  p.copy_(select(ok, p - d * lr, p));
}

nn::NamedTensors SGD::state() const {
  nn::NamedTensors out;
  for (size_t i = 0; i < momentum_.size(); ++i)
    out.emplace_back(cat(i, ".momentum_buffer"), momentum_[i]);
  return out;
}

// ---- Adam / AdamW ---------------------------------------------------------------------------

Adam::Adam(std::vector<Tensor> params, AdamOptions o, bool decoupled)
    : Optimizer(std::move(params), o.lr, o.skip_nonfinite), options(o), decoupled_(decoupled) {
  if (!(o.beta1 >= 0 && o.beta1 < 1) || !(o.beta2 >= 0 && o.beta2 < 1))
    throw Error(cat("Adam: betas must be in [0, 1), got ", o.beta1, ", ", o.beta2));
  if (!(o.eps >= 0) || !(o.weight_decay >= 0) || !std::isfinite(o.eps + o.weight_decay))
    throw Error(cat("Adam: eps and weight_decay must be finite and >= 0, got ", o.eps, ", ",
                    o.weight_decay));
  set_default_weight_decay(o.weight_decay);
  for (size_t i = 0; i < params_.size(); ++i) add_state(i);
}

void Adam::add_state(size_t i) {
  m_.push_back(state_zeros(params_[i]));
  v_.push_back(state_zeros(params_[i]));
}

double Adam::momentum() const { return options.beta1; }
void Adam::set_momentum(double b1) {
  if (!(b1 >= 0 && b1 < 1)) throw Error(cat("Adam: beta1 must be in [0, 1), got ", b1));
  options.beta1 = b1;
}

void Adam::update(size_t i, const Tensor& grad, const Tensor& t, const Tensor& ok) {
  Tensor& p = params_[i];
  Tensor g = grad;
  Tensor base = p;
  const double wd = weight_decay_of(i), lr = lr_of(i);
  if (wd != 0) {
    if (decoupled_)
      base = p * (1 - lr * wd);
    else
      g = g + wd * p;
  }
  const double b1 = options.beta1, b2 = options.beta2;
  Tensor m = m_[i] * b1 + g * (1 - b1);
  Tensor v = v_[i] * b2 + g * g * (1 - b2);
  Tensor bias1 = 1.0 - pow(b1, t);
  Tensor bias2 = 1.0 - pow(b2, t);
  Tensor denom = sqrt(v) / sqrt(bias2) + options.eps;
  Tensor fresh = base - (m / denom) * (lr / bias1);
  m_[i].copy_(select(ok, m, m_[i]));
  v_[i].copy_(select(ok, v, v_[i]));
  p.copy_(select(ok, fresh, p));
}

nn::NamedTensors Adam::state() const {
  nn::NamedTensors out;
  for (size_t i = 0; i < m_.size(); ++i) {
    out.emplace_back(cat(i, ".exp_avg"), m_[i]);
    out.emplace_back(cat(i, ".exp_avg_sq"), v_[i]);
  }
  return out;
}

// ---- clipping -------------------------------------------------------------------------------

DType detail::norm_dtype(const std::vector<Tensor>& grads) {
  // The norm is computed in the widest dtype of the gradients (f64 gradients keep f64).
  for (const Tensor& g : grads)
    if (g.defined() && g.dtype() == DType::F64) return DType::F64;
  return DType::F32;
}

Tensor detail::grad_square_sum(const std::vector<Tensor>& params, DType dtype) {
  Tensor sq;
  for (const Tensor& p : params) {
    if (!p.defined() || !p.grad().defined()) continue;
    Tensor s = cast(sum(p.grad() * p.grad()), dtype);
    sq = sq.defined() ? sq + s : s;
  }
  return sq;
}

void detail::scale_grads_to(const std::vector<Tensor>& params, const Tensor& norm,
                            double max_norm) {
  // As PyTorch: scale by max_norm / (norm + 1e-6) when that is below 1.
  Tensor scale = minimum(max_norm / (norm + 1e-6), 1.0);
  for (const Tensor& p : params) {
    if (!p.defined() || !p.grad().defined()) continue;
    Tensor q = p;
    q.set_grad(p.grad() * cast(scale, p.grad().dtype()));
  }
}

Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm) {
  if (!(max_norm > 0)) throw Error(cat("clip_grad_norm_: max_norm must be > 0, got ", max_norm));
  NoGrad no_grad;
  std::vector<Tensor> grads;
  for (const Tensor& p : params)
    if (p.defined()) grads.push_back(p.grad());
  const DType dt = detail::norm_dtype(grads);
  const Tensor sq = detail::grad_square_sum(params, dt);
  if (!sq.defined()) return zeros({}, dt);
  Tensor norm = sqrt(sq);
  detail::scale_grads_to(params, norm, max_norm);
  return norm;
}

}  // namespace lockstep::optim
