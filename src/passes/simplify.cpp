// Algebraic simplification; see passes.h.
#include <utility>
#include <vector>

#include "passes/passes.h"

namespace lockstep::passes {
namespace {

using ir::Op;

bool is_identity(const std::vector<int64_t>& perm) {
  for (size_t i = 0; i < perm.size(); ++i)
    if (perm[i] != static_cast<int64_t>(i)) return false;
  return true;
}

// Casts moved past the permutes beside them, so that each permute meets the product it can be
// folded into (a backend reads a transposed operand through its strides and computes a product's
// transpose as B^T A^T): a cast of a permute becomes a permute of the cast (autocast's cast of a
// linear layer's transposed weight), a permute of a cast of a product a cast of the product's
// permute (the gradient of such a weight, widened to f32). A cast commutes with any permute;
// each rewrite only where the inner value has no other reader, so nothing is computed twice,
// and a cast only where products alone read it (elsewhere it fuses with its reader).
// `moved`: whether any cast moved.
ir::Graph commute_casts(const ir::Graph& g, bool* moved) {
  const size_t n = g.nodes.size();
  // Readers per node, among the nodes an output needs (the graph may hold dead ones).
  std::vector<bool> live(n, false);
  for (int32_t o : g.outputs) live[o] = true;
  for (size_t i = n; i-- > 0;)
    if (live[i])
      for (int32_t o : g.nodes[i].operands) live[o] = true;
  std::vector<int> readers(n, 0);
  std::vector<bool> matmuls_read(n, true);  // every reader a matmul
  for (size_t i = 0; i < n; ++i)
    if (live[i])
      for (int32_t o : g.nodes[i].operands) {
        ++readers[o];
        matmuls_read[o] = matmuls_read[o] && g.nodes[i].op == Op::MatMul;
      }
  for (int32_t o : g.outputs) {
    ++readers[o];
    matmuls_read[o] = false;
  }
  // Every reader a matmul or a permute that only matmuls read: autocast's weight cast is read by
  // the forward product and, transposed, by the input gradient's.
  std::vector<bool> products_read(n, true);
  for (int32_t o : g.outputs) products_read[o] = false;
  for (size_t i = 0; i < n; ++i)
    if (live[i])
      for (int32_t o : g.nodes[i].operands)
        products_read[o] = products_read[o] && (g.nodes[i].op == Op::MatMul ||
                                                (g.nodes[i].op == Op::Permute && matmuls_read[i]));
  auto only_reader = [&](int32_t k, Op op) { return g.nodes[k].op == op && readers[k] == 1; };
  ir::Graph out;
  out.device = g.device;
  out.num_buffer_inputs = g.num_buffer_inputs;
  out.num_scalar_inputs = g.num_scalar_inputs;
  std::vector<int32_t> remap(n);
  for (size_t i = 0; i < n; ++i) {
    ir::GraphNode node = g.nodes[i];
    const int32_t a = node.operands.empty() ? -1 : node.operands[0];
    for (int32_t& o : node.operands) o = remap[o];
    const bool swap = live[i] && a >= 0 &&
                      ((node.op == Op::Permute && only_reader(a, Op::Cast) &&
                        only_reader(g.nodes[a].operands[0], Op::MatMul)) ||
                       (node.op == Op::Cast && products_read[i] && only_reader(a, Op::Permute) &&
                        g.nodes[g.nodes[a].operands[0]].op != Op::MatMul));
    if (swap) {
      *moved = true;
      // node(a(x)) as a(node(x)): the inner op is this node's on x, the outer one a's.
      const ir::GraphNode& mid = g.nodes[a];
      const int32_t x = mid.operands[0];
      ir::GraphNode inner = node;
      inner.operands = {remap[x]};
      if (node.op == Op::Permute) {
        inner.dtype = g.nodes[x].dtype;  // the permute, in x's dtype
      } else {
        inner.shape = g.nodes[x].shape;  // the cast, in x's shape
      }
      out.nodes.push_back(std::move(inner));
      node.op = mid.op;
      node.attrs = mid.attrs;
      node.operands = {static_cast<int32_t>(out.nodes.size() - 1)};
    }
    remap[i] = static_cast<int32_t>(out.nodes.size());
    out.nodes.push_back(std::move(node));
  }
  for (int32_t o : g.outputs) out.outputs.push_back(remap[o]);
  return out;
}

// Permutes of permutes composed, reshapes of reshapes joined, ops that return their operand
// unchanged dropped.
ir::Graph fold_movements(const ir::Graph& g) {
  std::vector<bool> is_output(g.nodes.size(), false);
  for (int32_t o : g.outputs) is_output[o] = true;
  ir::Graph out;
  out.device = g.device;
  out.num_buffer_inputs = g.num_buffer_inputs;
  out.num_scalar_inputs = g.num_scalar_inputs;
  std::vector<int32_t> remap(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    ir::GraphNode n = g.nodes[i];
    for (int32_t& o : n.operands) o = remap[o];
    const ir::GraphNode* a = n.operands.empty() ? nullptr : &out.nodes[n.operands[0]];
    // permute(permute(x, p), q) = permute(x, p o q); reshape(reshape(x)) = reshape(x).
    if (n.op == Op::Permute && a->op == Op::Permute) {
      std::vector<int64_t> composed(n.attrs.size());
      for (size_t d = 0; d < n.attrs.size(); ++d) composed[d] = a->attrs[n.attrs[d]];
      n.attrs = std::move(composed);
      n.operands = {a->operands[0]};
    } else if (n.op == Op::Reshape && a->op == Op::Reshape) {
      n.operands = {a->operands[0]};
    }
    a = n.operands.empty() ? nullptr : &out.nodes[n.operands[0]];
    // Ops that return their operand unchanged. An output keeps its own node: backends give
    // every output its own storage.
    const bool identity = a && a->dtype == n.dtype && a->shape == n.shape &&
                          (n.op == Op::Reshape || n.op == Op::Expand || n.op == Op::Cast ||
                           (n.op == Op::Permute && is_identity(n.attrs)));
    if (identity && !is_output[i]) {
      remap[i] = n.operands[0];
      continue;
    }
    remap[i] = static_cast<int32_t>(out.nodes.size());
    out.nodes.push_back(std::move(n));
  }
  for (int32_t o : g.outputs) out.outputs.push_back(remap[o]);
  return out;
}

}  // namespace

ir::Graph simplify(const ir::Graph& g) {
  bool moved = false;
  ir::Graph out = commute_casts(fold_movements(g), &moved);
  // Once more where casts moved: the transpose of a weight's cast that the input gradient's
  // product reads is then a transpose of a transpose, nothing.
  return moved ? fold_movements(out) : out;
}

}  // namespace lockstep::passes
