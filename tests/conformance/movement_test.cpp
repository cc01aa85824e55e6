// Conformance of the movement and indexing ops: reshape (incl. aliases that are outputs),
// permute, expand, slice with steps, concat, pad, gather and scatter_add, over every dtype,
// 0-d, size-1 and empty dims and > 100k-element tensors.
#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>

#include "conformance.h"

namespace conformance {
namespace {

class Movement : public Conformance {};
class Indexing : public Conformance {};

const std::vector<ls::DType> kAll = {ls::f32, ls::f64, ls::bf16,   ls::i32,
                                     ls::i64, ls::u8,  ls::boolean};

LS_COVERS(Movement, Reshape, Op::Reshape, Op::Mul);
TEST_F(Movement, Reshape) {
  for (ls::DType dt : kAll)
    for (const ls::Shape& s : shapes_all()) {
      ls::Shape reversed(s.rbegin(), s.rend());
      check("reshape " + str(dt), {{s, dt}}, [&](const Tensors& x) {
        const ls::Tensor flat = ls::reshape(x[0], {-1});
        const ls::Tensor back = ls::reshape(flat, reversed);
        const ls::Tensor twice = ls::reshape(ls::reshape(x[0], {1, -1}), s);
        return Tensors{flat, back, twice, ls::unsqueeze(x[0], 0)};
      });
    }
  // Reshapes whose operands or results are also outputs, or feed fused ops (the cpu backend
  // aliases reshapes it does not have to copy).
  for (const ls::Shape& s : {ls::Shape{6, 35}, ls::Shape{}, ls::Shape{0, 4}, ls::Shape{300, 401}})
    check("reshape aliases", {{s}}, [](const Tensors& x) {
      const ls::Tensor y = x[0] * 2.0f;
      const ls::Tensor r = ls::reshape(y, {-1});
      const ls::Tensor rr = ls::reshape(r, {1, -1});
      const ls::Tensor z = ls::exp(ls::reshape(ls::reshape(x[0], {-1}), {1, -1})) + rr;
      return Tensors{y, r, z, ls::reshape(ls::sum(z, {1}), {}), ls::reshape(x[0], {-1})};
    });
}

LS_COVERS(Movement, Permute, Op::Permute);
TEST_F(Movement, Permute) {
  const std::vector<ls::Shape> shapes = {
      {},
      {7},
      {3, 5},
      {1, 17},
      {2, 0, 3},
      {3, 5, 7},
      {2, 1, 33},
      {4, 3, 2, 5},
      {1, 3, 1, 5, 2},
      {1031, 131},
      {8, 64, 17, 13},
      // transposes done in tiles and 8x8 register blocks, with partial tiles at both edges
      {3, 40, 24},
      {2, 16, 9, 40}};
  for (ls::DType dt : kAll)
    for (const ls::Shape& s : shapes) {
      std::vector<int64_t> perm(s.size());
      std::iota(perm.begin(), perm.end(), 0);
      int count = 0;
      // Every permutation up to rank 3; a spread of them above.
      do {
        if (s.size() > 3 && count++ % 7 != 3) continue;
        check1("permute " + str(dt) + " " + str(perm), {{s, dt}},
               [&](const Tensors& x) { return ls::permute(x[0], perm); });
      } while (std::next_permutation(perm.begin(), perm.end()));
    }
  check("permute chains", {{{6, 5, 4, 3}}}, [](const Tensors& x) {
    const ls::Tensor p = ls::permute(x[0], {3, 1, 0, 2});
    return Tensors{p, ls::permute(p, {2, 1, 3, 0}), ls::transpose(p, 0, -1) * 3.0f};
  });
}

LS_COVERS(Movement, Expand, Op::Expand);
TEST_F(Movement, Expand) {
  const std::vector<std::pair<ls::Shape, ls::Shape>> cases = {{{}, {4, 5}},
                                                              {{1}, {0}},
                                                              {{3, 1}, {2, 3, 5}},
                                                              {{1, 1, 7}, {5, 3, 7}},
                                                              {{2, 1, 3}, {2, 4, 3}},
                                                              {{1, 0}, {6, 0}},
                                                              {{5}, {1, 5}},
                                                              {{1, 131}, {1031, 131}},
                                                              {{1031, 1}, {1031, 131}},
                                                              {{3, 1, 1}, {3, 129, 257}}};
  for (ls::DType dt : kAll)
    for (const auto& [from, to] : cases)
      check("expand " + str(dt) + " to " + str(to), {{from, dt}}, [&](const Tensors& x) {
        const ls::Tensor e = ls::expand(x[0], to);
        return Tensors{e, ls::cast(e, ls::f32) + 1.0f};
      });
}

LS_COVERS(Movement, Slice, Op::Slice);
TEST_F(Movement, Slice) {
  for (ls::DType dt : kAll)
    for (const ls::Shape& s : {ls::Shape{7, 17, 33}, ls::Shape{1, 5}, ls::Shape{0, 9}}) {
      for (size_t axis = 0; axis < s.size(); ++axis) {
        const int64_t n = s[axis];
        const std::vector<std::array<int64_t, 3>> ranges = {
            {0, n, 1}, {1, n - 1, 2}, {2, n, 3}, {-5, -1, 1}, {n, n, 1}, {0, n, 5}, {3, 2, 1}};
        for (const auto& r : ranges)
          check1(
              "slice " + str(dt) + " axis " + std::to_string(axis) + " " + str({r[0], r[1], r[2]}),
              {{s, dt}}, [&](const Tensors& x) {
                return ls::slice(x[0], static_cast<int64_t>(axis), r[0], r[1], r[2]);
              });
      }
    }
  for (ls::DType dt : {ls::f32, ls::f64})
    check("large slices " + str(dt), {{{1031, 131}, dt}}, [](const Tensors& x) {
      return Tensors{ls::slice(x[0], 0, 1, 1031, 3), ls::slice(x[0], 1, 0, 131, 2),
                     ls::slice(ls::slice(x[0], 0, 5, -5, 2), 1, 3, 120, 7) * 2.0};
    });
}

LS_COVERS(Movement, Concat, Op::Concat);
TEST_F(Movement, Concat) {
  for (ls::DType dt : kAll) {
    check1("concat axis 0 " + str(dt), {{{3, 4}, dt}, {{0, 4}, dt}, {{1, 4}, dt}},
           [](const Tensors& x) {
             return ls::concat({x[0], x[1], x[2], x[0]}, 0);
           });
    check1("concat axis 1 " + str(dt), {{{3, 4}, dt}, {{3, 1}, dt}, {{3, 0}, dt}},
           [](const Tensors& x) {
             return ls::concat({x[0], x[1], x[2]}, 1);
           });
    check1("concat last axis " + str(dt), {{{2, 3, 5}, dt}, {{2, 3, 7}, dt}}, [](const Tensors& x) {
      return ls::concat({x[1], x[0]}, -1);
    });
    check1("concat of empties " + str(dt), {{{2, 0, 5}, dt}, {{2, 0, 5}, dt}},
           [](const Tensors& x) {
             return ls::concat({x[0], x[1]}, 0);
           });
    check1("concat large " + str(dt), {{{1031, 131}, dt}, {{1031, 7}, dt}}, [](const Tensors& x) {
      return ls::concat({x[0], x[1], x[0]}, 1);
    });
  }
  check1("concat of computed values", {{{3, 5}}, {{5, 3}}}, [](const Tensors& x) {
    return ls::concat({ls::exp(x[0]), ls::transpose(x[1], 0, 1) * 1.0f, x[0]}, 0);
  });
}

LS_COVERS(Movement, Pad, Op::Pad);
TEST_F(Movement, Pad) {
  using Pads = std::vector<std::pair<int64_t, int64_t>>;
  const std::vector<std::pair<ls::Shape, Pads>> cases = {
      {{}, {}},
      {{7}, {{2, 3}}},
      {{3, 4}, {{0, 0}, {1, 2}}},
      {{0, 3}, {{1, 1}, {0, 2}}},
      {{2, 3, 5}, {{1, 0}, {0, 1}, {2, 2}}},
      {{1, 3, 7, 9}, {{0, 0}, {0, 0}, {1, 1}, {3, 0}}},
      {{1031, 131}, {{1, 2}, {3, 4}}},
      {{4, 0}, {{1, 1}, {2, 3}}},                      // an empty input, padded
      {{16, 64, 384}, {{0, 0}, {0, 0}, {128, 128}}}};  // a split's gradient
  for (ls::DType dt : kAll)
    for (const auto& [s, pads] : cases) {
      check1("pad " + str(dt), {{s, dt}},
             [&](const Tensors& x) { return ls::pad(x[0], pads, dt == ls::boolean ? 1 : 3); });
      if (ls::is_floating(dt))
        check1("pad with NaN " + str(dt), {{s, dt}},
               [&](const Tensors& x) { return ls::pad(x[0], pads, std::nan("")); });
    }
}

// Index values in [0, n) (a negative one is an error, as in PyTorch).
In index(const ls::Shape& s, int64_t n) { return {s, ls::i64, Fill::Range, 0, n}; }

LS_COVERS(Indexing, Gather, Op::Gather);
TEST_F(Indexing, Gather) {
  for (ls::DType dt : kAll) {
    check1("gather axis 0 " + str(dt), {{{5, 4}, dt}, index({7, 3}, 5)},
           [](const Tensors& x) { return ls::gather(x[0], 0, x[1]); });
    check1("gather axis 1 " + str(dt), {{{5, 4}, dt}, index({5, 9}, 4)},
           [](const Tensors& x) { return ls::gather(x[0], 1, x[1]); });
    check1("gather 3-d " + str(dt), {{{3, 6, 5}, dt}, index({2, 4, 5}, 6)},
           [](const Tensors& x) { return ls::gather(x[0], 1, x[1]); });
    check1("gather empty index " + str(dt), {{{3, 6}, dt}, index({3, 0}, 6)},
           [](const Tensors& x) { return ls::gather(x[0], 1, x[1]); });
    check1("gather large " + str(dt), {{{1031, 131}, dt}, index({1031, 150}, 131)},
           [](const Tensors& x) { return ls::gather(x[0], 1, x[1]); });
  }
  // An index broadcast from a smaller one (index_select's, an embedding's): the cpu kernel reads
  // it through the Expand, a row at a time.
  for (ls::DType dt : kAll) {
    check1("index_select rows " + str(dt), {{{1031, 131}, dt}, index({700}, 1031)},
           [](const Tensors& x) { return ls::index_select(x[0], 0, x[1]); });
    check1("index_select columns " + str(dt), {{{67, 131}, dt}, index({300}, 131)},
           [](const Tensors& x) { return ls::index_select(x[0], 1, x[1]); });
    check1("index_select middle axis " + str(dt), {{{5, 40, 33}, dt}, index({9}, 40)},
           [](const Tensors& x) { return ls::index_select(x[0], 1, x[1]); });
    check("broadcast index kept too " + str(dt), {{{9, 5}, dt}, index({4, 1}, 9)},
          [](const Tensors& x) {
            const ls::Tensor i = ls::expand(x[1], {4, 5});
            return Tensors{ls::gather(x[0], 0, i), i};
          });
  }
  check1("gather of computed values", {{{4, 7}}, index({4, 2}, 7)},
         [](const Tensors& x) { return ls::gather(ls::exp(x[0]) * 2.0f, 1, x[1]) + 1.0f; });
}

LS_COVERS(Indexing, Argsort, Op::Argsort, Op::Gather);
TEST_F(Indexing, Argsort) {
  const std::vector<ls::Shape> shapes = {{},     {1},       {7},         {0, 3},
                                         {3, 5}, {4, 1, 6}, {2, 3, 129}, {1031, 17}};
  for (ls::DType dt : kAll)
    for (const ls::Shape& s : shapes)
      for (Fill f : {Fill::Range, Fill::Special}) {
        // Ties (Range) test stability; Special puts NaN, infinities and signed zeros in.
        In in{s, dt, f, -3, 4};
        if (dt == ls::boolean) in.fill = Fill::Normal;
        for (int64_t axis = -1; axis < static_cast<int64_t>(s.size()); ++axis) {
          if (s.empty() && axis >= 0) break;
          check(
              "argsort " + str(dt) + " " + str(s) + " axis " + std::to_string(axis), {in},
              [&](const Tensors& x) {
                const ls::ValuesIndices down = ls::sort(x[0], axis, true);
                return Tensors{
                    ls::argsort(x[0], axis), down.values, down.indices,
                    ls::topk(x[0],
                             s.empty() ? 1 : std::min<int64_t>(2, s[(axis + s.size()) % s.size()]),
                             axis)
                        .indices};
              });
        }
      }
}

LS_COVERS(Indexing, ScatterAdd, Op::ScatterAdd);
TEST_F(Indexing, ScatterAdd) {
  for (ls::DType dt : {ls::f32, ls::f64, ls::i32, ls::i64, ls::u8, ls::boolean}) {
    check1("scatter_add axis 0 " + str(dt), {{{5, 4}, dt}, index({7, 3}, 5), {{7, 4}, dt}},
           [](const Tensors& x) { return ls::scatter_add(x[0], 0, x[1], x[2]); });
    check1("scatter_add axis 1 " + str(dt), {{{5, 4}, dt}, index({5, 9}, 4), {{5, 9}, dt}},
           [](const Tensors& x) { return ls::scatter_add(x[0], 1, x[1], x[2]); });
    check1("scatter_add 3-d " + str(dt), {{{3, 6, 5}, dt}, index({2, 4, 5}, 6), {{3, 4, 5}, dt}},
           [](const Tensors& x) { return ls::scatter_add(x[0], 1, x[1], x[2]); });
    check1("scatter_add empty index " + str(dt), {{{3, 6}, dt}, index({3, 0}, 6), {{3, 2}, dt}},
           [](const Tensors& x) { return ls::scatter_add(x[0], 1, x[1], x[2]); });
  }
  check1(
      "scatter_add large", {{{1031, 131}}, index({1031, 150}, 131), {{1031, 150}}},
      [](const Tensors& x) { return ls::scatter_add(x[0], 1, x[1], x[2]); }, 8);
  check1(
      "scatter_add of computed values", {{{4, 7}}, index({4, 9}, 7), {{4, 9}}},
      [](const Tensors& x) { return ls::scatter_add(x[0] * 0.5f, 1, x[1], ls::exp(x[2])); }, 9);
  // An embedding's gradient: rows of src added into the rows an index broadcast over the
  // columns names, repeats included; large enough to split over threads by columns, and by rows
  // when the axis is not the first. bf16 sums in f32 and rounds once on both sides.
  for (ls::DType dt : {ls::f32, ls::bf16, ls::f64}) {
    check1(
        "scatter_add rows " + str(dt), {{{61, 384}, dt}, index({3000, 1}, 61), {{3000, 384}, dt}},
        [](const Tensors& x) {
          return ls::scatter_add(x[0], 0, ls::expand(x[1], {3000, 384}), x[2]);
        },
        64);
    check1(
        "scatter_add by rows " + str(dt),
        {{{300, 129}, dt}, index({300, 200}, 129), {{300, 200}, dt}},
        [](const Tensors& x) { return ls::scatter_add(x[0], 1, x[1], x[2]); }, 16);
  }
  // Out-of-range indices fail on both backends, also through a broadcast index.
  check1("scatter_add out of range through a broadcast",
         {{{3, 4}}, {{3, 1}, ls::i64, Fill::Range, 4, 9}, {{3, 4}}}, [](const Tensors& x) {
           return ls::scatter_add(x[0], 0, ls::expand(x[1], {3, 4}), x[2]);
         });
  check1("scatter_add out of range", {{{3, 4}}, {{3, 2}, ls::i64, Fill::Range, 4, 9}, {{3, 2}}},
         [](const Tensors& x) { return ls::scatter_add(x[0], 1, x[1], x[2]); });
}

}  // namespace
}  // namespace conformance
