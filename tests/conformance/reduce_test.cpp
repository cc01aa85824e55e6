// Conformance of the reductions (sum, max, min, argmax, argmin): every subset of axes of a 4-d
// tensor (BatchNorm's (0, 2, 3) among them), full reductions, keepdim, size-1 and empty dims,
// NaN/inf, > 100k-element inputs, and reductions fed by elementwise trees (the cpu backend
// evaluates those inside the reduction).
#include <algorithm>

#include "conformance.h"

namespace conformance {
namespace {

class Reduce : public Conformance {};

using ReduceFn = ls::Tensor (*)(const ls::Tensor&, const std::vector<int64_t>&, bool, ls::Loc);
struct NamedReduce {
  const char* name;
  ReduceFn fn;
  bool empty_ok;  // may reduce over an empty axis (sum only)
};
const std::vector<NamedReduce> kReduces = {{"sum", ls::sum, true},
                                           {"max", ls::max, false},
                                           {"min", ls::min, false},
                                           {"argmax", ls::argmax, false},
                                           {"argmin", ls::argmin, false}};

// Every subset of the axes of `rank` (empty: all axes).
std::vector<std::vector<int64_t>> axis_subsets(size_t rank) {
  std::vector<std::vector<int64_t>> all;
  for (uint32_t m = 0; m < (1u << rank); ++m) {
    std::vector<int64_t> axes;
    for (size_t d = 0; d < rank; ++d)
      if (m & (1u << d)) axes.push_back(static_cast<int64_t>(d));
    all.push_back(axes);
  }
  return all;
}

double reduced_length(const ls::Shape& s, const std::vector<int64_t>& axes) {
  double k = 1;
  if (axes.empty())
    for (int64_t d : s) k *= static_cast<double>(d);
  for (int64_t a : axes) k *= static_cast<double>(s[a]);
  return k;
}

bool reduces_empty(const ls::Shape& s, const std::vector<int64_t>& axes) {
  for (size_t d = 0; d < s.size(); ++d)
    if (s[d] == 0 && (axes.empty() || std::find(axes.begin(), axes.end(), d) != axes.end()))
      return true;
  return false;
}

void reduce_cases(const std::vector<ls::Shape>& shapes, const std::vector<ls::DType>& dtypes,
                  Fill fill, bool all_subsets) {
  for (const NamedReduce& r : kReduces)
    for (ls::DType dt : dtypes)
      for (const ls::Shape& s : shapes) {
        std::vector<std::vector<int64_t>> sets =
            all_subsets
                ? axis_subsets(s.size())
                : std::vector<std::vector<int64_t>>{{}, {static_cast<int64_t>(s.size()) - 1}};
        if (s.empty()) sets = {{}};
        for (const auto& axes : sets) {
          if (!r.empty_ok && reduces_empty(s, axes)) continue;
          for (bool keep : {false, true}) {
            const std::string what = std::string(r.name) + " " + str(dt) + " axes " + str(axes) +
                                     (keep ? " keepdim" : "");
            check1(
                what, {{s, dt, fill}},
                [&](const Tensors& x) { return r.fn(x[0], axes, keep, ls::Loc::current()); },
                reduced_length(s, axes));
          }
        }
      }
}

LS_COVERS(Reduce, AxisSubsets, Op::Sum, Op::Max, Op::Min, Op::ArgMax, Op::ArgMin);
TEST_F(Reduce, AxisSubsets) {
  reduce_cases({{2, 3, 4, 5}, {1, 7, 1, 3}, {3, 4, 1, 5}, {3, 0, 2, 5}},
               {ls::f32, ls::f64, ls::bf16, ls::i32}, Fill::Normal, true);
  reduce_cases({{2, 3, 4, 5}}, {ls::i64, ls::boolean}, Fill::Normal, true);
}

LS_COVERS(Reduce, ShapesAndDtypes, Op::Sum, Op::Max, Op::Min, Op::ArgMax, Op::ArgMin);
TEST_F(Reduce, ShapesAndDtypes) {
  reduce_cases(shapes_all(), {ls::f32, ls::f64, ls::bf16, ls::i32, ls::i64, ls::u8, ls::boolean},
               Fill::Normal, false);
  reduce_cases(shapes_small(), {ls::f32, ls::f64}, Fill::Special, false);
  // bf16 with NaN, infinities and zeros (Special's huge values cancel differently in cpu's f32
  // lanes and ref's f64 sums).
  reduce_cases(shapes_small(), {ls::bf16}, Fill::NonFinite, false);
  reduce_cases({{5, 7}}, {ls::i32, ls::i64, ls::u8}, Fill::Special,
               true);  // wrapping sums, extremes
  // Ties: argmax/argmin take the first extreme element.
  reduce_cases({{4, 6, 5}}, {ls::f32, ls::i64}, Fill::Range, true);
}

LS_COVERS(Reduce, Large, Op::Sum, Op::Max, Op::Min);
TEST_F(Reduce, Large) {
  const std::vector<std::pair<ls::Shape, std::vector<int64_t>>> cases = {
      {{8, 64, 17, 13}, {0, 2, 3}},
      {{8, 64, 17, 13}, {1}},
      {{8, 64, 17, 13}, {}},
      {{8, 64, 17, 13}, {3}},
      {{8, 64, 17, 13}, {0, 1}},
      {{1031, 131}, {0}},
      {{1031, 131}, {1}},
      {{150001}, {}},
      {{3, 50001}, {1}},
      {{50001, 3}, {0}},
      {{2, 300, 257}, {0, 2}},
      // Per-channel sums of small feature maps (short runs), on one thread and on several.
      {{16, 256, 2, 2}, {0, 2, 3}},
      {{32, 512, 3, 3}, {0, 2, 3}},
      {{32, 512, 3, 3}, {2, 3}}};
  for (ls::DType dt : {ls::f32, ls::f64})
    for (const auto& [s, axes] : cases)
      check(
          "large " + str(dt) + " axes " + str(axes), {{s, dt}},
          [&](const Tensors& x) {
            return Tensors{ls::sum(x[0], axes), ls::max(x[0], axes, true), ls::min(x[0], axes)};
          },
          reduced_length(s, axes));
  // Leading axes over rows of kept elements (a bias gradient: sum over the batch), with NaN,
  // infinities and signed zeros among the values.
  for (const auto& [s, axes] : std::vector<std::pair<ls::Shape, std::vector<int64_t>>>{
           {{40, 33}, {0}},
           {{3, 20, 17}, {1}},
           {{5, 4, 300}, {0, 1}},
           // many rows: cut into bands combined in order
           {{1031, 131}, {0}},
           {{2, 700, 40}, {1}},
           // rows longer than one run of 2048 values
           {{300, 2100}, {0}}})
    check(
        "rows with special values, axes " + str(axes), {{s, ls::f32, Fill::NonFinite}},
        [&](const Tensors& x) {
          return Tensors{ls::sum(x[0], axes), ls::max(x[0], axes, true), ls::min(x[0], axes)};
        },
        reduced_length(s, axes));
}

LS_COVERS(Reduce, OfElementwiseTrees, Op::Sum, Op::Max, Op::Min, Op::Exp, Op::Mul, Op::Expand,
          Op::Sub, Op::Where, Op::Gt, Op::Relu);
TEST_F(Reduce, OfElementwiseTrees) {
  // BatchNorm statistics: mean and variance over (0, 2, 3), with a broadcast per-channel shift.
  for (const ls::Shape& s :
       {ls::Shape{8, 16, 17, 13}, ls::Shape{2, 3, 9, 65}, ls::Shape{1, 5, 1, 1},
        ls::Shape{4, 3, 64, 1}, ls::Shape{4, 3, 2, 0}}) {
    const double k = reduced_length(s, {0, 2, 3});
    check(
        "batchnorm statistics", {{s}, {{s[1], 1, 1}}},
        [](const Tensors& x) {
          const ls::Tensor centered = x[0] - x[1];
          const ls::Tensor mean = ls::mean(x[0], {0, 2, 3}, true);
          const ls::Tensor var = ls::mean(ls::square(x[0] - mean), {0, 2, 3});
          return Tensors{ls::sum(centered * centered, {0, 2, 3}), var, mean};
        },
        k);
  }
  for (const ls::Shape& s : {ls::Shape{7, 300}, ls::Shape{3, 65}, ls::Shape{2, 3, 1000},
                             ls::Shape{100000}, ls::Shape{64}, ls::Shape{63}}) {
    const int64_t last = s.back();
    check(
        "trees into reductions", {{s}, {{last}}},
        [](const Tensors& x) {
          const ls::Tensor e = ls::exp(x[0] - x[1]);
          const ls::Tensor masked = ls::where(x[0] > x[1], x[0] * x[1], -x[0]);
          return Tensors{ls::sum(e, {-1}),         ls::max(ls::relu(x[0]) * 2.0f, {-1}, true),
                         ls::min(masked, {-1}),    ls::sum(masked),
                         ls::sum(e * x[1], {}),    ls::max(ls::exp(x[0])),
                         ls::logsumexp(x[0], {-1})};
        },
        static_cast<double>(ls::shape_numel(s)));
  }
  // bf16 sums over leading axes into rows of 16 to 512 values (a bias's gradient under
  // autocast), of a value and of a tree: summed down a tile's rows in floats, then widened; NaN
  // and infinities among the values.
  for (const auto& [s, axes] : std::vector<std::pair<ls::Shape, std::vector<int64_t>>>{
           {{1030, 256}, {0}}, {{77, 32}, {0}}, {{9, 70, 16}, {0, 1}}, {{40, 512}, {0}}})
    check(
        "bf16 sums over leading axes " + str(s),
        {{s, ls::bf16, Fill::NonFinite}, {{s.back()}, ls::bf16}},
        [&](const Tensors& x) {
          return Tensors{ls::sum(x[0], axes), ls::sum(x[0] * x[1] + 1.0f, axes)};
        },
        reduced_length(s, axes));
  // NaN and inf flowing through a tree into max/min/sum.
  check(
      "special trees into reductions", {{{5, 130}, ls::f32, Fill::Special}, {{130}}},
      [](const Tensors& x) {
        const ls::Tensor t = x[0] * x[1] + 1.0f;
        return Tensors{ls::max(t, {1}), ls::min(t, {1}), ls::sum(t, {1}), ls::sum(ls::abs(t))};
      },
      650);
}

LS_COVERS(Reduce, ShortRows, Op::Sum, Op::Max, Op::Min, Op::Exp, Op::Sub);
TEST_F(Reduce, ShortRows) {
  // Reductions over trailing axes of at most 256 values (a softmax's or a layer norm's rows): the
  // cpu backend reads whole rows a tile at a time, so these cut tiles into rows, leave a partial
  // last tile, cross the threading threshold and reduce over two trailing axes, with NaN,
  // infinities and signed zeros in some rows, from memory and through a tree, in f32 and bf16.
  const std::vector<std::pair<ls::Shape, std::vector<int64_t>>> cases = {
      {{4, 997, 64}, {2}}, {{300, 100}, {1}},        {{2, 50, 256}, {2}}, {{700, 3}, {1}},
      {{33, 1}, {1}},      {{9, 40, 8, 16}, {2, 3}}, {{5, 7}, {1}}};
  for (ls::DType dt : {ls::f32, ls::bf16})
    for (const auto& [s, axes] : cases) {
      const bool keep = s.size() % 2 == 0;
      check(
          "short rows " + str(dt) + " " + str(s) + " axes " + str(axes),
          {{s, dt, Fill::NonFinite}, {s, dt}},
          [&](const Tensors& x) {
            const ls::Tensor shifted = ls::exp(x[1] - ls::max(x[1], axes, true));
            return Tensors{ls::sum(x[0], axes, keep), ls::max(x[0], axes, keep),
                           ls::min(x[0], axes, keep), ls::sum(shifted, axes, keep),
                           ls::min(x[0] * x[1], axes, keep)};
          },
          reduced_length(s, axes));
    }
}

LS_COVERS(Reduce, OfViews, Op::Sum, Op::Max, Op::ArgMin, Op::Permute, Op::Slice);
TEST_F(Reduce, OfViews) {
  for (ls::DType dt : {ls::f32, ls::f64, ls::i32})
    check(
        "reductions of views " + str(dt), {{{6, 5, 130}, dt}},
        [](const Tensors& x) {
          const ls::Tensor p = ls::permute(x[0], {2, 0, 1});
          const ls::Tensor s = ls::slice(x[0], 2, 1, 129, 3);
          return Tensors{ls::sum(p, {0}), ls::max(p, {1, 2}), ls::argmin(s, {2}),
                         ls::sum(s, {0, 2}, true), ls::mean(ls::cast(p, ls::f32), {2})};
        },
        130);
}

}  // namespace
}  // namespace conformance
