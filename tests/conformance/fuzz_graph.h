// The fuzzer's random graph builder: from a seed, a valid graph of 5-40 public-API ops over
// floating values (elementwise with broadcasting and bool masks, reductions, movement, indexing,
// matmul, convolution, pooling). Every choice depends only on the seed and on shapes, never on
// the dtype, device or values, so one seed records the same graph on every backend and dtype.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <lockstep/lockstep.h>

namespace conformance {

// The most elements a value of a fuzz graph may have.
inline constexpr int64_t kFuzzMaxNumel = 4096;

struct FuzzValue {
  lockstep::Tensor t;
  // Computed bit for bit alike by every backend (no floating reduction behind it): only such
  // values feed discontinuous ops, and they are compared exactly.
  bool exact = true;
  // A bound on how far cpu's f32 values may be from ref's, in units of f32's unit roundoff
  // (2^-24): it starts at reductions (cpu accumulates in f32, ref in f64) and grows through later
  // ops by their derivatives. 0 for exact values.
  double err = 0;
  double bound = 1;  // a bound on |values|, kept small so nothing overflows
};

// The error (as FuzzValue::err) of accumulating n terms of magnitude <= term in f32.
inline double accumulation_error(double n, double term) {
  return 2 * (1 + std::log2(n + 1)) * n * term;
}

class FuzzGraph {
 public:
  FuzzGraph(uint64_t seed, lockstep::DType dtype, lockstep::Device device);
  void build();
  const std::vector<FuzzValue>& outputs() const { return outputs_; }
  int num_ops() const { return ops_; }
  // What the builder did, one line per step (to read with the IR text of a failing graph).
  const std::string& log() const { return log_; }

 private:
  using Shape = lockstep::Shape;
  int64_t uni(int64_t lo, int64_t hi);  // inclusive
  bool coin(double p);
  size_t pick(bool exact_only = false);  // index of a value; prefers recent ones
  FuzzValue input(const Shape& shape, double lo = -2, double hi = 2);
  lockstep::Tensor index_input(const Shape& shape, int64_t n);
  void add(FuzzValue v, const std::string& what);
  FuzzValue squashed(const FuzzValue& v);  // tanh(v) when v's bound is large
  Shape random_shape(int max_rank);
  // A shape b such that a op b broadcasts, and its result's shape.
  Shape broadcast_partner(const Shape& a);

  bool unary();
  bool binary();
  bool mask();
  bool reduce();
  bool movement();
  bool indexing();
  bool matmul();
  bool conv();
  bool pool();
  bool leaf();

  std::mt19937_64 rng_;
  uint64_t seed_;
  lockstep::DType dtype_;
  lockstep::Device device_;
  int inputs_ = 0, ops_ = 0;
  std::vector<FuzzValue> values_, outputs_;
  std::string log_;
};

}  // namespace conformance
