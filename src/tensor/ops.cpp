// The recorded operations of ops.h: argument checks with clear errors, then IR nodes.
// Composite ops (mean, softmax, clamp, matmul's 1-d cases, ...) are written from primitives.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "autograd/grad_rules.h"
#include "lockstep/autograd.h"
#include "tensor/frontend.h"
#include "util/check.h"
#include "util/frames.h"

namespace lockstep {
namespace frontend {

using util::cat;

NodePtr scalar_node(Scalar value, DType dtype, Device device, const char* op, const Loc& loc) {
  ir::ScalarValue v;
  if (is_floating(dtype)) {
    v.f = value.to_double();
  } else {
    if (!value.is_integer() && value.to_double() != std::floor(value.to_double()))
      util::fail(loc, op,
                 cat("scalar ", value.to_double(), " is not a whole number but the tensor is ",
                     dtype_name(dtype)),
                 "Cast the tensor to a floating dtype first, e.g. ls::cast(x, ls::f32)");
    if (!value.is_integer() && std::abs(value.to_double()) >= 9.2e18)
      util::fail(loc, op, cat("scalar ", value.to_double(), " does not fit in ", dtype_name(dtype)),
                 "Use a smaller value");
    v.i = value.to_int();
    if (dtype == DType::Bool) v.i = v.i != 0;
    if (dtype == DType::I32 && (v.i < INT32_MIN || v.i > INT32_MAX))
      util::fail(loc, op, cat("scalar ", v.i, " does not fit in i32"),
                 "Cast the tensor to i64 first");
  }
  // Its origin is the user's place, resolved as an op node's is (ir::make_node).
  return ir::make_scalar(v, dtype, device, util::user_loc(loc));
}

NodePtr expand_to(const NodePtr& n, const Shape& shape, const Loc& loc) {
  if (n->shape == shape) return n;
  return make(Op::Expand, {n}, {}, loc, shape);
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op, const Loc& loc) {
  const size_t r = std::max(a.size(), b.size());
  Shape out(r);
  for (size_t i = 0; i < r; ++i) {
    const int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    const int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da != db && da != 1 && db != 1)
      util::fail(loc, op,
                 cat("shapes ", shape_str(a), " and ", shape_str(b), " do not broadcast (axis ",
                     static_cast<int64_t>(i) - static_cast<int64_t>(r), ": ", da, " vs ", db, ")"),
                 "Each dimension, aligned from the right, must be equal or 1; reshape or "
                 "unsqueeze one operand");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

int64_t norm_axis(int64_t axis, int64_t rank, const char* op, const Loc& loc) {
  if (axis < -rank || axis >= rank)
    util::fail(
        loc, op, cat("axis ", axis, " is out of range for a tensor of rank ", rank),
        rank == 0 ? "A 0-d tensor has no axes" : cat("Use an axis in [", -rank, ", ", rank, ")"));
  return axis < 0 ? axis + rank : axis;
}

Device device_of(const TensorOptions& options) {
  return options.has_device ? options.device : default_device();
}

namespace {

Tensor unary(Op op, const Tensor& x, const Loc& loc) {
  return record(op, {node(x, ir::user_name(op), loc)}, {}, loc);
}

}  // namespace

// PyTorch's type promotion (torch.result_type): categories bool < integer < floating; a 0-d
// tensor or a scalar counts only when its category is above the other operand's; otherwise the
// larger dtype of the same category wins.
namespace {
int category(DType d) { return d == DType::Bool ? 0 : is_integral(d) ? 1 : 2; }

}  // namespace

DType result_type(DType a, bool a_0d, DType b, bool b_0d) {
  if (a == b) return a;
  const int ca = category(a), cb = category(b);
  if (a_0d != b_0d) {
    const DType dim = a_0d ? b : a, zero = a_0d ? a : b;
    return category(zero) > category(dim) ? zero : dim;
  }
  if (ca != cb) return ca > cb ? a : b;
  return dtype_size(a) >= dtype_size(b) ? a : b;
}

// The dtype a scalar takes next to a tensor of dtype `t`: the tensor's, unless the scalar's
// kind is above it (a float scalar makes an integer tensor f32; an integer one makes bool i64).
DType scalar_type(DType t, const Scalar& s) {
  const int cs = s.is_bool() ? 0 : s.is_integer() ? 1 : 2;
  if (cs <= category(t)) return t;
  return cs == 2 ? DType::F32 : DType::I64;
}

NodePtr cast_node(const NodePtr& n, DType dtype, const Loc& loc) {
  return n->dtype == dtype ? n : make(Op::Cast, {n}, {}, loc, {}, dtype);
}

namespace {

// True division of integers gives floats, as PyTorch's `/`.
DType op_type(Op op, DType t) { return op == Op::Div && !is_floating(t) ? DType::F32 : t; }

Tensor binary(Op op, const NodePtr& a, const NodePtr& b, const Loc& loc) {
  const char* name = ir::op_info(op).name;
  const DType t = op_type(op, result_type(a->dtype, a->shape.empty(), b->dtype, b->shape.empty()));
  const Shape s = broadcast_shapes(a->shape, b->shape, name, loc);
  return record(op,
                {expand_to(cast_node(a, t, loc), s, loc), expand_to(cast_node(b, t, loc), s, loc)},
                {}, loc);
}

Tensor binary(Op op, const Tensor& a, const Tensor& b, const Loc& loc) {
  const char* name = ir::op_info(op).name;
  return binary(op, node(a, name, loc), node(b, name, loc), loc);
}

// With a host number: a few nodes (the number, its expand, the op) at one place, resolved once.
Tensor binary(Op op, const Tensor& a, Scalar b, const Loc& at) {
  const Loc loc = util::op_loc(at);
  const char* name = ir::op_info(op).name;
  const NodePtr& an = node(a, name, loc);
  const DType t = op_type(op, scalar_type(an->dtype, b));
  return binary(op, cast_node(an, t, loc), scalar_node(b, t, an->device, name, loc), loc);
}

Tensor binary(Op op, Scalar a, const Tensor& b, const Loc& at) {
  const Loc loc = util::op_loc(at);
  const char* name = ir::op_info(op).name;
  const NodePtr& bn = node(b, name, loc);
  const DType t = op_type(op, scalar_type(bn->dtype, a));
  return binary(op, scalar_node(a, t, bn->device, name, loc), cast_node(bn, t, loc), loc);
}

// [keepdim, sorted unique axes...]; empty `axes` means all.
std::vector<int64_t> reduce_attrs(const Shape& shape, const std::vector<int64_t>& axes,
                                  bool keepdim, const char* op, const Loc& loc) {
  const int64_t r = static_cast<int64_t>(shape.size());
  std::vector<int64_t> norm;
  if (axes.empty()) {
    norm.resize(r);
    std::iota(norm.begin(), norm.end(), 0);
  }
  for (int64_t a : axes) {
    const int64_t n = norm_axis(a, r, op, loc);
    if (std::find(norm.begin(), norm.end(), n) != norm.end())
      util::fail(loc, op, cat("axis ", a, " is given twice in ", shape_str(axes)),
                 "List each axis once");
    norm.push_back(n);
  }
  std::sort(norm.begin(), norm.end());
  norm.insert(norm.begin(), keepdim ? 1 : 0);
  return norm;
}

Tensor reduce(Op op, const Tensor& x, const std::vector<int64_t>& axes, bool keepdim,
              const Loc& loc) {
  const char* name = ir::user_name(op);
  NodePtr n = node(x, name, loc);
  if (op == Op::Sum) n = autocast_f32(n, loc);  // autocast: sums are f32
  return record(op, {n}, reduce_attrs(n->shape, axes, keepdim, name, loc), loc);
}

int64_t reduced_count(const Shape& shape, const std::vector<int64_t>& attrs) {
  int64_t c = 1;
  for (size_t i = 1; i < attrs.size(); ++i) c *= shape[attrs[i]];
  return c;
}

}  // namespace
}  // namespace frontend

using frontend::binary;
using frontend::make;
using frontend::node;
using frontend::NodePtr;
using frontend::record;
using frontend::unary;
using ir::Op;
using util::cat;

// The same node under a new handle: the value is shared, not computed again (an in-place update
// gives the updated handle a new node and leaves this one as it was).
Tensor clone(const Tensor& t, Loc loc) { return runtime::new_tensor(node(t, "clone", loc)); }

// ---- elementwise ---------------------------------------------------------------------------
Tensor neg(const Tensor& x, Loc loc) { return unary(Op::Neg, x, loc); }
Tensor abs(const Tensor& x, Loc loc) { return unary(Op::Abs, x, loc); }
Tensor exp(const Tensor& x, Loc loc) { return unary(Op::Exp, x, loc); }
Tensor log(const Tensor& x, Loc loc) { return unary(Op::Log, x, loc); }
Tensor sqrt(const Tensor& x, Loc loc) { return unary(Op::Sqrt, x, loc); }
Tensor rsqrt(const Tensor& x, Loc loc) { return unary(Op::Rsqrt, x, loc); }
Tensor tanh(const Tensor& x, Loc loc) { return unary(Op::Tanh, x, loc); }
Tensor sigmoid(const Tensor& x, Loc loc) { return unary(Op::Sigmoid, x, loc); }
Tensor relu(const Tensor& x, Loc loc) { return unary(Op::Relu, x, loc); }
Tensor sin(const Tensor& x, Loc loc) { return unary(Op::Sin, x, loc); }
Tensor cos(const Tensor& x, Loc loc) { return unary(Op::Cos, x, loc); }
Tensor erf(const Tensor& x, Loc loc) { return unary(Op::Erf, x, loc); }
Tensor floor(const Tensor& x, Loc loc) { return unary(Op::Floor, x, loc); }
Tensor ceil(const Tensor& x, Loc loc) { return unary(Op::Ceil, x, loc); }
Tensor sign(const Tensor& x, Loc loc) { return unary(Op::Sign, x, loc); }
Tensor logical_not(const Tensor& x, Loc loc) { return unary(Op::LogicalNot, x, loc); }
Tensor isfinite(const Tensor& x, Loc loc) { return unary(Op::IsFinite, x, loc); }
Tensor square(const Tensor& x, Loc loc) {
  node(x, "square", loc);
  return mul(x, x, loc);
}

#define LOCKSTEP_BINARY_DEF(name, op)                                                      \
  Tensor name(const Tensor& a, const Tensor& b, Loc loc) { return binary(op, a, b, loc); } \
  Tensor name(const Tensor& a, Scalar b, Loc loc) { return binary(op, a, b, loc); }        \
  Tensor name(Scalar a, const Tensor& b, Loc loc) { return binary(op, a, b, loc); }
LOCKSTEP_BINARY_DEF(add, Op::Add)
LOCKSTEP_BINARY_DEF(sub, Op::Sub)
LOCKSTEP_BINARY_DEF(mul, Op::Mul)
LOCKSTEP_BINARY_DEF(div, Op::Div)
LOCKSTEP_BINARY_DEF(pow, Op::Pow)
LOCKSTEP_BINARY_DEF(maximum, Op::Maximum)
LOCKSTEP_BINARY_DEF(minimum, Op::Minimum)
LOCKSTEP_BINARY_DEF(eq, Op::Eq)
LOCKSTEP_BINARY_DEF(ne, Op::Ne)
LOCKSTEP_BINARY_DEF(lt, Op::Lt)
LOCKSTEP_BINARY_DEF(le, Op::Le)
LOCKSTEP_BINARY_DEF(gt, Op::Gt)
LOCKSTEP_BINARY_DEF(ge, Op::Ge)
LOCKSTEP_BINARY_DEF(logical_and, Op::LogicalAnd)
LOCKSTEP_BINARY_DEF(logical_or, Op::LogicalOr)
#undef LOCKSTEP_BINARY_DEF

namespace {
Tensor where_nodes(const NodePtr& c, NodePtr a, NodePtr b, const Loc& loc) {
  if (c->dtype != DType::Bool)
    util::fail(loc, "where", cat("condition must be bool, got ", dtype_name(c->dtype)),
               "Compare to get a bool tensor, e.g. x > 0");
  const DType t = frontend::result_type(a->dtype, a->shape.empty(), b->dtype, b->shape.empty());
  a = frontend::cast_node(a, t, loc);
  b = frontend::cast_node(b, t, loc);
  const Shape s = frontend::broadcast_shapes(
      frontend::broadcast_shapes(c->shape, a->shape, "where", loc), b->shape, "where", loc);
  using frontend::expand_to;
  return record(Op::Where, {expand_to(c, s, loc), expand_to(a, s, loc), expand_to(b, s, loc)}, {},
                loc);
}
}  // namespace

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b, Loc loc) {
  return where_nodes(node(cond, "where", loc), node(a, "where", loc), node(b, "where", loc), loc);
}
Tensor where(const Tensor& cond, const Tensor& a, Scalar b, Loc loc) {
  const NodePtr& an = node(a, "where", loc);
  const DType t = frontend::scalar_type(an->dtype, b);
  return where_nodes(node(cond, "where", loc), an,
                     frontend::scalar_node(b, t, an->device, "where", loc), loc);
}
Tensor where(const Tensor& cond, Scalar a, const Tensor& b, Loc loc) {
  const NodePtr& bn = node(b, "where", loc);
  const DType t = frontend::scalar_type(bn->dtype, a);
  return where_nodes(node(cond, "where", loc),
                     frontend::scalar_node(a, t, bn->device, "where", loc), bn, loc);
}
Tensor where(const Tensor& cond, Scalar a, Scalar b, Loc loc) {
  const NodePtr& cn = node(cond, "where", loc);
  // Two scalars: f32 if either is a float, else i64, else bool (PyTorch's defaults).
  const DType t = frontend::scalar_type(frontend::scalar_type(DType::Bool, a), b);
  return where_nodes(cn, frontend::scalar_node(a, t, cn->device, "where", loc),
                     frontend::scalar_node(b, t, cn->device, "where", loc), loc);
}

Tensor cast(const Tensor& x, DType dtype, Loc loc) {
  const NodePtr& n = node(x, "cast", loc);
  if (n->dtype == dtype) return clone(x, loc);
  return record(Op::Cast, {n}, {}, loc, {}, dtype);
}

Tensor clamp(const Tensor& x, Scalar lo, Scalar hi, Loc loc) {
  const NodePtr& n = node(x, "clamp", loc);
  if (n->dtype == DType::Bool)
    util::fail(loc, "clamp", cat("is not defined for bool tensors, got bool", shape_str(n->shape)),
               "Cast to a numeric dtype first, e.g. ls::cast(x, ls::f32)");
  if (lo.to_double() > hi.to_double())
    util::fail(loc, "clamp",
               cat("lower bound ", lo.to_double(), " is above upper bound ", hi.to_double()),
               "Pass lo <= hi");
  // The bounds are checked (and named) as clamp's, then applied as maximum and minimum.
  const NodePtr lo_n = frontend::scalar_node(lo, n->dtype, n->device, "clamp", loc);
  const NodePtr hi_n = frontend::scalar_node(hi, n->dtype, n->device, "clamp", loc);
  const Tensor low = binary(Op::Maximum, n, lo_n, loc);
  return binary(Op::Minimum, node(low, "clamp", loc), hi_n, loc);
}

// ---- reductions ----------------------------------------------------------------------------
Tensor sum(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim, Loc loc) {
  return frontend::reduce(Op::Sum, x, axes, keepdim, loc);
}
Tensor max(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim, Loc loc) {
  return frontend::reduce(Op::Max, x, axes, keepdim, loc);
}
Tensor min(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim, Loc loc) {
  return frontend::reduce(Op::Min, x, axes, keepdim, loc);
}
Tensor argmax(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim, Loc loc) {
  return frontend::reduce(Op::ArgMax, x, axes, keepdim, loc);
}
Tensor argmin(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim, Loc loc) {
  return frontend::reduce(Op::ArgMin, x, axes, keepdim, loc);
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim, Loc loc) {
  const NodePtr n = frontend::autocast_f32(node(x, "mean", loc), loc);
  if (!is_floating(n->dtype))
    util::fail(
        loc, "mean",
        cat("needs a floating-point tensor, got ", dtype_name(n->dtype), shape_str(n->shape)),
        "Cast it first, e.g. ls::cast(x, ls::f32)");
  const std::vector<int64_t> attrs = frontend::reduce_attrs(n->shape, axes, keepdim, "mean", loc);
  const int64_t count = frontend::reduced_count(n->shape, attrs);
  Tensor s = record(Op::Sum, {n}, attrs, loc);
  // An empty reduction is 0/0 = NaN, as in PyTorch.
  return div(s, static_cast<double>(count), loc);
}

namespace {

// Checks x and axes for a softmax-family op (named `op`), sets the reduce attrs
// [keepdim=1, axes...] and returns the shift that keeps exp() finite: the max over the axes with
// keepdim; with `finite_only`, 0 where that max is not finite (an all -inf row would give
// -inf - -inf = NaN). A reduction over an empty axis has no max and needs no shift: 0.
Tensor softmax_shift(const Tensor& x, const std::vector<int64_t>& axes, bool finite_only,
                     const char* op, const Loc& loc, std::vector<int64_t>* attrs) {
  const NodePtr& n = node(x, op, loc);
  if (!is_floating(n->dtype))
    util::fail(
        loc, op,
        cat("needs a floating-point tensor, got ", dtype_name(n->dtype), shape_str(n->shape)),
        "Cast it first, e.g. ls::cast(x, ls::f32)");
  *attrs = frontend::reduce_attrs(n->shape, axes, true, op, loc);
  if (frontend::reduced_count(n->shape, *attrs) == 0) {
    Shape kept = n->shape;
    for (size_t i = 1; i < attrs->size(); ++i) kept[(*attrs)[i]] = 1;
    return full(kept, 0, TensorOptions(n->dtype, n->device), loc);
  }
  // Detached: softmax, log_softmax and logsumexp do not depend on the shift, so its exact
  // gradient is zero. Left attached, the backward computed that zero the long way: the max's
  // gradient (a mask of the maxima, divided by their count) times a sum over the row of the
  // other gradients, two more passes over every [B H, T, T] score tensor of an attention.
  Tensor m = record(Op::Max, {n}, *attrs, loc);
  return (finite_only ? where(isfinite(m, loc), m, 0.0, loc) : m).detach(loc);
}

}  // namespace

namespace {
// Autocast reads the softmax family's input as f32.
Tensor f32_under_autocast(const Tensor& x, const char* op, const Loc& loc) {
  const NodePtr& n = node(x, op, loc);
  const NodePtr f = frontend::autocast_f32(n, loc);
  return f == n ? x : runtime::new_tensor(f);
}
}  // namespace

Tensor logsumexp(const Tensor& x_in, const std::vector<int64_t>& axes, bool keepdim, Loc loc) {
  const Tensor x = f32_under_autocast(x_in, "logsumexp", loc);
  std::vector<int64_t> attrs;
  const Tensor m = softmax_shift(x, axes, true, "logsumexp", loc, &attrs);
  const Tensor e = exp(sub(x, m, loc), loc);
  Tensor s = log(record(Op::Sum, {node(e, "logsumexp", loc)}, attrs, loc), loc);
  Tensor out = add(s, m, loc);
  if (keepdim) return out;
  const Shape& full_shape = node(out, "logsumexp", loc)->shape;
  Shape squeezed;
  for (size_t d = 0; d < full_shape.size(); ++d)
    if (std::find(attrs.begin() + 1, attrs.end(), static_cast<int64_t>(d)) == attrs.end())
      squeezed.push_back(full_shape[d]);
  return reshape(out, squeezed, loc);
}

// The softmax family's gradients are PyTorch's formulas from the output (with_grad_fn), not
// what the primitives' rules give: softmax's dx = p (g - sum(g p)), log-softmax's
// dx = g - exp(out) sum(g). The primitives' version reads the same values but computes
// exp(x - max) / sum twice over and divides by the sum twice more, a quarter more passes over
// every [B H, T, T] score tensor of an attention's backward.
Tensor softmax(const Tensor& x_in, int64_t axis, Loc loc) {
  const Tensor x = f32_under_autocast(x_in, "softmax", loc);
  std::vector<int64_t> attrs;
  Tensor p;
  {
    NoGrad no_grad;
    const Tensor m = softmax_shift(x, {axis}, false, "softmax", loc, &attrs);
    const Tensor e = exp(sub(x, m, loc), loc);
    p = div(e, record(Op::Sum, {node(e, "softmax", loc)}, attrs, loc), loc);
  }
  const autograd::SavedValue saved(p, "softmax", loc);
  const std::vector<int64_t> axes(attrs.begin() + 1, attrs.end());
  return autograd::with_grad_fn(
      p, {x},
      [saved, axes, loc](const Tensor& g) {
        const Tensor out = saved.get();
        return std::vector<Tensor>{
            mul(out, sub(g, sum(mul(g, out, loc), axes, true, loc), loc), loc)};
      },
      loc);
}

Tensor log_softmax(const Tensor& x_in, int64_t axis, Loc loc) {
  const Tensor x = f32_under_autocast(x_in, "log_softmax", loc);
  std::vector<int64_t> attrs;
  Tensor y;
  {
    NoGrad no_grad;
    const Tensor m = softmax_shift(x, {axis}, true, "log_softmax", loc, &attrs);
    const Tensor e = exp(sub(x, m, loc), loc);
    const Tensor s = record(Op::Sum, {node(e, "log_softmax", loc)}, attrs, loc);
    y = sub(x, add(log(s, loc), m, loc), loc);
  }
  const autograd::SavedValue saved(y, "log_softmax", loc);
  const std::vector<int64_t> axes(attrs.begin() + 1, attrs.end());
  return autograd::with_grad_fn(
      y, {x},
      [saved, axes, loc](const Tensor& g) {
        return std::vector<Tensor>{
            sub(g, mul(exp(saved.get(), loc), sum(g, axes, true, loc), loc), loc)};
      },
      loc);
}

// ---- movement ------------------------------------------------------------------------------
Tensor reshape(const Tensor& x, const Shape& shape, Loc loc) {
  const NodePtr& n = node(x, "reshape", loc);
  Shape s = shape;
  int infer_at = -1;
  int64_t known = 1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      if (infer_at >= 0)
        util::fail(loc, "reshape", cat("more than one -1 in ", shape_str(shape)),
                   "Only one dimension can be inferred");
      infer_at = static_cast<int>(i);
    } else if (s[i] < 0) {
      util::fail(loc, "reshape", cat("negative size ", s[i], " in ", shape_str(shape)),
                 "Sizes must be >= 0, or -1 for one inferred dimension");
    } else if (__builtin_mul_overflow(known, s[i], &known)) {
      util::fail(loc, "reshape",
                 cat("shape ", shape_str(shape), " is too large: its count overflows"),
                 "Check the sizes (a huge value computed by mistake?)");
    }
  }
  const int64_t total = shape_numel(n->shape);
  if (infer_at >= 0) {
    if (known == 0 || total % known != 0)
      util::fail(loc, "reshape",
                 cat("cannot infer the -1 in ", shape_str(shape), " for ", total, " elements of ",
                     shape_str(n->shape)),
                 "The other sizes must divide the element count");
    s[infer_at] = total / known;
  }
  if (s == n->shape) return clone(x, loc);
  return record(Op::Reshape, {n}, {}, loc, s);
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& perm, Loc loc) {
  const NodePtr& n = node(x, "permute", loc);
  const int64_t r = static_cast<int64_t>(n->shape.size());
  if (static_cast<int64_t>(perm.size()) != r)
    util::fail(loc, "permute",
               cat("permutation ", shape_str(perm), " has ", perm.size(), " entries for ",
                   shape_str(n->shape)),
               "Give one entry per axis");
  std::vector<int64_t> p;
  for (int64_t a : perm) p.push_back(frontend::norm_axis(a, r, "permute", loc));
  return record(Op::Permute, {n}, p, loc);
}

Tensor transpose(const Tensor& x, int64_t axis0, int64_t axis1, Loc loc) {
  const NodePtr& n = node(x, "transpose", loc);
  const int64_t r = static_cast<int64_t>(n->shape.size());
  const int64_t a = frontend::norm_axis(axis0, r, "transpose", loc);
  const int64_t b = frontend::norm_axis(axis1, r, "transpose", loc);
  std::vector<int64_t> p(r);
  std::iota(p.begin(), p.end(), 0);
  std::swap(p[a], p[b]);
  return record(Op::Permute, {n}, p, loc);
}

Tensor expand(const Tensor& x, const Shape& shape, Loc loc) {
  const NodePtr& n = node(x, "expand", loc);
  Shape s = shape;
  const size_t lead = s.size() >= n->shape.size() ? s.size() - n->shape.size() : 0;
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i] == -1) {
      if (i < lead)
        util::fail(loc, "expand", cat("-1 in a new leading dimension of ", shape_str(shape)),
                   "Give new dimensions an explicit size");
      s[i] = n->shape[i - lead];
    }
  return Tensor(runtime::new_tensor(frontend::expand_to(n, s, loc)));
}

Tensor unsqueeze(const Tensor& x, int64_t axis, Loc loc) {
  const NodePtr& n = node(x, "unsqueeze", loc);
  const int64_t r = static_cast<int64_t>(n->shape.size());
  const int64_t a = frontend::norm_axis(axis, r + 1, "unsqueeze", loc);
  Shape s = n->shape;
  s.insert(s.begin() + a, 1);
  return record(Op::Reshape, {n}, {}, loc, s);
}

Tensor squeeze(const Tensor& x, int64_t axis, Loc loc) {
  const NodePtr& n = node(x, "squeeze", loc);
  const int64_t a =
      frontend::norm_axis(axis, static_cast<int64_t>(n->shape.size()), "squeeze", loc);
  if (n->shape[a] != 1)
    util::fail(
        loc, "squeeze",
        cat("axis ", axis, " of ", shape_str(n->shape), " has size ", n->shape[a], ", not 1"),
        "Only size-1 axes can be squeezed");
  Shape s = n->shape;
  s.erase(s.begin() + a);
  return record(Op::Reshape, {n}, {}, loc, s);
}

Tensor flatten(const Tensor& x, int64_t start_axis, int64_t end_axis, Loc loc) {
  const NodePtr& n = node(x, "flatten", loc);
  const int64_t r = static_cast<int64_t>(n->shape.size());
  if (r == 0) {  // a 0-d tensor flattens to [1]; its axes count as those of a 1-d tensor
    frontend::norm_axis(start_axis, 1, "flatten", loc);
    frontend::norm_axis(end_axis, 1, "flatten", loc);
    return reshape(x, {1}, loc);
  }
  const int64_t a = frontend::norm_axis(start_axis, r, "flatten", loc);
  const int64_t b = frontend::norm_axis(end_axis, r, "flatten", loc);
  if (a > b)
    util::fail(loc, "flatten", cat("start axis ", start_axis, " is after end axis ", end_axis),
               "Pass start_axis <= end_axis");
  Shape s(n->shape.begin(), n->shape.begin() + a);
  int64_t m = 1;
  for (int64_t d = a; d <= b; ++d) m *= n->shape[d];
  s.push_back(m);
  s.insert(s.end(), n->shape.begin() + b + 1, n->shape.end());
  return reshape(x, s, loc);
}

Tensor slice(const Tensor& x, int64_t axis, int64_t start, int64_t end, int64_t step, Loc loc) {
  const NodePtr& n = node(x, "slice", loc);
  const int64_t a = frontend::norm_axis(axis, static_cast<int64_t>(n->shape.size()), "slice", loc);
  if (step <= 0)
    util::fail(loc, "slice", cat("step ", step, " must be positive"),
               "Use a step >= 1 (reverse order is not supported)");
  const int64_t size = n->shape[a];
  auto clampi = [&](int64_t i) {
    if (i < 0) i += size;
    return std::clamp<int64_t>(i, 0, size);
  };
  const int64_t s = clampi(start);
  const int64_t e = std::max(s, clampi(end));
  return record(Op::Slice, {n}, {a, s, e, step}, loc);
}

Tensor concat(const std::vector<Tensor>& xs, int64_t axis, Loc loc) {
  if (xs.empty()) util::fail(loc, "concat", "got no tensors", "Pass at least one tensor");
  std::vector<NodePtr> nodes;
  for (const Tensor& t : xs) nodes.push_back(node(t, "concat", loc));
  const int64_t a =
      frontend::norm_axis(axis, static_cast<int64_t>(nodes[0]->shape.size()), "concat", loc);
  if (nodes.size() == 1) return clone(xs[0], loc);
  return record(Op::Concat, std::move(nodes), {a}, loc);
}

Tensor pad(const Tensor& x, const std::vector<std::pair<int64_t, int64_t>>& pads, Scalar value,
           Loc loc) {
  const NodePtr& n = node(x, "pad", loc);
  std::vector<int64_t> attrs;
  for (const auto& [lo, hi] : pads) {
    attrs.push_back(lo);
    attrs.push_back(hi);
  }
  return record(Op::Pad, {n, frontend::scalar_node(value, n->dtype, n->device, "pad", loc)}, attrs,
                loc);
}

// ---- indexing ------------------------------------------------------------------------------
Tensor gather(const Tensor& x, int64_t axis, const Tensor& index, Loc loc) {
  const NodePtr& n = node(x, "gather", loc);
  const int64_t a = frontend::norm_axis(axis, static_cast<int64_t>(n->shape.size()), "gather", loc);
  return record(Op::Gather, {n, node(index, "gather", loc)}, {a}, loc);
}

Tensor scatter_add(const Tensor& x, int64_t axis, const Tensor& index, const Tensor& src, Loc loc) {
  const NodePtr& n = node(x, "scatter_add", loc);
  const int64_t a =
      frontend::norm_axis(axis, static_cast<int64_t>(n->shape.size()), "scatter_add", loc);
  return record(Op::ScatterAdd, {n, node(index, "scatter_add", loc), node(src, "scatter_add", loc)},
                {a}, loc);
}

// ---- linear algebra, convolution, pooling ---------------------------------------------------
Tensor matmul(const Tensor& a, const Tensor& b, Loc loc) {
  // Autocast: the products in bf16 (f32 accumulation).
  const NodePtr an = frontend::autocast_low(node(a, "matmul", loc), loc);
  const NodePtr bn = frontend::autocast_low(node(b, "matmul", loc), loc);
  if (an->shape.empty() || bn->shape.empty())
    util::fail(loc, "matmul",
               cat("operands ", shape_str(an->shape), " and ", shape_str(bn->shape),
                   " include a 0-d tensor"),
               "Use ls::mul for scalars");
  Shape as = an->shape, bs = bn->shape;
  const bool a_vec = as.size() == 1, b_vec = bs.size() == 1;
  if (a_vec) as.insert(as.begin(), 1);
  if (b_vec) bs.push_back(1);
  const size_t r = std::max(as.size(), bs.size());
  as.insert(as.begin(), r - as.size(), 1);
  bs.insert(bs.begin(), r - bs.size(), 1);
  NodePtr a2 = as == an->shape ? an : make(Op::Reshape, {an}, {}, loc, as);
  NodePtr b2 = bs == bn->shape ? bn : make(Op::Reshape, {bn}, {}, loc, bs);
  NodePtr y = make(Op::MatMul, {a2, b2}, {}, loc);
  // Drop the dims added for 1-d operands and for rank alignment, as numpy.matmul does.
  Shape out(y->shape.begin(), y->shape.end() - 2);
  const size_t batch_rank = std::max(an->shape.size(), bn->shape.size());
  const size_t keep_batch = batch_rank >= 2 ? batch_rank - 2 : 0;
  out.erase(out.begin(), out.end() - static_cast<std::ptrdiff_t>(keep_batch));
  if (!a_vec) out.push_back(y->shape[r - 2]);
  if (!b_vec) out.push_back(y->shape[r - 1]);
  if (out == y->shape) return runtime::new_tensor(y);
  return record(Op::Reshape, {y}, {}, loc, out);
}

Tensor conv2d(const Tensor& x, const Tensor& weight, const Conv2dOptions& options, Loc loc) {
  using frontend::autocast_low;
  return record(
      Op::Conv2d,
      {autocast_low(node(x, "conv2d", loc), loc), autocast_low(node(weight, "conv2d", loc), loc)},
      frontend::conv_attrs(options).encode(), loc);
}

Tensor conv2d_backward_input(const Tensor& grad_out, const Tensor& weight, const Shape& input_shape,
                             const Conv2dOptions& options, Loc loc) {
  const char* op = "conv2d_backward_input";
  using frontend::autocast_low;
  return record(
      Op::Conv2dBackwardInput,
      {autocast_low(node(grad_out, op, loc), loc), autocast_low(node(weight, op, loc), loc)},
      frontend::conv_attrs(options).encode(), loc, input_shape);
}

Tensor conv2d_backward_weight(const Tensor& x, const Tensor& grad_out, const Shape& weight_shape,
                              const Conv2dOptions& options, Loc loc) {
  const char* op = "conv2d_backward_weight";
  using frontend::autocast_low;
  return record(Op::Conv2dBackwardWeight,
                {autocast_low(node(x, op, loc), loc), autocast_low(node(grad_out, op, loc), loc)},
                frontend::conv_attrs(options).encode(), loc, weight_shape);
}

Tensor lstm_layer(const Tensor& x, const Tensor& h0, const Tensor& c0, const Tensor& weight_ih,
                  const Tensor& weight_hh, const Tensor& bias, bool reverse, Loc loc) {
  const char* op = "lstm";
  return record(Op::Lstm,
                {node(x, op, loc), node(h0, op, loc), node(c0, op, loc), node(weight_ih, op, loc),
                 node(weight_hh, op, loc), node(bias, op, loc)},
                ir::RnnAttrs{reverse}.encode(), loc);
}

Tensor lstm_layer_backward(const Tensor& x, const Tensor& h0, const Tensor& c0,
                           const Tensor& weight_ih, const Tensor& weight_hh, const Tensor& bias,
                           const Tensor& out, const Tensor& grad_out, bool reverse, Loc loc) {
  const char* op = "lstm_backward";
  return record(
      Op::LstmBackward,
      {node(x, op, loc), node(h0, op, loc), node(c0, op, loc), node(weight_ih, op, loc),
       node(weight_hh, op, loc), node(bias, op, loc), node(out, op, loc), node(grad_out, op, loc)},
      ir::RnnAttrs{reverse}.encode(), loc);
}

Tensor gru_layer(const Tensor& x, const Tensor& h0, const Tensor& weight_ih,
                 const Tensor& weight_hh, const Tensor& bias, bool reverse, Loc loc) {
  const char* op = "gru";
  return record(Op::Gru,
                {node(x, op, loc), node(h0, op, loc), node(weight_ih, op, loc),
                 node(weight_hh, op, loc), node(bias, op, loc)},
                ir::RnnAttrs{reverse}.encode(), loc);
}

Tensor gru_layer_backward(const Tensor& x, const Tensor& h0, const Tensor& weight_ih,
                          const Tensor& weight_hh, const Tensor& bias, const Tensor& out,
                          const Tensor& grad_out, bool reverse, Loc loc) {
  const char* op = "gru_backward";
  return record(
      Op::GruBackward,
      {node(x, op, loc), node(h0, op, loc), node(weight_ih, op, loc), node(weight_hh, op, loc),
       node(bias, op, loc), node(out, op, loc), node(grad_out, op, loc)},
      ir::RnnAttrs{reverse}.encode(), loc);
}

Tensor max_pool2d(const Tensor& x, const Pool2dOptions& options, Loc loc) {
  return record(Op::MaxPool2d, {node(x, "max_pool2d", loc)}, frontend::pool_attrs(options).encode(),
                loc);
}

std::pair<Tensor, Tensor> max_pool2d_with_indices(const Tensor& x, const Pool2dOptions& options,
                                                  Loc loc) {
  const NodePtr& n = node(x, "max_pool2d", loc);
  return {record(Op::MaxPool2d, {n}, frontend::pool_attrs(options).encode(), loc),
          record(Op::MaxPool2dIndices, {n}, frontend::pool_attrs(options).encode(), loc)};
}

Tensor max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Shape& input_shape,
                           const Pool2dOptions& options, Loc loc) {
  const char* op = "max_pool2d_backward";
  return record(Op::MaxPool2dBackward, {node(grad_out, op, loc), node(indices, op, loc)},
                frontend::pool_attrs(options).encode(), loc, input_shape);
}

Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& options, Loc loc) {
  return record(Op::AvgPool2d, {node(x, "avg_pool2d", loc)}, frontend::pool_attrs(options).encode(),
                loc);
}

Tensor avg_pool2d_backward(const Tensor& grad_out, const Shape& input_shape,
                           const Pool2dOptions& options, Loc loc) {
  return record(Op::AvgPool2dBackward, {node(grad_out, "avg_pool2d_backward", loc)},
                frontend::pool_attrs(options).encode(), loc, input_shape);
}

}  // namespace lockstep
