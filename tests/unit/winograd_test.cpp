// lockstep's own F(4x4, 3x3) Winograd convolution (backends/cpu/winograd.h), all three
// directions, against a direct sum in double precision written here, over paddings 0 to 2,
// sizes that are not multiples of the tile, and plain, blocked and mixed layouts; blocked ones
// both whole (few tiles) and in chunks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "backends/cpu/dnnl_ops.h"
#include "backends/cpu/winograd.h"

namespace lockstep::backends::cpu {
namespace {

struct Case {
  int64_t n, c, k, h, w, pad;
  bool blocked_in, blocked_out;  // the direction's first operand and its result
};

std::vector<float> random_values(size_t count, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist;
  std::vector<float> v(count);
  for (float& e : v) e = dist(gen);
  return v;
}

// Plain NCHW to nChw16c (blocked) or back (C a multiple of 16).
std::vector<float> relayout(const std::vector<float>& x, int64_t n, int64_t c, int64_t hw,
                            bool to_blocked) {
  std::vector<float> out(x.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < c; ++j)
      for (int64_t p = 0; p < hw; ++p) {
        const int64_t plain = (i * c + j) * hw + p;
        const int64_t blocked = ((i * (c / 16) + j / 16) * hw + p) * 16 + j % 16;
        out[to_blocked ? blocked : plain] = x[to_blocked ? plain : blocked];
      }
  return out;
}

// The three directions of a 3x3 stride-1 convolution, summed directly in double.
struct Direct {
  Case s;
  int64_t ho, wo;
  explicit Direct(const Case& c) : s(c), ho(c.h + 2 * c.pad - 2), wo(c.w + 2 * c.pad - 2) {}
  template <typename F>
  void each(F f) const {  // f(x index, w index, y index)
    for (int64_t n = 0; n < s.n; ++n)
      for (int64_t k = 0; k < s.k; ++k)
        for (int64_t oh = 0; oh < ho; ++oh)
          for (int64_t ow = 0; ow < wo; ++ow)
            for (int64_t c = 0; c < s.c; ++c)
              for (int64_t i = 0; i < 3; ++i)
                for (int64_t j = 0; j < 3; ++j) {
                  const int64_t h = oh + i - s.pad, w = ow + j - s.pad;
                  if (h < 0 || h >= s.h || w < 0 || w >= s.w) continue;
                  f(((n * s.c + c) * s.h + h) * s.w + w, ((k * s.c + c) * 3 + i) * 3 + j,
                    ((n * s.k + k) * ho + oh) * wo + ow);
                }
  }
};

// max |a - b| over max |b|.
double relative_error(const std::vector<float>& a, const std::vector<double>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return diff / std::max(scale, 1e-30);
}

std::vector<float> run(WinogradConv::Kind kind, const Case& s, const std::vector<float>& in0,
                       const std::vector<float>& in1, size_t out_size) {
  const Shape x{s.n, s.c, s.h, s.w}, w{s.k, s.c, 3, 3};
  const Shape y{s.n, s.k, s.h + 2 * s.pad - 2, s.w + 2 * s.pad - 2};
  const std::vector<int64_t> attrs{1, 1, s.pad, s.pad, 1, 1, 1};
  EXPECT_TRUE(WinogradConv::takes(x, w, attrs));
  const bool weights = kind == WinogradConv::Kind::BackwardWeights;
  WinogradConv conv(kind, x, w, y, attrs, s.blocked_in, weights && s.blocked_out,
                    !weights && s.blocked_out);
  std::vector<float> scratch(conv.scratch_floats() + 16);
  float* aligned =
      reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(scratch.data()) + 63) / 64 * 64);
  std::vector<float> out(out_size, -1.0f);
  conv.run(in0.data(), in1.data(), out.data(), aligned);
  return out;
}

TEST(Winograd, EveryDirectionMatchesADirectSumInDouble) {
  const Case cases[] = {
      {2, 16, 16, 8, 8, 1, false, false},
      {2, 32, 48, 13, 11, 1, false, false},
      {1, 16, 32, 9, 14, 0, false, false},
      {2, 32, 16, 7, 6, 2, false, false},
      {2, 32, 48, 13, 11, 1, true, true},
      {3, 16, 32, 10, 5, 0, true, true},
      {1, 48, 16, 6, 9, 2, true, true},
      {2, 32, 32, 12, 12, 1, true, false},
      {2, 32, 32, 12, 12, 1, false, true},
      {1, 3, 5, 5, 5, 1, false, false},
      // Blocked with more tiles than run whole (576): in chunks of tile rows.
      {9, 16, 32, 31, 30, 1, true, true},
  };
  for (const Case& s : cases) {
    SCOPED_TRACE(::testing::Message()
                 << "n " << s.n << " c " << s.c << " k " << s.k << " h " << s.h << " w " << s.w
                 << " pad " << s.pad << " blocked " << s.blocked_in << s.blocked_out);
    const Direct d(s);
    const int64_t xs = s.n * s.c * s.h * s.w, ws = s.k * s.c * 9, ys = s.n * s.k * d.ho * d.wo;
    const std::vector<float> x = random_values(xs, 1), w = random_values(ws, 2);
    const std::vector<float> dy = random_values(ys, 3);
    std::vector<double> y_ref(ys, 0.0), dx_ref(xs, 0.0), dw_ref(ws, 0.0);
    d.each([&](int64_t xi, int64_t wi, int64_t yi) {
      y_ref[yi] += static_cast<double>(x[xi]) * w[wi];
      dx_ref[xi] += static_cast<double>(dy[yi]) * w[wi];
      dw_ref[wi] += static_cast<double>(dy[yi]) * x[xi];
    });
    // Each operand and result in the layout the case gives (blocked: a multiple of 16).
    auto act = [](const std::vector<float>& v, int64_t n, int64_t c, int64_t hw, bool blocked) {
      return blocked ? relayout(v, n, c, hw, true) : v;
    };
    auto back = [](const std::vector<float>& v, int64_t n, int64_t c, int64_t hw, bool blocked) {
      return blocked ? relayout(v, n, c, hw, false) : v;
    };
    const int64_t xhw = s.h * s.w, yhw = d.ho * d.wo;
    const std::vector<float> y =
        back(run(WinogradConv::Kind::Forward, s, act(x, s.n, s.c, xhw, s.blocked_in), w, ys), s.n,
             s.k, yhw, s.blocked_out);
    const std::vector<float> dx =
        back(run(WinogradConv::Kind::BackwardData, s, act(dy, s.n, s.k, yhw, s.blocked_in), w, xs),
             s.n, s.c, xhw, s.blocked_out);
    const std::vector<float> dw =
        run(WinogradConv::Kind::BackwardWeights, s, act(x, s.n, s.c, xhw, s.blocked_in),
            act(dy, s.n, s.k, yhw, s.blocked_out), ws);
    // F(4x4, 3x3) rounds within a few units of 1e-6 of the result's scale here; a wrong
    // transform entry or a misplaced tile is off by the values themselves.
    EXPECT_LT(relative_error(y, y_ref), 2e-5);
    EXPECT_LT(relative_error(dx, dx_ref), 2e-5);
    EXPECT_LT(relative_error(dw, dw_ref), 2e-5);
  }
}

TEST(Winograd, TakesOnlyThreeByThreeStrideOneProblems) {
  const Shape x{2, 16, 10, 10}, w{16, 16, 3, 3};
  EXPECT_TRUE(WinogradConv::takes(x, w, {1, 1, 1, 1, 1, 1, 1}));
  EXPECT_FALSE(WinogradConv::takes(x, w, {2, 2, 1, 1, 1, 1, 1}));              // stride 2
  EXPECT_FALSE(WinogradConv::takes(x, w, {1, 1, 1, 1, 2, 2, 1}));              // dilation
  EXPECT_FALSE(WinogradConv::takes(x, w, {1, 1, 3, 3, 1, 1, 1}));              // padding 3
  EXPECT_FALSE(WinogradConv::takes(x, {16, 8, 3, 3}, {1, 1, 1, 1, 1, 1, 2}));  // groups
  EXPECT_FALSE(WinogradConv::takes(x, {16, 16, 5, 5}, {1, 1, 2, 2, 1, 1, 1}));
  EXPECT_FALSE(WinogradConv::takes({2, 16, 1, 1}, w, {1, 1, 0, 0, 1, 1, 1}));  // empty output
}

TEST(Winograd, PaysOnlyWhereItBeatDirect) {
  using K = WinogradConv::Kind;
  const Shape x{64, 64, 32, 32}, w{64, 64, 3, 3}, y{64, 64, 32, 32};
  // ResNet-18's first stage on an AVX2 machine: blocked activations.
  EXPECT_TRUE(WinogradConv::pays(K::Forward, x, w, y, true, false, true, false));
  EXPECT_TRUE(WinogradConv::pays(K::BackwardWeights, x, w, y, true, true, false, false));
  // Few tiles over many channels run whole: ResNet-18's last stage (4x4 maps), ResNet-50's at
  // 224x224 (7x7).
  EXPECT_TRUE(WinogradConv::pays(K::BackwardWeights, {64, 512, 4, 4}, {512, 512, 3, 3},
                                 {64, 512, 4, 4}, true, true, false, false));
  EXPECT_TRUE(WinogradConv::pays(K::Forward, {32, 512, 7, 7}, {512, 512, 3, 3}, {32, 512, 7, 7},
                                 true, false, true, false));
  // ResNet-50's third stage at 224x224: 14x14 maps (16x16 of tiles).
  EXPECT_TRUE(WinogradConv::pays(K::Forward, {32, 256, 14, 14}, {256, 256, 3, 3}, {32, 256, 14, 14},
                                 true, false, true, false));
  // Where direct runs AVX-512 on blocked activations, it was faster.
  EXPECT_FALSE(WinogradConv::pays(K::Forward, x, w, y, true, false, true, true));
  // Few channels, 2x2 maps, small maps in chunks, little work, or 4x4 tiles of which a 9x9 map
  // fills little.
  EXPECT_FALSE(WinogradConv::pays(K::Forward, {64, 32, 32, 32}, {64, 32, 3, 3}, y, true, false,
                                  true, false));
  EXPECT_FALSE(WinogradConv::pays(K::Forward, {64, 512, 2, 2}, {512, 512, 3, 3}, {64, 512, 2, 2},
                                  true, false, true, false));
  EXPECT_FALSE(WinogradConv::pays(K::Forward, {1024, 512, 4, 4}, {512, 512, 3, 3},
                                  {1024, 512, 4, 4}, true, false, true, false));  // in chunks
  EXPECT_FALSE(WinogradConv::pays(K::Forward, {2, 64, 32, 32}, w, {2, 64, 32, 32}, true, false,
                                  true, false));
  EXPECT_FALSE(
      WinogradConv::pays(K::Forward, {64, 64, 9, 9}, w, {64, 64, 9, 9}, true, false, true, false));
  // Plain activations need a larger map.
  EXPECT_FALSE(WinogradConv::pays(K::Forward, {256, 64, 8, 8}, w, {256, 64, 8, 8}, false, false,
                                  false, false));
}

TEST(Winograd, ConvolutionsWithoutOneDnnWinogradRunItAndAgreeWithDirect) {
  // 72 channels: plain activations (not a multiple of 16), where lockstep's Winograd pays
  // whichever ISA oneDNN runs; DnnlConv asked for Winograd runs oneDNN's where it has one, else
  // lockstep's, and agrees with direct within Winograd's rounding.
  const Shape x{104, 72, 16, 16}, w{72, 72, 3, 3}, y{104, 72, 16, 16};
  const std::vector<int64_t> attrs{1, 1, 1, 1, 1, 1, 1};
  ASSERT_TRUE(WinogradConv::pays(WinogradConv::Kind::Forward, x, w, y, false, false, false, true));
  const std::vector<float> xv = random_values(104 * 72 * 256, 4),
                           wv = random_values(72 * 72 * 9, 5);
  std::vector<float> a(xv.size()), b(xv.size());
  struct Restore {
    ConvAlgo was = conv_algo();
    ~Restore() { set_conv_algo(was); }
  } restore;
  set_conv_algo(ConvAlgo::Direct);
  DnnlConv direct(DnnlConv::Kind::Forward, x, w, y, attrs, {}, false);
  set_conv_algo(ConvAlgo::Auto);
  DnnlConv winograd(DnnlConv::Kind::Forward, x, w, y, attrs, {}, true);
  direct.run(xv.data(), wv.data(), a.data());
  winograd.run(xv.data(), wv.data(), b.data());
  std::vector<double> ad(a.begin(), a.end());
  EXPECT_LT(relative_error(b, ad), 2e-5);
}

}  // namespace
}  // namespace lockstep::backends::cpu
