// Typed views of Node::attrs for the ops whose attributes are a record of several fields: the one
// place that knows which int64 means what. Ops read them with `X::of(node.attrs)` and record them
// with `x.encode()`; a malformed list is our bug (an InternalError), never the user's.
// Not for single-field attributes (an axis), which ir.h lists per op.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

#include "util/check.h"

namespace lockstep::ir {

// Conv2d, Conv2dBackwardInput, Conv2dBackwardWeight.
struct ConvAttrs {
  std::array<int64_t, 2> stride{1, 1};
  std::array<int64_t, 2> padding{0, 0};
  std::array<int64_t, 2> dilation{1, 1};
  int64_t groups = 1;

  static ConvAttrs of(const std::vector<int64_t>& a) {
    LS_INTERNAL_CHECK(a.size() == 7, "convolution attrs: expected 7, got ", a.size());
    return {{a[0], a[1]}, {a[2], a[3]}, {a[4], a[5]}, a[6]};
  }
  std::vector<int64_t> encode() const {
    return {stride[0], stride[1], padding[0], padding[1], dilation[0], dilation[1], groups};
  }
};

// MaxPool2d, MaxPool2dIndices, MaxPool2dBackward, AvgPool2d, AvgPool2dBackward.
struct PoolAttrs {
  std::array<int64_t, 2> kernel{2, 2};
  std::array<int64_t, 2> stride{2, 2};  // resolved: never 0
  std::array<int64_t, 2> padding{0, 0};
  bool count_include_pad = true;  // average pooling only

  static PoolAttrs of(const std::vector<int64_t>& a) {
    LS_INTERNAL_CHECK(a.size() == 7, "pooling attrs: expected 7, got ", a.size());
    return {{a[0], a[1]}, {a[2], a[3]}, {a[4], a[5]}, a[6] != 0};
  }
  std::vector<int64_t> encode() const {
    return {kernel[0],
            kernel[1],
            stride[0],
            stride[1],
            padding[0],
            padding[1],
            count_include_pad ? 1 : 0};
  }
};

// Lstm, LstmBackward, Gru, GruBackward: the direction (reverse: from the last time step to the
// first, as PyTorch's `_reverse` layers).
struct RnnAttrs {
  bool reverse = false;

  static RnnAttrs of(const std::vector<int64_t>& a) {
    LS_INTERNAL_CHECK(a.size() == 1, "recurrent layer attrs: expected 1, got ", a.size());
    return {a[0] != 0};
  }
  std::vector<int64_t> encode() const { return {reverse ? 1 : 0}; }
};

// Where LstmBackward's or GruBackward's result holds each gradient, for T time steps, batch N,
// input size I and hidden size H: the gradients of the layer's operands (x, h0, c0 for an LSTM,
// w_ih, w_hh, b) start at [0], [1], ... one after the other, and the last entry is the length of
// the whole.
inline std::vector<int64_t> rnn_grad_offsets(bool lstm, int64_t t, int64_t n, int64_t i,
                                             int64_t h) {
  const int64_t g = lstm ? 4 : 3;  // gates
  std::vector<int64_t> sizes{t * n * i, n * h, g * h * i, g * h * h, 4 * h};
  if (lstm) sizes.insert(sizes.begin() + 2, n * h);
  std::vector<int64_t> at(sizes.size() + 1, 0);
  for (size_t k = 0; k < sizes.size(); ++k) at[k + 1] = at[k] + sizes[k];
  return at;
}

// Slice: normalized, 0 <= start, end <= size, step > 0.
struct SliceAttrs {
  int64_t axis = 0, start = 0, end = 0, step = 1;

  static SliceAttrs of(const std::vector<int64_t>& a) {
    LS_INTERNAL_CHECK(a.size() == 4, "slice attrs: expected 4, got ", a.size());
    return {a[0], a[1], a[2], a[3]};
  }
  std::vector<int64_t> encode() const { return {axis, start, end, step}; }
};

// AllReduce: the sum over the ranks times `scale`. order >= 0: a gradient DataParallel (or
// ZeroRedundancyOptimizer) averages, bucketed with the others by the backend, buckets closing at
// `bucket_bytes` (the first at `first_bucket_bytes`); order -1: on its own. root >= 0: a reduce,
// whose sum only rank `root` receives (on the other ranks the value is not meaningful: it only
// orders what reads it). local: each rank's operand is its own share (a partial sum over the
// parameters it owns), which the ranks' agreement does not compare.
struct AllReduceAttrs {
  double scale = 1;
  int64_t order = -1, bucket_bytes = 0, first_bucket_bytes = 0, root = -1;
  bool local = false;

  static AllReduceAttrs of(const std::vector<int64_t>& a) {
    AllReduceAttrs r;
    if (a.empty()) return r;  // a plain sum, as recorded before buckets existed
    LS_INTERNAL_CHECK(a.size() == 4 || a.size() == 6, "all_reduce attrs: expected 6, got ",
                      a.size());
    std::memcpy(&r.scale, &a[0], sizeof r.scale);
    r.order = a[1], r.bucket_bytes = a[2], r.first_bucket_bytes = a[3];
    if (a.size() == 6) r.root = a[4], r.local = a[5] != 0;
    return r;
  }
  std::vector<int64_t> encode() const {
    int64_t bits = 0;
    std::memcpy(&bits, &scale, sizeof bits);
    return {bits, order, bucket_bytes, first_bucket_bytes, root, local ? 1 : 0};
  }
};

// Broadcast: [root], or [root, gather] for a sharded parameter's gather (fully_shard): Again, the
// backward may read a second one made just before it (passes::regather); Kept, the backward reads
// this one too.
struct BroadcastAttrs {
  enum class Gather : int64_t { None = 0, Again = 1, Kept = 2 };
  int64_t root = 0;
  Gather gather = Gather::None;

  static BroadcastAttrs of(const std::vector<int64_t>& a) {
    LS_INTERNAL_CHECK(a.size() == 1 || a.size() == 2, "broadcast attrs: expected 1 or 2, got ",
                      a.size());
    return {a[0], a.size() == 2 ? static_cast<Gather>(a[1]) : Gather::None};
  }
  std::vector<int64_t> encode() const {
    if (gather == Gather::None) return {root};
    return {root, static_cast<int64_t>(gather)};
  }
};

}  // namespace lockstep::ir
