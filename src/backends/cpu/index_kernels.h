// The cpu backend's kernels for index and movement ops on any dtype: gather and scatter-add
// (embeddings, cross-entropy's pick and their gradients), pad and concat (split's gradient,
// concatenations), index ramps and random bits, threaded where the size warrants. Element for
// element they compute what the ref kernels compute, in the same order where order matters
// (scatter-add sums each output element's contributions in index order), so the values are the
// same bits.
#pragma once

#include <cstdint>
#include <vector>

#include "ir/ir.h"

namespace lockstep::backends::cpu {

// An index operand read in place: its memory and strides over the index shape (0 where it is
// the broadcast of a smaller index, read through the Expand instead of a copy).
struct IndexView {
  const int64_t* data = nullptr;
  std::vector<int64_t> strides;
};

// out[..., k, ...] = x[..., index[..., k, ...], ...] along `axis`; out has the index's shape.
// Indices are in range (checked before, see add_step).
void gather(size_t elem, const void* x, const Shape& xs, const IndexView& index,
            const Shape& index_shape, int64_t axis, void* out);
// out = x, then out[..., index[i], ...] += src[i] along `axis`, each element's contributions in
// index order. bf16 sums in f32 and rounds once, as ref computes it. out may be x.
void scatter_add(DType dtype, const void* x, const Shape& xs, const IndexView& index,
                 const Shape& index_shape, const void* src, const Shape& src_shape, int64_t axis,
                 void* out);
// x padded (or cropped, where a padding is negative) by attrs [before0, after0, ...] with the
// one element at `value`.
void pad(size_t elem, const void* x, const Shape& xs, const std::vector<int64_t>& attrs,
         const void* value, const Shape& out_shape, void* out);
// The operands laid end to end along `axis`.
void concat(size_t elem, const std::vector<const void*>& xs, const std::vector<Shape>& shapes,
            int64_t axis, const Shape& out_shape, void* out);
// Values 0..n-1 along `axis`, in `dtype`.
void iota(DType dtype, const Shape& shape, int64_t axis, void* out);
// The position (row-major within the reduced axes) of the first largest (ArgMax) or smallest
// value of x over the axes in attrs ([keepdim, axes...]); NaN wins and stays, as in PyTorch.
void arg_reduce(bool is_max, DType dtype, const void* x, const Shape& xs,
                const std::vector<int64_t>& attrs, int64_t* out);
// The positions that sort x along `axis` (stable; NaN the largest value).
void argsort(DType dtype, const void* x, const Shape& xs, int64_t axis, bool descending,
             int64_t* out);
// Uniform [0, 1) values from the counter-based generator at state {seed, counter}.
void random_uniform(DType dtype, const int64_t* state, int64_t count, void* out);

}  // namespace lockstep::backends::cpu
