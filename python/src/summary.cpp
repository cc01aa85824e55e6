// lockstep.SummaryWriter: TensorBoard event files (lockstep/summary.h) with the names and
// arguments of torch.utils.tensorboard.SummaryWriter, and a context manager that closes it.
// The add_* calls only queue (safe in step closures); flush and close release the GIL.
#include "common.h"

namespace lockstep::python {
namespace {

std::string path_of(const py::object& o) {
  return py::str(py::module_::import("os").attr("fspath")(o)).cast<std::string>();
}

// A scalar as PyTorch takes it: a Python number, a NumPy scalar, a 0-d tensor (float(x)).
double number_of(const py::object& o) { return py::float_(o).cast<double>(); }

}  // namespace

void init_summary(py::module_& m) {
  using py::arg;
  const auto none = py::none();
  py::class_<SummaryWriter>(m, "SummaryWriter", R"(Writes TensorBoard event files, as
torch.utils.tensorboard.SummaryWriter: log_dir (default runs/<date>_<host><comment>), purge_step,
max_queue (events buffered before the background thread writes them), flush_secs,
filename_suffix. The add_* calls only queue an event: log from step closures freely.)")
      .def(py::init([](const py::object& log_dir, const std::string& comment,
                       std::optional<int64_t> purge_step, int64_t max_queue, double flush_secs,
                       const std::string& filename_suffix) {
             return std::make_unique<SummaryWriter>(SummaryWriterOptions{
                 .log_dir = log_dir.is_none() ? std::string() : path_of(log_dir),
                 .comment = comment,
                 .purge_step = purge_step,
                 .max_queue = max_queue,
                 .flush_secs = flush_secs,
                 .filename_suffix = filename_suffix});
           }),
           arg("log_dir") = none, arg("comment") = "", arg("purge_step") = none,
           arg("max_queue") = 10, arg("flush_secs") = 120, arg("filename_suffix") = "")
      .def(
          "add_scalar",
          [](SummaryWriter& w, const std::string& tag, const py::object& scalar_value,
             std::optional<int64_t> global_step, std::optional<double> walltime) {
            w.add_scalar(tag, number_of(scalar_value), global_step, walltime);
          },
          arg("tag"), arg("scalar_value"), arg("global_step") = none, arg("walltime") = none,
          "Logs one value (stored as float32) at global_step.")
      .def(
          "add_scalars",
          [](SummaryWriter& w, const std::string& main_tag, const py::dict& tag_scalar_dict,
             std::optional<int64_t> global_step, std::optional<double> walltime) {
            std::vector<std::pair<std::string, double>> values;
            for (const auto& kv : tag_scalar_dict)
              values.emplace_back(py::str(kv.first).cast<std::string>(),
                                  number_of(py::reinterpret_borrow<py::object>(kv.second)));
            w.add_scalars(main_tag, values, global_step, walltime);
          },
          arg("main_tag"), arg("tag_scalar_dict"), arg("global_step") = none,
          arg("walltime") = none,
          "Logs each value to the run <log_dir>/<main_tag>_<tag>, under the tag main_tag.")
      .def("add_text", &SummaryWriter::add_text, arg("tag"), arg("text_string"),
           arg("global_step") = none, arg("walltime") = none,
           "Logs markdown text (TensorBoard's text dashboard, tag '<tag>/text_summary').")
      .def(
          "flush",
          [](SummaryWriter& w) {
            NoGil release;
            w.flush();
          },
          "Writes every queued event to disk.")
      .def(
          "close",
          [](SummaryWriter& w) {
            NoGil release;
            w.close();
          },
          "Flushes and closes the files; later add_* calls raise lockstep.Error.")
      .def("get_logdir", &SummaryWriter::log_dir)
      .def_property_readonly("log_dir", &SummaryWriter::log_dir)
      .def_property_readonly("file_name", &SummaryWriter::file_name, "The main run's event file.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](SummaryWriter& w, const py::args&) {
        NoGil release;
        w.close();
        return false;
      });
}

}  // namespace lockstep::python
