// ls::select and basic indexing (x.index({...}), libtorch's spelling of PyTorch's x[...]) against
// PyTorch's results: the shapes and values below are what PyTorch 1.13 (python3-torch) gives for
// x = torch.arange(24).reshape(2, 3, 4).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include <lockstep/lockstep.h>
#include "unit/ops_test_util.h"

namespace ls = lockstep;
using ::testing::HasSubstr;

namespace {

struct Case {
  const char* python;
  std::vector<ls::TensorIndex> index;
  ls::Shape shape;
  std::vector<int64_t> values;
};

ls::Tensor arange_234() { return ls::reshape(ls::arange(24), {2, 3, 4}); }

}  // namespace

TEST(Indexing, BasicIndexingMatchesPyTorch) {
  const std::vector<Case> cases = {
      {"x[:, -1]", {ls::Slice(), -1}, {2, 4}, {8, 9, 10, 11, 20, 21, 22, 23}},
      {"x[..., 1:3]",
       {ls::Ellipsis, ls::Slice(1, 3)},
       {2, 3, 2},
       {1, 2, 5, 6, 9, 10, 13, 14, 17, 18, 21, 22}},
      {"x[1, None, ::2]",
       {1, ls::None, ls::Slice(std::nullopt, std::nullopt, 2)},
       {1, 2, 4},
       {12, 13, 14, 15, 20, 21, 22, 23}},
      {"x[0, 1, 2]", {0, 1, 2}, {}, {6}},
      {"x[-1, :, 1::2]",
       {-1, ls::Slice(), ls::Slice(1, std::nullopt, 2)},
       {3, 2},
       {13, 15, 17, 19, 21, 23}},
      {"x[None, ..., -2]", {ls::None, ls::Ellipsis, -2}, {1, 2, 3}, {2, 6, 10, 14, 18, 22}},
      {"x[:, 1:, :-1]",
       {ls::Slice(), ls::Slice(1), ls::Slice(std::nullopt, -1)},
       {2, 2, 3},
       {4, 5, 6, 8, 9, 10, 16, 17, 18, 20, 21, 22}},
      {"x[1:100, -5:2]",
       {ls::Slice(1, 100), ls::Slice(-5, 2)},
       {1, 2, 4},
       {12, 13, 14, 15, 16, 17, 18, 19}},
      {"x[2:1]", {ls::Slice(2, 1)}, {0, 3, 4}, {}},
  };
  const ls::Tensor x = arange_234();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.python);
    const ls::Tensor y = x.index(c.index);
    EXPECT_EQ(y.shape(), c.shape);
    EXPECT_EQ(y.to_vector<int64_t>(), c.values);
  }
  const ls::Tensor all = x.index({ls::Ellipsis, ls::None});
  EXPECT_EQ(all.shape(), (ls::Shape{2, 3, 4, 1}));
  EXPECT_EQ(all.to_vector<int64_t>(), x.to_vector<int64_t>());
}

TEST(Indexing, SelectMatchesPyTorch) {
  const ls::Tensor y = ls::select(arange_234(), 2, -1);  // x.select(2, -1)
  EXPECT_EQ(y.shape(), (ls::Shape{2, 3}));
  EXPECT_EQ(y.to_vector<int64_t>(), (std::vector<int64_t>{3, 7, 11, 15, 19, 23}));
}

TEST(Indexing, GradientsFlowBackThroughIndexing) {
  ls::Tensor w = ls::ones({2, 3});
  w.set_requires_grad();
  ls::step([&] { ls::sum(w.index({ls::Slice(), -1}) * 2.0).backward(); });
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{0, 0, 2, 0, 0, 2}));
}

TEST(Indexing, BadIndicesNameTheProblem) {
  const ls::Tensor x = arange_234();
  auto message = [&](const std::vector<ls::TensorIndex>& index) {
    return ops_test::error_of([&] { (void)x.index(index); });
  };
  EXPECT_THAT(message({ls::Slice(), 3}), HasSubstr("index 3 is out of range for axis 1 of size 3"));
  EXPECT_THAT(message({-3}), HasSubstr("index -3 is out of range for axis 0 of size 2"));
  EXPECT_THAT(message({0, 0, 0, 0}), HasSubstr("too many indices (4) for a tensor of rank 3"));
  EXPECT_THAT(message({ls::Ellipsis, 0, ls::Ellipsis}), HasSubstr("2 ellipses"));
  EXPECT_THAT(message({ls::Slice(0, 2, 0)}), HasSubstr("slice step 0 must be positive"));
  EXPECT_THROW((void)ls::select(ls::scalar_tensor(1.0), 0, 0), ls::Error);
}
