// Learning-rate schedules: host-side functions of the step count that set each parameter
// group's lr, which enters the step's program as a runtime scalar (no recompiles).
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <numbers>

#include "lockstep/ops.h"
#include "lockstep/optim.h"
#include "util/check.h"

namespace lockstep::optim {

using util::cat;

namespace {

// The entry `name` of a scheduler's state, checked to be `dtype` of `shape`.
const Tensor& entry(const nn::NamedTensors& state, const std::string& name, DType dtype,
                    const Shape& shape, const std::string& who) {
  for (const auto& [n, t] : state) {
    if (n != name) continue;
    if (!t.defined() || t.dtype() != dtype || t.shape() != shape)
      throw Error(cat(who, ": state entry '", name, "' is ",
                      t.defined() ? cat(dtype_name(t.dtype()), shape_str(t.shape())) : "empty",
                      ", expected ", dtype_name(dtype), shape_str(shape)));
    return t;
  }
  throw Error(cat(who, ": the state has no entry '", name, "' (a state of another scheduler?)"));
}

// Every entry of `state` is one of `names`.
void only(const nn::NamedTensors& state, std::initializer_list<const char*> names,
          const std::string& who) {
  for (const auto& entry : state) {
    // Not a structured binding: clang's OpenMP cannot capture one in the lambda.
    const std::string& n = entry.first;
    if (std::find_if(names.begin(), names.end(), [&](const char* k) { return n == k; }) ==
        names.end())
      throw Error(
          cat(who, ": the state has an unknown entry '", n, "' (a state of another scheduler?)"));
  }
}

int64_t count_entry(const nn::NamedTensors& state, const std::string& name,
                    const std::string& who) {
  const int64_t v = entry(state, name, DType::I64, {}, who).to_vector<int64_t>()[0];
  if (v < 0) throw Error(cat(who, ": state entry '", name, "' = ", v, " is negative"));
  return v;
}

std::vector<double> lrs_entry(const nn::NamedTensors& state, const std::string& name, size_t groups,
                              const std::string& who) {
  std::vector<double> lrs =
      entry(state, name, DType::F64, {static_cast<int64_t>(groups)}, who).to_vector<double>();
  for (size_t g = 0; g < lrs.size(); ++g)
    if (!std::isfinite(lrs[g]) || lrs[g] < 0)
      throw Error(cat(who, ": state entry '", name, "' has lr ", lrs[g], " for group ", g,
                      " (an lr is finite and >= 0)"));
  return lrs;
}

Tensor host_count(int64_t v) { return scalar_tensor(v, TensorOptions(DType::I64)); }
Tensor host_lrs(const std::vector<double>& lrs) {
  return from_vector<double>(lrs, {static_cast<int64_t>(lrs.size())});
}

}  // namespace

void Scheduler::load_state_dict(const nn::NamedTensors& state) {
  check_state_dict(state);
  load_checked(state);
}

LRScheduler::LRScheduler(Optimizer& opt) : opt_(opt) {
  for (size_t g = 0; g < opt.num_param_groups(); ++g) base_lrs_.push_back(opt.group_initial_lr(g));
}

void LRScheduler::set_count(int64_t c) {
  count_ = c;
  for (size_t g = 0; g < base_lrs_.size() && g < opt_.num_param_groups(); ++g)
    opt_.set_group_lr(g, group_lr_at(count_, g));
  on_count(count_);
}

std::vector<double> LRScheduler::get_last_lr() const {
  std::vector<double> out;
  for (size_t g = 0; g < base_lrs_.size(); ++g) out.push_back(group_lr_at(count_, g));
  return out;
}

nn::NamedTensors LRScheduler::state_dict() const {
  return {{"last_epoch", host_count(count_)}, {"base_lrs", host_lrs(base_lrs_)}};
}

void LRScheduler::check_state_dict(const nn::NamedTensors& state) const {
  const std::string who = kind() + "::load_state_dict";
  only(state, {"last_epoch", "base_lrs"}, who);
  count_entry(state, "last_epoch", who);
  lrs_entry(state, "base_lrs", base_lrs_.size(), who);
}

void LRScheduler::load_checked(const nn::NamedTensors& state) {
  const std::string who = kind() + "::load_state_dict";
  base_lrs_ = lrs_entry(state, "base_lrs", base_lrs_.size(), who);
  set_count(count_entry(state, "last_epoch", who));
}

StepLR::StepLR(Optimizer& opt, int64_t step_size, double gamma)
    : LRScheduler(opt), step_size_(step_size), gamma_(gamma) {
  if (step_size <= 0) throw Error(cat("StepLR: step_size must be > 0, got ", step_size));
}

double StepLR::lr_at(int64_t count, double base_lr) const {
  return base_lr * std::pow(gamma_, static_cast<double>(count / step_size_));
}

MultiStepLR::MultiStepLR(Optimizer& opt, std::vector<int64_t> milestones, double gamma)
    : LRScheduler(opt), milestones_(std::move(milestones)), gamma_(gamma) {
  if (!std::is_sorted(milestones_.begin(), milestones_.end()))
    throw Error("MultiStepLR: milestones must be increasing");
}

double MultiStepLR::lr_at(int64_t count, double base_lr) const {
  const auto passed =
      std::upper_bound(milestones_.begin(), milestones_.end(), count) - milestones_.begin();
  return base_lr * std::pow(gamma_, static_cast<double>(passed));
}

ExponentialLR::ExponentialLR(Optimizer& opt, double gamma) : LRScheduler(opt), gamma_(gamma) {
  if (!(gamma > 0) || !std::isfinite(gamma))
    throw Error(cat("ExponentialLR: gamma must be finite and > 0, got ", gamma));
}

double ExponentialLR::lr_at(int64_t count, double base_lr) const {
  return base_lr * std::pow(gamma_, static_cast<double>(count));
}

LinearLR::LinearLR(Optimizer& opt, double start_factor, double end_factor, int64_t total_iters)
    : LRScheduler(opt), start_(start_factor), end_(end_factor), total_(total_iters) {
  // PyTorch's checks: 0 < start_factor <= 1, 0 <= end_factor <= 1.
  if (!(start_factor > 0 && start_factor <= 1) || !(end_factor >= 0 && end_factor <= 1) ||
      total_iters <= 0)
    throw Error(
        cat("LinearLR: needs 0 < start_factor <= 1, 0 <= end_factor <= 1 and "
            "total_iters > 0, got ",
            start_factor, ", ", end_factor, ", ", total_iters));
  set_count(0);
}

double LinearLR::lr_at(int64_t count, double base_lr) const {
  const double done = static_cast<double>(std::min(count, total_)) / static_cast<double>(total_);
  return base_lr * (start_ + (end_ - start_) * done);
}

CosineWarmupLR::CosineWarmupLR(Optimizer& opt, int64_t warmup_steps, int64_t total_steps,
                               double min_lr)
    : LRScheduler(opt), warmup_(warmup_steps), total_(total_steps), min_lr_(min_lr) {
  if (warmup_steps < 0 || total_steps <= warmup_steps)
    throw Error(cat("CosineWarmupLR: need 0 <= warmup_steps < total_steps, got ", warmup_steps,
                    " and ", total_steps));
  set_count(0);
}

double CosineWarmupLR::lr_at(int64_t count, double base_lr) const {
  // As Hugging Face's get_cosine_schedule_with_warmup.
  if (count < warmup_) return base_lr * static_cast<double>(count) / static_cast<double>(warmup_);
  if (count >= total_) return min_lr_;
  const double progress =
      static_cast<double>(count - warmup_) / static_cast<double>(total_ - warmup_);
  return min_lr_ + (base_lr - min_lr_) * 0.5 * (1 + std::cos(std::numbers::pi * progress));
}

OneCycleLR::OneCycleLR(Optimizer& opt, const OneCycleOptions& o) : LRScheduler(opt), options_(o) {
  if (!(o.max_lr > 0) || o.total_steps <= 0 || !(o.pct_start > 0 && o.pct_start < 1) ||
      !(o.div_factor > 0) || !(o.final_div_factor > 0))
    throw Error(cat("OneCycleLR: needs max_lr > 0 and total_steps > 0 (both required), ",
                    "0 < pct_start < 1, positive div factors; got max_lr ", o.max_lr,
                    ", total_steps ", o.total_steps, ", pct_start ", o.pct_start));
  if (o.cycle_momentum) opt.momentum();  // throws for an optimizer without one, as PyTorch
  set_count(0);
}

double OneCycleLR::at(int64_t count, bool momentum) const {
  const OneCycleOptions& o = options_;
  const double initial = o.max_lr / o.div_factor, min_lr = initial / o.final_div_factor;
  const double total = static_cast<double>(o.total_steps);
  struct Phase {
    double end_step, start_lr, end_lr, start_m, end_m;
  };
  std::vector<Phase> phases;
  if (o.three_phase)
    phases = {{o.pct_start * total - 1, initial, o.max_lr, o.max_momentum, o.base_momentum},
              {2 * o.pct_start * total - 2, o.max_lr, initial, o.base_momentum, o.max_momentum},
              {total - 1, initial, min_lr, o.max_momentum, o.max_momentum}};
  else
    phases = {{o.pct_start * total - 1, initial, o.max_lr, o.max_momentum, o.base_momentum},
              {total - 1, o.max_lr, min_lr, o.base_momentum, o.max_momentum}};
  auto anneal = [&](double start, double end, double pct) {
    if (o.cos_anneal) return end + (start - end) / 2.0 * (std::cos(std::numbers::pi * pct) + 1);
    return (end - start) * pct + start;
  };
  const double step = static_cast<double>(count);
  double start_step = 0;
  for (size_t i = 0; i < phases.size(); ++i) {
    const Phase& p = phases[i];
    if (step <= p.end_step || i + 1 == phases.size()) {
      const double pct = (step - start_step) / (p.end_step - start_step);
      return momentum ? anneal(p.start_m, p.end_m, pct) : anneal(p.start_lr, p.end_lr, pct);
    }
    start_step = p.end_step;
  }
  return 0;
}

// At count == total_steps (after the last step) a linear anneal runs past its end; PyTorch would
// set that negative lr, here it stops at 0.
double OneCycleLR::lr_at(int64_t count, double) const { return std::max(0.0, at(count, false)); }
double OneCycleLR::momentum_at(int64_t count) const { return at(count, true); }

void OneCycleLR::on_count(int64_t count) {
  if (count > options_.total_steps)
    throw Error(cat("OneCycleLR: stepped ", count, " times, more than total_steps ",
                    options_.total_steps, " (as PyTorch, it does not go past the end)"));
  if (options_.cycle_momentum) opt_.set_momentum(momentum_at(count));
}

ReduceLROnPlateau::ReduceLROnPlateau(Optimizer& opt, const PlateauOptions& o)
    : opt_(opt), options_(o), best_(o.mode_max ? -INFINITY : INFINITY) {
  if (!(o.factor > 0 && o.factor < 1))
    throw Error(cat("ReduceLROnPlateau: factor must be in (0, 1), got ", o.factor));
  if (o.patience < 0 || o.cooldown < 0 || !(o.min_lr >= 0))
    throw Error("ReduceLROnPlateau: patience, cooldown and min_lr must be >= 0");
}

bool ReduceLROnPlateau::better(double a, double best) const {
  const PlateauOptions& o = options_;
  if (!o.mode_max) return o.threshold_rel ? a < best * (1 - o.threshold) : a < best - o.threshold;
  return o.threshold_rel ? a > best * (1 + o.threshold) : a > best + o.threshold;
}

void ReduceLROnPlateau::step(double metric) {
  if (std::isnan(metric)) throw Error("ReduceLROnPlateau: the metric is NaN");
  ++epochs_;
  if (better(metric, best_)) {
    best_ = metric;
    bad_ = 0;
  } else {
    ++bad_;
  }
  if (cooldown_ > 0) {
    --cooldown_;
    bad_ = 0;  // as PyTorch: bad epochs are ignored during cooldown
  }
  if (bad_ > options_.patience) {
    for (size_t g = 0; g < opt_.num_param_groups(); ++g) {
      const double old_lr = opt_.group_lr(g);
      const double new_lr = std::max(old_lr * options_.factor, options_.min_lr);
      if (old_lr - new_lr > options_.eps) opt_.set_group_lr(g, new_lr);
    }
    cooldown_ = options_.cooldown;
    bad_ = 0;
  }
}

nn::NamedTensors ReduceLROnPlateau::state_dict() const {
  std::vector<double> lrs;
  for (size_t g = 0; g < opt_.num_param_groups(); ++g) lrs.push_back(opt_.group_lr(g));
  return {{"best", scalar_tensor(best_, TensorOptions(DType::F64))},
          {"num_bad_epochs", host_count(bad_)},
          {"cooldown_counter", host_count(cooldown_)},
          {"last_epoch", host_count(epochs_)},
          {"_last_lr", host_lrs(lrs)}};
}

void ReduceLROnPlateau::check_state_dict(const nn::NamedTensors& state) const {
  const std::string who = "ReduceLROnPlateau::load_state_dict";
  only(state, {"best", "num_bad_epochs", "cooldown_counter", "last_epoch", "_last_lr"}, who);
  if (std::isnan(entry(state, "best", DType::F64, {}, who).to_vector<double>()[0]))
    throw Error(cat(who, ": state entry 'best' is NaN"));
  for (const char* name : {"num_bad_epochs", "cooldown_counter", "last_epoch"})
    count_entry(state, name, who);
  lrs_entry(state, "_last_lr", opt_.num_param_groups(), who);
}

void ReduceLROnPlateau::load_checked(const nn::NamedTensors& state) {
  const std::string who = "ReduceLROnPlateau::load_state_dict";
  best_ = entry(state, "best", DType::F64, {}, who).to_vector<double>()[0];
  bad_ = count_entry(state, "num_bad_epochs", who);
  cooldown_ = count_entry(state, "cooldown_counter", who);
  epochs_ = count_entry(state, "last_epoch", who);
  const std::vector<double> lrs = lrs_entry(state, "_last_lr", opt_.num_param_groups(), who);
  for (size_t g = 0; g < lrs.size(); ++g) opt_.set_group_lr(g, lrs[g]);
}

// ---- schedules of schedules and of the user's functions -----------------------------------

LambdaLR::LambdaLR(Optimizer& opt, std::vector<Factor> factors)
    : LRScheduler(opt), factors_(std::move(factors)) {
  if (factors_.size() != 1 && factors_.size() != base_lrs_.size())
    throw Error(cat(kind(), ": expected 1 factor function or one per parameter group (",
                    base_lrs_.size(), "), got ", factors_.size()));
  for (const Factor& f : factors_)
    if (!f) throw Error(cat(kind(), ": a factor function is empty"));
  if (kind() == "LambdaLR") set_count(0);  // MultiplicativeLR's own constructor sets it
}

double LambdaLR::lr_at(int64_t count, double base_lr) const { return base_lr * factor(0)(count); }

double LambdaLR::group_lr_at(int64_t count, size_t g) const {
  return base_lrs_[g] * factor(g)(count);
}

MultiplicativeLR::MultiplicativeLR(Optimizer& opt, std::vector<Factor> factors)
    : LambdaLR(opt, std::move(factors)) {
  products_.assign(base_lrs_.size(), {1.0});
  set_count(0);
}

double MultiplicativeLR::product(int64_t count, size_t g) const {
  std::vector<double>& p = products_[g];
  while (static_cast<int64_t>(p.size()) <= count)
    p.push_back(p.back() * factor(g)(static_cast<int64_t>(p.size())));
  return p[static_cast<size_t>(count)];
}

double MultiplicativeLR::lr_at(int64_t count, double base_lr) const {
  return base_lr * product(count, 0);
}

double MultiplicativeLR::group_lr_at(int64_t count, size_t g) const {
  return base_lrs_[g] * product(count, g);
}

namespace {

void check_parts(const std::vector<std::shared_ptr<LRScheduler>>& parts, const Optimizer& opt,
                 const char* who) {
  if (parts.empty()) throw Error(cat(who, ": needs at least one scheduler"));
  for (size_t i = 0; i < parts.size(); ++i) {
    if (!parts[i]) throw Error(cat(who, ": scheduler ", i, " is null"));
    if (&parts[i]->optimizer() != &opt)
      throw Error(cat(who, ": scheduler ", i, " schedules another optimizer; every part must ",
                      "schedule the same one"));
  }
}

Optimizer& first_optimizer(const std::vector<std::shared_ptr<LRScheduler>>& parts) {
  if (parts.empty() || !parts[0]) throw Error("ChainedScheduler: needs at least one scheduler");
  return parts[0]->optimizer();
}

}  // namespace

SequentialLR::SequentialLR(Optimizer& opt, std::vector<std::shared_ptr<LRScheduler>> parts,
                           std::vector<int64_t> milestones)
    : LRScheduler(opt), parts_(std::move(parts)), milestones_(std::move(milestones)) {
  check_parts(parts_, opt, "SequentialLR");
  if (milestones_.size() + 1 != parts_.size())
    throw Error(cat("SequentialLR: expected ", parts_.size() - 1, " milestones for ", parts_.size(),
                    " schedulers, got ", milestones_.size()));
  for (size_t i = 0; i < milestones_.size(); ++i)
    if (milestones_[i] < 0 || (i && milestones_[i] < milestones_[i - 1]))
      throw Error("SequentialLR: milestones must be non-negative and increasing");
  set_count(0);
}

double SequentialLR::group_lr_at(int64_t count, size_t g) const {
  const size_t i = static_cast<size_t>(
      std::upper_bound(milestones_.begin(), milestones_.end(), count) - milestones_.begin());
  return parts_[i]->group_lr_at(count - (i ? milestones_[i - 1] : 0), g);
}

double SequentialLR::lr_at(int64_t count, double) const { return group_lr_at(count, 0); }

ChainedScheduler::ChainedScheduler(std::vector<std::shared_ptr<LRScheduler>> parts)
    : LRScheduler(first_optimizer(parts)), parts_(std::move(parts)) {
  check_parts(parts_, opt_, "ChainedScheduler");
  set_count(0);
}

double ChainedScheduler::group_lr_at(int64_t count, size_t g) const {
  const double base = base_lrs_[g];
  double lr = base;
  for (const auto& p : parts_) lr *= base != 0 ? p->group_lr_at(count, g) / base : 0.0;
  return lr;
}

double ChainedScheduler::lr_at(int64_t count, double) const { return group_lr_at(count, 0); }

}  // namespace lockstep::optim
