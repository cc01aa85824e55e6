// A first end-to-end check: record, sync, read.
#include <gtest/gtest.h>

#include <lockstep/lockstep.h>

namespace ls = lockstep;

TEST(Smoke, AddAndRead) {
  ls::Tensor a = ls::from_vector<float>({1, 2, 3});
  ls::Tensor b = a + 1.5f;
  EXPECT_TRUE(b.is_pending());
  EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{2.5f, 3.5f, 4.5f}));
  EXPECT_FALSE(b.is_pending());
}
