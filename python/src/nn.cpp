// lockstep.nn: Module (subclassed in Python, as torch.nn.Module), the built-in layers,
// lockstep.nn.functional and the models. Modules are the C++ library's: a Python subclass is a
// C++ Module whose forward is the Python method, so parameters(), state_dict(), train()/eval(),
// apply, optimizers, checkpoints and DataParallel work on it as on any model.
#include <pybind11/functional.h>

#include <limits>

#include "common.h"

namespace lockstep::python {
namespace {

using nn::Module;

// A Python subclass's C++ object: forward calls the Python method; registration is opened to
// the Python base class (lockstep/nn/__init__.py), which registers on attribute assignment.
class PyModule : public Module {
 public:
  Tensor forward(const Tensor& x) override { PYBIND11_OVERRIDE(Tensor, Module, forward, x); }
  Tensor add_parameter(const std::string& name, const Tensor& t) {
    return register_parameter(name, t);
  }
  Tensor add_buffer(const std::string& name, const Tensor& t) { return register_buffer(name, t); }
  void add_module(const std::string& name, std::shared_ptr<Module> m) {
    register_module(name, std::move(m));
  }
};

PyModule& as_py(Module& m, const char* what) {
  auto* p = dynamic_cast<PyModule*>(&m);
  if (!p)
    throw Error(std::string(what) +
                ": only modules defined in Python (subclasses of lockstep.nn.Module) register "
                "attributes; a built-in layer has its own");
  return *p;
}

std::array<int64_t, 2> pair_of(const py::object& v) {
  if (py::isinstance<py::int_>(v)) return {v.cast<int64_t>(), v.cast<int64_t>()};
  auto s = v.cast<std::vector<int64_t>>();
  if (s.size() != 2)
    throw Error("expected an int or a pair of ints, got " + py::repr(v).cast<std::string>());
  return {s[0], s[1]};
}

nn::Reduction reduction_of(const std::string& r) {
  if (r == "mean") return nn::Reduction::Mean;
  if (r == "sum") return nn::Reduction::Sum;
  if (r == "none") return nn::Reduction::None;
  throw Error("reduction is 'mean', 'sum' or 'none', not '" + r + "'");
}

nn::GeluApproximation gelu_of(const std::string& a) {
  if (a == "none") return nn::GeluApproximation::None;
  if (a == "tanh") return nn::GeluApproximation::Tanh;
  throw Error("approximate is 'none' or 'tanh', not '" + a + "'");
}

Tensor opt_tensor(const py::object& o) { return o.is_none() ? Tensor() : o.cast<Tensor>(); }

Pool2dOptions pool_of(const py::object& kernel, const py::object& stride,
                      const py::object& padding) {
  Pool2dOptions o;
  o.kernel = pair_of(kernel);
  o.stride = stride.is_none() ? o.kernel : pair_of(stride);
  o.padding = pair_of(padding);
  return o;
}

template <typename M, typename... Options>
using Layer = py::class_<M, Module, std::shared_ptr<M>, Options...>;

// A NumPy array or another library's tensor where a module takes lockstep tensors: a short
// TypeError naming the conversion, instead of a dump of the call's signatures and the array.
void refuse_foreign_arrays(const py::object& self, const py::args& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const py::handle a = args[i];
    if (py::isinstance<Tensor>(a)) continue;
    const bool numpy = py::hasattr(a, "__array_interface__");
    if (!numpy && !py::hasattr(a, "__dlpack__")) continue;
    const std::string type = py::str(py::type::of(a).attr("__name__")).cast<std::string>();
    throw py::type_error(
        py::str(py::type::of(self).attr("__name__")).cast<std::string>() + "(): argument " +
        std::to_string(i + 1) + " is a " + (numpy ? "NumPy " : "") + type +
        ", not a lockstep.Tensor; convert it with " +
        (numpy ? "lockstep.from_numpy(x) (or lockstep.tensor(x))" : "lockstep.from_dlpack(x)"));
  }
}

// A layer's tensor attribute: reads its member; an assignment replaces the registered parameter
// (or buffer) as well (Module::set_parameter), so `out.weight = tok.weight` ties the two: one
// parameter, listed, updated and saved as PyTorch's. A layer without it (Linear(bias=False))
// reads None, as PyTorch's.
template <typename M, typename... Options>
void tensor_attr(Layer<M, Options...>& cls, const char* name, Tensor M::*member, bool param) {
  cls.def_property(
      name,
      [member](const M& m) -> py::object {
        return (m.*member).defined() ? py::cast(m.*member) : py::none();
      },
      [name, param](M& m, const py::object& v) {
        Tensor t = v.is_none() ? Tensor() : v.cast<Tensor>();
        if (param)
          m.set_parameter(name, std::move(t));
        else
          m.set_buffer(name, std::move(t));
      });
}

}  // namespace

void init_nn_extra(py::module_& nn, py::module_& functional);  // nn_extra.cpp

void init_nn(py::module_& m) {
  using py::arg;
  const auto none = py::none();
  py::module_ nnm = m.def_submodule("nn", "Modules, layers and losses.");
  py::class_<Module, PyModule, std::shared_ptr<Module>>(nnm, "Module")
      .def(py::init<>())
      .def("forward", &Module::forward, arg("input"))
      .def("__call__",
           [](py::object self, const py::args& args, const py::kwargs& kwargs) {
             Module& mod = self.cast<Module&>();
             refuse_foreign_arrays(self, args);
             py::object fwd = self.attr("forward");
             // The call's place, resolved once: the nodes its layers record name it without
             // asking Python again (util::user_loc finds it on the module frames).
             return mod.call(user_place(), [&] { return fwd(*args, **kwargs); });
           })
      .def("parameters", &Module::parameters)
      .def("named_parameters", &Module::named_parameters)
      .def("buffers", &Module::buffers)
      .def("named_buffers", &Module::named_buffers)
      .def("named_children", &Module::named_children)
      .def("children",
           [](const Module& mod) {
             py::list out;
             for (const auto& [name, c] : mod.named_children()) out.append(c);
             return out;
           })
      .def("named_modules",
           [](py::object self) {
             py::list out;
             for (const auto& [name, c] : self.cast<Module&>().named_modules())
               out.append(py::make_tuple(name, name.empty() ? self : py::cast(c)));
             return out;
           })
      .def(
          "apply",
          [](py::object self, const py::function& fn) {
            // PyTorch's order: each child's subtree, then the module itself (what decides the
            // order of the random draws of an init function such as DCGAN's weights_init).
            for (py::handle child : self.attr("children")()) child.attr("apply")(fn);
            fn(self);
            return self;
          },
          arg("fn"))
      .def(
          "train",
          [](py::object self, bool on) {
            self.cast<Module&>().train(on);
            return self;
          },
          arg("mode") = true)
      .def("eval",
           [](py::object self) {
             self.cast<Module&>().eval();
             return self;
           })
      .def_property_readonly("training", &Module::is_training)
      .def(
          "to",
          [](py::object self, const std::string& device) {
            self.cast<Module&>().to(parse_device(device));
            return self;
          },
          arg("device"))
      .def("state_dict", [](const Module& mod) { return ordered_dict(mod.state_dict()); })
      .def("set_parameter", &Module::set_parameter, arg("name"), arg("tensor"))
      .def("set_buffer", &Module::set_buffer, arg("name"), arg("tensor"))
      .def(
          "load_state_dict",
          [](Module& mod, const py::object& state, bool strict) {
            nn::NamedTensors named = named_tensors(state);
            NoGil release;
            mod.load_state_dict(named, strict);
          },
          arg("state_dict"), arg("strict") = true)
      .def("zero_grad",
           [](Module& mod) {
             for (Tensor& p : mod.parameters()) p.set_grad(Tensor());
           })
      .def("_register_parameter",
           [](Module& mod, const std::string& name, const Tensor& t) {
             return as_py(mod, "register_parameter").add_parameter(name, t);
           })
      .def("_register_buffer",
           [](Module& mod, const std::string& name, const Tensor& t) {
             return as_py(mod, "register_buffer").add_buffer(name, t);
           })
      .def("_register_module",
           [](Module& mod, const std::string& name, std::shared_ptr<Module> child) {
             as_py(mod, "register_module").add_module(name, std::move(child));
           });

  auto linear = Layer<nn::Linear>(nnm, "Linear")
                    .def(py::init<int64_t, int64_t, bool>(), arg("in_features"),
                         arg("out_features"), arg("bias") = true);
  tensor_attr(linear, "weight", &nn::Linear::weight, true);
  tensor_attr(linear, "bias", &nn::Linear::bias, true);
  auto conv = Layer<nn::Conv2d>(nnm, "Conv2d");
  conv.def(py::init([](int64_t in, int64_t out, const py::object& k, const py::object& stride,
                       const py::object& padding, const py::object& dilation, int64_t groups,
                       bool bias) {
             nn::Conv2dSpec s;
             s.in_channels = in;
             s.out_channels = out;
             s.kernel = pair_of(k);
             s.stride = pair_of(stride);
             s.padding = pair_of(padding);
             s.dilation = pair_of(dilation);
             s.groups = groups;
             s.bias = bias;
             return std::make_shared<nn::Conv2d>(s);
           }),
           arg("in_channels"), arg("out_channels"), arg("kernel_size"), arg("stride") = 1,
           arg("padding") = 0, arg("dilation") = 1, arg("groups") = 1, arg("bias") = true);
  tensor_attr(conv, "weight", &nn::Conv2d::weight, true);
  tensor_attr(conv, "bias", &nn::Conv2d::bias, true);
  for (const char* name : {"BatchNorm2d", "BatchNorm1d"}) {
    if (std::string(name) == "BatchNorm1d") {
      nnm.attr(name) = nnm.attr("BatchNorm2d");
      continue;
    }
    auto bn = Layer<nn::BatchNorm>(nnm, name).def(py::init<int64_t, double, double, bool>(),
                                                  arg("num_features"), arg("eps") = 1e-5,
                                                  arg("momentum") = 0.1, arg("affine") = true);
    tensor_attr(bn, "weight", &nn::BatchNorm::weight, true);
    tensor_attr(bn, "bias", &nn::BatchNorm::bias, true);
    tensor_attr(bn, "running_mean", &nn::BatchNorm::running_mean, false);
    tensor_attr(bn, "running_var", &nn::BatchNorm::running_var, false);
    tensor_attr(bn, "num_batches_tracked", &nn::BatchNorm::num_batches_tracked, false);
  }
  auto ln = Layer<nn::LayerNorm>(nnm, "LayerNorm");
  ln.def(py::init([](const py::object& shape, double eps, bool affine, bool bias) {
           Shape s =
               py::isinstance<py::int_>(shape) ? Shape{shape.cast<int64_t>()} : shape.cast<Shape>();
           return std::make_shared<nn::LayerNorm>(s, eps, affine, bias);
         }),
         arg("normalized_shape"), arg("eps") = 1e-5, arg("elementwise_affine") = true,
         arg("bias") = true);
  tensor_attr(ln, "weight", &nn::LayerNorm::weight, true);
  tensor_attr(ln, "bias", &nn::LayerNorm::bias, true);
  // inplace=True is accepted and computes out of place, as every lockstep op: the module's
  // output is what PyTorch's in-place module returns, and no other tensor can see the input.
  Layer<nn::Dropout>(nnm, "Dropout")
      .def(py::init([](double p, bool) { return std::make_shared<nn::Dropout>(p); }),
           arg("p") = 0.5, arg("inplace") = false);
  Layer<nn::ReLU>(nnm, "ReLU")
      .def(py::init([](bool) { return std::make_shared<nn::ReLU>(); }), arg("inplace") = false);
  Layer<nn::GELU>(nnm, "GELU")
      .def(py::init([](const std::string& a) { return std::make_shared<nn::GELU>(gelu_of(a)); }),
           arg("approximate") = "none");
  Layer<nn::LeakyReLU>(nnm, "LeakyReLU")
      .def(py::init([](double slope, bool) { return std::make_shared<nn::LeakyReLU>(slope); }),
           arg("negative_slope") = 0.01, arg("inplace") = false);
  Layer<nn::ELU>(nnm, "ELU")
      .def(py::init([](double alpha, bool) { return std::make_shared<nn::ELU>(alpha); }),
           arg("alpha") = 1.0, arg("inplace") = false);
  Layer<nn::Softplus>(nnm, "Softplus")
      .def(py::init<double, double>(), arg("beta") = 1.0, arg("threshold") = 20.0);
  Layer<nn::SiLU>(nnm, "SiLU").def(py::init<>());
  Layer<nn::Hardswish>(nnm, "Hardswish").def(py::init<>());
  Layer<nn::Mish>(nnm, "Mish").def(py::init<>());
  Layer<nn::LogSigmoid>(nnm, "LogSigmoid").def(py::init<>());
  Layer<nn::Identity>(nnm, "Identity").def(py::init<>());
  Layer<nn::Sigmoid>(nnm, "Sigmoid").def(py::init<>());
  Layer<nn::Tanh>(nnm, "Tanh").def(py::init<>());
  Layer<nn::Flatten>(nnm, "Flatten")
      .def(py::init<int64_t, int64_t>(), arg("start_dim") = 1, arg("end_dim") = -1);
  Layer<nn::MaxPool2d>(nnm, "MaxPool2d")
      .def(py::init([](const py::object& k, const py::object& s, const py::object& p) {
             return std::make_shared<nn::MaxPool2d>(pool_of(k, s, p));
           }),
           arg("kernel_size"), arg("stride") = none, arg("padding") = 0);
  Layer<nn::AvgPool2d>(nnm, "AvgPool2d")
      .def(py::init([](const py::object& k, const py::object& s, const py::object& p) {
             return std::make_shared<nn::AvgPool2d>(pool_of(k, s, p));
           }),
           arg("kernel_size"), arg("stride") = none, arg("padding") = 0);
  Layer<nn::AdaptiveAvgPool2d>(nnm, "AdaptiveAvgPool2d")
      .def(py::init([](const py::object& size) {
             return std::make_shared<nn::AdaptiveAvgPool2d>(pair_of(size));
           }),
           arg("output_size"));
  Layer<nn::Sequential>(nnm, "Sequential")
      .def(py::init([](const py::args& layers) {
        auto s = std::make_shared<nn::Sequential>();
        for (const py::handle& l : layers) s->add(l.cast<std::shared_ptr<Module>>());
        return s;
      }))
      .def("append",
           [](py::object self, std::shared_ptr<Module> l) {
             self.cast<nn::Sequential&>().add(std::move(l));
             return self;
           })
      .def("__len__", &nn::Sequential::size)
      .def("__getitem__", [](const nn::Sequential& s, int64_t i) {
        const auto n = static_cast<int64_t>(s.size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) throw py::index_error("Sequential index out of range");
        return s[static_cast<size_t>(i)];
      });
  Layer<nn::ModuleList>(nnm, "ModuleList")
      .def(py::init([](const py::object& modules) {
             auto l = std::make_shared<nn::ModuleList>();
             if (!modules.is_none())
               for (const py::handle& x : modules) l->push_back(x.cast<std::shared_ptr<Module>>());
             return l;
           }),
           arg("modules") = none)
      .def("append",
           [](py::object self, std::shared_ptr<Module> x) {
             self.cast<nn::ModuleList&>().push_back(std::move(x));
             return self;
           })
      .def("__len__", &nn::ModuleList::size)
      .def("__getitem__",
           [](const nn::ModuleList& l, int64_t i) {
             const auto n = static_cast<int64_t>(l.size());
             if (i < 0) i += n;
             if (i < 0 || i >= n) throw py::index_error("ModuleList index out of range");
             return l[static_cast<size_t>(i)];
           })
      .def("__iter__", [](const nn::ModuleList& l) {
        py::list out;
        for (const auto& x : l) out.append(x);
        return py::iter(out);
      });
  // The package's ModuleDict (nn/__init__.py) keeps the Python objects and answers KeyError.
  Layer<nn::ModuleDict>(nnm, "ModuleDict")
      .def(py::init<>())
      .def("_insert", [](nn::ModuleDict& d, const std::string& name,
                         std::shared_ptr<Module> x) { d.insert(name, std::move(x)); })
      .def("__contains__", &nn::ModuleDict::contains)
      .def("__getitem__", &nn::ModuleDict::operator[])
      .def("keys", &nn::ModuleDict::keys)
      .def("__len__", &nn::ModuleDict::size);
  Layer<nn::MultiheadAttention>(nnm, "MultiheadAttention")
      .def(py::init<int64_t, int64_t, double, bool, bool>(), arg("embed_dim"), arg("num_heads"),
           arg("dropout") = 0.0, arg("bias") = true, arg("batch_first") = false)
      .def(
          "forward",
          [](nn::MultiheadAttention& a, const Tensor& q, const Tensor& k, const Tensor& v,
             const py::object& key_padding_mask, bool need_weights, const py::object& attn_mask,
             bool average_attn_weights, bool is_causal) {
            nn::AttentionMasks masks{opt_tensor(attn_mask), opt_tensor(key_padding_mask),
                                     is_causal};
            auto out = a.forward(q, k, v, masks, need_weights, average_attn_weights);
            return py::make_tuple(out.output,
                                  out.weights.defined() ? py::cast(out.weights) : py::none());
          },
          arg("query"), arg("key"), arg("value"), arg("key_padding_mask") = none,
          arg("need_weights") = true, arg("attn_mask") = none, arg("average_attn_weights") = true,
          arg("is_causal") = false);
  init_nn_text(nnm);  // Embedding and the Transformer family (nn_text.cpp)
  auto rnn_options = [](int64_t in, int64_t hidden, int64_t layers, bool bias, bool batch_first,
                        double dropout, bool bidirectional) {
    nn::RNNOptions o;
    o.input_size = in;
    o.hidden_size = hidden;
    o.num_layers = layers;
    o.bias = bias;
    o.batch_first = batch_first;
    o.dropout = dropout;
    o.bidirectional = bidirectional;
    return o;
  };
  Layer<nn::LSTM>(nnm, "LSTM")
      .def(py::init([rnn_options](int64_t in, int64_t hidden, int64_t layers, bool bias,
                                  bool batch_first, double dropout, bool bidirectional) {
             return std::make_shared<nn::LSTM>(
                 rnn_options(in, hidden, layers, bias, batch_first, dropout, bidirectional));
           }),
           arg("input_size"), arg("hidden_size"), arg("num_layers") = 1, arg("bias") = true,
           arg("batch_first") = false, arg("dropout") = 0.0, arg("bidirectional") = false)
      .def(
          "forward",
          [](nn::LSTM& l, const Tensor& x, const py::object& hc) {
            Tensor h0, c0;
            if (!hc.is_none()) {
              py::tuple t = hc.cast<py::tuple>();
              h0 = t[0].cast<Tensor>();
              c0 = t[1].cast<Tensor>();
            }
            auto out = l.forward(x, h0, c0);
            return py::make_tuple(out.output, py::make_tuple(out.h_n, out.c_n));
          },
          arg("input"), arg("hx") = none);
  Layer<nn::GRU>(nnm, "GRU")
      .def(py::init([rnn_options](int64_t in, int64_t hidden, int64_t layers, bool bias,
                                  bool batch_first, double dropout, bool bidirectional) {
             return std::make_shared<nn::GRU>(
                 rnn_options(in, hidden, layers, bias, batch_first, dropout, bidirectional));
           }),
           arg("input_size"), arg("hidden_size"), arg("num_layers") = 1, arg("bias") = true,
           arg("batch_first") = false, arg("dropout") = 0.0, arg("bidirectional") = false)
      .def(
          "forward",
          [](nn::GRU& l, const Tensor& x, const py::object& h0) {
            auto out = l.forward(x, opt_tensor(h0));
            return py::make_tuple(out.output, out.h_n);
          },
          arg("input"), arg("hx") = none);

  // Variable-length batches padded to a few bucket lengths (one compile per bucket).
  py::class_<nn::PaddedSequences>(nnm, "PaddedSequences")
      .def_readonly("padded", &nn::PaddedSequences::padded)
      .def_readonly("padding_mask", &nn::PaddedSequences::padding_mask)
      .def_readonly("lengths", &nn::PaddedSequences::lengths)
      .def("__iter__", [](const nn::PaddedSequences& p) {
        return py::iter(py::make_tuple(p.padded, p.padding_mask, p.lengths));
      });
  nnm.def("bucket_length", &nn::bucket_length, arg("length"), arg("buckets"));
  nnm.def(
      "pad_sequences",
      [](const std::vector<Tensor>& seqs, int64_t length, bool batch_first, Scalar value) {
        return nn::pad_sequences(seqs, length, batch_first, value);
      },
      arg("sequences"), arg("length") = 0, arg("batch_first") = true, arg("padding_value") = 0);
  nnm.def(
      "pad_token_batch",
      [](const std::vector<std::vector<int64_t>>& tokens, const std::vector<int64_t>& buckets,
         int64_t pad_id) {
        // Host data: from_vector keeps the place as given.
        return nn::pad_token_batch(tokens, buckets, pad_id, default_device(), user_place());
      },
      arg("tokens"), arg("buckets"), arg("pad_id") = 0);

  // lockstep.nn.functional
  py::module_ F = nnm.def_submodule("functional", "Functions of lockstep.nn, as torch's.");
  F.def(
      "linear",
      [](const Tensor& x, const Tensor& w, const py::object& b) {
        return nn::linear(x, w, opt_tensor(b));
      },
      arg("input"), arg("weight"), arg("bias") = none);
  F.def(
      "relu", [](const Tensor& x) { return relu(x); }, arg("input"));
  F.def(
      "gelu", [](const Tensor& x, const std::string& a) { return nn::gelu(x, gelu_of(a)); },
      arg("input"), arg("approximate") = "none");
  F.def(
      "leaky_relu", [](const Tensor& x, double s) { return nn::leaky_relu(x, s); }, arg("input"),
      arg("negative_slope") = 0.01);
  F.def(
      "elu", [](const Tensor& x, double a) { return nn::elu(x, a); }, arg("input"),
      arg("alpha") = 1.0);
  F.def(
      "silu", [](const Tensor& x) { return nn::silu(x); }, arg("input"));
  F.def(
      "softplus", [](const Tensor& x, double b, double t) { return nn::softplus(x, b, t); },
      arg("input"), arg("beta") = 1.0, arg("threshold") = 20.0);
  F.def(
      "hardswish", [](const Tensor& x) { return nn::hardswish(x); }, arg("input"));
  F.def(
      "mish", [](const Tensor& x) { return nn::mish(x); }, arg("input"));
  F.def(
      "logsigmoid", [](const Tensor& x) { return nn::log_sigmoid(x); }, arg("input"));
  F.def(
      "sigmoid", [](const Tensor& x) { return sigmoid(x); }, arg("input"));
  F.def(
      "tanh", [](const Tensor& x) { return tanh(x); }, arg("input"));
  F.def(
      "softmax", [](const Tensor& x, int64_t d) { return softmax(x, d); }, arg("input"),
      arg("dim"));
  F.def(
      "log_softmax", [](const Tensor& x, int64_t d) { return log_softmax(x, d); }, arg("input"),
      arg("dim"));
  F.def(
      "dropout",
      [](const Tensor& x, double p, bool training) { return nn::dropout(x, p, training); },
      arg("input"), arg("p") = 0.5, arg("training") = true);
  F.def(
      "batch_norm",
      [](const Tensor& x, const Tensor& rm, const Tensor& rv, const py::object& w,
         const py::object& b, bool training, double momentum, double eps) {
        return nn::batch_norm(x, rm, rv, opt_tensor(w), opt_tensor(b), training, momentum, eps);
      },
      arg("input"), arg("running_mean"), arg("running_var"), arg("weight") = none,
      arg("bias") = none, arg("training") = false, arg("momentum") = 0.1, arg("eps") = 1e-5);
  F.def(
      "cross_entropy",
      [](const Tensor& logits, const Tensor& target, int64_t ignore_index,
         const std::string& reduction, double label_smoothing) {
        nn::CrossEntropyOptions o{reduction_of(reduction), ignore_index, label_smoothing};
        return nn::cross_entropy(logits, target, o);
      },
      arg("input"), arg("target"), arg("ignore_index") = -100, arg("reduction") = "mean",
      arg("label_smoothing") = 0.0);
  F.def(
      "nll_loss",
      [](const Tensor& lp, const Tensor& target, int64_t ignore_index,
         const std::string& reduction) {
        nn::CrossEntropyOptions o{reduction_of(reduction), ignore_index, 0.0};
        return nn::nll_loss(lp, target, o);
      },
      arg("input"), arg("target"), arg("ignore_index") = -100, arg("reduction") = "mean");
  F.def(
      "mse_loss",
      [](const Tensor& a, const Tensor& b, const std::string& r) {
        return nn::mse_loss(a, b, reduction_of(r));
      },
      arg("input"), arg("target"), arg("reduction") = "mean");
  F.def(
      "binary_cross_entropy_with_logits",
      [](const Tensor& a, const Tensor& b, const std::string& r) {
        return nn::binary_cross_entropy_with_logits(a, b, reduction_of(r));
      },
      arg("input"), arg("target"), arg("reduction") = "mean");
  F.def(
      "binary_cross_entropy",
      [](const Tensor& a, const Tensor& b, const py::object& weight, const std::string& r) {
        return nn::binary_cross_entropy(a, b, opt_tensor(weight), reduction_of(r));
      },
      arg("input"), arg("target"), arg("weight") = none, arg("reduction") = "mean");
  F.def(
      "scaled_dot_product_attention",
      [](const Tensor& q, const Tensor& k, const Tensor& v, const py::object& mask, double p,
         bool causal, const py::object& scale) {
        return nn::scaled_dot_product_attention(q, k, v, opt_tensor(mask), p, causal,
                                                scale.is_none() ? 0.0 : scale.cast<double>());
      },
      arg("query"), arg("key"), arg("value"), arg("attn_mask") = none, arg("dropout_p") = 0.0,
      arg("is_causal") = false, arg("scale") = none);
  F.def(
      "conv2d",
      [](const Tensor& x, const Tensor& w, const py::object& b, const py::object& stride,
         const py::object& padding, const py::object& dilation, int64_t groups) {
        Conv2dOptions o{pair_of(stride), pair_of(padding), pair_of(dilation), groups};
        Tensor y = conv2d(x, w, o);
        if (!b.is_none()) y = add(y, reshape(b.cast<Tensor>(), {1, -1, 1, 1}));
        return y;
      },
      arg("input"), arg("weight"), arg("bias") = none, arg("stride") = 1, arg("padding") = 0,
      arg("dilation") = 1, arg("groups") = 1);
  F.def(
      "max_pool2d",
      [](const Tensor& x, const py::object& k, const py::object& s, const py::object& p) {
        return max_pool2d(x, pool_of(k, s, p));
      },
      arg("input"), arg("kernel_size"), arg("stride") = none, arg("padding") = 0);
  F.def(
      "max_pool2d_with_indices",
      [](const Tensor& x, const py::object& k, const py::object& s, const py::object& p) {
        auto [values, indices] = max_pool2d_with_indices(x, pool_of(k, s, p));
        return py::make_tuple(values, indices);
      },
      arg("input"), arg("kernel_size"), arg("stride") = none, arg("padding") = 0);
  F.def(
      "avg_pool2d",
      [](const Tensor& x, const py::object& k, const py::object& s, const py::object& p) {
        return avg_pool2d(x, pool_of(k, s, p));
      },
      arg("input"), arg("kernel_size"), arg("stride") = none, arg("padding") = 0);
  F.def(
      "one_hot", [](const Tensor& i, int64_t n) { return one_hot(i, n); }, arg("input"),
      arg("num_classes"));
  F.def(
      "pad",
      [](const Tensor& x, const std::vector<int64_t>& pads, Scalar value) {
        // torch's order: the last axis first, (left, right) pairs.
        if (pads.size() % 2 != 0) throw Error("pad: an even number of pad sizes, as torch's");
        std::vector<std::pair<int64_t, int64_t>> per(static_cast<size_t>(x.dim()), {0, 0});
        const size_t n = pads.size() / 2;
        if (n > per.size()) throw Error("pad: more pad pairs than the input has axes");
        for (size_t i = 0; i < n; ++i) per[per.size() - 1 - i] = {pads[2 * i], pads[2 * i + 1]};
        return pad(x, per, value);
      },
      arg("input"), arg("pad"), arg("value") = 0);
  F.def(
      "accuracy", [](const Tensor& l, const Tensor& t) { return nn::accuracy(l, t); }, arg("input"),
      arg("target"));

  // lockstep.nn.init
  py::module_ I = nnm.def_submodule("init", "Initializers, in place, as torch.nn.init.");
  I.def("uniform_", &nn::init::uniform_, arg("tensor"), arg("a") = 0.0, arg("b") = 1.0);
  I.def("normal_", &nn::init::normal_, arg("tensor"), arg("mean") = 0.0, arg("std") = 1.0);
  I.def("constant_", &nn::init::constant_, arg("tensor"), arg("val"));
  I.def("zeros_", &nn::init::zeros_, arg("tensor"));
  I.def("ones_", &nn::init::ones_, arg("tensor"));
  I.def("xavier_uniform_", &nn::init::xavier_uniform_, arg("tensor"), arg("gain") = 1.0);
  I.def("xavier_normal_", &nn::init::xavier_normal_, arg("tensor"), arg("gain") = 1.0);
  auto fan_mode = [](const std::string& mode) {
    if (mode == "fan_in") return nn::init::FanMode::FanIn;
    if (mode == "fan_out") return nn::init::FanMode::FanOut;
    throw Error("mode is 'fan_in' or 'fan_out', not '" + mode + "'");
  };
  I.def(
      "kaiming_uniform_",
      [fan_mode](const Tensor& t, double a, const std::string& mode, const std::string& nl) {
        return nn::init::kaiming_uniform_(t, a, fan_mode(mode), nl);
      },
      arg("tensor"), arg("a") = 0.0, arg("mode") = "fan_in", arg("nonlinearity") = "leaky_relu");
  I.def(
      "kaiming_normal_",
      [fan_mode](const Tensor& t, double a, const std::string& mode, const std::string& nl) {
        return nn::init::kaiming_normal_(t, a, fan_mode(mode), nl);
      },
      arg("tensor"), arg("a") = 0.0, arg("mode") = "fan_in", arg("nonlinearity") = "leaky_relu");
  I.def(
      "calculate_gain",
      [](const std::string& nl, const py::object& param) {
        return nn::init::calculate_gain(
            nl, param.is_none() ? std::numeric_limits<double>::quiet_NaN() : param.cast<double>());
      },
      arg("nonlinearity"), arg("param") = none);
  I.def("calculate_fan_in_and_fan_out", &nn::init::calculate_fan_in_and_fan_out, arg("tensor"));
  I.def("trunc_normal_", &nn::init::trunc_normal_, arg("tensor"), arg("mean") = 0.0,
        arg("std") = 1.0, arg("a") = -2.0, arg("b") = 2.0);

  // lockstep.models
  py::module_ models = m.def_submodule("models", "ResNets, the GPT, the MLP and FashionCNN.");
  py::class_<models::ResNet, Module, std::shared_ptr<models::ResNet>>(models, "ResNet");
  for (auto [name, make] : {std::pair{"resnet18", &models::resnet18},
                            {"resnet34", &models::resnet34},
                            {"resnet50", &models::resnet50}}) {
    auto f = make;
    models.def(
        name,
        [f](int64_t num_classes, bool small_stem, int64_t in_channels) {
          models::ResNetOptions o;
          o.num_classes = num_classes;
          o.stem = small_stem ? models::ResNetStem::Small : models::ResNetStem::ImageNet;
          o.in_channels = in_channels;
          return std::make_shared<models::ResNet>(f(o));
        },
        arg("num_classes") = 1000, arg("small_stem") = false, arg("in_channels") = 3);
  }
  py::class_<models::GPT, Module, std::shared_ptr<models::GPT>>(models, "GPT")
      .def(py::init([](int64_t vocab, int64_t block, int64_t d, int64_t nhead, int64_t layers,
                       int64_t ff, double dropout) {
             models::GPTOptions o;
             o.vocab_size = vocab;
             o.block_size = block;
             o.d_model = d;
             o.nhead = nhead;
             o.num_layers = layers;
             o.dim_feedforward = ff;
             o.dropout = dropout;
             return std::make_shared<models::GPT>(o);
           }),
           arg("vocab_size") = 16, arg("block_size") = 32, arg("d_model") = 64, arg("nhead") = 4,
           arg("num_layers") = 2, arg("dim_feedforward") = 256, arg("dropout") = 0.0)
      .def(
          "generate",
          [](models::GPT& g, const Tensor& prompt, int64_t n, double temperature, int64_t top_k) {
            return g.generate(prompt, n, temperature, top_k);
          },
          arg("prompt"), arg("max_new_tokens"), arg("temperature") = 1.0, arg("top_k") = 0)
      .def_property_readonly("vocab_size",
                             [](const models::GPT& g) { return g.options.vocab_size; });
  py::class_<models::MLP, Module, std::shared_ptr<models::MLP>>(models, "MLP")
      .def(py::init<const std::vector<int64_t>&>(), arg("sizes"));
  py::class_<models::FashionCNN, Module, std::shared_ptr<models::FashionCNN>>(models, "FashionCNN")
      .def(py::init<int64_t, int64_t, int64_t>(), arg("num_classes") = 10, arg("in_channels") = 1,
           arg("image_size") = 28);
  init_nn_extra(nnm, F);
}

}  // namespace lockstep::python
