// Graph-to-graph passes, each a small function tested as IR text in, IR text out.
#pragma once

#include "ir/ir.h"

namespace lockstep::passes {

// Common-subexpression elimination: nodes with the same op, operands, attributes, shape and
// dtype become one. Host scalars are never merged (their values differ from run to run).
// Removes nodes no output needs.
ir::Graph cse(const ir::Graph& g);

// Algebraic simplification: a permute of a permute becomes one permute, a reshape of a reshape
// one reshape, and ops that return their operand unchanged (identity permutes, reshapes and
// expands to the same shape, casts to the same dtype) disappear, except where the value is a
// graph output. Leaves dead nodes behind (cse removes them).
ir::Graph simplify(const ir::Graph& g);

}  // namespace lockstep::passes
