// DType::BF16: rounding to nearest even, reads as float, promotion, ops computed as the
// definition says (widened to f32, computed, rounded) on ref and on cpu, gradients, and
// safetensors BF16 both ways, against values PyTorch wrote (tests/golden/make_bf16_fixture.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>

#include <lockstep/lockstep.h>
#include "unit/golden_util.h"

namespace ls = lockstep;

namespace {

uint16_t bits_of(float f) { return ls::bfloat16(f).bits; }

std::vector<uint16_t> bf16_bits(const ls::Tensor& t) {
  const std::vector<float> v = t.to_vector<float>();  // exact: bf16 widens to f32
  std::vector<uint16_t> out;
  for (float f : v) out.push_back(static_cast<uint16_t>(std::bit_cast<uint32_t>(f) >> 16));
  return out;
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(bits_of(1.0f), 0x3f80);
  EXPECT_EQ(bits_of(1 + 0x1p-8f), 0x3f80);             // halfway to 1 + 2^-7: ties to even (down)
  EXPECT_EQ(bits_of(1 + 3 * 0x1p-8f), 0x3f82);         // halfway to 1 + 2^-6: ties to even (up)
  EXPECT_EQ(bits_of(1 + 0x1p-8f + 0x1p-20f), 0x3f81);  // above halfway: up
  EXPECT_EQ(bits_of(std::numeric_limits<float>::max()), 0x7f80);  // overflows to inf
  EXPECT_EQ(bits_of(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(bits_of(0x1p-133f), 0x0001);      // the smallest subnormal, exact
  EXPECT_EQ(bits_of(0x1p-134f), 0x0000);      // half of it: ties to even (0)
  EXPECT_EQ(bits_of(3 * 0x1p-134f), 0x0002);  // 1.5 of it: ties to even (2)
  EXPECT_TRUE(std::isnan(static_cast<float>(ls::bfloat16(std::nanf("")))));
  EXPECT_EQ(ls::dtype_size(ls::bf16), 2u);
  EXPECT_TRUE(ls::is_floating(ls::bf16));
  EXPECT_STREQ(ls::dtype_name(ls::bf16), "bf16");
}

TEST(Bf16, CastsMatchPyTorchsRounding) {
  const golden::Fixture f = golden::load("bf16.safetensors");
  ASSERT_EQ(f["round"].dtype(), ls::bf16);
  for (const char* dev : {"ref", "cpu"}) {
    SCOPED_TRACE(dev);
    const ls::Tensor x = f["cases"].to(ls::parse_device(dev));
    const std::vector<uint16_t> got = bf16_bits(ls::cast(x, ls::bf16));
    const std::vector<uint16_t> want = bf16_bits(f["round"]);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      if ((want[i] & 0x7fff) > 0x7f80) {  // NaN: any NaN
        EXPECT_GT(got[i] & 0x7fff, 0x7f80) << i;
        continue;
      }
      EXPECT_EQ(got[i], want[i]) << "case " << i;
    }
  }
}

TEST(Bf16, OpsAreComputedInF32AndRoundedOnce) {
  const golden::Fixture f = golden::load("bf16.safetensors");
  for (const char* dev : {"ref", "cpu"}) {
    SCOPED_TRACE(dev);
    const ls::Device d = ls::parse_device(dev);
    const ls::Tensor a = f["a"].to(d), b = f["b"].to(d), w = f["w"].to(d);
    const std::vector<std::pair<std::string, ls::Tensor>> ours = {
        {"add", a + b},          {"mul", a * b},        {"div", a / (ls::abs(b) + 1)},
        {"exp", ls::exp(a)},     {"tanh", ls::tanh(a)}, {"matmul", ls::matmul(a, w)},
        {"sum", ls::sum(a, {1})}};
    for (const auto& [name, t] : ours) {
      ASSERT_EQ(t.dtype(), ls::bf16) << name;
      // Elementwise: bit for bit; exp and tanh within one bf16 ulp (libm vs PyTorch's
      // vectorized f32 kernels); matmul and sum within one ulp (PyTorch accumulates in f32
      // in its own order, ref in f64).
      const std::vector<float> got = t.to_vector<float>(), want = f[name].to_vector<float>();
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_LE(std::abs(got[i] - want[i]), std::abs(want[i]) * 0x1p-7f + 1e-30f)
            << name << " [" << i << "]: " << got[i] << " vs torch " << want[i];
    }
    EXPECT_EQ(bf16_bits(a + b), bf16_bits(f["add"]));
    EXPECT_EQ(bf16_bits(a * b), bf16_bits(f["mul"]));
    // The sum of 1 and 2^-8 in bf16 is 1 (rounded once, to even): not f32's 1.00390625.
    const ls::Tensor one = ls::cast(ls::full({1}, 1.0, {ls::f32, d}), ls::bf16);
    const ls::Tensor tiny = ls::cast(ls::full({1}, 0x1p-8, {ls::f32, d}), ls::bf16);
    EXPECT_EQ((one + tiny).to_vector<float>()[0], 1.0f);
    EXPECT_EQ(ls::cast(one + tiny, ls::f32).item<float>(), 1.0f);
  }
}

// bf16 sums over leading axes (autocast's bias gradients) on cpu run by whole rows: the ref
// backend's values in every layout that path takes (many rows over few columns, cut into bands;
// rows longer than one run of 2048; a kept axis before the summed ones) and in those it leaves
// to the general walk (fewer than 16 columns, a summed axis after a kept one).
TEST(Bf16, SumsOverLeadingAxesMatchRef) {
  const std::vector<std::pair<ls::Shape, std::vector<int64_t>>> cases = {
      {{2048, 512}, {0}},  {{32, 64, 512}, {0, 1}}, {{40000, 16}, {0}},  {{5, 3000}, {0}},
      {{3, 100, 40}, {1}}, {{64, 8}, {0}},          {{6, 7, 20}, {0, 2}}};
  for (size_t c = 0; c < cases.size(); ++c) {
    const auto& [shape, axes] = cases[c];
    SCOPED_TRACE(::testing::Message() << "case " << c);
    ls::manual_seed(3);
    const ls::Tensor x = ls::cast(ls::randn(shape), ls::bf16);
    const ls::Tensor sum_ref = ls::sum(x.to(ls::parse_device("ref")), axes);
    const ls::Tensor sum_cpu = ls::sum(x.to(ls::parse_device("cpu")), axes);
    ASSERT_EQ(sum_cpu.dtype(), ls::bf16);
    const std::vector<float> want = sum_ref.to_vector<float>(), got = sum_cpu.to_vector<float>();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)  // each within one bf16 ulp of the sum in f64
      ASSERT_LE(std::abs(got[i] - want[i]), std::abs(want[i]) * 0x1p-7f + 1e-30f) << i;
  }
}

// An activation built from several primitives is computed in f32 and rounded once, as PyTorch's
// bf16 kernels are: against each formula in double, rounded to bf16, nearly all values match bit
// for bit and none is more than one bf16 ulp away (rounding after each primitive misses by
// several ulps on a good share of them). Gradients likewise go through f32. kAbs: f32's own
// cancellation where a value is tiny beside its terms (gelu at -8: 1 + erf is 0 in f32).
TEST(Bf16, CompositeActivationsRoundOnce) {
  namespace F = ls::nn;
  std::vector<float> xs;
  for (int i = 0; i < 2048; ++i) xs.push_back(static_cast<float>(ls::bfloat16(-8.0f + i / 128.0f)));
  const double kInvSqrt2 = 0.70710678118654752, kSqrt2OverPi = 0.79788456080286536;
  const float kAbs = 1e-6f;
  auto sigmoid = [](double v) { return 1 / (1 + std::exp(-v)); };
  auto softplus = [](double v) { return v > 20 ? v : std::log1p(std::exp(v)); };
  const std::vector<std::pair<std::string, std::function<double(double)>>> refs = {
      {"gelu", [&](double v) { return 0.5 * v * (1 + std::erf(v * kInvSqrt2)); }},
      {"gelu_tanh",
       [&](double v) {
         return 0.5 * v * (1 + std::tanh(kSqrt2OverPi * (v + 0.044715 * v * v * v)));
       }},
      {"silu", [&](double v) { return v * sigmoid(v); }},
      {"elu", [](double v) { return v > 0 ? v : std::expm1(v); }},
      {"softplus", softplus},
      {"mish", [&](double v) { return v * std::tanh(softplus(v)); }},
      {"hardswish", [](double v) { return v * std::clamp(v + 3, 0.0, 6.0) / 6; }},
      {"log_sigmoid", [&](double v) { return std::log(sigmoid(v)); }}};
  // got[i] against f(xs[i]) rounded once to bf16: within one ulp (and kAbs), and for >= 99% of
  // the values within kAbs alone.
  auto expect_rounded_once = [&](const std::string& name, const std::vector<float>& got,
                                 const std::function<double(double)>& f) {
    int close = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      const float want = static_cast<float>(ls::bfloat16(static_cast<float>(f(xs[i]))));
      close += std::abs(got[i] - want) <= kAbs;
      EXPECT_LE(std::abs(got[i] - want), std::abs(want) * 0x1p-7f + kAbs)
          << name << "(" << xs[i] << "): " << got[i] << " vs " << want;
    }
    EXPECT_GE(close, static_cast<int>(xs.size()) * 99 / 100) << name;
  };
  for (const char* dev : {"ref", "cpu"}) {
    SCOPED_TRACE(dev);
    const ls::Tensor x = ls::cast(ls::from_vector(xs).to(ls::parse_device(dev)), ls::bf16);
    const std::vector<std::pair<std::string, ls::Tensor>> ours = {
        {"gelu", F::gelu(x)},           {"gelu_tanh", F::gelu(x, ls::nn::GeluApproximation::Tanh)},
        {"silu", F::silu(x)},           {"elu", F::elu(x)},
        {"softplus", F::softplus(x)},   {"mish", F::mish(x)},
        {"hardswish", F::hardswish(x)}, {"log_sigmoid", F::log_sigmoid(x)}};
    for (size_t k = 0; k < ours.size(); ++k) {
      const auto& [name, t] = ours[k];
      ASSERT_EQ(t.dtype(), ls::bf16) << name;
      expect_rounded_once(name, t.to_vector<float>(), refs[k].second);
    }
    // The gradient of a bf16 gelu is the f32 gradient rounded once.
    ls::Tensor xg = ls::from_vector(xs).to(ls::parse_device(dev));
    xg.set_requires_grad(true);
    ls::sum(ls::cast(F::gelu(ls::cast(xg, ls::bf16)), ls::f32)).backward();
    expect_rounded_once("gelu'", xg.grad().to_vector<float>(), [&](double v) {
      return 0.5 * (1 + std::erf(v * kInvSqrt2)) + v * std::exp(-0.5 * v * v) * 0.39894228040143268;
    });
  }
}

TEST(Bf16, PromotionGradientsAndReads) {
  const ls::Tensor h = ls::cast(ls::from_vector<float>({1.5f, -2.0f}), ls::bf16);
  EXPECT_EQ((h + ls::zeros({2})).dtype(), ls::f32);  // same category: the larger
  EXPECT_EQ((h * 2.5).dtype(), ls::bf16);
  EXPECT_EQ((h + ls::scalar_tensor(1.0, ls::f64)).dtype(), ls::bf16);  // 0-d, same category
  EXPECT_EQ((ls::zeros({2}, ls::i64) + h).dtype(), ls::bf16);
  EXPECT_EQ(ls::slice(h, 0, 1, 2).item<double>(), -2.0);
  EXPECT_EQ(h.to_string(), "[1.5, -2]");
  ls::Tensor w =
      ls::cast(ls::from_vector<float>({0.5f, 3.0f}), ls::bf16).detach().set_requires_grad();
  ls::sum(w * w).backward();
  EXPECT_EQ(w.grad().dtype(), ls::bf16);
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{1.0f, 6.0f}));
  // safetensors BF16 round trip, bits kept.
  const std::string path = ::testing::TempDir() + "/bf16_roundtrip.safetensors";
  ls::io::save_safetensors(path, {{"h", h}});
  const ls::Tensor back = ls::io::load_safetensors(path).tensors.at(0).second;
  EXPECT_EQ(back.dtype(), ls::bf16);
  EXPECT_EQ(bf16_bits(back), bf16_bits(h));
}

TEST(Bf16, TheMemoryPlanCountsTwoBytesAValue) {
  // The same program in f32 and in bf16: its output, a [1024, 1024] value, is what it plans.
  int64_t planned[2];
  int k = 0;
  for (ls::DType dt : {ls::f32, ls::bf16}) {
    const ls::Tensor x = ls::cast(ls::ones({1024, 1024}), dt);
    ls::sync();
    ls::wait();
    const ls::Tensor y = x * 2 + 1;
    ls::sync();
    ls::wait();
    planned[k++] = ls::metrics::counter("planned_bytes");
  }
  EXPECT_EQ(planned[0] - planned[1], 1024 * 1024 * 2);  // the output, at 4 and at 2 bytes
  EXPECT_NEAR(static_cast<double>(planned[1]), 1024 * 1024 * 2, 4096);  // (and a few scalars)
}

TEST(Bf16, RandomDrawsStayBelowOne) {
  // An f32 draw rounded to bf16 gives 1 about once in 512; bf16 draws take 8 random bits, as
  // PyTorch's, so every value is a bf16 in [0, 1).
  std::vector<float> first;
  for (const char* dev : {"ref", "cpu"}) {
    ls::manual_seed(21);
    const ls::Tensor u = ls::rand({20000}, {ls::bf16, ls::parse_device(dev)});
    ASSERT_EQ(u.dtype(), ls::bf16);
    const std::vector<float> v = u.to_vector<float>();
    float lo = 1, hi = 0;
    for (float x : v) {
      lo = std::min(lo, x);
      hi = std::max(hi, x);
      ASSERT_EQ(x * 256, std::floor(x * 256)) << x;
    }
    EXPECT_EQ(lo, 0.0f);
    EXPECT_EQ(hi, 255.0f / 256.0f);
    if (first.empty())
      first = v;
    else
      EXPECT_EQ(v, first) << "ref and cpu draw the same numbers";
    EXPECT_TRUE(std::isfinite(
        ls::sum(ls::cast(ls::randn({4096}, {ls::bf16, ls::parse_device(dev)}), ls::f32))
            .item<float>()));
  }
}

}  // namespace
