// LSTM and GRU with PyTorch's parameters, initialisation and gate formulas. In f32 (and under
// autocast) each layer and direction is one op over the whole sequence (ls::lstm_layer,
// ls::gru_layer: oneDNN's LSTM and GRU on the cpu backend); otherwise (f64 or bf16 modules, bf16
// input outside autocast) the cell is unrolled into the step's graph: the input projections of a
// whole layer are one matmul, then each time step adds the hidden projection and applies the gates
// (elementwise chains the cpu backend fuses).
#include <cmath>

#include "lockstep/autocast.h"
#include "lockstep/autograd.h"
#include "lockstep/nn.h"
#include "util/check.h"

namespace lockstep::nn {

using util::cat;

namespace {

std::string suffix(int64_t layer, bool reverse) {
  return cat("_l", layer, reverse ? "_reverse" : "");
}

}  // namespace

RNNBase::RNNBase(const RNNOptions& o, int64_t gates, const char* name) : options(o), name_(name) {
  if (o.input_size <= 0 || o.hidden_size <= 0 || o.num_layers <= 0)
    throw Error(cat(name, ": input_size ", o.input_size, ", hidden_size ", o.hidden_size,
                    " and num_layers ", o.num_layers, " must be positive"));
  if (o.dropout < 0 || o.dropout >= 1)
    throw Error(cat(name, ": dropout ", o.dropout, " is outside [0, 1)"));
  const int64_t h = o.hidden_size, dirs = o.bidirectional ? 2 : 1;
  const double bound = 1.0 / std::sqrt(static_cast<double>(h));
  // PyTorch's order: per layer, per direction, weight_ih, weight_hh, bias_ih, bias_hh.
  for (int64_t l = 0; l < o.num_layers; ++l)
    for (int64_t d = 0; d < dirs; ++d) {
      const std::string s = suffix(l, d == 1);
      const int64_t in = l == 0 ? o.input_size : h * dirs;
      auto add = [&](const std::string& n, Shape shape) {
        Tensor t = zeros(shape);
        init::uniform_(t, -bound, bound);
        weights_[n] = register_parameter(n, t);
      };
      add("weight_ih" + s, {gates * h, in});
      add("weight_hh" + s, {gates * h, h});
      if (o.bias) {
        add("bias_ih" + s, {gates * h});
        add("bias_hh" + s, {gates * h});
      }
    }
}

const Tensor& RNNBase::param(const char* kind, int64_t layer, bool reverse) const {
  static const Tensor none;
  auto it = weights_.find(kind + suffix(layer, reverse));
  return it == weights_.end() ? none : it->second;
}

std::vector<Tensor> RNNBase::project(const std::vector<Tensor>& inputs, int64_t layer,
                                     bool reverse) {
  // [T, N, in] -> [T, N, gates*H] in one matmul, then split by time.
  const Tensor x = stack(inputs, 0);
  return unbind(linear(x, param("weight_ih", layer, reverse), param("bias_ih", layer, reverse)), 0);
}

std::vector<Tensor> RNNBase::run_all(const Tensor& x, const Tensor& h0, const Tensor& c0,
                                     bool lstm) {
  const RNNOptions& o = options;
  if (!x.defined() || x.dim() != 3 || !is_floating(x.dtype()))
    throw Error(cat(name_, ": input must be a floating [", o.batch_first ? "N, T" : "T, N",
                    ", input_size] tensor, got ",
                    x.defined() ? cat(dtype_name(x.dtype()), shape_str(x.shape()))
                                : std::string("an empty handle"),
                    " (unbatched input: unsqueeze a batch axis)"));
  const Tensor seq = o.batch_first ? transpose(x, 0, 1) : x;
  const int64_t t = seq.size(0), n = seq.size(1), h = o.hidden_size, dirs = o.bidirectional ? 2 : 1;
  if (seq.size(2) != o.input_size)
    throw Error(
        cat(name_, ": input has ", seq.size(2), " features, the module expects ", o.input_size));
  if (t == 0) throw Error(cat(name_, ": the sequence is empty (length 0)"));
  const Shape state_shape = {o.num_layers * dirs, n, h};
  for (const Tensor* s : {&h0, &c0})
    if (s->defined() && s->shape() != state_shape)
      throw Error(cat(name_, ": initial state ", shape_str(s->shape()), " must be ",
                      shape_str(state_shape), " [num_layers * directions, N, hidden_size]"));
  const TensorOptions opts(seq.dtype(), seq.device());
  if (layer_op_applies(seq)) return run_layer_ops(seq, h0, c0, lstm);
  std::vector<Tensor> inputs = unbind(seq, 0), h_n, c_n;
  for (int64_t l = 0; l < o.num_layers; ++l) {
    std::vector<std::vector<Tensor>> outs;
    for (int64_t d = 0; d < dirs; ++d) {
      const int64_t k = l * dirs + d;
      const Tensor hk =
          h0.defined() ? reshape(slice(h0, 0, k, k + 1), {n, h}) : zeros({n, h}, opts);
      const Tensor ck =
          c0.defined() ? reshape(slice(c0, 0, k, k + 1), {n, h}) : zeros({n, h}, opts);
      std::vector<Tensor> r = run(inputs, l, d == 1, hk, lstm ? ck : Tensor());
      h_n.push_back(r[t]);
      if (lstm) c_n.push_back(r[t + 1]);
      r.resize(static_cast<size_t>(t));
      outs.push_back(std::move(r));
    }
    std::vector<Tensor> next;
    for (int64_t s = 0; s < t; ++s)
      next.push_back(dirs == 1 ? outs[0][s] : concat({outs[0][s], outs[1][s]}, -1));
    if (o.dropout > 0 && is_training() && l + 1 < o.num_layers)
      for (Tensor& v : next) v = nn::dropout(v, o.dropout, true);
    inputs = std::move(next);
  }
  Tensor output = stack(inputs, 0);
  if (o.batch_first) output = transpose(output, 0, 1);
  std::vector<Tensor> result{output, stack(h_n, 0)};
  if (lstm) result.push_back(stack(c_n, 0));
  return result;
}

bool RNNBase::layer_op_applies(const Tensor& seq) const {
  // Under autocast a bf16 sequence is read as f32: the layer runs in f32 (see autocast.h).
  if (seq.dtype() != DType::F32 && !(seq.dtype() == DType::BF16 && autocast_dtype())) return false;
  for (const auto& [name, w] : weights_)
    if (w.dtype() != DType::F32) return false;
  return true;
}

std::vector<Tensor> RNNBase::run_layer_ops(const Tensor& seq, const Tensor& h0, const Tensor& c0,
                                           bool lstm) {
  const RNNOptions& o = options;
  const int64_t t = seq.size(0), n = seq.size(1), h = o.hidden_size, dirs = o.bidirectional ? 2 : 1;
  const TensorOptions opts(DType::F32, seq.device());
  auto f32 = [](const Tensor& t) { return t.dtype() == DType::F32 ? t : cast(t, DType::F32); };
  Tensor input = f32(seq);
  std::vector<Tensor> h_n, c_n;
  for (int64_t l = 0; l < o.num_layers; ++l) {
    std::vector<Tensor> outs;
    for (int64_t d = 0; d < dirs; ++d) {
      const int64_t k = l * dirs + d;
      auto state = [&](const Tensor& s) {
        return s.defined() ? f32(reshape(slice(s, 0, k, k + 1), {n, h})) : zeros({n, h}, opts);
      };
      const bool reverse = d == 1;
      const Tensor &b_ih = param("bias_ih", l, reverse), &b_hh = param("bias_hh", l, reverse);
      const Tensor &w_ih = param("weight_ih", l, reverse), &w_hh = param("weight_hh", l, reverse);
      Tensor all;
      if (lstm) {
        const Tensor bias = b_ih.defined() ? b_ih + b_hh : zeros({4 * h}, opts);
        all = lstm_layer(input, state(h0), state(c0), w_ih, w_hh, bias, reverse);
        c_n.push_back(slice(all, 0, t + 1, t + 2));
      } else {  // the r and z gates' biases summed, the n gate's apart (r multiplies b_hn)
        const Tensor bias =
            b_ih.defined() ? concat({slice(b_ih, 0, 0, 2 * h) + slice(b_hh, 0, 0, 2 * h),
                                     slice(b_ih, 0, 2 * h, 3 * h), slice(b_hh, 0, 2 * h, 3 * h)},
                                    0)
                           : zeros({4 * h}, opts);
        all = gru_layer(input, state(h0), w_ih, w_hh, bias, reverse);
      }
      outs.push_back(slice(all, 0, 0, t));
      h_n.push_back(slice(all, 0, t, t + 1));
    }
    input = dirs == 1 ? outs[0] : concat(outs, -1);
    if (o.dropout > 0 && is_training() && l + 1 < o.num_layers)
      input = nn::dropout(input, o.dropout, true);
  }
  if (o.batch_first) input = transpose(input, 0, 1);
  std::vector<Tensor> result{input, concat(h_n, 0)};
  if (lstm) result.push_back(concat(c_n, 0));
  return result;
}

LSTM::LSTM(const RNNOptions& options) : RNNBase(options, 4, "LSTM") {}

LSTM::Output LSTM::forward(const Tensor& x, const Tensor& h0, const Tensor& c0) {
  std::vector<Tensor> r = run_all(x, h0, c0, true);
  return {r[0], r[1], r[2]};
}

std::vector<Tensor> LSTM::run(const std::vector<Tensor>& inputs, int64_t layer, bool reverse,
                              const Tensor& h0, const Tensor& c0) {
  const std::vector<Tensor> xs = project(inputs, layer, reverse);
  const Tensor& w_hh = param("weight_hh", layer, reverse);
  const Tensor& b_hh = param("bias_hh", layer, reverse);
  const int64_t t = static_cast<int64_t>(xs.size());
  std::vector<Tensor> out(static_cast<size_t>(t));
  Tensor h = h0, c = c0;
  for (int64_t k = 0; k < t; ++k) {
    const int64_t s = reverse ? t - 1 - k : k;
    const std::vector<Tensor> g = chunk(xs[s] + linear(h, w_hh, b_hh), 4, -1);
    const Tensor i = sigmoid(g[0]), f = sigmoid(g[1]), cand = tanh(g[2]), o = sigmoid(g[3]);
    c = f * c + i * cand;
    h = o * tanh(c);
    out[s] = h;
  }
  out.push_back(h);
  out.push_back(c);
  return out;
}

GRU::GRU(const RNNOptions& options) : RNNBase(options, 3, "GRU") {}

GRU::Output GRU::forward(const Tensor& x, const Tensor& h0) {
  std::vector<Tensor> r = run_all(x, h0, Tensor(), false);
  return {r[0], r[1]};
}

std::vector<Tensor> GRU::run(const std::vector<Tensor>& inputs, int64_t layer, bool reverse,
                             const Tensor& h0, const Tensor&) {
  const std::vector<Tensor> xs = project(inputs, layer, reverse);
  const Tensor& w_hh = param("weight_hh", layer, reverse);
  const Tensor& b_hh = param("bias_hh", layer, reverse);
  const int64_t t = static_cast<int64_t>(xs.size());
  std::vector<Tensor> out(static_cast<size_t>(t));
  Tensor h = h0;
  for (int64_t k = 0; k < t; ++k) {
    const int64_t s = reverse ? t - 1 - k : k;
    const std::vector<Tensor> gi = chunk(xs[s], 3, -1);
    const std::vector<Tensor> gh = chunk(linear(h, w_hh, b_hh), 3, -1);
    const Tensor r = sigmoid(gi[0] + gh[0]), z = sigmoid(gi[1] + gh[1]);
    const Tensor cand = tanh(gi[2] + r * gh[2]);
    h = (1.0 - z) * cand + z * h;
    out[s] = h;
  }
  out.push_back(h);
  return out;
}

}  // namespace lockstep::nn
