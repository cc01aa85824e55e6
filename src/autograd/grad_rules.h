// One gradient rule per primitive op: given a recorded node and the gradient of its value,
// the gradients of its operands, written with recorded ops (so they become part of the step).
#pragma once

#include <vector>

#include "ir/ir.h"
#include "lockstep/tensor.h"

namespace lockstep::autograd {

// Gradients for n's operands (an empty Tensor where an operand gets none). Called with
// gradient recording off. Throws InternalError for a differentiable op without a rule.
std::vector<Tensor> operand_grads(const ir::NodePtr& n, const Tensor& g);

// `g` summed over the dimensions that broadcasting added or stretched, down to `shape`.
Tensor sum_to_shape(const Tensor& g, const Shape& shape, const Loc& loc);

}  // namespace lockstep::autograd
