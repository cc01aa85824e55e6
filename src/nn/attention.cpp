// Attention: scaled dot-product attention, MultiheadAttention and TransformerEncoderLayer with
// PyTorch's parameter names, initialisation, mask conventions and arithmetic (so state dicts load
// both ways and losses match). Written from matmuls, a where for masks and the softmax
// composite, which the cpu backend fuses like any other elementwise and reduction chain.
#include <cmath>
#include <limits>

#include "lockstep/autograd.h"
#include "lockstep/nn.h"
#include "util/check.h"

namespace lockstep::nn {

using util::cat;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Query i may see key j when j <= i (keys past the queries' length all masked out).
Tensor causal_allowed(int64_t l, int64_t s, Device device, const Loc& loc) {
  return tril(ones({l, s}, TensorOptions(DType::Bool, device), loc), 0, loc);
}

void check_defined(const Tensor& t, const char* op, const char* what, const Loc& loc) {
  if (!t.defined())
    util::fail(loc, op, cat(what, " is an empty tensor handle"), "Pass a defined tensor");
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& attn_mask, double dropout_p, bool is_causal,
                                    double scale, Loc loc) {
  const char* op = "scaled_dot_product_attention";
  check_defined(q, op, "query", loc);
  check_defined(k, op, "key", loc);
  check_defined(v, op, "value", loc);
  if (q.dim() < 2 || k.dim() < 2 || v.dim() < 2)
    util::fail(loc, op,
               cat("query ", shape_str(q.shape()), ", key ", shape_str(k.shape()), " and value ",
                   shape_str(v.shape()), " need rank >= 2"),
               "Pass [..., L, E], [..., S, E] and [..., S, Ev]");
  if (q.size(-1) != k.size(-1) || k.size(-2) != v.size(-2))
    util::fail(loc, op,
               cat("query ", shape_str(q.shape()), ", key ", shape_str(k.shape()), " and value ",
                   shape_str(v.shape()), " do not fit"),
               "query and key need the same last size E, key and value the same length S");
  if (is_causal && attn_mask.defined())
    util::fail(loc, op, "both attn_mask and is_causal are given",
               "Fold the causal mask into attn_mask, or pass only is_causal");
  if (dropout_p < 0 || dropout_p >= 1)
    util::fail(loc, op, cat("dropout_p = ", dropout_p, " is outside [0, 1)"), "Use 0 <= p < 1");
  const double sc = scale != 0 ? scale : 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  Tensor scores = mul(matmul(q, transpose(k, -2, -1, loc), loc), sc, loc);
  const int64_t l = q.size(-2), s = k.size(-2);
  if (is_causal) scores = where(causal_allowed(l, s, q.device(), loc), scores, -kInf, loc);
  if (attn_mask.defined()) {
    if (attn_mask.dtype() == DType::Bool)
      scores = where(attn_mask, scores, -kInf, loc);
    else
      scores = add(scores, attn_mask, loc);
  }
  Tensor w = softmax(scores, -1, loc);
  if (dropout_p > 0) w = dropout(w, dropout_p, true, loc);
  return matmul(w, v, loc);
}

MultiheadAttention::MultiheadAttention(int64_t e, int64_t h, double p, bool bias, bool bf)
    : embed_dim(e), num_heads(h), dropout(p), batch_first(bf) {
  if (e <= 0 || h <= 0 || e % h != 0)
    throw Error(cat("MultiheadAttention: embed_dim ", e, " must be positive and divisible by ",
                    "num_heads ", h));
  if (p < 0 || p >= 1) throw Error(cat("MultiheadAttention: dropout ", p, " is outside [0, 1)"));
  in_proj_weight = register_parameter("in_proj_weight", zeros({3 * e, e}));
  init::xavier_uniform_(in_proj_weight);
  if (bias) in_proj_bias = register_parameter("in_proj_bias", zeros({3 * e}));
  out_proj = register_module("out_proj", std::make_shared<Linear>(e, e, bias));
  if (bias) init::zeros_(out_proj->bias);
}

Tensor MultiheadAttention::forward(const Tensor& x) {
  return forward(x, x, x, AttentionMasks{}, false).output;
}

MultiheadAttention::Output MultiheadAttention::forward(const Tensor& query, const Tensor& key,
                                                       const Tensor& value,
                                                       const AttentionMasks& masks,
                                                       bool need_weights,
                                                       bool average_attn_weights) {
  const Loc loc = Loc::current();
  const char* op = "MultiheadAttention";
  check_defined(query, op, "query", loc);
  check_defined(key, op, "key", loc);
  check_defined(value, op, "value", loc);
  if (query.dim() != 3 || key.dim() != 3 || value.dim() != 3)
    throw Error(cat("MultiheadAttention: query ", shape_str(query.shape()), ", key ",
                    shape_str(key.shape()), " and value ", shape_str(value.shape()),
                    " must be 3-d: ", batch_first ? "[N, L, E]" : "[L, N, E]",
                    " (unbatched inputs: unsqueeze a batch axis)"));
  // PyTorch's arithmetic, each head's products over [N, H, T, hd] views of the projections in
  // the inputs' own layout: batch-first rows [N, T, H, hd] keep the batch dims outermost, which
  // lets oneDNN run the heads' products on its brgemm kernels without a copy (PyTorch's
  // [N * H, T, hd] heads over a sequence-first [T, N, E] interleave the batch with the rows).
  const int64_t t_axis = batch_first ? 1 : 0, n_axis = 1 - t_axis;
  const int64_t l = query.size(t_axis), n = query.size(n_axis), e = embed_dim, h = num_heads,
                hd = e / h;
  const int64_t s = key.size(t_axis);
  if (query.size(2) != e || key.size(2) != e || value.size(2) != e || key.size(n_axis) != n ||
      value.size(n_axis) != n || value.size(t_axis) != s)
    throw Error(cat("MultiheadAttention(embed_dim ", e, "): query ", shape_str(query.shape()),
                    ", key ", shape_str(key.shape()), " and value ", shape_str(value.shape()),
                    " do not fit; each needs the batch size and embed_dim, key and value one "
                    "length"));
  const std::vector<Tensor> w = chunk(in_proj_weight, 3, 0);
  const std::vector<Tensor> b =
      in_proj_bias.defined() ? chunk(in_proj_bias, 3, 0) : std::vector<Tensor>(3);
  // [N, T, E] or [T, N, E] -> [N, H, T, hd]
  auto heads = [&](const Tensor& x, int64_t t) {
    return batch_first ? permute(reshape(x, {n, t, h, hd}), {0, 2, 1, 3})
                       : permute(reshape(x, {t, n, h, hd}), {1, 2, 0, 3});
  };
  const Tensor q = heads(linear(query, w[0], b[0]), l);
  const Tensor k = heads(linear(key, w[1], b[1]), s);
  const Tensor v = heads(linear(value, w[2], b[2]), s);

  // One float mask of 0 and -inf, [N or 1, H or 1, L or 1, S] against the scores [N, H, L, S]
  // (PyTorch merges them the same way, over [N * H, L, S]).
  Tensor mask;
  auto merge = [&](const Tensor& m) { mask = mask.defined() ? add(mask, m) : m; };
  if (masks.attn_mask.defined()) {
    const Tensor& am = masks.attn_mask;
    const bool ok2 = am.dim() == 2 && am.size(0) == l && am.size(1) == s;
    const bool ok3 = am.dim() == 3 && am.size(0) == n * h && am.size(1) == l && am.size(2) == s;
    if (!ok2 && !ok3)
      throw Error(cat("MultiheadAttention: attn_mask ", shape_str(am.shape()), " must be [", l,
                      ", ", s, "] or [", n * h, ", ", l, ", ", s, "]"));
    const Tensor f = am.dtype() == DType::Bool ? where(am, -kInf, 0.0) : am;
    merge(ok2 ? reshape(f, {1, 1, l, s}) : reshape(f, {n, h, l, s}));
  }
  if (masks.is_causal)
    merge(reshape(where(causal_allowed(l, s, q.device(), loc), 0.0, -kInf), {1, 1, l, s}));
  if (masks.key_padding_mask.defined()) {
    const Tensor& kp = masks.key_padding_mask;
    if (kp.dim() != 2 || kp.size(0) != n || kp.size(1) != s)
      throw Error(cat("MultiheadAttention: key_padding_mask ", shape_str(kp.shape()), " must be [",
                      n, ", ", s, "]"));
    const Tensor f = kp.dtype() == DType::Bool ? where(kp, -kInf, 0.0) : kp;
    merge(reshape(f, {n, 1, 1, s}));
  }

  const Tensor qs = div(q, std::sqrt(static_cast<double>(hd)));
  Tensor scores = matmul(qs, transpose(k, -2, -1));  // [N, H, L, S]
  if (mask.defined()) scores = add(scores, mask);
  Tensor attn = softmax(scores, -1);
  if (dropout > 0 && is_training()) attn = nn::dropout(attn, dropout, true);
  Tensor out = matmul(attn, v);  // [N, H, L, hd] -> the input's layout, heads side by side
  out = batch_first ? reshape(permute(out, {0, 2, 1, 3}), {n * l, e})
                    : reshape(permute(out, {2, 0, 1, 3}), {l * n, e});
  out = (*out_proj)(out);
  out = batch_first ? reshape(out, {n, l, e}) : reshape(out, {l, n, e});
  Output result{out, Tensor()};
  if (need_weights) {
    const Tensor& weights = attn;  // [N, H, L, S]
    result.weights = average_attn_weights ? mean(weights, {1}) : weights;
  }
  return result;
}

TransformerEncoderLayer::TransformerEncoderLayer(const TransformerEncoderLayerOptions& o)
    : options(o) {
  if (o.d_model <= 0 || o.nhead <= 0 || o.dim_feedforward <= 0)
    throw Error(cat("TransformerEncoderLayer: d_model ", o.d_model, ", nhead ", o.nhead,
                    " and dim_feedforward ", o.dim_feedforward, " must be positive"));
  self_attn = register_module(
      "self_attn",
      std::make_shared<MultiheadAttention>(o.d_model, o.nhead, o.dropout, o.bias, o.batch_first));
  linear1 =
      register_module("linear1", std::make_shared<Linear>(o.d_model, o.dim_feedforward, o.bias));
  dropout = register_module("dropout", std::make_shared<Dropout>(o.dropout));
  linear2 =
      register_module("linear2", std::make_shared<Linear>(o.dim_feedforward, o.d_model, o.bias));
  auto norm = [&] {
    return std::make_shared<LayerNorm>(Shape{o.d_model}, o.layer_norm_eps, true, o.bias);
  };
  norm1 = register_module("norm1", norm());
  norm2 = register_module("norm2", norm());
  dropout1 = register_module("dropout1", std::make_shared<Dropout>(o.dropout));
  dropout2 = register_module("dropout2", std::make_shared<Dropout>(o.dropout));
}

Tensor TransformerEncoderLayer::forward(const Tensor& src, const AttentionMasks& masks) {
  auto sa = [&](const Tensor& x) {
    return (*dropout1)((*self_attn)(x, x, x, masks, false).output);
  };
  auto ff = [&](const Tensor& x) {
    const Tensor a = (*linear1)(x);
    const Tensor act = options.activation == Activation::GELU ? gelu(a) : relu(a);
    return (*dropout2)((*linear2)((*dropout)(act)));
  };
  Tensor x = src;
  if (options.norm_first) {
    x = add(x, sa((*norm1)(x)));
    x = add(x, ff((*norm2)(x)));
  } else {
    x = (*norm1)(add(x, sa(x)));
    x = (*norm2)(add(x, ff(x)));
  }
  return x;
}

Tensor* MultiheadAttention::tensor_member(const std::string& name) {
  return name == "in_proj_weight" ? &in_proj_weight
         : name == "in_proj_bias" ? &in_proj_bias
                                  : nullptr;
}

}  // namespace lockstep::nn
