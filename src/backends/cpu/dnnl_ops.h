// The one adapter between lockstep and oneDNN (2.x API): matmul, the three convolutions and
// average pooling on f32 or bf16 NCHW tensors, LSTM and GRU layers on f32 (dnnl_rnn.cpp) (bf16:
// products accumulated in f32, results rounded once; oneDNN's bf16 kernels where the CPU has them,
// AVX512-BF16 or AMX). Primitives are created when a program is compiled and reused on every run.
// Errors from oneDNN become BackendError here. Nothing else includes dnnl.hpp (dnnl_common.h: what
// the adapter's files share).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/dtype.h"

namespace lockstep::backends::cpu {

// out[b] = a[b] x b[b] for broadcast batch dims; a and b are read with the given strides (in
// elements), so a transposed operand needs no copy. `in`: the operands' dtype, `out` the
// result's (f32 or bf16).
class DnnlMatMul {
 public:
  DnnlMatMul(const Shape& a, const std::vector<int64_t>& a_strides, const Shape& b,
             const std::vector<int64_t>& b_strides, const Shape& out, DType in = DType::F32,
             DType out_dtype = DType::F32, const std::vector<int64_t>& out_strides = {});
  ~DnnlMatMul();
  void run(const void* a, const void* b, void* out);
  // Bytes of the shared scratch a run takes (oneDNN's scratchpad).
  size_t scratch_bytes() const;
  // oneDNN's name for the kernel that runs it ("gemm:jit", "brg:avx512_core").
  std::string implementation() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// oneDNN's version, "2.7.3".
std::string onednn_version();

// oneDNN's name for the kernel a product read and written with these strides would run on
// (DnnlMatMul::implementation's, without creating it); "" where oneDNN has none for `dtype`.
std::string matmul_implementation(const Shape& a, const std::vector<int64_t>& a_strides,
                                  const Shape& b, const std::vector<int64_t>& b_strides,
                                  const Shape& out, const std::vector<int64_t>& out_strides,
                                  DType dtype);

// Convolution forward (in0 = x, in1 = w -> y), backward data (in0 = dy, in1 = w -> dx) and
// backward weights (in0 = x, in1 = dy -> dw). attrs as ir::Node's: stride, padding, dilation,
// groups. Weights are plain OIHW; activations and their gradients plain NCHW or, as `blocked`
// says, oneDNN's nChw16c; oneDNN's preferred layouts inside, reordered to and from. With
// `winograd` (chosen by the choose_conv_algorithms pass) the convolution runs as Winograd where
// oneDNN has it for the problem, else as lockstep's own Winograd (winograd.h) where that pays
// (or takes the problem, with ConvAlgo::Winograd), else direct.
// Where a convolution operand's copy in oneDNN's layout lives (see DnnlConv::run): by default
// in the shared scratch, written and used by one run. With `keep`, the copy is written there for
// a later convolution to read; with `ready`, it is already there (written by an earlier
// convolution's `keep`) and no reorder runs.
struct ConvCopy {
  float* keep = nullptr;
  const float* ready = nullptr;
};

// Which of a convolution's operands and its result are activations (or their gradients) held in
// the blocked nChw16c layout instead of plain NCHW; weights are always plain.
struct ConvBlocked {
  bool in0 = false, in1 = false, out = false;
};

class DnnlConv {
 public:
  enum class Kind { Forward, BackwardData, BackwardWeights };
  using Blocked = ConvBlocked;
  // `dtype`: of both operands and the result, f32 or bf16.
  DnnlConv(Kind kind, const Shape& x, const Shape& w, const Shape& y,
           const std::vector<int64_t>& attrs, Blocked blocked = {}, bool winograd = false,
           DType dtype = DType::F32);
  ~DnnlConv();
  using Copy = ConvCopy;
  void run(const void* in0, const void* in1, void* out, Copy copy0 = {}, Copy copy1 = {});
  // Bytes of the shared scratch a run takes (copies in oneDNN's layouts not shared with other
  // convolutions, and the scratchpad).
  size_t scratch_bytes() const;
  // Floats of operand k's copy in oneDNN's layout; 0 when the operand is used as it is.
  size_t copy_floats(int k) const;
  // Whether operand k of this convolution and operand other_k of `other` are copied to the
  // same layout (so, for the same value, one copy serves both).
  bool same_copy(int k, const DnnlConv& other, int other_k) const;
  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Average pooling forward (x -> y) or backward (dy -> dx) on f32 or bf16 NCHW tensors; attrs as
// ir::Node's pooling attrs (kernel, stride, padding, count_include_pad). Throws BackendError
// where oneDNN's windows would not be PyTorch's (see fits()).
class DnnlAvgPool {
 public:
  DnnlAvgPool(bool backward, const Shape& x, const Shape& y, const std::vector<int64_t>& attrs,
              DType dtype = DType::F32);
  ~DnnlAvgPool();
  void run(const void* in, void* out);
  size_t scratch_bytes() const;  // as DnnlMatMul's
  // Whether oneDNN computes what PyTorch (and ref) define for these shapes: its right padding
  // (implied by the output size) must not be negative, and when padding counts in the divisor
  // it must not exceed the left one (oneDNN divides by the whole kernel, PyTorch by the part
  // of the window inside the padded input).
  static bool fits(const Shape& x, const Shape& y, const std::vector<int64_t>& attrs);
  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// One LSTM or GRU layer in one direction on oneDNN's LSTM or linear-before-reset GRU primitive
// (ir::Op::Lstm, Gru and their gradients): T time steps, batch N, input size I, hidden size H;
// operands and results as the ops' (f32, plain, PyTorch's gate order: a GRU's is reordered for
// oneDNN on the way in and out). The forward pass for training leaves a workspace
// (workspace_bytes()) that the backward pass reads; a backward run given none recomputes it.
class DnnlRnn {
 public:
  enum class Cell { Lstm, Gru };
  DnnlRnn(Cell cell, int64_t t, int64_t n, int64_t i, int64_t h, bool reverse);
  ~DnnlRnn();
  size_t workspace_bytes() const;
  // Bytes of the shared scratch forward() and backward() take (weights in oneDNN's layouts, its
  // scratchpads, a recomputed workspace).
  size_t scratch_bytes() const;
  // The op's operands (x, h0, [c0,] w_ih, w_hh, b) -> its value; writes `workspace`.
  void forward(const float* const* in, float* out, void* workspace);
  // The gradient op's operands (those, the value, its gradient) -> the gradients
  // (ir::rnn_grad_offsets), reading the forward run's `workspace`, or
  // recomputing it when null.
  void backward(const float* const* in, float* grads, const void* workspace);
  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// How programs compiled from now on pick their convolutions' algorithm (the
// choose_conv_algorithms pass): Auto (default) uses Winograd for 3x3 stride-1 problems of at
// least 16 channels in and out and 64 output pixels, direct otherwise; Direct never uses
// Winograd; Winograd uses it wherever oneDNN or lockstep's own (winograd.h) has it. The
// environment's LOCKSTEP_CONV_ALGO=auto|direct|winograd sets the initial value.
enum class ConvAlgo { Auto, Direct, Winograd };
void set_conv_algo(ConvAlgo algo);
ConvAlgo conv_algo();

// Sets oneDNN's and the kernels' thread count (OpenMP).
void set_threads(int n);
int threads();

}  // namespace lockstep::backends::cpu
