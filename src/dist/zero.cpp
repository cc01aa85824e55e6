// ZeroRedundancyOptimizer (lockstep/dist.h): ZeRO stages 1 and 2, the optimizer's state (and
// under stage 2 the gradients) sharded by parameter over the ranks, a parameter larger than an
// even share split into one run per rank; each gradient (or run) reduced to its owner (stage 2),
// each parameter (or run) updated by its owner and broadcast from it inside the step's program.
#include <algorithm>
#include <numeric>
#include <optional>
#include <string>
#include <utility>

#include "dist/fully_shard.h"
#include "dist/ops.h"
#include "dist/partition.h"
#include "lockstep/dist.h"
#include "optim/clip.h"
#include "runtime/lazy.h"
#include "tensor/frontend.h"
#include "util/check.h"

namespace lockstep::dist {

using util::cat;

namespace {

Tensor run_values(const Tensor& whole, ZeroRedundancyOptimizer::Run run) {
  return slice(reshape(whole, {whole.numel()}), 0, run.offset, run.offset + run.numel);
}

}  // namespace

struct ZeroRedundancyOptimizer::Shard {
  std::vector<Tensor> params;
  std::vector<int> owners;  // -1: split
  std::vector<std::vector<Run>> runs;
  std::vector<int64_t> local_of;
  std::vector<int64_t> load;
  std::shared_ptr<optim::Optimizer> local;
};

ZeroRedundancyOptimizer::Shard ZeroRedundancyOptimizer::partition(std::vector<Tensor> params,
                                                                  const LocalFactory& make_local,
                                                                  const ZeroOptions& options,
                                                                  const Loc& loc,
                                                                  bool of_fully_shard) {
  const int world = world_size(), me = rank();
  if (options.stage < 1 || options.stage > 3)
    util::fail(loc, "ZeroRedundancyOptimizer", cat("stage ", options.stage),
               "Use stage 1 (the optimizer's state sharded), 2 (the gradients as well) or 3 "
               "(the parameters too: ls::dist::fully_shard)");
  if (options.stage == 3 && !of_fully_shard)
    util::fail(loc, "ZeroRedundancyOptimizer", "stage 3 over parameters that are not sharded",
               "Call ls::dist::fully_shard(model, make_local, options), which shards them");
  if (!(options.max_grad_norm >= 0))
    util::fail(loc, "ZeroRedundancyOptimizer", cat("max_grad_norm ", options.max_grad_norm),
               "Use a norm > 0 to clip, or 0 not to");
  if (options.bucket_bytes <= 0)
    util::fail(loc, "ZeroRedundancyOptimizer", cat("bucket_bytes ", options.bucket_bytes),
               "Use a bucket size > 0 bytes (the default is 4 MiB)");
  if (!make_local)
    util::fail(loc, "ZeroRedundancyOptimizer", "no function to make the local optimizer",
               "Pass one that builds an ls::optim optimizer over the parameters it is given");
  for (size_t i = 0; i < params.size(); ++i)
    if (!params[i].defined())
      util::fail(loc, "ZeroRedundancyOptimizer", cat("parameter ", i, " is an empty tensor"),
                 "Pass the model's parameters()");
  Shard s;
  s.load.assign(static_cast<size_t>(world), 0);
  // A parameter larger than an even share is split over the ranks.
  detail::Layout layout = detail::split_layout(detail::sizes_of(params), world);
  s.owners = std::move(layout.owners);
  s.runs = std::move(layout.runs);
  s.load = std::move(layout.load);
  s.local_of.assign(params.size(), -1);
  std::vector<Tensor> mine;
  for (size_t i = 0; i < params.size(); ++i) {
    if (s.owners[i] < 0) {
      // This rank's run, if it has one: a tensor of its own, its value set from the parameter at
      // each update and dropped after it (under stage 3 it holds it: fully_shard gives it).
      const int64_t n = s.runs[i][static_cast<size_t>(me)].numel;
      if (n == 0) continue;
      Tensor run = zeros({n}, TensorOptions(params[i].dtype(), params[i].device()), loc);
      detail::drop_value(run, loc);
      s.local_of[i] = static_cast<int64_t>(mine.size());
      mine.push_back(run);
    } else if (s.owners[i] == me) {
      s.local_of[i] = static_cast<int64_t>(mine.size());
      mine.push_back(params[i]);
    }
  }
  {
    // With fewer parameters than ranks, some rank owns none: its local optimizer holds the
    // hyper-parameters (a scheduler sets them on every rank) and the groups added later.
    const optim::detail::NoParamsAllowed none_owned;
    s.local = make_local(mine);
  }
  if (!s.local)
    util::fail(loc, "ZeroRedundancyOptimizer", "the local optimizer's function returned none",
               "Return an ls::optim optimizer made over the parameters given");
  const std::vector<Tensor>& got = s.local->params();
  bool same = got.size() == mine.size();
  for (size_t j = 0; same && j < got.size(); ++j) same = got[j].is_same(mine[j]);
  if (!same)
    util::fail(loc, "ZeroRedundancyOptimizer",
               cat("the local optimizer holds ", got.size(), " parameters, not the ", mine.size(),
                   " this rank was given, in their order"),
               "Build it over exactly the parameters its function receives");
  s.params = std::move(params);
  return s;
}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<Tensor> params,
                                                 const LocalFactory& make_local,
                                                 ZeroOptions options, Loc loc)
    : ZeroRedundancyOptimizer(partition(std::move(params), make_local, options, loc), options) {}

std::shared_ptr<ZeroRedundancyOptimizer> ZeroRedundancyOptimizer::sharding(
    std::vector<Tensor> params, const LocalFactory& make_local, ZeroOptions options,
    const Loc& loc) {
  options.stage = 3;
  return std::shared_ptr<ZeroRedundancyOptimizer>(new ZeroRedundancyOptimizer(
      partition(std::move(params), make_local, options, loc, true), options));
}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(Shard shard, ZeroOptions options)
    : Optimizer(shard.params, shard.local->lr(), options.skip_nonfinite),
      local_(std::move(shard.local)),
      owners_(std::move(shard.owners)),
      runs_(std::move(shard.runs)),
      local_of_(std::move(shard.local_of)),
      load_(std::move(shard.load)),
      stage_(options.stage),
      reshard_after_forward_(options.reshard_after_forward),
      max_grad_norm_(options.max_grad_norm),
      bucket_bytes_(options.bucket_bytes) {
  set_default_weight_decay(local_->group_weight_decay(0));
  global_of_.resize(local_->params().size());
  for (size_t i = 0; i < local_of_.size(); ++i)
    if (local_of_[i] >= 0) global_of_[static_cast<size_t>(local_of_[i])] = i;
}

ZeroRedundancyOptimizer::Run ZeroRedundancyOptimizer::run(size_t i) const {
  return owners_[i] < 0 ? runs_[i][static_cast<size_t>(rank())] : Run{};
}

void ZeroRedundancyOptimizer::update(size_t i, const Tensor& grad, const Tensor& t,
                                     const Tensor& ok) {
  if (const int64_t j = local_of_[i]; j >= 0) {
    // Under stage 3 the owner updates its own value (not a gather), or this rank its run of a
    // split parameter, work no other rank does.
    std::optional<runtime::OwnValues> own;
    std::optional<ir::RankLocal> mine;
    if (stage_ == 3) own.emplace(), mine.emplace();
    // A split parameter under stages 1 and 2: this rank's run, from the parameter as it is,
    // updated with the run's gradient (`grad`). Its value is the parameter's slice itself, not a
    // copy: the program reads the run where the parameter holds it. (Under stage 3 the run holds
    // its own value.)
    if (owners_[i] < 0 && stage_ < 3)
      runtime::set_value(*local_->params_[static_cast<size_t>(j)].impl(),
                         runtime::current_node(*run_values(params_[i], run(i)).impl()),
                         "ZeroRedundancyOptimizer", Loc::current());
    // This group's hyper-parameters as they are now (a scheduler sets them on this optimizer).
    Group& g = local_->groups_[local_->group_of_[static_cast<size_t>(j)]];
    g.lr = lr_of(i);
    g.weight_decay = weight_decay_of(i);
    local_->update(static_cast<size_t>(j), grad, t, ok);
  }
  // Stage 3: no other rank holds or needs the value until the next gather.
  if (stage_ == 3) return;
  // Broadcasts in one order on every rank, after every gradient's all-reduce (or reduce) and the
  // step's other collectives: the first of a step after all the gradients (the last parameter's
  // first, as backward makes them), each other after the one before it. Without it, a rank that
  // only receives a parameter would broadcast it as soon as the step starts, its owner only after
  // the update.
  std::vector<Tensor> after;
  size_t first = 0;
  while (first < reduced_.size() && !reduced_[first].defined()) ++first;
  if (i == first) {
    after = step_collectives();
  } else {
    after.push_back(params_[last_]);  // its value is the previous broadcast's
  }
  if (owners_[i] < 0)
    join_runs(i, std::move(after));
  else
    params_[i].copy_(broadcast(params_[i], owners_[i], after));
  last_ = i;
}

void ZeroRedundancyOptimizer::join_runs(size_t i, std::vector<Tensor> after) {
  const int me = rank();
  std::vector<Tensor> runs;
  for (size_t r = 0; r < runs_[i].size(); ++r) {
    if (runs_[i][r].numel == 0) continue;
    // Each rank's run from it (the others send theirs; this rank's slot is overwritten).
    const Tensor mine = static_cast<int>(r) == me
                            ? local_->params_[static_cast<size_t>(local_of_[i])]
                            : run_values(params_[i], runs_[i][r]);
    runs.push_back(broadcast(mine, static_cast<int>(r), after));
    after = {runs.back()};
  }
  params_[i].copy_(reshape(concat(runs, 0), params_[i].shape()));
}

std::vector<Tensor> ZeroRedundancyOptimizer::step_collectives() const {
  std::vector<Tensor> out;
  for (size_t k = reduced_.size(); k-- > 0;) {
    if (k < run_reduces_.size() && !run_reduces_[k].empty())
      out.insert(out.end(), run_reduces_[k].begin(), run_reduces_[k].end());
    else if (reduced_[k].defined())
      out.push_back(reduced_[k]);
  }
  out.insert(out.end(), globals_.begin(), globals_.end());
  return out;
}

std::vector<Tensor> ZeroRedundancyOptimizer::reduce_to_owners() {
  const Loc loc = Loc::current();
  const char* const op = "ZeroRedundancyOptimizer";
  const auto n = static_cast<int64_t>(params_.size());
  const DataParallelOptions defaults;
  std::vector<Tensor> reduced(params_.size());
  run_reduces_.assign(params_.size(), {});
  for (int64_t k = 0; k < n; ++k) {
    Tensor p = params_[static_cast<size_t>(k)];
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    // In the order backward makes them, bucketed as DataParallel's; a gradient DataParallel's
    // average_gradients is about to all-reduce is reduced instead, from what it would sum.
    ir::AllReduceAttrs attrs{
        .scale = 1.0 / world_size(),
        .order = n - 1 - k,
        .bucket_bytes = bucket_bytes_,
        .first_bucket_bytes = std::min(defaults.first_bucket_bytes, bucket_bytes_),
        .root = owners_[static_cast<size_t>(k)]};
    Tensor local = g;
    const ir::NodePtr node = frontend::node(g, op, loc);
    if (node->op == ir::Op::AllReduce) {
      const ir::AllReduceAttrs averaged = ir::AllReduceAttrs::of(node->attrs);
      if (averaged.order >= 0 && averaged.root < 0 && !averaged.local) {
        attrs.scale = averaged.scale;
        local = runtime::new_tensor(node->operands[0]);
      }
    }
    const auto i = static_cast<size_t>(k);
    if (owners_[i] < 0) {
      // Each run to its rank (reduces in one bucket); this rank keeps its own. A rank without a
      // run of it holds the first (only ordered by it, as the other ranks' reduces).
      for (size_t r = 0; r < runs_[i].size(); ++r) {
        if (runs_[i][r].numel == 0) continue;
        attrs.root = static_cast<int64_t>(r);
        run_reduces_[i].push_back(
            detail::record_all_reduce(run_values(local, runs_[i][r]), attrs, op, loc));
        if (static_cast<int>(r) == rank() || !reduced[i].defined())
          reduced[i] = run_reduces_[i].back();
      }
      p.set_grad(Tensor());
      continue;
    }
    reduced[i] = detail::record_all_reduce(local, attrs, op, loc);
    p.set_grad(owners_[i] == rank() ? reduced[i] : Tensor());
  }
  return reduced;
}

Tensor ZeroRedundancyOptimizer::after_reduces(const Tensor& share) const {
  if (std::find(load_.begin(), load_.end(), 0) == load_.end()) return share;
  return share +
         broadcast(zeros({}, TensorOptions(share.dtype(), share.device())), 0, step_collectives());
}

void ZeroRedundancyOptimizer::clip(std::vector<Tensor>& grads) {
  if (world_size() == 1) {
    grad_norm_ = optim::clip_grad_norm_(params_, max_grad_norm_);
    for (size_t i = 0; i < params_.size(); ++i) grads[i] = params_[i].grad();
    return;
  }
  // The global norm from each rank's sum of squares over the gradients it owns; each rank then
  // scales its own (as clip_grad_norm_ does all of them). The dtype from every rank's gradients
  // (the all-reduces or reduces, which all hold), so that the ranks' sums agree. Under stage 1
  // every rank holds every gradient, but scales only its own: one it scaled and does not update
  // would be kept computed from the step's collectives on this rank, and feed only this rank's
  // update and broadcast on its owner, so the ranks' programs would differ (comm_agree.cpp).
  // This rank's gradients: those of its parameters and of its runs of split ones.
  const std::vector<Tensor>& mine = local_->params();
  const DType dt = optim::detail::norm_dtype(reduced_);
  Tensor sq = optim::detail::grad_square_sum(mine, dt);
  if (!sq.defined()) sq = zeros({}, TensorOptions(dt, params_[0].device()));
  grad_norm_ = sqrt(detail::record_all_reduce(after_reduces(sq), {.local = true},
                                              "ZeroRedundancyOptimizer", Loc::current()));
  globals_.push_back(grad_norm_);
  optim::detail::scale_grads_to(mine, grad_norm_, max_grad_norm_);
  for (size_t i = 0; i < params_.size(); ++i) {
    if (owners_[i] < 0 && local_of_[i] >= 0 && grads[i].defined())
      grads[i] = local_->params_[static_cast<size_t>(local_of_[i])].grad();
    else if (Tensor g = params_[i].grad(); g.defined() && owners_[i] == rank())
      grads[i] = g;
  }
}

std::vector<Tensor> ZeroRedundancyOptimizer::step_gradients() {
  globals_.clear();
  run_reduces_.clear();
  const bool reduces = stage_ >= 2 && world_size() > 1;
  reduced_ = reduces ? reduce_to_owners() : Optimizer::step_gradients();
  std::vector<Tensor> grads = reduced_;
  // A split parameter's gradient is its run's on each rank, which the run's tensor holds (the
  // reduce's under stage 2, the run of the whole under stage 1); a rank without a run keeps
  // one defined (it takes part in the broadcasts) but updates nothing with it.
  for (size_t i = 0; i < params_.size(); ++i) {
    if (owners_[i] >= 0 || local_of_[i] < 0 || !reduced_[i].defined()) continue;
    Tensor piece = local_->params_[static_cast<size_t>(local_of_[i])];
    grads[i] = reduces ? reduced_[i] : run_values(reduced_[i], run(i));
    piece.set_grad(grads[i]);
  }
  if (max_grad_norm_ > 0) clip(grads);
  return grads;
}

void ZeroRedundancyOptimizer::end_step() {
  if (stage_ == 3) {
    // Every rank's program runs every reduce, though only the owners read theirs: a broadcast of
    // nothing, ordered after them (and the norm and the count), which the step computes.
    const std::vector<Tensor> after = step_collectives();
    if (!after.empty()) {
      fence_ = broadcast(zeros({}, TensorOptions(DType::F32, params_[0].device())), 0, after);
      fence_.impl()->anchor = true;
    }
    for (const Tensor& p : params_) runtime::drop_gathered(*p.impl());
  }
  // The runs of split parameters hold no value between steps (but under stage 3, where they
  // are the parameter's); under stage 1 no gradient either (the whole ones hold theirs).
  for (size_t i = 0; i < params_.size(); ++i) {
    if (owners_[i] >= 0 || local_of_[i] < 0 || stage_ == 3) continue;
    Tensor piece = local_->params_[static_cast<size_t>(local_of_[i])];
    detail::drop_value(piece, Loc::current());
    if (stage_ == 1) piece.set_grad(Tensor());
  }
  reduced_.clear();
  run_reduces_.clear();
  globals_.clear();
}

Tensor ZeroRedundancyOptimizer::count_nonfinite(const std::vector<Tensor>& grads,
                                                const Tensor& loss) {
  // Stage 1: every rank holds every gradient whole (`grads` holds only this rank's runs of the
  // split ones); the same count on every rank.
  if (stage_ == 1 || world_size() == 1) return Optimizer::count_nonfinite(reduced_, loss);
  // Each rank counts in the gradients it owns and its runs (and its own loss); the sum is every
  // rank's.
  std::vector<Tensor> mine(grads.size());
  for (size_t i = 0; i < grads.size(); ++i)
    if (owners_[i] == rank() || (owners_[i] < 0 && local_of_[i] >= 0)) mine[i] = grads[i];
  Tensor bad =
      detail::record_all_reduce(after_reduces(Optimizer::count_nonfinite(mine, loss)),
                                {.local = true}, "ZeroRedundancyOptimizer", Loc::current());
  globals_.push_back(bad);
  return bad;
}

nn::NamedTensors ZeroRedundancyOptimizer::state() const {
  // The local optimizer names its buffers by its own indices ("3.exp_avg"): by params()' here.
  nn::NamedTensors out;
  for (auto& [name, t] : local_->state()) {
    const size_t dot = name.find('.');
    const size_t j = std::stoul(name.substr(0, dot));
    out.emplace_back(cat(global_of_.at(j), name.substr(dot)), t);
  }
  return out;
}

void ZeroRedundancyOptimizer::add_state(size_t i) {
  // A parameter of an added group: to the lightest rank, as the constructor's.
  const int r = detail::partition_by_size({params_[i].numel()}, load_)[0];
  owners_.push_back(r);
  local_of_.push_back(-1);
  if (stage_ == 3) detail::shard_added(params_[i], r, reshard_after_forward_, Loc::current());
  if (r != rank()) return;
  local_->add_param_group({{params_[i]}, lr_of(i), weight_decay_of(i)});
  local_of_.back() = static_cast<int64_t>(local_->params().size()) - 1;
  global_of_.push_back(i);
}

void ZeroRedundancyOptimizer::zero_grad() {
  Optimizer::zero_grad();
  for (Tensor& p : local_->params_) p.set_grad(Tensor());
}

int64_t ZeroRedundancyOptimizer::local_grad_numel() const {
  int64_t n = 0;
  for (const Tensor& p : stage_ == 1 ? params_ : local_->params())
    if (p.grad().defined()) n += p.grad().numel();
  return n;
}

int64_t ZeroRedundancyOptimizer::local_state_numel() const {
  int64_t n = 0;
  for (const auto& [name, t] : local_->state()) n += t.numel();
  return n;
}

double ZeroRedundancyOptimizer::momentum() const { return local_->momentum(); }
void ZeroRedundancyOptimizer::set_momentum(double momentum) { local_->set_momentum(momentum); }

}  // namespace lockstep::dist
