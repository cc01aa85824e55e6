// The caller's Python line, and conversions shared by the binding.
#include "common.h"

#include <pybind11/numpy.h>

#include <functional>
#include <string>
#include <unordered_map>
#include <utility>

namespace lockstep::python {
namespace {

// Per code object: whether it is the lockstep package's own, and its file and function. Each
// code object seen is kept alive (a reference held here), so its address is never reused for
// another one. Both tables are used under the GIL only.
struct CodeInfo {
  bool internal = false;
  std::string file, function;
};

struct KeyHash {
  size_t operator()(const std::pair<const void*, int>& k) const {
    return std::hash<const void*>()(k.first) ^
           (static_cast<size_t>(k.second) * 0x9e3779b97f4a7c15u);
  }
};

std::string& package_dir() {
  static auto* dir = new std::string;
  return *dir;
}

std::unordered_map<const void*, CodeInfo>& code_infos() {
  static auto* m = new std::unordered_map<const void*, CodeInfo>;
  return *m;
}

std::unordered_map<std::pair<const void*, int>, Loc, KeyHash>& locs() {
  static auto* m = new std::unordered_map<std::pair<const void*, int>, Loc, KeyHash>;
  return *m;
}

std::string str_attr(PyObject* o, const char* name) {
  PyObject* v = PyObject_GetAttrString(o, name);
  if (!v) {
    PyErr_Clear();
    return {};
  }
  std::string out;
  if (PyUnicode_Check(v)) {
    Py_ssize_t n = 0;
    const char* s = PyUnicode_AsUTF8AndSize(v, &n);
    if (s)
      out.assign(s, static_cast<size_t>(n));
    else
      PyErr_Clear();
  }
  Py_DECREF(v);
  return out;
}

const CodeInfo& info_of(PyCodeObject* code) {
  auto& infos = code_infos();
  auto it = infos.find(code);
  if (it != infos.end()) return it->second;
  Py_INCREF(code);  // kept for good: see CodeInfo
  CodeInfo info;
  info.file = str_attr(reinterpret_cast<PyObject*>(code), "co_filename");
  info.function = str_attr(reinterpret_cast<PyObject*>(code), "co_qualname");
  if (info.function.empty()) info.function = str_attr(reinterpret_cast<PyObject*>(code), "co_name");
  const std::string& dir = package_dir();
  info.internal = !dir.empty() && info.file.compare(0, dir.size(), dir) == 0;
  return infos.emplace(code, std::move(info)).first->second;
}

}  // namespace

void set_package_dir(const std::string& dir) {
  package_dir() = dir;
  code_infos().clear();  // (references kept: see CodeInfo)
  locs().clear();
}

Loc caller() {
  PyFrameObject* f = PyEval_GetFrame();  // borrowed
  Py_XINCREF(f);
  while (f) {
    PyCodeObject* code = PyFrame_GetCode(f);  // new reference
    const CodeInfo& info = info_of(code);
    if (!info.internal) {
      // Keyed by the instruction, whose line is computed once (PyCode_Addr2Line walks a table).
      auto& table = locs();
      auto key = std::make_pair(static_cast<const void*>(code), PyFrame_GetLasti(f));
      auto it = table.find(key);
      if (it == table.end()) {
        const int line = PyFrame_GetLineNumber(f);
        it = table.emplace(key, Loc::intern(info.file, static_cast<uint32_t>(line), info.function))
                 .first;
      }
      Py_DECREF(code);
      Py_DECREF(f);
      return it->second;
    }
    Py_DECREF(code);
    PyFrameObject* back = PyFrame_GetBack(f);  // new reference
    Py_DECREF(f);
    f = back;
  }
  static const Loc outside = Loc::intern("<python>", 0, "<module>");
  return outside;
}

std::vector<int64_t> axes_of(const py::object& dim) {
  if (dim.is_none()) return {};
  if (py::isinstance<py::int_>(dim)) return {dim.cast<int64_t>()};
  return dim.cast<std::vector<int64_t>>();
}

py::object ordered_dict(const nn::NamedTensors& named) {
  py::object od = py::module_::import("collections").attr("OrderedDict")();
  for (const auto& [name, t] : named) od[py::str(name)] = t;
  return od;
}

nn::NamedTensors named_tensors(const py::object& state) {
  nn::NamedTensors out;
  py::object items = py::hasattr(state, "items") ? state.attr("items")() : state;
  for (const py::handle& kv : items) {
    py::tuple p = py::reinterpret_borrow<py::tuple>(kv);
    out.emplace_back(p[0].cast<std::string>(), p[1].cast<Tensor>());
  }
  return out;
}

Shape shape_of(const py::args& args) {
  if (args.size() == 1 && !py::isinstance<py::int_>(args[0])) return args[0].cast<Shape>();
  return args.cast<Shape>();
}

namespace {

std::optional<DType> dtype_of_numpy(const py::dtype& dt) {
  switch (dt.kind()) {
    case 'f':
      if (dt.itemsize() == 4) return DType::F32;
      if (dt.itemsize() == 8) return DType::F64;
      break;
    case 'i':
      if (dt.itemsize() == 4) return DType::I32;
      if (dt.itemsize() == 8) return DType::I64;
      break;
    case 'b':
      return DType::Bool;
    default:
      break;
  }
  return std::nullopt;
}

}  // namespace

Tensor to_tensor(const py::handle& data, std::optional<DType> dtype, Loc loc) {
  if (py::isinstance<Tensor>(data)) {
    Tensor t = data.cast<Tensor>();
    return dtype && *dtype != t.dtype() ? t.to(*dtype, loc) : t;
  }
  py::module_ np = py::module_::import("numpy");
  const bool is_array = py::isinstance<py::array>(data);
  // np.require keeps a 0-d array 0-d (np.ascontiguousarray would make it 1-d).
  py::array arr = np.attr("require")(data, py::none(), "C");
  std::optional<DType> from = dtype_of_numpy(arr.dtype());
  if (!from) {
    // Integers of other widths (uint8 images, int16) become i64 as PyTorch's Python scalars do;
    // anything else is refused, naming the way out.
    if (arr.dtype().kind() == 'u' || arr.dtype().kind() == 'i') {
      arr = arr.attr("astype")(np.attr("int64"));
      from = DType::I64;
    } else {
      throw Error("lockstep.tensor: a NumPy array of dtype " +
                  py::str(arr.dtype()).cast<std::string>() +
                  " has no lockstep dtype (float32, float64, int32, int64, bool); convert it "
                  "first, e.g. arr.astype(numpy.float32)");
    }
  }
  // Python floats are float64 in NumPy; lockstep's default float is float32, as PyTorch's.
  if (!is_array && *from == DType::F64) from = DType::F32;
  if (*from == DType::F32 && arr.dtype().itemsize() == 8)
    arr = arr.attr("astype")(np.attr("float32"));
  Shape shape(arr.shape(), arr.shape() + arr.ndim());
  const bool zero_dim = shape.empty();  // from_blob takes an empty shape as 1-d
  Tensor t = from_blob(arr.data(), zero_dim ? Shape{1} : shape, *from, default_device(), loc);
  if (zero_dim) t = t.reshape({}, loc);
  return dtype && *dtype != *from ? t.to(*dtype, loc) : t;
}

}  // namespace lockstep::python
