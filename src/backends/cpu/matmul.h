// The cpu backend's matrix products: oneDNN's matmul (dnnl_ops.h) for every product, and for a
// single f32 or bf16 product also a BLAS sgemm (blas_library(): OpenBLAS's, or oneDNN's where
// OpenBLAS misjudges the CPU), whichever is faster for that problem on this machine.
//
// Neither library is faster everywhere: on AVX2, where oneDNN 2.x has only its `gemm:jit`
// kernels, OpenBLAS runs some products at twice oneDNN's speed ([256 x 4096] x [4096 x 1024]
// with the left operand transposed, every weight gradient over many rows: 38 ms against 18 ms on
// two Zen 3 cores) and oneDNN others at twice OpenBLAS's ([1024 x 64] x [64 x 512]); on AVX-512
// oneDNN's matmul (brgemm) runs [1024 x 768] x [768 x 3072] with the right operand plain at 112
// GFLOP/s, where its own sgemm, which packs both operands, reaches 297 (two Xeon model 207
// cores; transposed, the same operand goes at 392 through the matmul). No rule on
// the shape predicts which (a sweep of 76 random products split both ways), so each problem is
// timed once, on both, at its first run (on the runtime thread, with the real operands), and
// the choice is kept:
//   - in the process, for every later program with the same problem;
//   - in a tuning record on disk (LOCKSTEP_TUNING_FILE; by default
//     $XDG_CACHE_HOME/lockstep/matmul.tsv, else ~/.cache/lockstep/matmul.tsv), so that every
//     process on this machine computes the same problem with the same library and training is
//     reproducible bit for bit across runs (a resumed run continues the losses of the one it
//     resumes). The record's first line for a problem decides, whoever wrote it; a process that
//     timed the problem itself reads the record back before it uses its choice. The key holds
//     all that makes a timing valid: the CPU's model, the thread count, both libraries'
//     versions and oneDNN's kernel, the problem's sizes, transposes and leading dimensions.
// The two differ only in rounding (summation order). LOCKSTEP_MATMUL=onednn|openblas|onednn_sgemm
// pins one where it applies; LOCKSTEP_TUNING_FILE=none keeps choices in the process only.
//
// A single bf16 product (bf16 operands, bf16 or f32 result: autocast's) is timed the same way
// between oneDNN's bf16 matmul and the BLAS sgemm on the operands widened to f32 (exact), the
// result rounded to bf16: both accumulate in f32, so they too differ only in summation order.
// Without AMX the widened one can win: [1024 x 256] x [256 x 1024] took 2.7 ms on oneDNN 2.6's
// bf16 brgemm and 1.75 widened on oneDNN's sgemm (the f32 product alone: 1.6-1.7), on
// two Xeon model 207 cores (AVX512-BF16, no AMX).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backends/cpu/dnnl_ops.h"
#include "lockstep/dtype.h"

namespace lockstep::backends::cpu {

// One product as a BLAS gemm call: C = op(A) op(B), op(A) [M x K], op(B) [K x N], C [M x N],
// row-major with leading dimensions (C possibly column-major).
struct GemmCall {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false, c_col_major = false;
  int64_t lda = 0, ldb = 0, ldc = 0;
};

// The call for out = a x b read with these strides (dnnl_ops.h's convention), or false when the
// product is not one BLAS call: a batch of more than one, or an operand whose rows and columns
// both have strides other than 1.
bool gemm_call(const Shape& a, const std::vector<int64_t>& as, const Shape& b,
               const std::vector<int64_t>& bs, const Shape& out, const std::vector<int64_t>& os,
               GemmCall* call);

// OneDnn: oneDNN's matmul primitive; OpenBlas: OpenBLAS's cblas_sgemm; OneDnnSgemm: oneDNN's
// dnnl_sgemm (its gemm:jit kernels, which pack both operands).
enum class MatMulLibrary { OneDnn, OpenBlas, OneDnnSgemm };
const char* library_name(MatMulLibrary lib);

// The BLAS sgemm of this process: OpenBLAS, unless its run-time dispatch picked kernels for
// narrower vectors than this CPU has, then oneDNN's sgemm. OpenBLAS 0.3.21 (Debian 12) does not
// know newer CPUs: it runs its SSE3 "Prescott" kernels on an Intel Xeon family 6 model 207
// (AVX-512), 40 GFLOP/s on 2 cores where oneDNN's sgemm reaches 130-250 on attention's block
// products, and its AVX2 Haswell kernels on AMD Zen 5. LOCKSTEP_MATMUL=openblas|onednn_sgemm
// pins one.
// With LOCKSTEP_DEBUG=1 a process that sets OpenBLAS aside says so once.
MatMulLibrary blas_library();

// One f32 product with cblas_sgemm's arguments (row-major: c = alpha op(a) op(b) + beta c,
// op(x) = x^T where trans_x) on blas_library(): for kernels that run many small products inside
// their own parallel loop (fused attention, Winograd), where either library runs one thread a
// call.
void blas_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                int64_t ldc);

// How products compiled from now on pick their library (LOCKSTEP_MATMUL sets the initial
// value): Auto times oneDNN's matmul against blas_library() where both apply; the others use
// that library where it applies (OpenBlas and OneDnnSgemm also pin blas_library()).
enum class MatMulChoice { Auto, OneDnn, OpenBlas, OneDnnSgemm };
void set_matmul_choice(MatMulChoice choice);

class MatMul {
 public:
  // As DnnlMatMul's.
  MatMul(const Shape& a, const std::vector<int64_t>& a_strides, const Shape& b,
         const std::vector<int64_t>& b_strides, const Shape& out, DType in = DType::F32,
         DType out_dtype = DType::F32, const std::vector<int64_t>& out_strides = {});
  ~MatMul();
  void run(const void* a, const void* b, void* out);
  size_t scratch_bytes() const;
  // The library that runs it (oneDNN's matmul or blas_library()); until the first run of a
  // product still to be timed, oneDNN.
  MatMulLibrary library() const { return library_; }

 private:
  void tune(const void* a, const void* b, void* out);
  // The product on a BLAS sgemm (a bf16 one widened to f32).
  void run_on(MatMulLibrary blas, const void* a, const void* b, void* out);

  std::unique_ptr<DnnlMatMul> dnnl_;
  DType in_, out_dtype_;
  GemmCall call_;
  MatMulLibrary library_ = MatMulLibrary::OneDnn;
  std::string key_;                // the tuning record's key, for a timed product
  std::atomic<bool> tuned_{true};  // false until a product to be timed has been
  std::mutex tune_mu_;
};

namespace detail {
// The tuning record's file ("" when choices stay in the process); another file (forgetting
// every choice made or read so far); forgetting them alone. For tests.
std::string tuning_file();
void set_tuning_file(const std::string& path);
void forget_matmul_choices();
}  // namespace detail

}  // namespace lockstep::backends::cpu
