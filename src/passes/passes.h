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
// graph output; a cast next to a permute moves to the permute's other side where that puts the
// permute beside a matmul (a cast of a transposed weight, a permute of a widened product), so a
// backend folds it into the product. Leaves dead nodes behind (cse removes them).
ir::Graph simplify(const ir::Graph& g);

// Gathers of sharded parameters (Broadcast with gather 1: ls::dist::fully_shard; a split
// parameter's, its runs' broadcasts joined by a concatenation and a reshape) read by both the
// forward and the backward run again just before the backward's first read, which then reads the
// second: the gathered parameter lives while the forward uses it and again while the backward
// does, not from one to the other (FSDP's reshard after forward). Every rank runs the same pass
// on the same collectives, so they stay in one order.
ir::Graph regather(const ir::Graph& g);

// Constant folding, the plan: the values that depend on nothing supplied at run time (no
// buffer, host scalar or random key; index ramps and what is computed from them alone), and of
// those the ones a backend computes once at compile time and keeps: each read by a value that is
// computed at run time. Outputs and values over max_bytes are computed at run time (an output
// must be fresh memory; a huge broadcast is cheaper to recompute than to keep), from folded
// operands.
struct Constants {
  std::vector<bool> constant;  // per node
  std::vector<bool> run_time;  // per node: computed at run time (not constant, an output, or big)
  std::vector<int32_t> fold;   // in graph order
};
Constants find_constants(const ir::Graph& g, size_t max_bytes);

}  // namespace lockstep::passes
