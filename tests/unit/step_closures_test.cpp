// What a step closure sees: the values of the step it was added in, whatever later steps have
// been queued meanwhile (steps run asynchronously, so when a closure runs the next steps are
// usually traced and queued already). Reads return those values; ops recorded in a closure read
// them too; a read that cannot be served is an immediate ls::Error, never a wait on a program
// queued behind the closure. And every closure error before a blocking point is reported.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <lockstep/lockstep.h>

namespace ls = lockstep;
using ::testing::HasSubstr;

namespace {

// Lets the tests queue later steps before an earlier step's closures run: the runtime thread is
// held in a closure of the first step until release() (a queue long enough for the steps
// meanwhile).
class HoldRuntime {
 public:
  HoldRuntime() : released_(promise_.get_future().share()) { ls::set_max_queued_programs(16); }
  ~HoldRuntime() {
    release();
    ls::wait();
    ls::set_max_queued_programs(2);
  }
  void hold_in_this_step() {
    ls::add_step_closure([f = released_] { f.wait(); });
  }
  void release() {
    if (!released_.valid() || done_) return;
    done_ = true;
    promise_.set_value();
  }

 private:
  std::promise<void> promise_;
  std::shared_future<void> released_;
  bool done_ = false;
};

}  // namespace

TEST(StepClosures, AClosureReadsTheValuesOfItsOwnStep) {
  ls::Tensor w = ls::zeros({3});
  std::vector<float> seen;
  {
    HoldRuntime hold;
    for (int i = 0; i < 4; ++i)
      ls::step([&] {
        w.add_(1.0);
        if (i == 0) hold.hold_in_this_step();
        ls::add_step_closure([&] { seen.push_back(w.to_vector<float>()[0]); });
      });
    hold.release();
  }
  EXPECT_EQ(seen, (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(w.to_vector<float>()[0], 4);
}

TEST(StepClosures, ACheckpointSavedInAClosureHoldsThatStepsState) {
  const std::string path =
      (std::filesystem::temp_directory_path() / "lockstep-closure-save.safetensors").string();
  ls::Tensor w = ls::zeros({5});
  {
    HoldRuntime hold;
    for (int i = 0; i < 3; ++i)
      ls::step([&] {
        w.add_(1.0);
        if (i == 0) {
          hold.hold_in_this_step();
          ls::add_step_closure([&] { ls::io::save_safetensors(path, {{"w", w}}); });
        }
      });
    hold.release();
  }
  const ls::io::Loaded loaded = ls::io::load_safetensors(path);
  ASSERT_EQ(loaded.tensors.size(), 1u);
  EXPECT_EQ(loaded.tensors[0].second.to_vector<float>(), std::vector<float>(5, 1.0f));
  std::filesystem::remove(path);
}

TEST(StepClosures, OpsRecordedInAClosureReadItsStepsValues) {
  // An average of the weights kept from closures: each update reads its own step's weights, so
  // the result does not depend on how far tracing ran ahead.
  ls::Tensor w = ls::zeros({2});
  ls::Tensor average = ls::zeros({2});
  {
    HoldRuntime hold;
    for (int i = 0; i < 4; ++i)
      ls::step([&] {
        w.add_(1.0);
        if (i == 0) hold.hold_in_this_step();
        ls::add_step_closure([&] { average.copy_(average * 0.5 + w * 0.5); });
      });
    hold.release();
  }
  const float expected = (((0.5f * 1) * 0.5f + 0.5f * 2) * 0.5f + 0.5f * 3) * 0.5f + 0.5f * 4;
  EXPECT_FLOAT_EQ(average.to_vector<float>()[0], expected);
}

TEST(StepClosures, AClosureReadingWhatItRecordedGetsAnErrorNotAHang) {
  ls::Tensor w = ls::ones({2});
  ls::step([&] {
    w.add_(1.0);
    ls::add_step_closure([&] { (void)ls::sum(w * 2).item<float>(); });
  });
  try {
    ls::wait();
    FAIL() << "no error";
  } catch (const ls::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("step closure"));
  }
  ls::step([&] { w.add_(1.0); });  // the next step works
  EXPECT_EQ(w.to_vector<float>()[0], 3);
}

TEST(StepClosures, AClosureChangingWhatALaterStepChangesGetsAnError) {
  ls::Tensor w = ls::zeros({2});
  {
    HoldRuntime hold;
    for (int i = 0; i < 2; ++i)
      ls::step([&] {
        w.add_(1.0);
        if (i == 0) {
          hold.hold_in_this_step();
          ls::add_step_closure([&] { w.add_(100.0); });
        }
      });
    hold.release();
    try {
      ls::wait();
      FAIL() << "no error";
    } catch (const ls::Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("a step closure changed a tensor that a step queued after"));
    }
  }
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{2, 2}));  // the later step's value stands
}

TEST(StepClosures, EveryClosureErrorBeforeABlockingPointIsReported) {
  for (int i = 0; i < 3; ++i)
    ls::step([&] {
      ls::add_step_closure([i] { throw ls::Error("closure " + std::to_string(i) + " failed"); });
    });
  try {
    ls::wait();
    FAIL() << "no error";
  } catch (const ls::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("closure 0 failed"));
    EXPECT_THAT(e.what(), HasSubstr("closure 1 failed"));
    EXPECT_THAT(e.what(), HasSubstr("closure 2 failed"));
  }
  EXPECT_NO_THROW(ls::wait());  // reported once
}

// A step dropped without being ended rolls back, never commits, never aborts: at once on the
// thread that entered it, or, dropped on another thread, when its thread next enters a step or
// syncs (and that thread is not left inside it).
TEST(StepClosures, AnAbandonedStepRollsBackOnItsOwnThreadOrAtItsThreadsNextStep) {
  ls::Tensor w = ls::ones({2});
  auto s = std::make_unique<ls::Step>();
  w.add_(1.0);
  s->abandon();
  s.reset();
  EXPECT_FALSE(ls::in_step());
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{1, 1}));

  s = std::make_unique<ls::Step>();
  w.add_(1.0);
  std::thread([&] { s->abandon(); }).join();  // never throws, never aborts
  s.reset();
  EXPECT_TRUE(ls::in_step());  // until this thread's next step entry or sync
  ls::step([&] { w.add_(10.0); });
  EXPECT_FALSE(ls::in_step());
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{11, 11}));
}

// Writing through an export while a queued program reads the tensor: the export waits for the
// thread's queued programs, so the program reads the values it was queued with.
TEST(StepClosures, WritesThroughAnExportDoNotRaceAQueuedProgram) {
  ls::Tensor w = ls::ones({4});
  (void)w.to_vector<float>();  // materialized: the export below needs no program of its own
  ls::Tensor y;
  std::thread releaser;
  {
    HoldRuntime hold;
    ls::step([&] { hold.hold_in_this_step(); });
    ls::step([&] { y = w * 2.0; });  // queued behind the held closure: reads w's memory
    releaser = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      hold.release();
    });
    ls::HostMemory m = ls::host_memory(w);  // waits for the step above to have run
    for (int i = 0; i < 4; ++i) static_cast<float*>(m.data)[i] = 100.0f;
    releaser.join();
  }
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{2, 2, 2, 2}));
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{100, 100, 100, 100}));
}
