// What every part of the Python binding shares: the user's Python line as a lockstep::Loc (one
// frames hook, registered when the module loads), conversions of Python numbers, shapes and
// dtypes, and the rule for the GIL around blocking calls. The binding holds no behaviour of its
// own: it calls the C++ library.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "lockstep/lockstep.h"
#include "util/frames.h"

namespace lockstep::python {

namespace py = pybind11;

// Registers the frames hook (util::set_frames_hook): the library asks it for the user's place
// (the innermost Python frame outside the lockstep package) whenever it records a place that
// lies in the binding's sources or its own. So a binding passes no location: the C++ default
// Loc::current() names the binding's line, and the library resolves it to the user's .py line
// for errors, cache-miss explanations, graph dumps and per-site metrics.
void register_frames_hook();
// The directory of the lockstep package's .py files (their frames are not the user's).
void set_package_dir(const std::string& dir);
// An Error's text with its C++ advice spelled for Python (common.cpp).
std::string python_spelling(std::string text);
// A Python object held by C++ (a queued closure, a scheduler's lr function): released with the
// GIL wherever its last owner lets go of it.
std::shared_ptr<py::object> keep(py::object o);
// The user's place, resolved now, for the few calls that need it before the library would
// resolve it: those that release the GIL first (the hook answers only while it is held: NoGil
// below), and those whose place the library keeps as given (a step's entry, a sync, a read,
// data copied from the host). Needs the GIL.
inline Loc user_place(Loc here = Loc::current()) { return util::user_loc(here); }

// A dtype argument: a lockstep.dtype (float32, int64, ...).
struct PyDType {
  DType value;
};

// Blocking calls (reads, syncs, waits, steps' entry and exit) run with the GIL released, so that
// step closures (which take it on the runtime thread) can run meanwhile. Their place is taken
// with user_place() before the release; while it is released, the frames hook answers nothing
// on this thread (it may look at Python's frames only with the GIL).
//
// A call that returns while the interpreter is finalizing (a daemon thread blocked in
// lockstep.wait() or a loader's next() when the program exits) never takes the GIL back: the thread
// stays parked until the process ends, as CPython 3.14 does itself. Python 3.11-3.13 would
// otherwise end the thread with pthread_exit from inside this destructor, whose unwinding through a
// noexcept frame aborts the process ("terminate called without an active exception"). Hence the
// destructor is noexcept(false): if finalization begins between the check and the GIL's return,
// that unwinding passes through it.
class NoGil {
 public:
  NoGil();
  ~NoGil() noexcept(false);
  NoGil(const NoGil&) = delete;
  NoGil& operator=(const NoGil&) = delete;

 private:
  PyThreadState* state_;
  bool was_released_;
};

void init_tensor(py::module_& m);
void init_ops(py::module_& m);
void init_tensor_methods(py::module_& m);  // after init_ops
void init_runtime(py::module_& m);
void init_nn(py::module_& m);
void init_nn_text(py::module_& nnm);  // from init_nn
void init_optim(py::module_& m);
void init_extras(py::module_& m);
void init_dlpack(py::module_& m);
void init_summary(py::module_& m);
void init_profiler(py::module_& m);
// The hottest calls entered below pybind11's dispatcher (fast_calls.cpp): after the functions it
// fronts are defined, before init_tensor_methods makes methods of them.
void init_fast_calls(py::module_& m);

// The elementwise functions of one tensor, lockstep.<name>(x): bound in ops.cpp, fronted in
// fast_calls.cpp (X is applied to each name). Kept out of clang-format, which lays the list out
// differently on each pass.
// clang-format off
#define LS_PY_UNARY_OPS(X)                                                                 \
  X(neg) X(abs) X(exp) X(log) X(log1p) X(sqrt) X(rsqrt) X(tanh) X(sigmoid) X(relu) X(sin) \
  X(cos) X(erf) X(floor) X(ceil) X(sign) X(logical_not) X(isfinite) X(square)
// clang-format on

// Axes given as an int, a sequence of ints, or None (every axis).
std::vector<int64_t> axes_of(const py::object& dim);
// A shape given as ints (`zeros(2, 3)`) or one sequence (`zeros((2, 3))`).
Shape shape_of(const py::args& args);
// State dicts: named tensors as a collections.OrderedDict (torch's type), and back from any
// mapping (or iterable of (name, tensor) pairs).
py::object ordered_dict(const nn::NamedTensors& named);
nn::NamedTensors named_tensors(const py::object& state);
// The tensor made from Python data: a lockstep.Tensor, a NumPy array, a number or nested lists.
Tensor to_tensor(const py::handle& data, std::optional<DType> dtype);
// Tensor.__dlpack__: the tensor's memory as a DLPack capsule, without a copy (dlpack.cpp).
py::capsule to_dlpack(const Tensor& t);

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
