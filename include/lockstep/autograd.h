// Reverse-mode autograd over lazy tensors. Gradients are more recorded IR, so a step's forward,
// backward and optimizer update land in one program. Autograd history lives within a step: the
// step's entry and exit syncs end it (a read inside the step does not).
#pragma once

#include "lockstep/tensor.h"

namespace lockstep {

// Ops recorded while a NoGrad is alive (on this thread) record no gradient information; what
// optimizers and running-statistics updates use.
class NoGrad {
 public:
  NoGrad();
  ~NoGrad();
  NoGrad(const NoGrad&) = delete;
  NoGrad& operator=(const NoGrad&) = delete;

 private:
  bool previous_;
};

bool is_grad_enabled();

// Accumulates d(output)/d(leaf) into leaf.grad() for every leaf that requires grad and that
// `output` depends on. Without grad_output, output must have one element (a loss).
void backward(const Tensor& output, const Tensor& grad_output = Tensor(), Loc loc = Loc::current());

}  // namespace lockstep
