// lockstep.profiler's native part: start/stop of step timelines (lockstep/profiler.h) and the
// user's own spans; the context managers are python/lockstep/profiler.py. stop() releases the
// GIL while it waits for the queued programs (their closures may need it).
#include "lockstep/profiler.h"
#include "common.h"

namespace lockstep::python {

void init_profiler(py::module_& m) {
  using py::arg;
  auto p = m.def_submodule("profiler", "Step timelines as Chrome Trace Event JSON");
  py::enum_<profiler::Level>(p, "Level")
      .value("coarse", profiler::Level::Coarse)
      .value("fine", profiler::Level::Fine);
  p.def(
      "start",
      [](const py::object& dir, const std::string& level) {
        if (level != "coarse" && level != "fine")
          throw Error("lockstep.profiler.start: level must be 'coarse' or 'fine', not '" + level +
                      "'");
        profiler::start(py::str(py::module_::import("os").attr("fspath")(dir)).cast<std::string>(),
                        level == "fine" ? profiler::Level::Fine : profiler::Level::Coarse);
      },
      arg("dir"), arg("level") = "coarse",
      R"(Starts tracing into dir (made if missing). level: 'coarse' (programs as a whole) or
'fine' (each step of a program's plan too).)");
  p.def(
      "stop",
      [] {
        py::gil_scoped_release release;
        return profiler::stop();
      },
      "Waits for this thread's queued programs, writes the trace; returns its path ('' if off)");
  p.def("enabled", &profiler::enabled);
  py::class_<profiler::RecordFunction>(p, "_RecordFunction")
      .def(py::init<std::string>(), arg("name"));
}

}  // namespace lockstep::python
