// Contract tests for laziness, sync, the compile cache, asynchronous execution and metrics
// (DESIGN.md section 1: "Tensors and laziness" and "Sync").
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include <chrono>
#include <future>
#include <memory>
#include <thread>

#include <lockstep/lockstep.h>
#include "runtime/lazy.h"
#include "unit/ops_test_util.h"

namespace ls = lockstep;
using ::testing::HasSubstr;

namespace {

int64_t counter(const char* name) { return ls::metrics::counter(name); }

// Counters change only by what a block of code does.
using ops_test::Delta;

}  // namespace

TEST(Laziness, OpsRecordAndDoNotCompute) {
  ls::wait();
  Delta executions("executions");
  ls::Tensor a = ls::from_vector<float>({1, 2, 3});
  ls::Tensor b = ls::exp(a) * 2.0f + a;
  EXPECT_TRUE(b.is_pending());
  EXPECT_EQ(b.shape(), (ls::Shape{3}));
  EXPECT_EQ(b.dtype(), ls::f32);
  ls::wait();
  EXPECT_EQ(executions.get(), 0);
}

TEST(Laziness, HandlesShareTheTensor) {
  ls::Tensor a = ls::zeros({2});
  ls::Tensor alias = a;
  a += 1.0f;  // in place: every handle sees it
  EXPECT_TRUE(alias.is_same(a));
  EXPECT_EQ(alias.to_vector<float>(), (std::vector<float>{1, 1}));
  ls::Tensor c = a;
  c = a - 5.0f;  // rebinds the handle; a is unchanged
  EXPECT_FALSE(c.is_same(a));
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{1, 1}));
  EXPECT_EQ(c.to_vector<float>(), (std::vector<float>{-4, -4}));
}

TEST(Laziness, EmptyHandle) {
  ls::Tensor t;
  EXPECT_FALSE(t.defined());
  EXPECT_THROW(t.shape(), ls::Error);
  EXPECT_THROW(t + 1.0f, ls::Error);
  EXPECT_THROW(t.item<float>(), ls::Error);
}

TEST(Laziness, BadShapeThrowsAtTheUsersLine) {
  ls::Tensor a = ls::zeros({2, 3});
  ls::Tensor b = ls::zeros({4});
  const int line = __LINE__ + 2;
  try {
    ls::Tensor c = a + b;
    FAIL() << "no error";
  } catch (const ls::Error& e) {
    const std::string msg = e.what();
    EXPECT_THAT(msg, HasSubstr("add"));
    EXPECT_THAT(msg, HasSubstr("[2, 3]"));
    EXPECT_THAT(msg, HasSubstr("[4]"));
    EXPECT_THAT(msg, HasSubstr("runtime_test.cpp:" + std::to_string(line)));
  }
}

TEST(Laziness, ReadRunsOnlyWhatItNeedsAndCountsAsImplicitSync) {
  ls::Tensor x = ls::from_vector<float>({1, 2});
  ls::Tensor other = x * 3.0f;  // pending, not needed by the read below
  ls::Tensor y = x + 1.0f;
  Delta implicit("implicit_syncs");
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{2, 3}));
  EXPECT_EQ(implicit.get(), 1);
  EXPECT_TRUE(other.is_pending());
  EXPECT_FALSE(y.is_pending());
  // A second read of a materialized value is not a sync.
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{2, 3}));
  EXPECT_EQ(implicit.get(), 1);
}

TEST(Laziness, ItemOfMaterializedValueIsNotASync) {
  ls::Tensor y = ls::full({}, 7.0f);
  EXPECT_EQ(y.item<float>(), 7.0f);
  Delta implicit("implicit_syncs");
  EXPECT_EQ(y.item<float>(), 7.0f);
  EXPECT_EQ(implicit.get(), 0);
}

// A loop that reads each element of a pending value, as indices (nanoGPT's get_batch: `for i in
// ix`, each `i` an index into its data): the first read computes the value, and each other
// element is copied on the host, with no program built or run for it.
TEST(Laziness, ReadingTheElementsOfAValueComputesItOnce) {
  ls::manual_seed(3);
  const ls::Tensor ix = ls::randint(0, 1000, {12});
  Delta implicit("implicit_syncs"), executions("executions");
  std::vector<int64_t> got;
  for (int64_t k = 0; k < 12; ++k) got.push_back(ls::select(ix, 0, k).item<int64_t>());
  EXPECT_EQ(implicit.get(), 1);
  EXPECT_EQ(executions.get(), 1);
  EXPECT_FALSE(ix.is_pending());
  EXPECT_EQ(got, ix.to_vector<int64_t>());
  // Slices with steps over several axes, and reshapes, of a computed value: each element where
  // the whole value has it.
  const ls::Tensor m = ls::reshape(ls::arange(60), {3, 4, 5}) * 2;
  const std::vector<int64_t> all = m.to_vector<int64_t>();
  Delta reads("implicit_syncs");
  const ls::Tensor part =
      ls::reshape(ls::slice(ls::slice(m, 2, 1, 5, 2), 1, 1, 4), {9, 2});  // [3, 3, 2] as [9, 2]
  std::vector<int64_t> want;
  for (int64_t a = 0; a < 3; ++a)
    for (int64_t b = 1; b < 4; ++b)
      for (int64_t c = 1; c < 5; c += 2)
        want.push_back(all[static_cast<size_t>(a * 20 + b * 5 + c)]);
  EXPECT_EQ(part.to_vector<int64_t>(), want);
  EXPECT_EQ(ls::select(ls::select(part, 0, 7), 0, 1).item<int64_t>(), want[15]);
  EXPECT_EQ(reads.get(), 0);
  // More elements than a host copy takes (64): a program, as before.
  const ls::Tensor big = ls::arange(100) * 3;
  const std::vector<int64_t> big_all = big.to_vector<int64_t>();
  Delta big_reads("implicit_syncs");
  EXPECT_EQ(ls::slice(big, 0, 0, 100, 1).to_vector<int64_t>(), big_all);
  EXPECT_EQ(big_reads.get(), 1);
}

TEST(Laziness, SmallIntegerArithmeticOnComputedValuesRunsNoProgram) {
  // nanoGPT's get_batch reads `i + 1` and `i + block_size` for each `i` of its indices: exact
  // integer ops on a few elements of computed values are computed on the host, no program each.
  const std::vector<int64_t> values{7, 420, 13, 999, 0, 512};
  const ls::Tensor ix = ls::from_vector<int64_t>(values) * 1;  // a computed value, not an upload
  ix.to_vector<int64_t>();
  Delta executions("executions"), host("host_reads");
  for (int64_t k = 0; k < 6; ++k) {
    const ls::Tensor i = ls::select(ix, 0, k);
    EXPECT_EQ((i + 1).item<int64_t>(), values[static_cast<size_t>(k)] + 1);
    EXPECT_EQ((i + 1 + 16).item<int64_t>(), values[static_cast<size_t>(k)] + 17);
    EXPECT_EQ(ls::maximum(i * 3 - 100, ls::zeros_like(i)).item<int64_t>(),
              std::max<int64_t>(values[static_cast<size_t>(k)] * 3 - 100, 0));
  }
  // Comparisons, where, sums and casts between integer types, over slices and reshapes.
  const ls::Tensor big = ls::sum(ls::where(ix > 100, ix, -ix));
  EXPECT_EQ(big.item<int64_t>(), -7 + 420 - 13 + 999 - 0 + 512);
  const ls::Tensor two = ls::reshape(ls::slice(ix, 0, 1, 5, 2), {2, 1}).to(ls::i32) + 1;
  EXPECT_EQ(two.to_vector<int32_t>(), (std::vector<int32_t>{421, 1000}));
  EXPECT_EQ(ls::sum(ix > 100).item<int64_t>(), 3);
  EXPECT_EQ(executions.get(), 0);
  EXPECT_EQ(host.get(), 6 * 3 + 3);
  // Inside a step too, without running the step's work so far: it stays pending. (Whatever an
  // earlier test left pending is computed first, so that the step's entry has nothing to sync.)
  ls::Tensor w = ls::from_vector<float>({1, 2});
  ls::sync();
  ls::wait();
  Delta step_programs("executions");
  ls::step([&] {
    w.mul_(3.0f);
    EXPECT_EQ((ls::select(ix, 0, 1) + 1).item<int64_t>(), 421);
    EXPECT_TRUE(w.is_pending());
  });
  ls::wait();
  EXPECT_EQ(step_programs.get(), 1);  // the step's own program
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{3, 6}));
  // Left to a program: floating point (a backend may round differently), integer division (it
  // may fail), a pending operand, and more elements than 64.
  const ls::Tensor f = ls::from_vector<float>({0.5f}) * 1.0f;
  f.item<float>();
  Delta programs("executions");
  EXPECT_EQ((f + 1.0f).item<float>(), 1.5f);
  EXPECT_EQ(programs.get(), 1);
  EXPECT_EQ(ls::floor_divide(ls::select(ix, 0, 1), 7).item<int64_t>(), 60);
  EXPECT_EQ(programs.get(), 2);
  const ls::Tensor pending = ls::randint(0, 5, {3});  // a draw: not computed on the host
  EXPECT_LT((ls::select(pending, 0, 0) + 1).item<int64_t>(), 6);
  EXPECT_EQ(programs.get(), 3);
  EXPECT_EQ((ls::arange(100) + 1).to_vector<int64_t>().back(), 100);
  EXPECT_EQ(programs.get(), 4);
}

TEST(Laziness, PrintingIsARead) {
  ls::Tensor x = ls::from_vector<int64_t>({1, 2, 3, 4}, {2, 2}) * ls::randint(2, 3, {2, 2});
  Delta implicit("implicit_syncs");
  std::ostringstream os;
  os << x;
  EXPECT_EQ(os.str(), "tensor(i64[2, 2], cpu) [[2, 4],\n [6, 8]]");
  EXPECT_EQ(implicit.get(), 1);
}

TEST(Sync, MaterializesEveryLivePendingTensorInOneGraph) {
  ls::wait();
  ls::Tensor a = ls::from_vector<float>({1, 2});
  ls::Tensor b = a * 2.0f;
  ls::Tensor c = a + b;
  ls::Tensor d = ls::sum(c);
  Delta executions("executions");
  Delta syncs("syncs");
  ls::sync();
  EXPECT_FALSE(b.is_pending());
  EXPECT_FALSE(c.is_pending());
  EXPECT_FALSE(d.is_pending());
  ls::wait();
  EXPECT_EQ(executions.get(), 1);
  EXPECT_EQ(syncs.get(), 1);
  EXPECT_EQ(d.item<float>(), 9.0f);
}

TEST(Sync, NothingPendingCostsNothing) {
  ls::sync();
  ls::wait();
  Delta syncs("syncs"), compiles("compiles"), executions("executions");
  for (int i = 0; i < 10; ++i) ls::sync();
  ls::wait();
  EXPECT_EQ(syncs.get(), 0);
  EXPECT_EQ(compiles.get(), 0);
  EXPECT_EQ(executions.get(), 0);
}

TEST(Sync, DeadTensorsAreNotComputed) {
  ls::sync();
  ls::Tensor keep = ls::from_vector<int64_t>({6, 8});
  {
    // Would fail at run time (integer division by zero) if it were computed.
    ls::Tensor dead = ls::floor_divide(keep, ls::zeros({2}, ls::i64));
    (void)dead;
  }
  ls::Tensor live = keep + 1;
  ls::sync();
  EXPECT_NO_THROW(ls::wait());
  EXPECT_EQ(live.to_vector<int64_t>(), (std::vector<int64_t>{7, 9}));
  EXPECT_THAT(ls::debug::last_graph_text(), ::testing::Not(HasSubstr("div")));
}

TEST(Sync, HashIgnoresDataAndHostScalars) {
  auto program = [](float scale, std::vector<float> data) {
    ls::Tensor x = ls::from_vector<float>(data);
    ls::Tensor y = ls::relu(x * scale - 1.0f);
    ls::sync();
    return y;
  };
  program(2.0f, {1, 2, 3});  // warm up: compiled once
  Delta compiles("compiles"), hits("cache_hits");
  ls::Tensor y1 = program(0.5f, {4, 5, 6});
  ls::Tensor y2 = program(3.0f, {-1, 0, 1});
  EXPECT_EQ(compiles.get(), 0);
  EXPECT_EQ(hits.get(), 2);
  EXPECT_EQ(y1.to_vector<float>(), (std::vector<float>{1, 1.5f, 2}));
  EXPECT_EQ(y2.to_vector<float>(), (std::vector<float>{0, 0, 2}));
  // A different shape is a different program.
  program(1.0f, {1, 2, 3, 4});
  EXPECT_EQ(compiles.get(), 1);
}

TEST(Sync, StructureIsHashedNotJustSizes) {
  ls::Tensor x = ls::from_vector<float>({1, 2});
  ls::Tensor y = x + x;
  ls::sync();
  ls::Tensor p = ls::from_vector<float>({1, 2});
  ls::Tensor q = ls::from_vector<float>({10, 20});
  Delta compiles("compiles");
  ls::Tensor z = p + q;  // two inputs, not one used twice: a different program
  ls::sync();
  EXPECT_EQ(compiles.get(), 1);
  EXPECT_EQ(z.to_vector<float>(), (std::vector<float>{11, 22}));
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{2, 4}));
}

TEST(Sync, CompileCacheIsBoundedLru) {
  ls::set_compile_cache_capacity(2);
  auto run = [](int64_t n) {
    ls::Tensor t = ls::ones({n}) * 2.0f;
    ls::sync();
    return t;
  };
  run(101);
  run(102);
  Delta compiles("compiles");
  run(101);  // still cached
  EXPECT_EQ(compiles.get(), 0);
  run(103);  // evicts 102, the least recently used
  run(101);
  EXPECT_EQ(compiles.get(), 1);
  run(102);
  EXPECT_EQ(compiles.get(), 2);
  EXPECT_EQ(ls::debug::last_cache_miss().field, "evicted") << ls::debug::last_cache_miss().text;
  ls::set_compile_cache_capacity(1024);
}

// An evaluation loop without a step that carries a recurrent state and reads a loss each
// iteration (word_language_model's evaluate()): once its read is warned of a growing program,
// the read also computes the state (it shares the loss's history), so later iterations run one
// program of one size. The losses are those of the loop that syncs everything each iteration.
TEST(Sync, AGrowingReadComputesThePendingValuesThatShareItsHistory) {
  auto losses = [](bool sync_all) {
    ls::manual_seed(3);
    const ls::Tensor w = ls::randn({4, 4}) * 0.5f;
    ls::Tensor h = ls::zeros({2, 4});
    std::vector<float> out;
    Delta compiles("compiles");
    std::vector<int64_t> compiled;
    ::testing::internal::CaptureStderr();
    for (int i = 0; i < 12; ++i) {
      h = ls::tanh(ls::matmul(h, w) + static_cast<float>(i) * 0.1f);
      const ls::Tensor loss = (h * h).sum();
      if (sync_all) ls::sync();
      out.push_back(loss.item<float>());
      compiled.push_back(compiles.get());
    }
    ::testing::internal::GetCapturedStderr();
    if (!sync_all) {
      EXPECT_EQ(compiled[11], compiled[7]) << "a program for every iteration";
    }
    return out;
  };
  const std::vector<float> want = losses(true);
  const std::vector<float> got = losses(false);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_FLOAT_EQ(got[i], want[i]) << i;
  ls::sync();
}

// The default cache holds a loop's programs over 100 distinct batch slices (a program each, as
// word_language_model's get_batch makes) and the first is still there after them.
TEST(Sync, TheDefaultCompileCacheKeepsAnEpochOfSlicedBatches) {
  const ls::Tensor source = ls::arange(400, ls::TensorOptions(ls::DType::F32));
  ls::sync();
  auto batch = [&](int64_t i) {
    ls::Tensor b = ls::slice(source, 0, i, i + 8) * 2.0f;
    ls::sync();
    return b;
  };
  for (int64_t i = 0; i < 100; ++i) batch(3 * i);
  Delta compiles("compiles");
  EXPECT_EQ(batch(0).to_vector<float>()[7], 14.0f);
  EXPECT_EQ(compiles.get(), 0) << "the first batch's program was dropped";
}

TEST(Async, SyncReturnsBeforeTheProgramRuns) {
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> closure_timed_out{false};
  ls::Tensor x = ls::from_vector<float>({1, 2, 3});
  ls::step([&] {
    x.mul_(2.0f);
    // Blocks the runtime thread until the test thread, which must already be past the step's
    // exit, lets it go. If the step waited for its program, this would time out.
    ls::add_step_closure([&, released] {
      if (released.wait_for(std::chrono::seconds(20)) != std::future_status::ready)
        closure_timed_out = true;
    });
  });
  release.set_value();
  ls::wait();
  EXPECT_FALSE(closure_timed_out);
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{2, 4, 6}));
}

TEST(Async, ExecutionErrorSurfacesAtNextBlockingPointNamingTheStep) {
  ls::wait();
  ls::Tensor n = ls::from_vector<int64_t>({10, 20});
  ls::Tensor zero = ls::from_vector<int64_t>({0, 5});
  ls::Tensor out;
  ls::step(
      [&] { out = ls::floor_divide(n, zero); });  // fails at run time: integer division by zero
  const int64_t failed_step = ls::current_step();
  try {
    ls::wait();
    FAIL() << "wait() did not report the execution error";
  } catch (const ls::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("step " + std::to_string(failed_step)));
    EXPECT_THAT(e.what(), HasSubstr("division by zero"));
  }
  EXPECT_NO_THROW(ls::wait());  // reported once
  EXPECT_TRUE(out.is_poisoned());
  EXPECT_THROW(out.to_vector<int64_t>(), ls::Error);
  EXPECT_THROW(out.to_vector<int64_t>(), ls::Error);  // every read rethrows
  // Work depending on the poisoned value fails too, and says why.
  ls::Tensor later = out + 1;
  try {
    later.to_vector<int64_t>();
    FAIL() << "a value computed from a poisoned one was read";
  } catch (const ls::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("division by zero"));
  }
  // The next, healthy step works.
  ls::Tensor ok;
  ls::step([&] { ok = n + zero; });
  EXPECT_EQ(ok.to_vector<int64_t>(), (std::vector<int64_t>{10, 25}));
}

TEST(Async, ReadOfAnotherValueReportsThePendingError) {
  ls::wait();
  ls::Tensor bad = ls::floor_divide(ls::from_vector<int64_t>({1}), ls::zeros({1}, ls::i64));
  ls::sync();
  ls::Tensor good = ls::from_vector<int64_t>({1}) + 1;
  ls::sync();
  // The failed program ran before `good`'s; reading `good` is the next blocking point.
  EXPECT_THROW(good.item<int64_t>(), ls::Error);
  EXPECT_EQ(good.item<int64_t>(), 2);
  EXPECT_TRUE(bad.is_poisoned());
}

TEST(Laziness, AShapeReferenceStaysValidAcrossASync) {
  // The sync replaces the tensor's pending node by the value it computed, and the old node dies;
  // the shape a caller holds by reference is the tensor's own (ASan checks the read).
  ls::Tensor t = ls::ones({2, 3}) + 1.0;
  const ls::Shape& shape = t.shape();
  ls::sync();
  ls::wait();
  t.add_(1.0);
  ls::sync();
  EXPECT_EQ(shape, (ls::Shape{2, 3}));
  EXPECT_EQ(t.to_vector<float>()[0], 3.0f);
}

TEST(Metrics, ReportListsCountersAndTimers) {
  ls::Tensor t = ls::ones({3}) + 1.0f;
  t.to_vector<float>();
  const std::string r = ls::metrics::report();
  for (const char* name :
       {"steps", "syncs", "implicit_syncs", "compiles", "cache_hits", "executions", "rollbacks",
        "bytes_to_device", "bytes_from_device", "trace", "compile", "execute"})
    EXPECT_THAT(r, HasSubstr(name));
  EXPECT_GT(counter("bytes_from_device"), 0);
  EXPECT_GT(ls::metrics::timer_count("execute"), 0);
}

TEST(Metrics, TransfersAreCounted) {
  Delta to_dev("bytes_to_device"), from_dev("bytes_from_device");
  ls::Tensor t = ls::from_vector<double>({1, 2, 3});
  EXPECT_EQ(to_dev.get(), 24);
  t.to_vector<double>();
  EXPECT_EQ(from_dev.get(), 24);
}

TEST(Metrics, AnUnknownNameIsAnErrorNamingTheKnownOnes) {
  // A misspelled name must not read 0 and pass silently.
  try {
    (void)ls::metrics::counter("compile");
    ADD_FAILURE() << "counter(\"compile\") read a value";
  } catch (const ls::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("no counter named 'compile'"));
    EXPECT_THAT(e.what(), HasSubstr("compiles"));
    EXPECT_THAT(e.what(), HasSubstr("max_planned_bytes"));
  }
  EXPECT_THROW((void)ls::metrics::timer_total_ns("executes"), ls::Error);
  EXPECT_THROW((void)ls::metrics::timer_count("compiles"), ls::Error);
  // Declared names read 0 before anything counts them, gauges' maxima included.
  ls::metrics::reset();
  EXPECT_EQ(counter("in_place_copies"), 0);
  EXPECT_EQ(counter("max_planned_bytes"), 0);
  EXPECT_EQ(ls::metrics::timer_total_ns("all_reduce_wait"), 0);
}

TEST(Devices, UnavailableDeviceIsAClearError) {
  try {
    ls::zeros({2}, ls::TensorOptions(ls::f32, ls::Device{ls::DeviceKind::Cuda, 0}));
    FAIL();
  } catch (const ls::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("cuda:0"));
  }
  EXPECT_THROW(ls::parse_device("tpu"), ls::Error);
  EXPECT_EQ(ls::parse_device("ref"), (ls::Device{ls::DeviceKind::Ref, 0}));
  ls::Tensor t = ls::ones({2});
  // To its own device: no transfer, a handle of its own on the same value (never a view).
  const ls::Tensor same = t.to(ls::default_device());
  EXPECT_FALSE(same.is_same(t));
  EXPECT_EQ(same.to_vector<float>(), t.to_vector<float>());
  EXPECT_EQ(ls::default_device(), (ls::Device{ls::DeviceKind::Cpu, 0}));
  ls::Tensor on_ref = t.to(ls::Device{ls::DeviceKind::Ref, 0});
  EXPECT_EQ(on_ref.device(), (ls::Device{ls::DeviceKind::Ref, 0}));
  EXPECT_EQ(on_ref.to_vector<float>(), t.to_vector<float>());
  // Creation on a device other than the default one.
  const ls::Device ref{ls::DeviceKind::Ref, 0};
  EXPECT_EQ(ls::arange(3, {ls::i64, ref}).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(ls::rand({3}, {ls::f32, ref}).device(), ref);
  EXPECT_EQ(ls::randn({3}, {ls::f32, ref}).device(), ref);
}

// A chain of 200,000 in-place updates is computed, and one as deep that no handle refers to any
// more is released whole (without recursion: a recursive release would overflow the stack) and
// never computed.
TEST(Graphs, DeepChainsDoNotOverflowTheStack) {
  ls::Tensor x = ls::zeros({1}, ls::i64);
  for (int i = 0; i < 200000; ++i) x += 1;
  EXPECT_EQ(x.item<int64_t>(), 200000);
  ls::wait();

  ls::Tensor y = ls::zeros({1}, ls::i64);
  y += 1;
  const std::weak_ptr<const ls::ir::Node> first = y.impl()->node;  // deepest in the chain
  for (int i = 1; i < 200000; ++i) y += 1;
  const std::weak_ptr<const ls::ir::Node> last = y.impl()->node;
  ASSERT_TRUE(y.is_pending());
  ASSERT_FALSE(first.expired());  // the later updates hold it
  Delta executions("executions");
  y = ls::Tensor();  // the whole pending chain dies at once
  EXPECT_TRUE(last.expired());
  EXPECT_TRUE(first.expired());
  ls::sync();
  ls::wait();
  EXPECT_EQ(executions.get(), 0) << "a chain no handle refers to was computed";
}

// f32 chains fuse into one tree as deep as the chain: building it, planning it and running it
// walk it without recursion. Plain, inside a step, and through backward. LOCKSTEP_DEEP_GRAPH_DEPTH
// runs deeper chains by hand.
TEST(Graphs, DeepFusedChainsCompileAndRun) {
  const char* env = std::getenv("LOCKSTEP_DEEP_GRAPH_DEPTH");
  const int depth = env ? std::atoi(env) : 30000;
  ls::Tensor x = ls::zeros({4});
  for (int i = 0; i < depth; ++i) x = x + 1.0;
  EXPECT_EQ(x.to_vector<float>()[3], static_cast<float>(depth));
  ls::Tensor y = ls::zeros({4});
  ls::step([&] {
    for (int i = 0; i < depth; ++i) y = y * 0.5 + 1.0;
  });
  EXPECT_NEAR(y.to_vector<float>()[0], 2.0f, 1e-6);
  ls::Tensor w = ls::ones({4});
  w.set_requires_grad();
  ls::step([&] {
    ls::Tensor h = w;
    for (int i = 0; i < depth / 4; ++i) h = h * 1.0 + 0.0;
    ls::sum(h).backward();
  });
  EXPECT_EQ(w.grad().to_vector<float>()[1], 1.0f);
}

// A fused tree over many distinct inputs (x = x + leaf_i): the fusion pass keeps only the few
// leaves its recompute rule looks at, so choosing the fusion is linear (100,000 leaves took more
// than 10 minutes before, 1.1 s after). LOCKSTEP_WIDE_GRAPH_LEAVES runs wider trees by hand.
TEST(Graphs, WideFusedTreesCompileAndRun) {
  const char* env = std::getenv("LOCKSTEP_WIDE_GRAPH_LEAVES");
  const int leaves = env ? std::atoi(env) : 30000;
  std::vector<ls::Tensor> in;
  for (int i = 0; i < leaves; ++i) in.push_back(ls::full({4}, 1.0));
  ls::sync();
  ls::Tensor x = ls::zeros({4});
  for (const ls::Tensor& l : in) x = x + l;
  EXPECT_EQ(x.to_vector<float>()[2], static_cast<float>(leaves));
}

TEST(Threads, TensorsFromOtherThreadsAreUsable) {
  ls::Tensor made;
  std::thread t([&] { made = ls::from_vector<float>({3, 4}); });
  t.join();
  EXPECT_EQ((made * 2.0f).to_vector<float>(), (std::vector<float>{6, 8}));
}

TEST(RuntimeQueue, TracingWaitsWhenTooManyProgramsAreQueued) {
  // Steps traced faster than they run: with at most one program waiting, the loop has to wait
  // for room instead of queueing all thirty; the values come out right. The runtime thread is
  // held (a closure of the first step waits for a release 100 ms later), so the loop waits
  // however fast the programs themselves run (under ThreadSanitizer on a busy machine they once
  // kept up with the tracing, and nothing waited).
  struct Restore {
    ~Restore() { ls::set_max_queued_programs(2); }
  } restore;
  ls::set_max_queued_programs(1);
  Delta waits("queue_waits");
  ls::Tensor a = ls::ones({128, 128});
  const ls::Tensor m = ls::full({128, 128}, 1.0 / 128);
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    release.set_value();
  });
  for (int i = 0; i < 30; ++i)
    ls::step([&] {
      for (int k = 0; k < 10; ++k) a = ls::matmul(a, m);
      if (i == 0) ls::add_step_closure([released] { released.wait(); });
    });
  releaser.join();
  for (float v : a.to_vector<float>()) ASSERT_NEAR(v, 1.0f, 1e-4f);
  EXPECT_GT(waits.get(), 0);
  EXPECT_THROW(ls::set_max_queued_programs(0), ls::Error);
}
