// `Tensor`: a cheap shared handle to a value that is either materialized (a device buffer) or
// pending (an IR value). Operations only record; reads run what they need and block.
// Not here: the operations themselves (ops.h) and the step/sync machinery (runtime.h).
#pragma once

#include <concepts>
#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "lockstep/dtype.h"
#include "lockstep/loc.h"

namespace lockstep {

namespace detail {
struct TensorImpl;
}

// A host number given to an op (`x * 0.5`, a learning rate). It becomes a runtime input of the
// step's program, never part of its hash: changing it never recompiles.
class Scalar {
 public:
  template <typename T, typename = std::enable_if_t<std::is_arithmetic_v<T>>>
  Scalar(T value)  // NOLINT(google-explicit-constructor): numbers convert implicitly.
      : is_integer_(std::is_integral_v<T>),
        is_bool_(std::is_same_v<T, bool>),
        f_(static_cast<double>(value)),
        i_(std::is_integral_v<T> ? static_cast<int64_t>(value) : 0) {}
  bool is_integer() const { return is_integer_; }  // true for bool too
  bool is_bool() const { return is_bool_; }
  double to_double() const { return f_; }
  int64_t to_int() const { return is_integer_ ? i_ : static_cast<int64_t>(f_); }

 private:
  bool is_integer_;
  bool is_bool_;
  double f_;
  int64_t i_;
};

struct TensorOptions {
  DType dtype = DType::F32;
  // Unset: the default device (see default_device()).
  bool has_device = false;
  Device device{};
  TensorOptions() = default;
  TensorOptions(DType d) : dtype(d) {}  // NOLINT(google-explicit-constructor)
  TensorOptions(DType d, Device dev) : dtype(d), has_device(true), device(dev) {}
};

class Tensor;

// PyTorch's basic indexing, as libtorch spells it: x.index({ls::Slice(), -1}) is x[:, -1],
// x.index({ls::Ellipsis, ls::Slice(1, 3)}) is x[..., 1:3], x.index({0, ls::None}) is x[0, None].
// A slice's start and stop may be negative and are clamped, as Python's; its step is positive.
struct Slice {
  std::optional<int64_t> start, stop;
  int64_t step = 1;
  Slice(std::optional<int64_t> start_ = std::nullopt, std::optional<int64_t> stop_ = std::nullopt,
        int64_t step_ = 1)
      : start(start_), stop(stop_), step(step_) {}
};
struct EllipsisIndex {};
inline constexpr EllipsisIndex Ellipsis{};
struct NoneIndex {};  // a new axis of size 1
inline constexpr NoneIndex None{};
class TensorIndex {
 public:
  TensorIndex(int64_t i) : v_(i) {}        // NOLINT: implicit, as libtorch's
  TensorIndex(int i) : v_(int64_t{i}) {}   // NOLINT
  TensorIndex(Slice s) : v_(s) {}          // NOLINT
  TensorIndex(EllipsisIndex e) : v_(e) {}  // NOLINT
  TensorIndex(NoneIndex n) : v_(n) {}      // NOLINT
  const std::variant<int64_t, Slice, EllipsisIndex, NoneIndex>& value() const { return v_; }

 private:
  std::variant<int64_t, Slice, EllipsisIndex, NoneIndex> v_;
};

// Carries the source location of the user's expression into operators, which cannot take a
// defaulted location parameter themselves.
template <typename T>
struct Located {
  const T& value;
  Loc loc;
  Located(const T& v, Loc l = Loc::current()) : value(v), loc(l) {}  // NOLINT
};

class Tensor {
 public:
  Tensor() = default;  // An empty handle: defined() is false.
  explicit Tensor(std::shared_ptr<detail::TensorImpl> impl);

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  int64_t dim() const;
  int64_t size(int64_t axis) const;
  int64_t numel() const;
  DType dtype() const;
  Device device() const;
  // True while the value is recorded but not yet computed.
  bool is_pending() const;
  // True when the value was lost (its step rolled back, or its execution failed); reading or
  // using it throws the reason.
  bool is_poisoned() const;
  // Whether two handles name the same tensor.
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }

  // Reads. Each runs only the sub-graph the value needs, blocks, and counts as an implicit sync.
  // item converts the one element to T (item<double>() of an f32 reads it, as PyTorch's);
  // to_vector needs T to be the tensor's element type (float for f32, int64_t for i64, ...).
  template <typename T>
  T item(Loc loc = Loc::current()) const;
  template <typename T>
  std::vector<T> to_vector(Loc loc = Loc::current()) const;
  // The values as text, nested brackets, e.g. "[[1, 2], [3, 4]]".
  std::string to_string(Loc loc = Loc::current()) const;

  // A copy on another device (counted as a transfer), or converted to another dtype.
  Tensor to(Device device, Loc loc = Loc::current()) const;
  Tensor to(DType dtype, Loc loc = Loc::current()) const;

  // In place: the tensor itself takes the new value (every handle to it sees it).
  Tensor& add_(const Tensor& other, Loc loc = Loc::current());
  Tensor& sub_(const Tensor& other, Loc loc = Loc::current());
  Tensor& mul_(const Tensor& other, Loc loc = Loc::current());
  Tensor& div_(const Tensor& other, Loc loc = Loc::current());
  Tensor& add_(Scalar other, Loc loc = Loc::current());
  Tensor& sub_(Scalar other, Loc loc = Loc::current());
  Tensor& mul_(Scalar other, Loc loc = Loc::current());
  Tensor& div_(Scalar other, Loc loc = Loc::current());
  // Takes src's value (broadcast to this shape, same dtype).
  Tensor& copy_(const Tensor& src, Loc loc = Loc::current());
  Tensor& fill_(Scalar value, Loc loc = Loc::current());
  Tensor& zero_(Loc loc = Loc::current());
  Tensor& operator+=(Located<Tensor> other) { return add_(other.value, other.loc); }
  Tensor& operator-=(Located<Tensor> other) { return sub_(other.value, other.loc); }
  Tensor& operator*=(Located<Tensor> other) { return mul_(other.value, other.loc); }
  Tensor& operator/=(Located<Tensor> other) { return div_(other.value, other.loc); }
  Tensor& operator+=(Scalar other) { return add_(other); }
  Tensor& operator-=(Scalar other) { return sub_(other); }
  Tensor& operator*=(Scalar other) { return mul_(other); }
  Tensor& operator/=(Scalar other) { return div_(other); }

  // Autograd (see autograd.h). Only floating-point leaf tensors (not results of ops) can
  // require grad; their gradients accumulate in grad() (an empty handle until the first
  // backward, and again after set_grad(Tensor())).
  Tensor& set_requires_grad(bool requires_grad = true, Loc loc = Loc::current());
  bool requires_grad() const;
  Tensor grad() const;
  void set_grad(const Tensor& grad, Loc loc = Loc::current());
  void backward(Loc loc = Loc::current()) const;
  // The same value without gradient history.
  Tensor detach(Loc loc = Loc::current()) const;

  // Shorthands for the free functions in ops.h.
  Tensor reshape(const Shape& shape, Loc loc = Loc::current()) const;
  // Basic indexing (TensorIndex above), as ls::index.
  Tensor index(const std::vector<TensorIndex>& indices, Loc loc = Loc::current()) const;
  Tensor permute(const std::vector<int64_t>& perm, Loc loc = Loc::current()) const;
  Tensor sum(const std::vector<int64_t>& axes = {}, bool keepdim = false,
             Loc loc = Loc::current()) const;
  Tensor mean(const std::vector<int64_t>& axes = {}, bool keepdim = false,
              Loc loc = Loc::current()) const;

  detail::TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<detail::TensorImpl>& impl_ptr() const { return impl_; }

 private:
  std::shared_ptr<detail::TensorImpl> impl_;
};

template <>
std::vector<bool> Tensor::to_vector<bool>(Loc loc) const;

// Prints "tensor(f32[2, 2], ref) [[1, 2], [3, 4]]"; an implicit sync.
std::ostream& operator<<(std::ostream& os, const Tensor& t);

}  // namespace lockstep
