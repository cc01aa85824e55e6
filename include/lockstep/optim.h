// Optimizers and learning-rate schedules. Updates are recorded in place, under NoGrad, in the
// step's graph; hyper-parameters and the step count enter as runtime scalars, so changing them
// never recompiles.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/nn.h"
#include "lockstep/tensor.h"

namespace lockstep::optim {

class Optimizer {
 public:
  explicit Optimizer(std::vector<Tensor> params, double lr, bool skip_nonfinite);
  virtual ~Optimizer() = default;
  // One update from the parameters' grad(). With skip_nonfinite, the update (and the state
  // change) is dropped when the gradient norm, or the given loss, is not finite; decided inside
  // the graph, without a host round trip, and counted in metrics as skipped_updates.
  void step(const Tensor& loss = Tensor());
  // Clears gradients (to "none", as PyTorch's default).
  void zero_grad();

  double lr() const { return lr_; }
  void set_lr(double lr) { lr_ = lr; }
  // Updates applied so far (i64 0-d tensor). A tensor, not a host number, so that a step's
  // rollback and a skipped update leave it right, and it never causes a recompile.
  const Tensor& step_count() const { return step_; }
  const std::vector<Tensor>& params() const { return params_; }
  // Number of skipped updates so far, as an i64 0-d tensor (computed in the graph).
  const Tensor& skipped_updates() const { return skipped_; }

  // Optimizer state by name, for checkpoints: "step", "skipped_updates", then per parameter i
  // "<i>.step" (its own update count, as PyTorch's) and the optimizer's buffers.
  nn::NamedTensors state_dict() const;
  void load_state_dict(const nn::NamedTensors& state);
  // The checks of load_state_dict alone: throws the same Error, changes nothing.
  void check_state_dict(const nn::NamedTensors& state) const;

 protected:
  // Updates params_[i] in place given its gradient; `t` is the number of this update of that
  // parameter (1 for its first) as a 0-d tensor of the parameter's dtype; `ok` is a bool 0-d tensor
  // (or empty when nothing is skipped): implementations keep every state change conditional on it.
  virtual void update(size_t i, const Tensor& grad, const Tensor& t, const Tensor& ok) = 0;
  // Named per-parameter state tensors (created on the first step).
  virtual nn::NamedTensors state() const = 0;
  // `fresh` if `ok` is true, else `old` (just `fresh` when nothing is skipped).
  static Tensor select(const Tensor& ok, const Tensor& fresh, const Tensor& old);

  std::vector<Tensor> params_;
  double lr_;
  Tensor step_;

 private:
  bool skip_nonfinite_;
  Tensor skipped_;
  std::vector<Tensor> param_steps_;  // updates applied to each parameter ("<i>.step")
};

struct SGDOptions {
  double lr = 0.01;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
  bool skip_nonfinite = false;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions options);
  SGDOptions options;

 protected:
  void update(size_t i, const Tensor& grad, const Tensor& t, const Tensor& ok) override;
  nn::NamedTensors state() const override;

 private:
  std::vector<Tensor> momentum_;
};

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;
  bool skip_nonfinite = false;
};

// Adam (L2 weight decay added to the gradient); AdamW (decoupled weight decay) when
// `decoupled` is set. Formulas as PyTorch's.
class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, AdamOptions options, bool decoupled = false);
  AdamOptions options;

 protected:
  void update(size_t i, const Tensor& grad, const Tensor& t, const Tensor& ok) override;
  nn::NamedTensors state() const override;

 private:
  bool decoupled_;
  std::vector<Tensor> m_, v_;
};

class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, AdamOptions options) : Adam(std::move(params), options, true) {}
};

// Scales gradients so that their global L2 norm is at most max_norm; returns the norm before
// clipping (a 0-d tensor). Recorded: no host round trip.
Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm);

// Learning-rate schedules: call step() once per optimizer step (or per epoch for the
// epoch-based ones, as you choose), it sets the optimizer's lr.
class LRScheduler {
 public:
  explicit LRScheduler(Optimizer& opt) : opt_(opt), base_lr_(opt.lr()) {}
  virtual ~LRScheduler() = default;
  void step() {
    ++count_;
    opt_.set_lr(lr_at(count_));
  }
  int64_t count() const { return count_; }
  void set_count(int64_t c) {
    count_ = c;
    opt_.set_lr(lr_at(count_));
  }
  virtual double lr_at(int64_t count) const = 0;

 protected:
  Optimizer& opt_;
  double base_lr_;
  int64_t count_ = 0;
};

class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& opt, int64_t step_size, double gamma = 0.1);
  double lr_at(int64_t count) const override;

 private:
  int64_t step_size_;
  double gamma_;
};

class MultiStepLR : public LRScheduler {
 public:
  MultiStepLR(Optimizer& opt, std::vector<int64_t> milestones, double gamma = 0.1);
  double lr_at(int64_t count) const override;

 private:
  std::vector<int64_t> milestones_;
  double gamma_;
};

// Linear warm-up from 0 to the base lr over warmup steps, then cosine decay to min_lr at
// total steps (and min_lr after): Hugging Face's get_cosine_schedule_with_warmup.
class CosineWarmupLR : public LRScheduler {
 public:
  CosineWarmupLR(Optimizer& opt, int64_t warmup_steps, int64_t total_steps, double min_lr = 0);
  double lr_at(int64_t count) const override;

 private:
  int64_t warmup_, total_;
  double min_lr_;
};

}  // namespace lockstep::optim
