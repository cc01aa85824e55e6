// Tensors are never views: every op called where it changes nothing (cat of one, roll by 0, a
// reshape to the same shape, ...) still returns a handle of its own, so an in-place update of
// the argument afterwards leaves the result as it was. Not the ops' values (their own tests).
#include <gtest/gtest.h>

#include <lockstep/lockstep.h>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "unit/ops_test_util.h"

namespace ls = lockstep;

namespace {

class NotViews : public ops_test::OnTestDevice {};

using Op = std::function<ls::Tensor(const ls::Tensor&)>;

// Each op in the case where its result has the argument's value (a 2x3 f32 argument).
std::vector<std::pair<std::string, Op>> identity_cases() {
  auto identity = std::make_shared<ls::nn::Identity>();
  auto empty_sequential = std::make_shared<ls::nn::Sequential>();
  return {
      {"clone", [](const ls::Tensor& w) { return ls::clone(w); }},
      {"concat of one", [](const ls::Tensor& w) { return ls::concat({w}, 0); }},
      {"stack then select", [](const ls::Tensor& w) { return ls::select(ls::stack({w}), 0, 0); }},
      {"roll by 0", [](const ls::Tensor& w) { return ls::roll(w, {0}, {0}); }},
      {"roll by the size", [](const ls::Tensor& w) { return ls::roll(w, {3}, {1}); }},
      {"roll flattened by 0", [](const ls::Tensor& w) { return ls::roll(w, {0}); }},
      {"flip of no axes", [](const ls::Tensor& w) { return ls::flip(w, {}); }},
      {"cast to its dtype", [](const ls::Tensor& w) { return ls::cast(w, ls::DType::F32); }},
      {"reshape to its shape",
       [](const ls::Tensor& w) {
         return ls::reshape(w, {2, 3});
       }},
      {"reshape with -1",
       [](const ls::Tensor& w) {
         return ls::reshape(w, {2, -1});
       }},
      {"expand to its shape",
       [](const ls::Tensor& w) {
         return ls::expand(w, {2, 3});
       }},
      {"permute by identity",
       [](const ls::Tensor& w) {
         return ls::permute(w, {0, 1});
       }},
      {"transpose of an axis with itself",
       [](const ls::Tensor& w) { return ls::transpose(w, 1, 1); }},
      {"movedim to itself", [](const ls::Tensor& w) { return ls::movedim(w, 0, 0); }},
      {"flatten of one axis", [](const ls::Tensor& w) { return ls::flatten(w, 1, 1); }},
      {"slice of everything", [](const ls::Tensor& w) { return ls::slice(w, 1, 0, 3); }},
      {"narrow of everything", [](const ls::Tensor& w) { return ls::narrow(w, 0, 0, 2); }},
      {"index with an ellipsis", [](const ls::Tensor& w) { return ls::index(w, {ls::Ellipsis}); }},
      {"index with a full slice",
       [](const ls::Tensor& w) {
         return ls::index(w, {ls::Slice(), ls::Slice()});
       }},
      {"repeat by ones",
       [](const ls::Tensor& w) {
         return ls::repeat(w, {1, 1});
       }},
      {"pad by nothing",
       [](const ls::Tensor& w) {
         return ls::pad(w, {{0, 0}, {0, 0}});
       }},
      {"chunk into one", [](const ls::Tensor& w) { return ls::chunk(w, 1, 0)[0]; }},
      {"split into one", [](const ls::Tensor& w) { return ls::split(w, 2, 0)[0]; }},
      {"clamp with no effect",
       [](const ls::Tensor& w) { return ls::clamp(w, ls::Tensor(), ls::full({}, 1e30f)); }},
      {"einsum ij->ij", [](const ls::Tensor& w) { return ls::einsum("ij->ij", {w}); }},
      {"dropout when not training",
       [](const ls::Tensor& w) { return ls::nn::dropout(w, 0.5, false); }},
      {"dropout with p = 0", [](const ls::Tensor& w) { return ls::nn::dropout(w, 0.0, true); }},
      {"to its own device", [](const ls::Tensor& w) { return w.to(w.device()); }},
      {"to its own dtype", [](const ls::Tensor& w) { return w.to(ls::DType::F32); }},
      {"detach", [](const ls::Tensor& w) { return w.detach(); }},
      {"nn::Identity", [identity](const ls::Tensor& w) { return (*identity)(w); }},
      {"empty nn::Sequential",
       [empty_sequential](const ls::Tensor& w) { return (*empty_sequential)(w); }},
  };
}

}  // namespace

TEST_F(NotViews, EveryOpInItsIdentityCaseReturnsAHandleOfItsOwn) {
  for (auto& [name, op] : identity_cases()) {
    SCOPED_TRACE(name);
    ls::Tensor w = ops_test::f32({1, 2, 3, 4, 5, 6}, {2, 3});
    const ls::Tensor r = op(w);
    EXPECT_FALSE(r.is_same(w));
    w.add_(10);
    EXPECT_EQ(r.to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
    EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{11, 12, 13, 14, 15, 16}));
  }
}

TEST_F(NotViews, AResultOfAPendingArgumentKeepsItsValueToo) {
  for (auto& [name, op] : identity_cases()) {
    SCOPED_TRACE(name);
    ls::Tensor w = ls::neg(ops_test::f32({-1, -2, -3, -4, -5, -6}, {2, 3}));
    const ls::Tensor r = op(w);
    EXPECT_FALSE(r.is_same(w));
    w.mul_(0);
    EXPECT_EQ(r.to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  }
}

// Writing through the host memory (the DLPack export) of a result changes that result alone,
// and writing through the argument's changes the argument alone, in each identity case.
TEST_F(NotViews, WritesThroughAnExportChangeOnlyTheExportedHandle) {
  for (auto& [name, op] : identity_cases()) {
    SCOPED_TRACE(name);
    ls::Tensor w = ops_test::f32({1, 2, 3, 4, 5, 6}, {2, 3});
    ls::Tensor r = op(w);
    {
      ls::HostMemory m = ls::host_memory(r);
      static_cast<float*>(m.data)[0] = 100;
    }
    EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
    EXPECT_EQ(r.to_vector<float>(), (std::vector<float>{100, 2, 3, 4, 5, 6}));
    {
      ls::HostMemory m = ls::host_memory(w);
      static_cast<float*>(m.data)[1] = 200;
    }
    EXPECT_EQ(r.to_vector<float>(), (std::vector<float>{100, 2, 3, 4, 5, 6}));
    EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{1, 200, 3, 4, 5, 6}));
    // A handle whose value nothing else shares exports the same memory every time.
    EXPECT_EQ(ls::host_memory(w).data, ls::host_memory(w).data);
  }
}

TEST(NotViewsInStep, ASnapshotOfAWeightTakenWithConcatHoldsTheOldWeights) {
  ls::Tensor w = ls::ones({4});
  ls::sync();
  const ls::Tensor snapshot = ls::concat({w}, 0);
  ls::step([&] { w.mul_(3); });
  EXPECT_EQ(w.to_vector<float>(), std::vector<float>(4, 3.0f));
  EXPECT_EQ(snapshot.to_vector<float>(), std::vector<float>(4, 1.0f));
}

TEST_F(NotViews, AnOpOfNoWorkRecordsNothing) {
  // The handle of its own costs no node: reading it computes nothing new.
  ls::Tensor w = ops_test::f32({1, 2, 3, 4, 5, 6}, {2, 3});
  const ls::Tensor r = ls::reshape(ls::roll(ls::concat({w}, 0), {0}, {0}), {2, 3});
  EXPECT_FALSE(r.is_pending());
}

TEST_F(NotViews, SortAndTopkOfA0dTensorAreHandlesOfTheirOwn) {
  ls::Tensor w = ls::full({}, 5.0);
  const ls::Tensor sorted = ls::sort(w).values;
  const ls::Tensor top = ls::topk(w, 1).values;
  EXPECT_FALSE(sorted.is_same(w));
  EXPECT_FALSE(top.is_same(w));
  w.add_(1);
  EXPECT_EQ(sorted.item<float>(), 5.0f);
  EXPECT_EQ(top.item<float>(), 5.0f);
}

TEST_F(NotViews, PiecesOfAnEmptyAxisAreHandlesOfTheirOwn) {
  const ls::Tensor w = ls::zeros({0, 2});
  for (const ls::Tensor& piece : ls::split(w, 0, 0)) EXPECT_FALSE(piece.is_same(w));
  const std::vector<ls::Tensor> pieces = ls::chunk(w, 3, 0);
  ASSERT_EQ(pieces.size(), 3u);
  for (const ls::Tensor& piece : pieces) EXPECT_FALSE(piece.is_same(w));
  EXPECT_FALSE(pieces[0].is_same(pieces[1]));
}
