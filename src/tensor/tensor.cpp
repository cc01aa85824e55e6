// The Tensor handle: metadata, reads (implicit syncs), printing, transfers, in-place updates.
#include <cstring>
#include <iomanip>
#include <sstream>
#include <type_traits>

#include "runtime/context.h"
#include "runtime/metrics.h"
#include "tensor/frontend.h"
#include "util/check.h"

namespace lockstep {

using frontend::node;
using util::cat;

Tensor::Tensor(std::shared_ptr<detail::TensorImpl> impl) : impl_(std::move(impl)) {}

namespace {
// The tensor's shape and dtype: the same for every value it takes (see TensorImpl).
const detail::TensorImpl& meta(const Tensor& t, const char* what) {
  if (!t.defined())
    throw Error(cat(what,
                    ": empty tensor handle (a default-constructed ls::Tensor); assign it a "
                    "value first"));
  return *t.impl();
}
}  // namespace

const Shape& Tensor::shape() const { return meta(*this, "shape").shape; }
int64_t Tensor::dim() const { return static_cast<int64_t>(shape().size()); }
int64_t Tensor::size(int64_t axis) const {
  const Shape& s = shape();
  return s[frontend::norm_axis(axis, static_cast<int64_t>(s.size()), "size", Loc::current())];
}
int64_t Tensor::numel() const { return shape_numel(shape()); }
DType Tensor::dtype() const { return meta(*this, "dtype").dtype; }
Device Tensor::device() const {
  return runtime::current_node(meta(*this, "device"))->device;  // Module::to moves tensors
}

bool Tensor::is_pending() const {
  if (!defined()) return false;
  runtime::TensorLock lock(*impl_);
  return runtime::holds_pending_value(*impl_);
}

bool Tensor::is_poisoned() const {
  if (!defined()) return false;
  ir::NodePtr n;
  {
    runtime::TensorLock lock(*impl_);
    if (impl_->poison) return true;
    n = impl_->node;
  }
  const auto& b = n->binding.buffer;
  return b && b->done.load() && b->error;
}

template <typename T>
std::vector<T> Tensor::to_vector(Loc loc) const {
  const ir::NodePtr& n = node(*this, "to_vector", loc);
  if constexpr (std::is_same_v<T, float>) {
    if (n->dtype == DType::BF16) {  // bf16 reads as float (exactly)
      const std::vector<unsigned char> bytes = runtime::read_bytes(*this, loc, "to_vector");
      std::vector<float> out(bytes.size() / 2);
      for (size_t i = 0; i < out.size(); ++i) {
        bfloat16 v;
        std::memcpy(&v.bits, bytes.data() + 2 * i, 2);
        out[i] = static_cast<float>(v);
      }
      return out;
    }
  }
  if (n->dtype != dtype_of<T>())
    util::fail(loc, "to_vector",
               cat("the tensor is ", dtype_name(n->dtype), " but ", dtype_name(dtype_of<T>()),
                   " values were asked for"),
               cat("Read it with the matching C++ type, or cast first: x.to(ls::",
                   dtype_name(dtype_of<T>()), ")"));
  const std::vector<unsigned char> bytes = runtime::read_bytes(*this, loc, "to_vector");
  std::vector<T> out(bytes.size() / sizeof(T));
  if (!out.empty()) std::memcpy(static_cast<void*>(out.data()), bytes.data(), bytes.size());
  return out;
}

template <typename T>
T Tensor::item(Loc loc) const {
  const ir::NodePtr& n = node(*this, "item", loc);
  if (shape_numel(n->shape) != 1)
    util::fail(loc, "item",
               cat("the tensor has ", shape_numel(n->shape), " elements (shape ",
                   shape_str(n->shape), "), not 1"),
               "Reduce it first (e.g. .sum()) or use to_vector()");
  const std::vector<unsigned char> bytes = runtime::read_bytes(*this, loc, "item");
  // Converts from the tensor's dtype, as PyTorch's item() then a C++ cast.
  auto as = [&](auto v) {
    std::memcpy(static_cast<void*>(&v), bytes.data(), sizeof v);
    return static_cast<T>(v);
  };
  switch (n->dtype) {
    case DType::F32:
      return as(float{});
    case DType::F64:
      return as(double{});
    case DType::I32:
      return as(int32_t{});
    case DType::I64:
      return as(int64_t{});
    case DType::Bool:
      return static_cast<T>(bytes[0] != 0);
    case DType::U8:
      return static_cast<T>(bytes[0]);
    case DType::BF16: {
      bfloat16 v;
      std::memcpy(&v.bits, bytes.data(), sizeof v.bits);
      return static_cast<T>(static_cast<float>(v));
    }
  }
  util::internal_fail(__FILE__, __LINE__, "item: unknown dtype");
}

template <>
std::vector<bool> Tensor::to_vector<bool>(Loc loc) const {
  const ir::NodePtr& n = node(*this, "to_vector", loc);
  if (n->dtype != DType::Bool)
    util::fail(loc, "to_vector",
               cat("the tensor is ", dtype_name(n->dtype), " but bool values were asked for"),
               "Read it with the matching C++ type, or compare first (x != 0)");
  const std::vector<unsigned char> bytes = runtime::read_bytes(*this, loc, "to_vector");
  return std::vector<bool>(bytes.begin(), bytes.end());
}

template float Tensor::item<float>(Loc) const;
template double Tensor::item<double>(Loc) const;
template int32_t Tensor::item<int32_t>(Loc) const;
template int64_t Tensor::item<int64_t>(Loc) const;
template bool Tensor::item<bool>(Loc) const;
template uint8_t Tensor::item<uint8_t>(Loc) const;
template std::vector<float> Tensor::to_vector<float>(Loc) const;
template std::vector<double> Tensor::to_vector<double>(Loc) const;
template std::vector<int32_t> Tensor::to_vector<int32_t>(Loc) const;
template std::vector<int64_t> Tensor::to_vector<int64_t>(Loc) const;
template std::vector<uint8_t> Tensor::to_vector<uint8_t>(Loc) const;

namespace {

std::string format_element(const unsigned char* p, DType dtype) {
  std::ostringstream os;
  switch (dtype) {
    case DType::F32: {
      float v;
      std::memcpy(&v, p, sizeof v);
      os << std::setprecision(6) << v;
      break;
    }
    case DType::F64: {
      double v;
      std::memcpy(&v, p, sizeof v);
      os << std::setprecision(10) << v;
      break;
    }
    case DType::I32: {
      int32_t v;
      std::memcpy(&v, p, sizeof v);
      os << v;
      break;
    }
    case DType::I64: {
      int64_t v;
      std::memcpy(&v, p, sizeof v);
      os << v;
      break;
    }
    case DType::Bool:
      os << (*p ? "true" : "false");
      break;
    case DType::U8:
      os << static_cast<int>(*p);
      break;
    case DType::BF16: {
      bfloat16 v;
      std::memcpy(&v.bits, p, sizeof v.bits);
      os << std::setprecision(4) << static_cast<float>(v);
      break;
    }
  }
  return os.str();
}

// Nested brackets; long dimensions show their first and last 3 entries, as PyTorch does.
void format(std::ostream& os, const unsigned char* data, const Shape& shape, size_t dim,
            int64_t offset, DType dtype, bool summarize) {
  if (dim == shape.size()) {
    os << format_element(data + offset * dtype_size(dtype), dtype);
    return;
  }
  int64_t inner = 1;
  for (size_t d = dim + 1; d < shape.size(); ++d) inner *= shape[d];
  os << "[";
  for (int64_t i = 0; i < shape[dim]; ++i) {
    if (summarize && shape[dim] > 6 && i == 3) {
      os << ", ...";
      i = shape[dim] - 4;
      continue;
    }
    if (i) os << (dim + 1 == shape.size() ? ", " : ",\n ");
    format(os, data, shape, dim + 1, offset + i * inner, dtype, summarize);
  }
  os << "]";
}

}  // namespace

std::string Tensor::to_string(Loc loc) const {
  const ir::NodePtr n = node(*this, "to_string", loc);
  const std::vector<unsigned char> bytes = runtime::read_bytes(*this, loc, "to_string");
  std::ostringstream os;
  format(os, bytes.data(), n->shape, 0, 0, n->dtype, shape_numel(n->shape) > 1000);
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "tensor(undefined)";
  if (t.is_poisoned()) return os << "tensor(poisoned)";
  return os << "tensor(" << dtype_name(t.dtype()) << shape_str(t.shape()) << ", "
            << device_name(t.device()) << ") " << t.to_string();
}

Tensor Tensor::to(Device device, Loc loc) const {
  const ir::NodePtr& n = node(*this, "to", loc);
  if (n->device == device) return clone(*this, loc);
  backends::backend_for(device);  // fails early for an unavailable device
  const std::vector<unsigned char> bytes = runtime::read_bytes(*this, loc, "to");
  runtime::count(runtime::Counter::Transfers);
  return runtime::new_tensor(ir::make_data(runtime::upload(device, bytes.data(), bytes.size()),
                                           n->shape, n->dtype, device));
}

Tensor Tensor::to(DType dtype, Loc loc) const { return cast(*this, dtype, loc); }

namespace {

// The node of a tensor about to be overwritten: a poisoned tensor may be given a new value.
ir::NodePtr target(const Tensor& self, const char* op, const Loc& loc) {
  if (!self.defined())
    util::fail(loc, op, "the target is an empty tensor handle",
               "In-place ops need an existing tensor; create one first, e.g. ls::zeros(shape)");
  return runtime::current_node(*self.impl());
}

// `reads_self`: the value is an elementwise op whose first operand is the tensor's value, e.g.
// add(self, o) for add_; if another thread replaced that value meanwhile, the update is refused.
Tensor& assign(Tensor& self, const Tensor& value, const char* op, const Loc& loc,
               bool reads_self = false) {
  const ir::NodePtr cur = target(self, op, loc);
  if (self.impl()->requires_grad && ir::grad_enabled())
    util::fail(loc, op,
               "in-place update of a tensor that requires grad, with gradient recording on",
               "Update parameters inside an ls::NoGrad scope (as optimizers do)");
  const ir::NodePtr& v = node(value, op, loc);
  if (v->shape != cur->shape)
    util::fail(loc, op,
               cat("the result has shape ", shape_str(v->shape), " but the tensor has shape ",
                   shape_str(cur->shape)),
               "An in-place op cannot change the tensor's shape; use the out-of-place op");
  if (v->dtype != cur->dtype)
    util::fail(
        loc, op,
        cat("the result is ", dtype_name(v->dtype), " but the tensor is ", dtype_name(cur->dtype)),
        "Cast the other operand to the tensor's dtype");
  runtime::set_value(*self.impl(), v, op, loc,
                     reads_self && !v->operands.empty() ? v->operands[0].get() : nullptr);
  return self;
}

}  // namespace

Tensor& Tensor::add_(const Tensor& o, Loc loc) {
  return assign(*this, add(*this, o, loc), "add_", loc, true);
}
Tensor& Tensor::sub_(const Tensor& o, Loc loc) {
  return assign(*this, sub(*this, o, loc), "sub_", loc, true);
}
Tensor& Tensor::mul_(const Tensor& o, Loc loc) {
  return assign(*this, mul(*this, o, loc), "mul_", loc, true);
}
Tensor& Tensor::div_(const Tensor& o, Loc loc) {
  return assign(*this, div(*this, o, loc), "div_", loc, true);
}
Tensor& Tensor::add_(Scalar o, Loc loc) {
  return assign(*this, add(*this, o, loc), "add_", loc, true);
}
Tensor& Tensor::sub_(Scalar o, Loc loc) {
  return assign(*this, sub(*this, o, loc), "sub_", loc, true);
}
Tensor& Tensor::mul_(Scalar o, Loc loc) {
  return assign(*this, mul(*this, o, loc), "mul_", loc, true);
}
Tensor& Tensor::div_(Scalar o, Loc loc) {
  return assign(*this, div(*this, o, loc), "div_", loc, true);
}

Tensor& Tensor::copy_(const Tensor& src, Loc loc) {
  const ir::NodePtr cur = target(*this, "copy_", loc);
  const ir::NodePtr& s = node(src, "copy_", loc);
  if (!(s->device == cur->device))
    util::fail(
        loc, "copy_",
        cat("source is on ", device_name(s->device), ", the tensor on ", device_name(cur->device)),
        "Move the source first with .to(device)");
  frontend::broadcast_shapes(s->shape, cur->shape, "copy_", loc);
  Tensor v = cast(src, cur->dtype, loc);
  return assign(
      *this,
      Tensor(runtime::new_tensor(frontend::expand_to(node(v, "copy_", loc), cur->shape, loc))),
      "copy_", loc);
}

Tensor& Tensor::fill_(Scalar value, Loc loc) {
  const ir::NodePtr cur = target(*this, "fill_", loc);
  return assign(*this, full(cur->shape, value, TensorOptions(cur->dtype, cur->device), loc),
                "fill_", loc);
}

Tensor& Tensor::zero_(Loc loc) { return fill_(0, loc); }

Tensor Tensor::reshape(const Shape& s, Loc loc) const { return lockstep::reshape(*this, s, loc); }
Tensor Tensor::index(const std::vector<TensorIndex>& indices, Loc loc) const {
  return lockstep::index(*this, indices, loc);
}
Tensor Tensor::permute(const std::vector<int64_t>& p, Loc loc) const {
  return lockstep::permute(*this, p, loc);
}
Tensor Tensor::sum(const std::vector<int64_t>& axes, bool keepdim, Loc loc) const {
  return lockstep::sum(*this, axes, keepdim, loc);
}
Tensor Tensor::mean(const std::vector<int64_t>& axes, bool keepdim, Loc loc) const {
  return lockstep::mean(*this, axes, keepdim, loc);
}

}  // namespace lockstep
