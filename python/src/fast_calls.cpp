// The calls a training loop makes most, entered below pybind11's dispatcher. A pybind11 call
// spends more time finding its overload, converting its arguments (a type lookup per argument)
// and wrapping its result than lockstep spends recording the op: `x + x` cost 2.7x its C++ twin,
// `neg(x)` 2.5x (bench/record_cost.py). Here the common shapes of these calls — tensor operators
// on tensors and Python numbers, the elementwise functions of one tensor, a built-in layer called
// on one tensor — read their arguments and wrap their result directly; every other form of the
// same call (keywords, NumPy scalars, a Python subclass's forward, wrong types) goes on to the
// pybind11 function it fronts, unchanged, so the two can only differ in speed.
//
// A result is wrapped as pybind11 wraps a returned Tensor (a Tensor moved to the heap, owned by
// its holder), without the type lookups and the table of instances (see wrap).
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "common.h"

namespace lockstep::python {
namespace {

PyTypeObject* g_tensor_type = nullptr;
const py::detail::type_info* g_tensor_info = nullptr;

// The Tensor a Python object holds: a lockstep.Tensor or an instance of a Python subclass
// (nn.Parameter) in pybind11's simple layout, initialized; null for anything else.
const Tensor* tensor_of(PyObject* o) {
  PyTypeObject* type = Py_TYPE(o);
  if (type != g_tensor_type && !PyType_IsSubtype(type, g_tensor_type)) return nullptr;
  auto* inst = reinterpret_cast<py::detail::instance*>(o);
  if (!inst->simple_layout) return nullptr;
  return static_cast<const Tensor*>(inst->simple_value_holder[0]);
}

// A Python number as the binding's Scalar caster reads it without conversion (bool, int within
// int64, float, NumPy float64 among them); nothing for the rest (NumPy integers convert on
// pybind11's path).
std::optional<Scalar> number_of(PyObject* o) {
  if (PyBool_Check(o)) return Scalar(o == Py_True);
  if (PyLong_Check(o)) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow != 0 || (v == -1 && PyErr_Occurred())) {
      PyErr_Clear();
      return std::nullopt;
    }
    return Scalar(static_cast<int64_t>(v));
  }
  if (PyFloat_Check(o)) return Scalar(PyFloat_AS_DOUBLE(o));
  return std::nullopt;
}

// A new lockstep.Tensor object holding `t`, as pybind11's cast of a returned Tensor makes it
// (type_caster_generic::cast, instance::allocate_layout, class_::init_instance): pybind11's simple
// layout (init_fast_calls checks that it is Tensor's), the value on the heap, owned by its
// std::unique_ptr holder. It is not entered in pybind11's table of instances (an insertion and
// an erasure, a third of what wrapping costs): that table serves only to give back the same
// Python object for a C++ reference to its value, and no function of the binding returns a
// reference to a Tensor (the in-place methods return `self`).
PyObject* wrap(Tensor&& t) {
  PyObject* self = g_tensor_type->tp_alloc(g_tensor_type, 0);  // zeroed
  if (!self) return nullptr;
  auto* inst = reinterpret_cast<py::detail::instance*>(self);
  auto* value = new Tensor(std::move(t));
  inst->simple_layout = true;
  inst->simple_value_holder[0] = value;
  inst->owned = true;
  new (&inst->simple_value_holder[1]) std::unique_ptr<Tensor>(value);
  inst->simple_holder_constructed = true;
  return self;
}

// Tensor's tp_dealloc: an object wrap() made (or pybind11 made alike: value owned by its holder,
// no weak references, no kept-alive patients, unregistered) is freed here, without pybind11's
// walk over its type's bases; any other goes to pybind11's own.
destructor g_pybind11_dealloc = nullptr;

void tensor_dealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  auto* inst = reinterpret_cast<py::detail::instance*>(self);
  if (type == g_tensor_type && inst->simple_layout && inst->simple_holder_constructed &&
      !inst->simple_instance_registered && !inst->weakrefs && !inst->has_patients) {
    std::destroy_at(reinterpret_cast<std::unique_ptr<Tensor>*>(&inst->simple_value_holder[1]));
    type->tp_free(self);
    Py_DECREF(type);  // each instance of a heap type holds a reference to it (as pybind11's)
  } else {
    g_pybind11_dealloc(self);
  }
}

// Runs `f`, turning a C++ exception into the Python one the binding's translators choose (as
// pybind11's dispatcher does).
template <typename F>
PyObject* guarded(F&& f) {
  try {
    return f();
  } catch (py::error_already_set& e) {
    e.restore();
    return nullptr;
  } catch (...) {
    if (py::detail::apply_exception_translators(
            py::detail::get_local_internals().registered_exception_translators) ||
        py::detail::apply_exception_translators(
            py::detail::get_internals().registered_exception_translators))
      return nullptr;
    PyErr_SetString(PyExc_SystemError, "lockstep: an exception escaped the exception translators");
    return nullptr;
  }
}

using Unary = Tensor (*)(const Tensor&, Loc);
using TensorTensor = Tensor (*)(const Tensor&, const Tensor&, Loc);
using TensorScalar = Tensor (*)(const Tensor&, Scalar, Loc);
using ScalarTensor = Tensor (*)(Scalar, const Tensor&, Loc);

// Module-level functions (and through init_tensor_methods, the methods that are the same
// function objects): `self` is the pybind11 function fronted.
template <Unary F>
PyObject* unary_front(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  if (nargs == 1 && !kwnames)
    if (const Tensor* x = tensor_of(args[0]))
      return guarded([&] { return wrap(F(*x, Loc::current())); });
  return PyObject_Vectorcall(self, args, static_cast<size_t>(nargs), kwnames);
}

// The (Tensor, Tensor), (Tensor, number) and (number, Tensor) forms of a binary op, or null
// with no error set when the operands are none of these.
template <TensorTensor TT, TensorScalar TS, ScalarTensor ST>
PyObject* binary(PyObject* a, PyObject* b) {
  const Tensor* ta = tensor_of(a);
  const Tensor* tb = tensor_of(b);
  if (ta && tb) return guarded([&] { return wrap(TT(*ta, *tb, Loc::current())); });
  if (ta) {
    if (const std::optional<Scalar> s = number_of(b))
      return guarded([&] { return wrap(TS(*ta, *s, Loc::current())); });
  } else if (tb) {
    if (const std::optional<Scalar> s = number_of(a))
      return guarded([&] { return wrap(ST(*s, *tb, Loc::current())); });
  }
  return nullptr;
}

template <TensorTensor TT, TensorScalar TS, ScalarTensor ST>
PyObject* binary_front(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  if (nargs == 2 && !kwnames)
    if (PyObject* r = binary<TT, TS, ST>(args[0], args[1]); r || PyErr_Occurred()) return r;
  return PyObject_Vectorcall(self, args, static_cast<size_t>(nargs), kwnames);
}

// Tensor's number slots. Other operands get what CPython's generic slot gave them (it called
// the left operand's method, then the right one's reflected method), by calling the methods
// themselves: the generic slot function cannot be called from another slot (it calls the left
// operand's method only while it is that type's slot).
// `name` must be a string literal: its interned Python string is made once and kept.
PyObject* interned(const char* name) {
  static std::unordered_map<const char*, PyObject*> strings;  // under the GIL
  PyObject*& s = strings[name];
  if (!s) s = PyUnicode_InternFromString(name);
  return s;
}

PyObject* call_method(PyObject* self, const char* name, PyObject* arg) {
  PyObject* key = interned(name);
  PyObject* method = key ? _PyType_Lookup(Py_TYPE(self), key) : nullptr;  // borrowed
  if (!method) {
    if (PyErr_Occurred()) return nullptr;
    Py_RETURN_NOTIMPLEMENTED;
  }
  PyObject* args[] = {self, arg};
  return PyObject_Vectorcall(method, args, arg ? 2 : 1, nullptr);
}

PyObject* generic_binary(PyObject* a, PyObject* b, const char* name, const char* rname) {
  if (PyObject_TypeCheck(a, g_tensor_type)) {
    PyObject* r = call_method(a, name, b);
    if (r != Py_NotImplemented) return r;
    Py_DECREF(r);
  }
  if (rname && Py_TYPE(a) != Py_TYPE(b) && PyObject_TypeCheck(b, g_tensor_type))
    return call_method(b, rname, a);
  Py_RETURN_NOTIMPLEMENTED;
}

template <TensorTensor TT, TensorScalar TS, ScalarTensor ST, const char* Name, const char* RName>
PyObject* binary_slot(PyObject* a, PyObject* b) {
  if (PyObject* r = binary<TT, TS, ST>(a, b); r || PyErr_Occurred()) return r;
  return generic_binary(a, b, Name, RName);
}

PyObject* matmul_slot(PyObject* a, PyObject* b) {
  const Tensor* ta = tensor_of(a);
  const Tensor* tb = tensor_of(b);
  if (ta && tb) return guarded([&] { return wrap(matmul(*ta, *tb, Loc::current())); });
  return generic_binary(a, b, "__matmul__", nullptr);
}

PyObject* negative_slot(PyObject* x) {
  if (const Tensor* t = tensor_of(x)) return guarded([&] { return wrap(neg(*t, Loc::current())); });
  return call_method(x, "__neg__", nullptr);
}

constexpr char kAdd[] = "__add__", kRAdd[] = "__radd__", kSub[] = "__sub__", kRSub[] = "__rsub__",
               kMul[] = "__mul__", kRMul[] = "__rmul__", kDiv[] = "__truediv__",
               kRDiv[] = "__rtruediv__";

// A built-in layer called on one tensor (`linear(x)`): what Module.__call__ does for it (the
// call's place, forward inside the module's frame) without its dispatch, its bound forward and
// a second dispatch into Module.forward. Any other call goes to the generic slot, which finds
// Module.__call__.
PyTypeObject* g_module_type = nullptr;
const py::detail::type_info* g_module_info = nullptr;
PyObject* g_module_forward = nullptr;  // Module.forward, as the class dict holds it
ternaryfunc g_generic_call = nullptr;

PyObject* module_call_slot(PyObject* self, PyObject* args, PyObject* kwargs) {
  if ((!kwargs || PyDict_GET_SIZE(kwargs) == 0) && PyTuple_GET_SIZE(args) == 1)
    if (const Tensor* x = tensor_of(PyTuple_GET_ITEM(args, 0))) {
      if (_PyType_Lookup(Py_TYPE(self), interned("forward")) == g_module_forward) {
        py::detail::type_caster_generic module(g_module_info);
        if (module.load(self, false) && module.value)
          return guarded([&] {
            auto& m = *static_cast<nn::Module*>(module.value);
            return wrap(m(*x, user_place()));
          });
      }
    }
  return g_generic_call(self, args, kwargs);
}

#define LS_BINARY_FNS(name)                                                               \
  static_cast<TensorTensor>(&lockstep::name), static_cast<TensorScalar>(&lockstep::name), \
      static_cast<ScalarTensor>(&lockstep::name)

// Points `type`'s number slots at the fast ones, where `type` reaches the operator through
// lockstep.Tensor's own method (a Python subclass overriding __add__ keeps its own).
void install_slots(PyTypeObject* type) {
  PyNumberMethods* n = type->tp_as_number;
  const auto inherits = [&](const char* dunder) {
    PyObject* name = interned(dunder);
    return _PyType_Lookup(type, name) == _PyType_Lookup(g_tensor_type, name);
  };
  if (inherits("__add__") && inherits("__radd__"))
    n->nb_add = &binary_slot<LS_BINARY_FNS(add), kAdd, kRAdd>;
  if (inherits("__sub__") && inherits("__rsub__"))
    n->nb_subtract = &binary_slot<LS_BINARY_FNS(sub), kSub, kRSub>;
  if (inherits("__mul__") && inherits("__rmul__"))
    n->nb_multiply = &binary_slot<LS_BINARY_FNS(mul), kMul, kRMul>;
  if (inherits("__truediv__") && inherits("__rtruediv__"))
    n->nb_true_divide = &binary_slot<LS_BINARY_FNS(div), kDiv, kRDiv>;
  if (inherits("__matmul__")) n->nb_matrix_multiply = &matmul_slot;
  if (inherits("__neg__")) n->nb_negative = &negative_slot;
  PyType_Modified(type);
}

// The fronts' method definitions: CPython keeps a pointer to each for the function's life.
std::deque<PyMethodDef> g_defs;
std::deque<std::string> g_docs;

void front(py::module_& m, const char* name, _PyCFunctionFastWithKeywords fn) {
  py::object fallback = m.attr(name);
  g_docs.push_back(py::str(fallback.attr("__doc__")).cast<std::string>());
  g_defs.push_back(PyMethodDef{name,
                               reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fn)),
                               METH_FASTCALL | METH_KEYWORDS, g_docs.back().c_str()});
  PyObject* f = PyCFunction_NewEx(&g_defs.back(), fallback.ptr(), m.attr("__name__").ptr());
  if (!f) throw py::error_already_set();
  m.attr(name) = py::reinterpret_steal<py::object>(f);
}

}  // namespace

void init_fast_calls(py::module_& m) {
  py::object tensor = m.attr("Tensor");
  g_tensor_type = reinterpret_cast<PyTypeObject*>(tensor.ptr());
  g_tensor_info = py::detail::get_type_info(typeid(Tensor));
  // wrap() builds pybind11's simple layout: one bound type, its holder (std::unique_ptr) in place.
  if (py::detail::all_type_info(g_tensor_type).size() != 1 ||
      g_tensor_info->holder_size_in_ptrs > py::detail::instance_simple_holder_in_ptrs() ||
      !g_tensor_info->simple_ancestors)
    throw std::logic_error("lockstep.Tensor is not in pybind11's simple layout");
  if (g_tensor_type->tp_dictoffset != 0 || PyType_HasFeature(g_tensor_type, Py_TPFLAGS_HAVE_GC))
    throw std::logic_error("lockstep.Tensor has instance dicts or is collected");
  g_pybind11_dealloc = g_tensor_type->tp_dealloc;
  g_tensor_type->tp_dealloc = &tensor_dealloc;
  install_slots(g_tensor_type);
  // For Python subclasses of Tensor (nn.Parameter), made after this: CPython gives a subclass
  // the generic slots again.
  m.def("_install_fast_slots", [](const py::type& type) {
    if (!PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(type.ptr()), g_tensor_type))
      throw py::type_error("_install_fast_slots: not a subclass of lockstep.Tensor");
    install_slots(reinterpret_cast<PyTypeObject*>(type.ptr()));
  });

  // Every layer the binding defines whose __call__ is Module's and whose instances have no
  // attributes of their own (a Python subclass, made later, keeps the generic slot).
  py::object module = m.attr("nn").attr("Module");
  g_module_type = reinterpret_cast<PyTypeObject*>(module.ptr());
  g_module_info = py::detail::get_type_info(g_module_type);
  g_module_forward = PyDict_GetItemString(g_module_type->tp_dict, "forward");
  g_generic_call = g_module_type->tp_call;
  PyObject* call = interned("__call__");
  PyObject* module_call = _PyType_Lookup(g_module_type, call);
  for (const auto& [type, infos] : py::detail::get_internals().registered_types_py)
    if (PyType_IsSubtype(type, g_module_type) && type->tp_dictoffset == 0 &&
        type->tp_call == g_generic_call && _PyType_Lookup(type, call) == module_call) {
      type->tp_call = &module_call_slot;
      PyType_Modified(type);
    }

#define LS_UNARY(name) front(m, #name, &unary_front<static_cast<Unary>(&lockstep::name)>);
  LS_PY_UNARY_OPS(LS_UNARY)
#undef LS_UNARY
#define LS_BINARY(name) front(m, #name, &binary_front<LS_BINARY_FNS(name)>);
  LS_BINARY(add)
  LS_BINARY(sub)
  LS_BINARY(mul)
  LS_BINARY(div)
  LS_BINARY(maximum)
  LS_BINARY(minimum)
#undef LS_BINARY
}

}  // namespace lockstep::python
