// The lowering rule for index ops, any dtype, on the index kernels (index_kernels.h): gathers,
// scatter-adds, pads, concats, index ramps, random bits, arg-reductions, sorts and host scalars.
// Not the checks of their indices, which add_step (lower.cpp) makes steps of their own.
#include <utility>
#include <vector>

#include "backends/cpu/index_kernels.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/lower_rules.h"
#include "backends/ref/ref_kernels.h"
#include "util/check.h"

namespace lockstep::backends::cpu {

using ir::Op;

namespace {

// An index operand as the kernels read it: through an Expand that broadcasts a smaller index
// (embeddings' and index_select's), with zero strides, rather than from a materialized copy.
std::pair<int32_t, std::vector<int64_t>> index_source(const plan::Plan& p, int32_t index) {
  const ir::GraphNode& e = p.graph.nodes[index];
  if (e.op == Op::Expand && p.run_time[index] && !p.is_output[index])
    return {e.operands[0], expand_strides(p.graph.nodes[e.operands[0]].shape, e.shape)};
  return {index, ref::strides_of(e.shape)};
}

}  // namespace

// Gather, scatter-add, pad, concat, index ramps and random bits: the index kernels, any dtype.
bool index_applies(const Lowering& l) {
  switch (l.n.op) {
    case Op::Gather:
    case Op::ScatterAdd:
    case Op::Pad:
    case Op::Concat:
      return !l.n.shape.empty();
    case Op::Iota:
    case Op::RandomUniform:
    case Op::Scalar:
      return true;
    case Op::ArgMax:
    case Op::ArgMin:
    case Op::Argsort:
      return shape_numel(l.operand(0).shape) > 0;
    default:
      return false;
  }
}
void lower_index(Lowering& l) {
  l.step.reads = l.n.operands;
  const int32_t id = l.id;
  const Shape out = l.n.shape;
  const DType dtype = l.n.dtype;
  const size_t elem = dtype_size(l.n.dtype);
  const std::vector<int64_t> attrs = l.n.attrs;
  switch (l.n.op) {
    case Op::Gather:
    case Op::ScatterAdd: {
      const int32_t x = l.n.operands[0];
      const std::pair<int32_t, std::vector<int64_t>> source = index_source(l.p, l.n.operands[1]);
      const int32_t index = source.first;
      const std::vector<int64_t> strides = source.second;
      l.step.reads[1] = index;
      l.index = index;
      const Shape xs = l.node(x).shape, is = l.operand(1).shape;
      const int64_t axis = attrs[0];
      if (l.n.op == Op::Gather) {
        l.step.label = "gather";
        l.cs.run = [=](Ctx& c) {
          gather(elem, c.ptr[x], xs, {static_cast<const int64_t*>(c.ptr[index]), strides}, is, axis,
                 c.ptr[id]);
        };
      } else {
        l.step.label = "scatter_add";
        const int32_t src = l.n.operands[2];
        const Shape ss = l.node(src).shape;
        l.cs.run = [=](Ctx& c) {
          scatter_add(dtype, c.ptr[x], xs, {static_cast<const int64_t*>(c.ptr[index]), strides}, is,
                      c.ptr[src], ss, axis, c.ptr[id]);
        };
      }
      return;
    }
    case Op::Pad: {
      const int32_t x = l.n.operands[0], value = l.n.operands[1];
      const Shape xs = l.node(x).shape;
      l.step.label = "pad";
      l.cs.run = [=](Ctx& c) { pad(elem, c.ptr[x], xs, attrs, c.ptr[value], out, c.ptr[id]); };
      return;
    }
    case Op::Concat: {
      std::vector<Shape> shapes;
      for (int32_t o : l.n.operands) shapes.push_back(l.node(o).shape);
      const std::vector<int32_t> ops = l.n.operands;
      l.step.label = "concat";
      l.cs.run = [=](Ctx& c) {
        std::vector<const void*> xs;
        for (int32_t o : ops) xs.push_back(c.ptr[o]);
        concat(elem, xs, shapes, attrs[0], out, c.ptr[id]);
      };
      return;
    }
    case Op::Iota:
      l.step.label = "iota";
      l.cs.run = [=](Ctx& c) { iota(dtype, out, attrs[0], c.ptr[id]); };
      return;
    case Op::RandomUniform: {
      const int32_t state = l.n.operands[0];
      const int64_t count = shape_numel(out);
      l.step.label = "rand";
      l.cs.run = [=](Ctx& c) {
        random_uniform(dtype, static_cast<const int64_t*>(c.ptr[state]), count, c.ptr[id]);
      };
      return;
    }
    case Op::ArgMax:
    case Op::ArgMin: {
      const int32_t x = l.n.operands[0];
      const Shape xs = l.node(x).shape;
      const DType xd = l.node(x).dtype;
      const bool is_max = l.n.op == Op::ArgMax;
      l.step.label = is_max ? "argmax" : "argmin";
      l.cs.run = [=](Ctx& c) {
        arg_reduce(is_max, xd, c.ptr[x], xs, attrs, static_cast<int64_t*>(c.ptr[id]));
      };
      return;
    }
    case Op::Argsort: {
      const int32_t x = l.n.operands[0];
      const Shape xs = l.node(x).shape;
      const DType xd = l.node(x).dtype;
      l.step.label = "argsort";
      l.cs.run = [=](Ctx& c) {
        argsort(xd, c.ptr[x], xs, attrs[0], attrs[1] != 0, static_cast<int64_t*>(c.ptr[id]));
      };
      return;
    }
    case Op::Scalar: {  // a host scalar of this run, written as the node's dtype (as ref does)
      const int64_t input = l.n.input;
      l.step.label = "scalar";
      l.cs.run = [=](Ctx& c) {
        const ir::ScalarValue v = c.scalars->at(static_cast<size_t>(input));
        void* out = c.ptr[id];
        switch (dtype) {
          case DType::F32:
            *static_cast<float*>(out) = static_cast<float>(v.f);
            return;
          case DType::F64:
            *static_cast<double*>(out) = v.f;
            return;
          case DType::BF16:
            *static_cast<uint16_t*>(out) = bfloat16(static_cast<float>(v.f)).bits;
            return;
          case DType::I32:
            *static_cast<int32_t*>(out) = static_cast<int32_t>(v.i);
            return;
          case DType::I64:
            *static_cast<int64_t*>(out) = v.i;
            return;
          case DType::Bool:
            *static_cast<bool*>(out) = static_cast<bool>(v.i);
            return;
          case DType::U8:
            *static_cast<uint8_t*>(out) = static_cast<uint8_t>(v.i);
            return;
        }
      };
      return;
    }
    default:
      util::internal_fail(__FILE__, __LINE__, "lower_index: not an index op");
  }
}

}  // namespace lockstep::backends::cpu
