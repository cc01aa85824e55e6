// lockstep.optim: the optimizers (parameter groups as torch's list of dicts) and the learning-rate
// schedulers, whose state goes into checkpoints with the model's and the optimizer's.
#include "common.h"

namespace lockstep::python {
namespace {

using optim::Optimizer;

// torch's `params`: an iterable of tensors, or of dicts {"params": [...], "lr": ..., ...}.
struct Groups {
  std::vector<optim::ParamGroup> groups;
};

Groups groups_of(const py::object& params) {
  Groups out;
  std::vector<Tensor> plain;
  for (const py::handle& item : params) {
    if (py::isinstance<py::dict>(item)) {
      py::dict d = py::reinterpret_borrow<py::dict>(item);
      optim::ParamGroup g;
      g.params = d["params"].cast<std::vector<Tensor>>();
      if (d.contains("lr")) g.lr = d["lr"].cast<double>();
      if (d.contains("weight_decay")) g.weight_decay = d["weight_decay"].cast<double>();
      for (const auto& kv : d) {
        const std::string key = kv.first.cast<std::string>();
        if (key != "params" && key != "lr" && key != "weight_decay")
          throw Error("optimizer parameter group: '" + key +
                      "' cannot differ between groups in lockstep (lr and weight_decay can)");
      }
      out.groups.push_back(std::move(g));
    } else {
      plain.push_back(item.cast<Tensor>());
    }
  }
  if (!plain.empty() && !out.groups.empty())
    throw Error("optimizer: give tensors or parameter groups (dicts), not both");
  if (out.groups.empty()) out.groups.push_back(optim::ParamGroup{plain});
  return out;
}

// Builds the optimizer over the first group and adds the others.
template <typename O, typename Options>
std::shared_ptr<O> make(const py::object& params, const Options& options, double lr) {
  Groups g = groups_of(params);
  auto opt = std::make_shared<O>(g.groups[0].params, options);
  if (g.groups[0].lr)
    opt->set_group_lr(0, *g.groups[0].lr);
  else
    opt->set_group_lr(0, lr);
  if (g.groups[0].weight_decay) opt->set_group_weight_decay(0, *g.groups[0].weight_decay);
  for (size_t i = 1; i < g.groups.size(); ++i) opt->add_param_group(g.groups[i]);
  return opt;
}

}  // namespace

void init_optim(py::module_& m) {
  using py::arg;
  py::module_ om = m.def_submodule("optim", "Optimizers and learning-rate schedulers.");
  py::class_<Optimizer, std::shared_ptr<Optimizer>>(om, "Optimizer")
      .def(
          "step",
          [](Optimizer& o, const py::object& loss) {
            o.step(loss.is_none() ? Tensor() : loss.cast<Tensor>());
          },
          arg("loss") = py::none(),
          "Records the update (inside a step it runs with the step's program).")
      .def(
          "zero_grad", [](Optimizer& o, bool) { o.zero_grad(); }, arg("set_to_none") = true)
      .def("num_param_groups", &Optimizer::num_param_groups)
      .def("group_lr", &Optimizer::group_lr, arg("group"))
      .def("set_group_lr", &Optimizer::set_group_lr, arg("group"), arg("lr"))
      .def("group_weight_decay", &Optimizer::group_weight_decay, arg("group"))
      .def("set_group_weight_decay", &Optimizer::set_group_weight_decay, arg("group"),
           arg("weight_decay"))
      .def(
          "add_param_group",
          [](Optimizer& o, const py::dict& d) {
            Groups g = groups_of(py::make_tuple(d));
            o.add_param_group(g.groups[0]);
          },
          arg("param_group"))
      .def_property("lr", &Optimizer::lr, &Optimizer::set_lr)
      .def_property("momentum", &Optimizer::momentum, &Optimizer::set_momentum)
      .def_property_readonly("step_count",
                             [](const Optimizer& o) {
                               // An integer, as PyTorch's counters: reading it is a sync.
                               const Loc loc = user_place();
                               NoGil release;
                               return o.step_count().item<int64_t>(loc);
                             })
      .def_property_readonly("skipped_updates", &Optimizer::skipped_updates)
      .def("params", &Optimizer::params)
      .def("state_dict", [](const Optimizer& o) { return ordered_dict(o.state_dict()); })
      .def("load_state_dict", [](Optimizer& o, const py::object& s) {
        nn::NamedTensors named = named_tensors(s);
        NoGil release;
        o.load_state_dict(named);
      });

  py::class_<optim::SGD, Optimizer, std::shared_ptr<optim::SGD>>(om, "SGD").def(
      py::init([](const py::object& params, double lr, double momentum, double dampening,
                  double weight_decay, bool nesterov, bool skip_nonfinite) {
        optim::SGDOptions o{lr, momentum, dampening, weight_decay, nesterov, skip_nonfinite};
        return make<optim::SGD>(params, o, lr);
      }),
      arg("params"), arg("lr") = 0.01, arg("momentum") = 0.0, arg("dampening") = 0.0,
      arg("weight_decay") = 0.0, arg("nesterov") = false, arg("skip_nonfinite") = false);
  auto adam_options = [](double lr, const std::pair<double, double>& betas, double eps, double wd,
                         bool skip) {
    return optim::AdamOptions{lr, betas.first, betas.second, eps, wd, skip};
  };
  py::class_<optim::Adam, Optimizer, std::shared_ptr<optim::Adam>>(om, "Adam")
      .def(
          py::init([adam_options](const py::object& params, double lr,
                                  std::pair<double, double> betas, double eps, double wd, bool skip,
                                  const py::object& /*foreach*/, const py::object& /*fused*/) {
            return make<optim::Adam>(params, adam_options(lr, betas, eps, wd, skip), lr);
          }),
          arg("params"), arg("lr") = 1e-3, arg("betas") = std::pair{0.9, 0.999}, arg("eps") = 1e-8,
          arg("weight_decay") = 0.0, arg("skip_nonfinite") = false, arg("foreach") = py::none(),
          arg("fused") = py::none());
  py::class_<optim::AdamW, optim::Adam, std::shared_ptr<optim::AdamW>>(om, "AdamW")
      .def(
          py::init([adam_options](const py::object& params, double lr,
                                  std::pair<double, double> betas, double eps, double wd, bool skip,
                                  const py::object& /*foreach*/, const py::object& /*fused*/) {
            return make<optim::AdamW>(params, adam_options(lr, betas, eps, wd, skip), lr);
          }),
          arg("params"), arg("lr") = 1e-3, arg("betas") = std::pair{0.9, 0.999}, arg("eps") = 1e-8,
          arg("weight_decay") = 1e-2, arg("skip_nonfinite") = false, arg("foreach") = py::none(),
          arg("fused") = py::none());
  py::class_<optim::RMSprop, Optimizer, std::shared_ptr<optim::RMSprop>>(om, "RMSprop")
      .def(py::init([](const py::object& params, double lr, double alpha, double eps, double wd,
                       double momentum, bool centered) {
             optim::RMSpropOptions o{lr, alpha, eps, wd, momentum, centered, false};
             return make<optim::RMSprop>(params, o, lr);
           }),
           arg("params"), arg("lr") = 1e-2, arg("alpha") = 0.99, arg("eps") = 1e-8,
           arg("weight_decay") = 0.0, arg("momentum") = 0.0, arg("centered") = false);
  py::class_<optim::Adagrad, Optimizer, std::shared_ptr<optim::Adagrad>>(om, "Adagrad")
      .def(py::init([](const py::object& params, double lr, double lr_decay, double wd, double init,
                       double eps) {
             optim::AdagradOptions o{lr, lr_decay, wd, init, eps, false};
             return make<optim::Adagrad>(params, o, lr);
           }),
           arg("params"), arg("lr") = 1e-2, arg("lr_decay") = 0.0, arg("weight_decay") = 0.0,
           arg("initial_accumulator_value") = 0.0, arg("eps") = 1e-10);
  py::class_<optim::Adadelta, Optimizer, std::shared_ptr<optim::Adadelta>>(om, "Adadelta")
      .def(py::init([](const py::object& params, double lr, double rho, double eps, double wd) {
             optim::AdadeltaOptions o{lr, rho, eps, wd, false};
             return make<optim::Adadelta>(params, o, lr);
           }),
           arg("params"), arg("lr") = 1.0, arg("rho") = 0.9, arg("eps") = 1e-6,
           arg("weight_decay") = 0.0);
  om.def(
      "clip_grad_norm_",
      [](const std::vector<Tensor>& params, double max_norm) {
        return optim::clip_grad_norm_(params, max_norm);
      },
      arg("parameters"), arg("max_norm"));

  // Schedulers: each keeps its optimizer alive.
  py::module_ sm = om.def_submodule("lr_scheduler", "Learning-rate schedules, as torch's.");
  py::class_<optim::Scheduler, std::shared_ptr<optim::Scheduler>>(sm, "Scheduler")
      .def("state_dict", [](const optim::Scheduler& s) { return ordered_dict(s.state_dict()); })
      .def("load_state_dict",
           [](optim::Scheduler& s, const py::object& st) { s.load_state_dict(named_tensors(st)); })
      .def_property_readonly("kind", &optim::Scheduler::kind);
  py::class_<optim::LRScheduler, optim::Scheduler, std::shared_ptr<optim::LRScheduler>>(
      sm, "LRScheduler")
      .def("step", &optim::LRScheduler::step)
      .def_property_readonly("last_epoch", &optim::LRScheduler::count)
      .def("get_last_lr", &optim::LRScheduler::get_last_lr)
      .def_property_readonly("optimizer", &optim::LRScheduler::optimizer,
                             py::return_value_policy::reference);
  const auto keep_alive_2 = py::keep_alive<1, 2>();
  py::class_<optim::StepLR, optim::LRScheduler, std::shared_ptr<optim::StepLR>>(sm, "StepLR")
      .def(py::init<Optimizer&, int64_t, double>(), arg("optimizer"), arg("step_size"),
           arg("gamma") = 0.1, keep_alive_2);
  py::class_<optim::MultiStepLR, optim::LRScheduler, std::shared_ptr<optim::MultiStepLR>>(
      sm, "MultiStepLR")
      .def(py::init<Optimizer&, std::vector<int64_t>, double>(), arg("optimizer"),
           arg("milestones"), arg("gamma") = 0.1, keep_alive_2);
  py::class_<optim::ExponentialLR, optim::LRScheduler, std::shared_ptr<optim::ExponentialLR>>(
      sm, "ExponentialLR")
      .def(py::init<Optimizer&, double>(), arg("optimizer"), arg("gamma"), keep_alive_2);
  py::class_<optim::LinearLR, optim::LRScheduler, std::shared_ptr<optim::LinearLR>>(sm, "LinearLR")
      .def(py::init<Optimizer&, double, double, int64_t>(), arg("optimizer"),
           arg("start_factor") = 1.0 / 3, arg("end_factor") = 1.0, arg("total_iters") = 5,
           keep_alive_2);
  py::class_<optim::CosineWarmupLR, optim::LRScheduler, std::shared_ptr<optim::CosineWarmupLR>>(
      sm, "CosineWarmupLR")
      .def(py::init<Optimizer&, int64_t, int64_t, double>(), arg("optimizer"), arg("warmup_steps"),
           arg("total_steps"), arg("min_lr") = 0.0, keep_alive_2);
  // The user's lr functions (lr_lambda: one, or a list with one per group), called with the GIL.
  auto factors_of = [](const py::object& fns) {
    std::vector<optim::LambdaLR::Factor> out;
    py::list list = py::isinstance<py::list>(fns) || py::isinstance<py::tuple>(fns)
                        ? py::list(fns)
                        : py::list(py::make_tuple(fns));
    for (py::handle f : list) {
      if (!PyCallable_Check(f.ptr())) throw py::type_error("lr_lambda must be callable");
      std::shared_ptr<py::object> fn = keep(py::reinterpret_borrow<py::object>(f));
      out.push_back([fn](int64_t count) {
        py::gil_scoped_acquire gil;
        return (*fn)(count).cast<double>();
      });
    }
    return out;
  };
  py::class_<optim::LambdaLR, optim::LRScheduler, std::shared_ptr<optim::LambdaLR>>(sm, "LambdaLR")
      .def(py::init([factors_of](Optimizer& o, const py::object& fns) {
             return std::make_shared<optim::LambdaLR>(o, factors_of(fns));
           }),
           arg("optimizer"), arg("lr_lambda"), keep_alive_2);
  py::class_<optim::MultiplicativeLR, optim::LambdaLR, std::shared_ptr<optim::MultiplicativeLR>>(
      sm, "MultiplicativeLR")
      .def(py::init([factors_of](Optimizer& o, const py::object& fns) {
             return std::make_shared<optim::MultiplicativeLR>(o, factors_of(fns));
           }),
           arg("optimizer"), arg("lr_lambda"), keep_alive_2);
  py::class_<optim::SequentialLR, optim::LRScheduler, std::shared_ptr<optim::SequentialLR>>(
      sm, "SequentialLR")
      .def(py::init<Optimizer&, std::vector<std::shared_ptr<optim::LRScheduler>>,
                    std::vector<int64_t>>(),
           arg("optimizer"), arg("schedulers"), arg("milestones"), keep_alive_2,
           py::keep_alive<1, 3>());
  py::class_<optim::ChainedScheduler, optim::LRScheduler, std::shared_ptr<optim::ChainedScheduler>>(
      sm, "ChainedScheduler")
      .def(py::init<std::vector<std::shared_ptr<optim::LRScheduler>>>(), arg("schedulers"),
           keep_alive_2);
  py::class_<optim::OneCycleLR, optim::LRScheduler, std::shared_ptr<optim::OneCycleLR>>(
      sm, "OneCycleLR")
      .def(py::init([](Optimizer& o, double max_lr, int64_t total_steps, double pct_start,
                       const std::string& anneal, double div, double final_div, bool three) {
             optim::OneCycleOptions opts;
             opts.max_lr = max_lr;
             opts.total_steps = total_steps;
             opts.pct_start = pct_start;
             opts.cos_anneal = anneal != "linear";
             opts.div_factor = div;
             opts.final_div_factor = final_div;
             opts.three_phase = three;
             return std::make_shared<optim::OneCycleLR>(o, opts);
           }),
           arg("optimizer"), arg("max_lr"), arg("total_steps"), arg("pct_start") = 0.3,
           arg("anneal_strategy") = "cos", arg("div_factor") = 25.0, arg("final_div_factor") = 1e4,
           arg("three_phase") = false, keep_alive_2);
  py::class_<optim::ReduceLROnPlateau, optim::Scheduler, std::shared_ptr<optim::ReduceLROnPlateau>>(
      sm, "ReduceLROnPlateau")
      .def(py::init([](Optimizer& o, const std::string& mode, double factor, int64_t patience,
                       double threshold, const std::string& threshold_mode, int64_t cooldown,
                       double min_lr, double eps) {
             optim::PlateauOptions p;
             p.mode_max = mode == "max";
             p.factor = factor;
             p.patience = patience;
             p.threshold = threshold;
             p.threshold_rel = threshold_mode != "abs";
             p.cooldown = cooldown;
             p.min_lr = min_lr;
             p.eps = eps;
             return std::make_shared<optim::ReduceLROnPlateau>(o, p);
           }),
           arg("optimizer"), arg("mode") = "min", arg("factor") = 0.1, arg("patience") = 10,
           arg("threshold") = 1e-4, arg("threshold_mode") = "rel", arg("cooldown") = 0,
           arg("min_lr") = 0.0, arg("eps") = 1e-8, keep_alive_2)
      .def("step", &optim::ReduceLROnPlateau::step, arg("metrics"));
}

}  // namespace lockstep::python
