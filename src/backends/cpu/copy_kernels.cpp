// Strided copies of any element size (see kernels.h): permutes, slices and broadcasts, with
// transposes done in tiles of registers. Not the index kernels' gathers, pads and concats
// (index_kernels.cpp).
#include <algorithm>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "backends/cpu/kernels.h"
#include "util/check.h"

namespace lockstep::backends::cpu {

namespace {

#if defined(__x86_64__)
// d[k * dd + j] = s[j * ss + k] for j, k < 8: an 8x8 block of 4-byte values transposed in
// registers (unpack pairs, then quads, then the 128-bit halves).
__attribute__((target("avx2"))) void transpose8x8(const void* src, int64_t ss, void* dst,
                                                  int64_t dd) {
  const float* s = static_cast<const float*>(src);
  float* d = static_cast<float*>(dst);
  __m256 r[8], t[8];
  for (int k = 0; k < 8; ++k) r[k] = _mm256_loadu_ps(s + k * ss);
  for (int k = 0; k < 8; k += 2) {
    t[k] = _mm256_unpacklo_ps(r[k], r[k + 1]);
    t[k + 1] = _mm256_unpackhi_ps(r[k], r[k + 1]);
  }
  for (int k = 0; k < 8; k += 4) {
    r[k] = _mm256_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int k = 0; k < 4; ++k) {
    _mm256_storeu_ps(d + k * dd, _mm256_permute2f128_ps(r[k], r[k + 4], 0x20));
    _mm256_storeu_ps(d + (k + 4) * dd, _mm256_permute2f128_ps(r[k], r[k + 4], 0x31));
  }
}

// The same for 2-byte values (bf16), in SSE2 registers: unpack 16-bit pairs, then 32-bit, then
// 64-bit halves.
void transpose8x8_2(const void* src, int64_t ss, void* dst, int64_t dd) {
  const uint16_t* s = static_cast<const uint16_t*>(src);
  uint16_t* d = static_cast<uint16_t*>(dst);
  __m128i r[8], t[8];
  for (int k = 0; k < 8; ++k) r[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + k * ss));
  for (int k = 0; k < 8; k += 2) {
    t[k] = _mm_unpacklo_epi16(r[k], r[k + 1]);
    t[k + 1] = _mm_unpackhi_epi16(r[k], r[k + 1]);
  }
  for (int k = 0; k < 8; k += 4) {
    r[k] = _mm_unpacklo_epi32(t[k], t[k + 2]);
    r[k + 1] = _mm_unpackhi_epi32(t[k], t[k + 2]);
    r[k + 2] = _mm_unpacklo_epi32(t[k + 1], t[k + 3]);
    r[k + 3] = _mm_unpackhi_epi32(t[k + 1], t[k + 3]);
  }
  for (int k = 0; k < 4; ++k) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 2 * k * dd),
                     _mm_unpacklo_epi64(r[k], r[k + 4]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + (2 * k + 1) * dd),
                     _mm_unpackhi_epi64(r[k], r[k + 4]));
  }
}
#endif

// A copy whose source runs along output dim u (stride 1) while the output runs along its last
// dim: a transpose of those two dims (attention's heads, a matrix's transpose) for each position
// of the others. Done in square tiles, so each source cache line is used whole while it is in
// cache (the row-by-row walk read one value per line: [128, 64, 128] -> [128, 128, 64] at a
// fifth of the memory's speed).
template <typename E>
bool transpose_copy(const E* s, const Shape& out_shape, const std::vector<int64_t>& strides,
                    int64_t src_offset, E* o) {
  const size_t r = out_shape.size();
  if (r < 2 || strides[r - 1] == 1 || out_shape[r - 1] < 8) return false;
  size_t u = r;
  for (size_t d = r - 1; d-- > 0;)
    if (strides[d] == 1 && out_shape[d] >= 8) {
      u = d;
      break;
    }
  if (u == r) return false;
  std::vector<int64_t> ostride(r);
  int64_t acc = 1;
  for (size_t d = r; d-- > 0;) {
    ostride[d] = acc;
    acc *= out_shape[d];
  }
  // The other dims: each position's source and output offsets.
  std::vector<int64_t> dims, sst, ost;
  for (size_t d = 0; d + 1 < r; ++d)
    if (d != u) dims.push_back(out_shape[d]), sst.push_back(strides[d]), ost.push_back(ostride[d]);
  const int64_t rows = out_shape[u], cols = out_shape[r - 1], cstride = strides[r - 1];
  const int64_t orow = ostride[u];
  constexpr int64_t kT = 16;
  const int64_t row_tiles = (rows + kT - 1) / kT;
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
#endif
  const int64_t outer = shape_numel(out_shape) / (rows * cols);
  parallel_for(outer * rows * cols > 65536, outer * row_tiles, [&](int64_t job) {
    int64_t rest = job / row_tiles, so = src_offset, oo = 0;
    for (size_t k = dims.size(); k-- > 0;) {
      so += rest % dims[k] * sst[k];
      oo += rest % dims[k] * ost[k];
      rest /= dims[k];
    }
    const int64_t i0 = job % row_tiles * kT, i1 = std::min(rows, i0 + kT);
    int64_t j_done = 0;  // columns done by 8x8 blocks
#if defined(__x86_64__)
    if (((sizeof(E) == 4 && avx2) || sizeof(E) == 2) && i1 - i0 == kT) {
      j_done = cols / 8 * 8;
      for (int64_t j = 0; j < j_done; j += 8)
        for (int64_t i = i0; i < i1; i += 8) {
          const E* from = s + so + i + j * cstride;
          E* to = o + oo + i * orow + j;
          if (sizeof(E) == 4)
            transpose8x8(from, cstride, to, orow);
          else
            transpose8x8_2(from, cstride, to, orow);
        }
    }
#endif
    for (int64_t j0 = j_done; j0 < cols; j0 += kT) {
      const int64_t j1 = std::min(cols, j0 + kT);
      for (int64_t i = i0; i < i1; ++i) {
        const E* from = s + so + i;
        E* to = o + oo + i * orow;
        for (int64_t j = j0; j < j1; ++j) to[j] = from[j * cstride];
      }
    }
  });
  return true;
}

template <typename E>
void strided_copy(const void* src, const Shape& out_shape, const std::vector<int64_t>& strides,
                  int64_t src_offset, void* out) {
  const int64_t n = shape_numel(out_shape);
  if (n == 0) return;
  const size_t r = out_shape.size();
  if (transpose_copy(static_cast<const E*>(src), out_shape, strides, src_offset,
                     static_cast<E*>(out)))
    return;
  // Output rows (along the last dim) in blocks of up to kBlock consecutive rows of one matrix
  // (the last two dims): a block's source offset is computed once, its rows step by the
  // second-to-last dim's stride (a division per row cost more than copying rows of 64 bf16).
  const int64_t last = r ? out_shape[r - 1] : 1;
  const int64_t last_stride = r ? strides[r - 1] : 0;
  const int64_t mid = r >= 2 ? out_shape[r - 2] : 1;
  const int64_t mid_stride = r >= 2 ? strides[r - 2] : 0;
  const int64_t matrices = n / (last * mid);
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (mid + kBlock - 1) / kBlock;
  const E* s = static_cast<const E*>(src);
  E* o = static_cast<E*>(out);
  parallel_for(n > 65536, matrices * blocks, [&](int64_t job) {
    const int64_t matrix = job / blocks, m0 = job % blocks * kBlock;
    const int64_t m1 = std::min(mid, m0 + kBlock);
    int64_t off = src_offset, rest = matrix;
    for (size_t d = r >= 2 ? r - 2 : 0; d-- > 0;) {
      off += rest % out_shape[d] * strides[d];
      rest /= out_shape[d];
    }
    for (int64_t m = m0; m < m1; ++m) {
      const E* from = s + off + m * mid_stride;
      E* dst = o + (matrix * mid + m) * last;
      if (last_stride == 1)
        std::memcpy(dst, from, last * sizeof(E));
      else
        for (int64_t i = 0; i < last; ++i) dst[i] = from[i * last_stride];
    }
  });
}
}  // namespace

void strided_copy_4(const void* src, const Shape& out_shape, const std::vector<int64_t>& strides,
                    int64_t src_offset, void* out) {
  strided_copy<uint32_t>(src, out_shape, strides, src_offset, out);
}
void strided_copy_2(const void* src, const Shape& out_shape, const std::vector<int64_t>& strides,
                    int64_t src_offset, void* out) {
  strided_copy<uint16_t>(src, out_shape, strides, src_offset, out);
}
void strided_copy(size_t elem, const void* src, const Shape& out_shape,
                  const std::vector<int64_t>& strides, int64_t src_offset, void* out) {
  switch (elem) {
    case 1:
      return strided_copy<uint8_t>(src, out_shape, strides, src_offset, out);
    case 2:
      return strided_copy<uint16_t>(src, out_shape, strides, src_offset, out);
    case 4:
      return strided_copy<uint32_t>(src, out_shape, strides, src_offset, out);
    case 8:
      return strided_copy<uint64_t>(src, out_shape, strides, src_offset, out);
    default:
      util::internal_fail(__FILE__, __LINE__, "strided_copy: no element of that size");
  }
}

std::vector<int64_t> expand_strides(const Shape& in, const Shape& out) {
  std::vector<int64_t> st(out.size(), 0);
  int64_t acc = 1;
  for (size_t i = 0; i < in.size(); ++i) {
    const size_t din = in.size() - 1 - i, dout = out.size() - 1 - i;
    st[dout] = in[din] == 1 && out[dout] != 1 ? 0 : acc;
    acc *= in[din];
  }
  return st;
}

}  // namespace lockstep::backends::cpu
