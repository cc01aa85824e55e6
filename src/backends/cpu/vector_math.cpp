// libmvec's vector variants, called through their vector-ABI names (glibc declares them for
// the compiler's use only under -ffast-math, which the kernels do not take).
#include "backends/cpu/vector_math.h"

#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "util/check.h"

extern "C" {
__m256 _ZGVdN8v_expf(__m256);
__m256 _ZGVdN8v_logf(__m256);
__m256 _ZGVdN8v_tanhf(__m256);
__m256 _ZGVdN8v_erff(__m256);
__m256 _ZGVdN8v_sinf(__m256);
__m256 _ZGVdN8v_cosf(__m256);
__m512 _ZGVeN16v_expf(__m512);
__m512 _ZGVeN16v_logf(__m512);
__m512 _ZGVeN16v_tanhf(__m512);
__m512 _ZGVeN16v_erff(__m512);
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

using Run = void (*)(int64_t, const float*, float*);

// [isa][fn]
constexpr Run kRuns[3][6] = {
    {run_scalar<exp_f>, run_scalar<log_f>, run_scalar<tanh_f>, run_scalar<erf_f>, run_scalar<sin_f>,
     run_scalar<cos_f>},
    {run_avx2<_ZGVdN8v_expf>, run_avx2<_ZGVdN8v_logf>, run_avx2<_ZGVdN8v_tanhf>,
     run_avx2<_ZGVdN8v_erff>, run_avx2<_ZGVdN8v_sinf>, run_avx2<_ZGVdN8v_cosf>},
    {run_avx512<_ZGVeN16v_expf>, run_avx512<_ZGVeN16v_logf>, run_avx512<_ZGVeN16v_tanhf>,
     run_avx512<_ZGVeN16v_erff>, run_avx512<_ZGVeN16v_sinf>, run_avx512<_ZGVeN16v_cosf>},
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

}  // namespace lockstep::backends::cpu
