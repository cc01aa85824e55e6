// DType and Device helpers of the public dtype.h.
#include <string>

#include "lockstep/dtype.h"
#include "lockstep/error.h"

namespace lockstep {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return "f32";
    case DType::F64:
      return "f64";
    case DType::I32:
      return "i32";
    case DType::I64:
      return "i64";
    case DType::Bool:
      return "bool";
    case DType::BF16:
      return "bf16";
    case DType::U8:
      return "u8";
  }
  return "?";
}

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return 4;
    case DType::F64:
      return 8;
    case DType::I32:
      return 4;
    case DType::I64:
      return 8;
    case DType::Bool:
      return 1;
    case DType::BF16:
      return 2;
    case DType::U8:
      return 1;
  }
  return 0;
}

bool is_floating(DType dtype) {
  return dtype == DType::F32 || dtype == DType::F64 || dtype == DType::BF16;
}
bool is_integral(DType dtype) {
  return dtype == DType::I32 || dtype == DType::I64 || dtype == DType::U8;
}

std::ostream& operator<<(std::ostream& os, DType dtype) { return os << dtype_name(dtype); }

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

int64_t shape_numel(const Shape& shape) {
  // Recorded shapes are checked (ir::check_size); a shape still being checked may overflow: its
  // count saturates at INT64_MAX, which no real count matches. An empty shape is empty whatever
  // its other sizes.
  for (int64_t d : shape)
    if (d == 0) return 0;
  int64_t n = 1;
  for (int64_t d : shape)
    if (__builtin_mul_overflow(n, d, &n)) return INT64_MAX;
  return n;
}

std::string device_name(Device device) {
  switch (device.kind) {
    case DeviceKind::Ref:
      return "ref";
    case DeviceKind::Cpu:
      return "cpu";
    case DeviceKind::Cuda:
      return "cuda:" + std::to_string(device.index);
  }
  return "?";
}

std::ostream& operator<<(std::ostream& os, Device device) { return os << device_name(device); }

Device parse_device(const std::string& text) {
  if (text == "ref") return {DeviceKind::Ref, 0};
  if (text == "cpu") return {DeviceKind::Cpu, 0};
  if (text.rfind("cuda", 0) == 0) {
    if (text == "cuda") return {DeviceKind::Cuda, 0};
    if (text.size() > 5 && text[4] == ':' &&
        text.find_first_not_of("0123456789", 5) == std::string::npos)
      return {DeviceKind::Cuda, std::stoi(text.substr(5))};
  }
  throw Error("unknown device '" + text + "'. Use ref, cpu or cuda:N");
}

}  // namespace lockstep
