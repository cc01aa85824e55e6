// Steps, syncs, closures, metrics, debug, autocast and no_grad. Every call that may block (a
// step's entry and exit sync, sync, wait, check_errors) releases the GIL while it runs, so step
// closures, which take it on the runtime thread, never deadlock against the caller; a step's
// and a sync's place is taken before (user_place).
#include <memory>

#include "common.h"

namespace lockstep::python {
namespace {

// The state of one `with lockstep.step():` between __enter__ and __exit__.
class PyStep {
 public:
  PyStep(std::optional<PyDType> autocast, const Loc& loc) {
    StepOptions options;
    if (autocast) options.autocast = autocast->value;
    NoGil release;
    step_ = std::make_unique<Step>(options, loc);
  }
  // A step never ended (an ExitStack never closed, an interrupt between __exit__'s bookkeeping
  // and the commit, the object collected on another thread) rolls back: never a commit, never
  // an abort (Step::abandon).
  ~PyStep() {
    if (!step_) return;
    NoGil release;
    step_->abandon();
    step_.reset();
  }
  PyStep(const PyStep&) = delete;
  PyStep& operator=(const PyStep&) = delete;
  void commit() {
    if (!step_) return;
    std::unique_ptr<Step> s = std::move(step_);
    NoGil release;
    s->commit();
  }
  void rollback(const std::string& reason) {
    if (!step_) return;
    std::unique_ptr<Step> s = std::move(step_);
    NoGil release;
    s->rollback(reason);
  }

 private:
  std::unique_ptr<Step> step_;
};

py::dict cache_miss_dict(const debug::CacheMiss& m) {
  py::dict d;
  d["site"] = m.site;
  d["first"] = m.first;
  d["compiles_at_site"] = m.compiles_at_site;
  d["node"] = m.node;
  d["op"] = m.op;
  d["field"] = m.field;
  d["before"] = m.before;
  d["after"] = m.after;
  d["where"] = m.where;
  d["module"] = m.module;
  d["backward_of"] = m.backward_of;
  d["more"] = m.more;
  d["hint"] = m.hint;
  d["text"] = m.text;
  return d;
}

template <typename Guard, typename... Args>
class PyScope {
 public:
  explicit PyScope(Args... args) : args_(args...) {}
  void enter() {
    // Constructed here rather than in std::make_unique: a guard's defaulted place (Loc::current())
    // is then this file's, which the library resolves to the user's line.
    std::apply([this](auto... a) { guard_.reset(new Guard(a...)); }, args_);  // NOLINT
  }
  void exit() { guard_.reset(); }

 private:
  std::tuple<Args...> args_;
  std::unique_ptr<Guard> guard_;
};

}  // namespace

void init_runtime(py::module_& m) {
  using py::arg;
  py::class_<PyStep>(m, "_Step")
      .def(py::init([](std::optional<PyDType> autocast) {
             return std::make_unique<PyStep>(autocast, user_place());
           }),
           arg("autocast") = py::none())
      .def("commit", &PyStep::commit)
      .def("rollback", &PyStep::rollback, arg("reason"));
  // lockstep.step's __enter__ and __exit__, in C++: a KeyboardInterrupt is raised between
  // bytecodes, so none can land between __exit__'s taking the step and its commit or rollback
  // (one written in Python could leave the step open while the handler runs: its reads inside
  // the step, its closures not run). An error while the reason is formatted rolls back too (the
  // step's destructor, as the exception leaves).
  m.def("_install_step_protocol", [](const py::object& cls) {
    auto enter = [](const py::object& self) {
      auto s = std::make_unique<PyStep>(self.attr("_autocast").cast<std::optional<PyDType>>(),
                                        user_place());
      self.attr("_active").attr("append")(py::cast(std::move(s)));
      return self;
    };
    auto exit = [](const py::object& self, const py::object& type, const py::object& exc,
                   const py::object&) {
      const py::object s = self.attr("_active").attr("pop")();
      if (type.is_none())
        s.cast<PyStep&>().commit();
      else
        s.cast<PyStep&>().rollback(
            py::str("{} left the step: {}").format(type.attr("__name__"), exc));
      return false;
    };
    auto method = [&](const char* name, const py::cpp_function& fn) {
      py::setattr(cls, name, py::reinterpret_steal<py::object>(PyInstanceMethod_New(fn.ptr())));
    };
    method("__enter__", py::cpp_function(enter, py::name("__enter__")));
    method("__exit__", py::cpp_function(exit, py::name("__exit__")));
  });

  m.def(
      "sync",
      [] {
        const Loc loc = user_place();
        NoGil release;
        sync(loc);
      },
      "Materializes every live pending tensor (enqueued; returns without waiting).");
  m.def(
      "wait",
      [] {
        NoGil release;
        wait();
      },
      "Blocks until every enqueued program has run; raises an execution error not yet raised.");
  m.def("check_errors", [] {
    NoGil release;
    check_errors();
  });
  m.def("current_step", &current_step);
  m.def("in_step", &in_step);
  m.def(
      "add_step_closure",
      [](const py::function& fn, const py::tuple& args) {
        std::shared_ptr<py::object> call = keep(py::make_tuple(fn, args));
        add_step_closure([call] {
          py::gil_scoped_acquire gil;  // released last: after c below
          // No garbage collection on the runtime thread: it would run the destructors of
          // whatever cycles it finds (a data loader, a model), which belong to the threads
          // that made them. Collection resumes on theirs.
          struct NoCollection {
            int was = PyGC_Disable();
            ~NoCollection() {
              if (was) PyGC_Enable();
            }
          } no_collection;
          py::tuple c = py::reinterpret_steal<py::tuple>(call->release());
          c[0](*c[1]);
        });
      },
      arg("closure"), arg("args") = py::tuple(),
      "Runs closure(*args) on the runtime thread after the current step's program has run.");
  m.def("set_num_threads", &set_num_threads, arg("n"));
  m.def("get_num_threads", &num_threads);
  m.def("set_flush_denormal", &set_flush_denormal, arg("mode"),
        "Whether the cpu backend's programs flush denormal floats to zero (default True); "
        "returns whether this CPU can (PyTorch's torch.set_flush_denormal).");
  m.def("flush_denormal", &flush_denormal);
  m.def(
      "cpu_kernels", [](const PyDType& d) { return cpu_kernels(d.value); },
      arg("dtype") = PyDType{DType::F32});
  m.def("thread_wait_setting", &thread_wait_setting,
        "How the OpenMP threads wait in this process (GOMP_SPINCOUNT=10000 unless set).");
  m.def("set_memory_limit", &set_memory_limit, arg("bytes"));
  m.def("memory_limit", &memory_limit);
  m.def("set_compile_cache_capacity", &set_compile_cache_capacity, arg("capacity"));
  m.def("set_max_queued_programs", &set_max_queued_programs, arg("n"));
  m.def("is_grad_enabled", &is_grad_enabled);

  py::class_<PyScope<AutocastScope, DType>>(m, "_Autocast")
      .def(py::init([](const PyDType& d) {
             return std::make_unique<PyScope<AutocastScope, DType>>(d.value);
           }),
           arg("dtype"))
      .def("enter", &PyScope<AutocastScope, DType>::enter)
      .def("exit", &PyScope<AutocastScope, DType>::exit);
  py::class_<PyScope<NoGrad>>(m, "_NoGrad")
      .def(py::init<>())
      .def("enter", &PyScope<NoGrad>::enter)
      .def("exit", &PyScope<NoGrad>::exit);
  m.def("autocast_dtype", []() -> py::object {
    std::optional<DType> d = autocast_dtype();
    return d ? py::cast(PyDType{*d}) : py::none();
  });

  py::module_ metrics = m.def_submodule("metrics", "Counters, timers and per-site statistics.");
  metrics.def("counter", &metrics::counter, arg("name"));
  metrics.def("timer_total_ns", &metrics::timer_total_ns, arg("name"));
  metrics.def("timer_count", &metrics::timer_count, arg("name"));
  metrics.def("reset", &metrics::reset);
  metrics.def("report", &metrics::report);
  metrics.def("report_json", &metrics::report_json);

  py::module_ dbg = m.def_submodule("debug", "Why programs compiled, and steady-state contracts.");
  dbg.def("last_graph_text", &debug::last_graph_text);
  dbg.def("diff", &debug::diff, arg("a"), arg("b"));
  dbg.def("last_cache_miss", [] { return cache_miss_dict(debug::last_cache_miss()); });
  dbg.def("sites", [] {
    py::list out;
    for (const debug::SiteStats& s : debug::sites()) {
      py::dict d;
      d["site"] = s.site;
      d["syncs"] = s.syncs;
      d["compiles"] = s.compiles;
      d["cache_hits"] = s.cache_hits;
      d["nodes"] = s.nodes;
      d["graphs"] = s.graphs;
      d["in_step"] = s.in_step;
      d["planned_bytes"] = s.planned_bytes;
      d["misses"] = s.misses;
      out.append(d);
    }
    return out;
  });
  dbg.def(
      "expect_steady",
      [](int64_t after_syncs, const std::string& on_recompile, int64_t implicit) {
        if (on_recompile != "throw" && on_recompile != "warn")
          throw Error("expect_steady: on_recompile is 'throw' or 'warn', not '" + on_recompile +
                      "'");
        debug::expect_steady(
            after_syncs,
            on_recompile == "throw" ? debug::OnRecompile::Throw : debug::OnRecompile::Warn,
            implicit);
      },
      arg("after_syncs") = 0, arg("on_recompile") = "throw", arg("implicit_syncs_per_step") = -1);
  dbg.def("stop_expecting_steady", &debug::stop_expecting_steady);
  dbg.def("set_pending_graph_limit", &debug::set_pending_graph_limit, arg("nodes"));
}

}  // namespace lockstep::python
