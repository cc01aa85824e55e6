// The `ref` backend: naive loops over every op and dtype, obviously correct, never optimized.
// It is the oracle every other backend is tested against.
#pragma once

#include "backends/backend.h"

namespace lockstep::backends::ref {

Backend& backend();

}  // namespace lockstep::backends::ref
