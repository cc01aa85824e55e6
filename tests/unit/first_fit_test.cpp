// plan::FirstFit against a plain first-fit placement (every live value scanned at every
// placement): the same offsets and peak for random programs of values of random sizes (zero
// included) and lifetimes; then a program that keeps 200,000 values live at once (a backward's
// activations), which the plain scan placed in quadratic time.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "plan/first_fit.h"

namespace {

// The reference: live values sorted by offset, scanned from the bottom.
struct PlainFirstFit {
  struct Block {
    size_t offset, size;
    int64_t last;
  };
  std::vector<Block> live;
  size_t peak = 0;
  size_t place(size_t size, int64_t now, int64_t last) {
    std::erase_if(live, [&](const Block& b) { return b.last < now; });
    std::sort(live.begin(), live.end(),
              [](const Block& a, const Block& b) { return a.offset < b.offset; });
    size_t offset = 0;
    for (const Block& b : live) {
      if (b.offset >= offset + size) break;
      offset = std::max(offset, b.offset + b.size);
    }
    if (size > 0) live.push_back({offset, size, last});
    peak = std::max(peak, offset + size);
    return offset;
  }
};

TEST(FirstFit, PlacesAsAPlainFirstFitScan) {
  std::mt19937_64 rng(7);
  for (int program = 0; program < 200; ++program) {
    lockstep::plan::FirstFit fit;
    PlainFirstFit plain;
    const int steps = 1 + static_cast<int>(rng() % 300);
    const int64_t max_life = 1 + static_cast<int64_t>(rng() % 40);
    for (int64_t now = 0; now < steps; ++now) {
      const size_t size = rng() % 5 == 0 ? 0 : 1 + rng() % (rng() % 2 ? 64 : 4096);
      const int64_t last = now + static_cast<int64_t>(rng() % static_cast<uint64_t>(max_life));
      ASSERT_EQ(fit.place(size, now, last), plain.place(size, now, last))
          << "program " << program << " step " << now;
    }
    EXPECT_EQ(fit.peak(), plain.peak);
  }
}

TEST(FirstFit, ManyValuesLiveAtOnce) {
  // 200,000 values placed one after another and all live until the end, then a second wave that
  // reuses the gaps the first leaves: every value has its own place, none overlap.
  lockstep::plan::FirstFit fit;
  constexpr int64_t n = 200000;
  size_t expect = 0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(fit.place(16, i, n + (i % 2 == 0 ? 0 : n)), expect);
    expect += 16;
  }
  // The even values die at step n; the odd ones live on: the next 16-byte values fill the holes
  // from the bottom.
  EXPECT_EQ(fit.place(16, n + 1, 3 * n), 0u);
  EXPECT_EQ(fit.place(16, n + 2, 3 * n), 32u);
  EXPECT_EQ(fit.place(32, n + 3, 3 * n), 16u * static_cast<size_t>(n));  // no hole is that long
  EXPECT_EQ(fit.peak(), 16u * static_cast<size_t>(n) + 32u);
}

}  // namespace
