// fully_shard (lockstep/dist.h): ZeRO-3, the parameters sharded over the ranks. The optimizer
// is ZeroRedundancyOptimizer's (zero.cpp) at stage 3; here, the parameters' values are dropped
// by the ranks that do not own them, and their reads become gathers (runtime::node_of).
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dist/fully_shard.h"
#include "lockstep/autograd.h"
#include "lockstep/dist.h"
#include "lockstep/nn.h"
#include "lockstep/runtime.h"
#include "runtime/lazy.h"
#include "util/check.h"

namespace lockstep::dist {

using util::cat;

namespace {

// A sharded parameter's stand-in on the ranks that do not own it: a mapping the size of the
// value that no page backs until written (and nothing writes it: a gather's non-root ranks
// receive into their own result), so it takes no memory; its reads see zeros.
class StandIn final : public backends::Storage {
 public:
  explicit StandIn(size_t bytes) : bytes_(bytes) {
    if (bytes_ == 0) return;
    void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
      throw Error(cat("fully_shard: cannot map ", bytes_, " bytes for a parameter's stand-in (",
                      std::strerror(errno), ")"));
    data_ = p;
  }
  ~StandIn() override {
    if (data_) ::munmap(data_, bytes_);
  }
  StandIn(const StandIn&) = delete;
  StandIn& operator=(const StandIn&) = delete;
  void* data() override { return data_; }
  size_t bytes() const override { return bytes_; }

 private:
  size_t bytes_;
  void* data_ = nullptr;
};

}  // namespace

namespace detail {

namespace {

bool is_stand_in(const ir::NodePtr& value) {
  return value->op == ir::Op::Data && value->binding.buffer &&
         std::dynamic_pointer_cast<StandIn>(value->binding.buffer->storage);
}

ir::NodePtr stand_in(const Shape& shape, DType dtype, Device device,
                     std::shared_ptr<const std::string> name, const Loc& loc) {
  auto buffer = std::make_shared<runtime::Buffer>();
  buffer->device = device;
  buffer->bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  buffer->storage = std::make_shared<StandIn>(buffer->bytes);
  buffer->name = std::move(name);
  buffer->done.store(true);
  return ir::make_data(buffer, shape, dtype, device, loc);
}

// A split parameter given a value of its own (fully_shard's start, a load): this rank's run of it
// into the run's tensor, and the parameter a stand-in again.
void adopt_runs(const Tensor& p) {
  if (is_stand_in(runtime::current_node(*p.impl()))) return;
  const Loc loc = Loc::current();
  const NoGrad no_grad;
  const runtime::OwnValues own_values;  // the value written, not the runs' gather
  const lockstep::detail::TensorImpl::GatherRuns& g = *p.impl()->gather_runs;
  if (Tensor own = g.own; own.defined()) {
    const auto [offset, numel] = g.runs[static_cast<size_t>(rank())];
    own.copy_(slice(reshape(p, {p.numel()}), 0, offset, offset + numel), loc);
  }
  drop_value(p, loc);
}

}  // namespace

void drop_value(const Tensor& t, const Loc& loc) {
  lockstep::detail::TensorImpl& impl = *t.impl();
  if (is_stand_in(runtime::current_node(impl))) return;  // dropped already
  runtime::set_value(impl, stand_in(t.shape(), t.dtype(), t.device(), impl.name, loc),
                     "dist::fully_shard", loc);
}

void drop_unowned(const std::vector<Tensor>& params, const Loc& loc) {
  for (const Tensor& p : params) {
    if (p.impl()->gather_runs)
      adopt_runs(p);
    else if (p.impl()->gather_root >= 0 && p.impl()->gather_root != rank())
      drop_value(p, loc);
  }
}

void shard_added(const Tensor& p, int owner, bool reshard_after_forward, const Loc& loc) {
  {
    const NoGrad no_grad;
    Tensor whole = p;
    whole.copy_(broadcast(p, 0, loc), loc);
  }
  sync(loc);
  p.impl()->gather_root = owner;
  p.impl()->gather_kept = !reshard_after_forward;
  drop_unowned({p}, loc);
}

}  // namespace detail

std::shared_ptr<ZeroRedundancyOptimizer> fully_shard(
    nn::Module& model, const ZeroRedundancyOptimizer::LocalFactory& make_local, ZeroOptions options,
    Loc loc) {
  const char* const op = "dist::fully_shard";
  if (in_step())
    util::fail(loc, op, "called inside a step", "Call it between steps, before training");
  const std::vector<Tensor> params = model.parameters();
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].defined() && params[i].impl()->sharded())
      util::fail(loc, op, cat("parameter ", i, " is sharded already"),
                 "Call fully_shard once per model");
  // Every rank starts from rank 0's values, as under DataParallel.
  { const DataParallel same(model, {}, loc); }
  const std::shared_ptr<ZeroRedundancyOptimizer> opt =
      ZeroRedundancyOptimizer::sharding(params, make_local, options, loc);
  sync(loc);
  for (size_t i = 0; i < params.size(); ++i) {
    lockstep::detail::TensorImpl& impl = *params[i].impl();
    impl.gather_kept = !options.reshard_after_forward;
    if (opt->owners_[i] >= 0) {
      impl.gather_root = opt->owners_[i];
      continue;
    }
    // Split: this rank's run is the local optimizer's tensor; the others' runs, stand-ins.
    auto g = std::make_shared<lockstep::detail::TensorImpl::GatherRuns>();
    for (size_t r = 0; r < opt->runs_[i].size(); ++r) {
      const ZeroRedundancyOptimizer::Run run = opt->runs_[i][r];
      g->runs.emplace_back(run.offset, run.numel);
      const bool mine = static_cast<int>(r) == rank();
      g->others.push_back(mine || run.numel == 0
                              ? nullptr
                              : detail::stand_in({run.numel}, params[i].dtype(), params[i].device(),
                                                 impl.name, loc));
    }
    if (const int64_t j = opt->local_of_[i]; j >= 0) {
      g->own = opt->local_->params()[static_cast<size_t>(j)];
      g->own.impl()->name = impl.name;
    }
    g->adopt = detail::adopt_runs;
    impl.gather_runs = std::move(g);
  }
  detail::drop_unowned(params, loc);
  return opt;
}

}  // namespace lockstep::dist
