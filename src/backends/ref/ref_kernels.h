// Shared pieces of the ref backend's kernels: a plain array view, index helpers (dtype dispatch:
// backends/by_dtype.h, bf16 never dispatched: widened to f32 before any kernel sees it).
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "backends/backend.h"
#include "backends/by_dtype.h"
#include "ir/ir.h"
#include "lockstep/error.h"

namespace lockstep::backends::ref {

// A contiguous row-major array.
struct Arr {
  const void* data;
  Shape shape;
  DType dtype;
  template <typename T>
  const T* as() const {
    return static_cast<const T*>(data);
  }
};

inline std::vector<int64_t> strides_of(const Shape& shape) {
  std::vector<int64_t> s(shape.size());
  int64_t acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    s[i] = acc;
    acc *= shape[i];
  }
  return s;
}

// Walks a row-major index over `shape`, keeping an offset into another array with `strides`
// (one per dim; 0 for a broadcast dim).
struct IndexWalker {
  const Shape& shape;
  std::vector<int64_t> idx;
  const std::vector<int64_t>& strides;
  int64_t offset;
  IndexWalker(const Shape& s, const std::vector<int64_t>& st, int64_t base)
      : shape(s), idx(s.size(), 0), strides(st), offset(base) {}
  // In two's complement (unsigned) arithmetic: past the last index of a dim the offset may step
  // out of range (a slice's step near 2^63) before it is taken back, and only the offsets of
  // real indices are ever read.
  void next() {
    for (size_t d = shape.size(); d-- > 0;) {
      offset = wrap(static_cast<uint64_t>(offset) + static_cast<uint64_t>(strides[d]));
      if (++idx[d] < shape[d]) return;
      offset = wrap(static_cast<uint64_t>(offset) -
                    static_cast<uint64_t>(strides[d]) * static_cast<uint64_t>(shape[d]));
      idx[d] = 0;
    }
  }
  static int64_t wrap(uint64_t v) { return static_cast<int64_t>(v); }
};

// Copies numel(out_shape) elements of `elem` bytes from src (walked with src_strides from
// src_offset, in elements) to a contiguous dst.
void strided_copy(void* dst, const void* src, const Shape& out_shape,
                  const std::vector<int64_t>& src_strides, int64_t src_offset, size_t elem);

// Evaluates one node into `out` (allocated with the node's shape and dtype): the ref semantics
// of every op, also what other backends fall back to for what they do not specialize.
void eval_node(const ir::GraphNode& n, const std::vector<Arr>& args,
               const std::vector<ir::ScalarValue>& scalars, void* out);

// Kernels for the heavy and indexing ops (ref_nn.cpp). Each writes `out`, already allocated
// with the node's shape and dtype.
void matmul(const ir::GraphNode& n, const Arr& a, const Arr& b, void* out);
void conv2d(const ir::GraphNode& n, const Arr& x, const Arr& w, void* out);
void conv2d_backward_input(const ir::GraphNode& n, const Arr& gy, const Arr& w, void* out);
void conv2d_backward_weight(const ir::GraphNode& n, const Arr& x, const Arr& gy, void* out);
void max_pool2d(const ir::GraphNode& n, const Arr& x, void* out, bool indices);
void max_pool2d_backward(const ir::GraphNode& n, const Arr& gy, const Arr& idx, void* out);
void avg_pool2d(const ir::GraphNode& n, const Arr& x, void* out);
void avg_pool2d_backward(const ir::GraphNode& n, const Arr& gy, void* out);
void gather(const ir::GraphNode& n, const Arr& x, const Arr& idx, void* out);
// Throws BackendError unless every i64 value of `index` is in [0, size): the check of gather
// and scatter_add along an axis of `size` (also run ahead of them by the cpu backend).
void check_indices(const char* op, const Arr& index, ir::IndexBound bound);
void scatter_add(const ir::GraphNode& n, const Arr& x, const Arr& idx, const Arr& src, void* out);
// One LSTM layer (operands x, h0, c0, w_ih, w_hh, b) and its gradient (those, the layer's value
// and its gradient); ref_rnn.cpp.
void lstm(const ir::GraphNode& n, const std::vector<Arr>& a, void* out);
void lstm_backward(const ir::GraphNode& n, const std::vector<Arr>& a, void* out);
// One GRU layer (x, h0, w_ih, w_hh, b) and its gradient (those, its value and its gradient).
void gru(const ir::GraphNode& n, const std::vector<Arr>& a, void* out);
void gru_backward(const ir::GraphNode& n, const std::vector<Arr>& a, void* out);
// Stable sort positions along attrs[0] (descending when attrs[1]); NaN above every number.
void argsort(const ir::GraphNode& n, const Arr& x, void* out);

}  // namespace lockstep::backends::ref
