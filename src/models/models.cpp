// The MLP, the Fashion-MNIST CNN and torchvision's ResNets.
#include <algorithm>
#include <cmath>

#include "lockstep/autograd.h"
#include "lockstep/models.h"
#include "lockstep/runtime.h"
#include "util/check.h"

namespace lockstep::models {

using util::cat;

MLP::MLP(const std::vector<int64_t>& sizes) {
  if (sizes.size() < 2) throw Error("MLP: needs at least an input and an output size");
  layers = register_module("layers", std::make_shared<nn::Sequential>());
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    layers->emplace<nn::Linear>(sizes[i], sizes[i + 1]);
    if (i + 2 < sizes.size()) layers->emplace<nn::ReLU>();
  }
}

Tensor MLP::forward(const Tensor& x) { return (*layers)(x.dim() > 2 ? flatten(x, 1) : x); }

FashionCNN::FashionCNN(int64_t num_classes, int64_t in_channels, int64_t image_size) {
  if (image_size % 4 != 0)
    throw Error(cat("FashionCNN: image size must be a multiple of 4, got ", image_size));
  conv1 = register_module("conv1",
                          std::make_shared<nn::Conv2d>(nn::Conv2dSpec{.in_channels = in_channels,
                                                                      .out_channels = 32,
                                                                      .kernel = {3, 3},
                                                                      .padding = {1, 1},
                                                                      .bias = false}));
  bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2d>(32));
  conv2 = register_module("conv2", std::make_shared<nn::Conv2d>(nn::Conv2dSpec{.in_channels = 32,
                                                                               .out_channels = 64,
                                                                               .kernel = {3, 3},
                                                                               .padding = {1, 1},
                                                                               .bias = false}));
  bn2 = register_module("bn2", std::make_shared<nn::BatchNorm2d>(64));
  const int64_t side = image_size / 4;
  fc1 = register_module("fc1", std::make_shared<nn::Linear>(64 * side * side, 128));
  fc2 = register_module("fc2", std::make_shared<nn::Linear>(128, num_classes));
}

Tensor FashionCNN::forward(const Tensor& x) {
  const Pool2dOptions pool{{2, 2}, {2, 2}, {0, 0}, true};
  Tensor h = max_pool2d(relu((*bn1)((*conv1)(x))), pool);
  h = max_pool2d(relu((*bn2)((*conv2)(h))), pool);
  h = relu((*fc1)(flatten(h, 1)));
  return (*fc2)(h);
}

namespace {

// kaiming_normal_(mode="fan_out", nonlinearity="relu"), as torchvision initialises convs.
std::shared_ptr<nn::Conv2d> conv(int64_t in, int64_t out, int64_t k, int64_t stride, int64_t pad) {
  auto c = std::make_shared<nn::Conv2d>(nn::Conv2dSpec{.in_channels = in,
                                                       .out_channels = out,
                                                       .kernel = {k, k},
                                                       .stride = {stride, stride},
                                                       .padding = {pad, pad},
                                                       .bias = false});
  NoGrad no_grad;
  const double std_dev = std::sqrt(2.0 / static_cast<double>(out * k * k));
  c->weight.copy_(randn(c->weight.shape()) * std_dev);
  return c;
}

class Block : public nn::Module {
 public:
  Block(bool bottleneck, int64_t in, int64_t planes, int64_t stride) : bottleneck_(bottleneck) {
    const int64_t out = bottleneck ? planes * 4 : planes;
    if (bottleneck) {
      conv1 = register_module("conv1", conv(in, planes, 1, 1, 0));
      bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2d>(planes));
      conv2 = register_module("conv2", conv(planes, planes, 3, stride, 1));
      bn2 = register_module("bn2", std::make_shared<nn::BatchNorm2d>(planes));
      conv3 = register_module("conv3", conv(planes, out, 1, 1, 0));
      bn3 = register_module("bn3", std::make_shared<nn::BatchNorm2d>(out));
    } else {
      conv1 = register_module("conv1", conv(in, planes, 3, stride, 1));
      bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2d>(planes));
      conv2 = register_module("conv2", conv(planes, planes, 3, 1, 1));
      bn2 = register_module("bn2", std::make_shared<nn::BatchNorm2d>(planes));
    }
    if (stride != 1 || in != out) {
      downsample = register_module("downsample", std::make_shared<nn::Sequential>());
      downsample->add(conv(in, out, 1, stride, 0));
      downsample->emplace<nn::BatchNorm2d>(out);
    }
  }

  Tensor forward(const Tensor& x) override {
    Tensor h = relu((*bn1)((*conv1)(x)));
    if (bottleneck_) {
      h = relu((*bn2)((*conv2)(h)));
      h = (*bn3)((*conv3)(h));
    } else {
      h = (*bn2)((*conv2)(h));
    }
    return relu(h + (downsample ? (*downsample)(x) : x));
  }

 private:
  bool bottleneck_;
  std::shared_ptr<nn::Conv2d> conv1, conv2, conv3;
  std::shared_ptr<nn::BatchNorm2d> bn1, bn2, bn3;
  std::shared_ptr<nn::Sequential> downsample;
};

}  // namespace

ResNet::ResNet(bool bottleneck, const std::vector<int64_t>& blocks, const ResNetOptions& o)
    : options(o) {
  if (blocks.size() != 4) throw Error("ResNet: needs four stages");
  if (o.num_classes <= 0) throw Error(cat("ResNet: num_classes must be > 0, got ", o.num_classes));
  conv1 =
      register_module("conv1", o.stem == ResNetStem::ImageNet ? conv(o.in_channels, 64, 7, 2, 3)
                                                              : conv(o.in_channels, 64, 3, 1, 1));
  bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2d>(64));
  int64_t in = 64;
  const int64_t planes[4] = {64, 128, 256, 512};
  for (int s = 0; s < 4; ++s) {
    auto stage = std::make_shared<nn::Sequential>();
    for (int64_t b = 0; b < blocks[s]; ++b) {
      const int64_t stride = (s > 0 && b == 0) ? 2 : 1;
      stage->add(std::make_shared<Block>(bottleneck, in, planes[s], stride));
      in = bottleneck ? planes[s] * 4 : planes[s];
    }
    layers.push_back(register_module(cat("layer", s + 1), stage));
  }
  fc = register_module("fc", std::make_shared<nn::Linear>(in, o.num_classes));
}

Tensor ResNet::forward(const Tensor& x) {
  Tensor h = relu((*bn1)((*conv1)(x)));
  if (options.stem == ResNetStem::ImageNet)
    h = max_pool2d(h, Pool2dOptions{{3, 3}, {2, 2}, {1, 1}, true});
  for (auto& stage : layers) h = (*stage)(h);
  h = mean(h, {2, 3});
  return (*fc)(h);
}

ResNet resnet18(const ResNetOptions& o) { return ResNet(false, {2, 2, 2, 2}, o); }
ResNet resnet34(const ResNetOptions& o) { return ResNet(false, {3, 4, 6, 3}, o); }
ResNet resnet50(const ResNetOptions& o) { return ResNet(true, {3, 4, 6, 3}, o); }

GPT::GPT(const GPTOptions& o) : options(o) {
  if (o.vocab_size <= 0 || o.block_size <= 0 || o.num_layers < 0)
    throw Error(cat("GPT: vocab_size ", o.vocab_size, " and block_size ", o.block_size,
                    " must be positive, num_layers ", o.num_layers, " >= 0"));
  tok_emb = register_module("tok_emb", std::make_shared<nn::Embedding>(o.vocab_size, o.d_model));
  pos_emb = register_module("pos_emb", std::make_shared<nn::Embedding>(o.block_size, o.d_model));
  layers = register_module("layers", std::make_shared<nn::ModuleList>());
  nn::TransformerEncoderLayerOptions layer{o.d_model, o.nhead, o.dim_feedforward, o.dropout,
                                           nn::Activation::GELU};
  layer.batch_first = true;
  layer.norm_first = true;
  for (int64_t i = 0; i < o.num_layers; ++i)
    layers->emplace_back<nn::TransformerEncoderLayer>(layer);
  ln_f = register_module("ln_f", std::make_shared<nn::LayerNorm>(Shape{o.d_model}));
  head = register_module("head", std::make_shared<nn::Linear>(o.d_model, o.vocab_size));
}

Tensor GPT::forward(const Tensor& tokens) {
  if (!tokens.defined() || tokens.dim() != 2 || tokens.dtype() != DType::I64)
    throw Error(cat("GPT: tokens must be i64 [N, T], got ",
                    tokens.defined() ? cat(dtype_name(tokens.dtype()), shape_str(tokens.shape()))
                                     : std::string("an empty handle")));
  const int64_t t = tokens.size(1);
  if (t > options.block_size)
    throw Error(cat("GPT: sequence length ", t, " is longer than block_size ", options.block_size));
  Tensor x = (*tok_emb)(tokens) + (*pos_emb)(arange(t, TensorOptions(DType::I64, tokens.device())));
  nn::AttentionMasks causal;
  causal.is_causal = true;
  for (const auto& layer : *layers)
    x = (*std::static_pointer_cast<nn::TransformerEncoderLayer>(layer))(x, causal);
  return (*head)((*ln_f)(x));
}

Tensor GPT::generate(const Tensor& prompt, int64_t n, double temperature, int64_t top_k, Loc loc) {
  if (!prompt.defined() || prompt.dim() != 2 || prompt.dtype() != DType::I64 || prompt.size(1) < 1)
    util::fail(loc, "GPT::generate",
               cat("the prompt must be i64 [N, T] with T >= 1, got ",
                   prompt.defined() ? cat(dtype_name(prompt.dtype()), shape_str(prompt.shape()))
                                    : std::string("an empty handle")),
               "Pass at least one token per sequence");
  if (n < 0) util::fail(loc, "GPT::generate", cat("n = ", n, " is negative"), "");
  if (!(temperature > 0) || !std::isfinite(temperature))
    util::fail(loc, "GPT::generate", cat("temperature ", temperature, " must be finite and > 0"),
               "Use a small temperature (e.g. 0.01) for nearly greedy sampling");
  if (top_k < 0 || top_k > options.vocab_size)
    util::fail(loc, "GPT::generate",
               cat("top_k = ", top_k, " is outside [0, ", options.vocab_size, "]"),
               "Pass 0 for all tokens");
  const int64_t batch = prompt.size(0), given = prompt.size(1), total = given + n;
  const int64_t window = std::min(options.block_size, total), vocab = options.vocab_size;
  const bool was_training = is_training();
  eval();
  struct Restore {
    GPT& m;
    bool training;
    ~Restore() { m.train(training); }
  } restore{*this, was_training};
  NoGrad no_grad;
  const TensorOptions i64(DType::I64, prompt.device());
  Tensor all = pad(prompt, {{0, 0}, {0, n}}, 0, loc);
  const Tensor ramp = arange(window, i64, loc), positions = arange(total, i64, loc);
  for (int64_t len = given; len < total; ++len) {
    step(
        [&] {
          // The window ends at the last token so far; before it fills, it starts at 0 and the
          // causal mask keeps the padding after the last token from mattering.
          const int64_t start = std::max<int64_t>(0, len - window);
          const int64_t last = std::min(len, window) - 1;
          const Tensor index =
              expand(unsqueeze(add(ramp, start, loc), 0, loc), {batch, window}, loc);
          const Tensor logits = forward(gather(all, 1, index, loc));
          Tensor next = reshape(gather(logits, 1, full({batch, 1, vocab}, last, i64, loc), loc),
                                {batch, vocab}, loc);
          next = mul(next, 1.0 / temperature, loc);
          if (top_k > 0 && top_k < vocab) {
            const Tensor kth =
                slice(topk(next, top_k, -1, true, loc).values, 1, top_k - 1, top_k, 1, loc);
            next =
                masked_fill(next, lt(next, expand(kth, {batch, vocab}, loc), loc), -INFINITY, loc);
          }
          const Tensor token = multinomial(softmax(next, -1, loc), 1, false, loc);
          all = where(expand(unsqueeze(eq(positions, len, loc), 0, loc), {batch, total}, loc),
                      expand(token, {batch, total}, loc), all, loc);
        },
        loc);
  }
  return all;
}

}  // namespace lockstep::models
