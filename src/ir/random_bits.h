// The semantics of RandomUniform, shared by every backend so that all produce the same numbers:
// element i of a draw with generator state {seed, counter} is a function of (seed, counter + i)
// only (a counter-based generator: splitmix64's output function over a seed-keyed stream).
#pragma once

#include <cstdint>

namespace lockstep::ir {

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline uint64_t random_bits(uint64_t seed, uint64_t counter) {
  const uint64_t gamma = 0x9E3779B97F4A7C15ull;
  return mix64(mix64(seed + gamma) + (counter + 1) * gamma);
}

// Uniform in [0, 1): 24 random bits for f32, 53 for f64, 8 for bf16 (each value a bf16 exactly,
// as PyTorch draws them: an f32 draw rounded to bf16 could give 1).
inline float random_uniform_bf16(uint64_t seed, uint64_t counter) {
  return static_cast<float>(random_bits(seed, counter) >> 56) * (1.0f / 256.0f);
}
inline float random_uniform_f32(uint64_t seed, uint64_t counter) {
  return static_cast<float>(random_bits(seed, counter) >> 40) * (1.0f / 16777216.0f);
}
inline double random_uniform_f64(uint64_t seed, uint64_t counter) {
  return static_cast<double>(random_bits(seed, counter) >> 11) * (1.0 / 9007199254740992.0);
}

}  // namespace lockstep::ir
