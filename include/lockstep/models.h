// Ready-made models with PyTorch's layouts and parameter names, so state dicts and
// checkpoints line up with torchvision's: an MLP, the small Fashion-MNIST CNN, ResNet-18/34/50.
#pragma once

#include <memory>
#include <vector>

#include "lockstep/nn.h"

namespace lockstep::models {

// Linear layers with ReLU between them: sizes {784, 1024, 1024, 10} gives 784-1024-1024-10.
// Parameters "layers.0.weight", "layers.2.weight", ... (a torch.nn.Sequential named layers).
class MLP : public nn::Module {
 public:
  explicit MLP(const std::vector<int64_t>& sizes);
  Tensor forward(const Tensor& x) override;  // x [N, sizes.front()] or [N, C, H, W] (flattened)
  std::shared_ptr<nn::Sequential> layers;
};

// Two conv + BatchNorm + ReLU + 2x2 max-pool blocks and two linear layers, for 1x28x28 images:
// conv1 (1->32, 3x3, pad 1), bn1, conv2 (32->64, 3x3, pad 1), bn2, fc1 (3136->128), fc2 (128->10).
// The convolutions have no bias: the BatchNorm after each would cancel it.
class FashionCNN : public nn::Module {
 public:
  explicit FashionCNN(int64_t num_classes = 10, int64_t in_channels = 1, int64_t image_size = 28);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<nn::Conv2d> conv1, conv2;
  std::shared_ptr<nn::BatchNorm2d> bn1, bn2;
  std::shared_ptr<nn::Linear> fc1, fc2;
};

enum class ResNetStem {
  ImageNet,  // 7x7 stride-2 conv and a 3x3 stride-2 max-pool (torchvision)
  Small,     // 3x3 stride-1 conv, no max-pool: for 32x32 inputs (CIFAR)
};

struct ResNetOptions {
  int64_t num_classes = 1000;
  ResNetStem stem = ResNetStem::ImageNet;
  int64_t in_channels = 3;
};

// torchvision's ResNet (v1.5: the stride is in the 3x3 conv of a bottleneck), with its
// initialisation (conv: kaiming normal, fan_out; BatchNorm: 1 and 0).
class ResNet : public nn::Module {
 public:
  ResNet(bool bottleneck, const std::vector<int64_t>& blocks, const ResNetOptions& options);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<nn::Conv2d> conv1;
  std::shared_ptr<nn::BatchNorm2d> bn1;
  std::vector<std::shared_ptr<nn::Sequential>> layers;  // layer1..layer4
  std::shared_ptr<nn::Linear> fc;
  ResNetOptions options;
};

struct GPTOptions {
  int64_t vocab_size = 16;
  int64_t block_size = 32;  // the longest sequence
  int64_t d_model = 64, nhead = 4, num_layers = 2, dim_feedforward = 256;
  double dropout = 0.0;
};

// A small GPT-style decoder: token and position embeddings (tok_emb, pos_emb), num_layers
// pre-norm nn::TransformerEncoderLayer with GELU under a causal mask (layers.0, layers.1, ...),
// a final LayerNorm (ln_f) and a linear head to the vocabulary (head). Names match the PyTorch
// model in tests/golden/make_gpt_fixture.py, so its state dict loads here.
class GPT : public nn::Module {
 public:
  explicit GPT(const GPTOptions& options = {});
  Tensor forward(const Tensor& tokens) override;  // i64 [N, T] -> logits [N, T, vocab_size]
  // Samples `n` tokens after `prompt` (i64 [N, T0], T0 >= 1): i64 [N, T0 + n]. Each token is
  // drawn (ls::multinomial) from the softmax of the last position's logits / temperature, among
  // the top_k most likely (0: all); the context is the last block_size tokens. Padded form: the
  // model always sees a window of one size, placed and read at positions that are host scalars,
  // so the whole generation compiles one program, whatever n (a context that grows one token a
  // time would compile one per length). One ls::step per token, with no read until the end: call
  // it outside a step. Runs in eval mode without gradients, and restores the mode.
  Tensor generate(const Tensor& prompt, int64_t n, double temperature = 1.0, int64_t top_k = 0,
                  Loc loc = Loc::current());
  GPTOptions options;
  std::shared_ptr<nn::Embedding> tok_emb, pos_emb;
  std::shared_ptr<nn::ModuleList> layers;
  std::shared_ptr<nn::LayerNorm> ln_f;
  std::shared_ptr<nn::Linear> head;
};

ResNet resnet18(const ResNetOptions& options = {});
ResNet resnet34(const ResNetOptions& options = {});
ResNet resnet50(const ResNetOptions& options = {});

}  // namespace lockstep::models
