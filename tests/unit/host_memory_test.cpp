// Host memory: large buffers released by one step are reused by the next (no fresh pages from
// the system every step), and every buffer still has the size asked for.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include <lockstep/lockstep.h>
#include "backends/backend.h"

namespace backends = lockstep::backends;

TEST(HostMemory, ALargeBufferIsReusedAfterRelease) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "under AddressSanitizer released buffers go back to the system";
#endif
  const size_t bytes = size_t{3} << 20;
  void* first = nullptr;
  {
    auto a = backends::alloc_host(bytes);
    first = a->data();
    ASSERT_NE(first, nullptr);
    EXPECT_EQ(a->bytes(), bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 64, 0u);
    std::memset(first, 1, bytes);  // the whole size is usable
  }
  auto b = backends::alloc_host(bytes);
  EXPECT_EQ(b->data(), first) << "the released buffer was not reused";
  // A slightly different size of the same class takes the next released one too, and reports
  // its own size.
  void* second = b->data();
  b.reset();
  auto c = backends::alloc_host(bytes - 1000);
  EXPECT_EQ(c->data(), second);
  EXPECT_EQ(c->bytes(), bytes - 1000);
  // While it is held, a new buffer is a different one.
  auto d = backends::alloc_host(bytes);
  EXPECT_NE(d->data(), c->data());
}

TEST(HostMemory, SmallAndEmptyBuffers) {
  auto a = backends::alloc_host(100);
  ASSERT_NE(a->data(), nullptr);
  EXPECT_EQ(a->bytes(), 100u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data()) % 64, 0u);
  auto e = backends::alloc_host(0);
  EXPECT_EQ(e->bytes(), 0u);
}

// A loop over many shapes releases buffers of sizes it never asks for again: what is kept for
// reuse stays within the bytes in use (at least 64 MiB), the oldest going back first. Before, it
// kept up to 1 GiB of them (a run over thousands of batch sizes grew by 0.5 MB a shape).
TEST(HostMemory, BuffersOfSizesNoLongerUsedGoBackToTheSystem) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "under AddressSanitizer released buffers go back to the system";
#endif
  const size_t limit = std::max(backends::host_memory_in_use(), size_t{64} << 20);
  size_t released = 0;
  for (int i = 0; i < 300; ++i) {
    const size_t bytes = (size_t{1} << 20) + static_cast<size_t>(i) * (size_t{13} << 12);
    backends::alloc_host(bytes);  // released at once
    released += bytes;
    ASSERT_LE(backends::host_memory_kept(), limit) << "after " << i + 1 << " sizes";
  }
  EXPECT_GT(released, 2 * limit);
  // The most recent ones are still there for the next step to take.
  EXPECT_GT(backends::host_memory_kept(), size_t{0});
}

// The compile cache keeps 64 programs, but only the 8 run most recently keep their arena: a
// program pushed past them by newer ones gives its arena back (its next run takes one again).
TEST(HostMemory, ProgramsNotRunLatelyKeepNoArena) {
  namespace ls = lockstep;
  auto run = [](int64_t rows) {
    const ls::Tensor x = ls::randn({rows, 256});
    const ls::Tensor h = ls::relu(ls::matmul(x, ls::randn({256, 256})));
    return ls::sum(ls::mul(h, h)).item<float>();
  };
  run(4096);  // intermediates of 4 MiB each in its arena
  ls::wait();
  const size_t after_big = backends::host_memory_in_use();
  for (int64_t rows = 1; rows <= 9; ++rows) run(rows);
  ls::wait();
  EXPECT_LT(backends::host_memory_in_use() + (size_t{4} << 20), after_big);
  // Run again, it is as before.
  EXPECT_GT(run(4096), 0.0f);
}

// A training loop whose steps are queued ahead of the one running keeps no more memory than one
// that waits for each step: a step's record of the values to restore if it fails (the previous
// gradients among them) goes as soon as its program is past its checks while the loop's thread
// waits for room, not when that thread next queues a program, after the next program has taken
// memory for its own gradients. Before, two more sets of gradients stayed resident (a ResNet-50
// training run: 739 MiB at its peak, 560 after).
TEST(HostMemory, QueuedStepsKeepNoMoreThanStepsWaitedFor) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "under AddressSanitizer released buffers go back to the system";
#endif
  namespace ls = lockstep;
  ls::manual_seed(0);
  // A weight of 16 MiB; every other value of the step is small beside it.
  auto model = std::make_shared<ls::nn::Linear>(2048, 2048, false);
  ls::optim::SGD opt(model->parameters(), {.lr = 0.01, .momentum = 0.9});
  const ls::Tensor x = ls::randn({4, 2048});
  // Resident: in use, or kept for reuse.
  auto train = [&](int steps, bool wait_each) {
    for (int i = 0; i < steps; ++i) {
      ls::step([&] {
        opt.zero_grad();
        ls::sum(ls::mul((*model)(x), (*model)(x))).backward();
        opt.step();
      });
      if (wait_each) ls::wait();
    }
    ls::wait();
    return backends::host_memory_in_use() + backends::host_memory_kept();
  };
  const size_t waited = train(4, true);  // compiled, the momentum made
  for (const bool wait_each : {false, true, false}) {
    SCOPED_TRACE(wait_each ? "waiting for each step" : "steps queued ahead");
    EXPECT_LE(train(12, wait_each), waited + (size_t{1} << 20));
  }
}
