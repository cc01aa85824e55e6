// Dtype dispatch shared by the host backends' kernels.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include "lockstep/dtype.h"
#include "util/check.h"

namespace lockstep::backends {

// Calls f(T{}) with the C++ element type of `dtype`. Bf16 says how a backend sees bf16 elements:
// as lockstep::bfloat16, as their uint16_t bits, or void where its kernels never see bf16 (the ref
// backend widens it to f32 first), in which case f is not called for it.
template <typename Bf16, typename F>
void by_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::F32:
      return std::forward<F>(f)(float{});
    case DType::F64:
      return std::forward<F>(f)(double{});
    case DType::I32:
      return std::forward<F>(f)(int32_t{});
    case DType::I64:
      return std::forward<F>(f)(int64_t{});
    case DType::Bool:
      return std::forward<F>(f)(bool{});
    case DType::U8:
      return std::forward<F>(f)(uint8_t{});
    case DType::BF16:
      if constexpr (!std::is_void_v<Bf16>) return std::forward<F>(f)(Bf16{});
      return;
  }
  util::internal_fail(__FILE__, __LINE__, "unknown dtype");
}

}  // namespace lockstep::backends
