// ls::getitem and ls::index_put (PyTorch's x[...] with tensors, and its assignment) against
// PyTorch's results: the shapes and values below are what PyTorch 1.13 (python3-torch) gives for
// x = torch.arange(24).reshape(2, 3, 4). python/tests/test_indexing.py fuzzes the Python side.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <lockstep/lockstep.h>
#include "unit/ops_test_util.h"

namespace ls = lockstep;
using ops_test::error_of;
using ::testing::HasSubstr;

namespace {

ls::Tensor arange_234() { return ls::reshape(ls::arange(24), {2, 3, 4}); }
ls::Tensor i64s(const std::vector<int64_t>& v, const ls::Shape& s = {}) {
  return ls::from_vector(v, s);
}
// x[..., 0] % 8 == 0: [[True, False, True], [False, True, False]].
ls::Tensor mask_23() { return ls::eq(ls::remainder(ls::select(arange_234(), 2, 0), 8), 0); }

struct Case {
  const char* python;
  std::vector<ls::IndexItem> key;
  ls::Shape shape;
  std::vector<int64_t> values;
};

}  // namespace

TEST(AdvancedIndexing, GetitemMatchesPyTorch) {
  const std::vector<Case> cases = {
      {"x[:, [2, 0]]",
       {ls::Slice(), i64s({2, 0})},
       {2, 2, 4},
       {8, 9, 10, 11, 0, 1, 2, 3, 20, 21, 22, 23, 12, 13, 14, 15}},
      // Advanced indices apart: their axes come first.
      {"x[[1, 0], :, [3, 1]]",
       {i64s({1, 0}), ls::Slice(), i64s({3, 1})},
       {2, 3},
       {15, 19, 23, 1, 5, 9}},
      {"x[mask]", {mask_23()}, {3, 4}, {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19}},
      // Broadcast together, i32 and i64, after an integer.
      {"x[0, [[1], [2]], [0, 3]]",
       {0, ls::from_vector(std::vector<int32_t>{1, 2}, {2, 1}), i64s({0, 3})},
       {2, 2},
       {4, 7, 8, 11}},
      {"x[True, 1]", {true, 1}, {1, 3, 4}, {12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23}},
      // A 0-d tensor is an integer (negative from the end).
      {"x[tensor(-1), 2]", {ls::reshape(i64s({-1}), {}), 2}, {4}, {20, 21, 22, 23}},
  };
  const ls::Tensor x = arange_234();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.python);
    const ls::Tensor y = ls::getitem(x, c.key);
    EXPECT_EQ(y.shape(), c.shape);
    EXPECT_EQ(y.to_vector<int64_t>(), c.values);
  }
}

TEST(AdvancedIndexing, IndexPutMatchesPyTorch) {
  const ls::Tensor x = arange_234();
  EXPECT_EQ(ls::index_put(x, {ls::Slice(), i64s({2, 0})}, -1).to_vector<int64_t>(),
            (std::vector<int64_t>{-1, -1, -1, -1, 4,  5,  6,  7,  -1, -1, -1, -1,
                                  -1, -1, -1, -1, 16, 17, 18, 19, -1, -1, -1, -1}));
  // A mask with one value per selected row: the mask is read.
  const ls::Tensor rows = ls::reshape(ls::mul(ls::arange(12), -1), {3, 4});
  EXPECT_EQ(ls::index_put(x, {mask_23()}, rows).to_vector<int64_t>(),
            (std::vector<int64_t>{0,  -1, -2, -3, 4,  5,  6,   7,   -4, -5, -6, -7,
                                  12, 13, 14, 15, -8, -9, -10, -11, 20, 21, 22, 23}));
  // A mask with a number: a where, the mask left unread.
  const ls::Tensor mask = mask_23();
  const ls::Tensor y = ls::index_put(x, {mask}, 100);
  EXPECT_TRUE(mask.is_pending());
  EXPECT_EQ(y.to_vector<int64_t>(),
            (std::vector<int64_t>{100, 100, 100, 100, 4,   5,   6,   7,   100, 100, 100, 100,
                                  12,  13,  14,  15,  100, 100, 100, 100, 20,  21,  22,  23}));
}

TEST(AdvancedIndexing, RepeatedIndicesLastWinsOrAddUp) {
  const ls::Tensor x = ls::zeros({4});
  const ls::Tensor v = ls::from_vector(std::vector<float>{5, 6, 7});
  EXPECT_EQ(ls::index_put(x, {i64s({1, 1, 2})}, v).to_vector<float>(),
            (std::vector<float>{0, 6, 7, 0}));
  EXPECT_EQ(ls::index_put(x, {i64s({1, 1, 2})}, v, true).to_vector<float>(),
            (std::vector<float>{0, 11, 7, 0}));
}

TEST(AdvancedIndexing, GradientsFlowBackThroughGetitemAndIndexPut) {
  ls::Tensor w = ls::ones({3, 2});
  w.set_requires_grad();
  ls::Tensor v = ls::ones({2});
  v.set_requires_grad();
  ls::step([&] {
    const ls::Tensor put = ls::index_put(ls::mul(w, 3.0), {1}, ls::mul(v, 2.0));
    ls::add(ls::sum(put), ls::sum(ls::getitem(w, {i64s({0, 0, 2})}))).backward();
  });
  // Row 1 of w*3 is overwritten: no gradient there from index_put.
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{5, 5, 0, 0, 4, 4}));
  EXPECT_EQ(v.grad().to_vector<float>(), (std::vector<float>{2, 2}));
}

TEST(AdvancedIndexing, BadKeysAreErrorsAndIndicesOutOfRangeFailAtTheRead) {
  const ls::Tensor x = arange_234();
  EXPECT_THAT(error_of([&] {
                ls::getitem(x, {0, 0, 0, i64s({0})});
              }),
              HasSubstr("too many indices"));
  EXPECT_THAT(error_of([&] {
                ls::getitem(x, {ls::Slice(), mask_23()});
              }),
              HasSubstr("does not match"));
  EXPECT_THAT(error_of([&] { ls::getitem(x, {ls::zeros({2})}); }),
              HasSubstr("i64, i32, bool or u8"));
  EXPECT_THAT(error_of([&] {
                ls::getitem(x, {i64s({0, 1}), i64s({0, 1, 2})});
              }),
              HasSubstr("do not broadcast"));
  EXPECT_THAT(error_of([&] {
                ls::index_put(x, {0}, ls::zeros({3, 3}, ls::DType::I64));
              }),
              HasSubstr("do not broadcast"));
  const ls::Tensor y = ls::getitem(x, {ls::Slice(), i64s({0, 3})});  // recorded
  EXPECT_THAT(error_of([&] { y.to_vector<int64_t>(); }), HasSubstr("out of range"));
}

TEST(AdvancedIndexing, GatheredIndicesAreCheckedBeforeAnotherGatherUsesThem) {
  // Both gathers are small steps computed from inputs, which run ahead of the checks; the one
  // whose indices come from the other must wait for that one's check (it read far out of bounds).
  const ls::Tensor ramp = i64s({0, 1});
  const ls::Tensor x = ls::from_vector(std::vector<float>{1, 2});
  const ls::Tensor y = ls::gather(x, 0, ls::gather(ramp, 0, i64s({-100000000, 0})));
  EXPECT_THAT(error_of([&] { y.to_vector<float>(); }), HasSubstr("out of range"));
}
