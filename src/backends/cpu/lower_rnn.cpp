// The lowering rule for recurrent layers: an LSTM or GRU layer and its gradient on oneDNN's
// primitives (DnnlRnn). The forward pass writes its workspace into a region of the plan
// (plan::Plan::regions: in the arena from the forward step to the last that reads it), which the
// gradient in the same program reads; a gradient whose forward pass is not a step of this
// program (its value an input, computed by an earlier one) recomputes the workspace. f64 layers
// (which oneDNN does not take) run the ref backend's kernels.
#include <algorithm>
#include <memory>
#include <vector>

#include "backends/cpu/dnnl_ops.h"
#include "backends/cpu/lower_rules.h"
#include "backends/ref/ref_kernels.h"
#include "ir/attrs.h"

namespace lockstep::backends::cpu {

using ir::Op;

namespace {

// The region holding the workspace of the forward step that computed `of` from the same six
// operands as the gradient `n`, in this program; -1 if there is none.
int32_t workspace_region(const plan::Plan& p, const ir::GraphNode& n, int32_t of) {
  const ir::GraphNode& fwd = p.graph.nodes[of];
  const Op want = n.op == Op::LstmBackward ? Op::Lstm : Op::Gru;
  if (fwd.op != want || fwd.attrs != n.attrs ||
      !std::equal(fwd.operands.begin(), fwd.operands.end(), n.operands.begin()))
    return -1;
  for (const plan::Step& s : p.steps)
    if (s.node == of && s.region >= 0) return s.region;
  return -1;
}

}  // namespace

bool recurrent_applies(const Lowering& l) {
  return ir::op_info(l.n.op).family == ir::OpFamily::Recurrent;
}

void lower_recurrent(Lowering& l) {
  l.step.reads = l.n.operands;
  if (l.n.dtype != DType::F32) {
    std::vector<ref::Arr> args;
    for (int32_t o : l.n.operands) args.push_back({nullptr, l.node(o).shape, l.node(o).dtype});
    const ir::GraphNode n = l.n;
    const int32_t id = l.id;
    l.cs.run = [n, args, id](Ctx& c) {
      std::vector<ref::Arr> a = args;
      for (size_t k = 0; k < a.size(); ++k) a[k].data = c.ptr[n.operands[k]];
      switch (n.op) {
        case Op::Lstm:
          return ref::lstm(n, a, c.ptr[id]);
        case Op::LstmBackward:
          return ref::lstm_backward(n, a, c.ptr[id]);
        case Op::Gru:
          return ref::gru(n, a, c.ptr[id]);
        default:
          return ref::gru_backward(n, a, c.ptr[id]);
      }
    };
    return;
  }
  const Shape& x = l.operand(0).shape;
  const bool reverse = ir::RnnAttrs::of(l.n.attrs).reverse;
  const bool lstm = l.n.op == Op::Lstm || l.n.op == Op::LstmBackward;
  auto rnn = std::make_shared<DnnlRnn>(lstm ? DnnlRnn::Cell::Lstm : DnnlRnn::Cell::Gru, x[0], x[1],
                                       x[2], l.operand(1).shape[1], reverse);
  l.step.scratch_bytes = rnn->scratch_bytes();
  const std::vector<int32_t> ops = l.n.operands;
  const int32_t id = l.id;
  auto operands = [ops](const Ctx& c) {
    std::vector<const float*> in;
    for (int32_t o : ops) in.push_back(static_cast<const float*>(c.ptr[o]));
    return in;
  };
  if (l.n.op == Op::Lstm || l.n.op == Op::Gru) {
    const auto r = static_cast<int32_t>(l.p.regions.size());
    l.p.regions.push_back(rnn->workspace_bytes());
    l.step.region = r;
    l.cs.run = [=](Ctx& c) {
      rnn->forward(operands(c).data(), static_cast<float*>(c.ptr[id]), (*c.regions)[r]->data());
    };
    return;
  }
  const int32_t r = workspace_region(l.p, l.n, ops[lstm ? 6 : 5]);
  l.step.region = r;
  l.cs.run = [=](Ctx& c) {
    rnn->backward(operands(c).data(), static_cast<float*>(c.ptr[id]),
                  r >= 0 ? (*c.regions)[r]->data() : nullptr);
  };
}

}  // namespace lockstep::backends::cpu
