// Autocast (lockstep/autocast.h): the thread's policy, and the casts the frontend inserts by it.
#include "lockstep/autocast.h"

#include "tensor/frontend.h"
#include "util/check.h"

namespace lockstep {
namespace {
thread_local std::optional<DType> t_autocast;
}  // namespace

AutocastScope::AutocastScope(DType dtype, Loc loc) : previous_(t_autocast) {
  if (dtype != DType::BF16 && dtype != DType::F32)
    util::fail(loc, "autocast", util::cat("takes bf16 (on) or f32 (off), got ", dtype_name(dtype)),
               "Use ls::autocast(ls::bf16)");
  t_autocast = dtype == DType::BF16 ? std::optional<DType>(dtype) : std::nullopt;
}

AutocastScope::~AutocastScope() { t_autocast = previous_; }

std::optional<DType> autocast_dtype() { return t_autocast; }

namespace frontend {

NodePtr autocast_low(const NodePtr& n, const Loc& loc) {
  if (!t_autocast || !is_floating(n->dtype) || n->dtype == *t_autocast) return n;
  // A permute still to be computed (a linear layer's transposed weight) is cast below it: the
  // same values, but the permute then moves the narrower ones, and feeding a product it is
  // read through its strides instead of being copied at full width before the cast.
  if (n->op == Op::Permute && !n->grad.fn && n->operands[0]->dtype == n->dtype)
    return make(Op::Permute, {autocast_low(n->operands[0], loc)}, n->attrs, loc, n->shape,
                *t_autocast);
  return cast_node(n, *t_autocast, loc);
}

NodePtr autocast_f32(const NodePtr& n, const Loc& loc) {
  if (!t_autocast || n->dtype != *t_autocast) return n;
  return cast_node(n, DType::F32, loc);
}

}  // namespace frontend
}  // namespace lockstep
