// The cpu backend's own passes over a plan::Plan, and what its steps run. The compiler
// (cpu_backend.cpp) runs, in order:
//   fold_constants     constants.cpp    values computed once at compile time
//   choose_fusion      plan/fusion.cpp  which elementwise nodes fuse into their consumers
//                                       (with the cpu's rules: fusion_rules())
//   choose_layouts     layouts.cpp      which activations stay in oneDNN's nChw16c layout
//   choose_conv_algorithms  conv_algorithms.cpp  which convolutions run as Winograd
//   fuse_attention     attention.cpp    attentions written from primitives run as one forward
//                                       and one backward step, their scores never in memory
//   lower              lower.cpp        the kernel that runs each node (oneDNN, fused trees,
//                                       own kernels), a step each
//   drop_unread_steps  plan/steps.cpp
//   merge_sums         merge.cpp        sums over one layout walked together
//   merge_fused_steps  merge.cpp        fused steps run tile by tile together
//   schedule           plan/schedule.cpp
//   add_checks         plan/checks.cpp  index checks first
//   bucket_all_reduces collectives.cpp  DataParallel's gradient all-reduces in buckets, each
//                                       started after its last gradient, waited for before its
//                                       first reader
//   prefetch_gathers   collectives.cpp  fully_shard's gathers started as early as the bytes in
//                                       flight allow
//   join_broadcasts    collectives.cpp  broadcasts received straight into their concatenation
//   overlap_broadcasts collectives.cpp  the other broadcasts in flight together, each waited for
//                                       before its first reader
//   share_conv_copies  conv_copies.cpp  one copy of a value for the convolutions that read it
//   plan_memory        plan/memory.cpp  arena, aliases, donations, planned bytes
// and the executable (executable.cpp) runs the plan.
#pragma once

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "backends/cpu/dnnl_ops.h"
#include "backends/cpu/fused.h"
#include "plan/passes.h"
#include "plan/pipeline.h"

namespace lockstep::backends::cpu {

// What a running step sees.
struct Ctx {
  std::vector<void*> ptr;  // per node: where its value is
  const std::vector<ir::ScalarValue>* scalars;
  float* copies = nullptr;  // convolution operands' shared copies (see share_conv_copies)
  // This run's regions (plan::Plan::regions), which values placed there live in.
  const std::vector<std::shared_ptr<Storage>>* regions = nullptr;
  // This run's arena (kept alive by a collective that writes there: a gather in flight).
  std::shared_ptr<Storage> arena;
  // Per node, the memory of an output (set once the outputs are allocated).
  const std::vector<std::shared_ptr<Storage>>* outputs = nullptr;
  // All of this run's memory (the arena, the regions, the outputs), made on first use: what a
  // collective in flight keeps alive, wherever it writes, should a later step fail.
  std::shared_ptr<void> held();

 private:
  std::shared_ptr<void> held_;
  bool held_outputs_ = false;
};

// Trees of a fused elementwise step with the node each writes: one, or several that
// merge_fused_steps joined to run tile by tile together.
using FusedMembers = std::vector<std::pair<int32_t, std::shared_ptr<FusedTree>>>;

// A sum over one input layout, read through a fused tree (an absorbed operand) or else straight
// from the node `input`.
struct SumOf {
  Shape in;
  std::vector<int64_t> attrs;
  std::shared_ptr<FusedTree> tree;
  int32_t input = -1;
  DType input_dtype = DType::F32;  // of `input`: f32 or bf16 (widened as it is read)
  bool bf16_out = false;           // the sum is written as bf16 (rounded from f32)
};
// Sums over the same layout with the node each writes: one, or several joined by merge_sums.
using SumParts = std::vector<std::pair<int32_t, std::shared_ptr<SumOf>>>;

struct AttentionFusion;  // attention.cpp

// The cpu backend's own decisions per node (plan::Plan::decisions).
struct CpuDecisions final : plan::BackendDecisions {
  explicit CpuDecisions(size_t nodes) : blocked(nodes), walk_blocked(nodes), winograd(nodes) {}
  std::vector<bool> blocked;       // held in oneDNN's nChw16c layout (layouts.cpp)
  std::vector<bool> walk_blocked;  // a sum that walks its input in the blocked order
  std::vector<bool> winograd;      // a convolution run as oneDNN's Winograd (conv_algorithms.cpp)
  // The fused attention whose step is lowered at this node (fuse_attention), or null.
  std::vector<std::shared_ptr<const AttentionFusion>> attention;
  std::string describe(int32_t node) const override;
  const char* mark(int32_t value) const override;
  const char* step_mark(int32_t node) const override;
};
// The plan's cpu decisions, made (all plain, none Winograd) on first use.
CpuDecisions& decisions(plan::Plan& p);
// Whether each value is held blocked (all false before the layout pass).
std::vector<bool> blocked_values(const plan::Plan& p);

// A cpu step's kernel: plan::Step::payload.
struct CpuStep final : plan::StepPayload {
  std::function<void(Ctx&)> run;
  // The check of operand plan::Step::checked, which add_checks moves to a step of its own.
  std::function<void(Ctx&)> check;
  std::shared_ptr<FusedMembers> fused;  // fused elementwise steps
  std::shared_ptr<FusedTree> rows;      // a row program's staged tree (merge_row_steps)
  std::shared_ptr<SumOf> sum;           // a single sum that merge_sums may join
  std::shared_ptr<DnnlConv> conv;       // oneDNN convolutions
  std::shared_ptr<plan::StepPayload> take_check() override;
};
inline CpuStep& kernel(plan::Step& s) { return static_cast<CpuStep&>(*s.payload); }
inline const CpuStep& kernel(const plan::Step& s) {
  return static_cast<const CpuStep&>(*s.payload);
}

// The passes (see above), and the list the compiler runs.
const std::vector<plan::Pass>& pipeline();
void fold_constants(plan::Plan& p);
plan::FusionRules fusion_rules();
void choose_layouts(plan::Plan& p);
void choose_conv_algorithms(plan::Plan& p);
void fuse_attention(plan::Plan& p);
void lower(plan::Plan& p);
void merge_row_steps(plan::Plan& p);
void merge_sums(plan::Plan& p);
void merge_fused_steps(plan::Plan& p);
void share_conv_copies(plan::Plan& p);
void bucket_all_reduces(plan::Plan& p);
void prefetch_gathers(plan::Plan& p);
void join_broadcasts(plan::Plan& p);
void overlap_broadcasts(plan::Plan& p);

// Kernels for steps the passes build or rebuild.
std::function<void(Ctx&)> run_fused(std::shared_ptr<const FusedMembers> members);
std::function<void(Ctx&)> run_sums(SumParts parts);
// Runs a oneDNN convolution; copy[k] places operand k's copy in oneDNN's layout among the shared
// copies: {offset in floats, whether this step writes it}, or offset -1 for the scratch.
std::function<void(Ctx&)> run_conv_step(std::shared_ptr<DnnlConv> conv, int32_t x, int32_t y,
                                        int32_t id, std::pair<int64_t, bool> copy0 = {-1, false},
                                        std::pair<int64_t, bool> copy1 = {-1, false});
// The plan's elementwise members of a fused step (for plan_memory's donations).
std::vector<plan::Member> members_of(const FusedMembers& fused);

// Which kernel takes a node (lower.cpp), for the passes that decide around those kernels.
bool is_f32(const ir::Graph& g, int32_t id);
// f32 operands and result with no empty dimension (what the specialized kernels take).
bool all_f32(const ir::Graph& g, int32_t id);
// The same, all bf16 (what the oneDNN bf16 kernels take).
bool all_bf16(const ir::Graph& g, int32_t id);
// A sum that reads or writes bf16 (f32 or bf16 on either side; summed in f32).
bool bf16_sum(const ir::Graph& g, int32_t id);
// A convolution (or gradient) oneDNN runs.
bool dnnl_conv(const ir::Graph& g, int32_t id);
// Our max pooling kernel (values, indices or the gradient), which reads and writes the blocked
// layout as well as the plain one.
bool blockable_pool(const ir::Graph& g, int32_t id);
// A sum over `in` read in blocked order: 4-D and blockable, summing over the channels or over
// the whole feature map, so that its results come out in plain order.
bool sum_takes_blocked(const Shape& in, const std::vector<int64_t>& attrs);
// A sum's input shape and attrs as it walks a blocked value: [N, C/16, H, W, 16].
std::pair<Shape, std::vector<int64_t>> blocked_sum(const Shape& in,
                                                   const std::vector<int64_t>& attrs);

}  // namespace lockstep::backends::cpu
