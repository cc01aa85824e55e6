// The parts of clip_grad_norm_ (lockstep/optim.h), for ZeroRedundancyOptimizer's stage 2, whose
// ranks each hold a share of the gradients: the sum of squares of a share, then the scaling once
// the ranks' sums are added up.
#pragma once

#include <vector>

#include "lockstep/tensor.h"

namespace lockstep::optim::detail {

// The dtype the norm of `grads` is computed in: f64 when any of them is f64.
DType norm_dtype(const std::vector<Tensor>& grads);
// The sum of the squares of the gradients `params` hold, in `dtype`; undefined when none holds one.
Tensor grad_square_sum(const std::vector<Tensor>& params, DType dtype);
// Scales the gradients `params` hold by max_norm / (norm + 1e-6) when that is below 1 (PyTorch's
// rule).
void scale_grads_to(const std::vector<Tensor>& params, const Tensor& norm, double max_norm);

}  // namespace lockstep::optim::detail
