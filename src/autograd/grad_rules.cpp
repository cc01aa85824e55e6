// The gradient rule of every primitive op (ops.def), side by side in one switch with no default:
// a new op must say here how it differentiates. Rules are written with recorded ops.
#include "autograd/grad_rules.h"

#include <cmath>
#include <numbers>
#include <numeric>

#include "lockstep/dist.h"
#include "lockstep/ops.h"
#include "runtime/lazy.h"
#include "tensor/frontend.h"
#include "util/check.h"

namespace lockstep::autograd {
namespace {

using ir::Op;

Tensor wrap(const ir::NodePtr& n) { return runtime::new_tensor(n); }

Conv2dOptions conv_options(const std::vector<int64_t>& a) {
  return frontend::conv_options(ir::ConvAttrs::of(a));
}
Pool2dOptions pool_options(const std::vector<int64_t>& a) {
  return frontend::pool_options(ir::PoolAttrs::of(a));
}

// The reduced axes of a reduction node, and its result reshaped to keepdim form.
std::vector<int64_t> reduced_axes(const ir::Node& n) {
  return std::vector<int64_t>(n.attrs.begin() + 1, n.attrs.end());
}

Tensor keepdim_form(const Tensor& t, const ir::Node& n, const Loc& loc) {
  Shape s = n.operands[0]->shape;
  for (size_t i = 1; i < n.attrs.size(); ++i) s[n.attrs[i]] = 1;
  return reshape(t, s, loc);
}

// Gradient of max(a, b) for a (PyTorch's split: half to each on ties).
Tensor extremum_grad(const Tensor& g, const Tensor& a, const Tensor& b, bool is_max,
                     const Loc& loc) {
  Tensor wins = is_max ? gt(a, b, loc) : lt(a, b, loc);
  Tensor tie = eq(a, b, loc);
  return where(wins, g, where(tie, div(g, 2.0, loc), 0.0, loc), loc);
}

}  // namespace

Tensor sum_to_shape(const Tensor& g, const Shape& shape, const Loc& loc) {
  const Shape& gs = g.shape();
  if (gs == shape) return g;
  const size_t lead = gs.size() - shape.size();
  std::vector<int64_t> axes;
  for (size_t d = 0; d < gs.size(); ++d)
    if (d < lead || (shape[d - lead] == 1 && gs[d] != 1)) axes.push_back(static_cast<int64_t>(d));
  Tensor s = axes.empty() ? g : sum(g, axes, true, loc);
  return reshape(s, shape, loc);
}

std::vector<Tensor> operand_grads(const ir::NodePtr& np, const Tensor& g) {
  const ir::Node& n = *np;
  const Loc& loc = n.origin.loc;
  auto in = [&](size_t i) { return wrap(n.operands[i]); };
  auto y = [&] { return wrap(np); };
  switch (n.op) {
    case Op::Data:
    case Op::Scalar:
    case Op::Iota:
    case Op::RandomUniform:
    case Op::Broadcast:
    case Op::LogicalNot:
    case Op::IsFinite:
    case Op::Check:
    case Op::Eq:
    case Op::Ne:
    case Op::Lt:
    case Op::Le:
    case Op::Gt:
    case Op::Ge:
    case Op::LogicalAnd:
    case Op::LogicalOr:
    case Op::ArgMax:
    case Op::ArgMin:
    case Op::MaxPool2dIndices:
    case Op::Argsort:
    case Op::LstmBackward:
    case Op::GruBackward:
      return {};
    case Op::Neg:
      return {neg(g, loc)};
    case Op::Abs:
      return {mul(g, sign(in(0), loc), loc)};
    case Op::Exp:
      return {mul(g, y(), loc)};
    case Op::Log:
      return {div(g, in(0), loc)};
    case Op::Sqrt:
      return {div(mul(g, 0.5, loc), y(), loc)};
    case Op::Rsqrt: {
      Tensor r = y();
      return {mul(g, mul(mul(mul(r, r, loc), r, loc), -0.5, loc), loc)};
    }
    case Op::Tanh: {
      Tensor t = y();
      return {mul(g, sub(1.0, mul(t, t, loc), loc), loc)};
    }
    case Op::Sigmoid: {
      Tensor s = y();
      return {mul(g, mul(s, sub(1.0, s, loc), loc), loc)};
    }
    case Op::Relu:  // the mask from the output: what the next layer keeps anyway
      return {where(gt(y(), 0.0, loc), g, 0.0, loc)};
    case Op::Sin:
      return {mul(g, cos(in(0), loc), loc)};
    case Op::Cos:
      return {neg(mul(g, sin(in(0), loc), loc), loc)};
    case Op::Erf: {  // 2/sqrt(pi) exp(-x^2), from the input: cheap to recompute, nothing stored
      const Tensor& x = in(0);
      return {mul(
          g, mul(exp(neg(mul(x, x, loc), loc), loc), 2.0 / std::sqrt(std::numbers::pi), loc), loc)};
    }
    case Op::Gelu:  // from the input: nothing stored but x
      return {mul(
          g, frontend::record(Op::GeluDerivative, {frontend::node(in(0), "gelu", loc)}, {}, loc),
          loc)};
    case Op::GeluDerivative: {  // phi(x) (2 - x^2)
      const Tensor& x = in(0);
      const Tensor x2 = mul(x, x, loc);
      const Tensor phi =
          mul(exp(mul(x2, -0.5, loc), loc), 1.0 / std::sqrt(2 * std::numbers::pi), loc);
      return {mul(g, mul(phi, sub(2.0, x2, loc), loc), loc)};
    }
    case Op::Floor:
    case Op::Ceil:
    case Op::Sign:
      return {zeros_like(g, loc)};
    case Op::Cast:
      if (!is_floating(n.operands[0]->dtype)) return {Tensor()};
      return {cast(g, n.operands[0]->dtype, loc)};
    case Op::Add:
      return {g, g};
    case Op::Sub:
      return {g, neg(g, loc)};
    case Op::Mul:
      return {mul(g, in(1), loc), mul(g, in(0), loc)};
    case Op::Div: {
      Tensor b = in(1);
      return {div(g, b, loc), neg(div(mul(g, y(), loc), b, loc), loc)};
    }
    case Op::Fmod: {
      // fmod(a, b) = a - trunc(a / b) * b: d/da = 1, d/db = -trunc(a / b) (PyTorch's).
      const Tensor q = div(in(0), in(1), loc);
      const Tensor trunc = where(lt(q, 0.0, loc), ceil(q, loc), floor(q, loc), loc);
      return {g, neg(mul(g, trunc, loc), loc)};
    }
    case Op::Pow: {
      Tensor a = in(0), b = in(1);
      Tensor da = mul(g, mul(b, pow(a, sub(b, 1.0, loc), loc), loc), loc);
      // d/db a^b = a^b log a, taken as 0 where a == 0 (PyTorch's convention).
      Tensor db = where(eq(a, 0.0, loc), 0.0, mul(g, mul(y(), log(a, loc), loc), loc), loc);
      return {da, db};
    }
    case Op::Maximum:
    case Op::Minimum: {
      const bool is_max = n.op == Op::Maximum;
      Tensor a = in(0), b = in(1);
      return {extremum_grad(g, a, b, is_max, loc), extremum_grad(g, b, a, is_max, loc)};
    }
    case Op::Where: {
      Tensor c = in(0);
      return {Tensor(), where(c, g, 0.0, loc), where(c, 0.0, g, loc)};
    }
    case Op::Sum:
      return {expand(keepdim_form(g, n, loc), n.operands[0]->shape, loc)};
    case Op::Max:
    case Op::Min: {
      // Shared equally among the elements that reach the extreme (as PyTorch's amax/amin).
      Tensor x = in(0);
      Tensor yk = expand(keepdim_form(y(), n, loc), x.shape(), loc);
      Tensor hit = cast(eq(x, yk, loc), x.dtype(), loc);
      Tensor count = sum(hit, reduced_axes(n), true, loc);
      Tensor share = div(keepdim_form(g, n, loc), count, loc);
      return {mul(hit, expand(share, x.shape(), loc), loc)};
    }
    case Op::Reshape:
      return {reshape(g, n.operands[0]->shape, loc)};
    case Op::Permute: {
      std::vector<int64_t> inverse(n.attrs.size());
      for (size_t i = 0; i < n.attrs.size(); ++i) inverse[n.attrs[i]] = static_cast<int64_t>(i);
      return {permute(g, inverse, loc)};
    }
    case Op::Expand:
      return {sum_to_shape(g, n.operands[0]->shape, loc)};
    case Op::Slice: {
      const Shape& xs = n.operands[0]->shape;
      const ir::SliceAttrs attrs = ir::SliceAttrs::of(n.attrs);
      const int64_t axis = attrs.axis, start = attrs.start, step = attrs.step;
      const int64_t size = xs[axis], count = n.shape[axis];
      Tensor spread = g;
      int64_t kept = count;
      if (step > 1) {
        // Interleave step-1 zeros after each element: [.., count, ..] -> [.., count*step, ..].
        Tensor u = unsqueeze(g, axis + 1, loc);
        std::vector<std::pair<int64_t, int64_t>> pads(u.dim(), {0, 0});
        pads[axis + 1] = {0, step - 1};
        Shape merged = xs;
        merged[axis] = count * step;
        spread = reshape(pad(u, pads, 0, loc), merged, loc);
        kept = std::min(count * step, size - start);
        spread = slice(spread, axis, 0, kept, 1, loc);
      }
      std::vector<std::pair<int64_t, int64_t>> pads(xs.size(), {0, 0});
      pads[axis] = {start, size - start - kept};
      return {pad(spread, pads, 0, loc)};
    }
    case Op::Concat: {
      std::vector<Tensor> out;
      int64_t at = 0;
      const int64_t axis = n.attrs[0];
      for (const ir::NodePtr& o : n.operands) {
        out.push_back(slice(g, axis, at, at + o->shape[axis], 1, loc));
        at += o->shape[axis];
      }
      return out;
    }
    case Op::Pad: {
      Tensor out = g;
      const Shape& xs = n.operands[0]->shape;
      for (size_t d = 0; d < xs.size(); ++d)
        if (n.attrs[2 * d] || n.attrs[2 * d + 1])
          out = slice(out, static_cast<int64_t>(d), n.attrs[2 * d], n.attrs[2 * d] + xs[d], 1, loc);
      return {out, Tensor()};
    }
    case Op::Gather: {
      Tensor x = in(0), index = in(1);
      return {scatter_add(zeros_like(x, loc), n.attrs[0], index, g, loc), Tensor()};
    }
    case Op::ScatterAdd: {
      Tensor index = in(1);
      const Shape& ss = n.operands[2]->shape;
      Tensor gs = gather(g, n.attrs[0], index, loc);
      std::vector<std::pair<int64_t, int64_t>> pads;
      bool padded = false;
      for (size_t d = 0; d < ss.size(); ++d) {
        pads.push_back({0, ss[d] - gs.shape()[d]});
        padded = padded || pads.back().second != 0;
      }
      return {g, Tensor(), padded ? pad(gs, pads, 0, loc) : gs};
    }
    case Op::MatMul: {
      Tensor a = in(0), b = in(1);
      const int64_t r = a.dim();
      Tensor ga = matmul(g, transpose(b, r - 2, r - 1, loc), loc);
      // One right-hand matrix for a whole batch (a linear layer on [B, T, D]): its gradient is
      // one product over the rows of every batch, [K, P M] x [P M, N], rather than P products
      // summed afterwards (PyTorch's linear computes it so too).
      bool shared_b = r >= 3;
      for (int64_t d = 0; d + 2 < r && shared_b; ++d)
        shared_b = b.shape()[d] == 1 && a.shape()[d] == g.shape()[d];
      if (shared_b) {
        const int64_t k = a.shape()[r - 1], cols = g.shape()[r - 1];
        int64_t rows = 1;
        for (int64_t d = 0; d + 1 < r; ++d) rows *= a.shape()[d];
        const Tensor a2 = reshape(a, {rows, k}, loc), g2 = reshape(g, {rows, cols}, loc);
        const Tensor gb = reshape(matmul(transpose(a2, 0, 1, loc), g2, loc), b.shape(), loc);
        return {sum_to_shape(ga, a.shape(), loc), gb};
      }
      Tensor gb = matmul(transpose(a, r - 2, r - 1, loc), g, loc);
      return {sum_to_shape(ga, a.shape(), loc), sum_to_shape(gb, b.shape(), loc)};
    }
    case Op::Conv2d: {
      const Conv2dOptions o = conv_options(n.attrs);
      Tensor x = in(0), w = in(1);
      return {conv2d_backward_input(g, w, x.shape(), o, loc),
              conv2d_backward_weight(x, g, w.shape(), o, loc)};
    }
    case Op::Conv2dBackwardInput: {
      // value = conv_bwd_input(gy, w): linear in gy (adjoint: conv2d) and in w.
      const Conv2dOptions o = conv_options(n.attrs);
      Tensor gy = in(0), w = in(1);
      return {conv2d(g, w, o, loc), conv2d_backward_weight(g, gy, w.shape(), o, loc)};
    }
    case Op::Conv2dBackwardWeight: {
      const Conv2dOptions o = conv_options(n.attrs);
      Tensor x = in(0), gy = in(1);
      return {conv2d_backward_input(gy, g, x.shape(), o, loc), conv2d(x, g, o, loc)};
    }
    case Op::MaxPool2d: {
      const Pool2dOptions o = pool_options(n.attrs);
      Tensor x = in(0);
      Tensor idx = runtime::new_tensor(
          ir::make_node(Op::MaxPool2dIndices, {n.operands[0]}, n.attrs, {}, DType::I64, loc));
      return {max_pool2d_backward(g, idx, x.shape(), o, loc)};
    }
    case Op::MaxPool2dBackward: {
      // value[plane, idx[o]] += gy[plane, o]: its adjoint gathers g at the indices.
      Tensor idx = in(1);
      const Shape& gys = n.operands[0]->shape;
      const Shape& xs = n.shape;
      Tensor gflat = reshape(g, {xs[0], xs[1], xs[2] * xs[3]}, loc);
      Tensor iflat = reshape(idx, {gys[0], gys[1], gys[2] * gys[3]}, loc);
      return {reshape(gather(gflat, 2, iflat, loc), gys, loc), Tensor()};
    }
    case Op::Lstm:
    case Op::Gru: {
      // The gradient op's result holds each operand's gradient, flattened, one after the other.
      const bool reverse = ir::RnnAttrs::of(n.attrs).reverse;
      const Tensor all =
          n.op == Op::Lstm
              ? lstm_layer_backward(in(0), in(1), in(2), in(3), in(4), in(5), y(), g, reverse, loc)
              : gru_layer_backward(in(0), in(1), in(2), in(3), in(4), y(), g, reverse, loc);
      std::vector<Tensor> grads;
      int64_t at = 0;
      for (const ir::NodePtr& o : n.operands) {
        const int64_t size = shape_numel(o->shape);
        grads.push_back(reshape(slice(all, 0, at, at + size, 1, loc), o->shape, loc));
        at += size;
      }
      return grads;
    }
    case Op::AvgPool2d:
      return {avg_pool2d_backward(g, n.operands[0]->shape, pool_options(n.attrs), loc)};
    case Op::AvgPool2dBackward:
      return {avg_pool2d(g, pool_options(n.attrs), loc)};
    case Op::AllReduce:
      // Each rank's loss reads every rank's x through the sum: the gradient is summed back.
      return {dist::all_reduce(g, ir::AllReduceAttrs::of(n.attrs).scale, loc)};
  }
  util::internal_fail(__FILE__, __LINE__, "no gradient rule");
}

}  // namespace lockstep::autograd
