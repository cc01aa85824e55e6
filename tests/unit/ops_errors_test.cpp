// Every bad input throws ls::Error at the call (never a crash, never an internal error), and the
// message names the op, the offending shapes or dtypes, and the user's source line.
#include <cstdint>
#include <limits>

#include "unit/ops_test_util.h"

namespace {

using namespace ops_test;

using OpsErrors = OnTestDevice;

TEST_F(OpsErrors, MessageNamesOpShapesFixAndUserLine) {
  const ls::Tensor a = ls::zeros({2, 3});
  const ls::Tensor b = ls::zeros({4});
  EXPECT_LS_ERROR(a + b, "add", "[2, 3]", "[4]", "broadcast", "ops_errors_test.cpp");
  EXPECT_LS_ERROR(ls::mul(a, ls::zeros({3, 2})), "mul", "[2, 3]", "[3, 2]");
  EXPECT_LS_ERROR(ls::matmul(a, ls::zeros({4, 5})), "matmul", "[2, 3]", "[4, 5]",
                  "ops_errors_test.cpp");
}

TEST_F(OpsErrors, WrongDtypes) {
  const ls::Tensor i = ls::zeros({2}, ls::i64);
  const ls::Tensor f = ls::zeros({2});
  const ls::Tensor b = ls::zeros({2}, ls::boolean);
  for (auto* op :
       {&ls::exp, &ls::log, &ls::sqrt, &ls::rsqrt, &ls::tanh, &ls::sigmoid, &ls::sin, &ls::cos})
    EXPECT_LS_ERROR(op(i, std::source_location::current()), "floating", "i64");
  EXPECT_LS_ERROR(ls::exp(i), "exp", "i64[2]");
  EXPECT_LS_ERROR(ls::neg(b), "neg", "bool[2]");
  EXPECT_LS_ERROR(-b, "neg", "bool");
  EXPECT_LS_ERROR(ls::abs(b), "abs", "bool");
  EXPECT_LS_ERROR(ls::relu(b), "relu", "bool");
  EXPECT_LS_ERROR(ls::sign(b), "sign", "bool");
  EXPECT_LS_ERROR(ls::floor(b), "floor", "bool");
  EXPECT_LS_ERROR(ls::add(b, b), "add", "bool");
  EXPECT_LS_ERROR(ls::maximum(b, b), "maximum", "bool");
  EXPECT_LS_ERROR(ls::where(f, f, f), "where", "bool", "f32");
  EXPECT_LS_ERROR(ls::where(i, 1, 2.0 * f), "where", "bool");
  EXPECT_LS_ERROR(ls::mean(i), "mean", "i64[2]");
  EXPECT_LS_ERROR(ls::softmax(i, 0), "softmax", "i64[2]");
  EXPECT_LS_ERROR(ls::log_softmax(i, 0), "log_softmax", "i64");
  EXPECT_LS_ERROR(ls::logsumexp(i, {0}), "logsumexp", "i64");
  EXPECT_LS_ERROR(ls::clamp(b, 0, 1), "clamp", "bool[2]");
  EXPECT_LS_ERROR(ls::concat({f, i}, 0), "concat", "f32", "i64");
  EXPECT_LS_ERROR(ls::matmul(ls::zeros({2, 2}, ls::boolean), ls::zeros({2, 2}, ls::boolean)),
                  "matmul", "bool");
  EXPECT_LS_ERROR(ls::matmul(ls::zeros({2, 2}), ls::zeros({2, 2}, ls::f64)), "matmul", "f32",
                  "f64");
}

// Float scalars promote integer tensors (i * 0.5 is f32, as in PyTorch); where a result must keep
// the tensor's integer dtype, a non-integral or unrepresentable value is an error.
TEST_F(OpsErrors, NonIntegralScalarWithIntegerTensor) {
  const ls::Tensor i = ls::zeros({2}, ls::i64);
  EXPECT_LS_ERROR(ls::add(ls::zeros({2}, ls::i32), int64_t{1} << 40), "add", "i32");
  EXPECT_LS_ERROR(ls::clamp(i, 0.5, 2), "clamp", "0.5");
  EXPECT_LS_ERROR(ls::pad(i, {{1, 1}}, 0.5), "pad", "0.5");
  EXPECT_LS_ERROR(ls::full({2}, 0.5, ls::i64), "full", "0.5");
  EXPECT_LS_ERROR(ls::arange(0, 2, 0.5, ls::i64), "arange", "0.5");
  EXPECT_LS_ERROR(ls::clamp(ls::zeros({2}), 2, 1), "clamp", "lower bound");
}

TEST_F(OpsErrors, NonBroadcastableShapes) {
  EXPECT_LS_ERROR(ls::sub(ls::zeros({2, 3}), ls::zeros({2})), "sub", "[2, 3]", "[2]");
  EXPECT_LS_ERROR(ls::lt(ls::zeros({0}), ls::zeros({2})), "lt", "[0]", "[2]");
  EXPECT_LS_ERROR(ls::where(ls::zeros({3}, ls::boolean), ls::zeros({2, 1}), ls::zeros({2, 2})),
                  "where", "[2, 3]", "[2, 2]");
  EXPECT_LS_ERROR(ls::pow(2, ls::zeros({2, 3}) + ls::zeros({3, 1})), "add", "[2, 3]", "[3, 1]");
}

TEST_F(OpsErrors, BadAxes) {
  const ls::Tensor x = ls::zeros({2, 3, 4});
  EXPECT_LS_ERROR(ls::sum(x, {3}), "sum", "axis 3", "rank 3");
  EXPECT_LS_ERROR(ls::sum(x, {-4}), "sum", "axis -4");
  EXPECT_LS_ERROR(ls::sum(x, {0, 0}), "sum", "twice");
  EXPECT_LS_ERROR(ls::sum(x, {1, -2}), "sum", "twice");
  EXPECT_LS_ERROR(ls::mean(x, {5}), "mean", "axis 5");
  EXPECT_LS_ERROR(ls::max(x, {2, 2}), "max", "twice");
  EXPECT_LS_ERROR(ls::min(x, {-5}), "min", "axis -5");
  EXPECT_LS_ERROR(ls::argmax(x, {3}), "argmax", "axis 3");
  EXPECT_LS_ERROR(ls::argmin(x, {0, -3}), "argmin", "twice");
  EXPECT_LS_ERROR(ls::softmax(x, 3), "softmax", "axis 3");
  EXPECT_LS_ERROR(ls::log_softmax(x, -4), "log_softmax", "axis -4");
  EXPECT_LS_ERROR(ls::logsumexp(x, {1, 1}), "logsumexp", "twice");
  EXPECT_LS_ERROR(ls::logsumexp(x, {3}), "logsumexp", "axis 3");
  EXPECT_LS_ERROR(ls::sum(ls::scalar_tensor(1.0f), {0}), "sum", "0-d");
  EXPECT_LS_ERROR(ls::transpose(x, 0, 3), "transpose", "axis 3");
  EXPECT_LS_ERROR(ls::unsqueeze(x, 4), "unsqueeze", "axis 4");
  EXPECT_LS_ERROR(ls::unsqueeze(x, -5), "unsqueeze", "axis -5");
  EXPECT_LS_ERROR(ls::squeeze(x, 3), "squeeze", "axis 3");
  EXPECT_LS_ERROR(ls::flatten(x, 3), "flatten", "axis 3");
  EXPECT_LS_ERROR(ls::flatten(x, 2, 1), "flatten", "start axis");
  EXPECT_LS_ERROR(ls::flatten(ls::scalar_tensor(1.0f), 3), "flatten", "axis 3");
  EXPECT_LS_ERROR(ls::slice(x, 3, 0, 1), "slice", "axis 3");
  EXPECT_LS_ERROR(ls::concat({x, x}, 3), "concat", "axis 3");
  EXPECT_LS_ERROR(ls::gather(x, 3, ls::zeros({2, 3, 4}, ls::i64)), "gather", "axis 3");
  EXPECT_LS_ERROR(ls::scatter_add(x, -4, ls::zeros({1, 1, 1}, ls::i64), x), "scatter_add",
                  "axis -4");
  EXPECT_LS_ERROR(x.size(3), "size", "axis 3");
  // Reducing over an empty axis has no value for max/min/argmax/argmin.
  EXPECT_LS_ERROR(ls::max(ls::zeros({2, 0}), {1}), "max", "size 0", "[2, 0]");
  EXPECT_LS_ERROR(ls::min(ls::zeros({0})), "min", "size 0");
  EXPECT_LS_ERROR(ls::argmax(ls::zeros({0, 2}), {0}), "argmax", "size 0");
  EXPECT_LS_ERROR(ls::argmin(ls::zeros({0})), "argmin", "size 0");
}

TEST_F(OpsErrors, MovementShapes) {
  const ls::Tensor x = ls::zeros({2, 3});
  EXPECT_LS_ERROR(ls::reshape(x, {4}), "reshape", "[2, 3]", "[4]");
  EXPECT_LS_ERROR(ls::reshape(x, {-1, -1}), "reshape", "-1");
  EXPECT_LS_ERROR(ls::reshape(x, {-1, 4}), "reshape", "[-1, 4]", "[2, 3]");
  EXPECT_LS_ERROR(ls::reshape(x, {-2, -3}), "reshape", "negative");
  EXPECT_LS_ERROR(ls::reshape(ls::zeros({2, 0}), {0, -1}), "reshape", "-1");
  EXPECT_LS_ERROR(ls::permute(x, {0, 0}), "permute", "[0, 0]", "[2, 3]");
  EXPECT_LS_ERROR(ls::permute(x, {0}), "permute", "[2, 3]");
  EXPECT_LS_ERROR(ls::permute(x, {0, 1, 2}), "permute", "[2, 3]");
  EXPECT_LS_ERROR(ls::permute(x, {0, 2}), "permute", "axis 2");
  EXPECT_LS_ERROR(ls::expand(x, {2, 4}), "expand", "[2, 3]", "[2, 4]");
  EXPECT_LS_ERROR(ls::expand(x, {3}), "expand", "[2, 3]", "[3]");
  EXPECT_LS_ERROR(ls::expand(ls::zeros({3}), {0}), "expand", "[3]", "[0]");
  EXPECT_LS_ERROR(ls::expand(x, {-1, 2, 3}), "expand", "-1");
  EXPECT_LS_ERROR(ls::expand(ls::zeros({1}), {-2}), "expand", "[1]");
  EXPECT_LS_ERROR(ls::squeeze(x, 0), "squeeze", "[2, 3]", "size 2");
  EXPECT_LS_ERROR(ls::slice(x, 0, 0, 1, 0), "slice", "step 0");
  EXPECT_LS_ERROR(ls::slice(x, 0, 0, 1, -1), "slice", "step -1");
  EXPECT_LS_ERROR(ls::concat({}, 0), "concat");
  EXPECT_LS_ERROR(ls::concat({x, ls::zeros({3, 3})}, 1), "concat", "[2, 3]", "[3, 3]");
  EXPECT_LS_ERROR(ls::concat({x, ls::zeros({2, 3, 1})}, 0), "concat", "[2, 3, 1]");
  EXPECT_LS_ERROR(ls::concat({ls::scalar_tensor(1.0f), ls::scalar_tensor(2.0f)}, 0), "concat",
                  "0-d");
  EXPECT_LS_ERROR(ls::pad(x, {{1, 1}}), "pad", "[2, 3]");
  EXPECT_LS_ERROR(ls::pad(x, {{0, 0}, {0, -1}}), "pad", "negative");
}

TEST_F(OpsErrors, Indexing) {
  const ls::Tensor x = ls::zeros({3, 2});
  EXPECT_LS_ERROR(ls::gather(x, 0, ls::zeros({2, 2}, ls::i32)), "gather", "i64", "i32");
  EXPECT_LS_ERROR(ls::gather(x, 0, ls::zeros({2}, ls::i64)), "gather", "[2]", "[3, 2]");
  EXPECT_LS_ERROR(ls::gather(x, 0, ls::zeros({2, 3}, ls::i64)), "gather", "[2, 3]", "[3, 2]");
  EXPECT_LS_ERROR(ls::scatter_add(x, 0, ls::zeros({2, 2}, ls::i64), ls::zeros({2, 2}, ls::f64)),
                  "scatter_add", "f64", "f32");
  EXPECT_LS_ERROR(ls::scatter_add(x, 0, ls::zeros({2, 2}, ls::i64), ls::zeros({1, 2})),
                  "scatter_add", "[2, 2]", "[1, 2]");
  EXPECT_LS_ERROR(ls::scatter_add(x, 0, ls::zeros({2, 2}, ls::i64), ls::zeros({4})), "scatter_add",
                  "[4]");
  EXPECT_LS_ERROR(ls::scatter_add(x, 0, ls::zeros({2, 2}, ls::f32), x), "scatter_add", "i64");
}

TEST_F(OpsErrors, Matmul) {
  EXPECT_LS_ERROR(ls::matmul(ls::zeros({2, 3}), ls::zeros({2, 3})), "matmul", "[2, 3]", "inner");
  EXPECT_LS_ERROR(ls::matmul(ls::zeros({3}), ls::zeros({4})), "matmul", "inner");
  EXPECT_LS_ERROR(ls::matmul(ls::zeros({2, 3}), ls::zeros({4})), "matmul", "inner");
  EXPECT_LS_ERROR(ls::matmul(ls::scalar_tensor(1.0f), ls::zeros({2})), "matmul", "0-d");
  EXPECT_LS_ERROR(ls::matmul(ls::zeros({2, 2, 3}), ls::zeros({3, 3, 4})), "matmul", "[2, 2, 3]",
                  "[3, 3, 4]", "batch");
}

TEST_F(OpsErrors, Conv2d) {
  const ls::Tensor x = ls::zeros({1, 3, 5, 5});
  EXPECT_LS_ERROR(ls::conv2d(x, ls::zeros({2, 2, 3, 3})), "conv2d", "[1, 3, 5, 5]", "[2, 2, 3, 3]",
                  "channels");
  EXPECT_LS_ERROR(ls::conv2d(x, ls::zeros({2, 1, 3, 3}), {.groups = 2}), "conv2d", "groups");
  EXPECT_LS_ERROR(ls::conv2d(ls::zeros({1, 4, 5, 5}), ls::zeros({3, 2, 3, 3}), {.groups = 2}),
                  "conv2d", "groups");
  EXPECT_LS_ERROR(ls::conv2d(x, ls::zeros({2, 3, 3, 3}), {.groups = 0}), "conv2d", "groups");
  EXPECT_LS_ERROR(ls::conv2d(ls::zeros({3, 5, 5}), ls::zeros({2, 3, 3, 3})), "conv2d", "[3, 5, 5]",
                  "rank 4");
  EXPECT_LS_ERROR(ls::conv2d(x, ls::zeros({2, 3, 3})), "conv2d", "rank 4");
  EXPECT_LS_ERROR(ls::conv2d(x, ls::zeros({2, 3, 6, 6})), "conv2d", "too small");
  EXPECT_LS_ERROR(ls::conv2d(x, ls::zeros({2, 3, 3, 3}), {.stride = {0, 1}}), "conv2d", "stride");
  EXPECT_LS_ERROR(ls::conv2d(x, ls::zeros({2, 3, 3, 3}), {.padding = {-1, 0}}), "conv2d");
  EXPECT_LS_ERROR(ls::conv2d(x, ls::zeros({2, 3, 3, 3}), {.dilation = {1, 0}}), "conv2d");
  // A kernel larger than the input must fail even when the stride would round the output size
  // up to 1 (2x2 input, 4x4 kernel, stride 3; and a 3-wide input with a dilated kernel of span 4).
  EXPECT_LS_ERROR(ls::conv2d(ls::zeros({1, 1, 2, 2}), ls::zeros({1, 1, 4, 4}), {.stride = {3, 3}}),
                  "conv2d", "too small");
  EXPECT_LS_ERROR(ls::conv2d(ls::zeros({1, 1, 3, 3}), ls::zeros({1, 1, 2, 2}),
                             {.stride = {2, 2}, .dilation = {3, 3}}),
                  "conv2d", "too small");
  EXPECT_LS_ERROR(ls::conv2d(ls::zeros({1, 1, 3, 3}, ls::i64), ls::zeros({1, 1, 2, 2}, ls::i64)),
                  "conv2d", "i64");
  EXPECT_LS_ERROR(ls::conv2d(x, ls::zeros({2, 3, 3, 3}, ls::f64)), "conv2d", "f32", "f64");
  // Gradients: the output gradient must match the forward output of the given shape.
  const ls::Tensor w = ls::zeros({2, 3, 3, 3});
  EXPECT_LS_ERROR(ls::conv2d_backward_input(ls::zeros({1, 2, 4, 4}), w, {1, 3, 5, 5}),
                  "conv2d_backward_input", "[1, 2, 4, 4]", "[1, 2, 3, 3]");
  EXPECT_LS_ERROR(ls::conv2d_backward_input(ls::zeros({1, 2, 3, 3}), w, {1, 3, 5}),
                  "conv2d_backward_input", "rank 4");
  EXPECT_LS_ERROR(ls::conv2d_backward_weight(x, ls::zeros({1, 2, 3, 3}), {2, 3, 2, 2}),
                  "conv2d_backward_weight", "[1, 2, 3, 3]", "[1, 2, 4, 4]");
  EXPECT_LS_ERROR(ls::conv2d_backward_weight(x, ls::zeros({1, 2, 3, 3}), {2, 2, 3, 3}),
                  "conv2d_backward_weight", "channels");
}

TEST_F(OpsErrors, LstmLayer) {
  // One layer: T 3, batch 2, input 4, hidden 5.
  const ls::Tensor x = ls::zeros({3, 2, 4}), s = ls::zeros({2, 5}), wi = ls::zeros({20, 4}),
                   wh = ls::zeros({20, 5}), b = ls::zeros({20});
  EXPECT_NO_THROW(ls::lstm_layer(x, s, s, wi, wh, b));
  EXPECT_LS_ERROR(ls::lstm_layer(ls::zeros({2, 4}), s, s, wi, wh, b), "lstm", "[T >= 1, N, I]");
  EXPECT_LS_ERROR(ls::lstm_layer(ls::zeros({0, 2, 4}), s, s, wi, wh, b), "lstm", "[T >= 1");
  EXPECT_LS_ERROR(ls::lstm_layer(x, s, s, ls::zeros({20, 3}), wh, b), "lstm", "operand 3",
                  "[20, 3]", "expected [20, 4]");
  EXPECT_LS_ERROR(ls::lstm_layer(x, s, ls::zeros({2, 4}), wi, wh, b), "lstm", "operand 2");
  EXPECT_LS_ERROR(ls::lstm_layer(x, s, s, wi, wh, ls::zeros({5})), "lstm", "operand 5");
  EXPECT_LS_ERROR(ls::lstm_layer(x, s, s, wi, wh, ls::zeros({20}, ls::f64)), "lstm", "f64",
                  "one dtype");
  EXPECT_LS_ERROR(
      ls::lstm_layer(ls::cast(x, ls::bf16), ls::cast(s, ls::bf16), ls::cast(s, ls::bf16),
                     ls::cast(wi, ls::bf16), ls::cast(wh, ls::bf16), ls::cast(b, ls::bf16)),
      "lstm", "bf16");
  const ls::Tensor y = ls::zeros({5, 2, 5});
  EXPECT_NO_THROW(ls::lstm_layer_backward(x, s, s, wi, wh, b, y, y));
  EXPECT_LS_ERROR(ls::lstm_layer_backward(x, s, s, wi, wh, b, y, ls::zeros({3, 2, 5})),
                  "lstm_backward", "operand 7", "[5, 2, 5]");
  // A GRU layer: three gates' weights, the bias of four (r, z, and n's two).
  const ls::Tensor gi = ls::zeros({15, 4}), gh = ls::zeros({15, 5}), gy = ls::zeros({4, 2, 5});
  EXPECT_NO_THROW(ls::gru_layer(x, s, gi, gh, b));
  EXPECT_NO_THROW(ls::gru_layer_backward(x, s, gi, gh, b, gy, gy));
  EXPECT_LS_ERROR(ls::gru_layer(x, s, wi, gh, b), "gru", "operand 2", "[20, 4]",
                  "expected [15, 4]");
  EXPECT_LS_ERROR(ls::gru_layer(x, s, gi, gh, ls::zeros({15})), "gru", "operand 4", "[20]");
  EXPECT_LS_ERROR(ls::gru_layer(x, ls::zeros({2, 5}, ls::f64), gi, gh, b), "gru", "one dtype");
  EXPECT_LS_ERROR(ls::gru_layer_backward(x, s, gi, gh, b, y, y), "gru_backward", "operand 5",
                  "[4, 2, 5]");
}

TEST_F(OpsErrors, Pooling) {
  const ls::Tensor x = ls::zeros({1, 1, 4, 4});
  EXPECT_LS_ERROR(ls::max_pool2d(x, {.kernel = {2, 2}, .padding = {2, 0}}), "max_pool2d", "padding",
                  "half");
  EXPECT_LS_ERROR(ls::avg_pool2d(x, {.kernel = {3, 3}, .padding = {1, 2}}), "avg_pool2d",
                  "padding");
  EXPECT_LS_ERROR(ls::max_pool2d_with_indices(x, {.kernel = {1, 1}, .padding = {1, 1}}),
                  "max_pool2d", "padding");
  EXPECT_LS_ERROR(ls::max_pool2d(ls::zeros({1, 4, 4}), {}), "max_pool2d", "[1, 4, 4]", "rank 4");
  EXPECT_LS_ERROR(ls::max_pool2d(x, {.kernel = {5, 5}}), "max_pool2d", "[1, 1, 4, 4]", "kernel");
  EXPECT_LS_ERROR(ls::max_pool2d(x, {.kernel = {0, 2}}), "max_pool2d", "kernel");
  EXPECT_LS_ERROR(ls::avg_pool2d(x, {.kernel = {2, 2}, .stride = {-1, 1}}), "avg_pool2d", "stride");
  EXPECT_LS_ERROR(ls::avg_pool2d(ls::zeros({1, 1, 4, 4}, ls::i64), {}), "avg_pool2d", "i64");
  EXPECT_LS_ERROR(ls::max_pool2d(ls::zeros({1, 1, 4, 4}, ls::boolean), {}), "max_pool2d", "bool");
  const ls::Pool2dOptions o{.kernel = {2, 2}};
  EXPECT_LS_ERROR(
      ls::max_pool2d_backward(ls::zeros({1, 1, 2, 2}), ls::zeros({1, 1, 2, 2}), {1, 1, 4, 4}, o),
      "max_pool2d_backward", "i64");
  EXPECT_LS_ERROR(ls::max_pool2d_backward(ls::zeros({1, 1, 2, 2}), ls::zeros({1, 1, 2, 2}, ls::i64),
                                          {1, 1, 6, 6}, o),
                  "max_pool2d_backward", "[1, 1, 2, 2]", "[1, 1, 3, 3]");
  EXPECT_LS_ERROR(ls::avg_pool2d_backward(ls::zeros({1, 1, 3, 3}), {1, 1, 4, 4}, o),
                  "avg_pool2d_backward", "[1, 1, 3, 3]", "[1, 1, 2, 2]");
}

TEST_F(OpsErrors, CreationAndReads) {
  EXPECT_LS_ERROR(ls::from_vector<float>({1, 2, 3}, {2, 2}), "from_vector", "3", "[2, 2]");
  EXPECT_LS_ERROR(ls::from_vector<int64_t>({}, {-1}), "from_vector", "negative");
  EXPECT_LS_ERROR(ls::from_blob(nullptr, {2}, ls::f32, ls::default_device()), "from_blob", "null");
  EXPECT_LS_ERROR(ls::zeros({2, -1}), "full", "[2, -1]");
  EXPECT_LS_ERROR(ls::rand({-1}), "rand", "[-1]");
  EXPECT_LS_ERROR(ls::rand({2}, ls::i64), "rand", "i64");
  EXPECT_LS_ERROR(ls::randn({2}, ls::i32), "randn", "i32");
  EXPECT_LS_ERROR(ls::randint(3, 3, {2}), "randint", "[3, 3)");
  EXPECT_LS_ERROR(ls::randint(5, 1, {2}), "randint", "[5, 1)");
  EXPECT_LS_ERROR(ls::randint(0, 5, {2}, ls::f32), "randint", "f32");
  EXPECT_LS_ERROR(ls::randint(0, 5, {2}, ls::boolean), "randint", "bool");
  EXPECT_LS_ERROR(ls::randint(0, int64_t{1} << 40, {2}, ls::i32), "randint", "i32");
  EXPECT_LS_ERROR(ls::randint(-(int64_t{1} << 40), 0, {2}, ls::i32), "randint", "i32");
  EXPECT_LS_ERROR(ls::arange(0, 5, 0), "arange", "step");
  EXPECT_LS_ERROR(ls::arange(3, ls::boolean), "arange", "bool");
  EXPECT_LS_ERROR(ls::arange(0, std::numeric_limits<double>::infinity(), 1, ls::f64), "arange");
  EXPECT_LS_ERROR(ls::arange(0, 1e30, 1, ls::f64), "arange");

  const ls::Tensor m = ls::zeros({2, 3});
  EXPECT_LS_ERROR(m.item<float>(), "item", "6", "[2, 3]");
  EXPECT_LS_ERROR(ls::zeros({0}).item<float>(), "item", "0");
  EXPECT_LS_ERROR(ls::zeros({2}, ls::f64).to_vector<float>(), "to_vector", "f64", "f32");
  EXPECT_LS_ERROR(ls::zeros({2}, ls::i32).to_vector<int64_t>(), "to_vector", "i32", "i64");
  EXPECT_LS_ERROR(ls::zeros({2}).to_vector<bool>(), "to_vector", "f32", "bool");
  EXPECT_LS_ERROR(ls::zeros({2}, ls::boolean).to_vector<float>(), "to_vector", "bool");
}

TEST_F(OpsErrors, EmptyTensorHandle) {
  const ls::Tensor e;
  const ls::Tensor x = ls::zeros({2});
  EXPECT_FALSE(e.defined());
  EXPECT_LS_ERROR(e.shape(), "empty");
  EXPECT_LS_ERROR(e.dtype(), "empty");
  EXPECT_LS_ERROR(e.numel(), "empty");
  EXPECT_LS_ERROR(e.item<float>(), "item", "empty");
  EXPECT_LS_ERROR(e.to_vector<float>(), "to_vector", "empty");
  EXPECT_LS_ERROR(e.to_string(), "empty");
  EXPECT_LS_ERROR(ls::add(e, x), "add", "empty");
  EXPECT_LS_ERROR(x + e, "add", "empty");
  EXPECT_LS_ERROR(e * 2, "mul", "empty");
  EXPECT_LS_ERROR(-e, "neg", "empty");
  EXPECT_LS_ERROR(ls::exp(e), "exp", "empty");
  EXPECT_LS_ERROR(ls::isfinite(e), "isfinite", "empty");
  EXPECT_LS_ERROR(ls::square(e), "square", "empty");
  EXPECT_LS_ERROR(ls::sum(e), "sum", "empty");
  EXPECT_LS_ERROR(ls::argmax(e), "argmax", "empty");
  EXPECT_LS_ERROR(ls::mean(e), "mean", "empty");
  EXPECT_LS_ERROR(ls::softmax(e, 0), "softmax", "empty");
  EXPECT_LS_ERROR(ls::logsumexp(e, {0}), "logsumexp", "empty");
  EXPECT_LS_ERROR(ls::clamp(e, 0, 1), "clamp", "empty");
  EXPECT_LS_ERROR(ls::cast(e, ls::f64), "cast", "empty");
  EXPECT_LS_ERROR(ls::where(e, x, x), "where", "empty");
  EXPECT_LS_ERROR(ls::reshape(e, {2}), "reshape", "empty");
  EXPECT_LS_ERROR(ls::permute(e, {0}), "permute", "empty");
  EXPECT_LS_ERROR(ls::expand(e, {2}), "expand", "empty");
  EXPECT_LS_ERROR(ls::slice(e, 0, 0, 1), "slice", "empty");
  EXPECT_LS_ERROR(ls::concat({x, e}, 0), "concat", "empty");
  EXPECT_LS_ERROR(ls::pad(e, {{1, 1}}), "pad", "empty");
  EXPECT_LS_ERROR(ls::gather(x, 0, e), "gather", "empty");
  EXPECT_LS_ERROR(ls::matmul(e, x), "matmul", "empty");
  EXPECT_LS_ERROR(ls::conv2d(e, e), "conv2d", "empty");
  EXPECT_LS_ERROR(ls::max_pool2d(e, {}), "max_pool2d", "empty");
  EXPECT_LS_ERROR(ls::zeros_like(e), "full_like", "empty");
  ls::Tensor target;
  EXPECT_LS_ERROR(target.add_(x), "add", "empty");
  EXPECT_LS_ERROR(target.copy_(x), "copy_", "empty");
  EXPECT_LS_ERROR(ls::zeros({2}).copy_(e), "copy_", "empty");
}

}  // namespace
