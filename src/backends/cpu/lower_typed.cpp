// The lowering rule of last resort: every op the other rules do not take, on the kernels for
// every dtype (typed_kernels.h). Not the f32 and bf16 kernels those rules pick (the other
// lower*.cpp files).
#include <cstring>
#include <vector>

#include "backends/cpu/lower_rules.h"
#include "backends/cpu/typed_kernels.h"

namespace lockstep::backends::cpu {

using ir::Op;
using plan::bytes_of;

// What the other rules do not take: other dtypes (f64, integers, bool, casts between any two)
// and the corners of the f32 and bf16 kernels (empty shapes, geometries oneDNN refuses), on the
// kernels for every dtype (typed_kernels.h).
bool typed_applies(const Lowering& l) {
  switch (ir::op_info(l.n.op).family) {
    case ir::OpFamily::Unary:
    case ir::OpFamily::Binary:
    case ir::OpFamily::Comparison:
    case ir::OpFamily::Select:
    case ir::OpFamily::Reduction:
    case ir::OpFamily::Contraction:
    case ir::OpFamily::Convolution:
    case ir::OpFamily::Pooling:
      return true;
    case ir::OpFamily::Movement:  // a 0-d pad: its operand as it is
      return l.n.op == Op::Pad && l.n.shape.empty();
    case ir::OpFamily::Index:  // an argsort of nothing: no step has anything to write
      return l.n.op == Op::Argsort && shape_numel(l.n.shape) == 0;
    default:
      return false;
  }
}
void lower_typed(Lowering& l) {
  l.step.reads = l.n.operands;
  const int32_t id = l.id;
  const Op op = l.n.op;
  const DType dtype = l.n.dtype;
  const Shape out = l.n.shape;
  const std::vector<int64_t> attrs = l.n.attrs;
  const std::vector<int32_t> operands = l.n.operands;
  std::vector<TypedArg> args;
  std::vector<Shape> shapes;
  for (int32_t o : l.n.operands) {
    args.push_back({nullptr, l.node(o).dtype});
    shapes.push_back(l.node(o).shape);
  }
  // Each run binds the operands' memory to a copy of `args`.
  auto bind = [args, operands](const Ctx& c) {
    std::vector<TypedArg> a = args;
    for (size_t k = 0; k < a.size(); ++k) a[k].data = c.ptr[operands[k]];
    return a;
  };
  switch (ir::op_info(op).family) {
    case ir::OpFamily::Reduction:
      l.step.kind = plan::StepKind::Reduction;
      l.cs.run = [=](Ctx& c) { typed_reduce(op, dtype, bind(c)[0], shapes[0], attrs, c.ptr[id]); };
      return;
    case ir::OpFamily::Contraction:
      l.cs.run = [=](Ctx& c) {
        const std::vector<TypedArg> a = bind(c);
        typed_matmul(dtype, a[0], shapes[0], a[1], shapes[1], out, c.ptr[id]);
      };
      return;
    case ir::OpFamily::Convolution:
      l.cs.run = [=](Ctx& c) {
        const std::vector<TypedArg> a = bind(c);
        typed_conv(op, dtype, a[0], shapes[0], a[1], shapes[1], out, attrs, c.ptr[id]);
      };
      return;
    case ir::OpFamily::Pooling:
      l.cs.run = [=](Ctx& c) {
        const std::vector<TypedArg> a = bind(c);
        const int64_t* indices =
            op == Op::MaxPool2dBackward ? static_cast<const int64_t*>(a[1].data) : nullptr;
        typed_pool(op, a[0], shapes[0], indices, out, attrs, c.ptr[id]);
      };
      return;
    case ir::OpFamily::Movement:
    case ir::OpFamily::Index: {
      const size_t bytes = bytes_of(l.n);
      l.cs.run = [=](Ctx& c) {
        if (bytes) std::memcpy(c.ptr[id], c.ptr[operands[0]], bytes);
      };
      return;
    }
    default: {
      // Not StepKind::Elementwise (fused trees): small integer steps that compute checked indices
      // stay eligible to run early with their checks (plan/checks.cpp), as ref's steps were.
      const int64_t count = shape_numel(out);
      l.cs.run = [=](Ctx& c) { typed_elementwise(op, dtype, bind(c), count, c.ptr[id]); };
      return;
    }
  }
}

}  // namespace lockstep::backends::cpu
