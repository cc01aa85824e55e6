// What every part of the Python binding shares: the caller's Python line as a lockstep::Loc,
// conversions of Python numbers, shapes and dtypes, and the rule for the GIL around blocking
// calls. The binding holds no behaviour of its own: it calls the C++ library.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "lockstep/lockstep.h"

namespace lockstep::python {

namespace py = pybind11;

// The innermost Python frame outside the lockstep package (its file, line and function), so that
// errors, cache-miss explanations, graph dumps and per-site metrics name the user's .py line.
// Interned per (code object, instruction): recording an op from Python stays cheap. Needs the GIL.
Loc caller();
// The directory of the lockstep package's .py files (frames there are skipped by caller()).
void set_package_dir(const std::string& dir);

// A dtype argument: a lockstep.dtype (float32, int64, ...).
struct PyDType {
  DType value;
};

// Blocking calls (reads, syncs, waits, steps' entry and exit) run with the GIL released, so that
// step closures (which take it on the runtime thread) can run meanwhile.
using NoGil = py::gil_scoped_release;

void init_tensor(py::module_& m);
void init_ops(py::module_& m);
void init_runtime(py::module_& m);
void init_nn(py::module_& m);
void init_optim(py::module_& m);
void init_extras(py::module_& m);
void init_dlpack(py::module_& m);  // after init_tensor

// Axes given as an int, a sequence of ints, or None (every axis).
std::vector<int64_t> axes_of(const py::object& dim);
// A shape given as ints (`zeros(2, 3)`) or one sequence (`zeros((2, 3))`).
Shape shape_of(const py::args& args);
// State dicts: named tensors as a collections.OrderedDict (torch's type), and back from any
// mapping (or iterable of (name, tensor) pairs).
py::object ordered_dict(const nn::NamedTensors& named);
nn::NamedTensors named_tensors(const py::object& state);
// The tensor made from Python data: a lockstep.Tensor, a NumPy array, a number or nested lists.
Tensor to_tensor(const py::handle& data, std::optional<DType> dtype, Loc loc);

}  // namespace lockstep::python

namespace pybind11::detail {

// A host number (float, int, bool, or a NumPy scalar) as a lockstep::Scalar.
template <>
struct type_caster<lockstep::Scalar> {
  std::optional<lockstep::Scalar> value;
  static constexpr auto name = const_name("float | int | bool");
  template <typename T>
  using cast_op_type = lockstep::Scalar&;
  explicit operator lockstep::Scalar&() { return *value; }
  bool load(handle src, bool convert) {
    PyObject* o = src.ptr();
    if (PyBool_Check(o)) {
      value.emplace(o == Py_True);
      return true;
    }
    if (PyLong_Check(o)) {
      int overflow = 0;
      const long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
      if (overflow != 0 || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return false;
      }
      value.emplace(static_cast<int64_t>(v));
      return true;
    }
    if (PyFloat_Check(o)) {
      value.emplace(PyFloat_AsDouble(o));
      return true;
    }
    if (!convert) return false;
    // A tensor is not a host number, although it has __index__ and __float__ (reads).
    if (isinstance<lockstep::Tensor>(src)) return false;
    // NumPy scalars and other numbers: integers by __index__, the rest by __float__.
    if (PyIndex_Check(o)) {
      object i = reinterpret_steal<object>(PyNumber_Index(o));
      if (!i) {
        PyErr_Clear();
        return false;
      }
      return load(i, false);
    }
    if (PyNumber_Check(o) && !PySequence_Check(o)) {
      const double d = PyFloat_AsDouble(o);
      if (d == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return false;
      }
      value.emplace(d);
      return true;
    }
    return false;
  }
  static handle cast(const lockstep::Scalar& s, return_value_policy, handle) {
    if (s.is_bool()) return handle(s.to_int() != 0 ? Py_True : Py_False).inc_ref();
    if (s.is_integer()) return PyLong_FromLongLong(s.to_int());
    return PyFloat_FromDouble(s.to_double());
  }
};

}  // namespace pybind11::detail
