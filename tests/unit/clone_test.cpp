// ls::clone (torch.clone): the same value bit for bit in every dtype (-0.0, NaN payloads), a
// handle of its own that an in-place update of the original (or of the clone) leaves as it was,
// and gradients that flow through it as through PyTorch's clone.
#include <gtest/gtest.h>

#include <lockstep/lockstep.h>
#include <cstdint>
#include <cstring>
#include <limits>

#include "unit/ops_test_util.h"

namespace ls = lockstep;

namespace {

// The bytes of a tensor's value, read through its host memory (no conversion on the way).
std::vector<unsigned char> bytes_of(const ls::Tensor& t) {
  const ls::HostMemory m = ls::host_memory(t);
  const size_t n = static_cast<size_t>(t.numel()) * ls::dtype_size(t.dtype());
  std::vector<unsigned char> out(n);
  if (n) std::memcpy(out.data(), m.data, n);
  return out;
}

template <typename T>
ls::Tensor raw(const std::vector<T>& values, ls::DType dtype) {
  return ls::from_blob(values.data(), {static_cast<int64_t>(values.size())}, dtype,
                       ls::default_device());
}

template <typename Bits, typename Float>
Float from_bits(Bits b) {
  Float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

class Clone : public ops_test::OnTestDevice {};

}  // namespace

TEST_F(Clone, KeepsEveryValueBitForBitInEveryDtype) {
  const std::vector<float> f32 = {-0.0f,
                                  0.0f,
                                  from_bits<uint32_t, float>(0x7fc01234u),
                                  from_bits<uint32_t, float>(0xffa00001u),  // signalling, negative
                                  std::numeric_limits<float>::infinity(),
                                  -1.5f,
                                  std::numeric_limits<float>::denorm_min()};
  const std::vector<double> f64 = {-0.0, from_bits<uint64_t, double>(0x7ff8000000abcdefull),
                                   -std::numeric_limits<double>::infinity(), 1e-310};
  const std::vector<int32_t> i32 = {INT32_MIN, -1, 0, INT32_MAX};
  const std::vector<int64_t> i64 = {INT64_MIN, -1, 0, INT64_MAX};
  const std::vector<uint16_t> bf16 = {0x8000, 0x7fc1, 0xff81, 0x3f80, 0x0001};  // -0, NaNs, 1, tiny
  const std::vector<unsigned char> b8 = {1, 0, 1};
  for (const ls::Tensor& x :
       {raw(f32, ls::DType::F32), raw(f64, ls::DType::F64), raw(i32, ls::DType::I32),
        raw(i64, ls::DType::I64), raw(bf16, ls::DType::BF16), raw(b8, ls::DType::Bool)}) {
    SCOPED_TRACE(ls::dtype_name(x.dtype()));
    const ls::Tensor c = ls::clone(x);
    EXPECT_FALSE(c.is_same(x));
    EXPECT_EQ(c.dtype(), x.dtype());
    EXPECT_EQ(c.shape(), x.shape());
    EXPECT_FALSE(c.is_pending());  // the value is shared, not computed again
    EXPECT_EQ(bytes_of(c), bytes_of(x));
  }
}

TEST_F(Clone, OfAPendingValueIsThatValue) {
  const ls::Tensor x = ls::neg(ops_test::f32({0.0f, -2.0f, 3.0f}));  // -0.0 first
  const ls::Tensor c = ls::clone(x);
  EXPECT_TRUE(c.is_pending());
  EXPECT_EQ(ops_test::bits(c), (std::vector<uint32_t>{0x80000000u, 0x40000000u, 0xc0400000u}));
  EXPECT_EQ(ops_test::bits(x), ops_test::bits(c));
}

TEST_F(Clone, AnInPlaceUpdateOfEitherLeavesTheOther) {
  ls::Tensor x = ops_test::f32({1, 2, 3});
  ls::Tensor c = ls::clone(x);
  x.add_(10);
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{11, 12, 13}));
  EXPECT_EQ(c.to_vector<float>(), (std::vector<float>{1, 2, 3}));
  c.mul_(-1);
  EXPECT_EQ(c.to_vector<float>(), (std::vector<float>{-1, -2, -3}));
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{11, 12, 13}));
}

TEST(CloneInStep, AParameterUpdatedInPlaceLeavesItsClone) {
  // In a step, the cpu backend updates a value in place when nothing else holds it: the clone
  // holds it.
  ls::Tensor w = ls::ones({64});
  ls::sync();
  const ls::Tensor before = ls::clone(w);
  for (int i = 0; i < 3; ++i) ls::step([&] { w.mul_(2); });
  EXPECT_EQ(w.to_vector<float>(), std::vector<float>(64, 8.0f));
  EXPECT_EQ(before.to_vector<float>(), std::vector<float>(64, 1.0f));
}

TEST_F(Clone, GradientsFlowThroughItAsThroughPyTorchs) {
  ls::Tensor x = ops_test::f32({1, -2, 3});
  x.set_requires_grad();
  const ls::Tensor c = ls::clone(x);
  EXPECT_TRUE(c.requires_grad());
  ls::sum(ls::mul(c, c)).backward();
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{2, -4, 6}));
  EXPECT_FALSE(c.grad().defined());  // not a leaf: its gradient goes on to x
  // A clone of a tensor without gradients has none either.
  EXPECT_FALSE(ls::clone(ops_test::f32({1})).requires_grad());
}
