// The ops of ops.h as lockstep.<name>, with PyTorch's argument names (input, dim, keepdim);
// tensor.cpp makes the ones that take a tensor first Tensor methods too. No binding passes a
// place: the library resolves this file's to the user's line (common.h).
#include <map>
#include <string>

#include "common.h"

namespace lockstep::python {
namespace {

// (values, indices) as PyTorch returns them: a named tuple (torch.return_types.topk, ...), so
// that `.values` and `.indices` work as well as unpacking.
py::object values_indices(const char* kind, const Tensor& values, const Tensor& indices) {
  static auto* types = new std::map<std::string, py::object>;  // never destroyed: Python's
  py::object& type = (*types)[kind];
  if (!type) {
    type = py::module_::import("collections")
               .attr("namedtuple")(kind, py::make_tuple("values", "indices"));
    type.attr("__module__") = "lockstep.return_types";
  }
  return type(values, indices);
}

TensorOptions options_of(const std::optional<PyDType>& dtype, DType fallback = DType::F32) {
  return TensorOptions(dtype ? dtype->value : fallback);
}

}  // namespace

void init_ops(py::module_& m) {
  using py::arg;
  const auto none = py::none();
  // Creation.
  m.def(
      "tensor",
      [](const py::object& data, std::optional<PyDType> dtype, bool requires_grad) {
        Tensor t = to_tensor(data, dtype ? std::optional(dtype->value) : std::nullopt);
        if (requires_grad) t.set_requires_grad(true);
        return t;
      },
      arg("data"), arg("dtype") = none, arg("requires_grad") = false,
      "A tensor with a copy of `data` (nested lists, numbers, a NumPy array).");
  m.def(
      "from_numpy", [](const py::object& a) { return to_tensor(a, std::nullopt); }, arg("array"),
      "A tensor with a copy of a NumPy array's values (its dtype kept).");
  m.def(
      "as_tensor",
      [](const py::object& data, std::optional<PyDType> dtype) {
        return to_tensor(data, dtype ? std::optional(dtype->value) : std::nullopt);
      },
      arg("data"), arg("dtype") = none);
#define LS_CREATION(name)                                                          \
  m.def(                                                                           \
      #name,                                                                       \
      [](const py::args& size, std::optional<PyDType> dtype, bool requires_grad) { \
        Tensor t = name(shape_of(size), options_of(dtype));                        \
        if (requires_grad) t.set_requires_grad(true);                              \
        return t;                                                                  \
      },                                                                           \
      arg("dtype") = none, arg("requires_grad") = false);
  LS_CREATION(zeros)
  LS_CREATION(ones)
  LS_CREATION(rand)
  LS_CREATION(randn)
#undef LS_CREATION
  m.def(
      "full",
      [](const Shape& size, Scalar v, std::optional<PyDType> dtype) {
        DType d = dtype ? dtype->value
                        : (v.is_bool()      ? DType::Bool
                           : v.is_integer() ? DType::I64
                                            : DType::F32);
        return full(size, v, TensorOptions(d));
      },
      arg("size"), arg("fill_value"), arg("dtype") = none);
  m.def(
      "zeros_like", [](const Tensor& x) { return zeros_like(x); }, arg("input"));
  m.def(
      "ones_like", [](const Tensor& x) { return ones_like(x); }, arg("input"));
  m.def(
      "rand_like", [](const Tensor& x) { return rand_like(x); }, arg("input"));
  m.def(
      "randn_like", [](const Tensor& x) { return randn_like(x); }, arg("input"));
  m.def(
      "full_like", [](const Tensor& x, Scalar v) { return full_like(x, v); }, arg("input"),
      arg("fill_value"));
  m.def(
      "scalar_tensor",
      [](Scalar v, std::optional<PyDType> dtype) { return scalar_tensor(v, options_of(dtype)); },
      arg("s"), arg("dtype") = none);
  m.def(
      "clone", [](const Tensor& x) { return clone(x); }, arg("input"),
      "A new tensor with the same values, bit for bit; gradients flow through it.");
  m.def(
      "arange",
      [](Scalar a, std::optional<Scalar> b, Scalar step, std::optional<PyDType> dtype,
         const py::object& device) {
        const bool integral = a.is_integer() && (!b || b->is_integer()) && step.is_integer();
        TensorOptions o = options_of(dtype, integral ? DType::I64 : DType::F32);
        if (!device.is_none()) {  // "cpu", or a tensor's .device (its name)
          o.has_device = true;
          o.device = parse_device(py::str(device).cast<std::string>());
        }
        if (!b) return arange(Scalar(int64_t{0}), a, step, o);
        return arange(a, *b, step, o);
      },
      arg("start"), arg("end") = none, arg("step") = 1, arg("dtype") = none, arg("device") = none);
  m.def(
      "linspace",
      [](double a, double b, int64_t steps, std::optional<PyDType> dtype) {
        return linspace(a, b, steps, options_of(dtype));
      },
      arg("start"), arg("end"), arg("steps"), arg("dtype") = none);
  m.def(
      "randint",
      [](int64_t low, int64_t high, const Shape& size) {
        return randint(low, high, size, TensorOptions(DType::I64));
      },
      arg("low"), arg("high"), arg("size"));
  m.def(  // torch.randint(high, size): low is 0
      "randint",
      [](int64_t high, const Shape& size) {
        return randint(0, high, size, TensorOptions(DType::I64));
      },
      arg("high"), arg("size"));
  m.def("manual_seed", &manual_seed, arg("seed"));
  m.def(
      "bernoulli", [](const Tensor& p) { return bernoulli(p); }, arg("input"));
  m.def(
      "bernoulli", [](const Tensor& x, double p) { return bernoulli(x, p); }, arg("input"),
      arg("p"));
  // The calling thread's generator state (i64[2]: seed, counter), e.g. for a checkpoint.
  m.def("generator_state", [] { return generator_state(); });
  m.def(
      "multinomial",
      [](const Tensor& w, int64_t n, bool replacement) { return multinomial(w, n, replacement); },
      arg("input"), arg("num_samples"), arg("replacement") = false);

  // Elementwise.
#define LS_UNARY(name) \
  m.def(               \
      #name, [](const Tensor& x) { return name(x); }, arg("input"));
  LS_PY_UNARY_OPS(LS_UNARY)
#undef LS_UNARY
// (Scalar, Tensor) and (Tensor, Scalar) before (Tensor, Tensor): see tensor.cpp's operators.
#define LS_BINARY(name)                                                                         \
  m.def(                                                                                        \
      #name, [](Scalar a, const Tensor& b) { return name(a, b); }, arg("input"), arg("other")); \
  m.def(                                                                                        \
      #name, [](const Tensor& a, Scalar b) { return name(a, b); }, arg("input"), arg("other")); \
  m.def(                                                                                        \
      #name, [](const Tensor& a, const Tensor& b) { return name(a, b); }, arg("input"),         \
      arg("other"));
  LS_BINARY(add)
  LS_BINARY(sub)
  LS_BINARY(mul)
  LS_BINARY(div)
  LS_BINARY(pow)
  LS_BINARY(maximum)
  LS_BINARY(minimum)
  LS_BINARY(eq)
  LS_BINARY(ne)
  LS_BINARY(lt)
  LS_BINARY(le)
  LS_BINARY(gt)
  LS_BINARY(ge)
  LS_BINARY(logical_and)
  LS_BINARY(logical_or)
  LS_BINARY(fmod)
  LS_BINARY(remainder)
  LS_BINARY(floor_divide)
#undef LS_BINARY
  m.def(
      "where", [](const Tensor& c, const Tensor& a, const Tensor& b) { return where(c, a, b); },
      arg("condition"), arg("input"), arg("other"));
  m.def(
      "where", [](const Tensor& c, const Tensor& a, Scalar b) { return where(c, a, b); },
      arg("condition"), arg("input"), arg("other"));
  m.def(
      "where", [](const Tensor& c, Scalar a, const Tensor& b) { return where(c, a, b); },
      arg("condition"), arg("input"), arg("other"));
  m.def(
      "where", [](const Tensor& c, Scalar a, Scalar b) { return where(c, a, b); }, arg("condition"),
      arg("input"), arg("other"));
  m.def(
      "masked_fill",
      [](const Tensor& x, const Tensor& mask, Scalar v) { return masked_fill(x, mask, v); },
      arg("input"), arg("mask"), arg("value"));
  m.def(
      "masked_fill",
      [](const Tensor& x, const Tensor& mask, const Tensor& v) { return masked_fill(x, mask, v); },
      arg("input"), arg("mask"), arg("value"));
  m.def(
      "clamp",
      [](const Tensor& x, std::optional<Scalar> lo, std::optional<Scalar> hi) {
        if (lo && hi) return clamp(x, *lo, *hi);
        if (lo) return clamp_min(x, *lo);
        if (hi) return clamp_max(x, *hi);
        throw Error("clamp: give min, max or both");
      },
      arg("input"), arg("min") = none, arg("max") = none);
  m.def(
      "clamp",
      [](const Tensor& x, const py::object& lo, const py::object& hi) {
        auto bound = [](const py::object& b) { return b.is_none() ? Tensor() : b.cast<Tensor>(); };
        return clamp(x, bound(lo), bound(hi));
      },
      arg("input"), arg("min") = none, arg("max") = none);
  m.def(
      "clamp_min", [](const Tensor& x, Scalar lo) { return clamp_min(x, lo); }, arg("input"),
      arg("min"));
  m.def(
      "clamp_max", [](const Tensor& x, Scalar hi) { return clamp_max(x, hi); }, arg("input"),
      arg("max"));

  // Reductions.
#define LS_REDUCE_AS(py_name, name)                              \
  m.def(                                                         \
      py_name,                                                   \
      [](const Tensor& x, const py::object& dim, bool keepdim) { \
        return name(x, axes_of(dim), keepdim);                   \
      },                                                         \
      arg("input"), arg("dim") = none, arg("keepdim") = false);
#define LS_REDUCE(name) LS_REDUCE_AS(#name, name)
  LS_REDUCE(sum)
  LS_REDUCE(mean)
  LS_REDUCE_AS("amax", max)
  LS_REDUCE_AS("amin", min)
  LS_REDUCE(argmax)
  LS_REDUCE(argmin)
  LS_REDUCE(prod)
  LS_REDUCE(any)
  LS_REDUCE(all)
#undef LS_REDUCE
#undef LS_REDUCE_AS
  m.def(
      "max", [](const Tensor& x) { return max(x, {}, false); }, arg("input"));
  m.def(
      "max",
      [](const Tensor& x, int64_t dim, bool keepdim) {
        return values_indices("max", max(x, {dim}, keepdim), argmax(x, {dim}, keepdim));
      },
      arg("input"), arg("dim"), arg("keepdim") = false);
  m.def(
      "max", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }, arg("input"),
      arg("other"));
  m.def(
      "min", [](const Tensor& x) { return min(x, {}, false); }, arg("input"));
  m.def(
      "min",
      [](const Tensor& x, int64_t dim, bool keepdim) {
        return values_indices("min", min(x, {dim}, keepdim), argmin(x, {dim}, keepdim));
      },
      arg("input"), arg("dim"), arg("keepdim") = false);
  m.def(
      "min", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }, arg("input"),
      arg("other"));
  m.def(
      "softmax", [](const Tensor& x, int64_t dim) { return softmax(x, dim); }, arg("input"),
      arg("dim"));
  m.def(
      "log_softmax", [](const Tensor& x, int64_t dim) { return log_softmax(x, dim); }, arg("input"),
      arg("dim"));
  m.def(
      "logsumexp",
      [](const Tensor& x, const py::object& dim, bool keepdim) {
        return logsumexp(x, axes_of(dim), keepdim);
      },
      arg("input"), arg("dim"), arg("keepdim") = false);
  m.def(
      "var",
      [](const Tensor& x, const py::object& dim, int64_t correction, bool keepdim) {
        return var(x, axes_of(dim), correction, keepdim);
      },
      arg("input"), arg("dim") = none, arg("correction") = 1, arg("keepdim") = false);
  m.def(
      "std",
      [](const Tensor& x, const py::object& dim, int64_t correction, bool keepdim) {
        return std(x, axes_of(dim), correction, keepdim);
      },
      arg("input"), arg("dim") = none, arg("correction") = 1, arg("keepdim") = false);
  m.def(
      "norm",
      [](const Tensor& x, double p, const py::object& dim, bool keepdim) {
        return norm(x, p, axes_of(dim), keepdim);
      },
      arg("input"), arg("p") = 2.0, arg("dim") = none, arg("keepdim") = false);
  m.def(
      "cumsum", [](const Tensor& x, int64_t dim) { return cumsum(x, dim); }, arg("input"),
      arg("dim"));
  m.def(
      "cumprod", [](const Tensor& x, int64_t dim) { return cumprod(x, dim); }, arg("input"),
      arg("dim"));
  m.def(
      "sort",
      [](const Tensor& x, int64_t dim, bool descending) {
        ValuesIndices r = sort(x, dim, descending);
        return values_indices("sort", r.values, r.indices);
      },
      arg("input"), arg("dim") = -1, arg("descending") = false);
  m.def(
      "argsort",
      [](const Tensor& x, int64_t dim, bool descending) { return argsort(x, dim, descending); },
      arg("input"), arg("dim") = -1, arg("descending") = false);
  m.def(
      "topk",
      [](const Tensor& x, int64_t k, int64_t dim, bool largest) {
        ValuesIndices r = topk(x, k, dim, largest);
        return values_indices("topk", r.values, r.indices);
      },
      arg("input"), arg("k"), arg("dim") = -1, arg("largest") = true);

  // Shapes and movement.
  m.def(
      "reshape", [](const Tensor& x, const Shape& s) { return reshape(x, s); }, arg("input"),
      arg("shape"));
  m.def(
      "permute", [](const Tensor& x, const Shape& p) { return permute(x, p); }, arg("input"),
      arg("dims"));
  m.def(
      "transpose", [](const Tensor& x, int64_t a, int64_t b) { return transpose(x, a, b); },
      arg("input"), arg("dim0"), arg("dim1"));
  m.def(
      "unsqueeze", [](const Tensor& x, int64_t d) { return unsqueeze(x, d); }, arg("input"),
      arg("dim"));
  m.def(
      "squeeze", [](const Tensor& x, int64_t d) { return squeeze(x, d); }, arg("input"),
      arg("dim"));
  m.def(
      "flatten", [](const Tensor& x, int64_t s, int64_t e) { return flatten(x, s, e); },
      arg("input"), arg("start_dim") = 0, arg("end_dim") = -1);
  m.def(
      "narrow", [](const Tensor& x, int64_t d, int64_t s, int64_t n) { return narrow(x, d, s, n); },
      arg("input"), arg("dim"), arg("start"), arg("length"));
  m.def(
      "select", [](const Tensor& x, int64_t d, int64_t i) { return select(x, d, i); }, arg("input"),
      arg("dim"), arg("index"));
  m.def(
      "cat", [](const std::vector<Tensor>& xs, int64_t dim) { return concat(xs, dim); },
      arg("tensors"), arg("dim") = 0);
  m.def(
      "concat", [](const std::vector<Tensor>& xs, int64_t dim) { return concat(xs, dim); },
      arg("tensors"), arg("dim") = 0);
  m.def(
      "stack", [](const std::vector<Tensor>& xs, int64_t dim) { return stack(xs, dim); },
      arg("tensors"), arg("dim") = 0);
  m.def(
      "chunk", [](const Tensor& x, int64_t n, int64_t dim) { return chunk(x, n, dim); },
      arg("input"), arg("chunks"), arg("dim") = 0);
  m.def(
      "split",
      [](const Tensor& x, const py::object& size, int64_t dim) {
        if (py::isinstance<py::int_>(size)) return split(x, size.cast<int64_t>(), dim);
        return split(x, size.cast<std::vector<int64_t>>(), dim);
      },
      arg("input"), arg("split_size_or_sections"), arg("dim") = 0);
  m.def(
      "unbind", [](const Tensor& x, int64_t dim) { return unbind(x, dim); }, arg("input"),
      arg("dim") = 0);
  m.def(
      "expand", [](const Tensor& x, const Shape& s) { return expand(x, s); }, arg("input"),
      arg("size"));
  m.def(
      "repeat", [](const Tensor& x, const Shape& r) { return repeat(x, r); }, arg("input"),
      arg("repeats"));
  m.def(
      "flip", [](const Tensor& x, const Shape& d) { return flip(x, d); }, arg("input"),
      arg("dims"));
  m.def(
      "roll", [](const Tensor& x, const Shape& s, const Shape& d) { return roll(x, s, d); },
      arg("input"), arg("shifts"), arg("dims") = Shape{});
  m.def(
      "movedim", [](const Tensor& x, int64_t s, int64_t d) { return movedim(x, s, d); },
      arg("input"), arg("source"), arg("destination"));
  m.def(
      "tril", [](const Tensor& x, int64_t d) { return tril(x, d); }, arg("input"),
      arg("diagonal") = 0);
  m.def(
      "triu", [](const Tensor& x, int64_t d) { return triu(x, d); }, arg("input"),
      arg("diagonal") = 0);
  m.def(
      "gather", [](const Tensor& x, int64_t d, const Tensor& i) { return gather(x, d, i); },
      arg("input"), arg("dim"), arg("index"));
  m.def(
      "scatter_add",
      [](const Tensor& x, int64_t d, const Tensor& i, const Tensor& s) {
        return scatter_add(x, d, i, s);
      },
      arg("input"), arg("dim"), arg("index"), arg("src"));
  m.def(
      "index_select",
      [](const Tensor& x, int64_t d, const Tensor& i) { return index_select(x, d, i); },
      arg("input"), arg("dim"), arg("index"));
  m.def(
      "take_along_dim",
      [](const Tensor& x, const Tensor& i, int64_t d) { return take_along_dim(x, i, d); },
      arg("input"), arg("indices"), arg("dim"));
  m.def(
      "einsum",
      [](const std::string& eq, const py::args& xs) {
        std::vector<Tensor> ops;
        if (xs.size() == 1 && !py::isinstance<Tensor>(xs[0]))
          ops = xs[0].cast<std::vector<Tensor>>();
        else
          ops = xs.cast<std::vector<Tensor>>();
        return einsum(eq, ops);
      },
      arg("equation"));
  m.def(
      "matmul", [](const Tensor& a, const Tensor& b) { return matmul(a, b); }, arg("input"),
      arg("other"));
  m.def(
      "mm", [](const Tensor& a, const Tensor& b) { return matmul(a, b); }, arg("input"),
      arg("mat2"));
  m.def(
      "bmm", [](const Tensor& a, const Tensor& b) { return matmul(a, b); }, arg("input"),
      arg("mat2"));
}

}  // namespace lockstep::python
