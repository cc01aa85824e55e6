// Autocast (lockstep/autocast.h): the thread's policy, and the casts the frontend inserts by it.
#include "lockstep/autocast.h"

#include <atomic>
#include <memory>
#include <vector>

#include "tensor/frontend.h"
#include "util/check.h"

namespace lockstep {

// One open scope: what it sets, and whether it has ended (on any thread).
struct detail::AutocastEntry {
  std::optional<DType> dtype;
  std::atomic<bool> ended{false};
};

namespace {

// The scopes opened on this thread, innermost last. A scope ended on another thread is only
// marked; this thread drops it when it next looks.
thread_local std::vector<std::shared_ptr<detail::AutocastEntry>> t_scopes;

void drop_ended_innermost() {
  while (!t_scopes.empty() && t_scopes.back()->ended.load(std::memory_order_acquire))
    t_scopes.pop_back();
}

std::optional<DType> current_autocast() {
  if (t_scopes.empty()) return std::nullopt;
  drop_ended_innermost();
  // An enclosing scope may have ended out of order (on another thread): the innermost open one
  // decides.
  for (auto it = t_scopes.rbegin(); it != t_scopes.rend(); ++it)
    if (!(*it)->ended.load(std::memory_order_acquire)) return (*it)->dtype;
  return std::nullopt;
}

}  // namespace

AutocastScope::AutocastScope(DType dtype, Loc loc) {
  if (dtype != DType::BF16 && dtype != DType::F32)
    util::fail(loc, "autocast", util::cat("takes bf16 (on) or f32 (off), got ", dtype_name(dtype)),
               "Use ls::autocast(ls::bf16)");
  entry_ = std::make_shared<detail::AutocastEntry>();
  entry_->dtype = dtype == DType::BF16 ? std::optional<DType>(dtype) : std::nullopt;
  t_scopes.push_back(entry_);
}

AutocastScope::~AutocastScope() {
  entry_->ended.store(true, std::memory_order_release);
  drop_ended_innermost();  // this thread's: the constructing thread's, or nothing of it
}

std::optional<DType> autocast_dtype() { return current_autocast(); }

namespace frontend {

NodePtr autocast_low(const NodePtr& n, const Loc& loc) {
  const std::optional<DType> low = current_autocast();
  if (!low || !is_floating(n->dtype) || n->dtype == *low) return n;
  // A permute still to be computed (a linear layer's transposed weight) is cast below it: the
  // same values, but the permute then moves the narrower ones, and feeding a product it is
  // read through its strides instead of being copied at full width before the cast.
  if (n->op == Op::Permute && !n->grad.fn && n->operands[0]->dtype == n->dtype)
    return make(Op::Permute, {autocast_low(n->operands[0], loc)}, n->attrs, loc, n->shape, *low);
  return cast_node(n, *low, loc);
}

NodePtr autocast_f32(const NodePtr& n, const Loc& loc) {
  const std::optional<DType> low = current_autocast();
  if (!low || n->dtype != *low) return n;
  return cast_node(n, DType::F32, loc);
}

}  // namespace frontend
}  // namespace lockstep
