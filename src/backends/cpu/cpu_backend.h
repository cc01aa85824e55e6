// The `cpu` backend: what users run. Heavy ops through oneDNN, elementwise trees fused into
// single tiled passes, a compile-time memory plan with buffer reuse in one arena, OpenMP
// threads. What those do not take (other dtypes, empty shapes, rare geometries) runs the kernels
// for every dtype (typed_kernels.h): no op runs a ref kernel here.
#pragma once

#include "backends/backend.h"

namespace lockstep::backends::cpu {

Backend& backend();
// Threads the cpu backend's programs use (0: OpenMP's default, OMP_NUM_THREADS or every core).
// A program runs with the count in force when it was compiled; a new count compiles again.
void set_num_threads(int n);
int num_threads();

}  // namespace lockstep::backends::cpu
