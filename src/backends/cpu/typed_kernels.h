// The cpu backend's kernels for every dtype: what the f32 and bf16 kernels (fused trees, oneDNN,
// the tuned reductions and poolings) do not take. Elementwise ops, reductions, products,
// convolutions and poolings on f64, i32, i64 and bool, the casts between any two dtypes, and
// the corners of the fast kernels (empty shapes, geometries oneDNN refuses). Threaded where the
// size warrants. f64 products and convolutions run on OpenBLAS, f32 ones on the BLAS sgemm
// (matmul.h; im2col for the convolutions); integers wrap (two's complement) as the ref backend
// defines them. bf16 operands are widened to f32, computed in f32 and rounded once, as ref
// computes them.
#pragma once

#include <cstdint>
#include <vector>

#include "ir/ir.h"

namespace lockstep::backends::cpu {

// A contiguous row-major operand.
struct TypedArg {
  const void* data = nullptr;
  DType dtype = DType::F32;
};

// One elementwise op (the Unary, Binary, Comparison and Select families, Cast among them) over
// `n` elements of operands with the output's shape. Integer division or fmod by zero and integer
// powers with a negative exponent throw BackendError before anything is written.
void typed_elementwise(ir::Op op, DType out_dtype, const std::vector<TypedArg>& args, int64_t n,
                       void* out);

// Sum, Max, Min, ArgMax or ArgMin of x (shape xs) over the axes of attrs ([keepdim, axes...]).
// Each output element takes its inputs in row-major order of the reduced axes; an empty
// reduction gives 0 (sum), the zero value (max, min) or -1 (argmax, argmin).
void typed_reduce(ir::Op op, DType out_dtype, TypedArg x, const Shape& xs,
                  const std::vector<int64_t>& attrs, void* out);

// [..., M, K] x [..., K, N] with batch dimensions of size 1 broadcast; every shape of rank r.
void typed_matmul(DType dtype, TypedArg a, const Shape& as, TypedArg b, const Shape& bs,
                  const Shape& out_shape, void* out);

// Conv2d (a: x, b: w), Conv2dBackwardInput (a: gy, b: w) or Conv2dBackwardWeight (a: x, b: gy),
// ir::ConvAttrs in attrs.
void typed_conv(ir::Op op, DType dtype, TypedArg a, const Shape& as, TypedArg b, const Shape& bs,
                const Shape& out_shape, const std::vector<int64_t>& attrs, void* out);

// MaxPool2d, MaxPool2dIndices, MaxPool2dBackward (x: gy, indices: the forward's, already
// checked), AvgPool2d or AvgPool2dBackward (x: gy), ir::PoolAttrs in attrs.
void typed_pool(ir::Op op, TypedArg x, const Shape& xs, const int64_t* indices,
                const Shape& out_shape, const std::vector<int64_t>& attrs, void* out);

}  // namespace lockstep::backends::cpu
