// Run-time rollback (DESIGN.md section 1, "Step"): a step whose program fails while it runs
// leaves every tensor it changed at its value before the step, bit for bit, even parameters the
// program updated in place; the error names the failing op's user line; training goes on.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <lockstep/lockstep.h>
#include "unit/ops_test_util.h"

namespace ls = lockstep;
using ::testing::HasSubstr;

namespace {

using ops_test::bits;  // bit patterns: "restored" means bit for bit

using ops_test::Delta;

// Every float value of the model and optimizer, and the generator, as bits.
std::map<std::string, std::vector<uint32_t>> snapshot(ls::nn::Module& model,
                                                      ls::optim::Optimizer& opt) {
  std::map<std::string, std::vector<uint32_t>> out;
  for (auto& [name, t] : model.state_dict()) out["model." + name] = bits(t);
  for (auto& [name, t] : opt.state_dict())
    if (t.dtype() == ls::DType::F32) out["optimizer." + name] = bits(t);
  const std::vector<int64_t> g = ls::generator_state().to_vector<int64_t>();
  out["generator"] = {static_cast<uint32_t>(g[1]), static_cast<uint32_t>(g[1] >> 32)};
  return out;
}

// A classifier large enough that SGD updates its parameters in place.
struct Classifier {
  ls::nn::Sequential model;
  std::unique_ptr<ls::optim::SGD> opt;
  Classifier() {
    ls::manual_seed(3);
    model.add(std::make_shared<ls::nn::Linear>(64, 512));
    model.add(std::make_shared<ls::nn::ReLU>());
    model.add(std::make_shared<ls::nn::Linear>(512, 10));
    opt = std::make_unique<ls::optim::SGD>(model.parameters(),
                                           ls::optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
  }
  ls::Tensor train_step(const std::vector<int64_t>& labels, int* line = nullptr) {
    ls::Tensor loss;
    ls::step([&] {
      ls::Tensor x = ls::randn({static_cast<int64_t>(labels.size()), 64});
      opt->zero_grad();
      if (line) *line = __LINE__ + 1;
      loss = ls::nn::cross_entropy(model(x), ls::from_vector<int64_t>(labels));
      loss.backward();
      opt->step();
    });
    return loss;
  }
};

const std::vector<int64_t> kGood = {1, 2, 3, 4, 5, 6, 7, 8};
const std::vector<int64_t> kBad = {1, 2, 3, 4, 5, 6, 70, 8};  // a label out of range

}  // namespace

TEST(RunTimeRollback, ABadLabelLeavesTheModelAsItWasAndTrainingGoesOn) {
  Classifier c;
  Delta in_place("in_place_outputs");
  c.train_step(kGood);
  c.train_step(kGood);
  ls::wait();
  EXPECT_GT(in_place.get(), 0) << "the parameters are updated in place";
  const auto before = snapshot(c.model, *c.opt);
  Delta rollbacks("run_time_rollbacks");
  int line = 0;
  ls::Tensor bad_loss = c.train_step(kBad, &line);
  std::string message;
  try {
    (void)bad_loss.item<float>();
  } catch (const ls::Error& e) {
    message = e.what();
  }
  EXPECT_THAT(message, HasSubstr("index 70 is out of range"));
  EXPECT_THAT(message, HasSubstr("run_time_rollback_test.cpp:" + std::to_string(line)))
      << "the failing op's line, not the read's";
  EXPECT_EQ(rollbacks.get(), 1);
  EXPECT_EQ(snapshot(c.model, *c.opt), before) << "bit for bit, the state before the bad step";
  // Training goes on, as if the bad batch had never been seen.
  c.train_step(kGood);
  const auto resumed = snapshot(c.model, *c.opt);
  Classifier reference;
  for (int i = 0; i < 3; ++i) reference.train_step(kGood);
  EXPECT_EQ(snapshot(reference.model, *reference.opt), resumed);
}

TEST(RunTimeRollback, StepsTracedAfterAFailedOneAreRolledBackToo) {
  // Steps 2 and 3 are traced (and queued) before step 1's failure is seen; they read its
  // poisoned outputs, so they fail as well, and all three are undone.
  Classifier c;
  c.train_step(kGood);
  ls::wait();
  const auto before = snapshot(c.model, *c.opt);
  Delta rollbacks("run_time_rollbacks");
  c.train_step(kBad);
  c.train_step(kGood);
  ls::Tensor last = c.train_step(kGood);
  EXPECT_THROW(ls::wait(), ls::Error);
  EXPECT_EQ(rollbacks.get(), 3);
  EXPECT_EQ(snapshot(c.model, *c.opt), before);
  EXPECT_THROW((void)last.item<float>(), ls::Error);  // made by a failed step: poisoned
  EXPECT_NO_THROW((void)c.train_step(kGood).item<float>());
}

TEST(RunTimeRollback, IndexChecksRunBeforeAnyInPlaceUpdate) {
  // The gather reads the updated parameter, so it runs after the in-place update; its index is
  // checked first, before anything is overwritten: nothing has to be copied aside.
  ls::Tensor p = ls::arange(1 << 16).to(ls::DType::F32);
  ls::Tensor index = ls::from_vector<int64_t>({0, 1, 1 << 20});
  ls::sync();
  ls::wait();
  const std::vector<uint32_t> p0 = bits(p);
  Delta copies("in_place_copies"), in_place("in_place_outputs");
  ls::Tensor picked;
  ls::step([&] {
    p.mul_(0.5);
    picked = ls::gather(p, 0, index);
  });
  EXPECT_THROW(ls::wait(), ls::Error);
  EXPECT_EQ(bits(p), p0);
  EXPECT_EQ(copies.get(), 0);
  // With a good index the same program updates in place.
  index = ls::from_vector<int64_t>({0, 1, 2});
  ls::sync();
  ls::step([&] {
    p.mul_(0.5);
    picked = ls::gather(p, 0, index);
  });
  EXPECT_EQ(picked.to_vector<float>(), (std::vector<float>{0, 0.5f, 1}));
  EXPECT_EQ(p.to_vector<float>()[100], 50.0f);
  EXPECT_GE(in_place.get(), 1);
}

TEST(RunTimeRollback, AValueUpdatedInPlaceBeforeAFailingOpIsCopiedAsideFirst) {
  // An integer division by zero is found only where it runs, after the in-place update it reads:
  // the program keeps a copy of the old value and puts it back.
  ls::Tensor p = ls::arange(1 << 16).to(ls::DType::F32);
  ls::Tensor divisor = ls::from_vector<int64_t>({1, 0});
  ls::sync();
  ls::wait();
  const std::vector<uint32_t> p0 = bits(p);
  Delta copies("in_place_copies");
  ls::Tensor q;
  ls::step([&] {
    p.mul_(0.5);
    q = ls::floor_divide(ls::slice(ls::cast(p, ls::DType::I64), 0, 0, 2), divisor);
  });
  EXPECT_THROW(ls::wait(), ls::Error);
  EXPECT_EQ(bits(p), p0);
  EXPECT_GE(copies.get(), 1);
}

TEST(RunTimeRollback, GradientsAreRestoredToo) {
  ls::Tensor w = ls::ones({3});
  w.set_requires_grad();
  ls::Tensor index = ls::from_vector<int64_t>({0, 5});
  ls::sync();
  EXPECT_FALSE(w.grad().defined());
  ls::step([&] {
    ls::Tensor y = ls::sum(ls::gather(w * 2.0, 0, index));
    y.backward();
  });
  EXPECT_THROW(ls::wait(), ls::Error);
  EXPECT_FALSE(w.grad().defined()) << "the gradient the failed step set is gone";
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{1, 1, 1}));
}

TEST(RunTimeRollback, NegativeIndicesAreErrorsAsInPyTorch) {
  const ls::Tensor x = ls::arange(4).to(ls::DType::F32);
  const ls::Tensor picked = ls::gather(x, 0, ls::from_vector<int64_t>({-1}));
  try {
    (void)picked.to_vector<float>();
    ADD_FAILURE() << "gather took index -1";
  } catch (const ls::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("index -1 is out of range [0, 4)"));
    EXPECT_THAT(e.what(), HasSubstr("negative indices are errors"));
  }
}

TEST(RunTimeRollback, StepsQueuedBackToBackStillUpdateInPlace) {
  // Each step's record goes back to the stepping thread to be freed after its program has run;
  // what it still holds must not stop the next program, traced and queued meanwhile, from
  // updating the parameters and momenta in place.
  Classifier c;
  c.train_step(kGood);
  c.train_step(kGood);
  ls::wait();
  Delta one("in_place_outputs");
  c.train_step(kGood);
  ls::wait();
  const int64_t per_step = one.get();
  ASSERT_GT(per_step, 0);
  Delta many("in_place_outputs");
  for (int i = 0; i < 20; ++i) c.train_step(kGood);
  ls::wait();
  EXPECT_EQ(many.get(), 20 * per_step);
}
