// Graph passes, IR text in, IR text out: each test builds a small graph, runs one pass and
// compares the printed result with what the pass must produce.
#include <gtest/gtest.h>

#include "ir/ir.h"
#include "passes/passes.h"

namespace ir = lockstep::ir;
namespace passes = lockstep::passes;
using ir::Op;
using lockstep::DType;
using lockstep::Shape;

namespace {

struct Builder {
  ir::Graph g;
  int32_t add(Op op, std::vector<int32_t> operands, std::vector<int64_t> attrs, Shape shape,
              DType dtype = DType::F32) {
    ir::GraphNode n;
    n.op = op;
    n.operands = std::move(operands);
    n.attrs = std::move(attrs);
    n.shape = std::move(shape);
    n.dtype = dtype;
    if (op == Op::Data) n.input = g.num_buffer_inputs++;
    if (op == Op::Scalar) n.input = g.num_scalar_inputs++;
    g.nodes.push_back(std::move(n));
    return static_cast<int32_t>(g.nodes.size() - 1);
  }
  int32_t data(Shape s) { return add(Op::Data, {}, {}, std::move(s)); }
};

std::string text(const ir::Graph& g) {
  // Drop the header line (device, counts): the nodes are what the passes change.
  const std::string t = ir::to_text(g);
  return t.substr(t.find('\n') + 1);
}

}  // namespace

TEST(Passes, SimplifyFoldsADoubleTransposeAway) {
  // The backward of matmul(x, transpose(w)) reads transpose(transpose(w)): that is w.
  Builder b;
  const int32_t x = b.data({4, 3}), w = b.data({5, 3});
  const int32_t wt = b.add(Op::Permute, {w}, {1, 0}, {3, 5});
  const int32_t y = b.add(Op::MatMul, {x, wt}, {}, {4, 5});
  const int32_t wtt = b.add(Op::Permute, {wt}, {1, 0}, {5, 3});
  const int32_t gx = b.add(Op::MatMul, {y, wtt}, {}, {4, 3});
  b.g.outputs = {y, gx};
  EXPECT_EQ(text(passes::cse(passes::simplify(b.g))),
            "%0 = data(#0) f32[4, 3]\n"
            "%1 = data(#1) f32[5, 3]\n"
            "%2 = permute(%1) {1, 0} f32[3, 5]\n"
            "%3 = mat_mul(%0, %2) f32[4, 5]\n"
            "%4 = mat_mul(%3, %1) f32[4, 3]\n"
            "return %3, %4\n");
}

TEST(Passes, SimplifyComposesPermutesAndReshapes) {
  Builder b;
  const int32_t x = b.data({2, 3, 4});
  const int32_t p = b.add(Op::Permute, {x}, {2, 0, 1}, {4, 2, 3});
  const int32_t q = b.add(Op::Permute, {p}, {0, 2, 1}, {4, 3, 2});  // x.permute(2, 1, 0)
  const int32_t r1 = b.add(Op::Reshape, {q}, {}, {12, 2});
  const int32_t r2 = b.add(Op::Reshape, {r1}, {}, {24});
  b.g.outputs = {r2};
  EXPECT_EQ(text(passes::cse(passes::simplify(b.g))),
            "%0 = data(#0) f32[2, 3, 4]\n"
            "%1 = permute(%0) {2, 1, 0} f32[4, 3, 2]\n"
            "%2 = reshape(%1) f32[24]\n"
            "return %2\n");
}

TEST(Passes, SimplifyDropsIdentitiesButKeepsOutputs) {
  Builder b;
  const int32_t x = b.data({2, 3});
  const int32_t same = b.add(Op::Reshape, {x}, {}, {2, 3});
  const int32_t cast = b.add(Op::Cast, {same}, {}, {2, 3});
  const int32_t e = b.add(Op::Expand, {cast}, {}, {2, 3});
  const int32_t y = b.add(Op::Neg, {e}, {}, {2, 3});
  const int32_t kept = b.add(Op::Reshape, {y}, {}, {2, 3});  // an output: keeps its node
  b.g.outputs = {y, kept};
  EXPECT_EQ(text(passes::cse(passes::simplify(b.g))),
            "%0 = data(#0) f32[2, 3]\n"
            "%1 = neg(%0) f32[2, 3]\n"
            "%2 = reshape(%1) f32[2, 3]\n"
            "return %1, %2\n");
}

// Under autocast a linear layer reads cast(transpose(w)) and its weight's gradient is
// transpose(cast(x^T g)): the casts move to the permutes' other side, so each permute meets its
// product (read through strides, or computed as B^T A^T), also where the input gradient's
// product reads the cast transposed back. Not where the inner value has another reader, nor for
// a cast that something other than a product (or a transpose only products read) reads (it
// fuses with that).
TEST(Passes, SimplifyMovesCastsSoPermutesMeetTheirProducts) {
  Builder b;
  const int32_t x = b.data({4, 3}), w = b.data({5, 3});
  const int32_t xb = b.add(Op::Cast, {x}, {}, {4, 3}, DType::BF16);
  const int32_t wt = b.add(Op::Permute, {w}, {1, 0}, {3, 5});
  const int32_t wtb = b.add(Op::Cast, {wt}, {}, {3, 5}, DType::BF16);
  const int32_t y = b.add(Op::MatMul, {xb, wtb}, {}, {4, 5}, DType::BF16);
  const int32_t xbt = b.add(Op::Permute, {xb}, {1, 0}, {3, 4}, DType::BF16);
  const int32_t gw = b.add(Op::MatMul, {xbt, y}, {}, {3, 5}, DType::BF16);
  const int32_t gw32 = b.add(Op::Cast, {gw}, {}, {3, 5});
  const int32_t gwt = b.add(Op::Permute, {gw32}, {1, 0}, {5, 3});
  b.g.outputs = {y, gwt};
  EXPECT_EQ(text(passes::cse(passes::simplify(b.g))),
            "%0 = data(#0) f32[4, 3]\n"
            "%1 = data(#1) f32[5, 3]\n"
            "%2 = cast(%0) bf16[4, 3]\n"
            "%3 = cast(%1) bf16[5, 3]\n"
            "%4 = permute(%3) {1, 0} bf16[3, 5]\n"
            "%5 = mat_mul(%2, %4) bf16[4, 5]\n"
            "%6 = permute(%2) {1, 0} bf16[3, 4]\n"
            "%7 = mat_mul(%6, %5) bf16[3, 5]\n"
            "%8 = permute(%7) {1, 0} bf16[5, 3]\n"
            "%9 = cast(%8) f32[5, 3]\n"
            "return %5, %9\n");
  // The input gradient's product reads the cast weight transposed back: the cast still moves,
  // and that product reads the cast weight itself (a transpose of a transpose is nothing).
  Builder d;
  const int32_t x2 = d.add(Op::Cast, {d.data({4, 3})}, {}, {4, 3}, DType::BF16);
  const int32_t w2 = d.data({5, 3});
  const int32_t w2tb =
      d.add(Op::Cast, {d.add(Op::Permute, {w2}, {1, 0}, {3, 5})}, {}, {3, 5}, DType::BF16);
  const int32_t y2 = d.add(Op::MatMul, {x2, w2tb}, {}, {4, 5}, DType::BF16);
  const int32_t back = d.add(Op::Permute, {w2tb}, {1, 0}, {5, 3}, DType::BF16);
  const int32_t dx = d.add(Op::MatMul, {y2, back}, {}, {4, 3}, DType::BF16);
  d.g.outputs = {y2, dx};
  EXPECT_EQ(text(passes::cse(passes::simplify(d.g))),
            "%0 = data(#0) f32[4, 3]\n"
            "%1 = cast(%0) bf16[4, 3]\n"
            "%2 = data(#1) f32[5, 3]\n"
            "%3 = cast(%2) bf16[5, 3]\n"
            "%4 = permute(%3) {1, 0} bf16[3, 5]\n"
            "%5 = mat_mul(%1, %4) bf16[4, 5]\n"
            "%6 = mat_mul(%5, %3) bf16[4, 3]\n"
            "return %5, %6\n");
  // The transposed weight read by an elementwise op too, the cast also by a negation, the
  // widened product also returned: each stays where it was.
  Builder c;
  const int32_t v = c.data({5, 3});
  const int32_t vt = c.add(Op::Permute, {v}, {1, 0}, {3, 5});
  const int32_t vtb = c.add(Op::Cast, {vt}, {}, {3, 5}, DType::BF16);
  const int32_t neg = c.add(Op::Neg, {vtb}, {}, {3, 5}, DType::BF16);
  const int32_t p = c.add(Op::MatMul, {neg, c.add(Op::Permute, {vtb}, {1, 0}, {5, 3}, DType::BF16)},
                          {}, {3, 3}, DType::BF16);
  const int32_t p32 = c.add(Op::Cast, {p}, {}, {3, 3});
  const int32_t pt = c.add(Op::Permute, {p32}, {1, 0}, {3, 3});
  c.g.outputs = {pt, p32};
  const std::string before = text(passes::cse(c.g));
  EXPECT_EQ(text(passes::cse(passes::simplify(c.g))), before);
}

TEST(Passes, CseMergesEqualNodesButNotScalarsAndDropsDeadOnes) {
  Builder b;
  const int32_t x = b.data({3});
  const int32_t s0 = b.add(Op::Scalar, {}, {}, {});
  const int32_t s1 = b.add(Op::Scalar, {}, {}, {});
  const int32_t a0 = b.add(Op::Mul, {x, s0}, {}, {3});
  const int32_t a1 = b.add(Op::Mul, {x, s1}, {}, {3});  // another scalar: not the same value
  const int32_t e0 = b.add(Op::Exp, {x}, {}, {3});
  const int32_t e1 = b.add(Op::Exp, {x}, {}, {3});  // same as e0
  b.add(Op::Log, {x}, {}, {3});                     // nothing reads it
  const int32_t s = b.add(Op::Add, {e0, e1}, {}, {3});
  b.g.outputs = {a0, a1, s};
  EXPECT_EQ(text(passes::cse(b.g)),
            "%0 = data(#0) f32[3]\n"
            "%1 = scalar($0) f32[]\n"
            "%2 = scalar($1) f32[]\n"
            "%3 = mul(%0, %1) f32[3]\n"
            "%4 = mul(%0, %2) f32[3]\n"
            "%5 = exp(%0) f32[3]\n"
            "%6 = add(%5, %5) f32[3]\n"
            "return %3, %4, %6\n");
}

TEST(Passes, FindConstantsFoldsWhatRunTimeValuesReadOfRampsAlone) {
  Builder b;
  const int32_t ramp = b.add(Op::Iota, {}, {0}, {8}, DType::I64);  // %0 constant
  const int32_t cast = b.add(Op::Cast, {ramp}, {}, {8});           // %1 constant
  const int32_t sine = b.add(Op::Sin, {cast}, {}, {8});            // %2 constant, read below
  const int32_t x = b.data({8});                                   // %3
  const int32_t y = b.add(Op::Mul, {x, sine}, {}, {8});            // %4 run time
  const int32_t s = b.add(Op::Scalar, {}, {}, {});                 // %5 host scalar
  const int32_t se = b.add(Op::Expand, {s}, {}, {8});              // %6 run time
  const int32_t z = b.add(Op::Add, {cast, se}, {}, {8});           // %7 run time
  const int32_t big = b.add(Op::Expand, {cast}, {}, {1000, 8});    // %8 constant, big
  const int32_t w = b.data({1000, 8});                             // %9
  const int32_t v = b.add(Op::Add, {w, big}, {}, {1000, 8});       // %10 run time
  const int32_t out = b.add(Op::Cos, {sine}, {}, {8});             // %11 constant output
  b.g.outputs = {y, z, v, out};
  const passes::Constants c = passes::find_constants(b.g, 1024);
  EXPECT_EQ(c.constant, (std::vector<bool>{true, true, true, false, false, false, false, false,
                                           true, false, false, true}));
  // The cast (read by z and by the big broadcast) and the sine (read by y and the output) are
  // kept; the ramp is only needed to compute them. The broadcast (32,000 bytes) and the output
  // are computed at run time from what was folded.
  EXPECT_EQ(c.fold, (std::vector<int32_t>{cast, sine}));
  EXPECT_FALSE(c.run_time[ramp]);
  EXPECT_TRUE(c.run_time[big]);
  EXPECT_TRUE(c.run_time[out]);
  // With room for the broadcast, it is folded too.
  EXPECT_EQ(passes::find_constants(b.g, 1 << 20).fold, (std::vector<int32_t>{cast, sine, big}));
}

// Marks node `n` as the backward's (of a product).
void mark_backward(Builder& b, int32_t n) {
  b.g.nodes[static_cast<size_t>(n)].origin.backward_of = static_cast<int16_t>(Op::MatMul);
}

// A sharded parameter's gather (a broadcast with gather 1) read by the forward and the backward
// runs again just before the backward's first read, which reads the second; a plain broadcast,
// and a gather only the forward reads, are left alone.
TEST(Passes, RegatherRunsAGatherAgainForTheBackward) {
  Builder b;
  const int32_t x = b.data({2, 3});
  const int32_t w = b.data({3, 3});
  const int32_t gw = b.add(Op::Broadcast, {w}, {1, 1}, {3, 3});  // %2 gather
  const int32_t v = b.data({3});
  const int32_t gv = b.add(Op::Broadcast, {v}, {1, 1}, {3});  // %4 gather: forward only
  const int32_t pb = b.add(Op::Broadcast, {w}, {0}, {3, 3});  // %5 plain: read by both
  const int32_t y = b.add(Op::MatMul, {x, gw}, {}, {2, 3});
  const int32_t z = b.add(Op::Add, {y, gv}, {}, {2, 3});
  const int32_t u = b.add(Op::MatMul, {z, pb}, {}, {2, 3});
  const int32_t e = b.add(Op::Exp, {u}, {}, {2, 3});  // %9: the backward starts after it
  auto backward = [&](Op op, std::vector<int32_t> operands, std::vector<int64_t> attrs,
                      Shape shape) {
    const int32_t n = b.add(op, std::move(operands), std::move(attrs), std::move(shape));
    mark_backward(b, n);
    return n;
  };
  const int32_t t = backward(Op::Permute, {pb}, {1, 0}, {3, 3});
  const int32_t d = backward(Op::MatMul, {e, t}, {}, {2, 3});
  const int32_t wt = backward(Op::Permute, {gw}, {1, 0}, {3, 3});
  const int32_t dx = backward(Op::MatMul, {d, wt}, {}, {2, 3});
  b.g.outputs = {e, dx};
  EXPECT_EQ(text(passes::regather(b.g)),
            "%0 = data(#0) f32[2, 3]\n"
            "%1 = data(#1) f32[3, 3]\n"
            "%2 = broadcast(%1) {1, 1} f32[3, 3]\n"
            "%3 = data(#2) f32[3]\n"
            "%4 = broadcast(%3) {1, 1} f32[3]\n"
            "%5 = broadcast(%1) {0} f32[3, 3]\n"
            "%6 = mat_mul(%0, %2) f32[2, 3]\n"
            "%7 = add(%6, %4) f32[2, 3]\n"
            "%8 = mat_mul(%7, %5) f32[2, 3]\n"
            "%9 = exp(%8) f32[2, 3]\n"
            "%10 = permute(%5) {1, 0} f32[3, 3]\n"
            "%11 = mat_mul(%9, %10) f32[2, 3]\n"
            "%12 = broadcast(%1) {1, 1} f32[3, 3]\n"
            "%13 = permute(%12) {1, 0} f32[3, 3]\n"
            "%14 = mat_mul(%11, %13) f32[2, 3]\n"
            "return %9, %14\n");
  // Nothing to run again: the graph as it was.
  b.g.nodes[static_cast<size_t>(wt)].operands = {pb};
  EXPECT_EQ(text(passes::regather(b.g)), text(b.g));
}

// A split parameter's gather (fully_shard): its runs' broadcasts, each from its rank, joined by a
// concatenation and shaped by a reshape. The backward's read runs the whole of it again, each
// piece once, and reads the new reshape.
TEST(Passes, RegatherRunsASplitParametersRunsAgainJoined) {
  Builder b;
  const int32_t x = b.data({2, 4});
  const int32_t own = b.data({5});
  const int32_t other = b.data({3});
  const int32_t r0 = b.add(Op::Broadcast, {own}, {0, 1}, {5});    // %3
  const int32_t r1 = b.add(Op::Broadcast, {other}, {1, 1}, {3});  // %4
  const int32_t cat = b.add(Op::Concat, {r0, r1}, {0}, {8});
  const int32_t w = b.add(Op::Reshape, {cat}, {}, {4, 2});
  const int32_t y = b.add(Op::MatMul, {x, w}, {}, {2, 2});
  const int32_t e = b.add(Op::Exp, {y}, {}, {2, 2});
  const int32_t wt = b.add(Op::Permute, {w}, {1, 0}, {2, 4});
  mark_backward(b, wt);
  const int32_t dx = b.add(Op::MatMul, {e, wt}, {}, {2, 4});
  mark_backward(b, dx);
  b.g.outputs = {e, dx};
  EXPECT_EQ(text(passes::regather(b.g)),
            "%0 = data(#0) f32[2, 4]\n"
            "%1 = data(#1) f32[5]\n"
            "%2 = data(#2) f32[3]\n"
            "%3 = broadcast(%1) {0, 1} f32[5]\n"
            "%4 = broadcast(%2) {1, 1} f32[3]\n"
            "%5 = concat(%3, %4) {0} f32[8]\n"
            "%6 = reshape(%5) f32[4, 2]\n"
            "%7 = mat_mul(%0, %6) f32[2, 2]\n"
            "%8 = exp(%7) f32[2, 2]\n"
            "%9 = broadcast(%1) {0, 1} f32[5]\n"
            "%10 = broadcast(%2) {1, 1} f32[3]\n"
            "%11 = concat(%9, %10) {0} f32[8]\n"
            "%12 = reshape(%11) f32[4, 2]\n"
            "%13 = permute(%12) {1, 0} f32[2, 4]\n"
            "%14 = mat_mul(%8, %13) f32[2, 4]\n"
            "return %8, %14\n");
}
