// The conformance harness: runs one recorded computation on the `cpu` backend and on `ref` (the
// oracle) from the same host inputs and compares every output with a tolerance per dtype.
// Each test declares the primitive ops it covers (LS_COVERS); the harness checks that they really
// appear in the recorded graphs, and coverage_test.cpp fails if an op of the table has no case.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include <lockstep/lockstep.h>
#include "ir/ir.h"

namespace conformance {

namespace ls = lockstep;
using ls::ir::Op;

// How an input's values are drawn.
enum class Fill {
  Normal,     // floats N(0, 1); integers in [-9, 9]; bools 50/50
  Positive,   // floats in [0.25, 3]; integers in [1, 9]
  Special,    // Normal mixed with NaN, +-inf, +-0, huge and denormal values (integers: extremes)
  NonFinite,  // Normal mixed with NaN, +-inf, +-0 and denormals, but no huge finite values
              // (sums of those overflow in f32 but not in ref's f64 accumulators)
  Range,      // whole numbers uniform in [lo, hi), also for float dtypes (so there are ties)
  Distinct,   // a shuffled ramp: no ties (for argmax, pooling indices)
};

struct In {
  ls::Shape shape;
  ls::DType dtype = ls::f32;
  Fill fill = Fill::Normal;
  int64_t lo = 0, hi = 0;  // Fill::Range
};

using Tensors = std::vector<ls::Tensor>;
using Fn = std::function<Tensors(const Tensors&)>;
using Fn1 = std::function<ls::Tensor(const Tensors&)>;

// Runs fn on cpu and on ref with the same inputs (and the same random seed) and compares each
// output: same shape and dtype; integers and bools exactly; floats within
// |got - want| <= atol * k + rtol * |want| (f32: 1e-6, 1e-5; f64: 1e-12, 1e-12; bf16: 1e-5 and
// one unit in the last place, 2^-7), where `k` is the
// length of the longest reduction behind an output (1 for elementwise ops). NaN matches NaN and
// infinities match exactly. Returns false (after reporting the failure) on a mismatch.
bool check(const std::string& what, const std::vector<In>& inputs, const Fn& fn, double k = 1);
bool check1(const std::string& what, const std::vector<In>& inputs, const Fn1& fn, double k = 1);

// Host values of a tensor as doubles (for any dtype) and its dtype-exact integer values.
std::vector<double> values_f64(const ls::Tensor& t);

// Shapes worth testing: 0-d, size-1, empty, odd sizes, and one or two over 100k elements.
std::vector<ls::Shape> shapes_small();
std::vector<ls::Shape> shapes_all();
std::string str(const ls::Shape& s);
std::string str(ls::DType d);

// Records that `test` covers `ops` (at static-initialization time); returns true.
bool declare(const char* test, std::initializer_list<Op> ops);
// Every test's declared ops, by test name ("Suite.Name").
const std::vector<std::pair<std::string, std::vector<Op>>>& declared();
// Ops seen in the graphs this process compared so far.
std::vector<bool>& seen_ops();

// Fixture of every conformance test: after the test, each op it declared must have appeared in
// a compared graph.
class Conformance : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;
};

}  // namespace conformance

// Declares the ops a TEST_F(Conformance..., name) covers. Put it just before the test.
#define LS_COVERS(suite, name, ...)                                  \
  [[maybe_unused]] static const bool ls_covers_##suite##_##name##_ = \
      ::conformance::declare(#suite "." #name, {__VA_ARGS__})
