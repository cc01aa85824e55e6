// What ZeroRedundancyOptimizer needs of the optimizers beyond lockstep/optim.h: the parts of
// clip_grad_norm_, for stage 2, whose ranks each hold a share of the gradients (the sum of squares
// of a share, then the scaling once the ranks' sums are added up); and local optimizers over no
// parameters, for a rank that owns none.
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

// While alive, optimizers made on this thread may have no parameters (a ZeRO rank that owns none
// keeps a local optimizer for its hyper-parameters and the groups added later); elsewhere that is
// an Error.
class NoParamsAllowed {
 public:
  NoParamsAllowed();
  ~NoParamsAllowed();
  NoParamsAllowed(const NoParamsAllowed&) = delete;
  NoParamsAllowed& operator=(const NoParamsAllowed&) = delete;
};

}  // namespace lockstep::optim::detail
