// Transcendental functions over f32 runs, picked by the CPU this process runs on: exp, log, tanh,
// sin and cos from glibc's vector math library (libmvec, glibc 2.35 and later: 8 lanes with AVX2
// and FMA, 16 with AVX-512), erf of lockstep's own (vector_math.cpp; at most 1.61 ulp, cheaper
// than libmvec's). libmvec's documented bound for its functions (glibc manual, "Known Maximum
// Errors in Math Functions", x86_64 vector variants) is at most 4 ulp; tests/unit/
// vector_math_test.cpp checks every ISA this CPU runs against double precision with that bound
// (erf with 2), and the special values (NaN, +-inf, 0, -0, overflow and underflow) against the
// scalar libm. Without AVX2 the scalar libm computes them.
#pragma once

#include <cstdint>

namespace lockstep::backends::cpu {

// Gelu (exact: (x / 2) (1 + erf(x / sqrt 2))) and GeluDerivative are computed from these erf
// and exp in one pass, their values those of the same float operations as separate passes.
enum class MathFn : uint8_t { Exp, Log, Tanh, Erf, Sin, Cos, Gelu, GeluDerivative };
enum class MathIsa : uint8_t { Scalar, Avx2, Avx512 };

// The widest ISA this CPU runs (AVX-512F, else AVX2 with FMA, else scalar).
MathIsa math_isa();
const char* math_isa_name(MathIsa isa);

// y[i] = f(x[i]) for i < n, with the best ISA; y may be x. Values do not depend on where an
// element lies in the run (a tail is computed in a full vector of its own).
void vector_math(MathFn f, int64_t n, const float* x, float* y);
// The same with a given ISA (tests); `isa` must be one this CPU runs.
void vector_math(MathFn f, MathIsa isa, int64_t n, const float* x, float* y);
// The function vector_math runs on each vector of `isa` (AVX-512: __m512 (*)(__m512); AVX2:
// __m256 (*)(__m256)), for native code that computes f on vectors it holds in registers with the
// same values (native.cpp); null for the scalar ISA.
void* vector_math_fn(MathFn f, MathIsa isa);

}  // namespace lockstep::backends::cpu
