// The ops of lockstep/dist.h (all_reduce, broadcast: lazy nodes), value hashes checked across
// the ranks, and DataParallel.
#include <cstring>

#include "dist/comm.h"
#include "dist/ops.h"
#include "ir/attrs.h"
#include "lockstep/autograd.h"
#include "lockstep/dist.h"
#include "lockstep/nn.h"
#include "lockstep/runtime.h"
#include "tensor/frontend.h"
#include "util/check.h"

namespace lockstep::dist {

using util::cat;

Tensor detail::record_all_reduce(const Tensor& x, const ir::AllReduceAttrs& attrs, const char* op,
                                 const Loc& loc) {
  if (!is_floating(x.dtype()) && attrs.scale != 1)
    util::fail(loc, op, cat("scale ", attrs.scale, " of ", dtype_name(x.dtype()), " values"),
               "Integer sums take no scale: cast to ls::f32 first, or pass scale 1");
  return frontend::record(ir::Op::AllReduce, {frontend::node(x, op, loc)}, attrs.encode(), loc,
                          x.shape(), x.dtype());
}

namespace {

// What a replica holds: the parameters, then the buffers.
std::vector<Tensor> state_of(const nn::Module& model) {
  std::vector<Tensor> state = model.parameters();
  for (const Tensor& b : model.buffers()) state.push_back(b);
  return state;
}

uint64_t fnv1a(const unsigned char* p, size_t n, uint64_t h) {
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

}  // namespace

Tensor all_reduce(const Tensor& x, double scale, Loc loc) {
  return detail::record_all_reduce(x, {.scale = scale}, "dist::all_reduce", loc);
}

Tensor broadcast(const Tensor& x, int root, Loc loc) { return broadcast(x, root, {}, loc); }

Tensor broadcast(const Tensor& x, int root, const std::vector<Tensor>& after, Loc loc) {
  if (root < 0 || root >= world_size())
    util::fail(loc, "dist::broadcast", cat("root rank ", root, " of a world of ", world_size()),
               cat("Use a rank in [0, ", world_size(), ")"));
  std::vector<ir::NodePtr> operands;
  for (const Tensor& t : after) operands.push_back(frontend::node(t, "dist::broadcast", loc));
  operands.push_back(frontend::node(x, "dist::broadcast", loc));
  return frontend::record(ir::Op::Broadcast, std::move(operands), {root}, loc, x.shape(),
                          x.dtype());
}

uint64_t hash_values(const std::vector<Tensor>& tensors, Loc loc) {
  uint64_t h = 1469598103934665603ull;
  for (const Tensor& t : tensors) {
    const std::vector<unsigned char> bytes = runtime::read_bytes(t, loc, "dist::hash_values");
    h = fnv1a(bytes.data(), bytes.size(), h);
    const uint64_t n = bytes.size();
    h = fnv1a(reinterpret_cast<const unsigned char*>(&n), sizeof n, h);
  }
  return h;
}

DataParallel::DataParallel(nn::Module& model, DataParallelOptions options, Loc loc)
    : model_(&model), options_(options) {
  if (options.bucket_bytes <= 0 || options.first_bucket_bytes <= 0)
    util::fail(loc, "dist::DataParallel",
               cat("bucket sizes must be > 0 bytes, got ", options.bucket_bytes, " and ",
                   options.first_bucket_bytes),
               "Use the defaults (25 MiB, 1 MiB) or other positive sizes");
  if (!initialized()) init();
  if (world_size() == 1) return;
  // Rank 0's parameters and buffers on every rank: one program of broadcasts.
  NoGrad no_grad;
  for (Tensor& t : state_of(model)) t.copy_(broadcast(t, 0, loc), loc);
  sync(loc);
  wait();
}

void DataParallel::average_gradients(Loc loc) {
  const std::vector<Tensor> params = model_->parameters();
  if (world_size() == 1) return;
  const double scale = 1.0 / world_size();
  // Order: the reverse of the parameters' (the order backward computes their gradients), which
  // the backend's bucket pass groups by (see lockstep/dist.h).
  const auto n = static_cast<int64_t>(params.size());
  for (int64_t k = 0; k < n; ++k) {
    Tensor p = params[static_cast<size_t>(k)];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    p.set_grad(detail::record_all_reduce(g,
                                         {.scale = scale,
                                          .order = n - 1 - k,
                                          .bucket_bytes = options_.bucket_bytes,
                                          .first_bucket_bytes = options_.first_bucket_bytes},
                                         "dist::DataParallel", loc),
               loc);
  }
  if (options_.broadcast_buffers) {
    NoGrad no_grad;
    for (Tensor b : model_->buffers()) b.copy_(broadcast(b, 0, loc), loc);
  }
}

uint64_t DataParallel::state_hash(Loc loc) const { return hash_values(state_of(*model_), loc); }

void DataParallel::check_replicas_agree(Loc loc) const {
  try {
    check_same_on_all_ranks(model_->parameters(), "the model's parameters", loc);
  } catch (const Error& e) {
    throw Error(cat(e.what(),
                    ". After training through DataParallel they part when the ranks' updates "
                    "differ: a hyper-parameter or host decision that differs per rank (an lr, a "
                    "step skipped on one rank), or parameters changed outside the steps"));
  }
  if (!options_.broadcast_buffers) return;
  try {
    check_same_on_all_ranks(model_->buffers(), "the model's buffers", loc);
  } catch (const Error& e) {
    throw Error(cat(e.what(),
                    ". DataParallel gives every rank rank 0's buffers in each step's "
                    "average_gradients: buffers changed after it (or outside the steps) part"));
  }
}

}  // namespace lockstep::dist
