// libmvec's vector variants, called through their vector-ABI names (glibc declares them for
// the compiler's use only under -ffast-math, which the kernels do not take), and erf of our own.
#include "backends/cpu/vector_math.h"

#include <immintrin.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "util/check.h"

extern "C" {
__m256 _ZGVdN8v_expf(__m256);
__m256 _ZGVdN8v_logf(__m256);
__m256 _ZGVdN8v_tanhf(__m256);
__m256 _ZGVdN8v_sinf(__m256);
__m256 _ZGVdN8v_cosf(__m256);
__m512 _ZGVeN16v_expf(__m512);
__m512 _ZGVeN16v_logf(__m512);
__m512 _ZGVeN16v_tanhf(__m512);
__m512 _ZGVeN16v_sinf(__m512);
__m512 _ZGVeN16v_cosf(__m512);
}

namespace lockstep::backends::cpu {
namespace {

template <__m256 (*F)(__m256)>
__attribute__((target("avx2,fma"))) void run_avx2(int64_t n, const float* x, float* y) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, F(_mm256_loadu_ps(x + i)));
  if (i < n) {  // the tail in a vector of its own, zeros in the unused lanes
    float buf[8] = {};
    std::memcpy(buf, x + i, static_cast<size_t>(n - i) * sizeof(float));
    _mm256_storeu_ps(buf, F(_mm256_loadu_ps(buf)));
    std::memcpy(y + i, buf, static_cast<size_t>(n - i) * sizeof(float));
  }
}

template <__m512 (*F)(__m512)>
__attribute__((target("avx512f"))) void run_avx512(int64_t n, const float* x, float* y) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, F(_mm512_loadu_ps(x + i)));
  if (i < n) {
    float buf[16] = {};
    std::memcpy(buf, x + i, static_cast<size_t>(n - i) * sizeof(float));
    _mm512_storeu_ps(buf, F(_mm512_loadu_ps(buf)));
    std::memcpy(y + i, buf, static_cast<size_t>(n - i) * sizeof(float));
  }
}

// exp with far-negative inputs kept off libmvec's slow path. libmvec's expf hands every vector
// with a lane below about -87.3 (where results turn subnormal, then zero; -inf included) to
// scalar code lane by lane: a causal attention's softmax, half of whose scores are -inf, ran its
// exp 5.5x slower. Such lanes go in as -87 and come out as the scalar expf of the real input
// (0 at -110 and below, vectorized; glibc's scalar expf between), so the results are
// unchanged.
constexpr float kExpSlow = -87.0f, kExpZero = -110.0f;

// F is libmvec's expf, passed as run_avx2's is (clang refuses a direct call with vector
// arguments to a function declared without the ISA's target attribute).
template <__m256 (*F)(__m256)>
__attribute__((target("avx2,fma"))) __m256 exp_avx2(__m256 v) {
  const __m256 low = _mm256_cmp_ps(v, _mm256_set1_ps(kExpSlow), _CMP_LT_OQ);
  if (!_mm256_movemask_ps(low)) return F(v);
  const __m256 zero = _mm256_cmp_ps(v, _mm256_set1_ps(kExpZero), _CMP_LE_OQ);
  __m256 r = F(_mm256_blendv_ps(v, _mm256_set1_ps(kExpSlow), low));
  r = _mm256_blendv_ps(r, _mm256_setzero_ps(), zero);
  const int sub = _mm256_movemask_ps(_mm256_andnot_ps(zero, low));  // subnormal results
  if (!sub) return r;
  alignas(32) float in[8], out[8];
  _mm256_store_ps(in, v);
  _mm256_store_ps(out, r);
  for (int k = 0; k < 8; ++k)
    if (sub >> k & 1) out[k] = std::exp(in[k]);
  return _mm256_load_ps(out);
}

template <__m512 (*F)(__m512)>
__attribute__((target("avx512f"))) __m512 exp_avx512(__m512 v) {
  const __mmask16 low = _mm512_cmp_ps_mask(v, _mm512_set1_ps(kExpSlow), _CMP_LT_OQ);
  if (!low) return F(v);
  const __mmask16 zero = _mm512_cmp_ps_mask(v, _mm512_set1_ps(kExpZero), _CMP_LE_OQ);
  __m512 r = F(_mm512_mask_blend_ps(low, v, _mm512_set1_ps(kExpSlow)));
  r = _mm512_mask_blend_ps(zero, r, _mm512_setzero_ps());
  const __mmask16 sub = low & static_cast<__mmask16>(~zero);
  if (!sub) return r;
  alignas(64) float in[16], out[16];
  _mm512_store_ps(in, v);
  _mm512_store_ps(out, r);
  for (int k = 0; k < 16; ++k)
    if (sub >> k & 1) out[k] = std::exp(in[k]);
  return _mm512_load_ps(out);
}

// erf of our own, fitted for this file: libmvec's erff cost 0.73-1.05 ms per million floats on
// one core (AVX-512, Xeon model 207), its expf 0.24-0.46, and GELU, forward and backward, is an
// erf per element. Two ranges, both computed and the lane's picked:
//   |x| <= 0.921875: erf(x) = x + x q(x^2), q of degree 5 (relative error 1.5e-8);
//   |x| >  0.921875: erf(x) = sign(x) (1 - exp(p(|x|))), p of degree 5 fitted to log(erfc(t)) on
//     [0.921875, 3.93] (erfc's error at most 2.3e-8; |x| is clamped to 3.93, where 1 - erfc
//     rounds to 1), exp by an argument reduction to [-ln 2 / 2, ln 2 / 2] and a polynomial of
//     degree 5 (relative error 1.1e-7; exp's argument lies in [-17.5, -1.6], so no overflow,
//     underflow or special value).
// The coefficients are least-squares fits iterated toward minimax (Lawson's algorithm) against
// 40-digit erf, erfc and exp, rounded to float; checked against double precision over every
// float in [-6, 6]: at most 1.61 ulp (libmvec's bound is 4); 0.52-0.66 ms per million floats
// where libmvec's erff took 0.73-0.99 in the same runs (1.2-1.4x; five alternating pairs).
// NaN stays NaN, +-inf gives +-1, -0 gives -0, subnormals x (2 / sqrt pi) as libm.
constexpr float kErfSwitch = 0.921875f, kErfClamp = 3.93f;
constexpr float kErfSmall[] = {-6.013434718e-04f, 4.998010239e-03f,  -2.677023948e-02f,
                               1.128192745e-01f,  -3.761250572e-01f, 1.283791517e-01f};
constexpr float kErfLogErfc[] = {-1.229059695e-03f, 1.540436173e-02f,  -9.058093157e-02f,
                                 -6.515336610e-01f, -1.119631391e+00f, -2.034710205e-03f};
constexpr float kExpReduced[] = {
    8.312521451e-03f, 4.189014670e-02f, 1.666711460e-01f, 4.999923156e-01f, 1.0f, 1.0f};
constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693145751953125f,
                kLn2Lo = 1.428606765330187045e-06f;

template <size_t N>
__attribute__((target("avx2,fma"))) __m256 horner(const float (&c)[N], __m256 x) {
  __m256 r = _mm256_set1_ps(c[0]);
  for (size_t i = 1; i < N; ++i) r = _mm256_fmadd_ps(r, x, _mm256_set1_ps(c[i]));
  return r;
}

template <size_t N>
__attribute__((target("avx512f"))) __m512 horner(const float (&c)[N], __m512 x) {
  __m512 r = _mm512_set1_ps(c[0]);
  for (size_t i = 1; i < N; ++i) r = _mm512_fmadd_ps(r, x, _mm512_set1_ps(c[i]));
  return r;
}

__attribute__((target("avx2,fma"))) __m256 erf_avx2(__m256 a) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 t = _mm256_andnot_ps(sign, a);
  const __m256 small = _mm256_fmadd_ps(horner(kErfSmall, _mm256_mul_ps(a, a)), a, a);
  const __m256 p = horner(kErfLogErfc, _mm256_min_ps(t, _mm256_set1_ps(kErfClamp)));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(p, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), p);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  const __m256 two_n = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  const __m256 erfc = _mm256_mul_ps(horner(kExpReduced, r), two_n);
  const __m256 big =
      _mm256_or_ps(_mm256_sub_ps(_mm256_set1_ps(1.0f), erfc), _mm256_and_ps(a, sign));
  return _mm256_blendv_ps(small, big, _mm256_cmp_ps(t, _mm256_set1_ps(kErfSwitch), _CMP_GT_OQ));
}

// The all-lanes masked forms: GCC 12's unmasked min, roundscale and scalef read an undefined
// vector that -Wuninitialized reports.
constexpr __mmask16 kAllLanes = 0xffff;

__attribute__((target("avx512f"))) __m512 erf_avx512(__m512 a) {
  const __m512 t = _mm512_abs_ps(a);
  const __m512 small = _mm512_fmadd_ps(horner(kErfSmall, _mm512_mul_ps(a, a)), a, a);
  const __m512 p =
      horner(kErfLogErfc, _mm512_maskz_min_ps(kAllLanes, t, _mm512_set1_ps(kErfClamp)));
  const __m512 n = _mm512_maskz_roundscale_ps(kAllLanes, _mm512_mul_ps(p, _mm512_set1_ps(kLog2e)),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), p);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  const __m512 erfc = _mm512_maskz_scalef_ps(kAllLanes, horner(kExpReduced, r), n);
  const __m512i one_minus = _mm512_castps_si512(_mm512_sub_ps(_mm512_set1_ps(1.0f), erfc));
  const __m512 big = _mm512_castsi512_ps(_mm512_or_si512(
      one_minus, _mm512_and_si512(_mm512_castps_si512(a), _mm512_set1_epi32(INT32_MIN))));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(t, _mm512_set1_ps(kErfSwitch), _CMP_GT_OQ), small,
                              big);
}

// GELU and its derivative per vector, erf (and libmvec's exp) inline, so that run_avx2 and
// run_avx512 compute them in one pass instead of a pass per operation; the same operations in
// the same order as the scalar versions below (this file is built without fused multiply-adds),
// so that the vector values are those of the separate passes:
// gelu(x) = (x / 2) (1 + erf(x / sqrt 2)), gelu'(x) = (1 + erf(x / sqrt 2)) / 2 + x phi(x).
constexpr float kRsqrt2 = 0.70710678118654752f, kRsqrt2Pi = 0.39894228040143268f;

template <__m256 (*Erf)(__m256)>
__attribute__((target("avx2,fma"))) __m256 gelu_avx2(__m256 a) {
  const __m256 t = Erf(_mm256_mul_ps(a, _mm256_set1_ps(kRsqrt2)));
  return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), a),
                       _mm256_add_ps(_mm256_set1_ps(1.0f), t));
}

template <__m256 (*Erf)(__m256), __m256 (*Exp)(__m256)>
__attribute__((target("avx2,fma"))) __m256 gelu_derivative_avx2(__m256 a) {
  const __m256 half = _mm256_set1_ps(0.5f);
  const __m256 t = Erf(_mm256_mul_ps(a, _mm256_set1_ps(kRsqrt2)));
  const __m256 u = Exp(_mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(-0.5f), a), a));
  return _mm256_add_ps(_mm256_add_ps(half, _mm256_mul_ps(half, t)),
                       _mm256_mul_ps(_mm256_mul_ps(a, u), _mm256_set1_ps(kRsqrt2Pi)));
}

template <__m512 (*Erf)(__m512)>
__attribute__((target("avx512f"))) __m512 gelu_avx512(__m512 a) {
  const __m512 t = Erf(_mm512_mul_ps(a, _mm512_set1_ps(kRsqrt2)));
  return _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), a),
                       _mm512_add_ps(_mm512_set1_ps(1.0f), t));
}

template <__m512 (*Erf)(__m512), __m512 (*Exp)(__m512)>
__attribute__((target("avx512f"))) __m512 gelu_derivative_avx512(__m512 a) {
  const __m512 half = _mm512_set1_ps(0.5f);
  const __m512 t = Erf(_mm512_mul_ps(a, _mm512_set1_ps(kRsqrt2)));
  const __m512 u = Exp(_mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(-0.5f), a), a));
  return _mm512_add_ps(_mm512_add_ps(half, _mm512_mul_ps(half, t)),
                       _mm512_mul_ps(_mm512_mul_ps(a, u), _mm512_set1_ps(kRsqrt2Pi)));
}

template <float (*F)(float)>
void run_scalar(int64_t n, const float* x, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = F(x[i]);
}

float exp_f(float v) { return std::exp(v); }
float log_f(float v) { return std::log(v); }
float tanh_f(float v) { return std::tanh(v); }
float erf_f(float v) { return std::erf(v); }
float sin_f(float v) { return std::sin(v); }
float cos_f(float v) { return std::cos(v); }
float gelu_f(float v) { return 0.5f * v * (1.0f + std::erf(v * kRsqrt2)); }
float gelu_derivative_f(float v) {
  return 0.5f + 0.5f * std::erf(v * kRsqrt2) + v * std::exp(-0.5f * v * v) * kRsqrt2Pi;
}

using Run = void (*)(int64_t, const float*, float*);

// [isa][fn]
constexpr Run kRuns[3][8] = {
    {run_scalar<exp_f>, run_scalar<log_f>, run_scalar<tanh_f>, run_scalar<erf_f>, run_scalar<sin_f>,
     run_scalar<cos_f>, run_scalar<gelu_f>, run_scalar<gelu_derivative_f>},
    {run_avx2<exp_avx2<_ZGVdN8v_expf>>, run_avx2<_ZGVdN8v_logf>, run_avx2<_ZGVdN8v_tanhf>,
     run_avx2<erf_avx2>, run_avx2<_ZGVdN8v_sinf>, run_avx2<_ZGVdN8v_cosf>,
     run_avx2<gelu_avx2<erf_avx2>>,
     run_avx2<gelu_derivative_avx2<erf_avx2, exp_avx2<_ZGVdN8v_expf>>>},
    {run_avx512<exp_avx512<_ZGVeN16v_expf>>, run_avx512<_ZGVeN16v_logf>,
     run_avx512<_ZGVeN16v_tanhf>, run_avx512<erf_avx512>, run_avx512<_ZGVeN16v_sinf>,
     run_avx512<_ZGVeN16v_cosf>, run_avx512<gelu_avx512<erf_avx512>>,
     run_avx512<gelu_derivative_avx512<erf_avx512, exp_avx512<_ZGVeN16v_expf>>>},
};

// [isa - 1][fn]: the per-vector functions of kRuns.
void* const kVectorFns[2][8] = {
    {reinterpret_cast<void*>(exp_avx2<_ZGVdN8v_expf>), reinterpret_cast<void*>(_ZGVdN8v_logf),
     reinterpret_cast<void*>(_ZGVdN8v_tanhf), reinterpret_cast<void*>(erf_avx2),
     reinterpret_cast<void*>(_ZGVdN8v_sinf), reinterpret_cast<void*>(_ZGVdN8v_cosf),
     reinterpret_cast<void*>(gelu_avx2<erf_avx2>),
     reinterpret_cast<void*>(gelu_derivative_avx2<erf_avx2, exp_avx2<_ZGVdN8v_expf>>)},
    {reinterpret_cast<void*>(exp_avx512<_ZGVeN16v_expf>), reinterpret_cast<void*>(_ZGVeN16v_logf),
     reinterpret_cast<void*>(_ZGVeN16v_tanhf), reinterpret_cast<void*>(erf_avx512),
     reinterpret_cast<void*>(_ZGVeN16v_sinf), reinterpret_cast<void*>(_ZGVeN16v_cosf),
     reinterpret_cast<void*>(gelu_avx512<erf_avx512>),
     reinterpret_cast<void*>(gelu_derivative_avx512<erf_avx512, exp_avx512<_ZGVeN16v_expf>>)},
};

MathIsa detect() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return MathIsa::Avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return MathIsa::Avx2;
  return MathIsa::Scalar;
}

}  // namespace

MathIsa math_isa() {
  static const MathIsa isa = detect();
  return isa;
}

const char* math_isa_name(MathIsa isa) {
  switch (isa) {
    case MathIsa::Scalar:
      return "scalar libm";
    case MathIsa::Avx2:
      return "libmvec AVX2";
    case MathIsa::Avx512:
      return "libmvec AVX-512";
  }
  return "?";
}

void vector_math(MathFn f, int64_t n, const float* x, float* y) {
  static const MathIsa isa = math_isa();
  kRuns[static_cast<int>(isa)][static_cast<int>(f)](n, x, y);
}

void vector_math(MathFn f, MathIsa isa, int64_t n, const float* x, float* y) {
  LS_INTERNAL_CHECK(static_cast<int>(isa) <= static_cast<int>(math_isa()),
                    "vector_math: this CPU does not run that ISA");
  kRuns[static_cast<int>(isa)][static_cast<int>(f)](n, x, y);
}

void* vector_math_fn(MathFn f, MathIsa isa) {
  if (isa == MathIsa::Scalar) return nullptr;
  return kVectorFns[static_cast<int>(isa) - 1][static_cast<int>(f)];
}

}  // namespace lockstep::backends::cpu
