// Matching a saved state against a module's or an optimizer's own tensors (shared by
// Module::load_state_dict and Optimizer::load_state_dict).
#pragma once

#include <utility>
#include <vector>

#include "lockstep/nn.h"

namespace lockstep::nn {

// Pairs each tensor of `mine` with the tensor of the same name in `state`, as (destination,
// source). Throws ls::Error listing every mismatched name (dtype or shape) and, when strict,
// every missing and unexpected one: "<what>: mismatched: ... Nothing was loaded. <hint>".
std::vector<std::pair<Tensor, Tensor>> match_state(const NamedTensors& mine,
                                                   const NamedTensors& state, bool strict,
                                                   const char* what, const std::string& hint);

}  // namespace lockstep::nn
