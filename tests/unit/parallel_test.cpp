// parallel_for and parallel_region (src/backends/cpu/parallel.h): below the size threshold the
// body runs on the calling thread without OpenMP, and a body called by a thread of another team
// still does all of its own work (its `omp for` does not share out the enclosing team's). The
// user's thread, which compiles, never starts an OpenMP team of its own.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstdint>
#include <filesystem>
#include <thread>
#include <vector>

#include <lockstep/lockstep.h>
#include "backends/cpu/parallel.h"

namespace cpu = lockstep::backends::cpu;

namespace {

// Two OpenMP threads while alive, whatever the machine; then the count as it was.
struct TwoThreads {
  int before = omp_get_max_threads();
  TwoThreads() { omp_set_num_threads(2); }
  ~TwoThreads() { omp_set_num_threads(before); }
};

TEST(Parallel, SmallWorkRunsInOrderOnTheCallingThread) {
  std::vector<int64_t> order;
  cpu::parallel_for(false, 100, [&](int64_t i) {
    EXPECT_EQ(omp_get_level(), 0);
    order.push_back(i);
  });
  ASSERT_EQ(order.size(), 100u);
  for (int64_t i = 0; i < 100; ++i) EXPECT_EQ(order[static_cast<size_t>(i)], i);
  int calls = 0;
  cpu::parallel_region(false, [&] {
    EXPECT_EQ(omp_get_level(), 0);
    EXPECT_EQ(omp_get_num_threads(), 1);
    ++calls;
  });
  EXPECT_EQ(calls, 1);
}

TEST(Parallel, LargeWorkCoversEveryIndexOnce) {
  const TwoThreads two;
  std::vector<int> hits(10000, 0);
  cpu::parallel_for(true, 10000, [&](int64_t i) { ++hits[static_cast<size_t>(i)]; });
  for (int h : hits) ASSERT_EQ(h, 1);
  std::vector<int> rows(1000, 0);
  cpu::parallel_region(true, [&] {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < 1000; ++i) ++rows[static_cast<size_t>(i)];
  });
  for (int h : rows) ASSERT_EQ(h, 1);
}

TEST(Parallel, ARegionInsideAnotherTeamDoesAllOfItsWork) {
  // Each outer iteration runs a region whose `omp for` must cover all its rows: bound to the
  // outer team instead, each thread would do only its share of every inner loop.
  const TwoThreads two;
  std::vector<std::vector<int>> rows(8, std::vector<int>(64, 0));
#pragma omp parallel for schedule(static)
  for (int64_t outer = 0; outer < 8; ++outer)
    for (bool threaded : {false, true})
      cpu::parallel_region(threaded, [&] {
#pragma omp for schedule(static)
        for (int64_t i = 0; i < 64; ++i) ++rows[static_cast<size_t>(outer)][static_cast<size_t>(i)];
      });
  for (const auto& r : rows)
    for (int h : r) ASSERT_EQ(h, 2);
}

// The threads of this process.
size_t process_threads() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/task"))
    ++n;
  return n;
}

// A team started by a user's thread stays, idle, beside the runtime thread's: libgomp then
// manages more threads than there are cores and cuts every team's spinning to almost nothing,
// so the runtime's threads sleep and are woken by the kernel between parallel regions. Compiling
// a program happens on the user's thread; the process's first product (oneDNN's setup) too.
TEST(Parallel, CompilingOnAUsersThreadStartsNoTeamThere) {
  lockstep::set_num_threads(2);
  // The runtime thread and its team, from a program without products.
  (lockstep::rand({1 << 20}) + 1).sum().item<float>();
  size_t before = 0, after = 0;
  std::thread user([&] {
    before = process_threads();
    const lockstep::Tensor a = lockstep::rand({256, 256}), b = lockstep::rand({256, 256});
    lockstep::matmul(a, b).sum().item<float>();
    after = process_threads();
  });
  user.join();
  EXPECT_EQ(after, before) << "the user's thread started threads of its own";
}

}  // namespace

// Denormals are flushed to zero by default, in every thread of the program's team (a large
// elementwise product is split over 2 threads); ls::set_flush_denormal(false) keeps them.
TEST(Denormals, FlushedToZeroByDefaultAndKeptWhenAsked) {
  namespace ls = lockstep;
  ASSERT_TRUE(ls::flush_denormal());
  ls::set_num_threads(2);
  const int64_t n = 1 << 20;
  const std::vector<float> tiny(n, 1e-30f);
  auto product = [&] {
    ls::Tensor x = ls::from_vector<float>(tiny);
    ls::Tensor d = ls::from_vector<float>(std::vector<float>(n, 1e-40f));  // denormal input
    return std::pair{(x * 1e-10f).to_vector<float>(), (d * 2.0f).to_vector<float>()};
  };
  auto [flushed, doubled] = product();
  for (int64_t i : {int64_t{0}, n / 2 + 1, n - 1}) {
    EXPECT_EQ(flushed[i], 0.0f) << i;  // FTZ: a denormal result is zero
    EXPECT_EQ(doubled[i], 0.0f) << i;  // DAZ: a denormal input reads as zero
  }
  EXPECT_TRUE(ls::set_flush_denormal(false));
  auto [kept, kept_doubled] = product();
  EXPECT_TRUE(ls::set_flush_denormal(true));
  ls::set_num_threads(0);
  for (int64_t i : {int64_t{0}, n / 2 + 1, n - 1}) {
    EXPECT_GT(kept[i], 0.0f) << i;
    EXPECT_LT(kept[i], 1.2e-38f) << i;
    EXPECT_FLOAT_EQ(kept_doubled[i], 2e-40f) << i;
  }
}
