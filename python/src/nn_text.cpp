// The layers of text models in lockstep.nn, with torch's keyword names and defaults: Embedding
// (padding_idx) and the Transformer family (TransformerEncoderLayer, TransformerEncoder,
// TransformerDecoderLayer, TransformerDecoder, Transformer). The rest of lockstep.nn is nn.cpp.
#include "common.h"

namespace lockstep::python {
namespace {

using nn::Module;

template <typename M>
using Layer = py::class_<M, Module, std::shared_ptr<M>>;

Tensor opt_tensor(const py::object& o) { return o.is_none() ? Tensor() : o.cast<Tensor>(); }

// torch's masks of one attention: attn_mask, key_padding_mask and the is_causal hint (None is
// false).
nn::AttentionMasks masks_of(const py::object& mask, const py::object& key_padding_mask,
                            const py::object& is_causal) {
  return {opt_tensor(mask), opt_tensor(key_padding_mask),
          !is_causal.is_none() && is_causal.cast<bool>()};
}

// activation= as torch takes it: "relu" or "gelu", or the function or module itself
// (F.relu, F.gelu, nn.ReLU(), nn.GELU()).
nn::Activation activation_of(const py::object& a) {
  if (py::isinstance<py::str>(a)) {
    const std::string s = a.cast<std::string>();
    if (s == "relu") return nn::Activation::ReLU;
    if (s == "gelu") return nn::Activation::GELU;
  } else {
    const py::module_ nnm = py::module_::import("lockstep._lockstep").attr("nn");
    const py::object f = nnm.attr("functional");
    if (a.is(f.attr("relu")) || py::isinstance(a, nnm.attr("ReLU"))) return nn::Activation::ReLU;
    if (a.is(f.attr("gelu"))) return nn::Activation::GELU;
    if (py::isinstance(a, nnm.attr("GELU")) &&
        a.cast<const nn::GELU&>().approximate == nn::GeluApproximation::None)
      return nn::Activation::GELU;
  }
  throw Error("activation is 'relu' or 'gelu' (or lockstep.nn.functional.relu / gelu), not " +
              py::repr(a).cast<std::string>());
}

nn::TransformerEncoderLayerOptions layer_options(int64_t d_model, int64_t nhead, int64_t ff,
                                                 double dropout, const py::object& activation,
                                                 double eps, bool batch_first, bool norm_first,
                                                 bool bias) {
  nn::TransformerEncoderLayerOptions o;
  o.d_model = d_model;
  o.nhead = nhead;
  o.dim_feedforward = ff;
  o.dropout = dropout;
  o.activation = activation_of(activation);
  o.layer_norm_eps = eps;
  o.batch_first = batch_first;
  o.norm_first = norm_first;
  o.bias = bias;
  return o;
}

// A child module as an attribute (model.encoder.layers[0].self_attn), as torch's; None when
// absent.
template <typename M, typename C>
void child(Layer<M>& cls, const char* name, std::shared_ptr<C> M::*member) {
  cls.def_property_readonly(name, [member](const M& m) -> py::object {
    return m.*member ? py::cast(std::static_pointer_cast<Module>(m.*member)) : py::none();
  });
}

// The keywords torch's Embedding takes that lockstep does not implement: their defaults only.
void refuse_embedding_options(const py::object& max_norm, bool scale_grad_by_freq, bool sparse) {
  if (!max_norm.is_none())
    throw Error(
        "Embedding: max_norm is not supported; renormalize the weight explicitly "
        "(under lockstep.no_grad) if you need it");
  if (scale_grad_by_freq) throw Error("Embedding: scale_grad_by_freq=True is not supported");
  if (sparse)
    throw Error(
        "Embedding: sparse=True is not supported; gradients are dense (sparse=False "
        "trains the same with every optimizer)");
}

}  // namespace

void init_nn_text(py::module_& nnm) {
  using py::arg;
  const auto none = py::none();
  const py::object relu = py::str("relu");

  auto emb = Layer<nn::Embedding>(nnm, "Embedding");
  emb.def(py::init([](int64_t num, int64_t dim, const py::object& padding_idx,
                      const py::object& max_norm, double, bool scale_grad_by_freq, bool sparse) {
            refuse_embedding_options(max_norm, scale_grad_by_freq, sparse);
            std::optional<int64_t> pad;
            if (!padding_idx.is_none()) pad = padding_idx.cast<int64_t>();
            return std::make_shared<nn::Embedding>(num, dim, pad);
          }),
          arg("num_embeddings"), arg("embedding_dim"), arg("padding_idx") = none,
          arg("max_norm") = none, arg("norm_type") = 2.0, arg("scale_grad_by_freq") = false,
          arg("sparse") = false)
      .def_property(
          "weight", [](const nn::Embedding& e) { return e.weight; },
          [](nn::Embedding& e, const Tensor& t) { e.set_parameter("weight", t); })
      .def_property_readonly("padding_idx",
                             [](const nn::Embedding& e) -> py::object {
                               return e.padding_idx ? py::cast(*e.padding_idx) : py::none();
                             })
      .def_property_readonly("num_embeddings",
                             [](const nn::Embedding& e) { return e.weight.size(0); })
      .def_property_readonly("embedding_dim",
                             [](const nn::Embedding& e) { return e.weight.size(1); });

  auto enc_layer = Layer<nn::TransformerEncoderLayer>(nnm, "TransformerEncoderLayer");
  enc_layer
      .def(py::init([](int64_t d_model, int64_t nhead, int64_t ff, double dropout,
                       const py::object& activation, double eps, bool batch_first, bool norm_first,
                       bool bias) {
             return std::make_shared<nn::TransformerEncoderLayer>(layer_options(
                 d_model, nhead, ff, dropout, activation, eps, batch_first, norm_first, bias));
           }),
           arg("d_model"), arg("nhead"), arg("dim_feedforward") = 2048, arg("dropout") = 0.1,
           arg("activation") = relu, arg("layer_norm_eps") = 1e-5, arg("batch_first") = false,
           arg("norm_first") = false, arg("bias") = true)
      .def(
          "forward",
          [](nn::TransformerEncoderLayer& l, const Tensor& src, const py::object& src_mask,
             const py::object& key_padding_mask, const py::object& is_causal) {
            return l.forward(src, masks_of(src_mask, key_padding_mask, is_causal));
          },
          arg("src"), arg("src_mask") = none, arg("src_key_padding_mask") = none,
          arg("is_causal") = false);
  child(enc_layer, "self_attn", &nn::TransformerEncoderLayer::self_attn);
  child(enc_layer, "linear1", &nn::TransformerEncoderLayer::linear1);
  child(enc_layer, "linear2", &nn::TransformerEncoderLayer::linear2);
  child(enc_layer, "norm1", &nn::TransformerEncoderLayer::norm1);
  child(enc_layer, "norm2", &nn::TransformerEncoderLayer::norm2);

  // A Python norm module is kept alive with the stack that calls it (keep_alive).
  auto encoder = Layer<nn::TransformerEncoder>(nnm, "TransformerEncoder");
  encoder
      .def(py::init([](const nn::TransformerEncoderLayer& layer, int64_t num_layers,
                       const py::object& norm, bool, bool) {
             return std::make_shared<nn::TransformerEncoder>(
                 layer, num_layers,
                 norm.is_none() ? nullptr : norm.cast<std::shared_ptr<Module>>());
           }),
           arg("encoder_layer"), arg("num_layers"), arg("norm") = none,
           arg("enable_nested_tensor") = true, arg("mask_check") = true, py::keep_alive<1, 4>())
      .def(
          "forward",
          [](nn::TransformerEncoder& e, const Tensor& src, const py::object& mask,
             const py::object& key_padding_mask, const py::object& is_causal) {
            return e.forward(src, masks_of(mask, key_padding_mask, is_causal));
          },
          arg("src"), arg("mask") = none, arg("src_key_padding_mask") = none,
          arg("is_causal") = none);
  child(encoder, "layers", &nn::TransformerEncoder::layers);
  child(encoder, "norm", &nn::TransformerEncoder::norm);

  auto dec_layer = Layer<nn::TransformerDecoderLayer>(nnm, "TransformerDecoderLayer");
  dec_layer
      .def(py::init([](int64_t d_model, int64_t nhead, int64_t ff, double dropout,
                       const py::object& activation, double eps, bool batch_first, bool norm_first,
                       bool bias) {
             return std::make_shared<nn::TransformerDecoderLayer>(layer_options(
                 d_model, nhead, ff, dropout, activation, eps, batch_first, norm_first, bias));
           }),
           arg("d_model"), arg("nhead"), arg("dim_feedforward") = 2048, arg("dropout") = 0.1,
           arg("activation") = relu, arg("layer_norm_eps") = 1e-5, arg("batch_first") = false,
           arg("norm_first") = false, arg("bias") = true)
      .def(
          "forward",
          [](nn::TransformerDecoderLayer& l, const Tensor& tgt, const Tensor& memory,
             const py::object& tgt_mask, const py::object& memory_mask,
             const py::object& tgt_key_padding_mask, const py::object& memory_key_padding_mask,
             const py::object& tgt_is_causal, const py::object& memory_is_causal) {
            return l.forward(tgt, memory, masks_of(tgt_mask, tgt_key_padding_mask, tgt_is_causal),
                             masks_of(memory_mask, memory_key_padding_mask, memory_is_causal));
          },
          arg("tgt"), arg("memory"), arg("tgt_mask") = none, arg("memory_mask") = none,
          arg("tgt_key_padding_mask") = none, arg("memory_key_padding_mask") = none,
          arg("tgt_is_causal") = false, arg("memory_is_causal") = false);
  child(dec_layer, "self_attn", &nn::TransformerDecoderLayer::self_attn);
  child(dec_layer, "multihead_attn", &nn::TransformerDecoderLayer::multihead_attn);
  child(dec_layer, "linear1", &nn::TransformerDecoderLayer::linear1);
  child(dec_layer, "linear2", &nn::TransformerDecoderLayer::linear2);
  child(dec_layer, "norm1", &nn::TransformerDecoderLayer::norm1);
  child(dec_layer, "norm2", &nn::TransformerDecoderLayer::norm2);
  child(dec_layer, "norm3", &nn::TransformerDecoderLayer::norm3);

  auto decoder = Layer<nn::TransformerDecoder>(nnm, "TransformerDecoder");
  decoder
      .def(py::init([](const nn::TransformerDecoderLayer& layer, int64_t num_layers,
                       const py::object& norm) {
             return std::make_shared<nn::TransformerDecoder>(
                 layer, num_layers,
                 norm.is_none() ? nullptr : norm.cast<std::shared_ptr<Module>>());
           }),
           arg("decoder_layer"), arg("num_layers"), arg("norm") = none, py::keep_alive<1, 4>())
      .def(
          "forward",
          [](nn::TransformerDecoder& d, const Tensor& tgt, const Tensor& memory,
             const py::object& tgt_mask, const py::object& memory_mask,
             const py::object& tgt_key_padding_mask, const py::object& memory_key_padding_mask,
             const py::object& tgt_is_causal, const py::object& memory_is_causal) {
            return d.forward(tgt, memory, masks_of(tgt_mask, tgt_key_padding_mask, tgt_is_causal),
                             masks_of(memory_mask, memory_key_padding_mask, memory_is_causal));
          },
          arg("tgt"), arg("memory"), arg("tgt_mask") = none, arg("memory_mask") = none,
          arg("tgt_key_padding_mask") = none, arg("memory_key_padding_mask") = none,
          arg("tgt_is_causal") = none, arg("memory_is_causal") = false);
  child(decoder, "layers", &nn::TransformerDecoder::layers);
  child(decoder, "norm", &nn::TransformerDecoder::norm);

  auto transformer = Layer<nn::Transformer>(nnm, "Transformer");
  transformer
      .def(py::init([](int64_t d_model, int64_t nhead, int64_t enc, int64_t dec, int64_t ff,
                       double dropout, const py::object& activation, double eps, bool batch_first,
                       bool norm_first, bool bias) {
             nn::TransformerOptions o;
             o.d_model = d_model;
             o.nhead = nhead;
             o.num_encoder_layers = enc;
             o.num_decoder_layers = dec;
             o.dim_feedforward = ff;
             o.dropout = dropout;
             o.activation = activation_of(activation);
             o.layer_norm_eps = eps;
             o.batch_first = batch_first;
             o.norm_first = norm_first;
             o.bias = bias;
             return std::make_shared<nn::Transformer>(o);
           }),
           arg("d_model") = 512, arg("nhead") = 8, arg("num_encoder_layers") = 6,
           arg("num_decoder_layers") = 6, arg("dim_feedforward") = 2048, arg("dropout") = 0.1,
           arg("activation") = relu, arg("layer_norm_eps") = 1e-5, arg("batch_first") = false,
           arg("norm_first") = false, arg("bias") = true)
      .def(
          "forward",
          [](nn::Transformer& t, const Tensor& src, const Tensor& tgt, const py::object& src_mask,
             const py::object& tgt_mask, const py::object& memory_mask,
             const py::object& src_key_padding_mask, const py::object& tgt_key_padding_mask,
             const py::object& memory_key_padding_mask, const py::object& src_is_causal,
             const py::object& tgt_is_causal, const py::object& memory_is_causal) {
            return t.forward(src, tgt, masks_of(src_mask, src_key_padding_mask, src_is_causal),
                             masks_of(tgt_mask, tgt_key_padding_mask, tgt_is_causal),
                             masks_of(memory_mask, memory_key_padding_mask, memory_is_causal));
          },
          arg("src"), arg("tgt"), arg("src_mask") = none, arg("tgt_mask") = none,
          arg("memory_mask") = none, arg("src_key_padding_mask") = none,
          arg("tgt_key_padding_mask") = none, arg("memory_key_padding_mask") = none,
          arg("src_is_causal") = none, arg("tgt_is_causal") = none, arg("memory_is_causal") = false)
      .def_static(
          "generate_square_subsequent_mask",
          [](int64_t sz, const py::object& device, const py::object& dtype) {
            TensorOptions o;
            if (!dtype.is_none()) o.dtype = dtype.cast<PyDType>().value;
            if (!device.is_none()) {
              o.has_device = true;
              o.device = parse_device(py::str(device).cast<std::string>());
            }
            return nn::Transformer::generate_square_subsequent_mask(sz, o);
          },
          arg("sz"), arg("device") = none, arg("dtype") = none)
      .def_property_readonly("d_model", [](const nn::Transformer& t) { return t.options.d_model; })
      .def_property_readonly("nhead", [](const nn::Transformer& t) { return t.options.nhead; })
      .def_property_readonly("batch_first",
                             [](const nn::Transformer& t) { return t.options.batch_first; });
  child(transformer, "encoder", &nn::Transformer::encoder);
  child(transformer, "decoder", &nn::Transformer::decoder);
}

}  // namespace lockstep::python
