// The whole public API of lockstep. Users write `namespace ls = lockstep;`.
#pragma once

#include "lockstep/autocast.h"
#include "lockstep/autograd.h"
#include "lockstep/checkpoint.h"
#include "lockstep/data.h"
#include "lockstep/dist.h"
#include "lockstep/dtype.h"
#include "lockstep/error.h"
#include "lockstep/io.h"
#include "lockstep/models.h"
#include "lockstep/nn.h"
#include "lockstep/ops.h"
#include "lockstep/optim.h"
#include "lockstep/profiler.h"
#include "lockstep/runtime.h"
#include "lockstep/summary.h"
#include "lockstep/tensor.h"
