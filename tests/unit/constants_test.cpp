// Constant folding in the cpu backend: values computed from index ramps alone are computed once,
// at compile time, and read from the program afterwards, with the values the ref backend
// computes every run.
#include <gtest/gtest.h>

#include <cmath>

#include <lockstep/lockstep.h>

namespace ls = lockstep;

namespace {

// A table computed from arange alone (a constant), and a value that reads it.
ls::Tensor table(ls::Device d) {
  const ls::Tensor r = ls::reshape(ls::arange(48, {ls::DType::F32, d}), {6, 8});
  return ls::exp(ls::cos(ls::sin(r)));
}

std::vector<float> run(ls::Device d, const std::vector<float>& x) {
  const ls::Tensor xt = ls::from_vector<float>(x, {6, 8}, d);
  return (xt * table(d)).to_vector<float>();
}

}  // namespace

TEST(Constants, ATableFromARampIsComputedOnceAtCompileTime) {
  const ls::Device cpu = ls::parse_device("cpu"), ref = ls::parse_device("ref");
  std::vector<float> x(48);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.25f * static_cast<float>(i) - 3.0f;
  const int64_t before = ls::metrics::counter("folded_constants");
  const std::vector<float> got = run(cpu, x);
  EXPECT_GT(ls::metrics::counter("folded_constants"), before) << "nothing was folded";
  const std::vector<float> want = run(ref, x);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_FLOAT_EQ(got[i], want[i]) << "element " << i;
  // The same program again, on new data: no compile, no folding, the kept table.
  for (float& v : x) v = -v + 1.0f;
  const int64_t after_first = ls::metrics::counter("folded_constants");
  const int64_t hits = ls::metrics::counter("cache_hits");
  const std::vector<float> again = run(cpu, x);
  EXPECT_GT(ls::metrics::counter("cache_hits"), hits);
  EXPECT_EQ(ls::metrics::counter("folded_constants"), after_first);
  const std::vector<float> want_again = run(ref, x);
  for (size_t i = 0; i < again.size(); ++i)
    EXPECT_FLOAT_EQ(again[i], want_again[i]) << "element " << i;
}

TEST(Constants, AConstantOutputIsStillFreshMemory) {
  // A constant that is itself a result: computed at run time into memory of its own (from the
  // folded ramp), so writing to one result never changes another.
  const ls::Device cpu = ls::parse_device("cpu");
  ls::Tensor a = ls::cos(ls::arange(5, {ls::DType::F32, cpu}));
  ls::Tensor b = ls::cos(ls::arange(5, {ls::DType::F32, cpu}));
  const std::vector<float> va = a.to_vector<float>();
  for (int i = 0; i < 5; ++i) EXPECT_FLOAT_EQ(va[i], std::cos(static_cast<float>(i)));
  b.add_(1.0);
  const std::vector<float> va2 = a.to_vector<float>(), vb = b.to_vector<float>();
  for (int i = 0; i < 5; ++i) {
    EXPECT_FLOAT_EQ(va2[i], std::cos(static_cast<float>(i)));
    EXPECT_FLOAT_EQ(vb[i], std::cos(static_cast<float>(i)) + 1.0f);
  }
}

TEST(Constants, HostScalarsAreNeverFolded) {
  // arange(start, end, step) keeps start and step as runtime values: new values, same program,
  // right results.
  const ls::Device cpu = ls::parse_device("cpu");
  for (int start : {0, 3, -2}) {
    const std::vector<float> v =
        ls::sin(ls::arange(start, start + 8, 2, {ls::DType::F32, cpu})).to_vector<float>();
    ASSERT_EQ(v.size(), 4u);
    for (int i = 0; i < 4; ++i)
      EXPECT_FLOAT_EQ(v[i], std::sin(static_cast<float>(start + 2 * i))) << "start " << start;
  }
}
