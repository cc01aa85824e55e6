// Optimizers and learning-rate schedules. Updates are recorded in place, under NoGrad, in the
// step's graph; hyper-parameters and the step count enter as runtime scalars, so changing them
// never recompiles.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/nn.h"
#include "lockstep/tensor.h"

namespace lockstep::dist {
class ZeroRedundancyOptimizer;
}

namespace lockstep::optim {

// Parameters with their own hyper-parameters (PyTorch's param_groups), added to an optimizer
// with add_param_group; unset options take the optimizer's. E.g. no weight decay on norms and
// biases: SGD opt(decayed, {.lr = 0.1, .weight_decay = 5e-4});
//           opt.add_param_group({no_decay, std::nullopt, 0.0});
struct ParamGroup {
  std::vector<Tensor> params = {};
  std::optional<double> lr = std::nullopt;
  std::optional<double> weight_decay = std::nullopt;
};

class Optimizer {
 public:
  explicit Optimizer(std::vector<Tensor> params, double lr, bool skip_nonfinite);
  virtual ~Optimizer() = default;
  // One update from the parameters' grad(). With skip_nonfinite, the update (and the state
  // change) is dropped when the gradient norm, or the given loss, is not finite; decided inside
  // the graph, without a host round trip, and counted in metrics as skipped_updates.
  void step(const Tensor& loss = Tensor());
  // Clears gradients (to "none", as PyTorch's default).
  virtual void zero_grad();

  // The first group's learning rate; set_lr sets every group's (schedulers set each group's
  // own). Host numbers entering the step as runtime scalars: changing them never recompiles.
  double lr() const { return groups_[0].lr; }
  void set_lr(double lr);
  // Parameter groups: the constructor's parameters are group 0.
  void add_param_group(const ParamGroup& group);
  size_t num_param_groups() const { return groups_.size(); }
  double group_lr(size_t g) const;
  void set_group_lr(size_t g, double lr);
  // The group's lr when the first scheduler took it (PyTorch's 'initial_lr'): every scheduler
  // made on this optimizer schedules from it, so one made after another (SequentialLR's parts)
  // does not start from the lr the first one set.
  double group_initial_lr(size_t g);
  double group_weight_decay(size_t g) const;
  void set_group_weight_decay(size_t g, double weight_decay);
  // Momentum (SGD's momentum, Adam's and Lion's beta1, RMSprop's momentum) for schedules that
  // cycle it (OneCycleLR); optimizers without one throw Error.
  virtual double momentum() const;
  virtual void set_momentum(double momentum);
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
  // Named per-parameter state tensors.
  virtual nn::NamedTensors state() const = 0;
  // Creates the state of params_[i] (called for each parameter, also for added groups).
  virtual void add_state(size_t i) = 0;
  // The gradient step() applies to each parameter (undefined: no update, no state change); by
  // default the parameters' grad(). ZeroRedundancyOptimizer's stage 2 reduces them here.
  virtual std::vector<Tensor> step_gradients();
  // With skip_nonfinite: how many elements of those gradients and of `loss` (if defined) are not
  // finite, as an i64 0-d tensor; 0 on every rank that must update.
  virtual Tensor count_nonfinite(const std::vector<Tensor>& grads, const Tensor& loss);
  // After the updates of a step (what step_gradients kept for them may be dropped).
  virtual void end_step() {}
  // The learning rate and weight decay of params_[i]'s group.
  double lr_of(size_t i) const { return groups_[group_of_[i]].lr; }
  double weight_decay_of(size_t i) const { return groups_[group_of_[i]].weight_decay; }
  // `fresh` if `ok` is true, else `old` (just `fresh` when nothing is skipped).
  static Tensor select(const Tensor& ok, const Tensor& fresh, const Tensor& old);

  std::vector<Tensor> params_;
  Tensor step_;
  // Drives an optimizer over its shard of the parameters through update, state and add_state.
  friend class dist::ZeroRedundancyOptimizer;
  // The subclass' default weight decay, for group 0 and groups that set none (set by each
  // subclass' constructor before it creates state).
  void set_default_weight_decay(double wd);

 private:
  struct Group {
    double lr;
    double weight_decay;
    bool weight_decay_set;
    std::optional<double> initial_lr;  // group_initial_lr's
  };
  std::vector<Group> groups_;
  std::vector<size_t> group_of_;  // params_[i]'s group
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
  double momentum() const override;
  void set_momentum(double momentum) override;

 protected:
  void update(size_t i, const Tensor& grad, const Tensor& t, const Tensor& ok) override;
  nn::NamedTensors state() const override;
  void add_state(size_t i) override;

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
  double momentum() const override;
  void set_momentum(double beta1) override;

 protected:
  void update(size_t i, const Tensor& grad, const Tensor& t, const Tensor& ok) override;
  nn::NamedTensors state() const override;
  void add_state(size_t i) override;

 private:
  bool decoupled_;
  std::vector<Tensor> m_, v_;
};

class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, AdamOptions options) : Adam(std::move(params), options, true) {}
};

struct RMSpropOptions {
  double lr = 1e-2;
  double alpha = 0.99;
  double eps = 1e-8;
  double weight_decay = 0;
  double momentum = 0;
  bool centered = false;
  bool skip_nonfinite = false;
};

// torch.optim.RMSprop: square_avg = alpha sq + (1 - alpha) g^2; step g / (sqrt(square_avg) + eps)
// (centered: sqrt(square_avg - grad_avg^2)), through a momentum buffer when momentum > 0.
class RMSprop : public Optimizer {
 public:
  RMSprop(std::vector<Tensor> params, RMSpropOptions options);
  RMSpropOptions options;
  double momentum() const override;
  void set_momentum(double momentum) override;

 protected:
  void update(size_t i, const Tensor& grad, const Tensor& t, const Tensor& ok) override;
  nn::NamedTensors state() const override;
  void add_state(size_t i) override;

 private:
  std::vector<Tensor> square_avg_, grad_avg_, momentum_;
};

struct AdagradOptions {
  double lr = 1e-2;
  double lr_decay = 0;
  double weight_decay = 0;
  double initial_accumulator_value = 0;
  double eps = 1e-10;
  bool skip_nonfinite = false;
};

// torch.optim.Adagrad: sum += g^2; p -= lr / (1 + (t - 1) lr_decay) * g / (sqrt(sum) + eps).
class Adagrad : public Optimizer {
 public:
  Adagrad(std::vector<Tensor> params, AdagradOptions options);
  AdagradOptions options;

 protected:
  void update(size_t i, const Tensor& grad, const Tensor& t, const Tensor& ok) override;
  nn::NamedTensors state() const override;
  void add_state(size_t i) override;

 private:
  std::vector<Tensor> sum_;
};

struct AdadeltaOptions {
  double lr = 1.0;
  double rho = 0.9;
  double eps = 1e-6;
  double weight_decay = 0;
  bool skip_nonfinite = false;
};

// torch.optim.Adadelta: square_avg = rho sq + (1 - rho) g^2;
// delta = sqrt(acc_delta + eps) / sqrt(square_avg + eps) g; acc_delta = rho acc + (1 - rho)
// delta^2; p -= lr delta.
class Adadelta : public Optimizer {
 public:
  Adadelta(std::vector<Tensor> params, AdadeltaOptions options);
  AdadeltaOptions options;

 protected:
  void update(size_t i, const Tensor& grad, const Tensor& t, const Tensor& ok) override;
  nn::NamedTensors state() const override;
  void add_state(size_t i) override;

 private:
  std::vector<Tensor> square_avg_, acc_delta_;
};

struct LionOptions {
  double lr = 1e-4;
  double beta1 = 0.9, beta2 = 0.99;
  double weight_decay = 0;
  bool skip_nonfinite = false;
};

// Lion (Chen et al., "Symbolic Discovery of Optimization Algorithms", 2023):
// p *= 1 - lr wd; p -= lr sign(beta1 m + (1 - beta1) g); m = beta2 m + (1 - beta2) g.
class Lion : public Optimizer {
 public:
  Lion(std::vector<Tensor> params, LionOptions options);
  LionOptions options;
  double momentum() const override;
  void set_momentum(double beta1) override;

 protected:
  void update(size_t i, const Tensor& grad, const Tensor& t, const Tensor& ok) override;
  nn::NamedTensors state() const override;
  void add_state(size_t i) override;

 private:
  std::vector<Tensor> m_;
};

// Scales gradients so that their global L2 norm is at most max_norm; returns the norm before
// clipping (a 0-d tensor). Recorded: no host round trip.
Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm);

// What a learning-rate scheduler keeps between steps, by PyTorch's names, as tensors of host
// values (0-d i64 counts, f64 lrs), for checkpoints: save_checkpoint and load_checkpoint take a
// scheduler, so a resumed run continues the schedule exactly.
class Scheduler {
 public:
  virtual ~Scheduler() = default;
  // Its class, as checkpoints record it ("CosineWarmupLR"): a state loads only into its kind.
  virtual std::string kind() const = 0;
  virtual nn::NamedTensors state_dict() const = 0;
  // Throws Error naming the entry (and changes nothing) when `state` is not a state of this
  // scheduler for this optimizer: other names, dtypes or sizes, a negative count, a bad lr.
  virtual void check_state_dict(const nn::NamedTensors& state) const = 0;
  void load_state_dict(const nn::NamedTensors& state);

 protected:
  virtual void load_checked(const nn::NamedTensors& state) = 0;
};

// Learning-rate schedules: call step() once per optimizer step (or per epoch for the
// epoch-based ones, as you choose); it sets each parameter group's lr from the group's lr when
// the scheduler was made (its base lr) and the count of steps so far. State: "last_epoch" (the
// count) and "base_lrs" (one per group).
class LRScheduler : public Scheduler {
 public:
  explicit LRScheduler(Optimizer& opt);
  void step() { set_count(count_ + 1); }
  int64_t count() const { return count_; }
  void set_count(int64_t c);
  // Each parameter group's lr at the current count (PyTorch's get_last_lr()).
  std::vector<double> get_last_lr() const;
  // Group g's lr after `count` steps (lr_at with its base lr; schedules with per-group rules
  // override it).
  virtual double group_lr_at(int64_t count, size_t g) const { return lr_at(count, base_lrs_[g]); }
  Optimizer& optimizer() const { return opt_; }
  // The lr after `count` steps of a group whose base lr is `base_lr` (group 0's by default).
  virtual double lr_at(int64_t count, double base_lr) const = 0;
  double lr_at(int64_t count) const { return lr_at(count, base_lrs_[0]); }
  nn::NamedTensors state_dict() const override;
  void check_state_dict(const nn::NamedTensors& state) const override;

 protected:
  void load_checked(const nn::NamedTensors& state) override;
  // Called after each count change, once the lrs are set (OneCycleLR moves the momentum).
  virtual void on_count(int64_t) {}
  Optimizer& opt_;
  std::vector<double> base_lrs_;
  int64_t count_ = 0;
};

class StepLR : public LRScheduler {
 public:
  std::string kind() const override { return "StepLR"; }
  StepLR(Optimizer& opt, int64_t step_size, double gamma = 0.1);
  using LRScheduler::lr_at;
  double lr_at(int64_t count, double base_lr) const override;

 private:
  int64_t step_size_;
  double gamma_;
};

class MultiStepLR : public LRScheduler {
 public:
  std::string kind() const override { return "MultiStepLR"; }
  MultiStepLR(Optimizer& opt, std::vector<int64_t> milestones, double gamma = 0.1);
  using LRScheduler::lr_at;
  double lr_at(int64_t count, double base_lr) const override;

 private:
  std::vector<int64_t> milestones_;
  double gamma_;
};

// base_lr * gamma^count (torch.optim.lr_scheduler.ExponentialLR).
class ExponentialLR : public LRScheduler {
 public:
  std::string kind() const override { return "ExponentialLR"; }
  ExponentialLR(Optimizer& opt, double gamma);
  using LRScheduler::lr_at;
  double lr_at(int64_t count, double base_lr) const override;

 private:
  double gamma_;
};

// base_lr times a factor going linearly from start_factor to end_factor over total_iters steps,
// then end_factor (torch.optim.lr_scheduler.LinearLR, its defaults).
class LinearLR : public LRScheduler {
 public:
  std::string kind() const override { return "LinearLR"; }
  explicit LinearLR(Optimizer& opt, double start_factor = 1.0 / 3, double end_factor = 1.0,
                    int64_t total_iters = 5);
  using LRScheduler::lr_at;
  double lr_at(int64_t count, double base_lr) const override;

 private:
  double start_, end_;
  int64_t total_;
};

// Linear warm-up from 0 to the base lr over warmup steps, then cosine decay to min_lr at
// total steps (and min_lr after): Hugging Face's get_cosine_schedule_with_warmup.
class CosineWarmupLR : public LRScheduler {
 public:
  std::string kind() const override { return "CosineWarmupLR"; }
  CosineWarmupLR(Optimizer& opt, int64_t warmup_steps, int64_t total_steps, double min_lr = 0);
  using LRScheduler::lr_at;
  double lr_at(int64_t count, double base_lr) const override;

 private:
  int64_t warmup_, total_;
  double min_lr_;
};

// base_lr * factor(count) (torch.optim.lr_scheduler.LambdaLR): one factor for every group, or
// one per group.
class LambdaLR : public LRScheduler {
 public:
  using Factor = std::function<double(int64_t)>;
  std::string kind() const override { return "LambdaLR"; }
  LambdaLR(Optimizer& opt, std::vector<Factor> factors);
  using LRScheduler::lr_at;
  double lr_at(int64_t count, double base_lr) const override;
  double group_lr_at(int64_t count, size_t g) const override;

 protected:
  const Factor& factor(size_t g) const { return factors_[factors_.size() == 1 ? 0 : g]; }
  std::vector<Factor> factors_;
};

// base_lr * factor(1) * ... * factor(count) (torch.optim.lr_scheduler.MultiplicativeLR).
class MultiplicativeLR : public LambdaLR {
 public:
  std::string kind() const override { return "MultiplicativeLR"; }
  MultiplicativeLR(Optimizer& opt, std::vector<Factor> factors);
  double lr_at(int64_t count, double base_lr) const override;
  double group_lr_at(int64_t count, size_t g) const override;

 private:
  double product(int64_t count, size_t g) const;
  mutable std::vector<std::vector<double>> products_;  // per group: products_[g][c] up to c
};

// Schedules one after another (torch.optim.lr_scheduler.SequentialLR): parts[i] from
// milestones[i - 1] on, counting from 0 again there. The parts must schedule this optimizer.
class SequentialLR : public LRScheduler {
 public:
  std::string kind() const override { return "SequentialLR"; }
  SequentialLR(Optimizer& opt, std::vector<std::shared_ptr<LRScheduler>> parts,
               std::vector<int64_t> milestones);
  using LRScheduler::lr_at;
  double lr_at(int64_t count, double base_lr) const override;
  double group_lr_at(int64_t count, size_t g) const override;

 private:
  std::vector<std::shared_ptr<LRScheduler>> parts_;
  std::vector<int64_t> milestones_;
};

// Schedules applied together (torch.optim.lr_scheduler.ChainedScheduler): the base lr times each
// part's factor (its lr over its base lr) at the same count. The parts must schedule this
// optimizer.
class ChainedScheduler : public LRScheduler {
 public:
  std::string kind() const override { return "ChainedScheduler"; }
  explicit ChainedScheduler(std::vector<std::shared_ptr<LRScheduler>> parts);
  using LRScheduler::lr_at;
  double lr_at(int64_t count, double base_lr) const override;
  double group_lr_at(int64_t count, size_t g) const override;

 private:
  std::vector<std::shared_ptr<LRScheduler>> parts_;
};

struct OneCycleOptions {
  double max_lr = 0;        // required
  int64_t total_steps = 0;  // required
  double pct_start = 0.3;
  bool cos_anneal = true;  // false: linear (anneal_strategy='linear')
  double div_factor = 25;
  double final_div_factor = 1e4;
  bool three_phase = false;
  bool cycle_momentum = true;
  double base_momentum = 0.85, max_momentum = 0.95;
};

// torch.optim.lr_scheduler.OneCycleLR, its defaults and formulas: the lr rises from
// max_lr / div_factor to max_lr over pct_start of total_steps and falls to
// max_lr / div_factor / final_div_factor; the momentum (Optimizer::momentum) moves the other
// way between max_momentum and base_momentum. Every group gets the same max_lr.
class OneCycleLR : public LRScheduler {
 public:
  std::string kind() const override { return "OneCycleLR"; }
  OneCycleLR(Optimizer& opt, const OneCycleOptions& options);
  using LRScheduler::lr_at;
  double lr_at(int64_t count, double base_lr) const override;
  double momentum_at(int64_t count) const;

 protected:
  void on_count(int64_t count) override;

 private:
  double at(int64_t count, bool momentum) const;
  OneCycleOptions options_;
};

struct PlateauOptions {
  bool mode_max = false;  // false: the metric should go down ('min'); true: up ('max')
  double factor = 0.1;
  int64_t patience = 10;
  double threshold = 1e-4;
  bool threshold_rel = true;  // false: 'abs'
  int64_t cooldown = 0;
  double min_lr = 0;
  double eps = 1e-8;
};

// torch.optim.lr_scheduler.ReduceLROnPlateau: step(metric) once per epoch with a host number
// (e.g. the validation loss read with item(): an epoch-level host read, a sync, as it is in
// PyTorch); after `patience` epochs without improvement every group's lr is multiplied by
// factor (not below min_lr).
// State: "best", "num_bad_epochs", "cooldown_counter", "last_epoch" (step calls) and "_last_lr"
// (each group's lr, which it lowered).
class ReduceLROnPlateau : public Scheduler {
 public:
  explicit ReduceLROnPlateau(Optimizer& opt, const PlateauOptions& options = {});
  void step(double metric);
  int64_t num_bad_epochs() const { return bad_; }
  std::string kind() const override { return "ReduceLROnPlateau"; }
  nn::NamedTensors state_dict() const override;
  void check_state_dict(const nn::NamedTensors& state) const override;

 protected:
  void load_checked(const nn::NamedTensors& state) override;

 private:
  bool better(double a, double best) const;
  Optimizer& opt_;
  PlateauOptions options_;
  double best_;
  int64_t bad_ = 0, cooldown_ = 0, epochs_ = 0;
};

}  // namespace lockstep::optim
