// Element types and devices: the two facts besides the shape that every tensor carries.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace lockstep {

// Every switch over DType has no default, so adding one lists the places that must handle it.
// BF16: bfloat16 (f32's exponent, 7 mantissa bits); the ref backend computes it as its
// definition says: inputs widened to f32, f32 arithmetic, the result rounded to nearest even.
// U8: unsigned 8-bit integers (images as PyTorch's uint8 holds them); arithmetic wraps mod 256.
enum class DType : uint8_t { F32, F64, I32, I64, Bool, BF16, U8 };

inline constexpr DType f32 = DType::F32;
inline constexpr DType f64 = DType::F64;
inline constexpr DType i32 = DType::I32;
inline constexpr DType i64 = DType::I64;
inline constexpr DType boolean = DType::Bool;
inline constexpr DType bf16 = DType::BF16;
inline constexpr DType u8 = DType::U8;

// One bfloat16 value: the top 16 bits of an f32. From float rounds to nearest, ties to even
// (overflow gives inf, NaN stays a quiet NaN); to float is exact. Written as a select, without
// branches, so that loops over it vectorize (the cpu backend's bf16 kernels use it).
struct bfloat16 {
  uint16_t bits = 0;
  bfloat16() = default;
  explicit bfloat16(float f) {
    const uint32_t u = std::bit_cast<uint32_t>(f);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t quiet_nan = (u >> 16) | 0x40u;
    bits = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
  }
  explicit operator float() const {
    return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
  }
};

const char* dtype_name(DType dtype);
size_t dtype_size(DType dtype);
bool is_floating(DType dtype);
bool is_integral(DType dtype);  // I32, I64, U8 (not Bool)
std::ostream& operator<<(std::ostream& os, DType dtype);

// The C++ type that stores one element of a dtype, and back.
template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::F32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::F64;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::I32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::I64;
}
template <>
constexpr DType dtype_of<bool>() {
  return DType::Bool;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::U8;
}
template <>
constexpr DType dtype_of<bfloat16>() {
  return DType::BF16;
}

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& shape);
int64_t shape_numel(const Shape& shape);

enum class DeviceKind : uint8_t { Ref, Cpu, Cuda };

struct Device {
  DeviceKind kind = DeviceKind::Ref;
  int index = 0;
  friend bool operator==(const Device&, const Device&) = default;
};

std::string device_name(Device device);
std::ostream& operator<<(std::ostream& os, Device device);
// Parses "ref", "cpu", "cuda:1". Throws Error on anything else.
Device parse_device(const std::string& text);

// The device new tensors land on when no device is given.
Device default_device();
void set_default_device(Device device);

}  // namespace lockstep
