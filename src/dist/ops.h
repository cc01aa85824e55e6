// The lazy AllReduce node that lockstep/dist.h's all_reduce, DataParallel and
// ZeroRedundancyOptimizer record (ir::AllReduceAttrs: scale, bucket order, reduce root, local).
#pragma once

#include "ir/attrs.h"
#include "lockstep/tensor.h"

namespace lockstep::dist::detail {

// `op` names the caller in errors (an integer sum with a scale is one).
Tensor record_all_reduce(const Tensor& x, const ir::AllReduceAttrs& attrs, const char* op,
                         const Loc& loc);

}  // namespace lockstep::dist::detail
