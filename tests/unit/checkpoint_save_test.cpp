// What save_checkpoint writes, load_checkpoint accepts: a training state that a resume would
// refuse (here Adam's second moments overflowed to +inf by gradients past 1.8e19 while the loss
// stays finite) is refused when saved, before anything is written, and the last good checkpoint
// at the path is kept; inside a step as outside.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>

#include <lockstep/lockstep.h>

namespace ls = lockstep;
using ::testing::HasSubstr;

namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / name).string();
}

// One Adam step of a linear layer; `scale` multiplies the loss (and so every gradient).
void train_step(ls::nn::Linear& model, ls::optim::Adam& opt, double scale) {
  opt.zero_grad();
  ls::Tensor loss = ls::mean(model(ls::ones({4, 3}))) * scale;
  loss.backward();
  opt.step();
}

}  // namespace

TEST(CheckpointSave, AStateAResumeWouldRefuseIsNotSavedAndTheLastGoodFileIsKept) {
  const std::string path = temp_path("lockstep-save-refused.safetensors");
  for (bool in_step : {false, true}) {
    SCOPED_TRACE(in_step ? "saved inside a step" : "saved outside a step");
    ls::manual_seed(3);
    ls::nn::Linear model(3, 2);
    ls::optim::Adam opt(model.parameters(), {.lr = 1e-3});
    train_step(model, opt, 1.0);
    ls::save_checkpoint(path, model, &opt);  // a good file
    train_step(model, opt, 1e21);            // exp_avg_sq overflows to +inf; weights stay finite
    for (const ls::Tensor& p : model.parameters())
      for (float v : p.to_vector<float>()) ASSERT_TRUE(std::isfinite(v));
    try {
      if (in_step) {
        ls::step([&] { ls::save_checkpoint(path, model, &opt); });
        ls::wait();
      } else {
        ls::save_checkpoint(path, model, &opt);
      }
      FAIL() << "saved a state its own resume refuses";
    } catch (const ls::Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("not saving"));
      EXPECT_THAT(e.what(), HasSubstr("exp_avg_sq"));
      EXPECT_THAT(e.what(), HasSubstr("inf"));
    }
    // The last good file is still there and loads.
    ls::nn::Linear resumed(3, 2);
    ls::optim::Adam resumed_opt(resumed.parameters(), {.lr = 1e-3});
    EXPECT_NO_THROW(ls::load_checkpoint(path, resumed, &resumed_opt));
  }
  std::filesystem::remove(path);
}
