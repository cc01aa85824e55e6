// The frames hook (the user's Python line), and conversions shared by the binding.
#include "common.h"

#include <pybind11/numpy.h>

#include <functional>
#include <limits>
#include <regex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <unistd.h>

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

// Counts set_package_dir calls: a thread's memo (see python_frames) made before is not used.
uint64_t g_generation = 0;  // under the GIL

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
  // The hook may run while an exception is being raised: keep it as it is.
  PyObject *type = nullptr, *value = nullptr, *trace = nullptr;
  PyErr_Fetch(&type, &value, &trace);
  CodeInfo info;
  info.file = str_attr(reinterpret_cast<PyObject*>(code), "co_filename");
  info.function = str_attr(reinterpret_cast<PyObject*>(code), "co_qualname");
  if (info.function.empty()) info.function = str_attr(reinterpret_cast<PyObject*>(code), "co_name");
  PyErr_Restore(type, value, trace);
  const std::string& dir = package_dir();
  info.internal = !dir.empty() && info.file.compare(0, dir.size(), dir) == 0;
  return infos.emplace(code, std::move(info)).first->second;
}

// The place of frame `f` running `code` (a user's frame), computed once per instruction
// (PyCode_Addr2Line walks a table).
Loc place_of(PyCodeObject* code, PyFrameObject* f, int lasti) {
  auto& table = locs();
  auto key = std::make_pair(static_cast<const void*>(code), lasti);
  auto it = table.find(key);
  if (it == table.end()) {
    const CodeInfo& info = info_of(code);
    const int line = PyFrame_GetLineNumber(f);
    it = table.emplace(key, Loc::intern(info.file, static_cast<uint32_t>(line), info.function))
             .first;
  }
  return it->second;
}

// What the hook keeps per thread, in one object (each thread_local of a shared library costs a
// lookup of its own).
struct ThreadPlace {
  bool gil_released = false;  // inside a NoGil
  // The last answer for an innermost user's frame: an op records a few nodes from one
  // instruction, each asking. A code object seen is never freed (CodeInfo), so the same address
  // and instruction are the same place.
  const void* code = nullptr;
  int lasti = -1;
  uint64_t generation = 0;
  Loc loc;
};
thread_local ThreadPlace t_place;

// python_frames when the innermost frame is not the one it last answered for: the place of the
// innermost frame outside the lockstep package. Takes `code`'s reference.
[[gnu::noinline]] Loc place_outside_package(ThreadPlace& me, PyFrameObject* f, PyCodeObject* code,
                                            int lasti) {
  if (!info_of(code).internal) {
    const Loc loc = place_of(code, f, lasti);
    me.code = code;
    me.lasti = lasti;
    me.generation = g_generation;
    me.loc = loc;
    Py_DECREF(code);
    return loc;
  }
  // Called from the package's own Python code (Module.__setattr__, step.__enter__): the frames
  // above it.
  Py_DECREF(code);
  PyFrameObject* back = PyFrame_GetBack(f);  // new reference
  while (back) {
    code = PyFrame_GetCode(back);
    if (!info_of(code).internal) {
      const Loc loc = place_of(code, back, PyFrame_GetLasti(back));
      Py_DECREF(code);
      Py_DECREF(back);
      return loc;
    }
    Py_DECREF(code);
    PyFrameObject* next = PyFrame_GetBack(back);
    Py_DECREF(back);
    back = next;
  }
  static const Loc outside = Loc::intern("<python>", 0, "<module>");
  return outside;
}

// The hook (util::FramesHook): the innermost Python frame outside the lockstep package. Only a
// thread that holds the GIL may look at Python's frames; any other (a loader thread, the runtime
// thread outside a closure, a call that released the GIL) gets no answer and the library keeps
// its own place. The binding's own places come from its functions, entered with the GIL, which
// they give up only in a NoGil.
Loc python_frames(bool in_binding) {
  ThreadPlace* place = &t_place;
  // Kept in a register: GCC would otherwise look the thread_local up again after each call.
  asm("" : "+r"(place));
  ThreadPlace& me = *place;
  if (in_binding ? me.gil_released : !Py_IsInitialized() || !PyGILState_Check()) return {};
  PyFrameObject* f = PyEval_GetFrame();  // borrowed
  if (!f) return {};
  PyCodeObject* code = PyFrame_GetCode(f);  // new reference
  const int lasti = PyFrame_GetLasti(f);
  if (me.code != code || me.lasti != lasti || me.generation != g_generation)
    return place_outside_package(me, f, code, lasti);
  Py_DECREF(code);
  return me.loc;
}

}  // namespace

void register_frames_hook() {
  // This file's directory holds every source of the binding (python/src/).
  const std::string self = Loc::current().file_name();
  util::set_frames_hook(&python_frames, self.substr(0, self.rfind('/') + 1).c_str());
}

NoGil::NoGil() : state_(PyEval_SaveThread()), was_released_(t_place.gil_released) {
  t_place.gil_released = true;
}

NoGil::~NoGil() noexcept(false) {
#if PY_VERSION_HEX >= 0x030D0000
  const bool finalizing = Py_IsFinalizing();
#else
  const bool finalizing = _Py_IsFinalizing();
#endif
  if (finalizing)
    for (;;) ::pause();  // see NoGil in common.h; the process's exit ends the thread
  PyEval_RestoreThread(state_);
  t_place.gil_released = was_released_;
}

void set_package_dir(const std::string& dir) {
  package_dir() = dir;
  code_infos().clear();  // (references kept: see CodeInfo)
  locs().clear();
  ++g_generation;
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
    case 'u':
      if (dt.itemsize() == 1) return DType::U8;
      break;
    case 'b':
      return DType::Bool;
    default:
      break;
  }
  return std::nullopt;
}

}  // namespace

Tensor to_tensor(const py::handle& data, std::optional<DType> dtype) {
  const Loc loc = user_place();  // from_blob keeps the place as given
  if (py::isinstance<Tensor>(data)) {
    Tensor t = data.cast<Tensor>();
    return dtype && *dtype != t.dtype() ? t.to(*dtype, loc) : t;
  }
  py::module_ np = py::module_::import("numpy");
  const bool is_array = py::isinstance<py::array>(data);
  // np.require keeps a 0-d array 0-d (np.ascontiguousarray would make it 1-d).
  py::array arr = np.attr("require")(data, py::none(), "C");
  const std::string from_name = py::str(arr.dtype()).cast<std::string>();
  // Another byte order ('>f4' on this little-endian machine): its values, in the native order.
  if (!arr.dtype().attr("isnative").cast<bool>())
    arr = arr.attr("astype")(arr.dtype().attr("newbyteorder")("="));
  std::optional<DType> from = dtype_of_numpy(arr.dtype());
  if (!from) {
    // Every dtype converts exactly or is refused naming it. Integers of other widths (int8,
    // int16, uint16, uint32) become i64, exactly; uint64 too, when every value is below 2^63
    // (PyTorch refuses the rest: `tensor([2**63])` overflows int64); float16 becomes f32, exactly.
    const char kind = arr.dtype().kind();
    const auto itemsize = arr.dtype().itemsize();
    if (kind == 'u' && itemsize == 8 && arr.size() > 0 &&
        py::int_(arr.attr("max")()).cast<uint64_t>() >
            static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      throw Error("lockstep.tensor: a value of the uint64 data (" + from_name +
                  ") is 2^63 or more and does not fit in int64, lockstep's widest integer; "
                  "reduce it, or convert the data to float64 first");
    if (kind == 'u' || kind == 'i') {
      arr = arr.attr("astype")(np.attr("int64"));
      from = DType::I64;
    } else if (kind == 'f' && itemsize == 2) {
      arr = arr.attr("astype")(np.attr("float32"));
      from = DType::F32;
    } else {
      throw Error("lockstep.tensor: data of NumPy dtype " + from_name +
                  " has no lockstep dtype (float32, float64, int32, int64, uint8, bool); convert "
                  "it first, e.g. arr.astype(numpy.float32)");
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

namespace lockstep::python {

// The library's advice is spelled in C++ ("Cast them with ls::cast(targets, ls::i64)", "Wrap
// each iteration in ls::step"); raised to Python, it is spelled as a Python user writes it.
std::string python_spelling(std::string text) {
  static const std::vector<std::pair<std::regex, std::string>>* rules = [] {
    auto* r = new std::vector<std::pair<std::regex, std::string>>;
    auto add = [&](const char* from, const char* to) { r->emplace_back(std::regex(from), to); };
    // Calls first, while they are still C++.
    add(R"(ls::cast\(([\w.]+), ([^()]+)\))", "$1.to($2)");
    add(R"(\.to\(ls::parse_device\(\\?"(\w+)\\?"\)\))", ".to(\"$1\")");
    add(R"(ls::step\(\.\.\.\) or an ls::Step scope)", "a `with lockstep.step():` block");
    add(R"(an? ls::Step scope)", "a `with lockstep.step():` block");
    add(R"(ls::Step\b)", "lockstep.step");
    add(R"(an? ls::NoGrad scope)", "a `with lockstep.no_grad():` block");
    add(R"(ls::NoGrad\b)", "lockstep.no_grad()");
    add(R"(ls::max_pool2d_with_indices)", "lockstep.nn.functional.max_pool2d_with_indices");
    add(R"(default-constructed ls::Tensor)", "a Tensor never given a value");
    add(R"(ls::zeros\(\{([^}]*)\}\))", "lockstep.zeros($1)");
    add(R"(\.to_vector<\w+>\(\))", ".tolist()");
    add(R"(\.item<\w+>\(\))", ".item()");
    // Names: the dtypes by Python's names, then every namespace.
    add(R"(ls::f32\b)", "lockstep.float32");
    add(R"(ls::f64\b)", "lockstep.float64");
    add(R"(ls::i32\b)", "lockstep.int32");
    add(R"(ls::i64\b)", "lockstep.int64");
    add(R"(ls::bf16\b)", "lockstep.bfloat16");
    add(R"(ls::u8\b)", "lockstep.uint8");
    add(R"(ls::boolean\b)", "lockstep.bool");
    add(R"(ls::step\b)", "`with lockstep.step():`");
    add(R"(ls::(\w+)::)", "lockstep.$1.");
    add(R"(ls::)", "lockstep.");
    return r;
  }();
  if (text.find("ls::") == std::string::npos) return text;
  for (const auto& [from, to] : *rules) text = std::regex_replace(text, from, to);
  return text;
}

// A Python object kept by C++ (a closure queued on the runtime thread, a scheduler's lr
// function). A closure lets go of it while it still holds the GIL (runtime.cpp's
// add_step_closure), so that nothing touches Python after its program is done: at exit the
// interpreter may be finalizing by then, and a thread that takes the GIL during finalization is
// ended on the spot. One never run (its step rolled back or failed) is released here, with the
// GIL.
std::shared_ptr<py::object> keep(py::object o) {
  return std::shared_ptr<py::object>(new py::object(std::move(o)), [](py::object* p) {
    if (*p) {
      py::gil_scoped_acquire gil;
      delete p;
    } else {
      delete p;
    }
  });
}

}  // namespace lockstep::python
