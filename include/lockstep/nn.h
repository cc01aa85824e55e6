// Neural-network building blocks: the Module base (parameters, buffers, train/eval, state
// dicts), layers with PyTorch's default initialisation and parameter names, functional ops
// and losses. All of it records: a module call adds to the step's graph.
#pragma once

#include <array>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/error.h"
#include "lockstep/ops.h"
#include "lockstep/tensor.h"

namespace lockstep::nn {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module {
 public:
  virtual ~Module() = default;
  // The module applied to one input. Modules without a single-input forward throw Error.
  virtual Tensor forward(const Tensor& x);
  // Calls forward with the call's line and this module's path ("layer3.1.conv2") on record, so
  // that errors and cache-miss explanations of what it records name the caller's line and the
  // module rather than a line inside lockstep.
  Tensor operator()(const Tensor& x, Loc loc = Loc::current());
  // Runs `body` as a call of this module (its path and the caller's line on record, as
  // operator() does) and returns what it returns. A module whose forward takes several inputs
  // (a mask, a state) offers its own call operator with it, keeping the one-input one:
  //   using Module::operator();
  //   Tensor operator()(const Tensor& x, const Tensor& mask, Loc loc = Loc::current()) {
  //     return call(loc, [&] { return forward(x, mask); });
  //   }
  template <typename F>
  auto call(Loc loc, F&& body) -> decltype(body()) {
    std::optional<decltype(body())> out;
    call_impl(loc, [&] { out.emplace(body()); });
    return std::move(*out);
  }

  // Parameters (trainable) and buffers (running statistics) of this module and its children,
  // named as PyTorch names them ("layer1.0.conv1.weight"). A tensor shared by several modules
  // is listed once, under its first name (state_dict() lists it under each, as PyTorch's).
  std::vector<Tensor> parameters() const;
  NamedTensors named_parameters() const;
  std::vector<Tensor> buffers() const;
  NamedTensors named_buffers() const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const {
    return children_;
  }
  // This module ("") and every module below it, depth first, named by path ("layers.0.attn"),
  // each once (as PyTorch's named_modules()).
  std::vector<std::pair<std::string, Module*>> named_modules();
  // Calls fn on every child's modules, then on this one (PyTorch's Module.apply), e.g. to
  // re-initialize every Linear: m.apply([](nn::Module& x) { if (auto* l = dynamic_cast<...>) }).
  void apply(const std::function<void(Module&)>& fn);

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Moves every parameter and buffer to `device`, in place (handles to them stay valid).
  void to(Device device);

  // Parameters and buffers by name. load_state_dict copies values into the existing tensors;
  // with `strict`, missing and unexpected names are an Error listing them. Shapes and dtypes
  // must match. Nothing is changed unless everything matches.
  NamedTensors state_dict() const;
  void load_state_dict(const NamedTensors& state, bool strict = true);
  // Makes `t` the parameter (or buffer) registered under `path` ("out.weight" reaches into the
  // child "out") in place of the one there: the layer computes with it, and parameters(),
  // optimizers made afterwards and state_dict() see it. Weight tying, as PyTorch's
  // `model.out.weight = model.tok.weight`: model.set_parameter("out.weight", tok->weight); the
  // shared tensor is then one parameter (listed once, updated once, saved under both names).
  // An Error names the registered names when `path` is not one.
  void set_parameter(const std::string& path, Tensor t);
  void set_buffer(const std::string& path, Tensor t);
  // The checks of load_state_dict alone: throws the same Error, changes nothing.
  void check_state_dict(const NamedTensors& state, bool strict = true) const;

 protected:
  // Registers and returns `t` (made to require grad); a name registered already is replaced.
  Tensor register_parameter(const std::string& name, Tensor t);
  Tensor register_buffer(const std::string& name, Tensor t);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    add_child(name, m);
    return m;
  }

  // The member a layer computes with for its parameter or buffer `name` (null: none), which
  // set_parameter and set_buffer replace too.
  virtual Tensor* tensor_member(const std::string& name) {
    (void)name;
    return nullptr;
  }

 private:
  void set_tensor(const std::string& path, Tensor t, bool param);
  void call_impl(const Loc& loc, const std::function<void()>& body);
  void add_child(const std::string& name, std::shared_ptr<Module> m);
  void collect(const std::string& prefix, bool params, NamedTensors* out) const;
  NamedTensors params_;
  NamedTensors buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;  // weight [out, in]

 protected:
  Tensor* tensor_member(const std::string& name) override;
};

struct Conv2dSpec {
  int64_t in_channels = 0, out_channels = 0;
  std::array<int64_t, 2> kernel{3, 3};
  std::array<int64_t, 2> stride{1, 1};
  std::array<int64_t, 2> padding{0, 0};
  std::array<int64_t, 2> dilation{1, 1};
  int64_t groups = 1;
  bool bias = true;
};

class Conv2d : public Module {
 public:
  explicit Conv2d(const Conv2dSpec& spec);
  Tensor forward(const Tensor& x) override;
  Conv2dSpec spec;
  Tensor weight, bias;  // weight [out, in / groups, kh, kw]

 protected:
  Tensor* tensor_member(const std::string& name) override;
};

struct ConvTranspose2dSpec {
  int64_t in_channels = 0, out_channels = 0;
  std::array<int64_t, 2> kernel{3, 3};
  std::array<int64_t, 2> stride{1, 1};
  std::array<int64_t, 2> padding{0, 0};
  std::array<int64_t, 2> output_padding{0, 0};
  int64_t groups = 1;
  bool bias = true;
  std::array<int64_t, 2> dilation{1, 1};
};

// torch.nn.ConvTranspose2d, its initialisation and parameter names.
class ConvTranspose2d : public Module {
 public:
  explicit ConvTranspose2d(const ConvTranspose2dSpec& spec);
  Tensor forward(const Tensor& x) override;
  // output_size: the output's [H, W] (or [N, C, H, W]), which picks the output padding in place
  // of spec.output_padding, as PyTorch's forward(input, output_size).
  Tensor forward(const Tensor& x, const std::vector<int64_t>& output_size);
  using Module::operator();
  Tensor operator()(const Tensor& x, const std::vector<int64_t>& output_size,
                    Loc loc = Loc::current()) {
    return call(loc, [&] { return forward(x, output_size); });
  }
  ConvTranspose2dSpec spec;
  Tensor weight, bias;  // weight [in, out / groups, kh, kw]

 protected:
  Tensor* tensor_member(const std::string& name) override;
};

// Batch normalization over [N, C] (1d) or [N, C, H, W] (2d). In training, normalizes with the
// batch statistics and updates the running ones inside the step's graph; in eval, uses them.
class BatchNorm : public Module {
 public:
  BatchNorm(int64_t num_features, double eps = 1e-5, double momentum = 0.1, bool affine = true);
  Tensor forward(const Tensor& x) override;
  int64_t num_features;
  double eps, momentum;
  Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 protected:
  Tensor* tensor_member(const std::string& name) override;
};
using BatchNorm1d = BatchNorm;
using BatchNorm2d = BatchNorm;

// With `affine`, a weight (ones) and, unless `bias` is false, a bias (zeros), as PyTorch's.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool affine = true,
                     bool bias = true);
  Tensor forward(const Tensor& x) override;
  Shape normalized_shape;
  double eps;
  Tensor weight, bias;

 protected:
  Tensor* tensor_member(const std::string& name) override;
};

// Rows of `weight` [num_embeddings, embedding_dim] (N(0, 1)) by index. With padding_idx
// (negative counts from the end), that row starts as zeros and gets no gradient, so optimizer
// steps leave it as it is (PyTorch's padding_idx); its value is still what a lookup returns.
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim,
            std::optional<int64_t> padding_idx = std::nullopt);
  Tensor forward(const Tensor& indices) override;  // i64 indices of any shape
  Tensor weight;
  std::optional<int64_t> padding_idx;  // in [0, num_embeddings) when given

 protected:
  Tensor* tensor_member(const std::string& name) override;
};

// Zeroes elements with probability p in training (scaling the rest by 1/(1-p)), with a mask
// from the step's random generator: no recompiles.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x) override;
  double p;
};

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};
enum class GeluApproximation { None, Tanh };
class GELU : public Module {
 public:
  explicit GELU(GeluApproximation approximate = GeluApproximation::None)
      : approximate(approximate) {}
  Tensor forward(const Tensor& x) override;
  GeluApproximation approximate;
};
// The activations below as modules, with PyTorch's defaults.
class LeakyReLU : public Module {
 public:
  explicit LeakyReLU(double negative_slope = 0.01) : negative_slope(negative_slope) {}
  Tensor forward(const Tensor& x) override;
  double negative_slope;
};
class ELU : public Module {
 public:
  explicit ELU(double alpha = 1.0) : alpha(alpha) {}
  Tensor forward(const Tensor& x) override;
  double alpha;
};
class Softplus : public Module {
 public:
  explicit Softplus(double beta = 1.0, double threshold = 20.0)
      : beta(beta), threshold(threshold) {}
  Tensor forward(const Tensor& x) override;
  double beta, threshold;
};
class SiLU : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};
class Hardswish : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};
class Mish : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};
class LogSigmoid : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};
// Returns its input (a placeholder where a layer is optional).
class Identity : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};
class Sigmoid : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};
class Tanh : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};
class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_axis = 1, int64_t end_axis = -1);
  Tensor forward(const Tensor& x) override;
  int64_t start_axis, end_axis;
};
class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(Pool2dOptions options);
  Tensor forward(const Tensor& x) override;
  Pool2dOptions options;
};
class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(Pool2dOptions options);
  Tensor forward(const Tensor& x) override;
  Pool2dOptions options;
};
class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(std::array<int64_t, 2> output_size);
  Tensor forward(const Tensor& x) override;
  std::array<int64_t, 2> output_size;
};

// torch.nn.functional.interpolate's arguments, for [N, C, H, W] inputs. One of size (1 or 2
// values: [H, W]) and scale_factor (1 or 2). mode: "nearest", "nearest-exact", "bilinear" or
// "bicubic"; align_corners only for bilinear and bicubic (unset: false).
struct InterpolateOptions {
  std::vector<int64_t> size;
  std::vector<double> scale_factor;
  std::string mode = "nearest";
  std::optional<bool> align_corners;
  std::optional<bool> recompute_scale_factor;
};
// torch.nn.Upsample (UpsamplingNearest2d: mode "nearest"; UpsamplingBilinear2d: "bilinear" with
// align_corners true).
class Upsample : public Module {
 public:
  explicit Upsample(const InterpolateOptions& options);
  Tensor forward(const Tensor& x) override;
  InterpolateOptions options;
};

// Children named "0", "1", ... as torch.nn.Sequential.
class Sequential : public Module {
 public:
  Sequential() = default;
  Sequential& add(std::shared_ptr<Module> m);
  template <typename M, typename... Args>
  Sequential& emplace(Args&&... args) {
    return add(std::make_shared<M>(std::forward<Args>(args)...));
  }
  Tensor forward(const Tensor& x) override;
  size_t size() const { return layers_.size(); }
  std::shared_ptr<Module> operator[](size_t i) const { return layers_.at(i); }

 private:
  std::vector<std::shared_ptr<Module>> layers_;
};

// Children named "0", "1", ... held in order, with no forward of its own (torch.nn.ModuleList):
// call them as the model's forward needs.
class ModuleList : public Module {
 public:
  ModuleList() = default;
  ModuleList& push_back(std::shared_ptr<Module> m);
  template <typename M, typename... Args>
  ModuleList& emplace_back(Args&&... args) {
    return push_back(std::make_shared<M>(std::forward<Args>(args)...));
  }
  size_t size() const { return modules_.size(); }
  std::shared_ptr<Module> operator[](size_t i) const;
  // The i-th module as its own type (an Error if it is not one).
  template <typename M>
  std::shared_ptr<M> at(size_t i) const {
    auto m = std::dynamic_pointer_cast<M>((*this)[i]);
    if (!m) throw Error("ModuleList::at: module " + std::to_string(i) + " is not of that type");
    return m;
  }
  auto begin() const { return modules_.begin(); }
  auto end() const { return modules_.end(); }

 private:
  std::vector<std::shared_ptr<Module>> modules_;
};

// Children by name, in insertion order (torch.nn.ModuleDict). Names must be non-empty and
// contain no '.'.
class ModuleDict : public Module {
 public:
  ModuleDict() = default;
  ModuleDict& insert(const std::string& name, std::shared_ptr<Module> m);
  bool contains(const std::string& name) const;
  std::shared_ptr<Module> operator[](const std::string& name) const;
  std::vector<std::string> keys() const;
  size_t size() const { return order_.size(); }

 private:
  std::vector<std::string> order_;
  std::map<std::string, std::shared_ptr<Module>> modules_;
};

// ---- attention ------------------------------------------------------------------------------
// What MultiheadAttention and TransformerEncoderLayer take besides their inputs, as PyTorch's.
struct AttentionMasks {
  // [L, S] or [N * num_heads, L, S]: bool, true where attending is NOT allowed (PyTorch's MHA
  // convention), or float, added to the scores.
  Tensor attn_mask;
  // [N, S] bool, true at padding keys to ignore.
  Tensor key_padding_mask;
  // A causal mask (query i sees keys <= i) on top of attn_mask.
  bool is_causal = false;
};

// Attention with PyTorch's parameters and names: in_proj_weight [3E, E] (xavier uniform),
// in_proj_bias [3E] (zeros), out_proj (Linear E -> E, bias zeros). Inputs are [L, N, E], or
// [N, L, E] with batch_first. Dropout applies to the attention weights in training.
class MultiheadAttention : public Module {
 public:
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, double dropout = 0.0, bool bias = true,
                     bool batch_first = false);
  struct Output {
    Tensor output;   // [L, N, E] (or [N, L, E])
    Tensor weights;  // [N, L, S] averaged over heads, or [N, H, L, S]; empty unless asked
  };
  Output forward(const Tensor& query, const Tensor& key, const Tensor& value,
                 const AttentionMasks& masks = {}, bool need_weights = true,
                 bool average_attn_weights = true);
  // Self-attention of x without masks: the output alone.
  Tensor forward(const Tensor& x) override;
  using Module::operator();
  Output operator()(const Tensor& query, const Tensor& key, const Tensor& value,
                    const AttentionMasks& masks = {}, bool need_weights = true,
                    Loc loc = Loc::current()) {
    return call(loc, [&] { return forward(query, key, value, masks, need_weights); });
  }
  int64_t embed_dim, num_heads;
  double dropout;
  bool batch_first;
  Tensor in_proj_weight, in_proj_bias;
  std::shared_ptr<Linear> out_proj;

 protected:
  Tensor* tensor_member(const std::string& name) override;
};

enum class Activation { ReLU, GELU };

struct TransformerEncoderLayerOptions {
  int64_t d_model = 0, nhead = 0;
  int64_t dim_feedforward = 2048;
  double dropout = 0.1;
  Activation activation = Activation::ReLU;
  double layer_norm_eps = 1e-5;
  bool batch_first = false;
  bool norm_first = false;
  bool bias = true;  // of the attention's projections, the linears and the norms
};
using TransformerDecoderLayerOptions = TransformerEncoderLayerOptions;

// torch.nn.TransformerEncoderLayer: self_attn, linear1, dropout, linear2, norm1, norm2, dropout1,
// dropout2 with PyTorch's names; post-norm, or pre-norm with norm_first.
class TransformerEncoderLayer : public Module {
 public:
  explicit TransformerEncoderLayer(const TransformerEncoderLayerOptions& options);
  Tensor forward(const Tensor& src, const AttentionMasks& masks);
  Tensor forward(const Tensor& src) override { return forward(src, AttentionMasks{}); }
  using Module::operator();
  Tensor operator()(const Tensor& src, const AttentionMasks& masks, Loc loc = Loc::current()) {
    return call(loc, [&] { return forward(src, masks); });
  }
  TransformerEncoderLayerOptions options;
  std::shared_ptr<MultiheadAttention> self_attn;
  std::shared_ptr<Linear> linear1, linear2;
  std::shared_ptr<Dropout> dropout, dropout1, dropout2;
  std::shared_ptr<LayerNorm> norm1, norm2;
};

// torch.nn.TransformerEncoder: num_layers copies of encoder_layer (its options and its values,
// as PyTorch's deep copy; each copy its own parameters) named layers.0, layers.1, ..., then
// `norm` when given. The masks go to every layer.
class TransformerEncoder : public Module {
 public:
  TransformerEncoder(const TransformerEncoderLayer& encoder_layer, int64_t num_layers,
                     std::shared_ptr<Module> norm = nullptr);
  Tensor forward(const Tensor& src, const AttentionMasks& masks);
  Tensor forward(const Tensor& src) override { return forward(src, AttentionMasks{}); }
  using Module::operator();
  Tensor operator()(const Tensor& src, const AttentionMasks& masks, Loc loc = Loc::current()) {
    return call(loc, [&] { return forward(src, masks); });
  }
  std::shared_ptr<ModuleList> layers;
  std::shared_ptr<Module> norm;  // null: none
};

// torch.nn.TransformerDecoderLayer: self-attention over tgt, attention over memory, the
// feed-forward block; self_attn, multihead_attn, linear1, dropout, linear2, norm1, norm2, norm3,
// dropout1, dropout2, dropout3 with PyTorch's names; post-norm, or pre-norm with norm_first.
// tgt [T, N, E] and memory [S, N, E] (or batch first).
class TransformerDecoderLayer : public Module {
 public:
  explicit TransformerDecoderLayer(const TransformerDecoderLayerOptions& options);
  Tensor forward(const Tensor& tgt, const Tensor& memory, const AttentionMasks& tgt_masks = {},
                 const AttentionMasks& memory_masks = {});
  using Module::forward;  // forward(x) alone is Module's Error: this one takes more
  using Module::operator();
  Tensor operator()(const Tensor& tgt, const Tensor& memory, const AttentionMasks& tgt_masks = {},
                    const AttentionMasks& memory_masks = {}, Loc loc = Loc::current()) {
    return call(loc, [&] { return forward(tgt, memory, tgt_masks, memory_masks); });
  }
  TransformerDecoderLayerOptions options;
  std::shared_ptr<MultiheadAttention> self_attn, multihead_attn;
  std::shared_ptr<Linear> linear1, linear2;
  std::shared_ptr<Dropout> dropout, dropout1, dropout2, dropout3;
  std::shared_ptr<LayerNorm> norm1, norm2, norm3;
};

// torch.nn.TransformerDecoder: num_layers copies of decoder_layer (as TransformerEncoder's),
// then `norm` when given.
class TransformerDecoder : public Module {
 public:
  TransformerDecoder(const TransformerDecoderLayer& decoder_layer, int64_t num_layers,
                     std::shared_ptr<Module> norm = nullptr);
  Tensor forward(const Tensor& tgt, const Tensor& memory, const AttentionMasks& tgt_masks = {},
                 const AttentionMasks& memory_masks = {});
  using Module::forward;  // forward(x) alone is Module's Error: this one takes more
  using Module::operator();
  Tensor operator()(const Tensor& tgt, const Tensor& memory, const AttentionMasks& tgt_masks = {},
                    const AttentionMasks& memory_masks = {}, Loc loc = Loc::current()) {
    return call(loc, [&] { return forward(tgt, memory, tgt_masks, memory_masks); });
  }
  std::shared_ptr<ModuleList> layers;
  std::shared_ptr<Module> norm;  // null: none
};

struct TransformerOptions {
  int64_t d_model = 512, nhead = 8;
  int64_t num_encoder_layers = 6, num_decoder_layers = 6;
  int64_t dim_feedforward = 2048;
  double dropout = 0.1;
  Activation activation = Activation::ReLU;
  double layer_norm_eps = 1e-5;
  bool batch_first = false;
  bool norm_first = false;
  bool bias = true;
};

// torch.nn.Transformer: encoder (TransformerEncoder with a final LayerNorm) and decoder
// (TransformerDecoder with a final LayerNorm); every parameter of rank > 1 xavier-uniform
// initialised, as PyTorch's. forward(src, tgt, ...) is the decoder's output.
class Transformer : public Module {
 public:
  explicit Transformer(const TransformerOptions& options = {});
  Tensor forward(const Tensor& src, const Tensor& tgt, const AttentionMasks& src_masks = {},
                 const AttentionMasks& tgt_masks = {}, const AttentionMasks& memory_masks = {});
  using Module::forward;  // forward(x) alone is Module's Error: this one takes more
  using Module::operator();
  Tensor operator()(const Tensor& src, const Tensor& tgt, const AttentionMasks& src_masks = {},
                    const AttentionMasks& tgt_masks = {}, const AttentionMasks& memory_masks = {},
                    Loc loc = Loc::current()) {
    return call(loc, [&] { return forward(src, tgt, src_masks, tgt_masks, memory_masks); });
  }
  // [sz, sz] float: -inf above the diagonal, 0 on and below it (an attn_mask letting query i
  // see keys <= i), as PyTorch's static method.
  static Tensor generate_square_subsequent_mask(int64_t sz, TensorOptions options = {},
                                                Loc loc = Loc::current());
  TransformerOptions options;
  std::shared_ptr<TransformerEncoder> encoder;
  std::shared_ptr<TransformerDecoder> decoder;
};

// ---- recurrent ------------------------------------------------------------------------------
struct RNNOptions {
  int64_t input_size = 0, hidden_size = 0;
  int64_t num_layers = 1;
  bool bias = true;
  bool batch_first = false;  // input [N, T, input_size] instead of [T, N, input_size]
  double dropout = 0;        // between layers, in training
  bool bidirectional = false;
};

// torch.nn.LSTM and torch.nn.GRU: PyTorch's parameters (weight_ih_l0, weight_hh_l0, bias_ih_l0,
// bias_hh_l0, ..._reverse; gates i, f, g, o and r, z, n), initialisation U(-1/sqrt(H), 1/sqrt(H))
// and formulas. The time loop is unrolled into the step's graph: one compile per sequence length
// (pad to a few bucket lengths, see pad_sequences, to bound the compiles). Initial states are
// [num_layers * directions, N, H]; empty handles mean zeros. In f32, and under autocast, each
// layer and direction is one op instead (ls::lstm_layer, ls::gru_layer; see autocast.h).
class RNNBase : public Module {
 public:
  RNNBase(const RNNOptions& options, int64_t gates, const char* name);
  RNNOptions options;

 protected:
  // One layer and direction over inputs [T, N, in]: outputs [T, N, H], final h (and c).
  virtual std::vector<Tensor> run(const std::vector<Tensor>& inputs, int64_t layer, bool reverse,
                                  const Tensor& h0, const Tensor& c0) = 0;
  // The whole stack: output [T, N, D*H] (or batch first), final h and c [L*D, N, H].
  std::vector<Tensor> run_all(const Tensor& x, const Tensor& h0, const Tensor& c0, bool lstm);
  // Input projections of a whole layer at once, then one per time step: [T, N, gates*H] pieces.
  std::vector<Tensor> project(const std::vector<Tensor>& inputs, int64_t layer, bool reverse);
  const Tensor& param(const char* kind, int64_t layer, bool reverse) const;
  // The f32 path: each layer and direction one ls::lstm_layer or ls::gru_layer over the sequence.
  bool layer_op_applies(const Tensor& seq) const;
  std::vector<Tensor> run_layer_ops(const Tensor& seq, const Tensor& h0, const Tensor& c0,
                                    bool lstm);

 private:
  const char* name_;
  std::map<std::string, Tensor> weights_;  // by PyTorch name
};

class LSTM : public RNNBase {
 public:
  explicit LSTM(const RNNOptions& options);
  struct Output {
    Tensor output, h_n, c_n;
  };
  Output forward(const Tensor& x, const Tensor& h0, const Tensor& c0);
  Tensor forward(const Tensor& x) override { return forward(x, Tensor(), Tensor()).output; }
  using Module::operator();
  Output operator()(const Tensor& x, const Tensor& h0, const Tensor& c0, Loc loc = Loc::current()) {
    return call(loc, [&] { return forward(x, h0, c0); });
  }

 protected:
  std::vector<Tensor> run(const std::vector<Tensor>& inputs, int64_t layer, bool reverse,
                          const Tensor& h0, const Tensor& c0) override;
};

class GRU : public RNNBase {
 public:
  explicit GRU(const RNNOptions& options);
  struct Output {
    Tensor output, h_n;
  };
  Output forward(const Tensor& x, const Tensor& h0);
  Tensor forward(const Tensor& x) override { return forward(x, Tensor()).output; }
  using Module::operator();
  Output operator()(const Tensor& x, const Tensor& h0, Loc loc = Loc::current()) {
    return call(loc, [&] { return forward(x, h0); });
  }

 protected:
  std::vector<Tensor> run(const std::vector<Tensor>& inputs, int64_t layer, bool reverse,
                          const Tensor& h0, const Tensor& c0) override;
};

// ---- variable-length batches ----------------------------------------------------------------
// A step compiles once per distinct shape, so a batch padded to its own longest sequence
// compiles once per length. Padding to a few bucket lengths bounds that to one compile per
// bucket:  auto batch = nn::pad_token_batch(token_lists, {32, 64, 128});
struct PaddedSequences {
  Tensor padded;        // [N, L, ...] (batch first) or [L, N, ...]
  Tensor padding_mask;  // bool [N, L]: true at padding (MultiheadAttention's key_padding_mask)
  std::vector<int64_t> lengths;
};
// The smallest bucket (ascending list) >= length; an Error naming both when none is.
int64_t bucket_length(int64_t length, const std::vector<int64_t>& buckets);
// torch.nn.utils.rnn.pad_sequence: sequences [L_i, ...] (same trailing shape and dtype) padded
// with padding_value to `length` (0: the longest) and stacked.
PaddedSequences pad_sequences(const std::vector<Tensor>& sequences, int64_t length = 0,
                              bool batch_first = true, Scalar padding_value = 0,
                              Loc loc = Loc::current());
// Host token lists as one i64 [N, bucket] upload (and its mask), padded with pad_id to the
// bucket of the longest list.
PaddedSequences pad_token_batch(const std::vector<std::vector<int64_t>>& tokens,
                                const std::vector<int64_t>& buckets, int64_t pad_id = 0,
                                Device device = default_device(), Loc loc = Loc::current());

// ---- functional -----------------------------------------------------------------------------
enum class Reduction { Mean, Sum, None };

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
              Loc loc = Loc::current());
// The exact (erf) form, PyTorch's default, or its tanh approximation (approximate='tanh').
Tensor gelu(const Tensor& x, GeluApproximation approximate = GeluApproximation::None,
            Loc loc = Loc::current());
// Activations with PyTorch's formulas and defaults (F.leaky_relu, F.elu, F.silu, F.softplus,
// F.hardswish, F.mish, F.logsigmoid). softplus is x where beta * x > threshold.
Tensor leaky_relu(const Tensor& x, double negative_slope = 0.01, Loc loc = Loc::current());
Tensor elu(const Tensor& x, double alpha = 1.0, Loc loc = Loc::current());
Tensor silu(const Tensor& x, Loc loc = Loc::current());
Tensor softplus(const Tensor& x, double beta = 1.0, double threshold = 20.0,
                Loc loc = Loc::current());
Tensor hardswish(const Tensor& x, Loc loc = Loc::current());
Tensor mish(const Tensor& x, Loc loc = Loc::current());
Tensor log_sigmoid(const Tensor& x, Loc loc = Loc::current());
Tensor erf(const Tensor& x, Loc loc = Loc::current());
Tensor dropout(const Tensor& x, double p, bool training, Loc loc = Loc::current());
// torch.nn.functional.interpolate on [N, C, H, W]: nearest as gathers with PyTorch's source
// indices, bilinear and bicubic as products with [out, in] interpolation matrices made on the
// host (PyTorch's weights), one along H and one along W.
Tensor interpolate(const Tensor& x, const InterpolateOptions& options, Loc loc = Loc::current());
// Batch normalization of x [N, C, ...] per channel (axis 1), as PyTorch's F.batch_norm. In
// training it normalizes with the batch's statistics and, when given, updates running_mean and
// running_var in place (momentum; unbiased variance); its gradient is batch norm's own
// two-reduction formula rather than the primitives'. In eval it normalizes with the running
// statistics. weight and bias ([C]) are optional.
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight = Tensor(), const Tensor& bias = Tensor(),
                  bool training = false, double momentum = 0.1, double eps = 1e-5,
                  Loc loc = Loc::current());

struct CrossEntropyOptions {
  Reduction reduction = Reduction::Mean;
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
};
// logits [N, C], targets i64 [N] (class indices). Mean is over non-ignored targets.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets,
                     const CrossEntropyOptions& options = {}, Loc loc = Loc::current());
// log_probs [N, C], targets i64 [N].
Tensor nll_loss(const Tensor& log_probs, const Tensor& targets,
                const CrossEntropyOptions& options = {}, Loc loc = Loc::current());
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean,
                Loc loc = Loc::current());
Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& targets,
                                        Reduction reduction = Reduction::Mean,
                                        Loc loc = Loc::current());
// torch.nn.functional.binary_cross_entropy: probabilities `input` in [0, 1] against `target` of
// its shape, -weight (t log(x) + (1 - t) log(1 - x)) with each log clamped to >= -100 as
// PyTorch's; `weight` (optional) broadcasts to the input. Values outside [0, 1] are not read to
// be refused (that would be a sync): they give NaN, where PyTorch raises.
Tensor binary_cross_entropy(const Tensor& input, const Tensor& target,
                            const Tensor& weight = Tensor(), Reduction reduction = Reduction::Mean,
                            Loc loc = Loc::current());
// softmax(q k^T * scale + mask) v over the last two axes: q [..., L, E], k [..., S, E],
// v [..., S, Ev] -> [..., L, Ev] (F.scaled_dot_product_attention). attn_mask broadcasts to
// [..., L, S]: bool, true where attending IS allowed (SDPA's convention, the opposite of
// MultiheadAttention's), or float, added. is_causal masks keys after each query (no attn_mask
// with it). scale 0 means 1 / sqrt(E). Dropout on the weights when dropout_p > 0.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& attn_mask = Tensor(), double dropout_p = 0.0,
                                    bool is_causal = false, double scale = 0.0,
                                    Loc loc = Loc::current());
// Fraction (f32, 0-d) of rows whose arg-max equals the target.
Tensor accuracy(const Tensor& logits, const Tensor& targets, Loc loc = Loc::current());

// ---- init: PyTorch's torch.nn.init, same formulas (fans, gains, bounds) ----------------------
// Each fills the tensor in place (under NoGrad, recorded like any update: no recompile when
// re-run) with values from the calling thread's generator, and returns it.
namespace init {

enum class FanMode { FanIn, FanOut };
// Gain of a nonlinearity: "linear", "conv1d", "conv2d", "sigmoid" 1; "tanh" 5/3; "relu"
// sqrt(2); "leaky_relu" sqrt(2 / (1 + slope^2)) (slope `param`, 0.01 when NaN); "selu" 3/4.
double calculate_gain(const std::string& nonlinearity,
                      double param = std::numeric_limits<double>::quiet_NaN());
// fan_in = size(1) * receptive field, fan_out = size(0) * receptive field (rank >= 2).
std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& t);

Tensor uniform_(Tensor t, double a = 0.0, double b = 1.0);
Tensor normal_(Tensor t, double mean = 0.0, double std = 1.0);
Tensor constant_(Tensor t, double value);
Tensor zeros_(Tensor t);
Tensor ones_(Tensor t);
// U(-b, b), b = gain sqrt(6 / (fan_in + fan_out)); N(0, gain sqrt(2 / (fan_in + fan_out))).
Tensor xavier_uniform_(Tensor t, double gain = 1.0);
Tensor xavier_normal_(Tensor t, double gain = 1.0);
// std = gain(nonlinearity, a) / sqrt(fan); uniform bound sqrt(3) std.
Tensor kaiming_uniform_(Tensor t, double a = 0.0, FanMode mode = FanMode::FanIn,
                        const std::string& nonlinearity = "leaky_relu");
Tensor kaiming_normal_(Tensor t, double a = 0.0, FanMode mode = FanMode::FanIn,
                       const std::string& nonlinearity = "leaky_relu");
// N(mean, std) truncated to [a, b] by inverting the CDF (PyTorch's method; no rejection).
Tensor trunc_normal_(Tensor t, double mean = 0.0, double std = 1.0, double a = -2.0,
                     double b = 2.0);

}  // namespace init

}  // namespace lockstep::nn
