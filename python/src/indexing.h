// Tensor's indexing methods (indexing.cpp): __getitem__ and __setitem__ as PyTorch's, index_put
// and index_put_, and lockstep.index_put.
#pragma once

#include "common.h"

namespace lockstep::python {

// Adds them to `t`, the class lockstep.Tensor of `m` (from init_tensor).
void init_indexing(py::module_& m, py::class_<Tensor>& t);

}  // namespace lockstep::python
