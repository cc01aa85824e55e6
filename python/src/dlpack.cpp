// DLPack: to_dlpack (Tensor.__dlpack__, defined with the other methods in tensor.cpp) hands a
// materialized tensor's host memory to torch.from_dlpack or numpy.from_dlpack without a copy
// (lockstep::host_memory: while the export lives, lockstep never updates that memory in place);
// lockstep.from_dlpack takes another library's tensor (copied into lockstep's memory).
#include <dlpack/dlpack.h>

#include <cstring>

#include "common.h"

namespace lockstep::python {
namespace {

DLDataType dl_dtype(DType d) {
  switch (d) {
    case DType::F32:
      return {kDLFloat, 32, 1};
    case DType::F64:
      return {kDLFloat, 64, 1};
    case DType::I32:
      return {kDLInt, 32, 1};
    case DType::I64:
      return {kDLInt, 64, 1};
    case DType::BF16:
      return {kDLBfloat, 16, 1};
    case DType::U8:
    case DType::Bool:
      break;
  }
  // Bool: DLPack 0.6 has no boolean code; one byte each, as PyTorch 1.13 exports its bool (its
  // from_dlpack reads it as uint8 0/1, the values exact; later DLPack readers know code 6).
  return {kDLUInt, 8, 1};
}

// DLPack 0.8's boolean code (kDLBool), which Debian's 0.6 header lacks: PyTorch 2.x and NumPy
// 1.25+ export bool with it.
constexpr uint8_t kDLBoolCode = 6;

// The producer's dtype by name ("torch.bool", NumPy's "bool"), where it has one.
bool producer_says_bool(const py::object& source) {
  if (!py::hasattr(source, "dtype")) return false;
  const std::string name = py::str(source.attr("dtype")).cast<std::string>();
  return name == "torch.bool" || name == "bool";
}

// kDLUInt 8 is uint8, unless the producer names its dtype bool: PyTorch 1.13 exports bool so.
std::optional<DType> from_dl(const DLDataType& t, bool producer_bool) {
  if (t.lanes != 1) return std::nullopt;
  if (t.code == kDLBoolCode && t.bits == 8) return DType::Bool;
  if (t.code == kDLFloat && t.bits == 32) return DType::F32;
  if (t.code == kDLFloat && t.bits == 64) return DType::F64;
  if (t.code == kDLInt && t.bits == 32) return DType::I32;
  if (t.code == kDLInt && t.bits == 64) return DType::I64;
  if (t.code == kDLBfloat && t.bits == 16) return DType::BF16;
  if (t.code == kDLUInt && t.bits == 8) return producer_bool ? DType::Bool : DType::U8;
  return std::nullopt;
}

// What a DLManagedTensor owns: the exported memory's owner and the shape it points into.
struct Export {
  DLManagedTensor managed{};
  std::shared_ptr<void> owner;
  std::vector<int64_t> shape;
};

void delete_export(DLManagedTensor* m) { delete static_cast<Export*>(m->manager_ctx); }

void capsule_destructor(PyObject* capsule) {
  // Still named "dltensor": nobody consumed it, so its deleter is ours to call.
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    if (m && m->deleter) m->deleter(m);
  } else {
    PyErr_Clear();
  }
}

Tensor from_dlpack(const py::object& source) {
  const Loc loc = user_place();
  py::object cap_obj = source;
  if (py::hasattr(source, "__dlpack__")) {
    try {
      cap_obj = source.attr("__dlpack__")();
    } catch (py::error_already_set&) {
      // A dtype its DLPack cannot express (PyTorch 1.13 and NumPy 1.24 export no bool): the
      // values through the producer's NumPy view instead, converted as lockstep.tensor does.
      if (!py::hasattr(source, "__array__")) throw;
      return to_tensor(py::module_::import("numpy").attr("asarray")(source), std::nullopt);
    }
  }
  PyObject* cap = cap_obj.ptr();
  if (!PyCapsule_IsValid(cap, "dltensor"))
    throw Error(
        "lockstep.from_dlpack: expected an object with __dlpack__ (a torch or NumPy "
        "array) or an unconsumed 'dltensor' capsule");
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
  const DLTensor& d = m->dl_tensor;
  if (d.device.device_type != kDLCPU)
    throw Error("lockstep.from_dlpack: the tensor is not in host memory (DLPack device type " +
                std::to_string(d.device.device_type) + "); copy it to the CPU first");
  const std::optional<DType> dtype = from_dl(d.dtype, producer_says_bool(source));
  if (!dtype)
    throw Error(
        "lockstep.from_dlpack: DLPack dtype (code " + std::to_string(d.dtype.code) + ", " +
        std::to_string(d.dtype.bits) + " bits, " + std::to_string(d.dtype.lanes) +
        " lanes) has no lockstep dtype (float32, float64, int32, int64, bfloat16, bool, uint8); "
        "convert it first (e.g. .to(torch.int64))");
  Shape shape(d.shape, d.shape + d.ndim);
  // Compact row-major only (strides absent, or equal to the compact ones).
  if (d.strides) {
    int64_t expect = 1;
    for (int i = d.ndim - 1; i >= 0; --i) {
      if (shape[static_cast<size_t>(i)] != 1 && d.strides[i] != expect)
        throw Error(
            "lockstep.from_dlpack: the tensor is not contiguous; call .contiguous() "
            "(torch) or numpy.ascontiguousarray first");
      expect *= shape[static_cast<size_t>(i)];
    }
  }
  const char* data = static_cast<const char*>(d.data) + d.byte_offset;
  const bool zero_dim = shape.empty();
  Tensor t = from_blob(data, zero_dim ? Shape{1} : shape, *dtype, default_device(), loc);
  if (zero_dim) t = t.reshape({}, loc);
  // Consumed: the producer's memory is released now that it is copied.
  PyCapsule_SetName(cap, "used_dltensor");
  if (m->deleter) m->deleter(m);
  return t;
}

}  // namespace

py::capsule to_dlpack(const Tensor& t) {
  const Loc loc = user_place();
  HostMemory mem;
  {
    NoGil release;
    mem = host_memory(t, loc);
  }
  auto e = std::make_unique<Export>();
  e->owner = std::move(mem.owner);
  e->shape = t.shape();
  DLTensor& d = e->managed.dl_tensor;
  d.data = mem.data;
  d.device = {kDLCPU, 0};
  d.ndim = static_cast<int>(e->shape.size());
  d.dtype = dl_dtype(t.dtype());
  d.shape = e->shape.data();
  d.strides = nullptr;  // compact, row-major
  d.byte_offset = 0;
  e->managed.manager_ctx = e.get();
  e->managed.deleter = &delete_export;
  DLManagedTensor* m = &e.release()->managed;
  PyObject* cap = PyCapsule_New(m, "dltensor", &capsule_destructor);
  if (!cap) {
    delete_export(m);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::capsule>(cap);
}

void init_dlpack(py::module_& m) {
  m.def("from_dlpack", &from_dlpack, py::arg("tensor"),
        "A lockstep tensor with a copy of another library's tensor (anything with __dlpack__).");
}

}  // namespace lockstep::python
