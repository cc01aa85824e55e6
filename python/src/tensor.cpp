// lockstep.Tensor and lockstep.dtype: every Tensor method is defined here (shape, dtype, reads
// into Python and NumPy, which release the GIL while they wait, autograd, operators, DLPack, and
// the functions of ops.cpp that take a tensor first, as methods) but indexing's (indexing.cpp).
#include <dlpack/dlpack.h>
#include <pybind11/numpy.h>

#include <cstring>
#include <numeric>
#include <sstream>

#include "common.h"
#include "indexing.h"

namespace lockstep::python {
namespace {

const char* py_dtype_name(DType d) {
  switch (d) {
    case DType::F32:
      return "float32";
    case DType::F64:
      return "float64";
    case DType::I32:
      return "int32";
    case DType::I64:
      return "int64";
    case DType::Bool:
      return "bool";
    case DType::BF16:
      return "bfloat16";
    case DType::U8:
      return "uint8";
  }
  return "?";
}

template <typename T>
py::array to_numpy_as(const Tensor& t, const Loc& loc) {
  std::vector<T> values;
  {
    NoGil release;
    values = t.to_vector<T>(loc);
  }
  py::array_t<T> out(t.shape());
  if (!values.empty()) std::memcpy(out.mutable_data(), values.data(), values.size() * sizeof(T));
  return out;
}

py::array to_numpy(const Tensor& t, const Loc& loc) {
  switch (t.dtype()) {
    case DType::F32:
      return to_numpy_as<float>(t, loc);
    case DType::F64:
      return to_numpy_as<double>(t, loc);
    case DType::I32:
      return to_numpy_as<int32_t>(t, loc);
    case DType::I64:
      return to_numpy_as<int64_t>(t, loc);
    case DType::U8:
      return to_numpy_as<uint8_t>(t, loc);
    case DType::Bool: {
      std::vector<bool> values;
      {
        NoGil release;
        values = t.to_vector<bool>(loc);
      }
      py::array_t<bool> out(t.shape());
      bool* p = out.mutable_data();
      for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];
      return out;
    }
    case DType::BF16:
      break;
  }
  throw Error(
      "Tensor.numpy(): NumPy has no bfloat16; read it as float32 with "
      "t.to(lockstep.float32).numpy(), or share it without a copy through DLPack "
      "(torch.from_dlpack(t))");
}

py::object item(const Tensor& t) {
  const Loc loc = user_place();
  if (t.dtype() == DType::Bool) {
    bool v = false;
    {
      NoGil release;
      v = t.item<bool>(loc);
    }
    return py::bool_(v);
  }
  if (is_integral(t.dtype())) {
    int64_t v = 0;
    {
      NoGil release;
      v = t.item<int64_t>(loc);
    }
    return py::int_(v);
  }
  double v = 0;
  {
    NoGil release;
    v = t.item<double>(loc);
  }
  return py::float_(v);
}

// The rows of a tensor, one at a time (Tensor.__iter__).
struct RowIterator {
  Tensor x;
  int64_t next = 0, rows = 0;
};

}  // namespace

void init_tensor(py::module_& m) {
  py::class_<PyDType>(m, "dtype", "An element type: lockstep.float32, int64, bfloat16, ...")
      .def_property_readonly("is_floating_point",
                             [](const PyDType& d) { return is_floating(d.value); })
      .def_property_readonly("itemsize",
                             [](const PyDType& d) { return static_cast<int>(dtype_size(d.value)); })
      .def("__repr__",
           [](const PyDType& d) { return std::string("lockstep.") + py_dtype_name(d.value); })
      .def("__eq__", [](const PyDType& a, const PyDType& b) { return a.value == b.value; })
      .def("__hash__", [](const PyDType& d) { return static_cast<int>(d.value); });
  for (auto [name, d] : {std::pair{"float32", DType::F32},
                         {"float", DType::F32},
                         {"float64", DType::F64},
                         {"double", DType::F64},
                         {"int32", DType::I32},
                         {"int", DType::I32},
                         {"int64", DType::I64},
                         {"long", DType::I64},
                         {"bool", DType::Bool},
                         {"uint8", DType::U8},
                         {"bfloat16", DType::BF16}})
    m.attr(name) = PyDType{d};

  py::class_<Tensor> t(m, "Tensor",
                       "A lazy tensor: ops record; reads (item, tolist, numpy) run what they "
                       "need and block, releasing the GIL while they wait.");
  t.def(py::init([](const Tensor& other) { return other; }), py::arg("other"),
        "Another handle to the same tensor.")
      .def_property_readonly("shape",
                             [](const Tensor& x) { return py::tuple(py::cast(x.shape())); })
      .def(
          "size",
          [](const Tensor& x, const py::object& dim) -> py::object {
            if (dim.is_none()) return py::tuple(py::cast(x.shape()));
            return py::int_(x.size(dim.cast<int64_t>()));
          },
          py::arg("dim") = py::none())
      .def("dim", &Tensor::dim)
      .def_property_readonly("ndim", &Tensor::dim)
      .def("numel", &Tensor::numel)
      .def_property_readonly("dtype", [](const Tensor& x) { return PyDType{x.dtype()}; })
      .def_property_readonly("device", [](const Tensor& x) { return device_name(x.device()); })
      .def_property_readonly("is_cuda",
                             [](const Tensor& x) { return x.device().kind == DeviceKind::Cuda; })
      // PyTorch's flags of devices lockstep has no backend for: always false.
      .def_property_readonly("is_xpu", [](const Tensor&) { return false; })
      .def_property_readonly("is_mps", [](const Tensor&) { return false; })
      .def_property_readonly("is_pending", &Tensor::is_pending)
      .def_property_readonly("is_poisoned", &Tensor::is_poisoned)
      .def("__len__",
           [](const Tensor& x) {
             if (x.dim() == 0) throw py::type_error("len() of a 0-d tensor");
             return x.size(0);
           })
      .def("item", &item, "The one element as a Python number (a blocking read).")
      .def(
          "numpy", [](const Tensor& x) { return to_numpy(x, user_place()); },
          "A NumPy copy of the values (a blocking read).")
      .def("tolist", [](const Tensor& x) { return to_numpy(x, user_place()).attr("tolist")(); })
      .def(
          "__array__",
          [](const Tensor& x, const py::object& dtype) {
            py::array a = to_numpy(x, user_place());
            return dtype.is_none() ? py::object(a) : a.attr("astype")(dtype);
          },
          py::arg("dtype") = py::none())
      .def("__float__", [](const Tensor& x) { return item(x).cast<double>(); })
      .def("__int__", [](const Tensor& x) { return item(x).cast<int64_t>(); })
      .def("__bool__",
           [](const Tensor& x) {
             if (x.numel() != 1)
               throw Error("the truth value of a tensor of " + std::to_string(x.numel()) +
                           " elements is ambiguous; use .any() or .all()");
             return item(x).cast<bool>();
           })
      .def("__index__",
           [](const Tensor& x) {
             if (!is_integral(x.dtype()) || x.numel() != 1)
               throw py::type_error("only integer tensors of one element can be an index");
             return item(x).cast<int64_t>();
           })
      .def("__repr__",
           [](const Tensor& x) {
             const Loc loc = user_place();
             std::ostringstream os;
             os << "tensor(" << dtype_name(x.dtype()) << shape_str(x.shape()) << ", "
                << device_name(x.device());
             if (x.is_poisoned()) return os.str() + ", poisoned)";
             std::string values;
             {
               NoGil release;
               values = x.to_string(loc);
             }
             os << ") " << values;
             return os.str();
           })
      // f"{loss:.4f}" as torch's: a 0-d tensor formats as its number; others as their text.
      .def("__format__",
           [](const py::object& self, const py::str& spec) -> py::object {
             const auto format = py::module_::import("builtins").attr("format");
             if (self.cast<const Tensor&>().dim() == 0) return format(self.attr("item")(), spec);
             return format(py::str(self), spec);
           })
      .def("__hash__", [](const Tensor& x) { return reinterpret_cast<intptr_t>(x.impl()); })
      .def("is_same", &Tensor::is_same)
      // Autograd.
      .def_property("requires_grad", &Tensor::requires_grad,
                    [](Tensor& x, bool on) { x.set_requires_grad(on); })
      .def(
          "requires_grad_",
          [](py::object self, bool on) {
            self.cast<Tensor&>().set_requires_grad(on);
            return self;
          },
          py::arg("requires_grad") = true)
      .def_property(
          "grad",
          [](const Tensor& x) -> py::object {
            Tensor g = x.grad();
            return g.defined() ? py::cast(g) : py::none();
          },
          [](Tensor& x, const py::object& g) {
            x.set_grad(g.is_none() ? Tensor() : g.cast<Tensor>());
          })
      .def(
          "backward",
          [](const Tensor& x, const py::object& gradient) {
            backward(x, gradient.is_none() ? Tensor() : gradient.cast<Tensor>());
          },
          py::arg("gradient") = py::none())
      .def("detach", [](const Tensor& x) { return x.detach(); })
      .def(
          "to",
          [](const Tensor& x, const py::object& where) {
            if (py::isinstance<PyDType>(where)) return x.to(where.cast<PyDType>().value);
            // A move reads the values: named by the user's line as a read is.
            return x.to(parse_device(where.cast<std::string>()), user_place());
          },
          py::arg("dtype_or_device"))
      .def("float", [](const Tensor& x) { return x.to(DType::F32); })
      .def("double", [](const Tensor& x) { return x.to(DType::F64); })
      .def("long", [](const Tensor& x) { return x.to(DType::I64); })
      .def("int", [](const Tensor& x) { return x.to(DType::I32); })
      .def("bfloat16", [](const Tensor& x) { return x.to(DType::BF16); })
      .def("byte", [](const Tensor& x) { return x.to(DType::U8); })
      .def("type_as", [](const Tensor& x, const Tensor& other) { return x.to(other.dtype()); })
      .def(
          "type", [](const Tensor& x, const PyDType& dtype) { return x.to(dtype.value); },
          py::arg("dtype"))
      .def("is_floating_point", [](const Tensor& x) { return is_floating(x.dtype()); })
      // In place: every handle to the tensor sees the new value.
      .def("copy_",
           [](py::object self, const Tensor& src) {
             self.cast<Tensor&>().copy_(src);
             return self;
           })
      .def("fill_",
           [](py::object self, Scalar v) {
             self.cast<Tensor&>().fill_(v);
             return self;
           })
      .def("zero_",
           [](py::object self) {
             self.cast<Tensor&>().zero_();
             return self;
           })
      .def(
          "__dlpack__", [](const Tensor& x, const py::object&) { return to_dlpack(x); },
          py::arg("stream") = py::none(),
          "The tensor's memory as a DLPack capsule, without a copy (a blocking read if pending).")
      .def("__dlpack_device__",
           [](const Tensor&) { return py::make_tuple(static_cast<int>(kDLCPU), 0); });

  // x[key] and x[key] = v (indexing.cpp).
  init_indexing(m, t);

  // Shapes as torch's methods take them: ints (x.reshape(2, 3)) or one sequence.
  t.def("reshape",
        [](const Tensor& x, const py::args& shape) { return reshape(x, shape_of(shape)); })
      .def("permute",
           [](const Tensor& x, const py::args& dims) { return permute(x, shape_of(dims)); })
      .def("expand",
           [](const Tensor& x, const py::args& sizes) { return expand(x, shape_of(sizes)); })
      .def("repeat",
           [](const Tensor& x, const py::args& repeats) { return repeat(x, shape_of(repeats)); })
      // New tensors of this one's dtype and device, as torch's x.new_zeros(2, 3).
      .def("new_zeros",
           [](const Tensor& x, const py::args& size) {
             return zeros(shape_of(size), TensorOptions(x.dtype(), x.device()));
           })
      .def("new_ones",
           [](const Tensor& x, const py::args& size) {
             return ones(shape_of(size), TensorOptions(x.dtype(), x.device()));
           })
      .def("t", [](const Tensor& x) { return x.dim() < 2 ? x : transpose(x, 0, 1); })
      .def_property_readonly("T",
                             [](const Tensor& x) {
                               std::vector<int64_t> reversed(static_cast<size_t>(x.dim()));
                               std::iota(reversed.rbegin(), reversed.rend(), int64_t{0});
                               return permute(x, reversed);
                             })
      .def_property_readonly("mT", [](const Tensor& x) { return transpose(x, -2, -1); })
      // Every lockstep tensor is dense and row-major: the same tensor.
      .def("contiguous", [](py::object self) { return self; })
      .def("__iter__", [](const Tensor& x) {
        if (x.dim() == 0) throw py::type_error("iteration over a 0-d tensor");
        return RowIterator{x, 0, x.size(0)};
      });
  // Iteration yields x[k] as it reaches it, from the tensor's value then (a loop that reads each
  // row as an index, nanoGPT's `for i in ix`, computes x at its first read and then reads rows of
  // a computed value, copied on the host, where rows made all at once would each compute x).
  py::class_<RowIterator>(m, "_RowIterator")
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__", [](RowIterator& it) {
        if (it.next >= it.rows) throw py::stop_iteration();
        return select(it.x, 0, it.next++);
      });
  t.attr("view") = t.attr("reshape");
  t.def("view_as", [](const Tensor& x, const Tensor& other) { return reshape(x, other.shape()); });
  t.attr("reshape_as") = t.attr("view_as");

  // Operators (the library resolves their place, this file's, to the user's line). Overloads taking
  // a number come first: pybind11 tries them in order, and a number fails the Scalar check at once,
  // while a number offered as a Tensor fails only after a costly lookup (a recorded op would pay it
  // every time).
#define LS_BINARY(py_name, py_rname, fn)                                     \
  t.def(py_name, [](const Tensor& a, Scalar b) { return fn(a, b); });        \
  t.def(py_name, [](const Tensor& a, const Tensor& b) { return fn(a, b); }); \
  t.def(py_rname, [](const Tensor& a, Scalar b) { return fn(b, a); });
  LS_BINARY("__add__", "__radd__", add)
  LS_BINARY("__sub__", "__rsub__", sub)
  LS_BINARY("__mul__", "__rmul__", mul)
  LS_BINARY("__truediv__", "__rtruediv__", div)
  LS_BINARY("__pow__", "__rpow__", pow)
  LS_BINARY("__mod__", "__rmod__", remainder)
  LS_BINARY("__floordiv__", "__rfloordiv__", floor_divide)
  LS_BINARY("__and__", "__rand__", logical_and)
  LS_BINARY("__or__", "__ror__", logical_or)
#undef LS_BINARY
#define LS_COMPARE(py_name, fn)                                       \
  t.def(py_name, [](const Tensor& a, Scalar b) { return fn(a, b); }); \
  t.def(py_name, [](const Tensor& a, const Tensor& b) { return fn(a, b); });
  LS_COMPARE("__eq__", eq)
  LS_COMPARE("__ne__", ne)
  LS_COMPARE("__lt__", lt)
  LS_COMPARE("__le__", le)
  LS_COMPARE("__gt__", gt)
  LS_COMPARE("__ge__", ge)
#undef LS_COMPARE
  t.def("__matmul__", [](const Tensor& a, const Tensor& b) { return matmul(a, b); });
  t.def("__neg__", [](const Tensor& a) { return neg(a); });
  t.def("__abs__", [](const Tensor& a) { return abs(a); });
  t.def("__invert__", [](const Tensor& a) { return logical_not(a); });
#define LS_INPLACE(py_name, method)                     \
  t.def(py_name, [](py::object self, const Tensor& b) { \
    self.cast<Tensor&>().method(b);                     \
    return self;                                        \
  });                                                   \
  t.def(py_name, [](py::object self, Scalar b) {        \
    self.cast<Tensor&>().method(b);                     \
    return self;                                        \
  });
  LS_INPLACE("__iadd__", add_)
  LS_INPLACE("__isub__", sub_)
  LS_INPLACE("__imul__", mul_)
  LS_INPLACE("__itruediv__", div_)
  LS_INPLACE("add_", add_)
  LS_INPLACE("sub_", sub_)
  LS_INPLACE("mul_", mul_)
  LS_INPLACE("div_", div_)
#undef LS_INPLACE
  // torch's x.add_(other, alpha=a) and x.sub_(other, alpha=a): x +/- a * other.
  t.def(
      "add_",
      [](py::object self, const Tensor& b, Scalar alpha) {
        self.cast<Tensor&>().add_(mul(b, alpha));
        return self;
      },
      py::arg("other"), py::kw_only(), py::arg("alpha"));
  t.def(
      "sub_",
      [](py::object self, const Tensor& b, Scalar alpha) {
        self.cast<Tensor&>().sub_(mul(b, alpha));
        return self;
      },
      py::arg("other"), py::kw_only(), py::arg("alpha"));
}

namespace {

// The functions of lockstep (ops.cpp) that take a tensor first and are Tensor methods too, as
// torch's (separated by spaces).
constexpr const char* kFunctionMethods =
    "abs exp log log1p sqrt rsqrt tanh sigmoid relu sin cos erf floor ceil sign square neg "
    "isfinite logical_not logical_and logical_or sum mean amax amin argmax argmin prod any all "
    "max min softmax log_softmax logsumexp var std norm cumsum cumprod sort argsort topk "
    "transpose unsqueeze squeeze flatten narrow select chunk split unbind flip roll movedim tril "
    "triu gather scatter_add index_select take_along_dim matmul masked_fill clamp clamp_min "
    "clamp_max add sub mul div pow maximum minimum eq ne lt le gt ge fmod remainder floor_divide "
    "clone bernoulli multinomial";

// Their in-place forms, as torch's `x.clamp_(0, 1)`: the function's result copied into x (every
// handle to x sees it: tensors are never views), x itself returned.
constexpr const char* kInPlaceMethods =
    "abs exp log log1p sqrt rsqrt tanh sigmoid relu sin cos erf floor ceil sign square neg "
    "logical_not masked_fill clamp clamp_min clamp_max pow fmod remainder floor_divide tril triu "
    "scatter_add cumsum cumprod";

}  // namespace

void init_tensor_methods(py::module_& m) {
  // Each is the module's function object itself, bound to the instance: a method call has no
  // Python frame in between, and the function and the method cannot drift apart.
  py::object t = m.attr("Tensor");
  std::istringstream names(kFunctionMethods);
  for (std::string name; names >> name;)
    t.attr(name.c_str()) =
        py::reinterpret_steal<py::object>(PyInstanceMethod_New(m.attr(name.c_str()).ptr()));
  std::istringstream in_place(kInPlaceMethods);
  for (std::string name; in_place >> name;) {
    const std::string method = name + "_";
    t.attr(method.c_str()) = py::cpp_function(
        [fn = py::object(m.attr(name.c_str()))](py::object self, const py::args& args,
                                                const py::kwargs& kwargs) {
          const Tensor result = fn(self, *args, **kwargs).cast<Tensor>();
          self.cast<Tensor&>().copy_(result);
          return self;
        },
        py::name(method.c_str()), py::is_method(t));
  }
  // Random fills, as torch's x.uniform_(a, b) and x.normal_(mean, std): lockstep.nn.init's.
  py::object init = m.attr("nn").attr("init");
  for (const char* name : {"uniform_", "normal_"})
    t.attr(name) = py::reinterpret_steal<py::object>(PyInstanceMethod_New(init.attr(name).ptr()));
}

}  // namespace lockstep::python
