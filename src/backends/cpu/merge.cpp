// The merge passes: sums over one layout that a few steps apart need nothing computed in between
// walk their input together (merge_sums), consecutive fused steps over the same number of
// elements run tile by tile together (merge_fused_steps), and reductions over rows with the trees
// that read them along those rows run as one program (merge_row_steps).
#include <algorithm>
#include <optional>
#include <string_view>

#include "backends/cpu/kernels.h"
#include "backends/cpu/passes.h"

namespace lockstep::backends::cpu {

using ir::Op;

namespace {

// A merged step reads what its members read, each value once.
void add_reads(plan::Step& merged, const plan::Step& member) {
  for (int32_t r : member.reads)
    if (std::find(merged.reads.begin(), merged.reads.end(), r) == merged.reads.end())
      merged.reads.push_back(r);
}

}  // namespace

// Consecutive fused steps over the same number of elements run as one group: per tile, each
// tree in turn, so a value one writes and the next reads (an optimizer's new momentum, then
// the parameter it moves) is still in cache; every read of a group member's value must be at
// the same element (no broadcast), which keeps tiles independent.
void merge_fused_steps(plan::Plan& p) {
  std::vector<plan::Step> out;
  for (plan::Step& s : p.steps) {
    // A host scalar reads nothing: it moves ahead of a fused step rather than separate it from
    // the next one.
    if (p.graph.nodes[s.node].op == Op::Scalar && !out.empty() && kernel(out.back()).fused) {
      out.insert(out.end() - 1, std::move(s));
      continue;
    }
    if (!out.empty() && kernel(out.back()).fused && kernel(s).fused) {
      plan::Step& g = out.back();
      const FusedTree& next = *kernel(s).fused->front().second;
      const int64_t numel = kernel(g).fused->front().second->numel();
      bool ok = next.numel() == numel && numel >= kTile;
      for (size_t k = 0; ok && k < next.leaf_nodes().size(); ++k)
        for (const auto& [node, tree] : *kernel(g).fused)
          if (next.leaf_nodes()[k] == node && !next.leaf_is_elementwise(k)) ok = false;
      if (ok) {
        kernel(g).fused->push_back(kernel(s).fused->front());
        g.extras.push_back(s.node);
        add_reads(g, s);
        g.members = members_of(*kernel(g).fused);
        g.label = "fused_group";
        g.detail += "; " + s.detail;
        kernel(g).run = run_fused(kernel(g).fused);
        continue;
      }
    }
    out.push_back(std::move(s));
  }
  p.steps = std::move(out);
}

namespace {

// The dims of `shape` from which on its values come in rows of `row` (their product), or -1.
int row_split(const Shape& shape, int64_t row) {
  int64_t p = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    p *= shape[d];
    if (p == row) return static_cast<int>(d);
    if (p > row) return -1;
  }
  return -1;
}

// A step merge_row_steps may take: a reduction over trailing dims (f32 result) of a fused tree
// or of a stored f32 or bf16 value, or a fused elementwise tree; plain order, rows of 16 to
// kRowTile values.
struct RowMember {
  int32_t node = -1;
  int32_t root = -1;     // its tree's root: the reduction's operand, or the node itself
  bool computed = true;  // the root is computed by its tree (false: a stored value, read)
  Op sink = Op::Data;    // Max, Min, Sum, or Data for a stored tree
  bool per_row = false;  // a stored tree over one value per row (set by the caller)
  int64_t numel = 0, row = 0;
  // Whether its values are one per row (a reduction's, a per-row tree's).
  bool row_values() const { return sink != Op::Data || per_row; }
};
std::optional<RowMember> row_member(const plan::Plan& p, const plan::Step& s) {
  const ir::Graph& g = p.graph;
  const ir::GraphNode& n = g.nodes[s.node];
  const CpuDecisions& d = static_cast<const CpuDecisions&>(*p.decisions);
  if (!s.extras.empty() || d.blocked[s.node] || d.walk_blocked[s.node]) return std::nullopt;
  RowMember m{s.node, s.node};
  const std::string_view label = s.label;
  if (label == "fused" && kernel(s).fused && kernel(s).fused->size() == 1) {
    m.numel = shape_numel(n.shape);  // its rows: the caller checks that the group's fit it
    return m;
  } else if ((n.op == Op::Max || n.op == Op::Min || n.op == Op::Sum) && n.dtype == DType::F32 &&
             n.attrs.size() >= 2 && s.kind == plan::StepKind::Reduction) {
    const ir::GraphNode& x = g.nodes[n.operands[0]];
    m.root = n.operands[0];
    m.computed = p.absorbed[m.root];
    if (!m.computed && (d.blocked[m.root] || (x.dtype != DType::F32 && x.dtype != DType::BF16)))
      return std::nullopt;
    for (size_t k = 1; k < n.attrs.size(); ++k)  // the last dims, each once, in order
      if (n.attrs[k] != static_cast<int64_t>(x.shape.size() - n.attrs.size() + k))
        return std::nullopt;
    m.sink = n.op;
    m.numel = shape_numel(x.shape);
    m.row = 1;
    for (size_t k = 1; k < n.attrs.size(); ++k) m.row *= x.shape[n.attrs[k]];
  } else {
    return std::nullopt;
  }
  constexpr int64_t kMinRow = 16;
  if (m.row < kMinRow || m.row > FusedTree::kRowTile || m.numel % m.row != 0) return std::nullopt;
  return m;
}

}  // namespace

// Reductions over the rows of a tree and the trees that read their results along those rows
// (a softmax: max, sum of exp(x - max), exp(x - max) / sum; a layer norm's mean, variance and
// normalization; their gradients), consecutive steps over the same rows, run as one staged tree
// (FusedTree::run_rows): tile by tile of whole rows, so each reads the rows where the last left
// them in cache, and a value one tree computed (the scores with their mask added, exp(x - max))
// is computed once, not once per step. A member may read an earlier member's reduction only
// broadcast along its rows and an earlier stored tree only element for element.
void merge_row_steps(plan::Plan& p) {
  const ir::Graph& g = p.graph;
  // How a member reads each value: its tree's leaves, or the one stored value it reduces.
  struct Read {
    int32_t node;
    bool elementwise, permuted, expanded;
  };
  auto reads_of = [&](const RowMember& m, const plan::Step& s) {
    if (!m.computed) return std::vector<Read>{{m.root, true, false, false}};
    const std::shared_ptr<FusedTree> tree =
        m.sink == Op::Data ? kernel(s).fused->front().second
                           : std::make_shared<FusedTree>(g, m.root, p.absorbed);
    std::vector<Read> reads;
    for (size_t k = 0; k < tree->leaf_nodes().size(); ++k)
      reads.push_back({tree->leaf_nodes()[k], tree->leaf_is_elementwise(k),
                       tree->leaf_is_permuted(k), tree->leaf_is_expanded(k)});
    return reads;
  };
  std::vector<plan::Step> out;
  size_t i = 0;
  while (i < p.steps.size()) {
    const std::optional<RowMember> first = row_member(p, p.steps[i]);
    if (!first || first->sink == Op::Data) {
      out.push_back(std::move(p.steps[i++]));
      continue;
    }
    const int64_t rows = first->numel / first->row;
    std::vector<RowMember> members{*first};
    std::vector<std::vector<Read>> reads{reads_of(*first, p.steps[i])};
    std::vector<size_t> taken{i}, scalars;
    for (size_t j = i + 1; j < p.steps.size(); ++j) {
      const plan::Step& s = p.steps[j];
      if (g.nodes[s.node].op == Op::Scalar && s.extras.empty()) {  // reads nothing: moves ahead
        scalars.push_back(j);
        continue;
      }
      std::optional<RowMember> m = row_member(p, s);
      if (!m) break;
      m->per_row = m->sink == Op::Data && m->numel == rows && rows != first->numel;
      // (A reduction over other dims of the same values, a longer row, is not one of these.)
      if (!m->per_row &&
          (m->numel != first->numel || (m->sink != Op::Data && m->row != first->row)))
        break;
      const Shape& shape = g.nodes[m->root].shape;
      const int split = m->per_row ? 0 : row_split(shape, first->row);
      if (split < 0) break;
      std::vector<Read> r = reads_of(*m, s);
      bool ok = true;
      for (const Read& leaf : r)
        for (const RowMember& e : members) {
          if (e.node != leaf.node) continue;
          if (e.row_values() && !m->per_row) {  // one value per row, along this tree's rows
            const Shape& ls = g.nodes[leaf.node].shape;
            ok = ok && !leaf.permuted && !leaf.expanded && ls.size() == shape.size();
            for (size_t d = 0; ok && d < shape.size(); ++d)
              ok = ls[d] == (static_cast<int>(d) < split ? shape[d] : 1);
          } else {  // values of its own space, element for element
            ok = ok && e.row_values() == m->per_row && leaf.elementwise && !leaf.permuted;
          }
        }
      if (!ok) break;
      members.push_back(*m);
      reads.push_back(std::move(r));
      taken.push_back(j);
    }
    // Trailing per-row trees gain nothing from the group.
    while (members.size() > 1 && members.back().per_row) {
      members.pop_back();
      reads.pop_back();
      taken.pop_back();
    }
    if (members.size() < 2) {
      out.push_back(std::move(p.steps[i++]));
      continue;
    }
    for (size_t j : scalars)
      if (j < taken.back()) out.push_back(std::move(p.steps[j]));
    std::vector<int32_t> roots;
    std::vector<bool> computed;
    for (const RowMember& m : members)
      if (!m.per_row) {
        roots.push_back(m.root);
        computed.push_back(m.computed);
      }
    auto staged = std::make_shared<FusedTree>(g, roots, computed, p.absorbed, first->row);
    // Per member: its stage of the staged tree, or its own per-row tree, and the value it writes.
    struct Part {
      int stage;
      Op sink;
      std::shared_ptr<FusedTree> per_row;
      int32_t node;
    };
    std::vector<Part> parts;
    int stage = 0;
    plan::Step& s = p.steps[i];
    s.kind = plan::StepKind::Elementwise;
    s.label = "fused_rows";
    s.detail = staged->describe();
    s.members.clear();
    for (size_t k = 0; k < members.size(); ++k) {
      const plan::Step& t = p.steps[taken[k]];
      const RowMember& m = members[k];
      if (m.per_row) {
        parts.push_back({-1, Op::Data, kernel(t).fused->front().second, m.node});
        s.detail += " ; per row: " + parts.back().per_row->describe();
      } else {
        parts.push_back({stage++, m.sink, nullptr, m.node});
      }
      if (k > 0) s.extras.push_back(t.node);
      add_reads(s, t);
      plan::Member mm;
      mm.node = m.node;
      for (const Read& r : reads[k]) {
        mm.reads.push_back(r.node);
        if (m.sink == Op::Data && r.elementwise) mm.elementwise_reads.push_back(r.node);
      }
      s.members.push_back(std::move(mm));
    }
    CpuStep& cs = kernel(s);
    cs.fused = nullptr;
    cs.sum = nullptr;
    cs.rows = staged;
    cs.run = [staged, parts](Ctx& c) {
      RunBuffers expanded;
      const std::vector<const void*> leaves = staged->bind(c.ptr, expanded);
      std::vector<FusedTree::RowStep> steps;
      for (const Part& part : parts) {
        FusedTree::RowStep st{part.stage, part.sink, part.per_row.get(), {}, c.ptr[part.node]};
        if (part.per_row) st.leaves = part.per_row->bind(c.ptr, expanded);
        steps.push_back(std::move(st));
      }
      FusedTree::run_rows(*staged, leaves, steps);
    };
    out.push_back(std::move(s));
    i = taken.back() + 1;  // (scalars met after the last member stay where they are)
  }
  p.steps = std::move(out);
}

// Sums over the same values' layout (same input shape and axes) that a few steps apart need
// nothing computed in between run as one walk, reading their inputs once: batch norm's backward
// sums the output gradient and the gradient times the normalized input per channel.
void merge_sums(plan::Plan& p) {
  constexpr size_t kLookahead = 12;
  std::vector<bool> gone(p.steps.size(), false);
  for (size_t i = 0; i < p.steps.size(); ++i) {
    if (gone[i] || !kernel(p.steps[i]).sum) continue;
    std::vector<size_t> members{i};
    // Values written by the members and the steps between: a sum that reads one (a softmax's
    // backward sums a value divided by the forward's sum) cannot share the walk.
    std::vector<int32_t> written = p.steps[i].writes();
    for (size_t j = i + 1; j < p.steps.size() && j <= i + kLookahead; ++j) {
      if (gone[j]) continue;
      const plan::Step& t = p.steps[j];
      bool depends = false;
      for (int32_t r : t.reads)
        depends = depends || std::find(written.begin(), written.end(), r) != written.end();
      if (kernel(t).sum && !depends && kernel(t).sum->in == kernel(p.steps[i]).sum->in &&
          kernel(t).sum->attrs == kernel(p.steps[i]).sum->attrs) {
        members.push_back(j);
        gone[j] = true;
        const std::vector<int32_t> w = t.writes();
        written.insert(written.end(), w.begin(), w.end());
        continue;
      }
      const std::vector<int32_t> w = t.writes();
      written.insert(written.end(), w.begin(), w.end());
    }
    if (members.size() == 1) continue;
    plan::Step& s = p.steps[i];
    SumParts parts;
    for (size_t m : members) {
      parts.emplace_back(p.steps[m].node, kernel(p.steps[m]).sum);
      if (m == i) continue;
      s.extras.push_back(p.steps[m].node);
      add_reads(s, p.steps[m]);
      s.detail += "; " + p.steps[m].detail;
    }
    s.label = "sums";
    kernel(s).sum = nullptr;
    kernel(s).run = run_sums(std::move(parts));
  }
  std::vector<plan::Step> kept;
  for (size_t i = 0; i < p.steps.size(); ++i)
    if (!gone[i]) kept.push_back(std::move(p.steps[i]));
  p.steps = std::move(kept);
}

}  // namespace lockstep::backends::cpu
