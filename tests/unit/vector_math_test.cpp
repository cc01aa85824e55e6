// The cpu backend's vector math (libmvec and its own erf, by ISA) against double precision: at most
// 4 ulp (the bound glibc documents for its x86_64 vector variants), the special values as the
// scalar libm gives them, and the same value wherever an element lies in a run (body, tail, in
// place).
#include "backends/cpu/vector_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace {

using lockstep::backends::cpu::math_isa;
using lockstep::backends::cpu::math_isa_name;
using lockstep::backends::cpu::MathFn;
using lockstep::backends::cpu::MathIsa;
using lockstep::backends::cpu::vector_math;

struct Fn {
  MathFn fn;
  const char* name;
  double (*exact)(double);
  float (*scalar)(float);
  float lo, hi;  // the range swept
};

const Fn kFns[] = {
    {MathFn::Exp, "exp", [](double x) { return std::exp(x); }, [](float x) { return std::exp(x); },
     -103.0f, 88.5f},
    {MathFn::Log, "log", [](double x) { return std::log(x); }, [](float x) { return std::log(x); },
     1e-30f, 1e30f},
    {MathFn::Tanh, "tanh", [](double x) { return std::tanh(x); },
     [](float x) { return std::tanh(x); }, -12.0f, 12.0f},
    {MathFn::Erf, "erf", [](double x) { return std::erf(x); }, [](float x) { return std::erf(x); },
     -6.0f, 6.0f},
    {MathFn::Sin, "sin", [](double x) { return std::sin(x); }, [](float x) { return std::sin(x); },
     -1e5f, 1e5f},
    {MathFn::Cos, "cos", [](double x) { return std::cos(x); }, [](float x) { return std::cos(x); },
     -1e5f, 1e5f},
};

std::vector<MathIsa> isas() {
  std::vector<MathIsa> v{MathIsa::Scalar};
  if (math_isa() >= MathIsa::Avx2) v.push_back(MathIsa::Avx2);
  if (math_isa() >= MathIsa::Avx512) v.push_back(MathIsa::Avx512);
  return v;
}

// |got - want| in units of the float spacing at want (the smallest subnormal's below it).
double ulps(float got, double want) {
  const float w = static_cast<float>(want);
  const float up = std::nextafter(std::fabs(w), std::numeric_limits<float>::infinity());
  const double spacing = static_cast<double>(up) - std::fabs(static_cast<double>(w));
  return std::fabs(static_cast<double>(got) - want) / spacing;
}

std::vector<float> inputs(const Fn& f) {
  std::vector<float> xs;
  // A uniform sweep, a logarithmic one (small magnitudes, both signs), and random floats.
  for (int i = 0; i <= 20000; ++i)
    xs.push_back(f.lo + (f.hi - f.lo) * static_cast<float>(i) / 20000);
  for (int e = -40; e <= 40; ++e)
    for (float m : {1.0f, 1.37f, 1.93f}) {
      const float v = std::ldexp(m, e);
      if (v >= f.lo && v <= f.hi) xs.push_back(v);
      if (-v >= f.lo && -v <= f.hi) xs.push_back(-v);
    }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(f.lo, f.hi);
  for (int i = 0; i < 20000; ++i) xs.push_back(u(rng));
  return xs;
}

TEST(VectorMath, WithinFourUlpOfDoublePrecisionOnEveryIsaThisCpuRuns) {
  for (MathIsa isa : isas())
    for (const Fn& f : kFns) {
      SCOPED_TRACE(::testing::Message() << math_isa_name(isa) << " " << f.name);
      const std::vector<float> xs = inputs(f);
      std::vector<float> ys(xs.size());
      vector_math(f.fn, isa, static_cast<int64_t>(xs.size()), xs.data(), ys.data());
      double worst = 0;
      float at = 0;
      for (size_t i = 0; i < xs.size(); ++i) {
        const double u = ulps(ys[i], f.exact(xs[i]));
        if (!(u <= worst)) worst = u, at = xs[i];
      }
      EXPECT_LE(worst, 4.0) << "worst at x = " << at;
    }
}

// erf is lockstep's own (two fitted ranges, switching at |x| = 0.921875): every float of both
// signs within a factor of 1.1 of the switch, and every 1021st float up to 6, within 2 ulp
// (1.61 is the worst over all floats in [-6, 6]) on every vector ISA.
TEST(VectorMath, ErfWithinTwoUlpAroundItsRangeSwitchAndAcrossEveryBinade) {
  std::vector<float> xs;
  const auto bits = [](float v) {
    uint32_t u;
    std::memcpy(&u, &v, sizeof u);
    return u;
  };
  const auto from = [](uint32_t u) {
    float v;
    std::memcpy(&v, &u, sizeof v);
    return v;
  };
  for (uint32_t u = bits(0.921875f / 1.1f); u <= bits(0.921875f * 1.1f); ++u) xs.push_back(from(u));
  for (uint32_t u = 0; u <= bits(6.0f); u += 1021) xs.push_back(from(u));
  const size_t positive = xs.size();
  for (size_t i = 0; i < positive; ++i) xs.push_back(-xs[i]);
  for (MathIsa isa : isas()) {
    if (isa == MathIsa::Scalar) continue;
    SCOPED_TRACE(math_isa_name(isa));
    std::vector<float> ys(xs.size());
    vector_math(MathFn::Erf, isa, static_cast<int64_t>(xs.size()), xs.data(), ys.data());
    double worst = 0;
    float at = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      const double u = ulps(ys[i], std::erf(static_cast<double>(xs[i])));
      if (!(u <= worst)) worst = u, at = xs[i];
    }
    EXPECT_LE(worst, 2.0) << "worst at x = " << at;
  }
}

TEST(VectorMath, SpecialValuesAsTheScalarLibmGivesThem) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> xs = {std::nanf(""), -std::nanf(""), inf,     -inf,   0.0f,
                                 -0.0f,         100.0f,         -200.0f, 1e-45f, -1e-45f,
                                 3e38f,         -3e38f,         1.0f};
  for (MathIsa isa : isas())
    for (const Fn& f : kFns) {
      SCOPED_TRACE(::testing::Message() << math_isa_name(isa) << " " << f.name);
      std::vector<float> ys(xs.size());
      vector_math(f.fn, isa, static_cast<int64_t>(xs.size()), xs.data(), ys.data());
      for (size_t i = 0; i < xs.size(); ++i) {
        const float want = f.scalar(xs[i]);
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(ys[i])) << "x = " << xs[i] << ": " << ys[i];
        } else if (std::isinf(want) || want == 0.0f) {
          EXPECT_EQ(ys[i], want) << "x = " << xs[i];
          EXPECT_EQ(std::signbit(ys[i]), std::signbit(want)) << "x = " << xs[i];
        } else {
          EXPECT_LE(ulps(ys[i], f.exact(xs[i])), 4.0) << "x = " << xs[i] << ": " << ys[i];
        }
      }
    }
}

// exp's lanes below -87 (subnormal or zero results; a causal mask's -inf) skip libmvec's slow
// path: mixed into vectors with ordinary values, in every position, they still give exactly
// the scalar expf's values, and the ordinary lanes stay within the bound.
TEST(VectorMath, ExpOfFarNegativeInputsMixedWithOthersIsTheScalarOnes) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> low = {-inf,     -1e30f,  -200.0f, -110.0f, -109.99f, -104.0f,
                                  -103.97f, -100.0f, -95.5f,  -87.34f, -87.01f};
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-20.0f, 20.0f);
  std::uniform_int_distribution<size_t> pick(0, low.size() - 1);
  std::vector<float> xs;
  std::vector<bool> is_low;
  for (int i = 0; i < 4000; ++i) {
    const bool l = rng() % 3 == 0;
    xs.push_back(l ? low[pick(rng)] : u(rng));
    is_low.push_back(l);
  }
  xs.push_back(std::nanf(""));
  is_low.push_back(false);
  for (MathIsa isa : isas()) {
    SCOPED_TRACE(math_isa_name(isa));
    std::vector<float> ys(xs.size());
    vector_math(MathFn::Exp, isa, static_cast<int64_t>(xs.size()), xs.data(), ys.data());
    for (size_t i = 0; i < xs.size(); ++i) {
      const float want = std::exp(xs[i]);
      if (std::isnan(want))
        EXPECT_TRUE(std::isnan(ys[i])) << i;
      else if (is_low[i])
        ASSERT_EQ(std::memcmp(&ys[i], &want, sizeof(float)), 0)
            << "exp(" << xs[i] << ") = " << ys[i] << ", scalar " << want;
      else
        ASSERT_LE(ulps(ys[i], std::exp(static_cast<double>(xs[i]))), 4.0) << "x = " << xs[i];
    }
  }
}

TEST(VectorMath, AValueDoesNotDependOnWhereItLiesInTheRun) {
  std::vector<float> base(37);
  for (size_t i = 0; i < base.size(); ++i) base[i] = 0.37f * static_cast<float>(i) - 5.1f;
  for (MathIsa isa : isas())
    for (const Fn& f : kFns) {
      SCOPED_TRACE(::testing::Message() << math_isa_name(isa) << " " << f.name);
      std::vector<float> whole(base.size());
      vector_math(f.fn, isa, static_cast<int64_t>(base.size()), base.data(), whole.data());
      for (size_t start = 0; start < base.size(); ++start) {
        // A run starting at `start` (every tail length and alignment), computed in place.
        std::vector<float> run(base.begin() + static_cast<std::ptrdiff_t>(start), base.end());
        vector_math(f.fn, isa, static_cast<int64_t>(run.size()), run.data(), run.data());
        for (size_t i = 0; i < run.size(); ++i)
          ASSERT_EQ(std::memcmp(&run[i], &whole[start + i], sizeof(float)), 0)
              << "element " << start + i << " differs when the run starts at " << start;
      }
      vector_math(f.fn, isa, 0, nullptr, nullptr);  // an empty run touches nothing
    }
}

// GELU and its derivative in one pass per vector give, bit for bit, what the same float
// operations give as separate passes over the run with vector_math's erf and exp: on every ISA,
// every tail length, in place, far out where exp(-x^2 / 2) is subnormal or zero, and NaN / inf.
TEST(VectorMath, GeluInOnePassIsTheComposedFormulaBitForBit) {
  std::vector<float> x;
  for (int i = 0; i < 400; ++i) x.push_back(0.05f * static_cast<float>(i) - 10.0f);
  for (float v : {13.0f, -13.3f, 14.0f, -20.0f, 100.0f, -1e30f, 0.0f, -0.0f,
                  std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN(), 1e-30f})
    x.push_back(v);
  const int64_t n = static_cast<int64_t>(x.size());
  for (MathIsa isa : isas())
    for (bool derivative : {false, true}) {
      SCOPED_TRACE(::testing::Message() << math_isa_name(isa) << (derivative ? " gelu'" : " gelu"));
      std::vector<float> t(x.size()), u(x.size()), want(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        t[i] = x[i] * 0.70710678118654752f;
        u[i] = -0.5f * x[i] * x[i];
      }
      vector_math(MathFn::Erf, isa, n, t.data(), t.data());
      vector_math(MathFn::Exp, isa, n, u.data(), u.data());
      for (size_t i = 0; i < x.size(); ++i)
        want[i] = derivative ? 0.5f + 0.5f * t[i] + x[i] * u[i] * 0.39894228040143268f
                             : 0.5f * x[i] * (1.0f + t[i]);
      for (int64_t start : {0, 1, 5, 17, 400}) {
        std::vector<float> got(x.begin() + start, x.end());
        vector_math(derivative ? MathFn::GeluDerivative : MathFn::Gelu, isa, n - start, got.data(),
                    got.data());
        for (int64_t i = start; i < n; ++i)
          ASSERT_EQ(std::memcmp(&got[i - start], &want[i], sizeof(float)), 0)
              << "x = " << x[i] << ": " << got[i - start] << " against " << want[i];
      }
    }
}

}  // namespace
