// F(4x4, 3x3) Winograd convolutions on the BLAS sgemm (matmul.h); see winograd.h.
#include "backends/cpu/winograd.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "backends/cpu/kernels.h"
#include "backends/cpu/matmul.h"
#include "ir/attrs.h"
#include "util/check.h"

namespace lockstep::backends::cpu {
namespace {

// F(4x4, 3x3): 6x6 input tiles overlapping by 2, 4x4 output tiles, 36 transformed positions.
constexpr int64_t kM = 4, kAlpha = 6, kPos = kAlpha * kAlpha;
// Problems of at most this many tiles (blocked) run `whole` (Problem::whole).
constexpr int64_t kWholeTiles = 512;

// 4x4 output tiles along a side of n outputs.
int64_t tiles_along(int64_t n) { return (n + kM - 1) / kM; }

// Tiles per chunk: the chunk's transformed input and products (36 * tiles * (C + K) floats)
// sized to stay near a core's cache, but never so few tiles that the products get too thin for
// the BLAS's kernels.
int64_t chunk_tiles(int64_t c, int64_t k) {
  return std::clamp<int64_t>(int64_t{8192} / (c + k), 32, 256);
}

// Loads row h of channel plane `src` (H rows of W, elements ws apart) into buf[0, len), the
// input's column j - pad at buf[j], zeros outside the image.
LOCKSTEP_TARGET_CLONES void load_row(const float* src, int64_t h, int64_t height, int64_t width,
                                     int64_t ws, int64_t pad, int64_t len, float* buf) {
  if (h < 0 || h >= height) {
    std::memset(buf, 0, static_cast<size_t>(len) * sizeof(float));
    return;
  }
  const float* row = src + h * width * ws;
  const int64_t lo = std::min(std::max<int64_t>(pad, 0), len);
  const int64_t hi = std::clamp<int64_t>(width + pad, lo, len);
  for (int64_t j = 0; j < lo; ++j) buf[j] = 0.0f;
  if (ws == 1) {
    std::memcpy(buf + lo, row + (lo - pad), static_cast<size_t>(hi - lo) * sizeof(float));
  } else {
    for (int64_t j = lo; j < hi; ++j) buf[j] = row[(j - pad) * ws];
  }
  for (int64_t j = hi; j < len; ++j) buf[j] = 0.0f;
}

// The transforms' rows, as Lavin's F(4x4, 3x3) (points 0, +-1, +-2, infinity):
//   B^T d (6 from 6), G g (6 from 3), A^T m (4 from 6), and for the weight gradient A e (6 from
//   4) and G^T x (3 from 6). Each is applied to whole rows (vectors over tiles or columns).
template <typename T>
__attribute__((always_inline)) inline void bt6(T d0, T d1, T d2, T d3, T d4, T d5, T v[6]) {
  v[0] = 4.0f * d0 - 5.0f * d2 + d4;
  v[1] = -4.0f * d1 - 4.0f * d2 + d3 + d4;
  v[2] = 4.0f * d1 - 4.0f * d2 - d3 + d4;
  v[3] = -2.0f * d1 - d2 + 2.0f * d3 + d4;
  v[4] = 2.0f * d1 - d2 - 2.0f * d3 + d4;
  v[5] = 4.0f * d1 - 5.0f * d3 + d5;
}
template <typename T>
__attribute__((always_inline)) inline void at4(T m0, T m1, T m2, T m3, T m4, T m5, T y[4]) {
  y[0] = m0 + m1 + m2 + m3 + m4;
  y[1] = m1 - m2 + 2.0f * m3 - 2.0f * m4;
  y[2] = m1 + m2 + 4.0f * m3 + 4.0f * m4;
  y[3] = m1 - m2 + 8.0f * m3 - 8.0f * m4 + m5;
}
template <typename T>
__attribute__((always_inline)) inline void a6(T e0, T e1, T e2, T e3, T v[6]) {
  v[0] = e0;
  v[1] = e0 + e1 + e2 + e3;
  v[2] = e0 - e1 + e2 - e3;
  v[3] = e0 + 2.0f * e1 + 4.0f * e2 + 8.0f * e3;
  v[4] = e0 - 2.0f * e1 + 4.0f * e2 - 8.0f * e3;
  v[5] = e3;
}

// The loops over whole rows, with each stream a restrict parameter (GCC vectorizes them only
// so: restrict on local pointers does not tell it the streams are apart).
#define LS_ALWAYS_INLINE __attribute__((always_inline)) inline
using In = const float* __restrict;
using Out = float* __restrict;

// w_i[j] = (B^T (r_0[j] .. r_5[j]))_i
LS_ALWAYS_INLINE void bt6_rows(In r0, In r1, In r2, In r3, In r4, In r5, Out w0, Out w1, Out w2,
                               Out w3, Out w4, Out w5, int64_t len) {
  for (int64_t j = 0; j < len; ++j) {
    float o[6];
    bt6(r0[j], r1[j], r2[j], r3[j], r4[j], r5[j], o);
    w0[j] = o[0], w1[j] = o[1], w2[j] = o[2], w3[j] = o[3], w4[j] = o[4], w5[j] = o[5];
  }
}
// v_j[q] = (B^T (c0[q], c1[q], c2[q], c3[q], c0[q + 1], c1[q + 1]))_j
LS_ALWAYS_INLINE void bt6_tiles(In c0, In c1, In c2, In c3, Out v0, Out v1, Out v2, Out v3, Out v4,
                                Out v5, int64_t tiles) {
  for (int64_t q = 0; q < tiles; ++q) {
    float o[6];
    bt6(c0[q], c1[q], c2[q], c3[q], c0[q + 1], c1[q + 1], o);
    v0[q] = o[0], v1[q] = o[1], v2[q] = o[2], v3[q] = o[3], v4[q] = o[4], v5[q] = o[5];
  }
}
// w_i[j] = (A (d_0[j] .. d_3[j]))_i
LS_ALWAYS_INLINE void a6_rows(In d0, In d1, In d2, In d3, Out w0, Out w1, Out w2, Out w3, Out w4,
                              Out w5, int64_t len) {
  for (int64_t j = 0; j < len; ++j) {
    float o[6];
    a6(d0[j], d1[j], d2[j], d3[j], o);
    w0[j] = o[0], w1[j] = o[1], w2[j] = o[2], w3[j] = o[3], w4[j] = o[4], w5[j] = o[5];
  }
}
// c_j[q] = s[4q + j] for q < n
LS_ALWAYS_INLINE void split4(In s, Out c0, Out c1, Out c2, Out c3, int64_t n) {
  for (int64_t q = 0; q < n; ++q) {
    c0[q] = s[kM * q];
    c1[q] = s[kM * q + 1];
    c2[q] = s[kM * q + 2];
    c3[q] = s[kM * q + 3];
  }
}
// s_a[q] = (A^T (m_0[q] .. m_5[q]))_a
LS_ALWAYS_INLINE void at4_rows(In m0, In m1, In m2, In m3, In m4, In m5, Out s0, Out s1, Out s2,
                               Out s3, int64_t n) {
  for (int64_t q = 0; q < n; ++q) {
    float y[4];
    at4(m0[q], m1[q], m2[q], m3[q], m4[q], m5[q], y);
    s0[q] = y[0], s1[q] = y[1], s2[q] = y[2], s3[q] = y[3];
  }
}

// B^T d B of one row of tiles (6 input rows r[0..5], each 4 * tiles + 2 long) to
// v[pos * pos_stride + t]; `t` holds 28 * (tiles + 1) floats.
LOCKSTEP_TARGET_CLONES void input_tiles(const float* const r[6], float* t, int64_t tiles, float* v,
                                        int64_t pos_stride) {
  const int64_t len = kM * tiles + 2, q1 = tiles + 1, rl = kM * q1;
  // Down the columns first (rows of the transform, whole rows at a time) ...
  bt6_rows(r[0], r[1], r[2], r[3], r[4], r[5], t, t + rl, t + 2 * rl, t + 3 * rl, t + 4 * rl,
           t + 5 * rl, len);
  for (int i = 0; i < 6; ++i)
    for (int64_t j = len; j < rl; ++j) t[i * rl + j] = 0.0f;
  // ... then along each transformed row, tile by tile: its columns 4q .. 4q + 5 split by
  // column mod 4 (c0[q + 1] is column 4q + 4) so the tiles' loop reads contiguous values.
  float* c = t + 6 * rl;
  for (int i = 0; i < 6; ++i) {
    split4(t + i * rl, c, c + q1, c + 2 * q1, c + 3 * q1, q1);
    float* vi = v + i * 6 * pos_stride;
    bt6_tiles(c, c + q1, c + 2 * q1, c + 3 * q1, vi, vi + pos_stride, vi + 2 * pos_stride,
              vi + 3 * pos_stride, vi + 4 * pos_stride, vi + 5 * pos_stride, tiles);
  }
}

// A e A^T of one row of 4x4 gradient tiles (rows d[0..3], each 4 * tiles long) to
// v[pos * pos_stride + t]; `t` holds 28 * tiles floats.
LOCKSTEP_TARGET_CLONES void gradient_tiles(const float* const d[4], float* t, int64_t tiles,
                                           float* v, int64_t pos_stride) {
  const int64_t len = kM * tiles;
  a6_rows(d[0], d[1], d[2], d[3], t, t + len, t + 2 * len, t + 3 * len, t + 4 * len, t + 5 * len,
          len);
  float* c = t + 6 * len;
  for (int i = 0; i < 6; ++i) {
    split4(t + i * len, c, c + tiles, c + 2 * tiles, c + 3 * tiles, tiles);
    float* vi = v + i * 6 * pos_stride;
    // A over the tile's 4 columns: the same rows as a6_rows, on the split columns.
    a6_rows(c, c + tiles, c + 2 * tiles, c + 3 * tiles, vi, vi + pos_stride, vi + 2 * pos_stride,
            vi + 3 * pos_stride, vi + 4 * pos_stride, vi + 5 * pos_stride, tiles);
  }
}

// A^T m A of one row of tiles of one output channel (m[pos * pos_stride + t]) to the 4 output
// rows o[0..3] (each 4 * tiles long); `t` holds 40 * tiles floats.
LOCKSTEP_TARGET_CLONES void output_tiles(const float* m, int64_t pos_stride, int64_t tiles,
                                         float* t, float* const o[4]) {
  // Along each row of the 6x6 first (t[(i * 4 + a) * tiles + q]), then down the columns, into
  // t[(24 + b * 4 + a) * tiles + q], interleaved into the output rows last.
  for (int i = 0; i < 6; ++i) {
    const float* mi = m + i * 6 * pos_stride;
    float* s = t + i * 4 * tiles;
    at4_rows(mi, mi + pos_stride, mi + 2 * pos_stride, mi + 3 * pos_stride, mi + 4 * pos_stride,
             mi + 5 * pos_stride, s, s + tiles, s + 2 * tiles, s + 3 * tiles, tiles);
  }
  float* y = t + 24 * tiles;
  const int64_t st = 4 * tiles;
  for (int a = 0; a < 4; ++a) {
    const float* s = t + a * tiles;
    at4_rows(s, s + st, s + 2 * st, s + 3 * st, s + 4 * st, s + 5 * st, y + a * tiles,
             y + (4 + a) * tiles, y + (8 + a) * tiles, y + (12 + a) * tiles, tiles);
  }
  for (int b = 0; b < 4; ++b) {
    const float* yb = y + b * 4 * tiles;
    float* ob = o[b];
    for (int64_t q = 0; q < tiles; ++q)
      for (int a = 0; a < 4; ++a) ob[kM * q + a] = yb[a * tiles + q];
  }
}

// Blocked activations (16 channels contiguous at each pixel): one tile of 16 channels at a
// time, every step a loop over the 16 lanes.
constexpr int kLanes = 16;

// The n x n pixels of one channel block (`src`: its H x W x 16 values) from (h0, w0), zeros
// outside.
template <int n>
LS_ALWAYS_INLINE void load_patch(const float* src, int64_t height, int64_t width, int64_t h0,
                                 int64_t w0, float (*d)[n][kLanes]) {
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      const int64_t h = h0 + i, w = w0 + j;
      if (h >= 0 && h < height && w >= 0 && w < width)
        std::memcpy(d[i][j], src + (h * width + w) * kLanes, sizeof d[i][j]);
      else
        std::memset(d[i][j], 0, sizeof d[i][j]);
    }
}

// The separable 2D transform of an n x n patch of 16-lane values to 6 x 6: f (6 from n) down
// each column, then along each row, to v[(i * 6 + j) * pos_stride + lane].
template <int n, typename F>
LS_ALWAYS_INLINE void transform_tile16(const float (*d)[n][kLanes], F f, float* v,
                                       int64_t pos_stride) {
  alignas(64) float t[6][n][kLanes];
  for (int j = 0; j < n; ++j)
    for (int l = 0; l < kLanes; ++l) {
      float in[n], o[6];
      for (int i = 0; i < n; ++i) in[i] = d[i][j][l];
      f(in, o);
      for (int i = 0; i < 6; ++i) t[i][j][l] = o[i];
    }
  for (int i = 0; i < 6; ++i)
    for (int l = 0; l < kLanes; ++l) {
      float in[n], o[6];
      for (int j = 0; j < n; ++j) in[j] = t[i][j][l];
      f(in, o);
      for (int j = 0; j < 6; ++j) v[(i * 6 + j) * pos_stride + l] = o[j];
    }
}

// B^T d B of the tile whose input corner is (h0, w0) in one channel block (`src`: its H x W x 16
// values; zeros outside), to v[pos * pos_stride + lane].
LOCKSTEP_TARGET_CLONES void input_tile16(const float* src, int64_t height, int64_t width,
                                         int64_t h0, int64_t w0, float* v, int64_t pos_stride) {
  alignas(64) float d[6][6][kLanes];
  load_patch<6>(src, height, width, h0, w0, d);
  transform_tile16<6>(
      d, [](const float* e, float* o) { bt6(e[0], e[1], e[2], e[3], e[4], e[5], o); }, v,
      pos_stride);
}

// A e A^T of the 4x4 gradient tile at (h0, w0) of one channel block (zeros outside).
LOCKSTEP_TARGET_CLONES void gradient_tile16(const float* src, int64_t height, int64_t width,
                                            int64_t h0, int64_t w0, float* v, int64_t pos_stride) {
  alignas(64) float d[4][4][kLanes];
  load_patch<4>(src, height, width, h0, w0, d);
  transform_tile16<4>(
      d, [](const float* e, float* o) { a6(e[0], e[1], e[2], e[3], o); }, v, pos_stride);
}

// A^T m A of one tile of one channel block (m[pos * pos_stride + lane]) to its output corner
// (h0, w0) of `dst` (H x W x 16 values; the parts past the edges dropped).
LOCKSTEP_TARGET_CLONES void output_tile16(const float* m, int64_t pos_stride, float* dst,
                                          int64_t height, int64_t width, int64_t h0, int64_t w0) {
  alignas(64) float t[6][4][kLanes];
  alignas(64) float y[4][4][kLanes];
  for (int i = 0; i < 6; ++i)
    for (int l = 0; l < kLanes; ++l) {
      const float* mi = m + i * 6 * pos_stride + l;
      float o[4];
      at4(mi[0], mi[pos_stride], mi[2 * pos_stride], mi[3 * pos_stride], mi[4 * pos_stride],
          mi[5 * pos_stride], o);
      for (int a = 0; a < 4; ++a) t[i][a][l] = o[a];
    }
  for (int a = 0; a < 4; ++a)
    for (int l = 0; l < kLanes; ++l) {
      float o[4];
      at4(t[0][a][l], t[1][a][l], t[2][a][l], t[3][a][l], t[4][a][l], t[5][a][l], o);
      for (int b = 0; b < 4; ++b) y[b][a][l] = o[b];
    }
  for (int b = 0; b < 4 && h0 + b < height; ++b)
    for (int a = 0; a < 4 && w0 + a < width; ++a)
      std::memcpy(dst + ((h0 + b) * width + w0 + a) * kLanes, y[b][a], sizeof y[b][a]);
}

// G g G^T of a 3x3 kernel g (row-major) to u[pos * stride].
void kernel_transform(const float g[9], float* u, int64_t stride) {
  auto g6 = [](float a, float b, float c, float v[6]) {
    v[0] = 0.25f * a;
    v[1] = -(a + b + c) / 6.0f;
    v[2] = -(a - b + c) / 6.0f;
    v[3] = a / 24.0f + b / 12.0f + c / 6.0f;
    v[4] = a / 24.0f - b / 12.0f + c / 6.0f;
    v[5] = c;
  };
  float t[6][3];
  for (int j = 0; j < 3; ++j) {
    float v[6];
    g6(g[j], g[3 + j], g[6 + j], v);
    for (int i = 0; i < 6; ++i) t[i][j] = v[i];
  }
  for (int i = 0; i < 6; ++i) {
    float v[6];
    g6(t[i][0], t[i][1], t[i][2], v);
    for (int j = 0; j < 6; ++j) u[(i * 6 + j) * stride] = v[j];
  }
}

// G^T x G of a 6x6 x (x[pos * stride]) to the 3x3 kernel g.
void kernel_gradient(const float* x, int64_t stride, float g[9]) {
  auto gt3 = [](const float x6[6], float v[3]) {
    v[0] = 0.25f * x6[0] - (x6[1] + x6[2]) / 6.0f + (x6[3] + x6[4]) / 24.0f;
    v[1] = (x6[2] - x6[1]) / 6.0f + (x6[3] - x6[4]) / 12.0f;
    v[2] = (x6[3] + x6[4] - x6[1] - x6[2]) / 6.0f + x6[5];
  };
  float t[3][6];
  for (int j = 0; j < 6; ++j) {
    float col[6], v[3];
    for (int i = 0; i < 6; ++i) col[i] = x[(i * 6 + j) * stride];
    gt3(col, v);
    for (int i = 0; i < 3; ++i) t[i][j] = v[i];
  }
  for (int i = 0; i < 3; ++i) {
    float v[3];
    gt3(t[i], v);
    for (int j = 0; j < 3; ++j) g[i * 3 + j] = v[j];
  }
}

int64_t round16(int64_t n) { return (n + 15) / 16 * 16; }

}  // namespace

bool WinogradConv::takes(const Shape& x, const Shape& w, const std::vector<int64_t>& attrs) {
  if (x.size() != 4 || w.size() != 4 || w[2] != 3 || w[3] != 3 || w[1] != x[1]) return false;
  const ir::ConvAttrs a = ir::ConvAttrs::of(attrs);
  if (a.groups != 1) return false;
  for (int d = 0; d < 2; ++d) {
    if (a.stride[d] != 1 || a.dilation[d] != 1 || a.padding[d] < 0 || a.padding[d] > 2)
      return false;
    if (x[2 + d] + 2 * a.padding[d] - 2 < 1) return false;
  }
  return x[0] > 0 && x[1] > 0 && w[0] > 0;
}

bool WinogradConv::pays(Kind kind, const Shape& x, const Shape& w, const Shape& y, bool blocked_in0,
                        bool blocked_in1, bool blocked_out, bool direct_avx512) {
  const int64_t c = x[1], k = w[0], ho = y[2], wo = y[3];
  const bool blocked =
      kind == Kind::BackwardWeights ? blocked_in0 && blocked_in1 : blocked_in0 && blocked_out;
  if (c < 64 || k < 64 || ho < (blocked ? 4 : 16) || wo < (blocked ? 4 : 16)) return false;
  if (blocked && direct_avx512) return false;
  const int64_t th = tiles_along(ho), tw = tiles_along(wo);
  // At most a quarter of what the tiles compute dropped at the edges (14x14 and 7x7 maps drop
  // 23% and still ran 1.2-2x faster; 9x9 ones drop 44%).
  if (th * tw * kM * kM * 3 > ho * wo * 4) return false;
  if (x[0] * ho * wo * c * k < (int64_t{1} << 26)) return false;  // multiply-adds / 9
  const bool whole = blocked && x[0] * th * tw <= kWholeTiles;
  if (!whole && (ho < 8 || wo < 8)) return false;  // in chunks of few tiles: 0.5x at 4x4
  if (kind == Kind::BackwardWeights && !whole &&
      kPos * c * k * std::max(1, omp_get_max_threads()) > (int64_t{1} << 24))
    return false;  // the threads' sums over 64 MiB
  return true;
}

WinogradConv::WinogradConv(Kind kind, const Shape& x, const Shape& w, const Shape& y,
                           const std::vector<int64_t>& attrs, bool blocked_in0, bool blocked_in1,
                           bool blocked_out)
    : kind_(kind), c_(x[1]), k_(w[0]), threads_(std::max(1, omp_get_max_threads())) {
  LS_INTERNAL_CHECK(takes(x, w, attrs), "WinogradConv: a problem it does not take");
  const ir::ConvAttrs a = ir::ConvAttrs::of(attrs);
  const Act xa{x[0], x[1], x[2], x[3], false}, ya{y[0], y[1], y[2], y[3], false};
  Problem& p = p_;
  switch (kind) {
    case Kind::Forward:
      p.in = xa, p.out = ya, p.k = k_, p.ph = a.padding[0], p.pw = a.padding[1];
      p.in.blocked = blocked_in0, p.out.blocked = blocked_out;
      break;
    case Kind::BackwardData:
      p.in = ya, p.out = xa, p.k = c_, p.ph = 2 - a.padding[0], p.pw = 2 - a.padding[1];
      p.in.blocked = blocked_in0, p.out.blocked = blocked_out;
      break;
    case Kind::BackwardWeights:
      // Tiles of dy (p.out), each reading its 4x4 patch of x (p.in).
      p.in = xa, p.out = ya, p.k = k_, p.ph = a.padding[0], p.pw = a.padding[1];
      p.in.blocked = blocked_in0, p.out.blocked = blocked_in1;
      break;
  }
  p.blocked = p.in.blocked && p.out.blocked;
  p.th = tiles_along(p.out.h);
  p.tw = tiles_along(p.out.w);
  const int64_t total_rows = p.out.n * p.th;
  p.rows = std::max<int64_t>(1, chunk_tiles(p.in.c, p.k) / p.tw);
  // At least two chunks a thread where the problem has them, for balance.
  p.rows = std::min(p.rows, std::max<int64_t>(1, total_rows / (2 * threads_)));
  p.whole = p.blocked && tiles() <= kWholeTiles;
}

size_t WinogradConv::chunk_floats() const {
  const Problem& p = p_;
  const int64_t tiles = p.rows * p.tw, len = kM * p.tw + 4;
  // Transformed input, products (or transformed gradient), 6 loaded rows (or 4 output rows) and
  // the transforms' work rows (input_tiles: 28 * (tw + 1) floats, gradient_tiles 28 * tw,
  // output_tiles 40 * tw).
  return static_cast<size_t>(round16(kPos * tiles * p.in.c) + round16(kPos * tiles * p.k) +
                             round16(6 * len) + round16(10 * len + 4 * (p.tw + 1)));
}

size_t WinogradConv::scratch_floats() const {
  const size_t kernel = static_cast<size_t>(round16(kPos * c_ * k_));
  if (p_.whole)  // all tiles transformed, their products (or transformed gradient), the kernel
    return static_cast<size_t>(round16(kPos * tiles() * p_.in.c) + round16(kPos * tiles() * p_.k)) +
           kernel;
  const size_t chunks = chunk_floats() * static_cast<size_t>(threads_);
  // Backward weights: each thread's sums over its tiles; the others: the transformed kernel.
  return kind_ == Kind::BackwardWeights ? chunks + kernel * static_cast<size_t>(threads_)
                                        : chunks + kernel;
}

// The n x n tiles of rows r0 .. r1 of tiles (tw a row, th an image) of activation `a`, 16
// channels at a time (tile16, blocked) or a row of tiles of one channel at a time (row_tiles,
// from n loaded rows), transformed to `v` as input_rows says. The tiles' corners lie at 4 * the
// tile's row and column less (ph, pw).
template <int n, typename Act, typename Tile16, typename RowTiles>
void transform_rows(const Act& a, const float* src, bool blocked, int64_t th, int64_t tw,
                    int64_t ph, int64_t pw, int64_t r0, int64_t r1, int64_t tc, float* v,
                    float* rowbuf, Tile16 tile16, RowTiles row_tiles) {
  if (blocked) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t img = r / th, h0 = kM * (r % th) - ph;
      for (int64_t q = 0; q < tw; ++q)
        for (int64_t cb = 0; cb < a.c; cb += kLanes)
          tile16(src + a.plane(img, cb), a.h, a.w, h0, kM * q - pw,
                 v + ((r - r0) * tw + q) * a.c + cb, tc * a.c);
    }
    return;
  }
  const int64_t len = kM * tw + 4;
  float* work = rowbuf + round16(6 * len);
  for (int64_t c = 0; c < a.c; ++c) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t img = r / th, h0 = kM * (r % th) - ph;
      const float* plane = src + a.plane(img, c);
      const float* rows[n];
      for (int i = 0; i < n; ++i) {
        load_row(plane, h0 + i, a.h, a.w, a.ws(), pw, kM * tw + n - 4, rowbuf + i * len);
        rows[i] = rowbuf + i * len;
      }
      row_tiles(rows, work, tw, v + c * tc + (r - r0) * tw, a.c * tc);
    }
  }
}

// The transformed values of tile rows r0 .. r1 (tile t = (r - r0) * tw + q): [pos][channel][t]
// (plain) or [pos][t][channel] (blocked), `tc` tiles apart per position. rowbuf: the chunk's
// row scratch (plain only).
void WinogradConv::input_rows(const float* x, int64_t r0, int64_t r1, int64_t tc, float* v,
                              float* rowbuf) const {
  const Problem& p = p_;
  transform_rows<6>(p.in, x, p.blocked, p.th, p.tw, p.ph, p.pw, r0, r1, tc, v, rowbuf, input_tile16,
                    input_tiles);
}

// input_rows' layouts, for the gradient's tiles (dy, p.out).
void WinogradConv::gradient_rows(const float* dy, int64_t r0, int64_t r1, int64_t tc, float* d,
                                 float* rowbuf) const {
  const Problem& p = p_;
  transform_rows<4>(p.out, dy, p.blocked, p.th, p.tw, 0, 0, r0, r1, tc, d, rowbuf, gradient_tile16,
                    gradient_tiles);
}

// The outputs of tile rows r0 .. r1 from their products, laid out as input_rows' values
// ([pos][k][t] plain, [pos][t][k] blocked).
void WinogradConv::output_rows(const float* m, int64_t r0, int64_t r1, int64_t tc, float* y,
                               float* rowbuf) const {
  const Problem& p = p_;
  const int64_t k = p.k, tw = p.tw, len = kM * tw + 4;
  if (p.blocked) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t n = r / p.th, h0 = kM * (r % p.th);
      for (int64_t q = 0; q < tw; ++q)
        for (int64_t kb = 0; kb < k; kb += kLanes)
          output_tile16(m + ((r - r0) * tw + q) * k + kb, tc * k, y + p.out.plane(n, kb), p.out.h,
                        p.out.w, h0, kM * q);
    }
    return;
  }
  float* work = rowbuf + round16(6 * len);
  float* o[4];
  for (int b = 0; b < 4; ++b) o[b] = rowbuf + b * len;
  const int64_t ws = p.out.ws();
  for (int64_t kk = 0; kk < k; ++kk) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t n = r / p.th, h = kM * (r % p.th);
      output_tiles(m + kk * tc + (r - r0) * tw, k * tc, tw, work, o);
      float* plane = y + p.out.plane(n, kk);
      for (int64_t b = 0; b < kM && h + b < p.out.h; ++b) {
        float* dst = plane + (h + b) * p.out.w * ws;
        if (ws == 1) {
          std::memcpy(dst, o[b], static_cast<size_t>(p.out.w) * sizeof(float));
        } else {
          for (int64_t j = 0; j < p.out.w; ++j) dst[j * ws] = o[b][j];
        }
      }
    }
  }
}

// The products of one position: tiles x k from tiles x cin values (blocked) or k x tiles from
// cin x tiles (plain), `tc` the values' and products' tile stride.
void WinogradConv::products(const float* v, const float* u, int64_t tiles, int64_t tc,
                            float* m) const {
  const Problem& p = p_;
  const int64_t cin = p.in.c, k = p.k, t = tiles, ld = tc;
  if (p.blocked)
    blas_sgemm(false, false, t, k, cin, 1.0f, v, cin, u, k, 0.0f, m, k);
  else
    blas_sgemm(false, false, k, t, cin, 1.0f, u, cin, v, ld, 0.0f, m, ld);
}

// One position's weight-gradient sums: acc ([c][k] blocked, [k][c] plain) += the gradient's
// transformed tiles times the input's.
void WinogradConv::gradient_sums(const float* v, const float* d, int64_t tiles, int64_t tc,
                                 float beta, float* acc) const {
  const Problem& p = p_;
  const int64_t cin = p.in.c, k = p.k, t = tiles, ld = tc;
  if (p.blocked)
    blas_sgemm(true, false, cin, k, t, 1.0f, v, cin, d, k, beta, acc, k);
  else
    blas_sgemm(false, true, k, cin, t, 1.0f, d, ld, v, ld, beta, acc, cin);
}

// G^T x G of the summed positions to the kernel gradient dw[k][c] (sums [pos][c][k] blocked,
// [pos][k][c] plain; `copies` of them, `copy` floats apart, added in order).
void WinogradConv::kernel_gradients(const float* sums, int copies, size_t copy, float* dw) const {
  const int64_t cin = p_.in.c, k = p_.k, pairs = k * cin;
#pragma omp parallel for schedule(static) num_threads(threads_)
  for (int64_t e = 0; e < pairs; ++e) {
    const int64_t at = p_.blocked ? e % cin * k + e / cin : e;
    float x6[kPos];
    for (int64_t pos = 0; pos < kPos; ++pos) {
      float s = 0.0f;
      for (int t = 0; t < copies; ++t) s += sums[copy * static_cast<size_t>(t) + pos * pairs + at];
      x6[pos] = s;
    }
    kernel_gradient(x6, 1, dw + e * 9);
  }
}

void WinogradConv::forward(const float* x, const float* u, float* y, float* scratch) const {
  const Problem& p = p_;
  const int64_t total_rows = p.out.n * p.th;
  const int64_t chunks = (total_rows + p.rows - 1) / p.rows;
  const int64_t tc = p.rows * p.tw;  // tiles in a full chunk (the values' tile stride)
  const size_t per_thread = chunk_floats();
#pragma omp parallel num_threads(threads_)
  {
    float* v = scratch + per_thread * static_cast<size_t>(omp_get_thread_num());
    float* m = v + round16(kPos * tc * p.in.c);
    float* rowbuf = m + round16(kPos * tc * p.k);
#pragma omp for schedule(static)
    for (int64_t ch = 0; ch < chunks; ++ch) {
      const int64_t r0 = ch * p.rows, r1 = std::min(total_rows, r0 + p.rows);
      input_rows(x, r0, r1, tc, v, rowbuf);
      for (int64_t pos = 0; pos < kPos; ++pos)
        products(v + pos * tc * p.in.c, u + pos * p.in.c * p.k, (r1 - r0) * p.tw, tc,
                 m + pos * tc * p.k);
      output_rows(m, r0, r1, tc, y, rowbuf);
    }
  }
}

void WinogradConv::weights(const float* x, const float* dy, float* dw, float* scratch) const {
  const Problem& p = p_;
  const int64_t total_rows = p.out.n * p.th;
  const int64_t chunks = (total_rows + p.rows - 1) / p.rows;
  const int64_t tc = p.rows * p.tw;
  const size_t per_thread = chunk_floats();
  const size_t kernel = static_cast<size_t>(round16(kPos * p.in.c * p.k));
  float* sums = scratch + per_thread * static_cast<size_t>(threads_);
  int used = 1;
#pragma omp parallel num_threads(threads_)
  {
    const int t = omp_get_thread_num();
#pragma omp single
    used = omp_get_num_threads();
    float* v = scratch + per_thread * static_cast<size_t>(t);
    float* d = v + round16(kPos * tc * p.in.c);
    float* rowbuf = d + round16(kPos * tc * p.k);
    float* acc = sums + kernel * static_cast<size_t>(t);
    std::memset(acc, 0, kernel * sizeof(float));
#pragma omp for schedule(static)
    for (int64_t ch = 0; ch < chunks; ++ch) {
      const int64_t r0 = ch * p.rows, r1 = std::min(total_rows, r0 + p.rows);
      input_rows(x, r0, r1, tc, v, rowbuf);
      gradient_rows(dy, r0, r1, tc, d, rowbuf);
      for (int64_t pos = 0; pos < kPos; ++pos)
        gradient_sums(v + pos * tc * p.in.c, d + pos * tc * p.k, (r1 - r0) * p.tw, tc, 1.0f,
                      acc + pos * p.in.c * p.k);
    }
  }
  // The threads' sums in thread order (the same bits for the same thread count), then G^T x G.
  kernel_gradients(sums, used, kernel, dw);
}

void WinogradConv::whole(const float* x, const float* u, const float* dy, float* out,
                         float* scratch) const {
  const Problem& p = p_;
  const int64_t cin = p.in.c, k = p.k, all = tiles(), rows = p.out.n * p.th;
  const bool weights = kind_ == Kind::BackwardWeights;
  float* v = scratch;
  float* m = v + round16(kPos * all * cin);  // products, or the transformed gradient
  float* acc = m + round16(kPos * all * k);  // weights: the sums
#pragma omp parallel num_threads(threads_)
  {
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      input_rows(x, r, r + 1, all, v + r * p.tw * cin, nullptr);
      if (weights) gradient_rows(dy, r, r + 1, all, m + r * p.tw * k, nullptr);
    }
#pragma omp for schedule(static)
    for (int64_t pos = 0; pos < kPos; ++pos) {
      if (weights)
        gradient_sums(v + pos * all * cin, m + pos * all * k, all, all, 0.0f, acc + pos * cin * k);
      else
        products(v + pos * all * cin, u + pos * cin * k, all, all, m + pos * all * k);
    }
    if (!weights) {
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) output_rows(m + r * p.tw * k, r, r + 1, all, out, nullptr);
    }
  }
  if (weights) kernel_gradients(acc, 1, 0, out);
}

void WinogradConv::run(const float* in0, const float* in1, float* out, float* scratch) const {
  if (kind_ == Kind::BackwardWeights) {
    if (p_.whole)
      whole(in0, nullptr, in1, out, scratch);
    else
      weights(in0, in1, out, scratch);
    return;
  }
  // The transformed kernel, [pos][out channel][in channel] (blocked: [pos][in][out]), after the
  // tiles' scratch.
  float* u = scratch + (p_.whole ? scratch_floats() - static_cast<size_t>(round16(kPos * c_ * k_))
                                 : chunk_floats() * static_cast<size_t>(threads_));
  const int64_t ko = p_.k, ci = p_.in.c;
  auto kernel_of = [&](int64_t o, int64_t i, float g[9]) {
    if (kind_ == Kind::Forward) {
      std::memcpy(g, in1 + (o * ci + i) * 9, 9 * sizeof(float));  // w[o][i]
    } else {
      // Backward data: w'[o = c][i = k] = w[k][c] flipped.
      const float* src = in1 + (i * ko + o) * 9;
      for (int e = 0; e < 9; ++e) g[e] = src[8 - e];
    }
  };
  // Written along the transformed kernel's rows: [pos][o][i] (plain) a row of i at a time;
  // [pos][i][o] (blocked) 16 o at a time through a small buffer (one o after another would
  // write 36 scattered values each: 40 ms for 512 x 512 channels).
  if (!p_.blocked) {
#pragma omp parallel for schedule(static) num_threads(threads_)
    for (int64_t o = 0; o < ko; ++o)
      for (int64_t i = 0; i < ci; ++i) {
        float g[9];
        kernel_of(o, i, g);
        kernel_transform(g, u + o * ci + i, ko * ci);
      }
  } else {
#pragma omp parallel for schedule(static) num_threads(threads_)
    for (int64_t ob = 0; ob < ko; ob += kLanes) {
      const int64_t on = std::min<int64_t>(kLanes, ko - ob);
      for (int64_t i = 0; i < ci; ++i) {
        float t[kPos][kLanes];
        for (int64_t oo = 0; oo < on; ++oo) {
          float g[9];
          kernel_of(ob + oo, i, g);
          kernel_transform(g, &t[0][oo], kLanes);
        }
        for (int64_t pos = 0; pos < kPos; ++pos)
          std::memcpy(u + pos * ko * ci + i * ko + ob, t[pos],
                      static_cast<size_t>(on) * sizeof(float));
      }
    }
  }
  if (p_.whole)
    whole(in0, u, nullptr, out, scratch);
  else
    forward(in0, u, out, scratch);
}

}  // namespace lockstep::backends::cpu
