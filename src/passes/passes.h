// Graph-to-graph passes, each a small function tested as IR text in, IR text out.
#pragma once

#include "ir/ir.h"

namespace lockstep::passes {

// Common-subexpression elimination: nodes with the same op, operands, attributes, shape and
// dtype become one. Host scalars are never merged (their values differ from run to run).
// Removes nodes no output needs.
ir::Graph cse(const ir::Graph& g);

}  // namespace lockstep::passes
