// Learning-rate schedules: host-side functions of the step count that set the optimizer's lr,
// which enters the step's program as a runtime scalar.
#include <algorithm>
#include <cmath>
#include <numbers>

#include "lockstep/optim.h"
#include "util/check.h"

namespace lockstep::optim {

using util::cat;

StepLR::StepLR(Optimizer& opt, int64_t step_size, double gamma)
    : LRScheduler(opt), step_size_(step_size), gamma_(gamma) {
  if (step_size <= 0) throw Error(cat("StepLR: step_size must be > 0, got ", step_size));
}

double StepLR::lr_at(int64_t count) const {
  return base_lr_ * std::pow(gamma_, static_cast<double>(count / step_size_));
}

MultiStepLR::MultiStepLR(Optimizer& opt, std::vector<int64_t> milestones, double gamma)
    : LRScheduler(opt), milestones_(std::move(milestones)), gamma_(gamma) {
  if (!std::is_sorted(milestones_.begin(), milestones_.end()))
    throw Error("MultiStepLR: milestones must be increasing");
}

double MultiStepLR::lr_at(int64_t count) const {
  const auto passed =
      std::upper_bound(milestones_.begin(), milestones_.end(), count) - milestones_.begin();
  return base_lr_ * std::pow(gamma_, static_cast<double>(passed));
}

CosineWarmupLR::CosineWarmupLR(Optimizer& opt, int64_t warmup_steps, int64_t total_steps,
                               double min_lr)
    : LRScheduler(opt), warmup_(warmup_steps), total_(total_steps), min_lr_(min_lr) {
  if (warmup_steps < 0 || total_steps <= warmup_steps)
    throw Error(cat("CosineWarmupLR: need 0 <= warmup_steps < total_steps, got ", warmup_steps,
                    " and ", total_steps));
  opt.set_lr(lr_at(0));
}

double CosineWarmupLR::lr_at(int64_t count) const {
  // As Hugging Face's get_cosine_schedule_with_warmup.
  if (count < warmup_) return base_lr_ * static_cast<double>(count) / static_cast<double>(warmup_);
  if (count >= total_) return min_lr_;
  const double progress =
      static_cast<double>(count - warmup_) / static_cast<double>(total_ - warmup_);
  return min_lr_ + (base_lr_ - min_lr_) * 0.5 * (1 + std::cos(std::numbers::pi * progress));
}

}  // namespace lockstep::optim
