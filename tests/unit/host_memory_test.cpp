// Host memory: large buffers released by one step are reused by the next (no fresh pages from
// the system every step), and every buffer still has the size asked for.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

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
