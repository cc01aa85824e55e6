// libtorch (PyTorch 1.13's C++ API, eager, oneDNN enabled) running the same workloads as
// bench/train_bench.cpp: same shapes, fake data, SGD momentum, thread count set explicitly.
//   torch_train <mlp|cnn|cnn256|resnet18|resnet50|resnet50_96|resnet50_224> [timed_steps] [threads]
#include <torch/torch.h>

#include <chrono>
#include <cstdio>

#include "workloads.h"

namespace {

struct BlockImpl : torch::nn::Module {
  BlockImpl(bool bottleneck, int64_t in, int64_t planes, int64_t stride) : bottleneck(bottleneck) {
    const int64_t out = bottleneck ? planes * 4 : planes;
    auto conv = [](int64_t i, int64_t o, int64_t k, int64_t s, int64_t p) {
      return torch::nn::Conv2d(torch::nn::Conv2dOptions(i, o, k).stride(s).padding(p).bias(false));
    };
    if (bottleneck) {
      conv1 = register_module("conv1", conv(in, planes, 1, 1, 0));
      conv2 = register_module("conv2", conv(planes, planes, 3, stride, 1));
      conv3 = register_module("conv3", conv(planes, out, 1, 1, 0));
      bn3 = register_module("bn3", torch::nn::BatchNorm2d(out));
    } else {
      conv1 = register_module("conv1", conv(in, planes, 3, stride, 1));
      conv2 = register_module("conv2", conv(planes, planes, 3, 1, 1));
    }
    bn1 = register_module("bn1", torch::nn::BatchNorm2d(planes));
    bn2 = register_module("bn2", torch::nn::BatchNorm2d(planes));
    if (stride != 1 || in != out) {
      down = register_module("downsample", torch::nn::Sequential(conv(in, out, 1, stride, 0),
                                                                 torch::nn::BatchNorm2d(out)));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    auto h = torch::relu(bn1(conv1(x)));
    if (bottleneck) {
      h = torch::relu(bn2(conv2(h)));
      h = bn3(conv3(h));
    } else {
      h = bn2(conv2(h));
    }
    return torch::relu(h + (down ? down->forward(x) : x));
  }
  bool bottleneck;
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv3{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr}, bn3{nullptr};
  torch::nn::Sequential down{nullptr};
};
TORCH_MODULE(Block);

struct ResNetImpl : torch::nn::Module {
  ResNetImpl(bool bottleneck, std::vector<int64_t> blocks, bool small_stem) : small(small_stem) {
    conv1 =
        register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 64, small ? 3 : 7)
                                                       .stride(small ? 1 : 2)
                                                       .padding(small ? 1 : 3)
                                                       .bias(false)));
    bn1 = register_module("bn1", torch::nn::BatchNorm2d(64));
    int64_t in = 64;
    const int64_t planes[4] = {64, 128, 256, 512};
    for (int s = 0; s < 4; ++s) {
      torch::nn::Sequential stage;
      for (int64_t b = 0; b < blocks[s]; ++b) {
        stage->push_back(Block(bottleneck, in, planes[s], (s > 0 && b == 0) ? 2 : 1));
        in = bottleneck ? planes[s] * 4 : planes[s];
      }
      layers.push_back(register_module("layer" + std::to_string(s + 1), stage));
    }
    fc = register_module("fc", torch::nn::Linear(in, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    auto h = torch::relu(bn1(conv1(x)));
    if (!small) h = torch::max_pool2d(h, 3, 2, 1);
    for (auto& l : layers) h = l->forward(h);
    return fc(h.mean({2, 3}));
  }
  bool small;
  torch::nn::Conv2d conv1{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr};
  std::vector<torch::nn::Sequential> layers;
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(ResNet);

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: torch_train <mlp|cnn|cnn256|resnet18|resnet50|resnet50_96|resnet50_224> "
                 "[timed_steps] [threads]\n");
    return 2;
  }
  const Workload w = workload_by_name(argv[1]);
  const int steps = argc > 2 ? std::atoi(argv[2]) : 20;
  torch::set_num_threads(argc > 3 ? std::atoi(argv[3]) : 2);
  torch::manual_seed(0);
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(torch::Tensor)> forward;
  double gflop = 0;
  if (w.name == "mlp") {
    auto m = torch::nn::Sequential(torch::nn::Linear(784, 1024), torch::nn::ReLU(),
                                   torch::nn::Linear(1024, 1024), torch::nn::ReLU(),
                                   torch::nn::Linear(1024, 10));
    module = m.ptr();
    forward = [m](torch::Tensor x) mutable { return m->forward(x); };
    gflop = 3 * 2.0 * w.batch * (784 * 1024 + 1024 * 1024 + 1024 * 10) / 1e9;
  } else if (w.name == "cnn" || w.name == "cnn256") {
    namespace tnn = torch::nn;
    auto conv = [](int64_t in, int64_t out) {
      return tnn::Conv2d(tnn::Conv2dOptions(in, out, 3).padding(1).bias(false));
    };
    auto m = tnn::Sequential(
        conv(1, 32), tnn::BatchNorm2d(32), tnn::ReLU(), tnn::MaxPool2d(tnn::MaxPool2dOptions(2)),
        conv(32, 64), tnn::BatchNorm2d(64), tnn::ReLU(), tnn::MaxPool2d(tnn::MaxPool2dOptions(2)),
        tnn::Flatten(), tnn::Linear(64 * 7 * 7, 128), tnn::ReLU(), tnn::Linear(128, 10));
    module = m.ptr();
    forward = [m](torch::Tensor x) mutable { return m->forward(x); };
  } else {
    const bool resnet50 = w.name.rfind("resnet50", 0) == 0;  // resnet50, _96, _224
    ResNet m(resnet50,
             resnet50 ? std::vector<int64_t>{3, 4, 6, 3} : std::vector<int64_t>{2, 2, 2, 2},
             w.image <= 64 && w.name == "resnet18");
    module = m.ptr();
    forward = [m](torch::Tensor x) mutable { return m->forward(x); };
  }
  torch::optim::SGD opt(module->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  auto images = w.image ? torch::randn({w.batch, w.channels, w.image, w.image})
                        : torch::randn({w.batch, 784});
  auto labels = torch::randint(0, 10, {w.batch}, torch::kLong);
  torch::Tensor loss;
  auto step = [&] {
    opt.zero_grad();
    loss = torch::nn::functional::cross_entropy(forward(images), labels);
    loss.backward();
    opt.step();
  };
  auto t0 = std::chrono::steady_clock::now();
  step();
  const double first_ms = seconds_since(t0) * 1e3;
  for (int i = 0; i < 2; ++i) step();
  t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) step();
  const double s = seconds_since(t0);
  std::printf("loss %.4f\n", loss.item<float>());
  // GFLOP/s is reported by the lockstep side (which counts its graph); 0 here unless known.
  print_result(w.name, "libtorch", first_ms, steps * w.batch / s, gflop, s / steps, 0.0, 0.0);
  return 0;
}
