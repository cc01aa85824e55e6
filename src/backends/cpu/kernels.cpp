// The cpu kernels' shared pieces (see kernels.h): bf16 runs widened and rounded, and the
// per-thread buffers behind RunBuffers. The kernels themselves are in reduce_kernels.cpp,
// copy_kernels.cpp and pool_kernels.cpp.
#include "backends/cpu/kernels.h"

namespace lockstep::backends::cpu {

// The rounding is ls::bfloat16's (branch-free, so these loops vectorize).
LOCKSTEP_TARGET_CLONES void bf16_to_f32(const uint16_t* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_value(src[i]);
}
void bf16_rows_to_f32(const uint16_t* src, int64_t rows, int64_t cols, int64_t ld, float* dst) {
  for (int64_t r = 0; r < rows; ++r) bf16_to_f32(src + r * ld, cols, dst + r * cols);
}
LOCKSTEP_TARGET_CLONES void round_to_bf16(const float* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_value(bfloat16(x[i]).bits);
}
void round_to_bf16(float* y, int64_t n) { round_to_bf16(y, n, y); }
LOCKSTEP_TARGET_CLONES void exact_to_bf16(const float* src, int64_t n, uint16_t* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = exact_bf16_bits(src[i]);
}
LOCKSTEP_TARGET_CLONES void f32_to_bf16(const float* src, int64_t n, uint16_t* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bfloat16(src[i]).bits;
}

namespace {
// A thread's buffers for RunBuffers: the first `used` are taken.
struct RunPool {
  struct Buffer {
    std::unique_ptr<float[]> floats;
    int64_t size = 0;
  };
  std::vector<Buffer> buffers;
  size_t used = 0;
};
RunPool& run_pool() {
  thread_local RunPool pool;
  return pool;
}
}  // namespace

RunBuffers::RunBuffers() : base_(run_pool().used) {}
RunBuffers::~RunBuffers() { run_pool().used = base_; }
float* RunBuffers::take(int64_t n) {
  RunPool& pool = run_pool();
  const size_t i = pool.used++;
  if (i == pool.buffers.size()) pool.buffers.emplace_back();
  RunPool::Buffer& b = pool.buffers[i];
  if (b.size < n) {
    b.floats = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(n));
    b.size = n;
  }
  return b.floats.get();
}

}  // namespace lockstep::backends::cpu
