// Native code for fused trees (backends/cpu/native.h) against the interpreter it replaces: every
// elementwise op native code computes, f32, bf16 and bool, tile and one-value operands,
// broadcasts, folded scaled sums, a `where` of one condition, and a tail shorter than a vector,
// over special values (NaN, infinities, signed zeros, subnormals, exp's far-negative inputs); the
// results must be the interpreter's bit for bit, since a tree switches between the two while a
// program runs.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/fused.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/native.h"
#include "backends/cpu/vector_math.h"
#include "ir/ir.h"
#include "util/check.h"

namespace ir = lockstep::ir;
namespace cpu = lockstep::backends::cpu;
using lockstep::DType;
using lockstep::util::cat;

namespace {

// A case: a graph whose last node is the tree's root, every node but the data absorbed.
struct Case {
  std::string name, text;
  ir::Graph g;
  std::shared_ptr<cpu::FusedTree> interpreted, native;
};

Case make_case(const std::string& name, const std::string& text) {
  Case c{name, text, ir::from_text(text), nullptr, nullptr};
  std::vector<bool> absorbed(c.g.nodes.size());
  for (size_t i = 0; i < absorbed.size(); ++i) absorbed[i] = c.g.nodes[i].op != ir::Op::Data;
  const int32_t root = static_cast<int32_t>(c.g.nodes.size()) - 1;
  c.interpreted = std::make_shared<cpu::FusedTree>(c.g, root, absorbed);
  c.native = std::make_shared<cpu::FusedTree>(c.g, root, absorbed);
  return c;
}

// Values that find the corners: NaN of both signs, infinities, zeros, subnormals, the largest
// and smallest normals, exp's far-negative range (its slow path), integers and halves (floor,
// ceil), then normal values of several scales.
std::vector<float> values(size_t n, uint32_t seed) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v{std::numeric_limits<float>::quiet_NaN(),
                       -std::numeric_limits<float>::quiet_NaN(),
                       inf,
                       -inf,
                       0.0f,
                       -0.0f,
                       1e-40f,
                       -1e-40f,
                       std::numeric_limits<float>::max(),
                       std::numeric_limits<float>::min(),
                       -88.0f,
                       -100.0f,
                       -104.0f,
                       -120.0f,
                       88.5f,
                       2.5f,
                       -2.5f,
                       3.0f,
                       1.0f,
                       -1.0f};
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float scales[] = {1.0f, 0.01f, 10.0f, 300.0f};
  while (v.size() < n) v.push_back(normal(rng) * scales[v.size() % 4]);
  v.resize(n);
  if (n > 40) std::shuffle(v.begin() + 40, v.end(), rng);  // the corners first, then mixed
  return v;
}

// Memory for each data node of `g` in its dtype, filled from values(); a one-value node holds
// the corner value `corner` (on from there for the next node).
std::vector<std::vector<unsigned char>> inputs(const ir::Graph& g, size_t corner = 0) {
  std::vector<std::vector<unsigned char>> mem(g.nodes.size());
  const std::vector<float> corners = values(20, 0);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const ir::GraphNode& n = g.nodes[i];
    if (n.op != ir::Op::Data) continue;
    const int64_t numel = lockstep::shape_numel(n.shape);
    std::vector<float> v = values(static_cast<size_t>(numel), static_cast<uint32_t>(i + 7));
    if (numel == 1) v[0] = corners[(corner + i) % corners.size()];
    mem[i].resize(static_cast<size_t>(numel) * lockstep::dtype_size(n.dtype));
    for (int64_t k = 0; k < numel; ++k) {
      if (n.dtype == DType::F32) {
        std::memcpy(mem[i].data() + k * 4, &v[k], 4);
      } else if (n.dtype == DType::BF16) {
        const uint16_t b = lockstep::bfloat16(v[k]).bits;
        std::memcpy(mem[i].data() + k * 2, &b, 2);
      } else {  // bool: every third value true, and the rest from the sign
        mem[i][k] = (k % 3 == 0) || v[k] > 0.0f;
      }
    }
  }
  return mem;
}

// The tree's result bytes, run as a program runs it (run_group, tile by tile).
std::vector<unsigned char> run(const cpu::FusedTree& t, const ir::Graph& g,
                               std::vector<std::vector<unsigned char>>& mem) {
  const ir::GraphNode& root = g.nodes.back();
  std::vector<unsigned char> out(static_cast<size_t>(lockstep::shape_numel(root.shape)) *
                                 lockstep::dtype_size(root.dtype));
  std::vector<void*> ptr(g.nodes.size(), nullptr);
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (!mem[i].empty()) ptr[i] = mem[i].data();
  cpu::RunBuffers expanded;
  const std::vector<const void*> leaves = t.bind(ptr, expanded);
  cpu::FusedTree::run_group({&t}, {leaves}, {out.data()});
  return out;
}

std::string unary(const std::string& op, const char* in, const char* out, int64_t n = 1000) {
  return cat("%0 = data(#0) ", in, "[", n, "]\n%1 = ", op, "(%0) ", out, "[", n, "]\n");
}

std::vector<Case> cases() {
  std::vector<Case> cs;
  for (const char* op : {"neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu",
                         "sin", "cos", "erf", "gelu", "gelu_derivative", "floor", "ceil", "sign"}) {
    cs.push_back(make_case(cat(op, " f32"), unary(op, "f32", "f32")));
    cs.push_back(make_case(cat(op, " bf16"), unary(op, "bf16", "bf16")));
  }
  for (const char* op : {"logical_not", "is_finite"}) {
    cs.push_back(make_case(cat(op, " f32"), unary(op, "f32", "bool")));
    cs.push_back(make_case(cat(op, " bool"), unary(op, "bool", "bool")));
  }
  cs.push_back(make_case("cast f32 to bool", unary("cast", "f32", "bool")));
  cs.push_back(make_case("cast f32 to bf16", unary("cast", "f32", "bf16")));
  cs.push_back(make_case("cast bf16 to f32 (then exp)",
                         "%0 = data(#0) bf16[1000]\n%1 = cast(%0) f32[1000]\n"
                         "%2 = exp(%1) f32[1000]\n"));
  cs.push_back(make_case("cast bool to f32 (then add)",
                         "%0 = data(#0) bool[1000]\n%1 = cast(%0) f32[1000]\n"
                         "%2 = data(#1) f32[1000]\n%3 = add(%1, %2) f32[1000]\n"));
  for (const char* op :
       {"add", "sub", "mul", "div", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge"}) {
    const std::string r = std::string(op).size() == 2 ? "bool" : "f32";
    const std::string rb = r == "bool" ? "bool" : "bf16";
    cs.push_back(
        make_case(cat(op, " tiles"), cat("%0 = data(#0) f32[1000]\n%1 = data(#1) f32[1000]\n",
                                         "%2 = ", op, "(%0, %1) ", r, "[1000]\n")));
    cs.push_back(make_case(cat(op, " by one value"),
                           cat("%0 = data(#0) f32[1000]\n%1 = data(#1) f32[]\n%2 = expand(%1) "
                               "f32[1000]\n%3 = ",
                               op, "(%0, %2) ", r, "[1000]\n")));
    cs.push_back(make_case(cat(op, " of one value"),
                           cat("%0 = data(#0) f32[]\n%1 = expand(%0) f32[40, 25]\n"
                               "%2 = data(#1) f32[25]\n%3 = expand(%2) f32[40, 25]\n%4 = ",
                               op, "(%1, %3) ", r, "[40, 25]\n")));
    cs.push_back(make_case(cat(op, " bf16"), cat("%0 = data(#0) bf16[1000]\n%1 = data(#1) "
                                                 "bf16[1000]\n%2 = ",
                                                 op, "(%0, %1) ", rb, "[1000]\n")));
  }
  for (const char* op : {"logical_and", "logical_or"})
    cs.push_back(make_case(op, cat("%0 = data(#0) bool[1000]\n%1 = data(#1) bool[1000]\n%2 = ", op,
                                   "(%0, %1) bool[1000]\n")));
  cs.push_back(make_case("where",
                         "%0 = data(#0) bool[1000]\n%1 = data(#1) f32[1000]\n"
                         "%2 = data(#2) f32[1000]\n%3 = where(%0, %1, %2) f32[1000]\n"));
  // A root `where` of one condition: each side only its own instructions (both sides run).
  for (const char* flag : {"1", "0"})
    cs.push_back(make_case(cat("where of one condition ", flag),
                           cat("%0 = data(#0) bool[]\n%1 = data(#1) f32[1000]\n%2 = data(#2) "
                               "f32[1000]\n%3 = exp(%1) f32[1000]\n%4 = mul(%2, %2) f32[1000]\n"
                               "%5 = expand(%0) bool[1000]\n%6 = where(%5, %3, %4) f32[1000]\n")));
  // ... and with a side that is a leaf as it is: one value, or a tile.
  for (const char* side : {"f32[]", "f32[1000]"})
    for (const char* flag : {"1", "0"})
      cs.push_back(make_case(
          cat("where of one condition ", flag, ", a side a leaf ", side),
          cat("%0 = data(#0) bool[]\n%1 = data(#1) ", side, "\n%2 = expand(%1) f32[1000]\n",
              "%3 = data(#2) f32[1000]\n%4 = exp(%3) f32[1000]\n%5 = expand(%0) bool[1000]\n"
              "%6 = where(%5, %2, %4) f32[1000]\n")));
  // Multiplies folded into a sum, and a relu into it (fold_scaled_sums), f32 and bf16.
  cs.push_back(make_case("scaled sums and relu",
                         "%0 = data(#0) f32[1000]\n%1 = data(#1) f32[1000]\n%2 = data(#2) f32[]\n"
                         "%3 = expand(%2) f32[1000]\n%4 = mul(%0, %3) f32[1000]\n"
                         "%5 = mul(%1, %0) f32[1000]\n%6 = sub(%4, %5) f32[1000]\n"
                         "%7 = relu(%6) f32[1000]\n%8 = add(%7, %1) f32[1000]\n"));
  cs.push_back(make_case("bf16 sum and relu",
                         "%0 = data(#0) bf16[1000]\n%1 = data(#1) bf16[1000]\n"
                         "%2 = add(%0, %1) bf16[1000]\n%3 = relu(%2) bf16[1000]\n"
                         "%4 = mul(%3, %0) bf16[1000]\n"));
  // A bias over rows (a period read in place) and a per-row value (a broadcast run), GELU's
  // backward as a GPT's step has it, with 13 values past the last whole vector.
  cs.push_back(make_case("gelu backward over rows",
                         "%0 = data(#0) f32[9, 333]\n%1 = data(#1) f32[9, 333]\n"
                         "%2 = data(#2) f32[333]\n%3 = expand(%2) f32[9, 333]\n"
                         "%4 = add(%1, %3) f32[9, 333]\n%5 = gelu_derivative(%4) f32[9, 333]\n"
                         "%6 = mul(%0, %5) f32[9, 333]\n%7 = data(#3) f32[9, 1]\n"
                         "%8 = expand(%7) f32[9, 333]\n%9 = div(%6, %8) f32[9, 333]\n"));
  return cs;
}

}  // namespace

TEST(NativeTrees, ComputeWhatTheInterpreterComputesBitForBit) {
  if (cpu::math_isa() == cpu::MathIsa::Scalar) GTEST_SKIP() << "native code needs AVX2";
  std::vector<Case> cs = cases();
  std::vector<std::shared_ptr<cpu::FusedTree>> trees;
  for (Case& c : cs) {
    ASSERT_FALSE(c.native->native_source("k").empty()) << c.name << " has no native code";
    trees.push_back(c.native);
  }
  cpu::compile_native(trees, cpu::NativeMode::Now);
  for (Case& c : cs) {
    SCOPED_TRACE(c.name + ":\n" + c.text);
    ASSERT_TRUE(c.native->has_native()) << "not compiled (see stderr)";
    ASSERT_FALSE(c.interpreted->has_native());
    bool one_value = false;
    for (const ir::GraphNode& n : c.g.nodes)
      one_value |= n.op == ir::Op::Data && lockstep::shape_numel(n.shape) == 1;
    for (size_t corner = 0; corner < (one_value ? 20 : 1); ++corner) {
      SCOPED_TRACE(cat("one-value operands from corner value ", corner));
      std::vector<std::vector<unsigned char>> mem = inputs(c.g, corner);
      const std::vector<unsigned char> want = run(*c.interpreted, c.g, mem);
      const std::vector<unsigned char> got = run(*c.native, c.g, mem);
      ASSERT_EQ(want.size(), got.size());
      // Bit for bit, but for which NaN: x86 passes on one operand's NaN, and which one depends
      // on the order the compiler gave a commutative op's operands (no consumer reads a NaN's
      // sign or payload).
      const DType dt = c.g.nodes.back().dtype;
      const size_t size = lockstep::dtype_size(dt), n = want.size() / size;
      auto value = [&](const std::vector<unsigned char>& v, size_t i) {
        if (dt == DType::F32)
          return std::bit_cast<float>(
              static_cast<uint32_t>(v[4 * i] | v[4 * i + 1] << 8 | v[4 * i + 2] << 16 |
                                    static_cast<uint32_t>(v[4 * i + 3]) << 24));
        if (dt == DType::BF16)
          return std::bit_cast<float>(static_cast<uint32_t>((v[2 * i] | v[2 * i + 1] << 8) << 16));
        return static_cast<float>(v[i]);
      };
      size_t differ = 0, first = n;
      for (size_t i = 0; i < n; ++i) {
        const float w = value(want, i), g = value(got, i);
        const bool same = (std::isnan(w) && std::isnan(g)) ||
                          std::memcmp(&want[i * size], &got[i * size], size) == 0;
        if (!same && differ++ == 0) first = i;
      }
      EXPECT_EQ(differ, 0u) << "values differ, the first at " << first << ": "
                            << (first < n ? value(want, first) : 0.0f) << " against "
                            << (first < n ? value(got, first) : 0.0f);
    }
  }
}

// Written in place over a leaf (an optimizer's update), the native loop reads each element
// before it writes it, as the interpreter does.
TEST(NativeTrees, UpdateInPlaceOverTheirLeaf) {
  if (cpu::math_isa() == cpu::MathIsa::Scalar) GTEST_SKIP() << "native code needs AVX2";
  Case c = make_case("in place",
                     "%0 = data(#0) f32[1000]\n%1 = data(#1) f32[1000]\n"
                     "%2 = mul(%1, %1) f32[1000]\n%3 = sqrt(%2) f32[1000]\n"
                     "%4 = sub(%0, %3) f32[1000]\n");
  cpu::compile_native({c.native}, cpu::NativeMode::Now);
  ASSERT_TRUE(c.native->has_native());
  std::vector<std::vector<unsigned char>> a = inputs(c.g), b = inputs(c.g);
  for (auto [tree, mem] : {std::pair{c.interpreted.get(), &a}, std::pair{c.native.get(), &b}}) {
    std::vector<void*> ptr(c.g.nodes.size(), nullptr);
    ptr[0] = (*mem)[0].data();
    ptr[1] = (*mem)[1].data();
    cpu::RunBuffers expanded;
    const std::vector<const void*> leaves = tree->bind(ptr, expanded);
    cpu::FusedTree::run_group({tree}, {leaves}, {ptr[0]});
  }
  EXPECT_EQ(a[0], b[0]);
}

// Ops native code does not compute keep their tree on the interpreter, and so does a tree
// longer than native code takes; neither stops the others of a module.
TEST(NativeTrees, LeaveWhatTheyDoNotComputeToTheInterpreter) {
  for (const char* op : {"pow", "fmod"}) {
    Case c = make_case(
        op, cat("%0 = data(#0) f32[64]\n%1 = data(#1) f32[64]\n%2 = ", op, "(%0, %1) f32[64]\n"));
    EXPECT_TRUE(c.native->native_source("k").empty()) << op;
  }
  std::string chain = "%0 = data(#0) f32[64]\n%1 = data(#1) f32[64]\n";
  for (int i = 2; i < 1000; ++i) chain += cat("%", i, " = add(%", i - 1, ", %0) f32[64]\n");
  EXPECT_TRUE(make_case("chain", chain).native->native_source("k").empty());
}

// A row program's staged tree (a softmax over rows of 100 with an affine input, reduced to the
// rows' max and sum), its stages as native code: each stage's values, the reductions and the
// values a later stage reads from an earlier one (exported) are the interpreter's bit for bit,
// over 37 rows (a partial last tile). Also with a first stage that is a bf16 input widened: a
// value the interpreter passes on from its operand's tile, which native code stores anew.
class NativeStages : public testing::TestWithParam<const char*> {};
INSTANTIATE_TEST_SUITE_P(F32AndWidenedBf16, NativeStages,
                         testing::Values("%3 = mul(%0, %2) f32[37, 100]\n%4 = data(#2) f32[]\n"
                                         "%5 = expand(%4) f32[37, 100]\n"
                                         "%6 = add(%3, %5) f32[37, 100]\n",
                                         "%3 = data(#2) bf16[37, 100]\n%4 = mul(%0, %2) "
                                         "f32[37, 100]\n%5 = exp(%4) f32[37, 100]\n"
                                         "%6 = cast(%3) f32[37, 100]\n"));
TEST_P(NativeStages, RunARowProgramsStagesAsTheInterpreterDoes) {
  if (cpu::math_isa() == cpu::MathIsa::Scalar) GTEST_SKIP() << "native code needs AVX2";
  const std::string text = std::string("%0 = data(#0) f32[37, 100]\n%1 = data(#1) f32[100]\n") +
                           "%2 = expand(%1) f32[37, 100]\n" + GetParam() +
                           "%7 = data(#3) f32[37, 1]\n%8 = expand(%7) f32[37, 100]\n"
                           "%9 = sub(%6, %8) f32[37, 100]\n%10 = exp(%9) f32[37, 100]\n"
                           "%11 = data(#4) f32[37, 1]\n%12 = expand(%11) f32[37, 100]\n"
                           "%13 = div(%10, %12) f32[37, 100]\n%14 = mul(%13, %2) f32[37, 100]\n";
  SCOPED_TRACE(text);
  const ir::Graph g = ir::from_text(text);
  std::vector<bool> absorbed(g.nodes.size());
  for (size_t i = 0; i < absorbed.size(); ++i) absorbed[i] = g.nodes[i].op != ir::Op::Data;
  auto staged = [&] {
    return std::make_shared<cpu::FusedTree>(g, std::vector<int32_t>{6, 10, 14},
                                            std::vector<bool>{true, true, true}, absorbed, 100);
  };
  const auto interpreted = staged(), native = staged();
  ASSERT_FALSE(native->native_source("k").empty());
  cpu::compile_native({native}, cpu::NativeMode::Now);
  ASSERT_TRUE(native->has_native());
  std::vector<std::vector<float>> results[2];
  for (int k = 0; k < 2; ++k) {
    const cpu::FusedTree& t = k == 0 ? *interpreted : *native;
    std::vector<std::vector<unsigned char>> mem = inputs(g, 3);
    std::vector<float> max(37), sum(37), out(3700);
    std::vector<void*> ptr(g.nodes.size(), nullptr);
    for (size_t i = 0; i < g.nodes.size(); ++i)
      if (!mem[i].empty()) ptr[i] = mem[i].data();
    cpu::RunBuffers expanded;
    const std::vector<const void*> leaves = t.bind(ptr, expanded);
    cpu::FusedTree::run_rows(t, leaves,
                             {{0, ir::Op::Max, nullptr, {}, max.data()},
                              {1, ir::Op::Sum, nullptr, {}, sum.data()},
                              {2, ir::Op::Data, nullptr, {}, out.data()}});
    results[k] = {max, sum, out};
  }
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE(cat("result ", r));
    const std::vector<float>&w = results[0][r], &n = results[1][r];
    for (size_t i = 0; i < w.size(); ++i)
      ASSERT_TRUE((std::isnan(w[i]) && std::isnan(n[i])) ||
                  std::bit_cast<uint32_t>(w[i]) == std::bit_cast<uint32_t>(n[i]))
          << "at " << i << ": " << w[i] << " against " << n[i];
  }
}
