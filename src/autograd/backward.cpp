// Reverse mode over the recorded IR: walk back from the output through nodes that require grad,
// apply each op's gradient rule, and accumulate into the leaves' grad(). Also the Tensor's
// autograd methods and NoGrad.
#include <algorithm>
#include <cmath>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "autograd/grad_rules.h"
#include "lockstep/autocast.h"
#include "lockstep/autograd.h"
#include "lockstep/ops.h"
#include "runtime/lazy.h"
#include "util/check.h"

namespace lockstep {

using util::cat;

NoGrad::NoGrad() : previous_(ir::grad_enabled()) { ir::set_grad_enabled(false); }
NoGrad::~NoGrad() { ir::set_grad_enabled(previous_); }
bool is_grad_enabled() { return ir::grad_enabled(); }

namespace {

// What backward continues through from a node: its operands, or, for a value computed by an
// earlier sync, the node it was computed from.
const std::vector<ir::NodePtr>& inputs_of(const ir::Node& n, std::vector<ir::NodePtr>& scratch) {
  if (n.grad.alias) {
    scratch.assign(1, n.grad.alias);
    return scratch;
  }
  if (n.grad.fn) return n.grad.fn->inputs;
  return n.operands;
}

// A gradient that is a value padded with zeros along one axis (a slice's, a split's or a
// chunk's gradient): the value, the axis and where it lies along it; `padded` is the padded node.
struct ZeroPadded {
  ir::NodePtr value, padded;
  int64_t axis = -1, begin = 0, end = 0;
};

std::optional<ZeroPadded> zero_padded(const ir::NodePtr& n) {
  if (n->op != ir::Op::Pad || n->operands[1]->op != ir::Op::Scalar) return std::nullopt;
  const ir::ScalarValue zero = n->operands[1]->binding.scalar;
  if (zero.f != 0 || zero.i != 0 || std::signbit(zero.f)) return std::nullopt;
  ZeroPadded z;
  for (size_t d = 0; d < n->shape.size(); ++d) {
    if (n->attrs[2 * d] == 0 && n->attrs[2 * d + 1] == 0) continue;
    if (z.axis >= 0) return std::nullopt;
    z.axis = static_cast<int64_t>(d);
  }
  if (z.axis < 0) return std::nullopt;
  z.value = n->operands[0];
  z.padded = n;
  z.begin = n->attrs[2 * z.axis];
  z.end = z.begin + z.value->shape[z.axis];
  return z;
}

// Pieces summed before they could be joined (an LSTM's gate gradients arrive o, f, i, g: the
// first two are not neighbours) are looked through, up to this many.
constexpr size_t kMaxPaddedPieces = 64;

// A gradient that is one zero-padded piece, or a sum of such pieces (sums of sums included) along
// one axis: the pieces, in the order found. Empty when it is neither.
std::vector<ZeroPadded> padded_pieces(const Tensor& t, const Loc& loc) {
  std::vector<ZeroPadded> pieces;
  std::vector<ir::NodePtr> todo{runtime::node_of(t, "backward", loc)};
  const Shape shape = todo.back()->shape;
  while (!todo.empty()) {
    const ir::NodePtr n = std::move(todo.back());
    todo.pop_back();
    if (pieces.size() + todo.size() >= kMaxPaddedPieces) return {};
    if (n->op == ir::Op::Add && n->operands.size() == 2 && n->operands[0]->shape == shape &&
        n->operands[1]->shape == shape && n->operands[0]->dtype == n->dtype &&
        n->operands[1]->dtype == n->dtype) {
      todo.push_back(n->operands[1]);
      todo.push_back(n->operands[0]);
      continue;
    }
    std::optional<ZeroPadded> z = zero_padded(n);
    if (!z || (!pieces.empty() && z->axis != pieces[0].axis)) return {};
    pieces.push_back(std::move(*z));
  }
  return pieces;
}

// A gradient that is a product over rows, x^T y with x [m, k] and y [m, n] (recorded as
// matmul(transpose(x), y), or as its transpose, matmul(transpose(y), x) transposed): a weight's
// gradient from one use of it (a linear layer's, an RNN's per time step). Under bf16 autocast a
// f32 weight's gradient from one use is such a product in bf16 widened to f32 (the gradient of
// the use's cast), transposed before or after the widening: `widened` says so.
struct RowProduct {
  ir::NodePtr x, y;
  bool widened = false;
};

bool is_transpose(const ir::Node& n) {
  return n.op == ir::Op::Permute && n.attrs.size() == 2 && n.attrs[0] == 1 && n.attrs[1] == 0;
}

std::optional<RowProduct> row_product(const Tensor& t, const Loc& loc) {
  const ir::Node* n = runtime::node_of(t, "backward", loc).get();
  RowProduct p;
  bool transposed = false;
  auto skip_transpose = [&] {
    if (!is_transpose(*n)) return;
    transposed = !transposed;
    n = n->operands[0].get();
  };
  skip_transpose();
  if (n->op == ir::Op::Cast && n->dtype == DType::F32 && n->operands[0]->dtype == DType::BF16) {
    p.widened = true;
    n = n->operands[0].get();
    skip_transpose();
  }
  if (n->op != ir::Op::MatMul || n->shape.size() != 2 || !is_transpose(*n->operands[0]))
    return std::nullopt;
  p.x = n->operands[0]->operands[0];
  p.y = n->operands[1];
  if (p.x->shape.size() != 2 || p.y->shape.size() != 2 || p.x->dtype != p.y->dtype)
    return std::nullopt;
  // (x^T y)^T is y^T x: every product as x^T y, untransposed.
  if (transposed) std::swap(p.x, p.y);
  return p;
}

// `v` as parts of a concatenation along `axis`: its own parts if it is one along that axis.
void append_parts(const ir::NodePtr& v, int64_t axis, std::vector<Tensor>& parts) {
  if (v->op == ir::Op::Concat && v->attrs[0] == axis)
    for (const ir::NodePtr& part : v->operands) parts.push_back(runtime::new_tensor(part));
  else
    parts.push_back(runtime::new_tensor(v));
}

// `a` and `b` concatenated along axis 0, a concatenation along it contributing its parts.
Tensor rows_of(const ir::NodePtr& a, const ir::NodePtr& b, const Loc& loc) {
  std::vector<Tensor> parts;
  for (const ir::NodePtr& v : {a, b}) append_parts(v, 0, parts);
  return concat(parts, 0, loc);
}

// The rows the combined products below may gather, per operand: past it, the copies would hold
// more memory than the separate products save in time.
constexpr int64_t kMaxGatheredBytes = int64_t{1} << 28;

// The sum of two gradients, by rules that give the same sum with fewer and larger kernels:
// - Pieces of the same value side by side (the gradients of slices or split pieces of it)
//   become one piece, their concatenation: a split into k pieces gets a gradient of one copy
//   instead of k padded copies and k - 1 sums (an LSTM's gates, an attention's q, k, v), in
//   whatever order the pieces arrive (pieces not yet side by side are summed, and the sum is
//   looked through when the piece between them arrives).
// - Two products over rows, x1^T y1 + x2^T y2, become one, [x1; x2]^T [y1; y2]: a weight used
//   at every time step (an RNN's) gets its gradient from one product over all of them instead
//   of one small product per step and their sums. Under bf16 autocast, widened bf16 products
//   become one widened product: the sum rounded to bf16 once (the product accumulates in f32)
//   rather than each term rounded, no less accurate.
Tensor sum_of(const Tensor& a, const Tensor& b, const Loc& loc) {
  if (const std::optional<RowProduct> ra = row_product(a, loc), rb = row_product(b, loc);
      ra && rb && ra->widened == rb->widened && ra->x->dtype == rb->x->dtype &&
      ra->x->shape[1] == rb->x->shape[1] && ra->y->shape[1] == rb->y->shape[1] &&
      (ra->x->shape[0] + rb->x->shape[0]) * std::max(ra->x->shape[1], ra->y->shape[1]) *
              dtype_size(ra->x->dtype) <=
          kMaxGatheredBytes) {
    const Tensor x = rows_of(ra->x, rb->x, loc), y = rows_of(ra->y, rb->y, loc);
    const Tensor product = matmul(transpose(x, 0, 1, loc), y, loc);
    return ra->widened ? cast(product, DType::F32, loc) : product;
  }
  std::vector<ZeroPadded> pieces = padded_pieces(a, loc);
  const std::vector<ZeroPadded> more = padded_pieces(b, loc);
  if (pieces.empty() || more.empty() || pieces[0].axis != more[0].axis) return add(a, b, loc);
  pieces.insert(pieces.end(), more.begin(), more.end());
  const int64_t axis = pieces[0].axis;
  std::sort(pieces.begin(), pieces.end(),
            [](const ZeroPadded& x, const ZeroPadded& y) { return x.begin < y.begin; });
  for (size_t k = 0; k < pieces.size(); ++k)
    if (pieces[k].value->dtype != pieces[0].value->dtype ||
        (k > 0 && pieces[k].begin < pieces[k - 1].end))
      return add(a, b, loc);  // overlapping pieces: a plain sum
  // Neighbouring pieces joined into one concatenation (a piece that is itself a concatenation
  // along the axis contributing its parts), each run padded to the whole, the runs summed.
  const int64_t size = pieces[0].padded->shape[axis];
  Tensor sum;
  for (size_t k = 0; k < pieces.size();) {
    size_t e = k + 1;
    while (e < pieces.size() && pieces[e].begin == pieces[e - 1].end) ++e;
    Tensor run;
    if (e == k + 1) {
      run = runtime::new_tensor(pieces[k].padded);  // alone: as it was
    } else {
      std::vector<Tensor> parts;
      for (size_t j = k; j < e; ++j) append_parts(pieces[j].value, axis, parts);
      run = concat(parts, axis, loc);
      if (pieces[k].begin != 0 || pieces[e - 1].end != size) {
        std::vector<std::pair<int64_t, int64_t>> pads(run.dim(), {0, 0});
        pads[axis] = {pieces[k].begin, size - pieces[e - 1].end};
        run = pad(run, pads, 0, loc);
      }
    }
    sum = sum.defined() ? add(sum, run, loc) : run;
    k = e;
  }
  return sum;
}

void accumulate(std::unordered_map<const ir::Node*, Tensor>& grads, const ir::Node* n,
                const Tensor& g, const Loc& loc) {
  auto [it, fresh] = grads.emplace(n, g);
  if (!fresh) it->second = sum_of(it->second, g, loc);
}

void deliver(detail::TensorImpl& leaf, const Tensor& g, const Loc& loc) {
  // Journaled: the step's rollback restores the previous grad handle too.
  runtime::update_grad_of(
      leaf,
      [&](const Tensor& old) {
        return old.defined() ? add(old, g, loc)
                             : runtime::new_tensor(runtime::node_of(g, "backward", loc));
      },
      "backward", loc);
}

}  // namespace

void backward(const Tensor& output, const Tensor& grad_output, Loc loc) {
  const ir::NodePtr root = runtime::node_of(output, "backward", loc);
  if (!root->grad.requires_grad)
    util::fail(loc, "backward",
               "the output does not require grad: no tensor with requires_grad reaches it, or it "
               "was computed under ls::NoGrad or in an earlier step",
               "Call set_requires_grad() on the parameters and backward in the step that "
               "computed the output");
  Tensor seed = grad_output;
  if (!seed.defined()) {
    if (shape_numel(root->shape) != 1)
      util::fail(loc, "backward",
                 cat("the output has shape ", shape_str(root->shape), ", not a single element"),
                 "Reduce it to a loss first (e.g. .mean()) or pass grad_output");
    seed = full(root->shape, 1, TensorOptions(root->dtype, root->device), loc);
  } else {
    const ir::NodePtr& s = runtime::node_of(seed, "backward", loc);
    if (s->shape != root->shape || s->dtype != root->dtype)
      util::fail(loc, "backward",
                 cat("grad_output is ", dtype_name(s->dtype), shape_str(s->shape),
                     " but the output is ", dtype_name(root->dtype), shape_str(root->shape)),
                 "Pass a gradient with the output's shape and dtype");
  }
  NoGrad no_grad;
  // Gradients run in their forward values' dtypes, whatever autocast scope the caller is in.
  const AutocastScope no_autocast(DType::F32, loc);

  // Post-order over the nodes that require grad (iterative: graphs can be deep).
  std::vector<const ir::Node*> order;
  std::unordered_map<const ir::Node*, ir::NodePtr> owner;  // keeps pointers valid
  std::unordered_set<const ir::Node*> seen;
  struct Frame {
    const ir::Node* node;
    size_t next;
  };
  std::vector<Frame> stack{{root.get(), 0}};
  owner[root.get()] = root;
  seen.insert(root.get());
  std::vector<ir::NodePtr> scratch;
  while (!stack.empty()) {
    Frame& f = stack.back();
    const ir::Node* n = f.node;
    static const std::vector<ir::NodePtr> kNone;
    const bool is_leaf = !n->grad.leaf.expired();  // gradients stop at a leaf
    const std::vector<ir::NodePtr>& ins = is_leaf ? kNone : inputs_of(*n, scratch);
    if (f.next < ins.size()) {
      const ir::NodePtr& c = ins[f.next++];
      if (c->grad.requires_grad && seen.insert(c.get()).second) {
        owner[c.get()] = c;
        stack.push_back({c.get(), 0});
      }
      continue;
    }
    order.push_back(n);
    stack.pop_back();
  }

  std::unordered_map<const ir::Node*, Tensor> grads;
  grads.emplace(root.get(), seed);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const ir::Node* n = *it;
    auto g_it = grads.find(n);
    if (g_it == grads.end()) continue;  // no path from the output carries a gradient here
    const Tensor g = g_it->second;
    grads.erase(g_it);
    if (auto leaf = n->grad.leaf.lock()) {
      deliver(*leaf, g, loc);
      continue;
    }
    if (n->grad.alias) {
      accumulate(grads, n->grad.alias.get(), g, loc);
      continue;
    }
    const std::vector<ir::NodePtr>& ins = n->grad.fn ? n->grad.fn->inputs : n->operands;
    std::vector<Tensor> gs;
    {
      const ir::BackwardOf scope(n);  // what is recorded now computes n's gradient
      gs = n->grad.fn ? n->grad.fn->fn(g) : autograd::operand_grads(owner.at(n), g);
    }
    for (size_t i = 0; i < gs.size() && i < ins.size(); ++i)
      if (gs[i].defined() && ins[i]->grad.requires_grad) {
        const ir::NodePtr& gn = runtime::node_of(gs[i], "backward", loc);
        LS_INTERNAL_CHECK(gn->shape == ins[i]->shape && gn->dtype == ins[i]->dtype, "gradient of ",
                          ir::op_info(n->op).name, " has the wrong shape");
        accumulate(grads, ins[i].get(), gs[i], loc);
      }
  }
}

namespace autograd {

SavedValue::SavedValue(const Tensor& value, const char* op, const Loc& loc)
    : node_(value.defined() ? runtime::node_of(value, op, loc) : nullptr) {}

Tensor SavedValue::get() const { return runtime::new_tensor(node_); }

Tensor with_grad_fn(const Tensor& value, const std::vector<Tensor>& inputs,
                    std::function<std::vector<Tensor>(const Tensor&)> fn, const Loc& loc) {
  if (!ir::grad_enabled()) return value;
  auto grad_fn = std::make_shared<ir::GradFn>();
  bool any = false;
  for (const Tensor& t : inputs) {
    grad_fn->inputs.push_back(runtime::node_of(t, "backward", loc));
    any = any || grad_fn->inputs.back()->grad.requires_grad;
  }
  if (!any) return value;
  grad_fn->fn = std::move(fn);
  const ir::NodePtr& n = runtime::node_of(value, "backward", loc);
  return runtime::new_tensor(ir::annotated(n, {true, {}, nullptr, std::move(grad_fn)}));
}

}  // namespace autograd

Tensor& Tensor::set_requires_grad(bool requires_grad, Loc loc) {
  const ir::NodePtr& n = runtime::node_of(*this, "set_requires_grad", loc);
  if (requires_grad && !is_floating(n->dtype))
    util::fail(loc, "set_requires_grad",
               cat("a ", dtype_name(n->dtype), " tensor cannot require grad"),
               "Only floating-point tensors have gradients");
  if (requires_grad && n->grad.requires_grad && n->grad.leaf.lock().get() != impl())
    util::fail(loc, "set_requires_grad", "the tensor is the result of ops that require grad",
               "Only leaves can be made to require grad; use detach() first");
  runtime::set_requires_grad_of(*impl(), requires_grad);
  return *this;
}

bool Tensor::requires_grad() const { return defined() && runtime::requires_grad_of(*impl()); }

Tensor Tensor::grad() const { return defined() ? runtime::grad_of(*impl()) : Tensor(); }

void Tensor::set_grad(const Tensor& grad, Loc loc) {
  const ir::NodePtr& n = runtime::node_of(*this, "set_grad", loc);
  if (grad.defined()) {
    const ir::NodePtr& g = runtime::node_of(grad, "set_grad", loc);
    if (g->shape != n->shape || g->dtype != n->dtype || !(g->device == n->device))
      util::fail(loc, "set_grad",
                 cat("gradient ", dtype_name(g->dtype), shape_str(g->shape),
                     " does not match tensor ", dtype_name(n->dtype), shape_str(n->shape)),
                 "Pass a gradient with the tensor's shape, dtype and device");
  }
  runtime::set_grad_of(*impl(), grad, "set_grad", loc);
}

void Tensor::backward(Loc loc) const { lockstep::backward(*this, Tensor(), loc); }

Tensor Tensor::detach(Loc loc) const {
  const ir::NodePtr& n = runtime::node_of(*this, "detach", loc);
  if (!n->grad.requires_grad) return runtime::new_tensor(n);
  return runtime::new_tensor(ir::annotated(n, {}));
}

}  // namespace lockstep
