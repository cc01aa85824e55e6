// The whole public API of lockstep. Users write `namespace ls = lockstep;`.
#pragma once

#include "lockstep/dtype.h"
#include "lockstep/error.h"
#include "lockstep/ops.h"
#include "lockstep/runtime.h"
#include "lockstep/tensor.h"
