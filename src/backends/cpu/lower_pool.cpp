// The lowering rules for pooling: max pooling (values and indices in one pass) and its gradient on
// our kernels (kernels.h), plain or blocked, and average pooling and its gradient through oneDNN.
// Not pooling of other dtypes or empty shapes (lower_typed.cpp).
#include <memory>
#include <vector>

#include "backends/cpu/kernels.h"
#include "backends/cpu/lower_rules.h"
#include "runtime/metrics.h"
#include "util/check.h"

namespace lockstep::backends::cpu {

using ir::Op;

namespace {

// The forward pooling's input and output shapes, for an average pooling or its backward.
const Shape& pool_input(const ir::Graph& g, const ir::GraphNode& n) {
  return n.op == Op::AvgPool2dBackward ? n.shape : g.nodes[n.operands[0]].shape;
}
const Shape& pool_output(const ir::Graph& g, const ir::GraphNode& n) {
  return n.op == Op::AvgPool2dBackward ? g.nodes[n.operands[0]].shape : n.shape;
}

}  // namespace

// Max pooling: values and indices of the same pooling in one pass, plain or blocked.
bool max_pooling_applies(const Lowering& l) {
  return (l.n.op == Op::MaxPool2d || l.n.op == Op::MaxPool2dIndices) &&
         (is_f32(l.p.graph, l.n.operands[0]) || l.operand(0).dtype == DType::BF16) &&
         shape_numel(l.n.shape) > 0;
}
void lower_max_pooling(Lowering& l) {
  // Values and indices of the same pooling come from one pass.
  const int32_t x = l.n.operands[0];
  const Op other = l.n.op == Op::MaxPool2d ? Op::MaxPool2dIndices : Op::MaxPool2d;
  for (int32_t k : l.p.consumers[x])
    if (k != l.id && l.node(k).op == other && l.node(k).attrs == l.n.attrs && !l.p.absorbed[k] &&
        l.p.run_time[k]) {
      l.step.extras = {k};
      l.p.merged[k] = true;
      break;
    }
  l.step.reads = l.n.operands;
  const int32_t other_id = l.step.extras.empty() ? -1 : l.step.extras[0];
  const int32_t values = l.n.op == Op::MaxPool2d ? l.id : other_id;
  const int32_t indices = l.n.op == Op::MaxPool2d ? other_id : l.id;
  const Shape in = l.node(x).shape, out = l.n.shape;
  const std::vector<int64_t> attrs = l.n.attrs;
  const bool blocked = l.mask[x];
  LS_INTERNAL_CHECK(l.mask[l.id] == blocked && (other_id < 0 || l.mask[other_id] == blocked),
                    "max pooling's input, values and indices in different layouts");
  if (blocked) runtime::count(runtime::Counter::BlockedMaxPooling);
  if (l.node(x).dtype == DType::BF16) {
    l.cs.run = [=](Ctx& c) {
      uint16_t* v = values >= 0 ? static_cast<uint16_t*>(c.ptr[values]) : nullptr;
      int64_t* i = indices >= 0 ? static_cast<int64_t*>(c.ptr[indices]) : nullptr;
      const uint16_t* xs = static_cast<const uint16_t*>(c.ptr[x]);
      if (blocked)
        max_pool2d_blocked_bf16(xs, in, out, attrs, v, i);
      else
        max_pool2d_bf16(xs, in, out, attrs, v, i);
    };
  } else {
    l.cs.run = [=](Ctx& c) {
      float* v = values >= 0 ? static_cast<float*>(c.ptr[values]) : nullptr;
      int64_t* i = indices >= 0 ? static_cast<int64_t*>(c.ptr[indices]) : nullptr;
      if (blocked)
        max_pool2d_blocked_f32(static_cast<const float*>(c.ptr[x]), in, out, attrs, v, i);
      else
        max_pool2d_f32(static_cast<const float*>(c.ptr[x]), in, out, attrs, v, i);
    };
  }
}

// Average pooling and its gradient through oneDNN.
bool avg_pooling_applies(const Lowering& l) {
  return (l.n.op == Op::AvgPool2d || l.n.op == Op::AvgPool2dBackward) &&
         (all_f32(l.p.graph, l.id) || all_bf16(l.p.graph, l.id)) &&
         DnnlAvgPool::fits(pool_input(l.p.graph, l.n), pool_output(l.p.graph, l.n), l.n.attrs);
}
void lower_avg_pooling(Lowering& l) {
  auto pool =
      std::make_shared<DnnlAvgPool>(l.n.op == Op::AvgPool2dBackward, pool_input(l.p.graph, l.n),
                                    pool_output(l.p.graph, l.n), l.n.attrs, l.n.dtype);
  l.step.scratch_bytes = pool->scratch_bytes();
  l.step.reads = l.n.operands;
  const int32_t x = l.n.operands[0], id = l.id;
  l.cs.run = [pool, x, id](Ctx& c) { pool->run(c.ptr[x], c.ptr[id]); };
}

// The gradient of max pooling, plain or blocked.
bool max_pooling_backward_applies(const Lowering& l) {
  return l.n.op == Op::MaxPool2dBackward && (l.f32 || l.n.dtype == DType::BF16) &&
         l.operand(0).dtype == l.n.dtype && shape_numel(l.n.shape) > 0;
}
void lower_max_pooling_backward(Lowering& l) {
  l.step.reads = l.n.operands;
  const int32_t id = l.id, gy = l.n.operands[0], idx = l.n.operands[1];
  const Shape gys = l.node(gy).shape, in = l.n.shape;
  const bool blocked = l.mask[id];
  LS_INTERNAL_CHECK(l.mask[gy] == blocked && l.mask[idx] == blocked,
                    "max pooling's gradient, output gradient and indices in different layouts");
  if (blocked) runtime::count(runtime::Counter::BlockedMaxPooling);
  // Its indices are checked ahead unless the forward pooling computed them (see the end of
  // add_step); the kernel checks them again, before its threads start. A bf16 gradient is
  // summed in f32 and rounded once, as ref computes it.
  const bool bf16 = l.n.dtype == DType::BF16;
  l.cs.run = [=](Ctx& c) {
    const int64_t* i = static_cast<const int64_t*>(c.ptr[idx]);
    if (bf16) {
      const uint16_t* g = static_cast<const uint16_t*>(c.ptr[gy]);
      uint16_t* dx = static_cast<uint16_t*>(c.ptr[id]);
      if (blocked)
        max_pool2d_backward_blocked_bf16(g, i, gys, in, dx);
      else
        max_pool2d_backward_bf16(g, i, gys, in, dx);
      return;
    }
    const float* g = static_cast<const float*>(c.ptr[gy]);
    float* dx = static_cast<float*>(c.ptr[id]);
    if (blocked)
      max_pool2d_backward_blocked_f32(g, i, gys, in, dx);
    else
      max_pool2d_backward_f32(g, i, gys, in, dx);
  };
}

}  // namespace lockstep::backends::cpu
