// Tensor.__getitem__, __setitem__, index_put(_) and lockstep.index_put: Python's index expressions
// (as PyTorch reads them) turned into the library's IndexItems; getitem and index_put (ops.h) do
// the rest. A key holding a bool tensor reads its values: that call releases the GIL.
#include <pybind11/numpy.h>

#include <string>
#include <vector>

#include "indexing.h"

namespace lockstep::python {
namespace {

std::string type_name(const py::handle& o) { return py::str(py::type::of(o).attr("__name__")); }

[[noreturn]] void refuse(const py::handle& o) {
  throw Error(
      "Tensor indexing: only integers, slices (:), ellipsis (...), None, bools, and "
      "integer or bool tensors, arrays and lists are valid indices (got " +
      type_name(o) + ")");
}

int64_t as_index(const py::handle& o) {
  py::object i = py::reinterpret_steal<py::object>(PyNumber_Index(o.ptr()));
  if (!i) throw py::error_already_set();
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (overflow != 0)
    throw Error("Tensor indexing: the index " + py::repr(i).cast<std::string>() +
                " is out of the range of int64");
  if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
  return v;
}

bool is_numpy_bool(const py::handle& o) {
  return py::isinstance(o, py::module_::import("numpy").attr("bool_"));
}

// A list, nested lists or an array of indices or booleans, as a tensor (an empty one is i64).
Tensor sequence_index(const py::handle& o) {
  py::module_ np = py::module_::import("numpy");
  py::array a;
  try {
    a = np.attr("asarray")(o);
  } catch (const py::error_already_set&) {
    throw Error("Tensor indexing: the list " + py::repr(o).cast<std::string>().substr(0, 80) +
                " is not a regular array of integers or bools");
  }
  const char kind = a.dtype().kind();
  if (a.size() == 0 && kind != 'b')
    a = a.attr("astype")(np.attr("int64"));
  else if (kind != 'b' && kind != 'i' && kind != 'u')
    throw Error("Tensor indexing: arrays used as indices must hold integers or bools, got " +
                py::str(a.dtype()).cast<std::string>());
  return to_tensor(a, std::nullopt);
}

IndexItem item_of(const py::handle& o) {
  if (py::isinstance<Tensor>(o)) return o.cast<Tensor>();
  if (PyBool_Check(o.ptr())) return o.ptr() == Py_True;
  if (PyLong_Check(o.ptr())) return as_index(o);
  if (py::isinstance<py::slice>(o)) {
    // Python's own reading: bounds through __index__, clamped to the range of Py_ssize_t.
    Py_ssize_t start = 0, stop = 0, step = 0;
    if (PySlice_Unpack(o.ptr(), &start, &stop, &step) < 0) throw py::error_already_set();
    if (step < 0)
      throw Error("Tensor indexing: slice step " + std::to_string(step) +
                  " is negative; steps must be positive (as PyTorch's; lockstep.flip reverses)");
    return Slice(start, stop, step);
  }
  if (o.ptr() == Py_Ellipsis) return Ellipsis;
  if (o.is_none()) return None;
  if (py::isinstance<py::array>(o)) return sequence_index(o);
  if (is_numpy_bool(o)) return py::cast<bool>(o);
  if (PyIndex_Check(o.ptr())) return as_index(o);  // NumPy's integer scalars
  if (PySequence_Check(o.ptr()) && !py::isinstance<py::str>(o) && !py::isinstance<py::bytes>(o))
    return sequence_index(o);
  refuse(o);
}

// PyTorch's (and old NumPy's) rule: a list shorter than 32 that holds a tensor, a sequence, a
// slice, ... or None is a tuple of indices; any other one is one index.
bool sequence_as_tuple(const py::handle& key) {
  if (py::isinstance<py::tuple>(key)) return true;
  if (py::isinstance<Tensor>(key) || !PySequence_Check(key.ptr())) return false;
  const Py_ssize_t n = PySequence_Size(key.ptr());
  if (n < 0) {
    PyErr_Clear();
    return false;
  }
  if (n >= 32) return false;
  for (Py_ssize_t i = 0; i < n; ++i) {
    py::object o = py::reinterpret_steal<py::object>(PySequence_GetItem(key.ptr(), i));
    if (!o) {
      PyErr_Clear();
      return false;
    }
    if (py::isinstance<Tensor>(o) || PySequence_Check(o.ptr()) || py::isinstance<py::slice>(o) ||
        o.ptr() == Py_Ellipsis || o.is_none())
      return true;
  }
  return false;
}

std::vector<IndexItem> key_of(const py::handle& key) {
  std::vector<IndexItem> out;
  if (sequence_as_tuple(key)) {
    for (const py::handle& k : py::reinterpret_borrow<py::sequence>(key)) out.push_back(item_of(k));
  } else {
    out.push_back(item_of(key));
  }
  return out;
}

// Whether the key reads a mask's values (then the call releases the GIL, passing the user's place).
bool reads(const std::vector<IndexItem>& key) {
  for (const IndexItem& item : key)
    if (const Tensor* t = std::get_if<Tensor>(&item.value());
        t && (t->dtype() == DType::Bool || t->dtype() == DType::U8))
      return true;
  return false;
}

template <typename F>
Tensor run(const std::vector<IndexItem>& key, F&& f) {
  const Loc loc = user_place();
  if (!reads(key)) return f(loc);
  NoGil release;
  return f(loc);
}

Tensor put(const Tensor& x, const std::vector<IndexItem>& key, const py::object& value,
           bool accumulate) {
  py::detail::make_caster<Scalar> number;
  if (!accumulate && !py::isinstance<Tensor>(value) && number.load(value, true)) {
    const Scalar s = py::detail::cast_op<Scalar&>(number);
    return run(key, [&](const Loc& loc) { return index_put(x, key, s, loc); });
  }
  const Tensor v = to_tensor(value, std::nullopt);
  return run(key, [&](const Loc& loc) { return index_put(x, key, v, accumulate, loc); });
}

// torch.index_put's indices: tensors (or what makes one), None for a whole axis.
std::vector<IndexItem> put_key(const py::object& indices) {
  std::vector<IndexItem> key;
  for (const py::handle& k : py::reinterpret_borrow<py::sequence>(indices))
    key.push_back(k.is_none() ? IndexItem(Slice()) : item_of(k));
  return key;
}

}  // namespace

void init_indexing(py::module_& m, py::class_<Tensor>& t) {
  t.def(
       "__getitem__",
       [](const Tensor& x, const py::object& key) {
         const std::vector<IndexItem> items = key_of(key);
         return run(items, [&](const Loc& loc) { return getitem(x, items, loc); });
       },
       "x[key] as PyTorch's: integers, slices, None, ..., bools, integer tensors, arrays and "
       "lists (recorded as gathers: an index out of range fails when the step runs, as "
       "index_select's) and bool masks (their values are read: a blocking read and an implicit "
       "sync, as nonzero in PyTorch/XLA).")
      .def(
          "__setitem__",
          [](Tensor& x, const py::object& key, const py::object& value) {
            const Tensor v = put(x, key_of(key), value, false);
            x.copy_(v, user_place());
          },
          "x[key] = v: x takes the value lockstep.index_put(x, key, v) in place (tensors are "
          "never views). A mask is not read when v is a number or broadcasts along its entries.")
      .def(
          "index_put",
          [](const Tensor& x, const py::object& indices, const py::object& values,
             bool accumulate) { return put(x, put_key(indices), values, accumulate); },
          py::arg("indices"), py::arg("values"), py::arg("accumulate") = false,
          "torch.index_put: x with x[indices] = values (or += where accumulate); None in "
          "indices is a whole axis, as torch's.")
      .def(
          "index_put_",
          [](py::object self, const py::object& indices, const py::object& values,
             bool accumulate) {
            Tensor& x = self.cast<Tensor&>();
            x.copy_(put(x, put_key(indices), values, accumulate), user_place());
            return self;
          },
          py::arg("indices"), py::arg("values"), py::arg("accumulate") = false);
  m.attr("index_put") = t.attr("index_put");
}

}  // namespace lockstep::python
