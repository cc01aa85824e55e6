// What lockstep says when a user's program goes wrong in ways a libtorch user meets (issue 32):
// a run-time index error names the function or module the user called before the primitive; a
// training loop without a step boundary is warned about once, naming its lines; a step that
// keeps other values than before is explained by the lines that made them, in one sentence.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include <lockstep/lockstep.h>
#include "unit/ops_test_util.h"

namespace ls = lockstep;
using ops_test::Delta;
using ops_test::error_of;
using ::testing::HasSubstr;
using ::testing::Not;

namespace {

std::string here(int line) { return std::string(__FILE__) + ":" + std::to_string(line); }

// What follows "execution failed: " in a run-time error.
std::string failure(const std::string& message) {
  const std::string mark = "execution failed: ";
  const size_t at = message.find(mark);
  return at == std::string::npos ? message : message.substr(at + mark.size());
}

struct TokenModel : ls::nn::Module {
  std::shared_ptr<ls::nn::Embedding> tok_emb;
  std::shared_ptr<ls::nn::Linear> head;
  TokenModel() {
    tok_emb = register_module("tok_emb", std::make_shared<ls::nn::Embedding>(10, 4));
    head = register_module("head", std::make_shared<ls::nn::Linear>(4, 5));
  }
  int emb_line = 0;
  ls::Tensor forward(const ls::Tensor& ids) override {
    emb_line = __LINE__ + 1;
    return (*head)((*tok_emb)(ids));
  }
};

}  // namespace

TEST(Messages, ARunTimeIndexErrorNamesTheUsersFunctionOrModuleFirst) {
  TokenModel model;
  // A token id past the vocabulary: the Embedding and its path, then the primitive.
  std::string m = error_of([&] {
    model(ls::from_vector<int64_t>({1, 97}, {2})).sum().item<float>();
  });
  EXPECT_EQ(failure(m).rfind("Embedding at " + here(model.emb_line) +
                                 " in tok_emb: gather: index 97 "
                                 "is out of range [0, 10)",
                             0),
            0u)
      << m;
  // A label past the classes: cross_entropy (not the nll_loss it is built on), at the user's line.
  ls::Tensor logits = model(ls::from_vector<int64_t>({1, 2}, {2}));
  const int ce_line = __LINE__ + 1;
  ls::Tensor loss = ls::nn::cross_entropy(logits, ls::from_vector<int64_t>({1, 7}, {2}));
  m = error_of([&] { loss.item<float>(); });
  EXPECT_EQ(failure(m).rfind("cross_entropy at " + here(ce_line) + ": gather: index 7 ", 0), 0u)
      << m;
  // Its gradient too (a scatter of the same labels).
  m = error_of([&] {
    ls::step([&] {
      ls::nn::cross_entropy(model(ls::from_vector<int64_t>({1, 2}, {2})),
                            ls::from_vector<int64_t>({-1, 3}, {2}))
          .backward();
    });
    ls::wait();
  });
  EXPECT_THAT(failure(m), HasSubstr("cross_entropy at ")) << m;
  // index_select and one_hot name themselves; a gather the user called stays a gather.
  ls::Tensor x = ls::rand({3, 4});
  m = error_of([&] {
    ls::index_select(x, 1, ls::from_vector<int64_t>({0, 4})).sum().item<float>();
  });
  EXPECT_EQ(failure(m).rfind("index_select at ", 0), 0u) << m;
  m = error_of([&] { ls::one_hot(ls::from_vector<int64_t>({5}), 3).sum().item<int64_t>(); });
  EXPECT_EQ(failure(m).rfind("one_hot at ", 0), 0u) << m;
  const int gather_line = __LINE__ + 1;
  ls::Tensor g = ls::gather(x, 1, ls::from_vector<int64_t>({0, 9, 0}, {3, 1}));
  m = error_of([&] { g.sum().item<float>(); });
  EXPECT_EQ(failure(m).rfind("gather: index 9 is out of range", 0), 0u) << m;
  EXPECT_THAT(m, HasSubstr("(at " + std::string(__FILE__) + ":" + std::to_string(gather_line)))
      << m;
}

// A loop without ls::step: the optimizer's in-place updates stay pending, so each read computes
// every iteration so far and compiles a larger program. Warned once, naming the read's line and
// the loop's; from then on the read computes the parameters too, so the program stops growing.
// Not for the same loop with a step, nor for a generation loop whose context grows.
TEST(Messages, ALoopWithoutAStepIsWarnedAboutOnceNamingItsLines) {
  ls::manual_seed(3);
  ls::nn::Linear lin(8, 2);
  ls::optim::SGD opt(lin.parameters(), {.lr = 0.1});
  ls::Tensor x = ls::rand({4, 8});
  Delta warnings("growing_program_warnings");
  int read_line = 0, loss_line = 0;
  std::vector<int64_t> compiled;
  Delta loop_compiles("compiles");
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 12; ++i) {
    opt.zero_grad();
    loss_line = __LINE__ + 1;
    ls::Tensor loss = ls::square(lin(x)).mean();
    loss.backward();
    opt.step();
    read_line = __LINE__ + 1;
    loss.item<float>();
    compiled.push_back(loop_compiles.get());
  }
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(warnings.get(), 1);
  EXPECT_THAT(err, HasSubstr("item at " + std::string(__FILE__) + ":" + std::to_string(read_line) +
                             " compiled a larger program at each of its last 4 syncs"));
  EXPECT_THAT(err, HasSubstr("Wrap each iteration in ls::step"));
  EXPECT_THAT(err, HasSubstr("Most nodes come from " + here(loss_line)));
  EXPECT_EQ(err.find("compiled a larger program"), err.rfind("compiled a larger program")) << err;
  EXPECT_THAT(err, HasSubstr("From now on each read here also computes"));
  EXPECT_EQ(compiled[11], compiled[6]) << "a larger program at each read still";
  ls::sync();

  // The same loop with a step: one program, no warning.
  Delta compiles("compiles");
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 8; ++i) {
    ls::Tensor loss;
    ls::step([&] {
      opt.zero_grad();
      loss = ls::square(lin(x)).mean();
      loss.backward();
      opt.step();
    });
    loss.item<float>();
  }
  err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(warnings.get(), 1);
  EXPECT_LE(compiles.get(), 2);
  EXPECT_THAT(err, Not(HasSubstr("compiled a larger program")));

  // Naive generation: a context one longer each time, read each time (a new shape, not a larger
  // program): no warning.
  ls::nn::Embedding emb(10, 4);
  std::vector<int64_t> tokens = {1};
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 8; ++i) {
    ls::NoGrad no_grad;
    ls::Tensor h = emb(ls::from_vector(tokens, {static_cast<int64_t>(tokens.size())}));
    tokens.push_back(ls::argmax(h.sum({1})).item<int64_t>() % 10);
  }
  err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(warnings.get(), 1);
  EXPECT_THAT(err, Not(HasSubstr("compiled a larger program")));
}

// A step whose result is kept on odd steps only: the explanation names what was added or dropped
// by its line, in a sentence, without node ids.
TEST(Messages, AStepKeepingOtherValuesIsExplainedByTheirLines) {
  ls::Tensor w = ls::zeros({4}).set_requires_grad();
  int loss_line = 0;
  std::vector<ls::debug::CacheMiss> misses;
  for (int i = 0; i < 4; ++i) {
    ls::Tensor keep;
    ls::step([&] {
      loss_line = __LINE__ + 1;
      ls::Tensor loss = (w * 2).sum();
      loss.backward();
      ls::NoGrad no_grad;
      w.sub_(w.grad() * 0.1);
      w.set_grad(ls::Tensor());
      if (i % 2 == 1) keep = loss;
    });
    misses.push_back(ls::debug::last_cache_miss());
  }
  const ls::debug::CacheMiss& m = misses[1];
  EXPECT_EQ(m.field, "outputs");
  EXPECT_EQ(m.op, "sum");
  EXPECT_EQ(m.where, here(loss_line));
  EXPECT_THAT(m.text, HasSubstr("keeps other values than before: added the sum at " +
                                here(loss_line) + "; dropped nothing"));
  EXPECT_THAT(m.text, HasSubstr("hold the loss every step"));
  EXPECT_EQ(m.text.find('%'), std::string::npos) << m.text;
  // Short whatever the checkout's path: its lines are counted without the file's path.
  std::string without_paths = m.text;
  for (size_t at; (at = without_paths.find(__FILE__)) != std::string::npos;)
    without_paths.erase(at, std::string(__FILE__).size());
  EXPECT_LT(without_paths.size(), 400u) << m.text;
  // Steps 3 and 4 are steps 1 and 2 again: no more compiles.
  EXPECT_EQ(misses[3].compiles_at_site, 2);
}

// A loop that waits for a closure's signal (as lockstep-train's pacing does) must not wait
// forever on a step whose program failed, which runs no closure: check_errors raises the
// library's error while it waits (issue 30, item 5).
TEST(Messages, ALoopWaitingOnAFailedStepsClosureGetsTheError) {
  ls::Tensor w = ls::zeros({4});
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  ls::step([&] {
    w.add_(ls::gather(w, 0, ls::full({4}, 9, ls::i64)));  // fails as it runs
    ls::add_step_closure([&] {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
      cv.notify_all();
    });
  });
  const std::string m = error_of([&] {
    std::unique_lock<std::mutex> lock(mu);
    for (int i = 0;
         i < 200 && !cv.wait_for(lock, std::chrono::milliseconds(50), [&] { return done; }); ++i) {
      lock.unlock();
      ls::check_errors();
      lock.lock();
    }
  });
  EXPECT_FALSE(done);
  EXPECT_THAT(m, HasSubstr("index 9 is out of range")) << m;
  EXPECT_THAT(m, HasSubstr("rolled back")) << m;
  ls::check_errors();  // raised once: nothing left
  EXPECT_EQ(w.to_vector<float>(), std::vector<float>(4, 0.0f));
}
