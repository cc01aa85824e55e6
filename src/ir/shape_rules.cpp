// Shape and dtype rules of every primitive op: the checks that make a bad op fail at the user's
// line. One rule for every elementwise op (from the table's columns), one case per other op; no
// default, so a new op of another kind in ops.def must be handled here.
#include <algorithm>
#include <array>
#include <string>

#include "ir/attrs.h"
#include "ir/elementwise.h"
#include "ir/ir.h"
#include "util/check.h"

namespace lockstep::ir {

namespace {

using util::cat;

struct Checker {
  Op op;
  const std::vector<NodePtr>& in;
  const Loc& loc;

  [[noreturn]] void fail(const std::string& what, const std::string& fix) const {
    util::fail(loc, user_name(op), what, fix);
  }
  std::string shapes() const {
    std::string s;
    for (size_t i = 0; i < in.size(); ++i) {
      if (i) s += " and ";
      s += cat(dtype_name(in[i]->dtype), shape_str(in[i]->shape));
    }
    return s;
  }
  void floating(int i) const {
    if (!is_floating(in[i]->dtype))
      fail(cat("needs a floating-point tensor, got ", dtype_name(in[i]->dtype),
               shape_str(in[i]->shape)),
           "Cast it first, e.g. ls::cast(x, ls::f32)");
  }
  void numeric(int i) const {
    if (in[i]->dtype == DType::Bool)
      fail(cat("is not defined for bool tensors, got ", dtype_name(in[i]->dtype),
               shape_str(in[i]->shape)),
           "Cast to a numeric dtype first, e.g. ls::cast(x, ls::f32)");
  }
  void same_dtype() const {
    for (size_t i = 1; i < in.size(); ++i)
      if (in[i]->dtype != in[0]->dtype)
        fail(cat("dtype mismatch: ", shapes()),
             "Cast one operand so both have the same dtype, e.g. ls::cast(b, a.dtype())");
  }
  void same_shape() const {
    for (size_t i = 1; i < in.size(); ++i)
      if (in[i]->shape != in[0]->shape)
        fail(cat("operand shapes differ: ", shapes()),
             "Broadcast them to one shape with ls::expand");
  }
  void rank(int i, size_t r) const {
    if (in[i]->shape.size() != r)
      fail(cat("operand ", i, " must have rank ", r, ", got ", shape_str(in[i]->shape)),
           r == 4 ? "Use the NCHW layout [batch, channels, height, width]" : "Reshape it");
  }
  void attrs_size(const std::vector<int64_t>& attrs, size_t n) const {
    if (attrs.size() != n)
      util::internal_fail(__FILE__, __LINE__, cat(op_info(op).name, " expects ", n, " attrs"));
  }
};

// A recurrent layer's operands, checked: Lstm's x [T, N, I], h0 [N, H], c0 [N, H], w_ih [4H, I],
// w_hh [4H, H], b [4H]; Gru's x, h0, w_ih [3H, I], w_hh [3H, H], b [4H]; all f32 or all f64.
// Returns {T, N, I, H}.
std::array<int64_t, 4> rnn_sizes(const Checker& c, bool lstm) {
  const size_t count = lstm ? 6 : 5;
  const DType d = c.in[0]->dtype;
  for (size_t k = 0; k < count; ++k)
    if ((d != DType::F32 && d != DType::F64) || c.in[k]->dtype != d)
      c.fail(cat("takes f32 or f64 operands of one dtype, got ", c.shapes()),
             cat("Use nn::", lstm ? "LSTM" : "GRU",
                 ", which records it for f32 and the unrolled cell otherwise"));
  const Shape &x = c.in[0]->shape, &h0 = c.in[1]->shape, &w_ih = c.in[lstm ? 3 : 2]->shape;
  if (x.size() != 3 || x[0] < 1 || h0.size() != 2)
    c.fail(cat("needs x [T >= 1, N, I] and h0 [N, H], got ", c.shapes()),
           "Pass one layer's sequence (time first) and its initial state");
  const int64_t t = x[0], n = x[1], i = x[2], h = h0[1], g = lstm ? 4 : 3;
  std::vector<Shape> want = {x, {n, h}, {g * h, i}, {g * h, h}, {4 * h}};
  if (lstm) want.insert(want.begin() + 2, Shape{n, h});
  for (size_t k = 1; k < count; ++k)
    if (c.in[k]->shape != want[k])
      c.fail(
          cat("operand ", k, " is ", shape_str(c.in[k]->shape), ", expected ", shape_str(want[k]),
              " (x ", shape_str(x), ", hidden size ", h, ", weight_ih ", shape_str(w_ih), ")"),
          lstm ? "Pass x, h0, c0, weight_ih, weight_hh and the summed biases of one LSTM layer"
               : "Pass x, h0, weight_ih, weight_hh and the biases of one GRU layer");
  return {t, n, i, h};
}

// The shape of a recurrent layer's value ([T + 2, N, H] for an LSTM: its last c too; [T + 1, N, H]
// for a GRU) or, with `gradient`, of its gradient op's result, whose last two operands are that
// value and its gradient.
Shape rnn_shape(const Checker& c, bool lstm, bool gradient) {
  const auto [t, n, i, h] = rnn_sizes(c, lstm);
  const Shape value{t + (lstm ? 2 : 1), n, h};
  if (!gradient) return value;
  for (size_t k = lstm ? 6 : 5; k < c.in.size(); ++k)
    if (c.in[k]->dtype != c.in[0]->dtype || c.in[k]->shape != value)
      c.fail(cat("operand ", k, " is ", dtype_name(c.in[k]->dtype), shape_str(c.in[k]->shape),
                 ", expected ", dtype_name(c.in[0]->dtype), shape_str(value)),
             cat("Pass the ", lstm ? "lstm" : "gru", "'s value and its gradient"));
  return {rnn_grad_offsets(lstm, t, n, i, h).back()};
}

// Output size of a convolution along one axis; <= 0 when the dilated kernel does not fit in the
// padded input (the numerator is negative then: division truncating toward zero must not round
// it up to an output of size 1).
int64_t conv_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
  const int64_t span = in + 2 * p - d * (k - 1) - 1;
  return span < 0 ? 0 : span / s + 1;
}

// Output shape of conv2d(x_shape, w_shape) or throws.
Shape conv_forward_shape(const Checker& c, const Shape& x, const Shape& w,
                         const std::vector<int64_t>& attrs) {
  c.attrs_size(attrs, 7);
  const ConvAttrs a = ConvAttrs::of(attrs);
  for (int d = 0; d < 2; ++d)
    if (a.stride[d] <= 0 || a.padding[d] < 0 || a.dilation[d] <= 0)
      c.fail(cat("bad stride/padding/dilation {", a.stride[0], ",", a.stride[1], "}/{",
                 a.padding[0], ",", a.padding[1], "}/{", a.dilation[0], ",", a.dilation[1], "}"),
             "Strides and dilations must be >= 1 and padding >= 0");
  const int64_t g = a.groups;
  if (x.size() != 4 || w.size() != 4)
    c.fail(cat("input ", shape_str(x), " and weight ", shape_str(w), " must both have rank 4"),
           "Use input [N, C, H, W] and weight [out_channels, C / groups, kh, kw]");
  if (g <= 0 || x[1] % g != 0 || w[0] % g != 0)
    c.fail(cat("groups=", g, " must be >= 1 and divide both input channels ", x[1],
               " and output channels ", w[0]),
           "Choose groups dividing both channel counts");
  if (w[1] * g != x[1])
    c.fail(cat("input ", shape_str(x), " has ", x[1], " channels but weight ", shape_str(w),
               " expects ", w[1] * g, " (weight dim 1 x groups ", g, ")"),
           "Make weight.size(1) == input channels / groups");
  const int64_t ho = conv_out(x[2], w[2], a.stride[0], a.padding[0], a.dilation[0]);
  const int64_t wo = conv_out(x[3], w[3], a.stride[1], a.padding[1], a.dilation[1]);
  if (ho <= 0 || wo <= 0)
    c.fail(cat("input ", shape_str(x), " is too small for kernel ", w[2], "x", w[3],
               " with this padding and dilation (output would be ", ho, "x", wo, ")"),
           "Use a larger input or more padding");
  return {x[0], w[0], ho, wo};
}

Shape pool_forward_shape(const Checker& c, const Shape& x, const std::vector<int64_t>& attrs) {
  c.attrs_size(attrs, 7);
  const PoolAttrs a = PoolAttrs::of(attrs);
  if (x.size() != 4)
    c.fail(cat("input ", shape_str(x), " must have rank 4"), "Use the layout [N, C, H, W]");
  for (int d = 0; d < 2; ++d) {
    if (a.kernel[d] <= 0 || a.stride[d] <= 0 || a.padding[d] < 0)
      c.fail(cat("bad kernel ", a.kernel[0], "x", a.kernel[1], ", stride ", a.stride[0], "x",
                 a.stride[1], ", padding ", a.padding[0], "x", a.padding[1]),
             "Kernel and stride must be >= 1, padding >= 0");
    if (a.padding[d] * 2 > a.kernel[d])
      c.fail(cat("padding ", a.padding[d], " is more than half the kernel size ", a.kernel[d]),
             "Use padding <= kernel / 2 (as PyTorch requires)");
  }
  int64_t out[2];
  for (int d = 0; d < 2; ++d) {
    const int64_t span = x[2 + d] + 2 * a.padding[d];
    out[d] = span < a.kernel[d] ? 0 : (span - a.kernel[d]) / a.stride[d] + 1;
  }
  if (out[0] <= 0 || out[1] <= 0)
    c.fail(
        cat("input ", shape_str(x), " is smaller than the kernel ", a.kernel[0], "x", a.kernel[1]),
        "Use a smaller kernel or a larger input");
  return {x[0], x[1], out[0], out[1]};
}

void check_reduce(const Checker& c, const std::vector<int64_t>& attrs, const Shape& x, Shape* out) {
  if (attrs.empty()) util::internal_fail(__FILE__, __LINE__, "reduce without keepdim attr");
  const bool keepdim = attrs[0] != 0;
  std::vector<bool> reduced(x.size(), false);
  for (size_t i = 1; i < attrs.size(); ++i) {
    const int64_t a = attrs[i];
    if (a < 0 || a >= static_cast<int64_t>(x.size()) || reduced[a])
      util::internal_fail(__FILE__, __LINE__, "reduce axes not normalized");
    reduced[a] = true;
  }
  out->clear();
  for (size_t d = 0; d < x.size(); ++d) {
    if (!reduced[d])
      out->push_back(x[d]);
    else if (keepdim)
      out->push_back(1);
  }
  const bool needs_identity =
      c.op == Op::Max || c.op == Op::Min || c.op == Op::ArgMax || c.op == Op::ArgMin;
  if (needs_identity)
    for (size_t d = 0; d < x.size(); ++d)
      if (reduced[d] && x[d] == 0)
        c.fail(cat("cannot reduce over axis ", d, " of size 0 in ", shape_str(x),
                   ": the result has no value"),
               "Reduce only over non-empty axes");
}

// Every elementwise op: operands of one shape (broadcasting is an explicit Expand) and one dtype
// that the op admits (ops.def's admits column); the result has the operands' dtype, or bool where
// the op's formula is a predicate (ir/elementwise.h). A cast's dtype is its attribute; a select's
// condition is bool.
void elementwise_rule(const Checker& c, Shape* shape, DType* dtype) {
  const std::vector<NodePtr>& in = c.in;
  *shape = in[0]->shape;
  if (c.op == Op::Cast) return;
  if (c.op == Op::Where) {
    if (in[0]->dtype != DType::Bool)
      c.fail(cat("condition must be bool, got ", dtype_name(in[0]->dtype)),
             "Compare to get a bool tensor, e.g. x > 0");
    if (in[1]->dtype != in[2]->dtype)
      c.fail(cat("branches have different dtypes: ", c.shapes()), "Cast one branch");
    c.same_shape();
    *dtype = in[1]->dtype;
    return;
  }
  c.same_dtype();
  switch (op_admits(c.op)) {
    case Admits::Any:
      break;
    case Admits::Numeric:
      c.numeric(0);
      break;
    case Admits::Float:
      c.floating(0);
      break;
  }
  c.same_shape();
  *dtype = elementwise::yields_bool(c.op) ? DType::Bool : in[0]->dtype;
}

}  // namespace

void infer(Op op, const std::vector<NodePtr>& in, const std::vector<int64_t>& attrs, Shape* shape,
           DType* dtype, const Loc& loc) {
  const OpInfo& info = op_info(op);
  if (info.arity >= 0 && static_cast<int>(in.size()) != info.arity)
    util::internal_fail(__FILE__, __LINE__,
                        cat(info.name, " takes ", info.arity, " operands, got ", in.size()));
  Checker c{op, in, loc};
  switch (op) {
    case Op::Data:
      return;
    case Op::Scalar:
      if (!shape->empty()) util::internal_fail(__FILE__, __LINE__, "scalar node with a shape");
      return;
    case Op::Iota:
      c.attrs_size(attrs, 1);
      if (attrs[0] < 0 || attrs[0] >= static_cast<int64_t>(shape->size()))
        util::internal_fail(__FILE__, __LINE__, "iota axis out of range");
      if (*dtype == DType::Bool) c.fail("cannot count in bool", "Use an integer or float dtype");
      return;
    case Op::RandomUniform:
      if (in[0]->dtype != DType::I64 || in[0]->shape != Shape{2})
        c.fail(cat("generator state must be i64[2], got ", c.shapes()),
               "Pass the state of ls::generator_state()");
      if (!is_floating(*dtype))
        c.fail(cat("random values must be floating-point, not ", dtype_name(*dtype)),
               "Use ls::f32 or ls::f64 (ls::randint for integers)");
      return;
#define LS_OP(name, arity, family, admits, props, user) LS_IF_ELEMENTWISE_##family(case Op::name:)
#include "ir/ops.def"
#undef LS_OP
      return elementwise_rule(c, shape, dtype);
    case Op::Sum:
      check_reduce(c, attrs, in[0]->shape, shape);
      *dtype =
          (in[0]->dtype == DType::Bool || in[0]->dtype == DType::I32 || in[0]->dtype == DType::U8)
              ? DType::I64
              : in[0]->dtype;
      return;
    case Op::Max:
    case Op::Min:
      check_reduce(c, attrs, in[0]->shape, shape);
      *dtype = in[0]->dtype;
      return;
    case Op::ArgMax:
    case Op::ArgMin:
      check_reduce(c, attrs, in[0]->shape, shape);
      *dtype = DType::I64;
      return;
    case Op::Reshape:
      if (shape_numel(*shape) != shape_numel(in[0]->shape))
        c.fail(cat("cannot reshape ", shape_str(in[0]->shape), " (", shape_numel(in[0]->shape),
                   " elements) to ", shape_str(*shape), " (", shape_numel(*shape), " elements)"),
               "The new shape must have the same number of elements");
      *dtype = in[0]->dtype;
      return;
    case Op::Permute: {
      const Shape& x = in[0]->shape;
      std::vector<bool> seen(x.size(), false);
      bool ok = attrs.size() == x.size();
      for (size_t i = 0; ok && i < attrs.size(); ++i) {
        ok = attrs[i] >= 0 && attrs[i] < static_cast<int64_t>(x.size()) && !seen[attrs[i]];
        if (ok) seen[attrs[i]] = true;
      }
      if (!ok)
        c.fail(cat("permutation ", shape_str(attrs), " does not reorder the ", x.size(),
                   " axes of ", shape_str(x)),
               "Give each axis 0..rank-1 exactly once");
      shape->clear();
      for (int64_t a : attrs) shape->push_back(x[a]);
      *dtype = in[0]->dtype;
      return;
    }
    case Op::Expand: {
      const Shape& x = in[0]->shape;
      const Shape& out = *shape;
      bool ok = x.size() <= out.size();
      for (size_t i = 0; ok && i < x.size(); ++i) {
        const int64_t xd = x[x.size() - 1 - i], od = out[out.size() - 1 - i];
        ok = xd == od || xd == 1;
      }
      for (int64_t d : out) ok = ok && d >= 0;
      if (!ok)
        c.fail(cat("cannot expand ", shape_str(x), " to ", shape_str(out)),
               "Only size-1 dimensions stretch, and new dimensions go in front");
      *dtype = in[0]->dtype;
      return;
    }
    case Op::Slice: {
      c.attrs_size(attrs, 4);
      const Shape& x = in[0]->shape;
      const SliceAttrs slice = SliceAttrs::of(attrs);
      const int64_t axis = slice.axis, start = slice.start, end = slice.end, step = slice.step;
      if (axis < 0 || axis >= static_cast<int64_t>(x.size()) || step <= 0 || start < 0 ||
          end > x[axis] || start > x[axis] || end < 0)
        util::internal_fail(__FILE__, __LINE__, "slice attrs not normalized");
      *shape = x;
      (*shape)[axis] = end > start ? (end - start - 1) / step + 1 : 0;  // no overflow for any step
      *dtype = in[0]->dtype;
      return;
    }
    case Op::Concat: {
      c.attrs_size(attrs, 1);
      if (in.empty()) c.fail("needs at least one tensor", "Pass a non-empty list");
      c.same_dtype();
      const Shape& first = in[0]->shape;
      const int64_t axis = attrs[0];
      if (axis < 0 || axis >= static_cast<int64_t>(first.size()))
        util::internal_fail(__FILE__, __LINE__, "concat axis not normalized");
      *shape = first;
      (*shape)[axis] = 0;
      for (const NodePtr& n : in) {
        bool ok = n->shape.size() == first.size();
        for (size_t d = 0; ok && d < first.size(); ++d)
          ok = static_cast<int64_t>(d) == axis || n->shape[d] == first[d];
        if (!ok)
          c.fail(cat("shapes ", c.shapes(), " differ outside axis ", axis),
                 "All tensors must have the same shape except along the concat axis");
        (*shape)[axis] += n->shape[axis];
      }
      *dtype = in[0]->dtype;
      return;
    }
    case Op::Pad: {
      const Shape& x = in[0]->shape;
      if (attrs.size() != 2 * x.size())
        c.fail(cat("needs one (before, after) pair per axis of ", shape_str(x), ", got ",
                   attrs.size() / 2),
               "Give exactly rank pairs");
      if (!in[1]->shape.empty() || in[1]->dtype != in[0]->dtype)
        util::internal_fail(__FILE__, __LINE__, "pad value must be a 0-d tensor of x's dtype");
      *shape = x;
      for (size_t d = 0; d < x.size(); ++d) {
        if (attrs[2 * d] < 0 || attrs[2 * d + 1] < 0)
          c.fail(cat("negative padding ", attrs[2 * d], ", ", attrs[2 * d + 1], " on axis ", d),
                 "Padding must be >= 0; use ls::slice to crop");
        (*shape)[d] += attrs[2 * d] + attrs[2 * d + 1];
      }
      *dtype = in[0]->dtype;
      return;
    }
    case Op::Argsort:
      c.attrs_size(attrs, 2);
      if (in[0]->shape.empty()
              ? attrs[0] != 0
              : attrs[0] < 0 || attrs[0] >= static_cast<int64_t>(in[0]->shape.size()))
        util::internal_fail(__FILE__, __LINE__, "argsort axis not normalized");
      *shape = in[0]->shape;
      *dtype = DType::I64;
      return;
    case Op::Gather:
    case Op::ScatterAdd: {
      c.attrs_size(attrs, 1);
      const Shape& x = in[0]->shape;
      const Shape& idx = in[1]->shape;
      const int64_t axis = attrs[0];
      if (in[1]->dtype != DType::I64)
        c.fail(cat("index must be i64, got ", dtype_name(in[1]->dtype)),
               "Cast it with ls::cast(index, ls::i64)");
      if (idx.size() != x.size())
        c.fail(cat("index ", shape_str(idx), " must have the rank of the input ", shape_str(x)),
               "Unsqueeze or reshape the index");
      if (axis < 0 || axis >= static_cast<int64_t>(x.size()))
        util::internal_fail(__FILE__, __LINE__, "gather axis not normalized");
      for (size_t d = 0; d < x.size(); ++d)
        if (static_cast<int64_t>(d) != axis && idx[d] > x[d])
          c.fail(
              cat("index ", shape_str(idx), " is larger than input ", shape_str(x), " on axis ", d),
              "Outside the gather axis the index may not be larger than the input");
      if (op == Op::Gather) {
        *shape = idx;
      } else {
        if (in[2]->dtype != in[0]->dtype)
          c.fail(cat("src dtype ", dtype_name(in[2]->dtype), " differs from input dtype ",
                     dtype_name(in[0]->dtype)),
                 "Cast src to the input's dtype");
        for (size_t d = 0; d < x.size(); ++d)
          if (in[2]->shape.size() != x.size() || idx[d] > in[2]->shape[d])
            c.fail(cat("index ", shape_str(idx), " is larger than src ", shape_str(in[2]->shape)),
                   "src must have the index's rank and be at least as large on every axis");
        *shape = x;
      }
      *dtype = in[0]->dtype;
      return;
    }
    case Op::AllReduce:
      c.attrs_size(attrs, 6);
      if (attrs[4] < -1) c.fail(cat("root rank ", attrs[4], " is negative"), "Use a rank >= 0");
      if (in[0]->dtype == DType::Bool)
        c.fail("cannot sum bool values over the ranks", "Cast to ls::i32 first");
      *shape = in[0]->shape;
      *dtype = in[0]->dtype;
      return;
    case Op::Broadcast:
      if (attrs.size() != 2) c.attrs_size(attrs, 1);
      if (attrs[0] < 0) c.fail(cat("root rank ", attrs[0], " is negative"), "Use a rank >= 0");
      if (in.empty()) c.fail("nothing to broadcast", "Pass the value (last operand)");
      *shape = in.back()->shape;
      *dtype = in.back()->dtype;
      return;
    case Op::MatMul: {
      c.same_dtype();
      c.numeric(0);
      const Shape& a = in[0]->shape;
      const Shape& b = in[1]->shape;
      if (a.size() < 2 || a.size() != b.size())
        c.fail(cat("operands ", c.shapes(), " must have the same rank >= 2"),
               "Use ls::matmul, which handles 1-d and mixed-rank operands");
      const size_t r = a.size();
      if (a[r - 1] != b[r - 2])
        c.fail(cat("inner dimensions differ: ", shape_str(a), " x ", shape_str(b), " (", a[r - 1],
                   " vs ", b[r - 2], ")"),
               "The last dim of the left operand must equal the second-to-last of the right; "
               "transpose one operand?");
      shape->assign(r, 0);
      for (size_t d = 0; d + 2 < r; ++d) {
        if (a[d] != b[d] && a[d] != 1 && b[d] != 1)
          c.fail(cat("batch dimensions of ", shape_str(a), " and ", shape_str(b),
                     " do not broadcast (axis ", d, ")"),
                 "Make batch dimensions equal or 1");
        (*shape)[d] = a[d] == 1 ? b[d] : a[d];
      }
      (*shape)[r - 2] = a[r - 2];
      (*shape)[r - 1] = b[r - 1];
      *dtype = in[0]->dtype;
      return;
    }
    case Op::Lstm:
    case Op::LstmBackward:
    case Op::Gru:
    case Op::GruBackward: {
      c.attrs_size(attrs, 1);
      *shape = rnn_shape(c, op == Op::Lstm || op == Op::LstmBackward,
                         op == Op::LstmBackward || op == Op::GruBackward);
      *dtype = in[0]->dtype;
      return;
    }
    case Op::Conv2d:
      c.same_dtype();
      c.floating(0);
      *shape = conv_forward_shape(c, in[0]->shape, in[1]->shape, attrs);
      *dtype = in[0]->dtype;
      return;
    case Op::Conv2dBackwardInput: {
      c.same_dtype();
      c.floating(0);
      const Shape fwd = conv_forward_shape(c, *shape, in[1]->shape, attrs);
      if (fwd != in[0]->shape)
        c.fail(
            cat("output gradient ", shape_str(in[0]->shape), " does not match the forward output ",
                shape_str(fwd), " of input ", shape_str(*shape)),
            "Pass the gradient of conv2d's output and the original input shape");
      *dtype = in[0]->dtype;
      return;
    }
    case Op::Conv2dBackwardWeight: {
      c.same_dtype();
      c.floating(0);
      const Shape fwd = conv_forward_shape(c, in[0]->shape, *shape, attrs);
      if (fwd != in[1]->shape)
        c.fail(
            cat("output gradient ", shape_str(in[1]->shape), " does not match the forward output ",
                shape_str(fwd), " of weight ", shape_str(*shape)),
            "Pass the gradient of conv2d's output and the original weight shape");
      *dtype = in[0]->dtype;
      return;
    }
    case Op::MaxPool2d:
      c.numeric(0);
      *shape = pool_forward_shape(c, in[0]->shape, attrs);
      *dtype = in[0]->dtype;
      return;
    case Op::MaxPool2dIndices:
      c.numeric(0);
      *shape = pool_forward_shape(c, in[0]->shape, attrs);
      *dtype = DType::I64;
      return;
    case Op::AvgPool2d:
      c.floating(0);
      *shape = pool_forward_shape(c, in[0]->shape, attrs);
      *dtype = in[0]->dtype;
      return;
    case Op::MaxPool2dBackward:
    case Op::AvgPool2dBackward: {
      c.numeric(0);
      if (op == Op::AvgPool2dBackward) c.floating(0);
      const Shape fwd = pool_forward_shape(c, *shape, attrs);
      if (fwd != in[0]->shape)
        c.fail(
            cat("output gradient ", shape_str(in[0]->shape), " does not match the forward output ",
                shape_str(fwd), " of input ", shape_str(*shape)),
            "Pass the gradient of the pooling output and the original input shape");
      if (op == Op::MaxPool2dBackward && (in[1]->dtype != DType::I64 || in[1]->shape != fwd))
        c.fail(cat("indices ", dtype_name(in[1]->dtype), shape_str(in[1]->shape),
                   " must be i64 with the output's shape ", shape_str(fwd)),
               "Pass the indices from ls::max_pool2d_with_indices");
      *dtype = in[0]->dtype;
      return;
    }
  }
  util::internal_fail(__FILE__, __LINE__, "unknown op");
}

}  // namespace lockstep::ir
