// The extension module lockstep._lockstep; the package lockstep (python/lockstep/) adds what is
// written best in Python (the step context manager, Module's attribute registration) on top.
#include "common.h"

PYBIND11_MODULE(_lockstep, m) {
  namespace py = pybind11;
  namespace lp = lockstep::python;
  m.doc() = "lockstep: lazy tensors and explicit, transactional training steps";
  // lockstep.Error subclasses RuntimeError; BackendError subclasses Error.
  static py::exception<lockstep::Error> error(m, "Error", PyExc_RuntimeError);
  static py::exception<lockstep::BackendError> backend_error(m, "BackendError", error.ptr());
  // Printed as lockstep.Error, not lockstep._lockstep.Error.
  error.attr("__module__") = "lockstep";
  backend_error.attr("__module__") = "lockstep";
  // The library's advice, spelled for Python ("x.to(lockstep.int64)", not "ls::cast(x, ls::i64)").
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const lockstep::BackendError& e) {
      PyErr_SetString(backend_error.ptr(), lp::python_spelling(e.what()).c_str());
    } catch (const lockstep::Error& e) {
      PyErr_SetString(error.ptr(), lp::python_spelling(e.what()).c_str());
    }
  });
  // One hook names the user's Python line for everything the library records; no binding
  // passes a place (common.h).
  lp::register_frames_hook();
  m.def("_set_package_dir", &lp::set_package_dir);
  lp::init_tensor(m);
  lp::init_ops(m);
  lp::init_runtime(m);
  lp::init_nn(m);
  lp::init_optim(m);
  lp::init_extras(m);
  lp::init_dlpack(m);
  lp::init_summary(m);
  lp::init_profiler(m);
  lp::init_fast_calls(m);
  lp::init_tensor_methods(m);
}
