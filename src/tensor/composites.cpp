// The ops a libtorch user reaches for, written from primitives with PyTorch's names, semantics
// and defaults: pieces and joins, flips and rolls, triangles and masks, remainders, running
// sums and products, statistics and norms, sorting, index selection, one-hot (einsum: einsum.cpp).
// Only fmod (exactness) and argsort (no composite sorts) are primitives of their own.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <variant>

#include "tensor/frontend.h"
#include "util/check.h"
#include "util/frames.h"

namespace lockstep {

using frontend::make;
using frontend::node;
using frontend::NodePtr;
using frontend::record;
using ir::Op;
using util::cat;

namespace {

int64_t rank_of(const NodePtr& n) { return static_cast<int64_t>(n->shape.size()); }

// Both operands cast to their promoted dtype and broadcast to one shape.
std::pair<NodePtr, NodePtr> promoted(const NodePtr& a, const NodePtr& b, const char* op,
                                     const Loc& loc) {
  const DType t = frontend::result_type(a->dtype, a->shape.empty(), b->dtype, b->shape.empty());
  const Shape s = frontend::broadcast_shapes(a->shape, b->shape, op, loc);
  return {frontend::expand_to(frontend::cast_node(a, t, loc), s, loc),
          frontend::expand_to(frontend::cast_node(b, t, loc), s, loc)};
}

// A 0-d tensor holding a scalar operand with the dtype it takes next to `t` (PyTorch's rules).
Tensor scalar_operand(Scalar v, const Tensor& t, const char* op, const Loc& loc) {
  const NodePtr& n = node(t, op, loc);
  return scalar_tensor(v, TensorOptions(frontend::scalar_type(n->dtype, v), n->device), loc);
}

void check_numeric(const NodePtr& n, const char* op, const Loc& loc) {
  if (n->dtype == DType::Bool)
    util::fail(loc, op, cat("is not defined for bool tensors, got bool", shape_str(n->shape)),
               "Cast to a numeric dtype first, e.g. ls::cast(x, ls::i64)");
}

void check_floating(const NodePtr& n, const char* op, const Loc& loc) {
  if (!is_floating(n->dtype))
    util::fail(
        loc, op,
        cat("needs a floating-point tensor, got ", dtype_name(n->dtype), shape_str(n->shape)),
        "Cast it first, e.g. ls::cast(x, ls::f32)");
}

// An i64 ramp 0..n-1 along `axis` of `shape`.
Tensor iota(const Shape& shape, int64_t axis, Device device, const Loc& loc) {
  return runtime::new_tensor(ir::make_leaf(Op::Iota, {axis}, shape, DType::I64, device, loc));
}

// pads for `pad` that add `before` at the front of `axis` only.
std::vector<std::pair<int64_t, int64_t>> pad_front(int64_t rank, int64_t axis, int64_t before) {
  std::vector<std::pair<int64_t, int64_t>> p(static_cast<size_t>(rank), {0, 0});
  p[static_cast<size_t>(axis)].first = before;
  return p;
}

// Sums (and products) of bool and i32 are i64, as PyTorch's.
Tensor widened(const Tensor& x, const NodePtr& n, const Loc& loc) {
  return n->dtype == DType::Bool || n->dtype == DType::I32 ? cast(x, DType::I64, loc) : x;
}

// Where fmod's remainder r is non-zero with the other sign than the divisor b: there Python's
// % adds b, and its // steps the quotient down by one.
Tensor off_sign(const Tensor& r, const Tensor& b, const Loc& loc) {
  return logical_and(ne(r, 0, loc), ne(lt(r, 0, loc), lt(b, 0, loc), loc), loc);
}

}  // namespace

// ---- arithmetic ----------------------------------------------------------------------------
Tensor log1p(const Tensor& x, Loc loc) {
  check_floating(node(x, "log1p", loc), "log1p", loc);
  // Kahan's: with w = 1 + x rounded, log(w) * x / (w - 1) cancels the rounding of w; where w is
  // 1, log1p(x) is x. The denominator of the branch not taken is kept non-zero for the gradient.
  const Tensor w = add(x, 1, loc);
  const Tensor one = eq(w, 1, loc);
  const Tensor d = where(one, 1, sub(w, 1, loc), loc);
  return where(one, x, div(mul(log(where(one, 2, w, loc), loc), x, loc), d, loc), loc);
}

Tensor fmod(const Tensor& a, const Tensor& b, Loc loc) {
  auto [x, y] = promoted(node(a, "fmod", loc), node(b, "fmod", loc), "fmod", loc);
  check_numeric(x, "fmod", loc);
  return record(Op::Fmod, {x, y}, {}, loc);
}
Tensor fmod(const Tensor& a, Scalar b, Loc loc) {
  return fmod(a, scalar_operand(b, a, "fmod", loc), loc);
}
Tensor fmod(Scalar a, const Tensor& b, Loc loc) {
  return fmod(scalar_operand(a, b, "fmod", loc), b, loc);
}

Tensor remainder(const Tensor& a, const Tensor& b, Loc loc) {
  auto [x, y] = promoted(node(a, "remainder", loc), node(b, "remainder", loc), "remainder", loc);
  check_numeric(x, "remainder", loc);
  const Tensor r = record(Op::Fmod, {x, y}, {}, loc);
  const Tensor bt = runtime::new_tensor(y);
  const Tensor fix = off_sign(r, bt, loc);
  return where(fix, add(r, bt, loc), r, loc);
}
Tensor remainder(const Tensor& a, Scalar b, Loc loc) {
  return remainder(a, scalar_operand(b, a, "remainder", loc), loc);
}
Tensor remainder(Scalar a, const Tensor& b, Loc loc) {
  return remainder(scalar_operand(a, b, "remainder", loc), b, loc);
}

Tensor floor_divide(const Tensor& a, const Tensor& b, Loc loc) {
  auto [x, y] =
      promoted(node(a, "floor_divide", loc), node(b, "floor_divide", loc), "floor_divide", loc);
  check_numeric(x, "floor_divide", loc);
  const Tensor bt = runtime::new_tensor(y);
  const Tensor r = record(Op::Fmod, {x, y}, {}, loc);
  const Tensor down = off_sign(r, bt, loc);
  if (!is_floating(x->dtype)) {  // integer division truncates
    const Tensor q = record(Op::Div, {x, y}, {}, loc);
    return where(down, sub(q, 1, loc), q, loc);
  }
  // Python's float //: (a - fmod(a, b)) / b is (nearly) whole; rounded to the nearest whole.
  const Tensor at = runtime::new_tensor(x);
  Tensor q = div(sub(at, r, loc), bt, loc);
  q = where(down, sub(q, 1, loc), q, loc);
  Tensor f = floor(q, loc);
  f = where(gt(sub(q, f, loc), 0.5, loc), add(f, 1, loc), f, loc);
  return where(eq(bt, 0, loc), div(at, bt, loc), f, loc);
}
Tensor floor_divide(const Tensor& a, Scalar b, Loc loc) {
  return floor_divide(a, scalar_operand(b, a, "floor_divide", loc), loc);
}
Tensor floor_divide(Scalar a, const Tensor& b, Loc loc) {
  return floor_divide(scalar_operand(a, b, "floor_divide", loc), b, loc);
}

Tensor clamp(const Tensor& x, const Tensor& lo, const Tensor& hi, Loc loc) {
  check_numeric(node(x, "clamp", loc), "clamp", loc);
  if (!lo.defined() && !hi.defined())
    util::fail(loc, "clamp", "both bounds are empty handles", "Pass at least one bound");
  Tensor y = x;
  if (lo.defined()) y = maximum(y, lo, loc);
  if (hi.defined()) y = minimum(y, hi, loc);
  return y;
}
Tensor clamp_min(const Tensor& x, Scalar lo, Loc loc) {
  check_numeric(node(x, "clamp_min", loc), "clamp_min", loc);
  return maximum(x, lo, loc);
}
Tensor clamp_max(const Tensor& x, Scalar hi, Loc loc) {
  check_numeric(node(x, "clamp_max", loc), "clamp_max", loc);
  return minimum(x, hi, loc);
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, const Tensor& value, Loc loc) {
  const NodePtr& xn = node(x, "masked_fill", loc);
  const NodePtr& mn = node(mask, "masked_fill", loc);
  const NodePtr& vn = node(value, "masked_fill", loc);
  if (mn->dtype != DType::Bool)
    util::fail(loc, "masked_fill", cat("mask must be bool, got ", dtype_name(mn->dtype)),
               "Compare to get a bool mask, e.g. x > 0");
  if (!vn->shape.empty())
    util::fail(loc, "masked_fill",
               cat("value must be a 0-d tensor, got shape ", shape_str(vn->shape)),
               "Pass a scalar or a 0-d tensor");
  if (frontend::broadcast_shapes(mn->shape, xn->shape, "masked_fill", loc) != xn->shape)
    util::fail(loc, "masked_fill",
               cat("mask ", shape_str(mn->shape), " does not broadcast to the input ",
                   shape_str(xn->shape)),
               "The mask may only have the input's shape or broadcast to it");
  return where(mask, cast(value, xn->dtype, loc), x, loc);
}
Tensor masked_fill(const Tensor& x, const Tensor& mask, Scalar value, Loc loc) {
  const NodePtr& xn = node(x, "masked_fill", loc);
  return masked_fill(
      x, mask,
      runtime::new_tensor(frontend::scalar_node(value, xn->dtype, xn->device, "masked_fill", loc)),
      loc);
}

// ---- reductions ----------------------------------------------------------------------------
namespace {

// The number of elements `axes` (empty: all) cover, after checking them as sum does.
int64_t count_over(const NodePtr& n, const std::vector<int64_t>& axes, const char* op,
                   const Loc& loc) {
  if (axes.empty()) return shape_numel(n->shape);
  int64_t c = 1;
  for (int64_t a : axes) c *= n->shape[frontend::norm_axis(a, rank_of(n), op, loc)];
  return c;
}

// Shape after reducing `axes` (all when empty).
Shape reduced_shape(const Shape& s, const std::vector<int64_t>& axes, bool keepdim, const char* op,
                    const Loc& loc) {
  const int64_t r = static_cast<int64_t>(s.size());
  std::vector<bool> gone(s.size(), axes.empty());
  for (int64_t a : axes) gone[frontend::norm_axis(a, r, op, loc)] = true;
  Shape out;
  for (size_t d = 0; d < s.size(); ++d)
    if (!gone[d])
      out.push_back(s[d]);
    else if (keepdim)
      out.push_back(1);
  return out;
}

}  // namespace

Tensor var(const Tensor& x, const std::vector<int64_t>& axes, int64_t correction, bool keepdim,
           Loc loc) {
  const NodePtr& n = node(x, "var", loc);
  check_floating(n, "var", loc);
  if (correction < 0)
    util::fail(loc, "var", cat("correction ", correction, " is negative"),
               "Use 0 (population) or 1 (unbiased, the default)");
  const int64_t count = count_over(n, axes, "var", loc);
  const Tensor d = sub(x, mean(x, axes, true, loc), loc);
  const Tensor s = sum(mul(d, d, loc), axes, keepdim, loc);
  // As PyTorch: a divisor below zero counts as zero (the result is inf or NaN).
  return div(s, static_cast<double>(std::max<int64_t>(0, count - correction)), loc);
}

Tensor std(const Tensor& x, const std::vector<int64_t>& axes, int64_t correction, bool keepdim,
           Loc loc) {
  node(x, "std", loc);
  return sqrt(var(x, axes, correction, keepdim, loc), loc);
}

Tensor prod(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim, Loc loc) {
  const NodePtr& n = node(x, "prod", loc);
  const Shape out = reduced_shape(n->shape, axes, keepdim, "prod", loc);
  Tensor y = widened(x, n, loc);
  // The reduced axes moved last and flattened into one of length k, then halved: products of
  // pairs (an odd length padded with a 1) until one is left. Exact gradients, zeros included.
  const int64_t r = rank_of(n);
  std::vector<bool> gone(static_cast<size_t>(r), axes.empty());
  for (int64_t a : axes) gone[frontend::norm_axis(a, r, "prod", loc)] = true;
  std::vector<int64_t> perm;
  Shape kept;
  int64_t k = 1;
  for (int64_t d = 0; d < r; ++d)
    if (!gone[d]) {
      perm.push_back(d);
      kept.push_back(n->shape[d]);
    }
  for (int64_t d = 0; d < r; ++d)
    if (gone[d]) {
      perm.push_back(d);
      k *= n->shape[d];
    }
  if (k == 0) return ones(out, TensorOptions(node(y, "prod", loc)->dtype, n->device), loc);
  if (r > 0) y = permute(y, perm, loc);
  Shape flat = kept;
  flat.push_back(k);
  y = reshape(y, flat, loc);
  const int64_t last = static_cast<int64_t>(flat.size()) - 1;
  while (k > 1) {
    if (k % 2) {
      std::vector<std::pair<int64_t, int64_t>> p(flat.size(), {0, 0});
      p.back().second = 1;
      y = pad(y, p, 1, loc);
      ++k;
    }
    y = mul(slice(y, last, 0, k / 2, 1, loc), slice(y, last, k / 2, k, 1, loc), loc);
    k /= 2;
  }
  return reshape(y, out, loc);
}

Tensor norm(const Tensor& x, double p, const std::vector<int64_t>& axes, bool keepdim, Loc loc) {
  const NodePtr& n = node(x, "norm", loc);
  check_floating(n, "norm", loc);
  if (std::isnan(p) || p < 0) {
    if (p != -std::numeric_limits<double>::infinity())
      util::fail(loc, "norm", cat("order p = ", p, " is not supported"),
                 "Use p >= 0, inf or -inf (vector norms)");
  }
  const Tensor a = abs(x, loc);
  if (std::isinf(p)) return p > 0 ? max(a, axes, keepdim, loc) : min(a, axes, keepdim, loc);
  if (p == 0) return cast(sum(ne(x, 0, loc), axes, keepdim, loc), n->dtype, loc);
  if (p == 1) return sum(a, axes, keepdim, loc);
  if (p == 2) {
    // sqrt with a zero gradient at the zero vector (PyTorch's subgradient), not NaN.
    const Tensor s = sum(mul(x, x, loc), axes, keepdim, loc);
    const Tensor zero = eq(s, 0, loc);
    return where(zero, 0, sqrt(where(zero, 1, s, loc), loc), loc);
  }
  const Tensor s = sum(pow(a, p, loc), axes, keepdim, loc);
  const Tensor zero = eq(s, 0, loc);
  return where(zero, 0, pow(where(zero, 1, s, loc), 1.0 / p, loc), loc);
}

Tensor any(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim, Loc loc) {
  node(x, "any", loc);
  return gt(sum(ne(x, 0, loc), axes, keepdim, loc), 0, loc);
}

Tensor all(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim, Loc loc) {
  node(x, "all", loc);
  return eq(sum(eq(x, 0, loc), axes, keepdim, loc), 0, loc);
}

namespace {

// Hillis-Steele scan along `axis`: log2(n) steps, each combining every element with the one
// `s` before it (the identity shifted in at the front). Every step is elementwise, so the
// gradient is exact through the primitives' own rules.
Tensor scan(const Tensor& x, int64_t axis, bool product, const char* op, const Loc& loc) {
  const NodePtr& n = node(x, op, loc);
  check_numeric(n, op, loc);
  if (n->shape.empty()) return widened(x, n, loc);
  const int64_t a = frontend::norm_axis(axis, rank_of(n), op, loc);
  const int64_t len = n->shape[a];
  Tensor y = widened(x, n, loc);
  for (int64_t s = 1; s < len; s *= 2) {
    const Tensor shifted =
        pad(slice(y, a, 0, len - s, 1, loc), pad_front(rank_of(n), a, s), product ? 1 : 0, loc);
    y = product ? mul(y, shifted, loc) : add(y, shifted, loc);
  }
  return y;
}

}  // namespace

Tensor cumsum(const Tensor& x, int64_t axis, Loc loc) {
  return scan(x, axis, false, "cumsum", loc);
}
Tensor cumprod(const Tensor& x, int64_t axis, Loc loc) {
  return scan(x, axis, true, "cumprod", loc);
}

// ---- sorting -------------------------------------------------------------------------------
Tensor argsort(const Tensor& x, int64_t axis, bool descending, Loc loc) {
  const NodePtr& n = node(x, "argsort", loc);
  if (n->shape.empty()) {
    frontend::norm_axis(axis, 1, "argsort", loc);
    return zeros({}, TensorOptions(DType::I64, n->device), loc);
  }
  const int64_t a = frontend::norm_axis(axis, rank_of(n), "argsort", loc);
  return record(Op::Argsort, {n}, {a, descending ? 1 : 0}, loc);
}

ValuesIndices sort(const Tensor& x, int64_t axis, bool descending, Loc loc) {
  const NodePtr& n = node(x, "sort", loc);
  const Tensor idx = argsort(x, axis, descending, loc);
  if (n->shape.empty()) return {clone(x, loc), idx};
  return {gather(x, axis, idx, loc), idx};
}

ValuesIndices topk(const Tensor& x, int64_t k, int64_t axis, bool largest, Loc loc) {
  const NodePtr& n = node(x, "topk", loc);
  const int64_t size =
      n->shape.empty() ? 1 : n->shape[frontend::norm_axis(axis, rank_of(n), "topk", loc)];
  if (k < 0 || k > size)
    util::fail(loc, "topk",
               cat("k = ", k, " is out of range for ", size, " elements along axis ", axis, " of ",
                   shape_str(n->shape)),
               cat("Use 0 <= k <= ", size));
  ValuesIndices s = sort(x, axis, largest, loc);
  if (n->shape.empty()) return s;
  return {slice(s.values, axis, 0, k, 1, loc), slice(s.indices, axis, 0, k, 1, loc)};
}

// ---- movement ------------------------------------------------------------------------------
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t axis,
                          Loc loc) {
  const NodePtr& n = node(x, "split", loc);
  const int64_t a = frontend::norm_axis(axis, rank_of(n), "split", loc);
  int64_t total = 0;
  bool over = false;  // the sizes add up to more than the axis (checked without overflow)
  for (int64_t s : sizes) {
    if (s < 0)
      util::fail(loc, "split", cat("negative size ", s, " in ", shape_str(sizes)),
                 "Sizes must be >= 0");
    over = over || s > n->shape[a] - total;
    if (!over) total += s;
  }
  if (over || total != n->shape[a])
    util::fail(loc, "split",
               cat("sizes ", shape_str(sizes), " add up to ",
                   over ? std::string("more than that") : std::to_string(total), " but axis ", axis,
                   " of ", shape_str(n->shape), " has ", n->shape[a]),
               "The sizes must add up to the axis' length");
  std::vector<Tensor> out;
  int64_t at = 0;
  for (int64_t s : sizes) {
    out.push_back(record(Op::Slice, {n}, {a, at, at + s, 1}, loc));
    at += s;
  }
  return out;
}

std::vector<Tensor> split(const Tensor& x, int64_t size, int64_t axis, Loc loc) {
  const NodePtr& n = node(x, "split", loc);
  const int64_t len = n->shape[frontend::norm_axis(axis, rank_of(n), "split", loc)];
  if (size <= 0 && !(size == 0 && len == 0))
    util::fail(loc, "split", cat("split size ", size, " must be positive"),
               "Pass the length of each piece (the last may be shorter)");
  if (len == 0) return {clone(x, loc)};
  std::vector<int64_t> sizes;
  for (int64_t at = 0; at < len; at += size) sizes.push_back(std::min(size, len - at));
  return split(x, sizes, axis, loc);
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t axis, Loc loc) {
  const NodePtr& n = node(x, "chunk", loc);
  if (chunks <= 0)
    util::fail(loc, "chunk", cat("chunks = ", chunks, " must be positive"), "Ask for >= 1 chunk");
  const int64_t len = n->shape[frontend::norm_axis(axis, rank_of(n), "chunk", loc)];
  if (len == 0) {
    std::vector<Tensor> out;
    for (int64_t i = 0; i < chunks; ++i) out.push_back(clone(x, loc));
    return out;
  }
  return split(x, (len + chunks - 1) / chunks, axis, loc);
}

Tensor stack(const std::vector<Tensor>& xs, int64_t axis, Loc loc) {
  if (xs.empty()) util::fail(loc, "stack", "got no tensors", "Pass at least one tensor");
  const NodePtr& first = node(xs[0], "stack", loc);
  const int64_t a = frontend::norm_axis(axis, rank_of(first) + 1, "stack", loc);
  std::vector<Tensor> parts;
  for (size_t i = 0; i < xs.size(); ++i) {
    const NodePtr& n = node(xs[i], "stack", loc);
    if (n->shape != first->shape)
      util::fail(loc, "stack",
                 cat("tensor ", i, " has shape ", shape_str(n->shape), " but tensor 0 has ",
                     shape_str(first->shape)),
                 "Stacked tensors must all have the same shape");
    parts.push_back(unsqueeze(xs[i], a, loc));
  }
  return concat(parts, a, loc);
}

std::vector<Tensor> unbind(const Tensor& x, int64_t axis, Loc loc) {
  const NodePtr& n = node(x, "unbind", loc);
  const int64_t a = frontend::norm_axis(axis, rank_of(n), "unbind", loc);
  Shape s = n->shape;
  s.erase(s.begin() + a);
  std::vector<Tensor> out;
  for (int64_t i = 0; i < n->shape[a]; ++i)
    out.push_back(reshape(record(Op::Slice, {n}, {a, i, i + 1, 1}, loc), s, loc));
  return out;
}

Tensor narrow(const Tensor& x, int64_t axis, int64_t start, int64_t length, Loc loc) {
  const NodePtr& n = node(x, "narrow", loc);
  const int64_t a = frontend::norm_axis(axis, rank_of(n), "narrow", loc);
  const int64_t size = n->shape[a];
  const int64_t s = start < 0 ? start + size : start;
  // length > size - s, not s + length > size: a length near 2^63 must not overflow the check.
  if (s < 0 || s > size || length < 0 || length > size - s)
    util::fail(loc, "narrow",
               cat("start ", start, " and length ", length, " do not fit axis ", axis, " of ",
                   shape_str(n->shape)),
               cat("Use -", size, " <= start <= ", size, " and start + length <= ", size));
  return record(Op::Slice, {n}, {a, s, s + length, 1}, loc);
}

namespace {
Tensor select_as(const Tensor& x, int64_t axis, int64_t index, const char* op, const Loc& loc) {
  const NodePtr& n = node(x, op, loc);
  if (n->shape.empty())
    util::fail(loc, op, "cannot index a 0-d tensor with an integer",
               "Index tensors that have at least one axis");
  const int64_t a = frontend::norm_axis(axis, rank_of(n), op, loc);
  const int64_t size = n->shape[a];
  if (index < -size || index >= size)
    util::fail(loc, op,
               cat("index ", index, " is out of range for axis ", a, " of size ", size, " in ",
                   shape_str(n->shape)),
               cat("Use -", size, " <= index < ", size));
  const int64_t i = index < 0 ? index + size : index;
  Shape out = n->shape;
  out.erase(out.begin() + a);
  return record(Op::Reshape, {make(Op::Slice, {n}, ir::SliceAttrs{a, i, i + 1, 1}.encode(), loc)},
                {}, loc, out);
}
}  // namespace

Tensor select(const Tensor& x, int64_t axis, int64_t index, Loc loc) {
  return select_as(x, axis, index, "select", loc);
}

Tensor index(const Tensor& x, const std::vector<TensorIndex>& indices, Loc loc) {
  const int64_t rank = rank_of(node(x, "index", loc));
  int64_t named = 0, ellipses = 0;
  for (const TensorIndex& t : indices) {
    named += std::holds_alternative<int64_t>(t.value()) || std::holds_alternative<Slice>(t.value());
    ellipses += std::holds_alternative<EllipsisIndex>(t.value());
  }
  if (ellipses > 1)
    util::fail(loc, "index", cat(ellipses, " ellipses"), "Use at most one ls::Ellipsis");
  if (named > rank)
    util::fail(loc, "index",
               cat("too many indices (", named, ") for a tensor of rank ", rank, " (",
                   shape_str(x.shape()), ")"),
               "Index at most one integer or slice per axis");
  Tensor y = x;
  int64_t axis = 0;  // the next axis of y the indices address
  for (const TensorIndex& t : indices) {
    if (const int64_t* i = std::get_if<int64_t>(&t.value())) {
      y = select_as(y, axis, *i, "index", loc);
    } else if (const Slice* s = std::get_if<Slice>(&t.value())) {
      if (s->step <= 0)
        util::fail(loc, "index", cat("slice step ", s->step, " must be positive"),
                   "Use a step >= 1 (as PyTorch; ls::flip reverses)");
      y = slice(y, axis, s->start.value_or(0),
                s->stop.value_or(std::numeric_limits<int64_t>::max()), s->step, loc);
      ++axis;
    } else if (std::holds_alternative<NoneIndex>(t.value())) {
      y = unsqueeze(y, axis, loc);
      ++axis;
    } else {
      axis += rank - named;  // the axes no index names
    }
  }
  return y.is_same(x) ? clone(x, loc) : y;
}

Tensor movedim(const Tensor& x, const std::vector<int64_t>& source,
               const std::vector<int64_t>& destination, Loc loc) {
  const NodePtr& n = node(x, "movedim", loc);
  const int64_t r = rank_of(n);
  if (source.size() != destination.size())
    util::fail(loc, "movedim",
               cat(source.size(), " source axes but ", destination.size(), " destinations"),
               "Give one destination per source axis");
  std::vector<int64_t> perm(static_cast<size_t>(r), -1);
  std::vector<bool> used(static_cast<size_t>(r), false);
  for (size_t i = 0; i < source.size(); ++i) {
    const int64_t s = frontend::norm_axis(source[i], r, "movedim", loc);
    const int64_t d = frontend::norm_axis(destination[i], r, "movedim", loc);
    if (used[s] || perm[d] >= 0)
      util::fail(loc, "movedim",
                 cat("axes repeat in source ", shape_str(source), " or destination ",
                     shape_str(destination)),
                 "List each axis once");
    perm[d] = s;
    used[s] = true;
  }
  int64_t next = 0;
  for (int64_t& p : perm)
    if (p < 0) {
      while (used[next]) ++next;
      p = next++;
    }
  return permute(x, perm, loc);
}

Tensor movedim(const Tensor& x, int64_t source, int64_t destination, Loc loc) {
  return movedim(x, std::vector<int64_t>{source}, std::vector<int64_t>{destination}, loc);
}

Tensor repeat(const Tensor& x, const std::vector<int64_t>& repeats, Loc loc) {
  const NodePtr& n = node(x, "repeat", loc);
  if (repeats.size() < n->shape.size())
    util::fail(loc, "repeat",
               cat(repeats.size(), " repeats for a tensor of rank ", n->shape.size(), " (",
                   shape_str(n->shape), ")"),
               "Give at least one repeat count per axis");
  Shape s(repeats.size() - n->shape.size(), 1);
  s.insert(s.end(), n->shape.begin(), n->shape.end());
  // [s0, s1, ...] -> [1, s0, 1, s1, ...] -> expanded to [r0, s0, r1, s1, ...] -> [r0*s0, ...].
  Shape inter, big, out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (repeats[i] < 0)
      util::fail(loc, "repeat", cat("negative repeat count in ", shape_str(repeats)),
                 "Counts must be >= 0");
    inter.insert(inter.end(), {1, s[i]});
    big.insert(big.end(), {repeats[i], s[i]});
    out.push_back(repeats[i] * s[i]);
  }
  return reshape(expand(reshape(x, inter, loc), big, loc), out, loc);
}

Tensor flip(const Tensor& x, const std::vector<int64_t>& axes, Loc loc) {
  const NodePtr& n = node(x, "flip", loc);
  const int64_t r = rank_of(n);
  std::vector<bool> seen(static_cast<size_t>(r), false);
  Tensor y = x;
  for (int64_t axis : axes) {
    const int64_t a = frontend::norm_axis(axis, r, "flip", loc);
    if (seen[a])
      util::fail(loc, "flip", cat("axis ", axis, " is given twice in ", shape_str(axes)),
                 "List each axis once");
    seen[a] = true;
    if (n->shape[a] <= 1) continue;
    // Reversed positions along the axis: (size - 1) - i.
    const Tensor idx = sub(n->shape[a] - 1, iota(n->shape, a, n->device, loc), loc);
    y = gather(y, a, idx, loc);
  }
  return y.is_same(x) ? clone(x, loc) : y;
}

Tensor roll(const Tensor& x, const std::vector<int64_t>& shifts, const std::vector<int64_t>& axes,
            Loc loc) {
  const NodePtr& n = node(x, "roll", loc);
  if (axes.empty()) {
    if (shifts.size() != 1)
      util::fail(loc, "roll", cat(shifts.size(), " shifts with no axes"),
                 "Without axes give one shift (the tensor is rolled flattened)");
    if (n->shape.empty()) return clone(x, loc);
    return reshape(roll(reshape(x, {-1}, loc), shifts, {0}, loc), n->shape, loc);
  }
  if (shifts.size() != axes.size())
    util::fail(loc, "roll", cat(shifts.size(), " shifts for ", axes.size(), " axes"),
               "Give one shift per axis");
  Tensor y = x;
  for (size_t i = 0; i < axes.size(); ++i) {
    const int64_t a = frontend::norm_axis(axes[i], rank_of(n), "roll", loc);
    const int64_t size = n->shape[a];
    if (size == 0) continue;
    const int64_t s = ((shifts[i] % size) + size) % size;
    if (s == 0) continue;
    y = concat({slice(y, a, size - s, size, 1, loc), slice(y, a, 0, size - s, 1, loc)}, a, loc);
  }
  return y.is_same(x) ? clone(x, loc) : y;
}

namespace {
Tensor triangle(const Tensor& x, int64_t diagonal, bool lower, const char* op, const Loc& loc) {
  const NodePtr& n = node(x, op, loc);
  const int64_t r = rank_of(n);
  if (r < 2)
    util::fail(loc, op, cat("needs a tensor of rank >= 2, got ", shape_str(n->shape)),
               "Pass a matrix or a batch of matrices");
  const Shape mn = {n->shape[r - 2], n->shape[r - 1]};
  // Column minus row: 0 on the main diagonal, k on the k-th above it.
  const Tensor offset = sub(iota(mn, 1, n->device, loc), iota(mn, 0, n->device, loc), loc);
  const Tensor keep = lower ? le(offset, diagonal, loc) : ge(offset, diagonal, loc);
  return where(keep, x, zeros({}, TensorOptions(n->dtype, n->device), loc), loc);
}
}  // namespace

Tensor tril(const Tensor& x, int64_t diagonal, Loc loc) {
  return triangle(x, diagonal, true, "tril", loc);
}
Tensor triu(const Tensor& x, int64_t diagonal, Loc loc) {
  return triangle(x, diagonal, false, "triu", loc);
}

// ---- indexing ------------------------------------------------------------------------------
Tensor index_select(const Tensor& x, int64_t axis, const Tensor& index, Loc loc) {
  const util::UserOp user_op("index_select");
  const NodePtr& n = node(x, "index_select", loc);
  const NodePtr& in = node(index, "index_select", loc);
  if (in->dtype != DType::I64 && in->dtype != DType::I32)
    util::fail(loc, "index_select",
               cat("index must be an integer tensor, got ", dtype_name(in->dtype)),
               "Cast it with ls::cast(index, ls::i64)");
  if (in->shape.size() > 1)
    util::fail(loc, "index_select", cat("index must be 0-d or 1-d, got ", shape_str(in->shape)),
               "Flatten the index, select, then reshape the result");
  if (n->shape.empty()) {
    frontend::norm_axis(axis, 1, "index_select", loc);
    return clone(x, loc);
  }
  const int64_t a = frontend::norm_axis(axis, rank_of(n), "index_select", loc);
  const int64_t k = in->shape.empty() ? 1 : in->shape[0];
  Shape ones_shape(n->shape.size(), 1), out = n->shape;
  ones_shape[a] = k;
  out[a] = k;
  const Tensor idx = expand(reshape(cast(index, DType::I64, loc), ones_shape, loc), out, loc);
  return gather(x, a, idx, loc);
}

Tensor take_along_dim(const Tensor& x, const Tensor& index, int64_t axis, Loc loc) {
  const util::UserOp user_op("take_along_dim");
  const NodePtr& n = node(x, "take_along_dim", loc);
  const NodePtr& in = node(index, "take_along_dim", loc);
  if (in->shape.size() != n->shape.size())
    util::fail(loc, "take_along_dim",
               cat("index ", shape_str(in->shape), " must have the rank of the input ",
                   shape_str(n->shape)),
               "Unsqueeze the index to the input's rank");
  const int64_t a = frontend::norm_axis(axis, rank_of(n), "take_along_dim", loc);
  Shape xs = n->shape, is = in->shape;
  xs[a] = 1;
  is[a] = 1;
  Shape b = frontend::broadcast_shapes(xs, is, "take_along_dim", loc);
  Shape bx = b, bi = b;
  bx[a] = n->shape[a];
  bi[a] = in->shape[a];
  return gather(expand(x, bx, loc), a, expand(index, bi, loc), loc);
}

Tensor one_hot(const Tensor& index, int64_t num_classes, Loc loc) {
  const util::UserOp user_op("one_hot");
  const NodePtr& in = node(index, "one_hot", loc);
  if (in->dtype != DType::I64)
    util::fail(loc, "one_hot", cat("index must be i64, got ", dtype_name(in->dtype)),
               "Cast it with ls::cast(index, ls::i64)");
  if (num_classes <= 0)
    util::fail(loc, "one_hot", cat("num_classes = ", num_classes, " must be positive"),
               "Pass the number of classes (it cannot be inferred from the data without a sync)");
  Shape s = in->shape;
  s.push_back(num_classes);
  Shape idx_shape = in->shape;
  idx_shape.push_back(1);
  // A scatter, so that an index outside [0, num_classes) fails as PyTorch's does.
  const Tensor idx = reshape(index, idx_shape, loc);
  return scatter_add(zeros(s, TensorOptions(DType::I64, in->device), loc), -1, idx,
                     ones(idx_shape, TensorOptions(DType::I64, in->device), loc), loc);
}

Tensor linspace(double start, double end, int64_t steps, TensorOptions options, Loc loc) {
  if (steps < 0)
    util::fail(loc, "linspace", cat("steps = ", steps, " is negative"), "Use steps >= 0");
  if (!is_floating(options.dtype))
    util::fail(loc, "linspace", cat("needs a floating dtype, got ", dtype_name(options.dtype)),
               "Use ls::f32 or ls::f64 (or arange for integers)");
  if (steps <= 1) return full({steps}, start, options, loc);
  const double step = (end - start) / static_cast<double>(steps - 1);
  const Tensor i = arange(steps, options, loc);
  // As PyTorch: the first half counts up from start, the second half down from end.
  return where(lt(i, static_cast<double>(steps / 2), loc), add(mul(i, step, loc), start, loc),
               sub(end, mul(sub(static_cast<double>(steps - 1), i, loc), step, loc), loc), loc);
}

}  // namespace lockstep
