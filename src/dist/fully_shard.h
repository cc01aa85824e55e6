// What fully_shard (fully_shard.cpp) shares with the sharded checkpoints.
#pragma once

#include <vector>

#include "lockstep/loc.h"
#include "lockstep/tensor.h"

namespace lockstep::dist::detail {

// Gives each sharded parameter (TensorImpl::gather_root) this rank does not own a stand-in
// value that takes no memory, in place of the value it holds (after fully_shard's start, or a
// load that gave it the whole value).
void drop_unowned(const std::vector<Tensor>& params, const Loc& loc);
// Gives `t` a stand-in value of its shape that takes no memory (its reads see zeros): a
// sharded parameter this rank does not own, a split parameter's run between steps.
void drop_value(const Tensor& t, const Loc& loc);
// Shards parameter `p`, added to a stage 3 optimizer after fully_shard: every rank takes rank 0's
// value (as fully_shard's start), then only `owner` keeps it (ZeroOptions::reshard_after_forward
// as given).
void shard_added(const Tensor& p, int owner, bool reshard_after_forward, const Loc& loc);

}  // namespace lockstep::dist::detail
