// Helpers shared by the frontend files (tensor.cpp, ops.cpp, creation.cpp): turning tensors into
// operand nodes, recording nodes as new tensors, normalizing axes with clear errors.
#pragma once

#include <string>
#include <vector>

#include "ir/attrs.h"
#include "ir/ir.h"
#include "lockstep/ops.h"
#include "runtime/lazy.h"

namespace lockstep::frontend {

using ir::NodePtr;
using ir::Op;

// By value: binding the result to a reference stays valid even when `t` is a temporary.
inline NodePtr node(const Tensor& t, const char* op, const Loc& loc) {
  return runtime::node_of(t, op, loc);
}

inline Tensor record(Op op, std::vector<NodePtr> operands, std::vector<int64_t> attrs,
                     const Loc& loc, Shape shape = {}, DType dtype = DType::F32) {
  return runtime::new_tensor(
      ir::make_node(op, std::move(operands), std::move(attrs), std::move(shape), dtype, loc));
}

inline NodePtr make(Op op, std::vector<NodePtr> operands, std::vector<int64_t> attrs,
                    const Loc& loc, Shape shape = {}, DType dtype = DType::F32) {
  return ir::make_node(op, std::move(operands), std::move(attrs), std::move(shape), dtype, loc);
}

// The public options of convolutions and poolings as the IR's attributes, and back (a pooling
// stride of 0 means the kernel's).
inline ir::ConvAttrs conv_attrs(const Conv2dOptions& o) {
  return {o.stride, o.padding, o.dilation, o.groups};
}
inline Conv2dOptions conv_options(const ir::ConvAttrs& a) {
  return {a.stride, a.padding, a.dilation, a.groups};
}
inline ir::PoolAttrs pool_attrs(const Pool2dOptions& o) {
  return {
      o.kernel,
      {o.stride[0] == 0 ? o.kernel[0] : o.stride[0], o.stride[1] == 0 ? o.kernel[1] : o.stride[1]},
      o.padding,
      o.count_include_pad};
}
inline Pool2dOptions pool_options(const ir::PoolAttrs& a) {
  return {a.kernel, a.stride, a.padding, a.count_include_pad};
}

// A 0-d runtime input holding `value` as `dtype`; refuses a value the dtype cannot hold.
NodePtr scalar_node(Scalar value, DType dtype, Device device, const char* op, const Loc& loc);
// `n` broadcast to `shape` (no node when already that shape).
NodePtr expand_to(const NodePtr& n, const Shape& shape, const Loc& loc);
// NumPy broadcast of two shapes; Error naming `op` when they do not broadcast.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op, const Loc& loc);
// Axis in [-rank, rank) to [0, rank).
int64_t norm_axis(int64_t axis, int64_t rank, const char* op, const Loc& loc);
Device device_of(const TensorOptions& options);
// PyTorch's promotion of two operands (`*_0d`: a 0-d tensor, which counts only when of a higher
// category), and the dtype a scalar takes next to a tensor of dtype `t`.
DType result_type(DType a, bool a_0d, DType b, bool b_0d);
DType scalar_type(DType t, const Scalar& s);
// `n` as `dtype` (no node when it already is).
NodePtr cast_node(const NodePtr& n, DType dtype, const Loc& loc);
// Autocast (lockstep/autocast.h), when on for this thread: `n` in the lower precision (a floating
// operand of a matmul or convolution), or `n` read as f32 (a lower-precision input of a
// reduction, softmax or loss). `n` itself otherwise.
NodePtr autocast_low(const NodePtr& n, const Loc& loc);
NodePtr autocast_f32(const NodePtr& n, const Loc& loc);

}  // namespace lockstep::frontend
