// The Transformer stacks with PyTorch's names, defaults and arithmetic: TransformerEncoder,
// TransformerDecoderLayer, TransformerDecoder and Transformer, built on MultiheadAttention and
// TransformerEncoderLayer (attention.cpp). No fast paths of their own: every layer records the
// same matmuls, masks and norms.
#include <limits>

#include "lockstep/nn.h"
#include "util/check.h"

namespace lockstep::nn {

using util::cat;

namespace {

void check_stack(const char* what, int64_t num_layers) {
  if (num_layers <= 0) throw Error(cat(what, ": num_layers ", num_layers, " must be positive"));
}

// A fresh layer holding `layer`'s values and mode: PyTorch's copy.deepcopy of the layer.
template <typename L>
std::shared_ptr<L> copy_of(const L& layer) {
  auto copy = std::make_shared<L>(layer.options);
  copy->load_state_dict(layer.state_dict());
  copy->train(layer.is_training());
  return copy;
}

Tensor ffn(const TransformerDecoderLayerOptions& o, Linear& linear1, Dropout& dropout,
           Linear& linear2, const Tensor& x) {
  const Tensor a = linear1(x);
  return linear2(dropout(o.activation == Activation::GELU ? gelu(a) : relu(a)));
}

}  // namespace

TransformerEncoder::TransformerEncoder(const TransformerEncoderLayer& encoder_layer,
                                       int64_t num_layers, std::shared_ptr<Module> n)
    : norm(std::move(n)) {
  check_stack("TransformerEncoder", num_layers);
  layers = register_module("layers", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < num_layers; ++i) layers->push_back(copy_of(encoder_layer));
  if (norm) register_module("norm", norm);
}

Tensor TransformerEncoder::forward(const Tensor& src, const AttentionMasks& masks) {
  Tensor x = src;
  for (size_t i = 0; i < layers->size(); ++i)
    x = (*layers->at<TransformerEncoderLayer>(i))(x, masks);
  return norm ? (*norm)(x) : x;
}

TransformerDecoderLayer::TransformerDecoderLayer(const TransformerDecoderLayerOptions& o)
    : options(o) {
  if (o.d_model <= 0 || o.nhead <= 0 || o.dim_feedforward <= 0)
    throw Error(cat("TransformerDecoderLayer: d_model ", o.d_model, ", nhead ", o.nhead,
                    " and dim_feedforward ", o.dim_feedforward, " must be positive"));
  auto attention = [&] {
    return std::make_shared<MultiheadAttention>(o.d_model, o.nhead, o.dropout, o.bias,
                                                o.batch_first);
  };
  auto layer_norm = [&] {
    return std::make_shared<LayerNorm>(Shape{o.d_model}, o.layer_norm_eps, true, o.bias);
  };
  auto drop = [&] { return std::make_shared<Dropout>(o.dropout); };
  // PyTorch's order of registration, so that state_dict() lists the names as its does.
  self_attn = register_module("self_attn", attention());
  multihead_attn = register_module("multihead_attn", attention());
  linear1 =
      register_module("linear1", std::make_shared<Linear>(o.d_model, o.dim_feedforward, o.bias));
  dropout = register_module("dropout", drop());
  linear2 =
      register_module("linear2", std::make_shared<Linear>(o.dim_feedforward, o.d_model, o.bias));
  norm1 = register_module("norm1", layer_norm());
  norm2 = register_module("norm2", layer_norm());
  norm3 = register_module("norm3", layer_norm());
  dropout1 = register_module("dropout1", drop());
  dropout2 = register_module("dropout2", drop());
  dropout3 = register_module("dropout3", drop());
}

Tensor TransformerDecoderLayer::forward(const Tensor& tgt, const Tensor& memory,
                                        const AttentionMasks& tgt_masks,
                                        const AttentionMasks& memory_masks) {
  auto sa = [&](const Tensor& x) {
    return (*dropout1)((*self_attn)(x, x, x, tgt_masks, false).output);
  };
  auto mha = [&](const Tensor& x) {
    return (*dropout2)((*multihead_attn)(x, memory, memory, memory_masks, false).output);
  };
  auto ff = [&](const Tensor& x) {
    return (*dropout3)(ffn(options, *linear1, *dropout, *linear2, x));
  };
  Tensor x = tgt;
  if (options.norm_first) {
    x = add(x, sa((*norm1)(x)));
    x = add(x, mha((*norm2)(x)));
    x = add(x, ff((*norm3)(x)));
  } else {
    x = (*norm1)(add(x, sa(x)));
    x = (*norm2)(add(x, mha(x)));
    x = (*norm3)(add(x, ff(x)));
  }
  return x;
}

TransformerDecoder::TransformerDecoder(const TransformerDecoderLayer& decoder_layer,
                                       int64_t num_layers, std::shared_ptr<Module> n)
    : norm(std::move(n)) {
  check_stack("TransformerDecoder", num_layers);
  layers = register_module("layers", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < num_layers; ++i) layers->push_back(copy_of(decoder_layer));
  if (norm) register_module("norm", norm);
}

Tensor TransformerDecoder::forward(const Tensor& tgt, const Tensor& memory,
                                   const AttentionMasks& tgt_masks,
                                   const AttentionMasks& memory_masks) {
  Tensor x = tgt;
  for (size_t i = 0; i < layers->size(); ++i)
    x = (*layers->at<TransformerDecoderLayer>(i))(x, memory, tgt_masks, memory_masks);
  return norm ? (*norm)(x) : x;
}

Transformer::Transformer(const TransformerOptions& o) : options(o) {
  TransformerEncoderLayerOptions lo;
  lo.d_model = o.d_model;
  lo.nhead = o.nhead;
  lo.dim_feedforward = o.dim_feedforward;
  lo.dropout = o.dropout;
  lo.activation = o.activation;
  lo.layer_norm_eps = o.layer_norm_eps;
  lo.batch_first = o.batch_first;
  lo.norm_first = o.norm_first;
  lo.bias = o.bias;
  auto final_norm = [&] {
    return std::make_shared<LayerNorm>(Shape{o.d_model}, o.layer_norm_eps, true, o.bias);
  };
  encoder = register_module(
      "encoder", std::make_shared<TransformerEncoder>(TransformerEncoderLayer(lo),
                                                      o.num_encoder_layers, final_norm()));
  decoder = register_module(
      "decoder", std::make_shared<TransformerDecoder>(TransformerDecoderLayer(lo),
                                                      o.num_decoder_layers, final_norm()));
  for (Tensor& p : parameters())
    if (p.dim() > 1) init::xavier_uniform_(p);
}

Tensor Transformer::forward(const Tensor& src, const Tensor& tgt, const AttentionMasks& src_masks,
                            const AttentionMasks& tgt_masks, const AttentionMasks& memory_masks) {
  const int64_t n_axis = options.batch_first ? 0 : 1;
  if (src.dim() == 3 && tgt.dim() == 3 && src.size(n_axis) != tgt.size(n_axis))
    util::fail(
        Loc::current(), "Transformer",
        cat("src ", shape_str(src.shape()), " and tgt ", shape_str(tgt.shape()),
            " have different batch sizes"),
        options.batch_first ? "Pass [N, S, E] and [N, T, E]" : "Pass [S, N, E] and [T, N, E]");
  if (src.size(-1) != options.d_model || tgt.size(-1) != options.d_model)
    util::fail(Loc::current(), "Transformer",
               cat("src ", shape_str(src.shape()), " and tgt ", shape_str(tgt.shape()),
                   " must both end with d_model ", options.d_model),
               "");
  const Tensor memory = (*encoder)(src, src_masks);
  return (*decoder)(tgt, memory, tgt_masks, memory_masks);
}

Tensor Transformer::generate_square_subsequent_mask(int64_t sz, TensorOptions options, Loc loc) {
  if (sz < 0)
    util::fail(loc, "generate_square_subsequent_mask", cat("size ", sz, " is negative"), "");
  return triu(full({sz, sz}, -std::numeric_limits<double>::infinity(), options, loc), 1, loc);
}

}  // namespace lockstep::nn
