// Autocast (lockstep/autocast.h): which ops run in bf16 (visible in the graph's IR), f32 master
// weights and gradients, one compile per step shape, bit-exact rollback of the f32 weights, the
// step option, and the refusals. Values are checked against the same computation written out by
// hand with explicit casts (and, for training, against f32 within bf16's precision).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <lockstep/lockstep.h>

namespace ls = lockstep;
using ::testing::HasSubstr;
using ::testing::Not;

namespace {

int64_t counter(const char* name) { return ls::metrics::counter(name); }

// Lines of the last graph's IR that record `op` (e.g. "matmul(").
std::vector<std::string> ir_lines(const std::string& op) {
  std::vector<std::string> out;
  const std::string text = ls::debug::last_graph_text();
  size_t at = 0;
  while (at < text.size()) {
    const size_t end = text.find('\n', at);
    const std::string line = text.substr(at, end == std::string::npos ? end : end - at);
    if (line.find("= " + op) != std::string::npos) out.push_back(line);
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return out;
}

TEST(Autocast, MatmulAndConvolutionRunInBf16AndReductionsInF32) {
  for (const char* dev : {"ref", "cpu"}) {
    SCOPED_TRACE(dev);
    const ls::Device d = ls::parse_device(dev);
    const ls::Tensor x = ls::randn({4, 8}, {ls::f32, d}), w = ls::randn({8, 3}, {ls::f32, d});
    const ls::Tensor img = ls::randn({2, 3, 6, 6}, {ls::f32, d});
    const ls::Tensor k = ls::randn({4, 3, 3, 3}, {ls::f32, d});
    ls::Tensor y, s, sm, lsm, m, c, e;
    {
      auto scope = ls::autocast(ls::bf16);
      ASSERT_EQ(ls::autocast_dtype(), ls::bf16);
      y = ls::matmul(x, w);
      s = ls::sum(y);
      m = ls::mean(y, {1});
      sm = ls::softmax(y, 1);
      lsm = ls::log_softmax(y, 1);
      c = ls::conv2d(img, k, {.padding = {1, 1}});
      e = ls::exp(y);  // everything else: its operand's dtype
    }
    EXPECT_FALSE(ls::autocast_dtype().has_value());
    EXPECT_EQ(y.dtype(), ls::bf16);
    EXPECT_EQ(c.dtype(), ls::bf16);
    EXPECT_EQ(e.dtype(), ls::bf16);
    for (const ls::Tensor* t : {&s, &m, &sm, &lsm}) EXPECT_EQ(t->dtype(), ls::f32);
    // The same, written with explicit casts: the products of bf16-rounded operands accumulated
    // in f32 and rounded once.
    const ls::Tensor xb = ls::cast(x, ls::bf16), wb = ls::cast(w, ls::bf16);
    const ls::Tensor want_y = ls::matmul(xb, wb);
    EXPECT_EQ(y.to_vector<float>(), want_y.to_vector<float>());
    EXPECT_EQ(sm.to_vector<float>(), ls::softmax(ls::cast(want_y, ls::f32), 1).to_vector<float>());
    const ls::Tensor want_c =
        ls::conv2d(ls::cast(img, ls::bf16), ls::cast(k, ls::bf16), {.padding = {1, 1}});
    const std::vector<float> got_c = c.to_vector<float>(), exp_c = want_c.to_vector<float>();
    ASSERT_EQ(got_c.size(), exp_c.size());
    for (size_t i = 0; i < got_c.size(); ++i)
      EXPECT_NEAR(got_c[i], exp_c[i], std::abs(exp_c[i]) * 0x1p-7f + 1e-6f) << i;
    // The graph says so: the products take bf16 operands (cast from the f32 inputs).
    ls::sync();
    ls::wait();
    {
      auto scope = ls::autocast(ls::bf16);
      (void)ls::matmul(x, w).sum().item<float>();
    }
    const std::vector<std::string> mm = ir_lines("mat_mul(");
    ASSERT_EQ(mm.size(), 1u) << ls::debug::last_graph_text();
    EXPECT_THAT(mm[0], HasSubstr("bf16")) << mm[0];
    EXPECT_EQ(ir_lines("cast(").size(), 3u) << ls::debug::last_graph_text();  // x, w, and sum's f32
  }
}

TEST(Autocast, APermutedOperandIsCastBeforeItsPermute) {
  // linear's transposed weight: cast to bf16 first, then permuted (half the bytes to move, and
  // the product reads the transpose through its strides); the same values and gradients as the
  // cast of the permute.
  for (const char* dev : {"ref", "cpu"}) {
    SCOPED_TRACE(dev);
    const ls::Device d = ls::parse_device(dev);
    const ls::Tensor x = ls::randn({2, 5, 8}, {ls::f32, d});
    ls::Tensor w = ls::randn({6, 8}, {ls::f32, d});
    w.set_requires_grad();
    ls::Tensor y;
    {
      auto scope = ls::autocast(ls::bf16);
      y = ls::matmul(x, ls::transpose(w, 0, 1));
      (void)y.sum().item<float>();
    }
    const std::vector<std::string> casts = ir_lines("cast(");
    const std::vector<std::string> permutes = ir_lines("permute(");
    ASSERT_EQ(permutes.size(), 1u) << ls::debug::last_graph_text();
    EXPECT_THAT(permutes[0], HasSubstr("bf16[8, 6]")) << permutes[0];
    EXPECT_EQ(casts.size(), 3u) << ls::debug::last_graph_text();  // x, w, and sum's f32
    ls::Tensor loss;
    {
      auto scope = ls::autocast(ls::bf16);
      loss = ls::sum(ls::square(ls::cast(ls::matmul(x, ls::transpose(w, 0, 1)), ls::f32)));
    }
    loss.backward();
    const std::vector<float> got = w.grad().to_vector<float>();
    w.set_grad(ls::Tensor());
    const ls::Tensor want_y =
        ls::matmul(ls::cast(x, ls::bf16), ls::cast(ls::transpose(w, 0, 1), ls::bf16));
    EXPECT_EQ(y.to_vector<float>(), want_y.to_vector<float>());
    ls::sum(ls::square(ls::cast(want_y, ls::f32))).backward();
    EXPECT_EQ(got, w.grad().to_vector<float>());
  }
}

TEST(Autocast, NestedScopesAndRefusals) {
  {
    auto on = ls::autocast(ls::bf16);
    {
      auto off = ls::autocast(ls::f32);
      EXPECT_FALSE(ls::autocast_dtype().has_value());
      EXPECT_EQ(ls::matmul(ls::ones({2, 2}), ls::ones({2, 2})).dtype(), ls::f32);
    }
    EXPECT_EQ(ls::autocast_dtype(), ls::bf16);
  }
  try {
    auto bad = ls::autocast(ls::i64);
    FAIL() << "autocast to i64 was accepted";
  } catch (const ls::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("autocast"));
    EXPECT_THAT(e.what(), HasSubstr("i64"));
  }
  EXPECT_FALSE(ls::autocast_dtype().has_value());
  EXPECT_THROW(ls::step([] {}, {.autocast = ls::i32}), ls::Error);
  EXPECT_FALSE(ls::autocast_dtype().has_value());
  EXPECT_FALSE(ls::in_step());
  // Integers stay integers under autocast.
  auto on = ls::autocast(ls::bf16);
  EXPECT_EQ(ls::matmul(ls::ones({2, 2}, ls::i64), ls::ones({2, 2}, ls::i64)).dtype(), ls::i64);
}

// A scope ended on another thread (a Python context exited there) ends it for the thread that
// opened it, which no longer records in bf16; scopes it opened inside stay as they are.
TEST(Autocast, AScopeEndedOnAnotherThreadEndsOnItsOwnToo) {
  auto outer = std::make_unique<ls::AutocastScope>(ls::bf16);
  EXPECT_EQ(ls::autocast_dtype(), ls::bf16);
  std::thread([&] {
    EXPECT_FALSE(ls::autocast_dtype().has_value());  // never this thread's
    outer.reset();
    EXPECT_FALSE(ls::autocast_dtype().has_value());
  }).join();
  EXPECT_FALSE(ls::autocast_dtype().has_value());
  EXPECT_EQ(ls::matmul(ls::ones({2, 2}), ls::ones({2, 2})).dtype(), ls::f32);
  // Out of order: the enclosing bf16 scope ends elsewhere while an inner f32 one is open here.
  auto on = std::make_unique<ls::AutocastScope>(ls::bf16);
  {
    auto off = ls::autocast(ls::f32);
    auto inner_on = std::make_unique<ls::AutocastScope>(ls::bf16);
    std::thread([&] { on.reset(); }).join();
    EXPECT_EQ(ls::autocast_dtype(), ls::bf16);  // the innermost open scope decides
    inner_on.reset();
    EXPECT_FALSE(ls::autocast_dtype().has_value());
  }
  EXPECT_FALSE(ls::autocast_dtype().has_value());
}

// A small conv net with batch norm, trained by SGD with momentum under autocast.
struct Net {
  std::shared_ptr<ls::nn::Sequential> seq = std::make_shared<ls::nn::Sequential>();
  Net() {
    seq
        ->emplace<ls::nn::Conv2d>(ls::nn::Conv2dSpec{
            .in_channels = 3, .out_channels = 16, .padding = {1, 1}, .bias = false})
        .emplace<ls::nn::BatchNorm2d>(16)
        .emplace<ls::nn::ReLU>()
        .emplace<ls::nn::Flatten>()
        .emplace<ls::nn::Linear>(16 * 4 * 4, 5);
  }
};

TEST(Autocast, TrainingKeepsF32MasterWeightsCompilesOnceAndRollsBackExactly) {
  for (const char* dev : {"ref", "cpu"}) {
    SCOPED_TRACE(dev);
    const ls::Device d = ls::parse_device(dev);
    ls::manual_seed(7);
    Net net, ref_net;
    net.seq->to(d);
    ref_net.seq->load_state_dict(net.seq->state_dict());
    ref_net.seq->to(d);
    const ls::Tensor x = ls::randn({8, 3, 4, 4}, {ls::f32, d});
    const ls::Tensor t = ls::from_vector<int64_t>({0, 1, 2, 3, 4, 0, 1, 2}).to(d);
    ls::optim::SGD opt(net.seq->parameters(), {.lr = 0.05, .momentum = 0.9});
    ls::optim::SGD ref_opt(ref_net.seq->parameters(), {.lr = 0.05, .momentum = 0.9});
    std::vector<float> losses, f32_losses;
    int64_t compiles_before = 0;
    for (int i = 0; i < 4; ++i) {
      if (i == 2) {
        ls::wait();
        compiles_before = counter("compiles");
      }
      ls::step(
          [&] {
            opt.zero_grad();
            ls::Tensor out = net.seq->forward(x);
            EXPECT_EQ(out.dtype(), ls::bf16);  // the linear layer's product
            ls::Tensor loss = ls::nn::cross_entropy(out, t);
            EXPECT_EQ(loss.dtype(), ls::f32);
            loss.backward();
            opt.step();
            ls::add_step_closure([&losses, loss] { losses.push_back(loss.item<float>()); });
          },
          {.autocast = ls::bf16});
      ls::step([&] {
        ref_opt.zero_grad();
        ls::Tensor loss = ls::nn::cross_entropy(ref_net.seq->forward(x), t);
        loss.backward();
        ref_opt.step();
        ls::add_step_closure([&f32_losses, loss] { f32_losses.push_back(loss.item<float>()); });
      });
    }
    ls::wait();
    // From the third step on (the first two create the gradients and the momentum), every
    // step hits the compile cache.
    EXPECT_EQ(counter("compiles") - compiles_before, 0);
    for (const ls::Tensor& p : net.seq->parameters()) {
      EXPECT_EQ(p.dtype(), ls::f32);
      EXPECT_EQ(p.grad().dtype(), ls::f32);
    }
    for (const auto& [name, b] : net.seq->named_buffers())
      if (name.find("running") != std::string::npos) {
        EXPECT_EQ(b.dtype(), ls::f32) << name;
      }
    ASSERT_EQ(losses.size(), 4u);
    for (size_t i = 0; i < losses.size(); ++i)
      EXPECT_NEAR(losses[i], f32_losses[i], 0.03 * std::abs(f32_losses[i]) + 1e-3) << i;
    EXPECT_LT(losses.back(), losses.front());
    // A failing step under autocast restores the f32 weights and buffers bit for bit.
    const ls::nn::NamedTensors before = net.seq->state_dict();
    std::vector<std::vector<double>> values;  // f32 and i64 values, exactly
    for (const auto& [name, v] : before) values.push_back(ls::cast(v, ls::f64).to_vector<double>());
    EXPECT_THROW(ls::step(
                     [&] {
                       opt.zero_grad();
                       ls::nn::cross_entropy(net.seq->forward(x), t).backward();
                       opt.step();
                       throw std::runtime_error("abandon the step");
                     },
                     {.autocast = ls::bf16}),
                 std::runtime_error);
    EXPECT_FALSE(ls::autocast_dtype().has_value());
    const ls::nn::NamedTensors after = net.seq->state_dict();
    ASSERT_EQ(after.size(), before.size());
    for (size_t i = 0; i < after.size(); ++i) {
      EXPECT_EQ(after[i].second.dtype(), before[i].second.dtype());
      EXPECT_EQ(ls::cast(after[i].second, ls::f64).to_vector<double>(), values[i])
          << after[i].first;
    }
  }
}

TEST(Autocast, CheckpointsStayF32AndLoadIntoEitherPrecision) {
  ls::manual_seed(11);
  Net net;
  ls::optim::SGD opt(net.seq->parameters(), {.lr = 0.05, .momentum = 0.9});
  const ls::Tensor x = ls::randn({4, 3, 4, 4});
  const ls::Tensor t = ls::from_vector<int64_t>({0, 1, 2, 3});
  auto train_step = [&](Net& n, ls::optim::SGD& o, std::optional<ls::DType> precision) {
    float out = 0;
    ls::step(
        [&] {
          o.zero_grad();
          ls::Tensor loss = ls::nn::cross_entropy(n.seq->forward(x), t);
          loss.backward();
          o.step();
          ls::add_step_closure([&out, loss] { out = loss.item<float>(); });
        },
        {.autocast = precision});
    ls::wait();
    return out;
  };
  for (int i = 0; i < 2; ++i) train_step(net, opt, ls::bf16);
  const std::string path = ::testing::TempDir() + "/autocast_checkpoint.safetensors";
  ls::save_checkpoint(path, *net.seq, &opt);
  // Its floating-point tensors (weights, buffers, momentum) are f32, as without autocast.
  for (const auto& [name, v] : ls::io::load_safetensors(path).tensors)
    if (ls::is_floating(v.dtype())) {
      EXPECT_EQ(v.dtype(), ls::f32) << name;
    }
  // The checkpoint continues in bf16 and in f32 alike, from the same weights.
  for (std::optional<ls::DType> precision :
       {std::optional<ls::DType>(ls::bf16), std::optional<ls::DType>()}) {
    Net resumed;
    ls::optim::SGD resumed_opt(resumed.seq->parameters(), {.lr = 0.05, .momentum = 0.9});
    ls::load_checkpoint(path, *resumed.seq, &resumed_opt);
    const float loss = train_step(resumed, resumed_opt, precision);
    EXPECT_TRUE(std::isfinite(loss));
    for (const ls::Tensor& p : resumed.seq->parameters()) EXPECT_EQ(p.dtype(), ls::f32);
  }
}

TEST(Autocast, StepGuardOptionAndBackwardInForwardDtypes) {
  ls::Tensor w = ls::randn({3, 3}).set_requires_grad();
  {
    ls::Step s({.autocast = ls::bf16});
    EXPECT_EQ(ls::autocast_dtype(), ls::bf16);
    ls::Tensor y = ls::matmul(ls::ones({2, 3}), w);
    EXPECT_EQ(y.dtype(), ls::bf16);
    ls::sum(y).backward();
  }
  EXPECT_FALSE(ls::autocast_dtype().has_value());
  EXPECT_EQ(w.grad().dtype(), ls::f32);
  // Each column's gradient: the bf16 sum of two ones.
  EXPECT_EQ(w.grad().to_vector<float>(), std::vector<float>(9, 2.0f));
  // A graph recorded in f32 and differentiated inside an autocast scope stays f32.
  w.set_grad(ls::Tensor());
  ls::Tensor loss = ls::sum(ls::matmul(ls::full({2, 3}, 0.1), w));
  {
    auto scope = ls::autocast(ls::bf16);
    loss.backward();
  }
  (void)w.grad().sum().item<float>();
  EXPECT_THAT(ls::debug::last_graph_text(), Not(HasSubstr("bf16")));
}

// An f32 weight used at every time step under autocast (an RNN's): each use casts it to bf16,
// and its gradient is one bf16 product over all the steps' rows, widened once, not a product,
// a cast and a transpose per step and their f32 sums. Values against the f32 gradient on the
// ref backend, within bf16's precision.
TEST(Autocast, AWeightUsedAtEveryStepGetsItsGradientFromOneBf16Product) {
  const int kSteps = 6;
  std::vector<float> wv(16), hv(12);
  for (size_t i = 0; i < wv.size(); ++i) wv[i] = 0.07f * static_cast<float>(i % 7) - 0.2f;
  for (size_t i = 0; i < hv.size(); ++i) hv[i] = 0.25f * static_cast<float>(i % 5) - 0.5f;
  std::vector<std::vector<float>> grads;
  for (ls::Device device : {ls::default_device(), ls::Device{ls::DeviceKind::Ref, 0}}) {
    const bool bf16 = device == ls::default_device();
    ls::Tensor w = ls::from_vector(wv, {4, 4}, device).set_requires_grad();
    ls::step(
        [&] {
          ls::Tensor h = ls::from_vector(hv, {3, 4}, device), loss;
          for (int t = 0; t < kSteps; ++t) {
            h = ls::tanh(ls::nn::linear(h, w, ls::Tensor()));
            const ls::Tensor term = ls::sum(ls::cast(h, ls::f32) * static_cast<double>(t + 1));
            loss = t == 0 ? term : loss + term;
          }
          loss.backward();
        },
        {.autocast = bf16 ? std::optional<ls::DType>(ls::bf16) : std::nullopt});
    if (bf16) {
      const std::string graph = ls::debug::last_graph_text();
      // Forward one per step, the gradients of the steps' inputs one each but the first's, and
      // one for the weight: against a product per step for the weight too.
      EXPECT_LE(ir_lines("mat_mul(").size(), static_cast<size_t>(2 * kSteps)) << graph;
      EXPECT_THAT(graph, HasSubstr("bf16")) << graph;
    }
    grads.push_back(w.grad().to_vector<float>());
  }
  ASSERT_EQ(grads[0].size(), grads[1].size());
  double scale = 0;
  for (float g : grads[1]) scale = std::max(scale, std::abs(static_cast<double>(g)));
  ASSERT_GT(scale, 0.1);
  for (size_t i = 0; i < grads[0].size(); ++i)
    EXPECT_NEAR(grads[0][i], grads[1][i], 0.03 * scale) << i;
}

TEST(Autocast, BatchNormOfBf16IsComputedInF32AndGivenBackInBf16) {
  ls::manual_seed(3);
  const ls::Tensor x = ls::cast(ls::randn({4, 16, 3, 3}) * 3 + 1, ls::bf16);
  ls::nn::BatchNorm2d bn(16), bn32(16);
  {
    ls::NoGrad no_grad;
    bn.weight.copy_(ls::rand({16}) + 0.5);
  }
  bn32.load_state_dict(bn.state_dict());
  const ls::Tensor y = bn.forward(x);
  const ls::Tensor want = bn32.forward(ls::cast(x, ls::f32));
  EXPECT_EQ(y.dtype(), ls::bf16);
  EXPECT_EQ(bn.running_mean.dtype(), ls::f32);
  EXPECT_EQ(y.to_vector<float>(), ls::cast(want, ls::bf16).to_vector<float>());
  EXPECT_EQ(bn.running_var.to_vector<float>(), bn32.running_var.to_vector<float>());
  // An input of another dtype than its f32 parameters is still refused, with the fix.
  try {
    (void)bn.forward(ls::ones({2, 16, 2, 2}, ls::f64));
    FAIL() << "f64 input with f32 statistics was accepted";
  } catch (const ls::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("running_mean is f32[16]"));
  }
}

}  // namespace

namespace {

// The recurrent layers run in f32 under autocast (one oneDNN op per layer): the same values as
// outside it, from an f32 input; a bf16 input is read as f32.
TEST(Autocast, RecurrentLayersRunInF32) {
  ls::manual_seed(3);
  ls::nn::LSTM lstm({.input_size = 6, .hidden_size = 5, .num_layers = 2, .bidirectional = true});
  ls::nn::GRU gru({.input_size = 6, .hidden_size = 4});
  const ls::Tensor x = ls::randn({7, 3, 6});
  const std::vector<float> lstm_f32 = lstm(x).to_vector<float>();
  const std::vector<float> gru_f32 = gru(x).to_vector<float>();
  ls::Tensor a, g, b;
  {
    auto scope = ls::autocast(ls::bf16);
    a = lstm(x);
    g = gru(x);
    b = lstm(ls::cast(x, ls::bf16));
  }
  EXPECT_EQ(a.dtype(), ls::f32);
  EXPECT_EQ(a.to_vector<float>(), lstm_f32);
  EXPECT_EQ(g.to_vector<float>(), gru_f32);
  EXPECT_EQ(b.dtype(), ls::f32);
  EXPECT_EQ(b.to_vector<float>(),
            lstm(ls::cast(ls::cast(x, ls::bf16), ls::f32)).to_vector<float>());
  EXPECT_EQ(ir_lines("lstm(").size(), 4u) << ls::debug::last_graph_text();  // 2 layers x 2 dirs
}

}  // namespace
