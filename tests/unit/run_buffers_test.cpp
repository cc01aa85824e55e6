// RunBuffers (src/backends/cpu/kernels.h): the buffers a kernel's run takes (a fused tree's
// expanded leaves) come from its thread's pool and are kept for the next run, so a step's kernels
// do not allocate (and fault in fresh pages) each time they run.
#include <gtest/gtest.h>

#include <cstdint>
#include <thread>

#include "backends/cpu/kernels.h"

namespace cpu = lockstep::backends::cpu;

namespace {

TEST(RunBuffers, ARunsBuffersAreDistinctAndKeptForTheNextRun) {
  float* first = nullptr;
  float* second = nullptr;
  {
    cpu::RunBuffers run;
    first = run.take(1000);
    second = run.take(300);
    ASSERT_NE(first, nullptr);
    ASSERT_NE(second, nullptr);
    for (int64_t i = 0; i < 1000; ++i) first[i] = 1.0f;
    for (int64_t i = 0; i < 300; ++i) second[i] = 2.0f;
    for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(first[i], 1.0f);  // no overlap
  }
  {
    cpu::RunBuffers run;  // the next kernel: the same memory, no allocation
    EXPECT_EQ(run.take(800), first);
    EXPECT_EQ(run.take(300), second);
    float* grown = run.take(5000);  // one more than the last run took
    for (int64_t i = 0; i < 5000; ++i) grown[i] = 3.0f;
  }
  {
    cpu::RunBuffers run;
    EXPECT_EQ(run.take(10), first);
    float* big = run.take(100000);  // larger than the second slot kept: a larger buffer
    for (int64_t i = 0; i < 100000; ++i) big[i] = 4.0f;
  }
}

TEST(RunBuffers, NestedRunsAreAStack) {
  cpu::RunBuffers outer;
  float* a = outer.take(64);
  float* inner_buffer = nullptr;
  {
    cpu::RunBuffers inner;
    inner_buffer = inner.take(64);
    EXPECT_NE(inner_buffer, a);
  }
  // The inner run's buffer is free again: the outer run's next one is it.
  EXPECT_EQ(outer.take(64), inner_buffer);
}

TEST(RunBuffers, EachThreadHasItsOwn) {
  cpu::RunBuffers here;
  float* mine = here.take(256);
  float* theirs = nullptr;
  std::thread t([&] {
    cpu::RunBuffers there;
    theirs = there.take(256);
    for (int64_t i = 0; i < 256; ++i) theirs[i] = 5.0f;
  });
  for (int64_t i = 0; i < 256; ++i) mine[i] = 6.0f;
  t.join();
  EXPECT_NE(mine, theirs);
  for (int64_t i = 0; i < 256; ++i) ASSERT_EQ(mine[i], 6.0f);
}

}  // namespace
