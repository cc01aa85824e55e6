// One gradient rule per primitive op: given a recorded node and the gradient of its value,
// the gradients of its operands, written with recorded ops (so they become part of the step).
#pragma once

#include <functional>
#include <vector>

#include "ir/ir.h"
#include "lockstep/tensor.h"

namespace lockstep::autograd {

// Gradients for n's operands (an empty Tensor where an operand gets none). Called with
// gradient recording off. Throws InternalError for a differentiable op without a rule.
std::vector<Tensor> operand_grads(const ir::NodePtr& n, const Tensor& g);

// `value`, computed from `inputs` with gradient recording off, as a tensor whose gradients
// with respect to `inputs` are fn(gradient of value): a composite op's own backward, shorter
// than the one the primitives would give (batch norm). fn runs with recording off and returns
// one gradient per input (undefined: none). Without grad mode or an input requiring grad, it
// returns `value` itself.
Tensor with_grad_fn(const Tensor& value, const std::vector<Tensor>& inputs,
                    std::function<std::vector<Tensor>(const Tensor&)> fn, const Loc& loc);

// A value a gradient function keeps for backward (with_grad_fn): it holds the value as recorded,
// not a live tensor, which every sync would compute and store as if the user held it. Undefined
// when made from an undefined tensor.
class SavedValue {
 public:
  SavedValue() = default;
  SavedValue(const Tensor& value, const char* op, const Loc& loc);
  bool defined() const { return node_ != nullptr; }
  DType dtype() const { return node_->dtype; }
  // The value, as a tensor to compute the gradient with.
  Tensor get() const;

 private:
  ir::NodePtr node_;
};

// `g` summed over the dimensions that broadcasting added or stretched, down to `shape`.
Tensor sum_to_shape(const Tensor& g, const Shape& shape, const Loc& loc);

}  // namespace lockstep::autograd
