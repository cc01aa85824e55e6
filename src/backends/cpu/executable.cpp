// The cpu executable: runs a compiled plan (plan::Plan with CpuStep kernels) step by step over
// one arena, allocating the outputs or taking over donated inputs, and keeps every donated input
// restorable while a data check may still fail.
#include "backends/cpu/executable.h"

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <string_view>

#include "backends/cpu/denormals.h"
#include "backends/cpu/native.h"
#include "backends/cpu/passes.h"
#include "dist/comm.h"
#include "runtime/metrics.h"
#include "runtime/profiler.h"
#include "util/check.h"

namespace lockstep::backends::cpu {

std::shared_ptr<void> Ctx::held() {
  // Made again once the outputs are allocated (a gather may start before them).
  if (!held_ || (outputs && !held_outputs_)) {
    struct Held {
      std::shared_ptr<Storage> arena;
      std::vector<std::shared_ptr<Storage>> regions, outputs;
    };
    auto h = std::make_shared<Held>();
    h->arena = arena;
    if (regions) h->regions = *regions;
    if (outputs) h->outputs = *outputs;
    held_ = std::move(h);
    held_outputs_ = outputs != nullptr;
  }
  return held_;
}

using plan::bytes_of;
using plan::Slot;

CpuExecutable::CpuExecutable(plan::Plan plan, int threads)
    : p_(std::move(plan)), threads_(threads) {
  // The elementwise trees, row programs and the trees sums read through get native code
  // (native.h).
  std::vector<std::shared_ptr<FusedTree>> trees;
  for (const plan::Step& s : p_.steps) {
    if (!s.payload) continue;
    const CpuStep& k = kernel(s);
    if (k.fused)
      for (const auto& member : *k.fused) trees.push_back(member.second);
    if (k.sum && k.sum->tree) trees.push_back(k.sum->tree);
    if (k.rows) trees.push_back(k.rows);
  }
  compile_native(trees);
}

void CpuExecutable::release_idle_memory() {
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return;  // running: its arena is in use
  arena_.reset();
  copies_.reset();
}

std::vector<std::shared_ptr<Storage>> CpuExecutable::run(
    const std::vector<std::shared_ptr<Storage>>& inputs,
    const std::vector<ir::ScalarValue>& scalars, const std::vector<bool>& donatable,
    const std::function<void()>& past_checks) {
  std::lock_guard<std::mutex> lock(mu_);
  if (omp_get_max_threads() != threads_) omp_set_num_threads(threads_);
  DenormalScope denormals(threads_);
  if (!arena_ && p_.arena_bytes) arena_ = alloc_host(p_.arena_bytes);
  if (!copies_ && p_.copies_bytes) copies_ = alloc_host(p_.copies_bytes);
  // The regions: in the arena (plan_memory), or fresh for every run when outputs placed there
  // are slices of them, which the caller keeps after the next run has begun.
  std::vector<std::shared_ptr<Storage>> regions(p_.regions.size());
  for (size_t r = 0; r < regions.size(); ++r)
    regions[r] = r < p_.region_at.size() && p_.region_at[r] >= 0 && arena_ && p_.regions[r]
                     ? slice_of(arena_, static_cast<size_t>(p_.region_at[r]), p_.regions[r])
                     : alloc_host(std::max<size_t>(p_.regions[r], 64));
  Ctx ctx;
  ctx.scalars = &scalars;
  ctx.regions = &regions;
  ctx.arena = arena_;
  ctx.copies = copies_ ? static_cast<float*>(copies_->data()) : nullptr;
  ctx.ptr.assign(p_.graph.nodes.size(), nullptr);
  // An alias (a reshape, a contiguous slice) lives at its offset in the memory of the value it
  // aliases, set before it (operands come first).
  auto alias_ptr = [&](const Slot& s) -> void* {
    void* of = ctx.ptr[s.index];
    return of ? static_cast<char*>(of) + s.offset : nullptr;
  };
  // Everything but the outputs first: the steps before the first output is written (those
  // that check the labels or token ids among them) run before the outputs take their memory.
  for (size_t i = 0; i < p_.graph.nodes.size(); ++i) {
    const Slot& s = p_.slot[i];
    switch (s.kind) {
      case Slot::None:
      case Slot::Output:
        break;
      // Empty values may have no storage (an arena of 0 bytes is never allocated).
      case Slot::Input:
        ctx.ptr[i] = inputs.at(s.index) ? inputs[s.index]->data() : nullptr;
        break;
      case Slot::Arena:
        ctx.ptr[i] = arena_ ? static_cast<char*>(arena_->data()) + s.index : nullptr;
        break;
      case Slot::Alias:
        ctx.ptr[i] = alias_ptr(s);
        break;
      case Slot::Constant:
        ctx.ptr[i] = static_cast<char*>(p_.constants->data()) + s.index;
        break;
      case Slot::Region:
        ctx.ptr[i] = static_cast<char*>(regions[static_cast<size_t>(s.region)]->data()) + s.index;
        break;
    }
  }
  size_t at = 0;  // the step running
  try {
    for (; at < p_.prefix; ++at) kernel(p_.steps[at]).run(ctx);
  } catch (const InternalError&) {
    throw;
  } catch (const std::exception& e) {
    arena_.reset();  // a gather still in flight may write there: the next run takes another
    backends::fail_at(p_.graph.nodes[p_.steps[at].node],
                      e);  // no output or donated input written yet
  }
  // Past the last check, a failure is a fault: the runtime drops its record of values to
  // restore (here, when every check ran in the prefix, before the outputs are allocated).
  const size_t checked = static_cast<size_t>(p_.last_can_fail + 1);
  if (checked <= p_.prefix && past_checks) past_checks();
  std::vector<std::shared_ptr<Storage>> outs(p_.graph.outputs.size());
  std::vector<std::shared_ptr<Storage>> out_of_node(p_.graph.nodes.size());
  // Outputs updated in place, and copies of the inputs they overwrite before a step that may
  // still fail: a failed run leaves every donated input as it was (Executable::run).
  std::vector<size_t> donated;
  std::vector<std::shared_ptr<Storage>> kept(p_.graph.outputs.size());
  for (size_t k = 0; k < p_.graph.outputs.size(); ++k) {
    const int32_t id = p_.graph.outputs[k];
    if (!out_of_node[id]) {
      // Updated in place when the planned donor input is free to take (see plan_donations).
      const int32_t j = p_.donor[k];
      if (j >= 0 && static_cast<size_t>(j) < donatable.size() && donatable[j] && inputs[j]) {
        out_of_node[id] = inputs[j];
        donated.push_back(k);
        if (p_.donor_step[k] < p_.last_can_fail) {
          kept[k] = alloc_host(inputs[j]->bytes());
          std::memcpy(kept[k]->data(), inputs[j]->data(), inputs[j]->bytes());
          runtime::count(runtime::Counter::InPlaceCopies);
        }
        runtime::count(runtime::Counter::InPlaceOutputs);
      } else if (p_.slot[id].kind == Slot::Region) {
        out_of_node[id] =
            slice_of(regions[static_cast<size_t>(p_.slot[id].region)],
                     static_cast<size_t>(p_.slot[id].index), bytes_of(p_.graph.nodes[id]));
      } else {
        out_of_node[id] = alloc_host(bytes_of(p_.graph.nodes[id]));
      }
    }
    outs[k] = out_of_node[id];
  }
  for (size_t i = 0; i < p_.graph.nodes.size(); ++i) {
    const Slot& s = p_.slot[i];
    if (s.kind == Slot::Output) ctx.ptr[i] = out_of_node[i]->data();
    if (s.kind == Slot::Alias) ctx.ptr[i] = alias_ptr(s);
  }
  ctx.outputs = &out_of_node;
  try {
    for (; at < p_.steps.size(); ++at) {
      if (at == checked && checked > p_.prefix && past_checks) past_checks();
      plan::Step& step = p_.steps[at];
      // OpenMPI moves a non-blocking collective along only inside MPI calls (which do its
      // shared-memory copies and sums on this thread: metrics timer all_reduce_progress).
      if (dist::detail::in_flight()) {
        const int64_t t0 = runtime::now_ns();
        dist::detail::progress();
        runtime::time_ns(runtime::Timer::AllReduceProgress, runtime::now_ns() - t0);
      }
      if (!profile_ && !runtime::prof::fine()) {
        kernel(step).run(ctx);
        continue;
      }
      const int64_t t0 = runtime::now_ns();
      kernel(step).run(ctx);
      const int64_t took = runtime::now_ns() - t0;
      if (runtime::prof::fine()) trace_step(step, t0, took);
      if (!profile_) continue;
      // LOCKSTEP_PROFILE=steps: a timer per step ("mat_mul %93[1024, 784]"), else per kind.
      std::string name;
      if (profile_steps_)
        name = util::cat(step.label, " %", step.node, shape_str(p_.graph.nodes[step.node].shape));
      runtime::time_kernel_ns(
          profile_steps_ ? std::string_view(name) : std::string_view(step.label), took);
    }
  } catch (const InternalError&) {
    throw;
  } catch (const std::exception& e) {
    arena_.reset();  // a gather still in flight may write there: the next run takes another
    // Donated inputs already overwritten get their copy back, or are reported lost.
    std::vector<int32_t> lost;
    for (size_t k : donated) {
      if (p_.donor_step[k] > static_cast<int>(at)) continue;  // not written yet
      const std::shared_ptr<Storage>& in = inputs[p_.donor[k]];
      if (kept[k])
        std::memcpy(in->data(), kept[k]->data(), in->bytes());
      else
        lost.push_back(p_.donor[k]);
    }
    backends::fail_at(p_.graph.nodes[p_.steps[at].node], e, std::move(lost));
  }
  return outs;
}

// Named as LOCKSTEP_PROFILE=steps names it; products and convolutions with their shapes and
// GFLOP/s, fused trees with the ops they compute.
void CpuExecutable::trace_step(const plan::Step& step, int64_t start_ns, int64_t took) const {
  const auto& nodes = p_.graph.nodes;
  const ir::GraphNode& written = nodes[step.node];
  // A product computed transposed (B^T A^T) writes the permute of the matmul.
  const bool transposed =
      written.op == ir::Op::Permute && nodes[written.operands[0]].op == ir::Op::MatMul;
  const ir::GraphNode& n = transposed ? nodes[written.operands[0]] : written;
  std::string args;
  runtime::prof::add_arg(args, "shape", shape_str(n.shape));
  double flops = 0;
  // A fused attention's steps run several products over the columns its mask keeps (attention.h):
  // their node's product alone would misstate the rate.
  const bool attention = std::string_view(step.label).starts_with("attention");
  if (n.op == ir::Op::MatMul && !attention) {
    const Shape& a = nodes[n.operands[0]].shape;
    const Shape& b = nodes[n.operands[1]].shape;
    runtime::prof::add_arg(args, "operands", util::cat(shape_str(a), " x ", shape_str(b)));
    flops = 2.0 * static_cast<double>(shape_numel(n.shape)) * static_cast<double>(a.back());
  } else if (n.op == ir::Op::Conv2d || n.op == ir::Op::Conv2dBackwardInput ||
             n.op == ir::Op::Conv2dBackwardWeight) {
    // 2 * (the forward's output elements) * (weights per output channel), in all three.
    const bool weight_out = n.op == ir::Op::Conv2dBackwardWeight;
    const Shape& w = weight_out ? n.shape : nodes[n.operands[1]].shape;
    const Shape& out =
        n.op == ir::Op::Conv2d ? n.shape : nodes[n.operands[weight_out ? 1 : 0]].shape;
    runtime::prof::add_arg(args, "weight", shape_str(w));
    if (!w.empty() && w[0] > 0)
      flops =
          2.0 * static_cast<double>(shape_numel(out)) * static_cast<double>(shape_numel(w) / w[0]);
  }
  if (flops > 0) {
    runtime::prof::add_arg(args, "gflop", flops * 1e-9);
    runtime::prof::add_arg(args, "gflop_per_s", took > 0 ? flops / static_cast<double>(took) : 0.0);
  }
  if (!step.members.empty()) {
    std::string ops;
    for (const plan::Member& m : step.members)
      ops += util::cat(ops.empty() ? "" : " ", ir::op_info(nodes[m.node].op).name);
    runtime::prof::add_arg(args, "ops", ops);
  }
  runtime::prof::complete("kernel", util::cat(step.label, " %", step.node), start_ns,
                          start_ns + took, std::move(args));
}

// The memory preflight (plan/preflight.cpp).
void CpuExecutable::check_memory(size_t limit) const { plan::check_memory(p_, limit, "cpu"); }

}  // namespace lockstep::backends::cpu
