// Finding fused attentions in the plan's graph (attention.h): the pattern, the views its operands
// are read through, and the pass that hands the two steps' nodes to the lowering.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/attention.h"
#include "backends/cpu/fused.h"
#include "backends/cpu/passes.h"
#include "backends/ref/ref_kernels.h"
#include "ir/attrs.h"
#include "runtime/metrics.h"
#include "util/options.h"

namespace lockstep::backends::cpu {

using ir::Op;

namespace {

// ---- Matching the pattern in the graph ----

// The element offsets of a [G..., rows, cols] view's matrices, and its row stride.
Rows rows_of(const Shape& shape, const std::vector<int64_t>& strides, int64_t offset) {
  const size_t r = shape.size();
  Rows rows;
  rows.ld = strides[r - 2];
  const int64_t g = shape_numel(Shape(shape.begin(), shape.end() - 2));
  rows.base.assign(static_cast<size_t>(g), offset);
  for (int64_t gi = 0; gi < g; ++gi) {
    int64_t rest = gi;
    for (size_t d = r - 2; d-- > 0;) {
      rows.base[static_cast<size_t>(gi)] += rest % shape[d] * strides[d];
      rest /= shape[d];
    }
  }
  return rows;
}

// A value as a strided view of a node's memory.
struct View {
  int32_t base = -1;
  int64_t offset = 0;
  Shape shape;
  std::vector<int64_t> strides;
  bool operator==(const View&) const = default;
  // The view with its last two axes swapped.
  View transposed() const {
    View t = *this;
    const size_t r = shape.size();
    std::swap(t.shape[r - 1], t.shape[r - 2]);
    std::swap(t.strides[r - 1], t.strides[r - 2]);
    return t;
  }
};

// The strides of `to`, a reshape of a view with these shape and strides, or false where the
// reshape does not keep a view (PyTorch's rule for view()).
bool reshaped(const Shape& from, const std::vector<int64_t>& st, const Shape& to,
              std::vector<int64_t>* out) {
  out->assign(to.size(), 0);
  if (shape_numel(from) == 0 || from.empty()) return false;
  int64_t view_d = static_cast<int64_t>(to.size()) - 1;
  int64_t chunk = st.back(), tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(from.size()) - 1; d >= 0; --d) {
    const auto du = static_cast<size_t>(d);
    tensor_numel *= from[du];
    if (d == 0 || (from[du - 1] != 1 && st[du - 1] != tensor_numel * chunk)) {
      while (view_d >= 0 && (view_numel < tensor_numel || to[static_cast<size_t>(view_d)] == 1)) {
        (*out)[static_cast<size_t>(view_d)] = view_numel * chunk;
        view_numel *= to[static_cast<size_t>(view_d)];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (d > 0) chunk = st[du - 1], tensor_numel = 1, view_numel = 1;
    }
  }
  return view_d == -1;
}

class Matcher {
 public:
  explicit Matcher(const plan::Plan& p) : p_(p), g_(p.graph) {}

  const ir::GraphNode& node(int32_t id) const { return g_.nodes[id]; }
  bool f32(int32_t id) const { return node(id).dtype == DType::F32; }

  // The host scalar's number that an Expand of a Scalar reads, else -1.
  int64_t scalar_of(int32_t id) const {
    const ir::GraphNode& n = node(id);
    if (n.op != Op::Expand) return -1;
    const ir::GraphNode& s = node(n.operands[0]);
    return s.op == Op::Scalar && s.dtype == n.dtype ? s.input : -1;
  }
  // A reduction over the last axis with keepdim.
  bool row_reduction(int32_t id, Op op, int32_t of) const {
    const ir::GraphNode& n = node(id);
    const int64_t last = static_cast<int64_t>(node(of).shape.size()) - 1;
    return n.op == op && n.operands[0] == of && n.attrs == std::vector<int64_t>{1, last};
  }
  // The other operand of binary node `id` when one operand is `known`, else -1.
  int32_t other(int32_t id, int32_t known) const {
    const ir::GraphNode& n = node(id);
    if (n.operands.size() != 2) return -1;
    if (n.operands[0] == known) return n.operands[1];
    if (n.operands[1] == known) return n.operands[0];
    return -1;
  }
  // Whether every reader of `id` is in `set`, and it is not an output.
  bool read_only_by(int32_t id, const std::vector<int32_t>& set) const {
    if (p_.is_output[id]) return false;
    for (int32_t c : p_.consumers[id])
      if (std::find(set.begin(), set.end(), c) == set.end()) return false;
    return true;
  }

  // Node `id` as a view of the first node down its permutes, reshapes and slices that is not
  // one (or whose view they do not keep). A view another fusion writes (an attention's output
  // through its permute) is where it stops: what it views is not written.
  View view_of(int32_t id) const {
    const ir::GraphNode& n = node(id);
    const bool view_op = n.op == Op::Permute || n.op == Op::Reshape || n.op == Op::Slice;
    if (view_op && p_.run_time[id] && !p_.merged[id] && n.dtype == node(n.operands[0]).dtype) {
      View u = view_of(n.operands[0]);
      const std::vector<int64_t> in = u.strides;
      bool ok = true;
      if (n.op == Op::Permute) {
        for (size_t i = 0; i < n.attrs.size(); ++i)
          u.strides[i] = in[static_cast<size_t>(n.attrs[i])];
      } else if (n.op == Op::Slice) {
        const ir::SliceAttrs sl = ir::SliceAttrs::of(n.attrs);
        const auto ax = static_cast<size_t>(sl.axis);
        u.offset += sl.start * in[ax];
        u.strides[ax] = in[ax] * sl.step;
      } else {
        ok = reshaped(u.shape, in, n.shape, &u.strides);
      }
      u.shape = n.shape;
      if (ok) return u;
    }
    return View{id, 0, n.shape, ref::strides_of(n.shape)};
  }
  // The operand a matrix view is read as: columns contiguous, else none.
  static bool operand(const View& v, Operand* o) {
    if (v.strides.back() != 1) return false;
    o->node = v.base;
    o->rows = rows_of(v.shape, v.strides, v.offset);
    return true;
  }

  // Whether node `id` has the dtype the attention's products have (bf16 under autocast).
  bool typed(int32_t id, bool bf16) const {
    return node(id).dtype == (bf16 ? DType::BF16 : DType::F32);
  }
  // The f32 operand of a cast of bf16 `id` to f32 (autocast's softmax input), else -1; the same
  // for a cast of f32 to bf16 with `to_bf16`.
  int32_t cast_from(int32_t id, bool to_bf16) const {
    const ir::GraphNode& n = node(id);
    if (n.op != Op::Cast || n.dtype != (to_bf16 ? DType::BF16 : DType::F32)) return -1;
    return node(n.operands[0]).dtype == (to_bf16 ? DType::F32 : DType::BF16) ? n.operands[0] : -1;
  }

  std::shared_ptr<AttentionFusion> forward(int32_t o, std::vector<int32_t>* inner) const;
  bool backward(AttentionFusion& a, const View& q, const View& k, const View& v, int32_t p,
                int32_t scale_node, int32_t x_node, std::vector<int32_t>* inner) const;

 private:
  const plan::Plan& p_;
  const ir::Graph& g_;
};

// The forward pattern ending at product `o` = P V; `inner` gets the nodes it computes. Under
// autocast (bf16 products) the scores are cast to f32 for the softmax and P back to bf16; with
// dropout (f32) the product reads where(keep, P / s, 0), keep a bool value of the scores' shape.
std::shared_ptr<AttentionFusion> Matcher::forward(int32_t o, std::vector<int32_t>* inner) const {
  const ir::GraphNode& on = node(o);
  const bool bf16 = on.dtype == DType::BF16;
  if (on.op != Op::MatMul || !typed(o, bf16) || on.shape.size() < 2) return nullptr;
  const int32_t p_read = on.operands[0], v = on.operands[1];  // what the product reads of P
  int32_t pn = p_read;
  std::vector<int32_t> between;  // the nodes from P to p_read
  int32_t keep = -1;
  int64_t drop_scale = -1, drop_zero = -1;
  if (bf16) {
    pn = cast_from(p_read, true);
    between = {p_read};
  } else if (node(p_read).op == Op::Where) {
    const ir::GraphNode& w = node(p_read);
    const ir::GraphNode& kept = node(w.operands[1]);
    keep = w.operands[0];
    drop_zero = scalar_of(w.operands[2]);
    if (kept.op != Op::Div || drop_zero < 0 || node(keep).dtype != DType::Bool ||
        node(keep).shape != w.shape)
      return nullptr;
    drop_scale = scalar_of(kept.operands[1]);
    if (drop_scale < 0) return nullptr;
    pn = kept.operands[0];
    between = {w.operands[1], p_read};
  }
  if (pn < 0) return nullptr;
  const ir::GraphNode& pd = node(pn);
  if (pd.op != Op::Div || !f32(pn)) return nullptr;
  const int32_t en = pd.operands[0], sum_x = pd.operands[1];
  if (node(sum_x).op != Op::Expand) return nullptr;
  const int32_t sum = node(sum_x).operands[0];
  if (!row_reduction(sum, Op::Sum, en) || node(en).op != Op::Exp) return nullptr;
  const int32_t sub = node(en).operands[0];
  if (node(sub).op != Op::Sub) return nullptr;
  const int32_t x = node(sub).operands[0], max_x = node(sub).operands[1];
  if (node(max_x).op != Op::Expand) return nullptr;
  const int32_t max = node(max_x).operands[0];
  if (!row_reduction(max, Op::Max, x) || !f32(x)) return nullptr;
  int32_t xt = bf16 ? cast_from(x, false) : x;  // the masked scores, bf16 under autocast
  // Under autocast, an f32 mask added to the scores (PyTorch's MultiheadAttention's float mask)
  // promotes them: x = widened scores + mask, in f32.
  int32_t widened = -1, f32_mask = -1;
  if (xt < 0 && node(x).op == Op::Add)
    for (int k = 0; k < 2 && widened < 0; ++k) {
      const int32_t w = node(x).operands[k], m = node(x).operands[1 - k];
      if (cast_from(w, false) >= 0 && f32(m)) widened = w, f32_mask = m, xt = x;
    }
  if (xt < 0) return nullptr;

  auto a = std::make_shared<AttentionFusion>();
  a->bf16 = bf16;
  a->keep = keep, a->drop_scale_input = drop_scale, a->drop_zero_input = drop_zero;
  // The mask.
  int32_t y = xt;
  const ir::GraphNode& xn = node(xt);
  if (widened >= 0) {
    a->mask_kind = MaskKind::Additive, a->mask = f32_mask, a->mask_f32 = true;
    y = cast_from(widened, false);
  } else if (xn.op == Op::Where) {
    const int64_t fill_a = scalar_of(xn.operands[1]), fill_b = scalar_of(xn.operands[2]);
    if (fill_a >= 0) {
      a->mask_kind = MaskKind::FillWhereTrue, a->fill_input = fill_a, y = xn.operands[2];
    } else if (fill_b >= 0) {
      a->mask_kind = MaskKind::KeepWhereTrue, a->fill_input = fill_b, y = xn.operands[1];
    } else {
      return nullptr;
    }
    a->mask = xn.operands[0];
  } else if (xn.op == Op::Add) {
    for (int k = 0; k < 2 && y == xt; ++k) {
      const int32_t m = xn.operands[k], other = xn.operands[1 - k];
      const Op oo = node(other).op;
      if (typed(m, bf16) && (oo == Op::MatMul || oo == Op::Mul || oo == Op::Div))
        a->mask_kind = MaskKind::Additive, a->mask = m, y = other;
    }
    if (y == xt) return nullptr;
  } else {
    // Unmasked, the fused steps skip nothing and do one product more than the primitives (the
    // backward's recomputed scores): measured slower at 256 and 512 keys (causal masks are
    // where they gain). docs/performance.md, "Fused attention".
    return nullptr;
  }
  if (node(a->mask).op == Op::Expand) a->mask = node(a->mask).operands[0];
  // The scale.
  int32_t scores = y;
  const ir::GraphNode& yn = node(y);
  int32_t scale_node = -1;
  if (yn.op == Op::Mul || yn.op == Op::Div) {
    for (int k = yn.op == Op::Div ? 1 : 0; k < 2 && scale_node < 0; ++k)
      if (const int64_t s = scalar_of(yn.operands[k]); s >= 0) {
        scale_node = yn.operands[k];
        a->scale_input = s;
        a->scale_kind = yn.op == Op::Mul ? ScaleKind::Mul : ScaleKind::Div;
        scores = yn.operands[1 - k];
      }
    if (scale_node < 0) return nullptr;
  }
  const ir::GraphNode& sn = node(scores);
  if (sn.op != Op::MatMul || !typed(scores, bf16) || !typed(y, bf16)) return nullptr;
  const int32_t kt = sn.operands[1];
  // Shapes: the same leading axes everywhere, no broadcast in the batch.
  const Shape& xs = xn.shape;
  const size_t r = xs.size();
  const Shape lead(xs.begin(), xs.end() - 2);
  for (int32_t t : {sn.operands[0], kt, v}) {
    const Shape& ts = node(t).shape;
    if (!typed(t, bf16) || ts.size() != r || !std::equal(lead.begin(), lead.end(), ts.begin()))
      return nullptr;
  }
  const View qv = view_of(sn.operands[0]), kv = view_of(kt).transposed(), vv = view_of(v);
  if (!operand(qv, &a->q) || !operand(kv, &a->k) || !operand(vv, &a->v)) return nullptr;
  a->g = shape_numel(lead);
  a->l = xs[r - 2], a->s = xs[r - 1], a->e = node(sn.operands[0]).shape[r - 1];
  a->ev = node(v).shape[r - 1];
  if (a->g * a->l * a->s == 0 || a->e == 0 || a->ev == 0) return nullptr;
  // The mask's strides against the scores' shape, right-aligned, 0 where it broadcasts.
  const ir::GraphNode& m = node(a->mask);
  if (m.shape.size() > r || (m.dtype == DType::Bool) != (a->mask_kind != MaskKind::Additive))
    return nullptr;
  std::vector<int64_t> st(r, 0);
  int64_t stride = 1;
  for (size_t d = 0; d < m.shape.size(); ++d) {
    const size_t md = m.shape.size() - 1 - d, xd = r - 1 - d;
    if (m.shape[md] != 1 && m.shape[md] != xs[xd]) return nullptr;
    st[xd] = m.shape[md] == 1 ? 0 : stride;
    stride *= m.shape[md];
  }
  a->mask_ls = st[r - 2], a->mask_ss = st[r - 1];
  a->mask_base = rows_of(xs, st, 0).base;
  a->max = max, a->sum = sum, a->out = o;
  *inner = {scores, max, max_x, sub, en, sum, sum_x, pn};
  if (y != scores) inner->push_back(y);
  if (widened >= 0) inner->push_back(widened);
  if (xt != y) inner->push_back(xt);
  if (x != xt) inner->push_back(x);
  for (int32_t b : between) inner->push_back(b);
  // The backward, if P is read by more than the product.
  bool forward_only = p_.consumers[p_read].size() == 1;
  for (int32_t b : {pn, between.size() == 2 ? between[0] : pn})
    forward_only = forward_only && (p_read == pn || p_.consumers[b].size() == 1);
  if (forward_only) return a;
  if (!backward(*a, qv, kv, vv, pn, scale_node, xt, inner)) return nullptr;
  return a;
}

// The backward of the forward `a`: P's gradient terms as autograd writes them (dV = P^T dO,
// dP = dO V^T, softmax's dS = P (dP - sum(dP P)), the mask's where, the scale, dQ = dS K,
// dK^T = Q^T dS).
bool Matcher::backward(AttentionFusion& a, const View& q, const View& k, const View& v, int32_t p,
                       int32_t scale_node, int32_t x, std::vector<int32_t>* inner) const {
  // P's readers: the product (under autocast its bf16 cast, with dropout the where, which the
  // product and P^T read), P^T, and the softmax gradient's two products.
  const bool bf16 = a.bf16;
  const int32_t p_read = node(a.out).operands[0];
  const int32_t kept = a.keep >= 0 ? node(p_read).operands[1] : -1;  // dropout's P / s
  std::vector<int32_t> mine;
  // dP as the softmax gradient reads it, back to the product dO V^T: under autocast its cast to
  // f32; with dropout where(keep, dO V^T, 0) / s.
  auto product_of = [&](int32_t dp) -> int32_t {
    if (dp < 0) return -1;
    if (bf16) return cast_from(dp, false);
    if (a.keep < 0) return dp;
    const ir::GraphNode& d = node(dp);
    if (d.op != Op::Div || scalar_of(d.operands[1]) != a.drop_scale_input) return -1;
    const ir::GraphNode& w = node(d.operands[0]);
    if (w.op != Op::Where || w.operands[0] != a.keep) return -1;
    a.drop_zero2_input = scalar_of(w.operands[2]);
    return a.drop_zero2_input < 0 ? -1 : w.operands[1];
  };
  int32_t pt = -1, dot = -1, prod = -1;
  std::vector<int32_t> readers = p_.consumers[p];
  if (p_read != p)
    readers.insert(readers.end(), p_.consumers[p_read].begin(), p_.consumers[p_read].end());
  for (int32_t c : readers) {
    const ir::GraphNode& cn = node(c);
    if (c == a.out || c == p_read || c == kept) continue;
    if (swaps_last_two(cn) && cn.operands[0] == p_read && pt < 0) {
      pt = c;
    } else if (cn.op == Op::Mul &&
               (p_read == p || (cn.operands[0] != p_read && cn.operands[1] != p_read))) {
      const int32_t o = other(c, p);
      const int32_t o_product = product_of(o);
      if (o_product >= 0 && node(o_product).op == Op::MatMul && dot < 0) {
        dot = c;
      } else if (o >= 0 && node(o).op == Op::Sub && prod < 0) {
        prod = c;
      } else {
        return false;
      }
    } else {
      return false;
    }
  }
  if (pt < 0 || dot < 0 || prod < 0 || p_.consumers[pt].size() != 1) return false;
  const int32_t dv = p_.consumers[pt][0];
  if (node(dv).op != Op::MatMul || node(dv).operands[0] != pt || !typed(dv, bf16)) return false;
  const int32_t d_out = node(dv).operands[1];
  const int32_t dp = other(dot, p), dp_product = product_of(dp);
  if (dp_product < 0) return false;
  const ir::GraphNode& dpn = node(dp_product);
  const View dov = view_of(d_out);
  if (node(d_out).shape != node(a.out).shape || !typed(d_out, bf16) ||
      view_of(dpn.operands[0]) != dov || view_of(dpn.operands[1]).transposed() != v ||
      !operand(dov, &a.d_out))
    return false;
  // dS = P (dP - expand(sum(dP P))).
  const int32_t sub = other(prod, p);
  if (node(sub).operands[0] != dp || node(node(sub).operands[1]).op != Op::Expand) return false;
  const int32_t dsum_x = node(sub).operands[1], dsum = node(dsum_x).operands[0];
  if (!row_reduction(dsum, Op::Sum, dot)) return false;
  mine.insert(mine.end(), {pt, dot, dsum, dsum_x, sub, prod});
  if (bf16 || a.keep >= 0) mine.push_back(dp_product);
  if (a.keep >= 0) mine.push_back(node(dp).operands[0]);  // the where
  // Under autocast the gradient goes back to bf16 for the mask and the products.
  int32_t d = prod;
  if (bf16) {
    if (p_.consumers[prod].size() != 1 || cast_from(p_.consumers[prod][0], true) != prod)
      return false;
    d = p_.consumers[prod][0];
    mine.push_back(d);
  }
  // The mask's where: the fill's place takes a zero.
  const int32_t mask_x = node(x).operands[0];
  if (a.mask_kind == MaskKind::FillWhereTrue || a.mask_kind == MaskKind::KeepWhereTrue) {
    if (p_.consumers[d].size() != 1) return false;
    const int32_t w = p_.consumers[d][0];
    const ir::GraphNode& wn = node(w);
    const bool fill_true = a.mask_kind == MaskKind::FillWhereTrue;
    if (wn.op != Op::Where || wn.operands[0] != mask_x || wn.operands[fill_true ? 2 : 1] != d)
      return false;
    a.zero_input = scalar_of(wn.operands[fill_true ? 1 : 2]);
    if (a.zero_input < 0) return false;
    d = w;
    mine.push_back(w);
  }
  // The scale.
  if (a.scale_kind != ScaleKind::None) {
    if (p_.consumers[d].size() != 1) return false;
    const int32_t s = p_.consumers[d][0];
    const ir::GraphNode& sn = node(s);
    const bool ok =
        a.scale_kind == ScaleKind::Mul
            ? sn.op == Op::Mul && other(s, d) >= 0 && scalar_of(other(s, d)) == a.scale_input
            : sn.op == Op::Div && sn.operands[0] == d && sn.operands[1] == scale_node;
    if (!ok) return false;
    d = s;
    mine.push_back(s);
  }
  // dQ = dS K and dK^T = Q^T dS (its transpose, dK, written instead when that is all it is for).
  int32_t dq = -1, dkt = -1;
  for (int32_t c : p_.consumers[d]) {
    const ir::GraphNode& cn = node(c);
    if (cn.op != Op::MatMul || !typed(c, bf16)) return false;
    if (cn.operands[0] == d && view_of(cn.operands[1]) == k && dq < 0) {
      dq = c;
    } else if (cn.operands[1] == d && view_of(cn.operands[0]).transposed() == q && dkt < 0) {
      dkt = c;
    } else {
      return false;
    }
  }
  if (dq < 0 || dkt < 0) return false;
  for (int32_t m : mine) inner->push_back(m);
  inner->push_back(dp);
  a.backward = true;
  a.dq = dq, a.dv = dv, a.dk = dkt;
  if (!p_.is_output[dkt] && p_.consumers[dkt].size() == 1 &&
      swaps_last_two(node(p_.consumers[dkt][0])) && !p_.absorbed[p_.consumers[dkt][0]]) {
    a.dk = p_.consumers[dkt][0];
    a.dk_transposed = false;
  }
  return true;
}

// Where a product [G.., rows, cols] is written: its own node, contiguous; or, when its one reader
// is a permute that keeps the last axis (attention's heads back to [B, T, H, hd]) and is a value
// of its own (not one that trees read through its strides), that permute's memory, through its
// strides.
int32_t written_as(const plan::Plan& p, int32_t id, Rows* rows) {
  const ir::GraphNode& n = p.graph.nodes[id];
  if (!p.is_output[id] && p.consumers[id].size() == 1) {
    const int32_t c = p.consumers[id][0];
    const ir::GraphNode& cn = p.graph.nodes[c];
    if (keeps_last_axis(cn) && cn.dtype == n.dtype && !p.absorbed[c]) {
      const std::vector<int64_t> out = ref::strides_of(cn.shape);
      std::vector<int64_t> st(out.size());
      for (size_t i = 0; i < out.size(); ++i) st[static_cast<size_t>(cn.attrs[i])] = out[i];
      *rows = rows_of(n.shape, st, 0);
      return c;
    }
  }
  *rows = rows_of(n.shape, ref::strides_of(n.shape), 0);
  return id;
}

}  // namespace

void fuse_attention(plan::Plan& p) {
  const std::string& mode = util::option(util::Option::FusedAttention);
  if (mode == "0") return;
  // Over few keys the fused steps cost more than the primitives: their per-row and per-block
  // work (a product call per block, the softmax row by row) is not repaid by scores that fit in
  // cache anyway. Measured (Xeon model 207, causal, forward and backward, ms a step, fused against
  // primitives): [64, 4, 16, 16] 1.2 against 0.4; [64, 4, 32, 16] 1.9-3.2 against 1.6; [16, 4,
  // 64, 16] 1.2 against 1.0-1.1; [32, 4, 64, 32] level; [4, 4, 512, 64] 13-14 against 21-24.
  constexpr int64_t kMinKeys = 64;
  const bool every = mode == "1";
  const Matcher m(p);
  CpuDecisions& d = decisions(p);
  const std::vector<bool> blocked = d.blocked;
  d.attention.assign(p.graph.nodes.size(), nullptr);
  for (size_t i = 0; i < p.graph.nodes.size(); ++i) {
    const auto o = static_cast<int32_t>(i);
    if (!p.run_time[o] || p.absorbed[o] || p.merged[o]) continue;
    std::vector<int32_t> inner;
    std::shared_ptr<AttentionFusion> a = m.forward(o, &inner);
    if (!a || (!every && a->s < kMinKeys)) continue;
    // Every value computed inside is read only inside (and by the products written).
    std::vector<int32_t> set = inner;
    for (int32_t w : {a->out, a->dq, a->dv, a->dk}) set.push_back(w);
    if (!a->dk_transposed) set.push_back(p.graph.nodes[a->dk].operands[0]);
    bool ok = true;
    for (int32_t n : inner) ok = ok && m.read_only_by(n, set) && p.run_time[n];
    std::vector<int32_t> reads = {a->q.node, a->k.node, a->v.node, a->mask};
    if (a->keep >= 0) reads.push_back(a->keep);
    if (a->backward) reads.push_back(a->d_out.node);
    for (int32_t r : reads) ok = ok && !blocked[r];
    for (int32_t w : {a->out, a->dq, a->dv, a->dk}) ok = ok && (w < 0 || !blocked[w]);
    if (!ok) continue;
    for (int32_t r : reads) p.absorbed[r] = false;  // read from memory
    // Nothing inside is a step of its own: the two steps compute all that is read of it.
    for (int32_t n : inner) p.merged[n] = true;
    // The forward's step is lowered at its product P V and writes the row max, the row sum and
    // the product (through its permute if that is all that reads it).
    a->out = written_as(p, a->out, &a->out_rows);
    p.merged[a->out] = true;
    p.merged[o] = false;
    a->forward_at = o;
    d.attention[o] = a;
    if (a->backward) {
      // The backward's is lowered at the first of its three products, and writes their values
      // (each through its permute if that is all that reads it).
      const int32_t dkt = a->dk_transposed ? a->dk : p.graph.nodes[a->dk].operands[0];
      const int32_t anchor = std::min({a->dq, a->dv, dkt});
      for (int32_t w : {a->dq, a->dv, dkt, a->dk}) p.merged[w] = true;
      a->dq = written_as(p, a->dq, &a->dq_rows);
      a->dv = written_as(p, a->dv, &a->dv_rows);
      p.merged[a->dq] = p.merged[a->dv] = true;
      p.merged[anchor] = false;
      d.attention[anchor] = a;
    }
    runtime::count(runtime::Counter::FusedAttentions);
  }
}

}  // namespace lockstep::backends::cpu
