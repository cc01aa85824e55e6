// lockstep's own Winograd convolution, F(4x4, 3x3) (Lavin and Gray, "Fast Algorithms for
// Convolutional Neural Networks", 2015), for f32 3x3 stride-1 convolutions on CPUs where oneDNN
// has none (its Winograd needs AVX-512: on an AVX2 machine every such convolution ran direct).
// All three directions are 36 matrix products in the transformed domain (one per position of a
// 6x6 transformed tile), computed by the BLAS sgemm (matmul.h): per chunk of tiles, each thread its
// own chunks so the transformed chunk stays in its cache, or, for few tiles over many channels, all
// tiles at once with the threads splitting the products:
//   forward          y  = A^T [ (G g G^T) . (B^T d B) ] A          per 4x4 output tile
//   backward data    the forward of dy with the kernel flipped and its channels swapped
//                    (padding 2 - p)
//   backward weights dw = G^T [ sum over tiles (A dy A^T) . (B^T d B) ] G
// Against direct it multiplies 4x less and rounds differently (the transforms add and subtract
// up to 6x6 inputs, with weights up to 8, before the product): tests/unit/winograd_test.cpp
// bounds the difference against a direct sum in double precision.
#pragma once

#include <cstdint>
#include <vector>

#include "lockstep/dtype.h"

namespace lockstep::backends::cpu {

class WinogradConv {
 public:
  enum class Kind { Forward, BackwardData, BackwardWeights };
  // Whether it computes this problem: f32, 3x3 kernel, stride 1, no dilation, no groups,
  // padding at most 2 (x: [N, C, H, W], w: [K, C, 3, 3], attrs as ir::Node's).
  static bool takes(const Shape& x, const Shape& w, const std::vector<int64_t>& attrs);
  // Whether it beats oneDNN's direct convolution on this problem, by a rule (measured with
  // bench/conv_bench.cpp, see bench/README.md): at least 64 channels in and out; maps of at
  // least 4x4 for blocked activations that run whole (few tiles: Problem::whole), else 8x8, and
  // 16x16 for plain ones (its slower path); at most a quarter of what the 4x4 tiles compute
  // dropped at the edges; at least 2^26 multiply-adds / 9; for the weight gradient in chunks,
  // the threads' sums in bounds. Where oneDNN's direct runs AVX-512 (`direct_avx512`), only
  // plain activations (channel counts not a multiple of 16, which direct runs slowly): on blocked
  // ones direct was faster.
  static bool pays(Kind kind, const Shape& x, const Shape& w, const Shape& y, bool blocked_in0,
                   bool blocked_in1, bool blocked_out, bool direct_avx512);
  // Operands and result as DnnlConv's: forward (x, w -> y), backward data (dy, w -> dx), backward
  // weights (x, dy -> dw); activations plain NCHW or blocked nChw16c as `blocked_*` say.
  WinogradConv(Kind kind, const Shape& x, const Shape& w, const Shape& y,
               const std::vector<int64_t>& attrs, bool blocked_in0, bool blocked_in1,
               bool blocked_out);
  // Runs on `scratch`, scratch_floats() floats (64-byte aligned).
  void run(const float* in0, const float* in1, float* out, float* scratch) const;
  size_t scratch_floats() const;

 private:
  // An activation's layout: element (n, c, h, w) of [N, C, H, W] at
  // (n * C + c) * H * W + h * W + w (plain) or in blocks of 16 channels (nChw16c).
  struct Act {
    int64_t n = 0, c = 0, h = 0, w = 0;
    bool blocked = false;
    int64_t plane(int64_t ni, int64_t ci) const {  // offset of (ni, ci, 0, 0)
      return blocked ? ((ni * (c / 16) + ci / 16) * h * w) * 16 + ci % 16 : (ni * c + ci) * h * w;
    }
    int64_t ws() const { return blocked ? 16 : 1; }  // between (h, w) and (h, w + 1)
  };
  // One forward problem: in [N, C, H, W] (3x3 kernel, padding ph, pw) -> out [N, K, Ho, Wo].
  struct Problem {
    Act in, out;
    int64_t k = 0;  // output channels
    int64_t ph = 0, pw = 0;
    int64_t th = 0, tw = 0;  // tiles per image: ceil(Ho / 4) x ceil(Wo / 4)
    int64_t rows = 0;        // tile rows per chunk
    // Both activations blocked: tiles are transformed 16 channels at a time, and the
    // transformed values are held [pos][tile][channel] (else [pos][channel][tile], rows of
    // tiles transformed at a time).
    bool blocked = false;
    // Few tiles (small maps, a small batch) over many channels, blocked: all tiles transformed
    // at once and the threads split the 36 products instead of the tiles, so each reads its
    // transformed kernels once (a chunk of a few tiles per product re-read them all per chunk:
    // ResNet-18's 4x4 stage ran at half direct's speed).
    bool whole = false;
  };
  // The chunked directions (a thread's chunks of tile rows, transformed, multiplied and
  // transformed back on its own scratch) and the whole one (all tiles at once, the threads
  // splitting the 36 products); dy given for the weight gradient, u (the transformed kernel)
  // for the others.
  void forward(const float* x, const float* u, float* y, float* scratch) const;
  void weights(const float* x, const float* dy, float* dw, float* scratch) const;
  void whole(const float* x, const float* u, const float* dy, float* out, float* scratch) const;
  // Their steps (winograd.cpp says each one's layouts).
  void input_rows(const float* x, int64_t r0, int64_t r1, int64_t tc, float* v,
                  float* rowbuf) const;
  void gradient_rows(const float* dy, int64_t r0, int64_t r1, int64_t tc, float* d,
                     float* rowbuf) const;
  void output_rows(const float* m, int64_t r0, int64_t r1, int64_t tc, float* y,
                   float* rowbuf) const;
  void products(const float* v, const float* u, int64_t tiles, int64_t tc, float* m) const;
  void gradient_sums(const float* v, const float* d, int64_t tiles, int64_t tc, float beta,
                     float* acc) const;
  void kernel_gradients(const float* sums, int copies, size_t copy, float* dw) const;
  int64_t tiles() const { return p_.out.n * p_.th * p_.tw; }
  size_t chunk_floats() const;  // per thread

  Kind kind_;
  Problem p_;  // forward: x -> y; backward data: dy -> dx; backward weights: x and dy's tiles
  int64_t c_ = 0, k_ = 0;  // the forward problem's input and output channels
  int threads_ = 1;
};

}  // namespace lockstep::backends::cpu
