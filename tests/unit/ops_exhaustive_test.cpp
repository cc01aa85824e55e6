// Exhaustive sweeps against naive reference loops written here: every subset of axes of a 4-d
// reduction (positive and negative, keepdim or not), every permutation of 4 axes, Python slicing
// over a grid of bounds and steps, and NumPy broadcasting over many shape pairs.
#include <algorithm>
#include <cstdint>
#include <numeric>

#include "unit/ops_test_util.h"

namespace {

using namespace ops_test;

using OpsExhaustive = OnTestDevice;

// Row-major multi-index of flat position i in shape s.
std::vector<int64_t> unravel(int64_t i, const ls::Shape& s) {
  std::vector<int64_t> idx(s.size());
  for (size_t d = s.size(); d-- > 0;) {
    idx[d] = i % s[d];
    i /= s[d];
  }
  return idx;
}

int64_t ravel(const std::vector<int64_t>& idx, const ls::Shape& s) {
  int64_t o = 0;
  for (size_t d = 0; d < s.size(); ++d) o = o * s[d] + idx[d];
  return o;
}

// Values with repeats (to exercise first-wins ties) in a fixed pseudo-random order.
std::vector<double> values(int64_t n) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<double>((i * 7 + 3) % 11) - 5;
  return v;
}

TEST_F(OpsExhaustive, ReductionsOverEveryAxisSubset) {
  const ls::Shape s = {2, 3, 1, 4};
  const std::vector<double> xv = values(ls::shape_numel(s));
  const ls::Tensor x = f64(xv, s);
  for (int mask = 0; mask < 16; ++mask) {
    for (bool keepdim : {false, true}) {
      for (bool negative : {false, true}) {
        std::vector<int64_t> axes;
        for (int d = 0; d < 4; ++d)
          if (mask >> d & 1) axes.push_back(negative && d % 2 ? d - 4 : d);
        const int eff = mask == 0 ? 15 : mask;  // no axes: all of them
        ls::Shape out, kept, red;
        for (int d = 0; d < 4; ++d) {
          if (eff >> d & 1) {
            red.push_back(s[d]);
            if (keepdim) out.push_back(1);
          } else {
            kept.push_back(s[d]);
            out.push_back(s[d]);
          }
        }
        const int64_t n_out = ls::shape_numel(kept);
        std::vector<double> sum(n_out, 0), mx(n_out), mn(n_out);
        std::vector<int64_t> amax(n_out, -1), amin(n_out, -1);
        for (int64_t i = 0; i < static_cast<int64_t>(xv.size()); ++i) {
          const std::vector<int64_t> idx = unravel(i, s);
          std::vector<int64_t> ki, ri;
          for (int d = 0; d < 4; ++d) (eff >> d & 1 ? ri : ki).push_back(idx[d]);
          const int64_t o = ravel(ki, kept), b = ravel(ri, red);
          sum[o] += xv[i];
          if (amax[o] < 0 || xv[i] > mx[o]) mx[o] = xv[i], amax[o] = b;
          if (amin[o] < 0 || xv[i] < mn[o]) mn[o] = xv[i], amin[o] = b;
        }
        SCOPED_TRACE(::testing::Message()
                     << "axes " << ls::shape_str(axes) << " keepdim " << keepdim);
        expect_tensor<double>(ls::sum(x, axes, keepdim), out, sum);
        expect_tensor<double>(ls::max(x, axes, keepdim), out, mx);
        expect_tensor<double>(ls::min(x, axes, keepdim), out, mn);
        expect_tensor<int64_t>(ls::argmax(x, axes, keepdim), out, amax);
        expect_tensor<int64_t>(ls::argmin(x, axes, keepdim), out, amin);
        std::vector<double> mean = sum;
        for (double& m : mean) m /= static_cast<double>(xv.size() / n_out);
        expect_tensor<double>(ls::mean(x, axes, keepdim), out, mean);
      }
    }
  }
}

TEST_F(OpsExhaustive, EveryPermutationOfFourAxes) {
  const ls::Shape s = {2, 3, 1, 4};
  const ls::Tensor x = iota<int32_t>(s);
  std::vector<int64_t> perm = {0, 1, 2, 3};
  do {
    ls::Shape out;
    for (int64_t p : perm) out.push_back(s[p]);
    std::vector<int32_t> want(static_cast<size_t>(ls::shape_numel(s)));
    for (int64_t i = 0; i < ls::shape_numel(out); ++i) {
      const std::vector<int64_t> oi = unravel(i, out);
      std::vector<int64_t> xi(4);
      for (int d = 0; d < 4; ++d)
        xi[perm[d]] = oi[d];  // out[..., i_d, ...] = x[... i_d at perm[d]]
      want[i] = static_cast<int32_t>(ravel(xi, s));
    }
    SCOPED_TRACE(ls::shape_str(perm));
    expect_tensor<int32_t>(ls::permute(x, perm), out, want);
  } while (std::next_permutation(perm.begin(), perm.end()));
}

// Python's slice(start, end, step).indices(size) for step > 0.
std::vector<int64_t> py_slice(int64_t size, int64_t start, int64_t end, int64_t step) {
  auto fix = [size](int64_t i) {
    return i < 0 ? std::max<int64_t>(i + size, 0) : std::min(i, size);
  };
  std::vector<int64_t> r;
  for (int64_t i = fix(start); i < fix(end); i += step) r.push_back(i);
  return r;
}

TEST_F(OpsExhaustive, SliceMatchesPythonOverAGridOfBounds) {
  const ls::Shape s = {3, 5};
  const ls::Tensor x = iota<int64_t>(s);
  for (int64_t axis : {0, 1, -1}) {
    const int64_t a = axis < 0 ? axis + 2 : axis;
    for (int64_t start = -7; start <= 7; ++start)
      for (int64_t end = -7; end <= 7; ++end)
        for (int64_t step : {1, 2, 3, 6}) {
          const std::vector<int64_t> picks = py_slice(s[a], start, end, step);
          ls::Shape out = s;
          out[a] = static_cast<int64_t>(picks.size());
          std::vector<int64_t> want;
          for (int64_t i = 0; i < ls::shape_numel(out); ++i) {
            std::vector<int64_t> idx = unravel(i, out);
            idx[a] = picks[idx[a]];
            want.push_back(ravel(idx, s));
          }
          SCOPED_TRACE(::testing::Message()
                       << "axis " << axis << " [" << start << ":" << end << ":" << step << "]");
          expect_tensor<int64_t>(ls::slice(x, axis, start, end, step), out, want);
        }
  }
}

TEST_F(OpsExhaustive, BroadcastingOverShapePairs) {
  const std::vector<ls::Shape> shapes = {{},        {1},       {3},       {2, 1}, {1, 3}, {2, 3},
                                         {4, 1, 1}, {4, 2, 3}, {1, 1, 3}, {0},    {2, 0}, {0, 1}};
  for (const ls::Shape& sa : shapes)
    for (const ls::Shape& sb : shapes) {
      // The NumPy rule, stated directly.
      const size_t r = std::max(sa.size(), sb.size());
      ls::Shape out(r);
      bool ok = true;
      for (size_t i = 0; i < r; ++i) {
        const int64_t da = i < r - sa.size() ? 1 : sa[i - (r - sa.size())];
        const int64_t db = i < r - sb.size() ? 1 : sb[i - (r - sb.size())];
        ok = ok && (da == db || da == 1 || db == 1);
        out[i] = da == 1 ? db : da;
      }
      SCOPED_TRACE(ls::shape_str(sa) + " - " + ls::shape_str(sb));
      const ls::Tensor a = iota<int64_t>(sa);
      const ls::Tensor b = ls::mul(iota<int64_t>(sb), 100);
      if (!ok) {
        EXPECT_LS_ERROR(a - b, "sub", ls::shape_str(sa), ls::shape_str(sb));
        continue;
      }
      std::vector<int64_t> want;
      for (int64_t i = 0; i < ls::shape_numel(out); ++i) {
        const std::vector<int64_t> oi = unravel(i, out);
        auto at = [&](const ls::Shape& sx) {
          std::vector<int64_t> xi(sx.size());
          for (size_t d = 0; d < sx.size(); ++d) {
            const int64_t od = oi[r - sx.size() + d];
            xi[d] = sx[d] == 1 ? 0 : od;
          }
          return ravel(xi, sx);
        };
        want.push_back(at(sa) - 100 * at(sb));
      }
      expect_tensor<int64_t>(a - b, out, want);
      // where broadcasts the same way (cond shaped like a).
      expect_tensor<int64_t>(ls::where(ls::ge(a, 0), a, b), out, [&] {
        std::vector<int64_t> w;
        for (int64_t i = 0; i < ls::shape_numel(out); ++i) {
          const std::vector<int64_t> oi = unravel(i, out);
          std::vector<int64_t> xi(sa.size());
          for (size_t d = 0; d < sa.size(); ++d) xi[d] = sa[d] == 1 ? 0 : oi[r - sa.size() + d];
          w.push_back(ravel(xi, sa));
        }
        return w;
      }());
    }
}

}  // namespace
