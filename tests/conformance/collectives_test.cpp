// The collectives (dist/) in a one-process world, where they exchange nothing: all_reduce is x
// times its scale, broadcast is x, on cpu as on ref; and the gradients DataParallel
// averages go through the cpu's bucket pass (packed into buckets by size, the scaled sums
// unpacked).
#include "conformance.h"
#include "dist/comm.h"
#include "ir/attrs.h"
#include "lockstep/dist.h"
#include "tensor/frontend.h"

namespace conformance {
namespace {

class Collectives : public Conformance {};

LS_COVERS(Collectives, AllReduceAndBroadcast, Op::AllReduce, Op::Broadcast);
TEST_F(Collectives, AllReduceAndBroadcast) {
  for (const ls::Shape& s : shapes_small()) {
    // bf16 sums in f32 and rounds once; integer sums take no scale.
    for (ls::DType dt : {ls::f32, ls::f64, ls::i32, ls::i64, ls::u8, ls::bf16})
      for (double scale : {1.0, ls::is_floating(dt) ? 0.25 : 1.0})
        check1("all_reduce " + str(s) + " " + str(dt) + " scale " + std::to_string(scale),
               {{s, dt}},
               [&](const Tensors& x) { return ls::dist::all_reduce(x[0] + x[0], scale); });
    for (ls::DType dt : {ls::f32, ls::i64, ls::boolean})
      check1("broadcast " + str(s) + " " + str(dt), {{s, dt}},
             [&](const Tensors& x) { return ls::dist::broadcast(x[0]); });
  }
}

// AllReduce nodes as DataParallel records them (order >= 0): buckets of 1 KiB after a first of
// 256 bytes, three dtypes and two scales among them, so buckets close at every rule.
LS_COVERS(Collectives, Buckets, Op::AllReduce);
TEST_F(Collectives, Buckets) {
  const std::vector<std::pair<ls::Shape, ls::DType>> grads = {
      {{10}, ls::f32},   {{7, 9}, ls::f32}, {{300}, ls::f32},   {{3}, ls::f64}, {{2, 2}, ls::f32},
      {{0, 4}, ls::f32}, {{5}, ls::i64},    {{33, 7}, ls::f32}, {{1}, ls::f32}};
  std::vector<In> in;
  for (const auto& [shape, dt] : grads) in.push_back({shape, dt});
  const int64_t before = ls::metrics::counter("all_reduce_buckets");
  check("bucketed gradients", in, [&](const Tensors& x) {
    // All the all-reduces first, then their readers: as DataParallel's step records them
    // (a reader before a later gradient's all-reduce would close the bucket).
    Tensors reduced, out;
    for (size_t k = 0; k < x.size(); ++k) {
      const double scale = x[k].dtype() == ls::i64 ? 1.0 : (k == 8 ? 0.5 : 0.125);
      const ls::Loc loc = ls::Loc::current();
      ls::Tensor g = x[k] * (x[k].dtype() == ls::i64 ? 3 : 2.0);
      reduced.push_back(ls::frontend::record(
          Op::AllReduce, {ls::frontend::node(g, "test", loc)},
          ls::ir::AllReduceAttrs{scale, static_cast<int64_t>(x.size() - k), 1024, 256}.encode(),
          loc, g.shape(), g.dtype()));
    }
    for (const ls::Tensor& r : reduced) out.push_back(r + (r.dtype() == ls::i64 ? 1 : 1.0));
    return out;
  });
  // In the order of the gradients: [k=8] (scale 1/2), [7], [6] (i64), [5, 4], [3] (f64), [2]
  // (1216 bytes: it closes its bucket), [1, 0].
  EXPECT_EQ(ls::metrics::counter("all_reduce_buckets") - before, 7);
}

}  // namespace
}  // namespace conformance
