// Conformance of whole programs rather than single ops: compiled programs rerun from the cache
// with new data and new host scalars, other thread counts (other tile and row partitions), and
// outputs that are leaves of the program (scalars, broadcasts of scalars, inputs reshaped).
#include "conformance.h"

namespace conformance {
namespace {

class Program : public Conformance {};

// A mixed program: convolution, pooling, matmul with a transposed operand, fused trees with
// broadcasts and masks, reductions, permutes and slices, and a host scalar `s`. Masks and pooling
// indices come from values both backends compute exactly, so rounding cannot flip them.
Tensors mixed(const Tensors& v, double s) {
  ls::Conv2dOptions conv;
  conv.padding = {1, 1};
  ls::Pool2dOptions pool;
  pool.kernel = {2, 2};
  const ls::Tensor y = ls::relu(ls::conv2d(v[0], v[1], conv) * s + v[2]);  // [4, 8, 40, 41]
  const auto [p, idx] = ls::max_pool2d_with_indices(v[0] * s, pool);       // [4, 3, 20, 20]
  const ls::Tensor flat = ls::reshape(ls::max_pool2d(y, pool), {32, 400});
  const ls::Tensor h = ls::matmul(flat, ls::transpose(v[3], 0, 1));  // [32, 50]
  const ls::Tensor mask = ls::transpose(ls::slice(v[3], 1, 0, 32), 0, 1) > 0.0f;
  const ls::Tensor m = ls::where(mask, ls::exp(-ls::abs(h)), h * s);
  const ls::Tensor t = ls::permute(y, {0, 2, 3, 1});
  return {ls::sum(m, {1}),
          ls::mean(y, {0, 2, 3}),
          idx,
          ls::slice(t, 1, 3, 40, 3),
          ls::max_pool2d_backward(p * 0.5f, idx, v[0].shape(), pool),
          ls::max(h)};
}

const std::vector<In> kMixedInputs = {
    {{4, 3, 40, 41}}, {{8, 3, 3, 3}}, {{8, 1, 1}}, {{50, 400}, ls::f32, Fill::Range, -1, 2}};

LS_COVERS(Program, CachedProgramsRerun, Op::Conv2d, Op::MaxPool2dIndices, Op::MatMul, Op::Where,
          Op::Permute, Op::Slice, Op::MaxPool2dBackward);
TEST_F(Program, CachedProgramsRerun) {
  // Same graph every time (the data and the scalar are runtime inputs): one compile per device,
  // then cache hits that must recompute everything from the new values.
  for (int run = 0; run < 3; ++run) {
    const double s = 0.25 + run;
    check(
        "mixed program run " + std::to_string(run), kMixedInputs,
        [s](const Tensors& v) { return mixed(v, s); }, 400 * 27);
  }
}

LS_COVERS(Program, ThreadCounts, Op::Conv2d, Op::MatMul, Op::Sum, Op::Permute);
TEST_F(Program, ThreadCounts) {
  for (int threads : {1, 3, 8}) {
    ls::set_num_threads(threads);
    const std::string n = std::to_string(threads) + " threads";
    check(
        "mixed program, " + n, kMixedInputs, [](const Tensors& v) { return mixed(v, 0.5); },
        400 * 27);
    check(
        "large reductions, " + n, {{{8, 64, 17, 13}}},
        [](const Tensors& v) {
          return Tensors{ls::sum(ls::exp(v[0] * 0.5f), {0, 2, 3}), ls::max(v[0], {1}),
                         ls::sum(v[0]), ls::permute(v[0], {3, 1, 0, 2}) + 1.0f};
        },
        113152);
  }
  ls::set_num_threads(0);
}

LS_COVERS(Program, LeafOutputs, Op::Scalar, Op::Expand, Op::Reshape, Op::Iota);
TEST_F(Program, LeafOutputs) {
  check("creation outputs", {{{3, 4}}}, [](const Tensors& v) {
    return Tensors{ls::scalar_tensor(2.5),    ls::full({2, 3}, 7),
                   ls::zeros({0, 3}),         ls::ones({5}, ls::i64),
                   ls::zeros_like(v[0]),      ls::full_like(v[0], -1.5),
                   ls::reshape(v[0], {4, 3}), ls::reshape(v[0], {-1}) * 1.0f,
                   ls::arange(0, 10, 3),      ls::full({}, true, ls::boolean)};
  });
}

}  // namespace
}  // namespace conformance
