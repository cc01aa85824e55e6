// The cpu backend's compiler and executor: passes, a plan of steps (fused trees, oneDNN
// primitives, own kernels, ref fallbacks), and the memory plan; see cpu_backend.h.
#include "backends/cpu/cpu_backend.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <sstream>
#include <string>

#include "backends/cpu/dnnl_ops.h"
#include "backends/cpu/fused.h"
#include "backends/cpu/kernels.h"
#include "backends/ref/ref_kernels.h"
#include "passes/passes.h"
#include "runtime/lazy.h"
#include "util/check.h"

namespace lockstep::backends::cpu {
namespace {

using ir::Op;

std::atomic<int> g_threads{0};

// Largest elementwise tree (in instructions) recomputed in each of several consumers rather
// than written to memory once (when that saves memory traffic: see plan()).
constexpr int kRecomputeLimit = 8;

// Reductions whose contiguous runs are at least this long walk the runs; shorter ones (sums over
// small feature maps) go by tiles of the input instead.
constexpr int64_t kLongRun = 512;

// Constant values larger than this are recomputed every run rather than kept with the program.
constexpr size_t kFoldMaxBytes = size_t{16} << 20;

struct Ctx {
  std::vector<void*> ptr;  // per node: where its value is
  const std::vector<ir::ScalarValue>* scalars;
  float* copies = nullptr;  // convolution operands' shared copies (see share_conv_copies)
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
};
// Sums over the same layout with the node each writes: one, or several joined by merge_sums.
using SumParts = std::vector<std::pair<int32_t, std::shared_ptr<SumOf>>>;

struct Step {
  const char* label;            // for LOCKSTEP_PROFILE
  std::string detail;           // for plan dumps (LOCKSTEP_DUMP)
  int32_t node;                 // the value it writes
  std::vector<int32_t> extras;  // further values it writes
  std::vector<int32_t> reads;   // values it reads
  std::function<void(Ctx&)> run;
  std::shared_ptr<FusedMembers> fused;  // set for fused elementwise steps
  std::shared_ptr<SumOf> sum;           // set for a single sum that merge_sums may join
  std::shared_ptr<DnnlConv> conv;       // set for oneDNN convolutions
  // Whether it checks its data and may throw (indices out of range, integer division by zero):
  // donated inputs it could leave overwritten are copied aside first (see run).
  bool can_fail = false;
  // A check of operand `checked` that add_checks runs as a step of its own, as soon as the
  // operand is computed: the op itself then cannot fail, wherever the schedule puts it.
  std::function<void(Ctx&)> check;
  int32_t checked = -1;
  bool is_check = false;     // such a step: it writes nothing (`node` names the op it checks)
  size_t scratch_bytes = 0;  // of the shared oneDNN scratch it takes while it runs
  // The values it writes: node, then extras.
  std::vector<int32_t> writes() const {
    if (is_check) return {};
    std::vector<int32_t> w{node};
    w.insert(w.end(), extras.begin(), extras.end());
    return w;
  }
};

// Runs a oneDNN convolution; copy[k] places operand k's copy in oneDNN's layout among the shared
// copies: {offset in floats, whether this step writes it}, or offset -1 for the scratch.
std::function<void(Ctx&)> run_conv_step(std::shared_ptr<DnnlConv> conv, int32_t x, int32_t y,
                                        int32_t id, std::pair<int64_t, bool> copy0 = {-1, false},
                                        std::pair<int64_t, bool> copy1 = {-1, false}) {
  return [=](Ctx& c) {
    auto place = [&](std::pair<int64_t, bool> p) {
      DnnlConv::Copy copy;
      if (p.first >= 0 && p.second) copy.keep = c.copies + p.first;
      if (p.first >= 0 && !p.second) copy.ready = c.copies + p.first;
      return copy;
    };
    conv->run(static_cast<const float*>(c.ptr[x]), static_cast<const float*>(c.ptr[y]),
              static_cast<float*>(c.ptr[id]), place(copy0), place(copy1));
  };
}

// Where a value lives during a run.
struct Slot {
  enum Kind { None, Input, Arena, Output, Alias, Constant } kind = None;
  // Input number, arena offset, output number, aliased node, or offset among the constants.
  int64_t index = 0;
};

// Greedy first-fit placement of values in one block of memory, in step order: a value lives from
// the step that places it to its last step; blocks whose values are dead are reused.
class FirstFit {
 public:
  // Where a value of `size` placed at step `now` and last used at step `last` goes.
  size_t place(size_t size, int64_t now, int64_t last) {
    live_.erase(
        std::remove_if(live_.begin(), live_.end(), [&](const Block& b) { return b.last < now; }),
        live_.end());
    std::sort(live_.begin(), live_.end(),
              [](const Block& a, const Block& b) { return a.offset < b.offset; });
    size_t offset = 0;
    for (const Block& b : live_) {
      if (b.offset >= offset + size) break;
      offset = std::max(offset, b.offset + b.size);
    }
    live_.push_back({offset, size, last});
    peak_ = std::max(peak_, offset + size);
    return offset;
  }
  size_t peak() const { return peak_; }

 private:
  struct Block {
    size_t offset, size;
    int64_t last;
  };
  std::vector<Block> live_;
  size_t peak_ = 0;
};

bool is_f32(const ir::Graph& g, int32_t id) { return g.nodes[id].dtype == DType::F32; }

size_t bytes_of(const ir::GraphNode& n) {
  return static_cast<size_t>(shape_numel(n.shape)) * dtype_size(n.dtype);
}

// A Permute that swaps the last two axes and nothing else.
bool is_last_two_swap(const ir::GraphNode& n) {
  if (n.op != Op::Permute || n.attrs.size() < 2) return false;
  const size_t r = n.attrs.size();
  for (size_t i = 0; i + 2 < r; ++i)
    if (n.attrs[i] != static_cast<int64_t>(i)) return false;
  return n.attrs[r - 2] == static_cast<int64_t>(r - 1) &&
         n.attrs[r - 1] == static_cast<int64_t>(r - 2);
}

// Runs the trees of a fused step, tile by tile.
std::function<void(Ctx&)> run_fused(std::shared_ptr<const FusedMembers> members) {
  return [members](Ctx& c) {
    std::vector<const FusedTree*> trees;
    std::vector<std::vector<const void*>> leaves;
    std::vector<std::vector<float>> expanded;
    std::vector<void*> outs;
    for (const auto& [node, tree] : *members) {
      trees.push_back(tree.get());
      leaves.push_back(tree->bind(c.ptr, expanded));
      outs.push_back(c.ptr[node]);
    }
    FusedTree::run_group(trees, leaves, outs);
  };
}

// Computes sums that share one input layout: short runs (sums over small feature maps) by tiles
// of the input, long ones walked run by run.
std::function<void(Ctx&)> run_sums(SumParts parts) {
  const ReduceLayout layout = reduce_layout(parts[0].second->in, parts[0].second->attrs);
  const ReduceMap map = reduce_map(parts[0].second->in, parts[0].second->attrs);
  size_t tmp_floats = 0;
  for (const auto& [node, of] : parts)
    if (of->tree) tmp_floats = std::max(tmp_floats, of->tree->scratch_floats());
  return [parts = std::move(parts), layout, map, tmp_floats](Ctx& c) {
    std::vector<std::vector<const void*>> leaves(parts.size());
    std::vector<std::vector<float>> expanded;
    std::vector<float*> outs;
    for (size_t k = 0; k < parts.size(); ++k) {
      if (parts[k].second->tree) leaves[k] = parts[k].second->tree->bind(c.ptr, expanded);
      outs.push_back(static_cast<float*>(c.ptr[parts[k].first]));
    }
    auto read = [&](size_t k, int64_t off, int64_t len, float* tmp) -> const float* {
      const SumOf& of = *parts[k].second;
      if (!of.tree) return static_cast<const float*>(c.ptr[of.input]) + off;
      of.tree->prefetch(leaves[k], off, len);
      return of.tree->eval(leaves[k], off, len, tmp, nullptr);
    };
    if (layout.inner < kLongRun)
      sum_tiles_f32(map, parts.size(), read, outs, tmp_floats);
    else
      sum_multi_f32(layout, parts.size(), read, outs, tmp_floats);
  };
}

class CpuExecutable final : public Executable {
 public:
  explicit CpuExecutable(const ir::Graph& input) : g_(passes::cse(passes::simplify(input))) {
    plan();
  }

  size_t planned_bytes() const override { return planned_.total(); }
  void check_memory(size_t limit) const override;

  std::vector<std::shared_ptr<Storage>> run(const std::vector<std::shared_ptr<Storage>>& inputs,
                                            const std::vector<ir::ScalarValue>& scalars,
                                            const std::vector<bool>& donatable,
                                            const std::function<void()>& past_checks) override {
    const int want = g_threads.load();
    if (want > 0 && omp_get_max_threads() != want) omp_set_num_threads(want);
    if (!arena_ && arena_bytes_) arena_ = alloc_host(arena_bytes_);
    if (!copies_ && copies_floats_) copies_ = alloc_host(copies_floats_ * sizeof(float));
    Ctx ctx;
    ctx.scalars = &scalars;
    ctx.copies = copies_ ? static_cast<float*>(copies_->data()) : nullptr;
    ctx.ptr.assign(g_.nodes.size(), nullptr);
    // Everything but the outputs first: the steps before the first output is written (those
    // that check the labels or token ids among them) run before the outputs take their memory.
    for (size_t i = 0; i < g_.nodes.size(); ++i) {
      const Slot& s = slot_[i];
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
          ctx.ptr[i] = ctx.ptr[s.index];
          break;
        case Slot::Constant:
          ctx.ptr[i] = static_cast<char*>(constants_->data()) + s.index;
          break;
      }
    }
    size_t at = 0;  // the step running
    try {
      for (; at < prefix_; ++at) steps_[at].run(ctx);
    } catch (const InternalError&) {
      throw;
    } catch (const std::exception& e) {
      backends::fail_at(g_.nodes[steps_[at].node], e);  // no output or donated input written yet
    }
    // Past the last check, a failure is a fault: the runtime drops its record of values to
    // restore (here, when every check ran in the prefix, before the outputs are allocated).
    const size_t checked = static_cast<size_t>(last_can_fail_ + 1);
    if (checked <= prefix_ && past_checks) past_checks();
    std::vector<std::shared_ptr<Storage>> outs(g_.outputs.size());
    std::vector<std::shared_ptr<Storage>> out_of_node(g_.nodes.size());
    // Outputs updated in place, and copies of the inputs they overwrite before a step that may
    // still fail: a failed run leaves every donated input as it was (Executable::run).
    std::vector<size_t> donated;
    std::vector<std::shared_ptr<Storage>> kept(g_.outputs.size());
    for (size_t k = 0; k < g_.outputs.size(); ++k) {
      const int32_t id = g_.outputs[k];
      if (!out_of_node[id]) {
        // Updated in place when the planned donor input is free to take (see plan_donations).
        const int32_t j = donor_[k];
        if (j >= 0 && static_cast<size_t>(j) < donatable.size() && donatable[j] && inputs[j]) {
          out_of_node[id] = inputs[j];
          donated.push_back(k);
          if (donor_step_[k] < last_can_fail_) {
            kept[k] = alloc_host(inputs[j]->bytes());
            std::memcpy(kept[k]->data(), inputs[j]->data(), inputs[j]->bytes());
            runtime::count("in_place_copies");
          }
          runtime::count("in_place_outputs");
        } else
          out_of_node[id] = alloc_host(bytes_of(g_.nodes[id]));
      }
      outs[k] = out_of_node[id];
    }
    for (size_t i = 0; i < g_.nodes.size(); ++i) {
      const Slot& s = slot_[i];
      if (s.kind == Slot::Output) ctx.ptr[i] = out_of_node[i]->data();
      if (s.kind == Slot::Alias) ctx.ptr[i] = ctx.ptr[s.index];
    }
    try {
      for (; at < steps_.size(); ++at) {
        if (at == checked && checked > prefix_ && past_checks) past_checks();
        Step& step = steps_[at];
        if (!profile_) {
          step.run(ctx);
          continue;
        }
        const int64_t t0 = runtime::now_ns();
        step.run(ctx);
        const int64_t took = runtime::now_ns() - t0;
        // LOCKSTEP_PROFILE=steps: a timer per step ("mat_mul %93[1024, 784]"), else per kind.
        std::string name;
        if (profile_steps_)
          name = util::cat(step.label, " %", step.node, shape_str(g_.nodes[step.node].shape));
        runtime::time_ns(profile_steps_ ? name.c_str() : step.label, took);
      }
    } catch (const InternalError&) {
      throw;
    } catch (const std::exception& e) {
      // Donated inputs already overwritten get their copy back, or are reported lost.
      std::vector<int32_t> lost;
      for (size_t k : donated) {
        if (donor_step_[k] > static_cast<int>(at)) continue;  // not written yet
        const std::shared_ptr<Storage>& in = inputs[donor_[k]];
        if (kept[k])
          std::memcpy(in->data(), kept[k]->data(), in->bytes());
        else
          lost.push_back(donor_[k]);
      }
      backends::fail_at(g_.nodes[steps_[at].node], e, std::move(lost));
    }
    return outs;
  }

 private:
  void plan();
  void add_step(int32_t id);
  // Whether oneDNN takes this convolution: its right padding (what makes oneDNN's output size
  // PyTorch's floor formula) must not skip more than a stride's worth of input.
  bool dnnl_conv_fits(int32_t id) const {
    const ir::GraphNode& n = g_.nodes[id];
    const Shape& x = n.op == Op::Conv2dBackwardInput ? n.shape : g_.nodes[n.operands[0]].shape;
    const Shape& w = n.op == Op::Conv2dBackwardWeight ? n.shape : g_.nodes[n.operands[1]].shape;
    const Shape& y = n.op == Op::Conv2d                ? n.shape
                     : n.op == Op::Conv2dBackwardInput ? g_.nodes[n.operands[0]].shape
                                                       : g_.nodes[n.operands[1]].shape;
    const auto& a = n.attrs;
    for (int d = 0; d < 2; ++d) {
      const int64_t extent = (w[2 + d] - 1) * a[4 + d] + 1;
      const int64_t pad_r = (y[2 + d] - 1) * a[d] + extent - x[2 + d] - a[2 + d];
      // A negative right padding (input rows a stride skips at the end) is fine: oneDNN just
      // does not read them. Padding beyond "same" is fine too: the crashes once seen with it
      // (groups 2, dilation 2, padding 2 on a 2-tap kernel) came from oneDNN's thread-bound
      // scratchpad (see dnnl_ops.cpp), and the conformance suite covers such shapes.
      if (pad_r < -(a[d] - 1)) return false;
    }
    return true;
  }
  // The forward pooling's input and output shapes, for an average pooling or its backward.
  const Shape& pool_input(const ir::GraphNode& n) const {
    return n.op == Op::AvgPool2dBackward ? n.shape : g_.nodes[n.operands[0]].shape;
  }
  const Shape& pool_output(const ir::GraphNode& n) const {
    return n.op == Op::AvgPool2dBackward ? g_.nodes[n.operands[0]].shape : n.shape;
  }
  // A last-two-axes transpose of an f32 matmul that nothing else reads.
  bool transposed_matmul(int32_t id) const {
    const ir::GraphNode& n = g_.nodes[id];
    if (!is_last_two_swap(n) || n.dtype != DType::F32 || shape_numel(n.shape) == 0) return false;
    const int32_t m = n.operands[0];
    const ir::GraphNode& mm = g_.nodes[m];
    if (mm.op != Op::MatMul || is_output_[m] || consumers_[m].size() != 1 || !run_time_[m])
      return false;
    for (int32_t o : mm.operands)
      if (g_.nodes[o].dtype != DType::F32 || shape_numel(g_.nodes[o].shape) == 0) return false;
    return true;
  }
  void fold_constants();
  void choose_layouts();
  // Specialized kernels take f32 operands and results with no empty dimension; the rest goes to
  // ref.
  bool all_f32(int32_t id) const {
    const ir::GraphNode& n = g_.nodes[id];
    for (int32_t o : n.operands)
      if (!is_f32(g_, o) || shape_numel(g_.nodes[o].shape) == 0) return false;
    return is_f32(g_, id) && shape_numel(n.shape) > 0;
  }
  // Whether node id's step is a oneDNN convolution (else the ref kernel runs it).
  bool dnnl_conv(int32_t id) const {
    const Op op = g_.nodes[id].op;
    return (op == Op::Conv2d || op == Op::Conv2dBackwardInput || op == Op::Conv2dBackwardWeight) &&
           all_f32(id) && dnnl_conv_fits(id);
  }
  // Whether node id's step is our max pooling kernel (values, indices or the gradient), which
  // reads and writes the blocked layout as well as the plain one: f32 values, i64 indices, no
  // empty dimension, and blockable maps on both sides.
  bool blockable_pool(int32_t id) const {
    const ir::GraphNode& n = g_.nodes[id];
    if (n.op != Op::MaxPool2d && n.op != Op::MaxPool2dIndices && n.op != Op::MaxPool2dBackward)
      return false;
    if (n.dtype != (n.op == Op::MaxPool2dIndices ? DType::I64 : DType::F32)) return false;
    const ir::GraphNode& x = g_.nodes[n.operands[0]];  // the input, or the output gradient
    if (x.dtype != DType::F32 || !blockable(x.shape) || !blockable(n.shape)) return false;
    return n.op != Op::MaxPool2dBackward || g_.nodes[n.operands[1]].dtype == DType::I64;
  }
  // A sum over `in` read in blocked order (see choose_layouts): 4-D and blockable, summing over
  // the channels or over the whole feature map, so that its results come out in plain order.
  static bool sum_takes_blocked(const Shape& in, const std::vector<int64_t>& attrs) {
    if (!blockable(in)) return false;
    bool reduced[4] = {false, false, false, false};
    for (size_t i = 1; i < attrs.size(); ++i) reduced[attrs[i]] = true;
    return reduced[1] || (reduced[2] && reduced[3]);
  }
  // A sum's input shape and attrs as it walks a blocked value: [N, C/16, H, W, 16].
  static std::pair<Shape, std::vector<int64_t>> blocked_sum(const Shape& in,
                                                            const std::vector<int64_t>& attrs) {
    const Shape in5{in[0], in[1] / kBlock, in[2], in[3], kBlock};
    std::vector<int64_t> a5{attrs[0]};
    for (size_t i = 1; i < attrs.size(); ++i) {
      a5.push_back(attrs[i]);
      if (attrs[i] == 1) a5.push_back(4);
    }
    std::sort(a5.begin() + 1, a5.end());
    return {in5, a5};
  }
  void schedule();
  void share_conv_copies();
  void merge_fused_steps();
  void add_checks();
  void merge_sums();
  void plan_memory();
  void plan_donations(const std::vector<int>& last, const std::vector<int32_t>& root);
  void dump_plan(const char* dir) const;

  ir::Graph g_;
  const bool profile_ = std::getenv("LOCKSTEP_PROFILE") != nullptr;
  const bool profile_steps_ = profile_ && std::string(std::getenv("LOCKSTEP_PROFILE")) == "steps";
  std::vector<std::vector<int32_t>> consumers_;
  std::vector<bool> is_output_, absorbed_;
  std::vector<bool> blocked_;         // held in the blocked activation layout (choose_layouts)
  std::vector<bool> blocked_walk_;    // a sum walking its input in blocked order
  std::vector<bool> merged_;          // computed by another node's step
  std::vector<bool> run_time_;        // computed by a step (not a constant folded at compile time)
  std::vector<int64_t> constant_at_;  // offset of a folded constant in constants_, else -1
  std::shared_ptr<Storage> constants_;
  std::vector<Step> steps_;
  std::vector<Slot> slot_;
  std::vector<int32_t> donor_;   // per output: the input it may overwrite, or -1
  std::vector<int> donor_step_;  // per output: the step that overwrites it (-1: none)
  int last_can_fail_ = -1;       // the last step that may throw (-1: none)
  // Leading steps that write no output (run before the outputs are allocated), up to the last
  // step that may throw at most.
  size_t prefix_ = 0;
  size_t arena_bytes_ = 0;
  std::shared_ptr<Storage> arena_;
  size_t copies_floats_ = 0;
  std::shared_ptr<Storage> copies_;
  // What a run takes besides its inputs (plan_memory): the memory preflight checks it against
  // ls::memory_limit() and the runtime reports it (planned_bytes).
  struct Planned {
    size_t arena = 0, outputs = 0, copies = 0, scratch = 0, constants = 0;
    size_t total() const { return arena + outputs + copies + scratch + constants; }
  } planned_;
  std::vector<int32_t> live_at_peak_;  // arena values live at the step where most bytes are
};

void CpuExecutable::plan() {
  const size_t n = g_.nodes.size();
  consumers_.assign(n, {});
  is_output_.assign(n, false);
  for (size_t i = 0; i < n; ++i)
    for (int32_t o : g_.nodes[i].operands) consumers_[o].push_back(static_cast<int32_t>(i));
  for (int32_t o : g_.outputs) is_output_[o] = true;
  fold_constants();
  // A fusible node is evaluated inside its consumers' trees (its value never goes to memory)
  // when every consumer can take it: a fusible node of its shape, or an f32 reduction walking
  // it in long contiguous runs. With several consumers the node is recomputed in each, which
  // pays on a memory-bound machine as long as the recomputed tree stays small.
  absorbed_.assign(n, false);
  merged_.assign(n, false);
  std::vector<int> cost(n, 0);  // instructions of the tree a node brings into its consumers
  // The distinct full-size values that tree reads from memory.
  std::vector<std::vector<int32_t>> full_leaves(n);
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = static_cast<int32_t>(i);
    const ir::GraphNode& node = g_.nodes[i];
    if (is_output_[i] || node.op == Op::Scalar || !fusible(g_, id) || consumers_[i].empty() ||
        !run_time_[i])
      continue;
    bool all_take = true;
    std::vector<int32_t> distinct;
    for (int32_t c : consumers_[i]) {
      if (!run_time_[c]) continue;  // computed at compile time, from its own copy
      if (std::find(distinct.begin(), distinct.end(), c) == distinct.end()) distinct.push_back(c);
      const ir::GraphNode& cn = g_.nodes[c];
      const bool tree = fusible(g_, c) && cn.shape == node.shape;
      const bool reduction = (cn.op == Op::Sum || cn.op == Op::Max || cn.op == Op::Min) &&
                             cn.dtype == DType::F32 && node.dtype == DType::F32 &&
                             shape_numel(cn.shape) > 0 &&
                             (reduce_layout(node.shape, cn.attrs).inner >= 64 ||
                              (cn.op == Op::Sum && reduce_layout(node.shape, cn.attrs).inner >= 4));
      all_take = all_take && (tree || reduction);
    }
    cost[i] = node.op == Op::Expand ? 0 : 1;  // a broadcast is a load, not an instruction
    for (int32_t o : node.operands) {
      if (absorbed_[o]) {
        cost[i] += cost[o];
        for (int32_t l : full_leaves[o])
          if (std::find(full_leaves[i].begin(), full_leaves[i].end(), l) == full_leaves[i].end())
            full_leaves[i].push_back(l);
      } else if (node.op != Op::Expand && g_.nodes[o].shape == node.shape &&
                 std::find(full_leaves[i].begin(), full_leaves[i].end(), o) ==
                     full_leaves[i].end()) {
        full_leaves[i].push_back(o);
      }
    }
    // Recomputing in k consumers reads the tree's L full-size inputs k times; storing it reads
    // them once, writes the value (about two reads' worth, with the cache line fetched first)
    // and reads it k times: recompute while (k - 1) L <= k + 2, and the tree stays short.
    const int64_t k = static_cast<int64_t>(distinct.size());
    const int64_t l = static_cast<int64_t>(full_leaves[i].size());
    absorbed_[i] = all_take && (k == 1 || (cost[i] <= kRecomputeLimit && (k - 1) * l <= k + 2));
  }
  choose_layouts();
  for (size_t i = 0; i < n; ++i)
    if (!absorbed_[i] && !merged_[i] && run_time_[i] && g_.nodes[i].op != Op::Data)
      add_step(static_cast<int32_t>(i));
  // Drop steps whose value nothing reads (e.g. a transpose folded into a matmul).
  std::vector<bool> needed(n, false);
  for (int32_t o : g_.outputs) needed[o] = true;
  std::vector<Step> kept;
  for (size_t s = steps_.size(); s-- > 0;) {
    bool any = false;
    for (int32_t w : steps_[s].writes()) any = any || needed[w];
    if (!any) continue;
    for (int32_t r : steps_[s].reads) needed[r] = true;
    kept.push_back(std::move(steps_[s]));
  }
  std::reverse(kept.begin(), kept.end());
  steps_ = std::move(kept);
  merge_sums();
  merge_fused_steps();
  schedule();
  add_checks();
  share_conv_copies();
  plan_memory();
  prefix_ = 0;
  auto writes_output = [&](const Step& s) {
    const std::vector<int32_t> w = s.writes();
    return std::any_of(w.begin(), w.end(), [&](int32_t v) {
      int32_t r = v;
      while (slot_[r].kind == Slot::Alias) r = static_cast<int32_t>(slot_[r].index);
      return slot_[r].kind == Slot::Output || slot_[r].kind == Slot::Input;
    });
  };
  while (static_cast<int>(prefix_) <= last_can_fail_ && !writes_output(steps_[prefix_])) ++prefix_;
  if (const char* dir = std::getenv("LOCKSTEP_DUMP")) dump_plan(dir);
}

// Which activations stay in oneDNN's blocked layout (nChw16c) between convolutions. Values are
// grouped into classes that must share a layout: a fused tree's result with the full-size values
// it reads (it walks them all in one order), the full-size values one sum reads, a max
// pooling's input with its values and indices and the gradients computed from those indices. A
// class is blocked when every member may be: a blockable f32 value computed at run time by a
// oneDNN convolution, a fused tree or our max pooling (or a bool mask a tree computes, or the
// pooling's i64 indices), not a program output, and read only by oneDNN convolutions (as an
// activation or gradient, never as weights), fused trees of its shape, sums over its channels
// or its whole feature maps and max pooling. A value anything else reads (average pooling,
// reshapes, matmuls, ref kernels) stays plain, and so does its class: a convolution then
// reorders it as before.
void CpuExecutable::choose_layouts() {
  const size_t n = g_.nodes.size();
  blocked_.assign(n, false);
  blocked_walk_.assign(n, false);
  // Union-find over the nodes; n stands for "plain", n + 1 + i for sum i's walk over its input.
  std::vector<int32_t> parent(2 * n + 1);
  for (size_t i = 0; i < parent.size(); ++i) parent[i] = static_cast<int32_t>(i);
  auto find = [&](int32_t v) {
    while (parent[v] != v) v = parent[v] = parent[parent[v]];
    return v;
  };
  auto join = [&](int32_t a, int32_t b) { parent[find(a)] = find(b); };
  auto tree_leaves = [&](int32_t root) { return FusedTree(g_, root, absorbed_).leaf_nodes(); };
  const int32_t plain = static_cast<int32_t>(n);
  std::vector<bool> candidate(n, false);
  for (size_t i = 0; i < n; ++i) {
    const ir::GraphNode& node = g_.nodes[i];
    // f32 values, and bool ones (masks) that trees compute and read.
    const bool fused = fusible(g_, static_cast<int32_t>(i));
    const bool pool = blockable_pool(static_cast<int32_t>(i));
    candidate[i] = (node.dtype == DType::F32 || (fused && node.dtype == DType::Bool) || pool) &&
                   blockable(node.shape) && run_time_[i] && !absorbed_[i] && !is_output_[i] &&
                   node.op != Op::Data &&
                   (fused || pool ||
                    (node.op != Op::Conv2dBackwardWeight && dnnl_conv(static_cast<int32_t>(i))));
    if (!candidate[i]) join(static_cast<int32_t>(i), plain);
  }
  // The full-size leaves of a walk over `shape` (a tree's or a sum's) share its layout; a
  // smaller value read through a broadcast stays plain. Says whether any leaf was full-size.
  auto walk = [&](int32_t self, const Shape& shape, const std::vector<int32_t>& leaves) {
    bool full = false;
    for (int32_t l : leaves) {
      const bool same = g_.nodes[l].shape == shape;
      join(l, same ? self : plain);
      full = full || same;
    }
    return full;
  };
  std::vector<int32_t> walking_sums;  // sums whose walk reads a full-size value
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = static_cast<int32_t>(i);
    const ir::GraphNode& node = g_.nodes[i];
    if (absorbed_[i] || !run_time_[i] || node.op == Op::Data) continue;
    if (fusible(g_, id)) {
      walk(id, node.shape, tree_leaves(id));
    } else if (dnnl_conv(id)) {
      // Weights (forward and backward-data operand 1) and weight gradients stay plain.
      if (node.op != Op::Conv2dBackwardWeight) join(node.operands[1], plain);
      if (node.op == Op::Conv2dBackwardWeight) join(id, plain);
    } else if (blockable_pool(id)) {
      // Max pooling takes its input (or output gradient) and indices in the layout of its
      // result: the values and indices of one pooling, and the gradients that use those
      // indices, all share one layout.
      for (int32_t o : node.operands) join(o, id);
    } else if (node.op == Op::Sum && node.dtype == DType::F32 &&
               sum_takes_blocked(g_.nodes[node.operands[0]].shape, node.attrs)) {
      const int32_t x = node.operands[0];
      const Shape& shape = g_.nodes[x].shape;
      if (walk(plain + 1 + id, shape, absorbed_[x] ? tree_leaves(x) : std::vector<int32_t>{x}))
        walking_sums.push_back(id);
    } else {
      join(id, plain);
      for (int32_t o : node.operands) {
        if (!absorbed_[o]) {
          join(o, plain);
        } else {  // a reduction other than those sums walks the tree in plain order
          for (int32_t l : tree_leaves(o)) join(l, plain);
        }
      }
    }
  }
  for (int32_t o : g_.outputs) join(o, plain);
  int64_t count = 0;
  for (size_t i = 0; i < n; ++i) {
    blocked_[i] = candidate[i] && find(static_cast<int32_t>(i)) != find(plain);
    count += blocked_[i];
  }
  // A sum walks in blocked order when the values it reads are blocked: its full-size leaves
  // share its class, and a class that is not plain holds only blocked values. (A walk over
  // broadcasts only stays plain.)
  for (int32_t id : walking_sums) blocked_walk_[id] = find(plain + 1 + id) != find(plain);
  if (count) runtime::count("blocked_activations", count);
}

// Values that depend on nothing supplied at run time (index ramps and what is computed from
// them alone) are computed here, once, by the ref kernels, and kept with the program: the steps
// that read them read the kept copy.
void CpuExecutable::fold_constants() {
  const size_t n = g_.nodes.size();
  const passes::Constants c = passes::find_constants(g_, kFoldMaxBytes);
  run_time_ = c.run_time;
  constant_at_.assign(n, -1);
  if (c.fold.empty()) return;
  // Everything the folded values are computed from, evaluated in graph order.
  std::vector<bool> needed(n, false);
  for (int32_t f : c.fold) needed[f] = true;
  for (size_t i = n; i-- > 0;)
    if (needed[i])
      for (int32_t o : g_.nodes[i].operands) needed[o] = true;
  std::vector<std::vector<std::byte>> value(n);
  const std::vector<ir::ScalarValue> no_scalars;
  for (size_t i = 0; i < n; ++i) {
    if (!needed[i]) continue;
    const ir::GraphNode& node = g_.nodes[i];
    std::vector<ref::Arr> args;
    for (int32_t o : node.operands)
      args.push_back({value[o].data(), g_.nodes[o].shape, g_.nodes[o].dtype});
    value[i].resize(bytes_of(node));
    ref::eval_node(node, args, no_scalars, value[i].data());
  }
  size_t total = 0;
  for (int32_t f : c.fold) {
    constant_at_[f] = static_cast<int64_t>(total);
    total += (bytes_of(g_.nodes[f]) + 63) / 64 * 64;
  }
  constants_ = alloc_host(std::max<size_t>(total, 64));
  for (int32_t f : c.fold)
    if (!value[f].empty())
      std::memcpy(static_cast<char*>(constants_->data()) + constant_at_[f], value[f].data(),
                  value[f].size());
  runtime::count("folded_constants", static_cast<int64_t>(c.fold.size()));
}

void CpuExecutable::dump_plan(const char* dir) const {
  static std::atomic<int> counter{0};
  const std::string path = util::cat(dir, "/cpu-plan-", counter++, ".txt");
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return;  // a debugging aid: never fails the compile
  // The data checks end at step `last_can_fail_` (-1: none); the first `prefix_` steps run
  // before the outputs are allocated.
  std::fprintf(f, "arena %zu bytes, %zu steps, last check at step %d, %zu steps before outputs\n",
               arena_bytes_, steps_.size(), last_can_fail_, prefix_);
  for (size_t i = 0; i < g_.nodes.size(); ++i)
    if (constant_at_[i] >= 0)
      std::fprintf(f, "%%%zu constant %s%s (folded)\n", i, dtype_name(g_.nodes[i].dtype),
                   shape_str(g_.nodes[i].shape).c_str());
  for (const Step& s : steps_) {
    const ir::GraphNode& n = g_.nodes[s.node];
    // Values in the blocked activation layout are marked "(nChw16c)"; so is a sum that walks
    // its input in that order.
    auto layout = [&](int32_t v) { return blocked_[v] ? "(nChw16c)" : ""; };
    std::string reads;
    for (int32_t r : s.reads) reads += util::cat(" %", r, shape_str(g_.nodes[r].shape), layout(r));
    std::fprintf(f, "%%%d %s %s%s%s <-%s  %s\n", s.node, s.label, dtype_name(n.dtype),
                 shape_str(n.shape).c_str(), blocked_walk_[s.node] ? "(nChw16c)" : layout(s.node),
                 reads.c_str(), s.detail.c_str());
  }
  std::fclose(f);
}

// Step order, refined: the order of the graph is a valid one, but it computes some values long
// before they are needed and reads others long after they were written.
void CpuExecutable::schedule() {
  // A weight gradient moves up to right after the input gradient of the same convolution (both
  // read the output gradient): its operands are ready there, the shared copy of the output
  // gradient (share_conv_copies) lives for one step instead of hundreds, and so do the
  // operands' last reads.
  std::vector<int> producer(g_.nodes.size(), -1);
  auto index_producers = [&] {
    std::fill(producer.begin(), producer.end(), -1);
    for (size_t s = 0; s < steps_.size(); ++s)
      for (int32_t v : steps_[s].writes()) producer[v] = static_cast<int>(s);
  };
  index_producers();
  for (size_t w = 0; w < steps_.size(); ++w) {
    const ir::GraphNode& wn = g_.nodes[steps_[w].node];
    if (!steps_[w].conv || wn.op != Op::Conv2dBackwardWeight) continue;
    const int dy_step = producer[wn.operands[1]];
    for (size_t d = static_cast<size_t>(std::max(dy_step, 0)); d + 1 < w; ++d) {
      const ir::GraphNode& dn = g_.nodes[steps_[d].node];
      if (!steps_[d].conv || dn.op != Op::Conv2dBackwardInput || dn.operands[0] != wn.operands[1])
        continue;
      bool ready = true;
      for (int32_t r : steps_[w].reads) ready = ready && producer[r] <= static_cast<int>(d);
      if (!ready) break;
      Step moved = std::move(steps_[w]);
      steps_.erase(steps_.begin() + static_cast<std::ptrdiff_t>(w));
      steps_.insert(steps_.begin() + static_cast<std::ptrdiff_t>(d) + 1, std::move(moved));
      index_producers();
      break;
    }
  }
}

// A value that several convolutions copy to the same oneDNN layout is copied once: a forward
// convolution's input, copied again by its weight gradient, and an output gradient, copied by
// both backward convolutions. The first of them in step order writes the copy, the others read
// it. The copies live in their own memory, planned like the arena (first fit by lifetime).
void CpuExecutable::share_conv_copies() {
  struct Use {
    size_t step;
    int k;
  };
  std::vector<std::vector<Use>> groups;
  std::vector<int32_t> group_value;
  for (size_t s = 0; s < steps_.size(); ++s) {
    if (!steps_[s].conv) continue;
    for (int k = 0; k < 2; ++k) {
      if (steps_[s].conv->copy_floats(k) == 0) continue;
      const int32_t v = g_.nodes[steps_[s].node].operands[k];
      bool joined = false;
      for (size_t gi = 0; gi < groups.size() && !joined; ++gi) {
        const Use& u = groups[gi][0];
        if (group_value[gi] == v && steps_[s].conv->same_copy(k, *steps_[u.step].conv, u.k)) {
          groups[gi].push_back({s, k});
          joined = true;
        }
      }
      if (!joined) {
        groups.push_back({{s, k}});
        group_value.push_back(v);
      }
    }
  }
  FirstFit fit;
  using Place = std::pair<int64_t, bool>;         // see run_conv_step
  std::map<size_t, std::array<Place, 2>> places;  // by step, for steps that share a copy
  for (const std::vector<Use>& uses : groups) {
    if (uses.size() < 2) continue;
    const size_t first = uses.front().step, last = uses.back().step;
    const size_t offset = fit.place(steps_[first].conv->copy_floats(uses.front().k),
                                    static_cast<int64_t>(first), static_cast<int64_t>(last));
    runtime::count("shared_conv_copies", static_cast<int64_t>(uses.size() - 1));
    for (const Use& u : uses) {
      auto [it, fresh] =
          places.try_emplace(u.step, std::array<Place, 2>{Place{-1, false}, Place{-1, false}});
      it->second[u.k] = {static_cast<int64_t>(offset), u.step == first};
    }
  }
  copies_floats_ = fit.peak();
  for (const auto& [s, place] : places) {
    Step& st = steps_[s];
    const ir::GraphNode& n = g_.nodes[st.node];
    st.run = run_conv_step(st.conv, n.operands[0], n.operands[1], st.node, place[0], place[1]);
  }
}

// Consecutive fused steps over the same number of elements run as one group: per tile, each
// tree in turn, so a value one writes and the next reads (an optimizer's new momentum, then
// the parameter it moves) is still in cache; every read of a group member's value must be at
// the same element (no broadcast), which keeps tiles independent.
void CpuExecutable::merge_fused_steps() {
  std::vector<Step> out;
  for (Step& s : steps_) {
    // A host scalar reads nothing: it moves ahead of a fused step rather than separate it from
    // the next one.
    if (g_.nodes[s.node].op == Op::Scalar && !out.empty() && out.back().fused) {
      out.insert(out.end() - 1, std::move(s));
      continue;
    }
    if (!out.empty() && out.back().fused && s.fused) {
      Step& g = out.back();
      const FusedTree& next = *s.fused->front().second;
      const int64_t numel = g.fused->front().second->numel();
      bool ok = next.numel() == numel && numel >= kTile;
      for (size_t k = 0; ok && k < next.leaf_nodes().size(); ++k)
        for (const auto& [node, tree] : *g.fused)
          if (next.leaf_nodes()[k] == node && !next.leaf_is_elementwise(k)) ok = false;
      if (ok) {
        g.fused->push_back(s.fused->front());
        g.extras.push_back(s.node);
        for (int32_t r : s.reads)
          if (std::find(g.reads.begin(), g.reads.end(), r) == g.reads.end()) g.reads.push_back(r);
        g.label = "fused_group";
        g.detail += "; " + s.detail;
        g.run = run_fused(g.fused);
        continue;
      }
    }
    out.push_back(std::move(s));
  }
  steps_ = std::move(out);
}

// Sums over the same values' layout (same input shape and axes) that a few steps apart need
// nothing computed in between run as one walk, reading their inputs once: batch norm's backward
// sums the output gradient and the gradient times the normalized input per channel.
void CpuExecutable::merge_sums() {
  constexpr size_t kLookahead = 12;
  std::vector<bool> gone(steps_.size(), false);
  for (size_t i = 0; i < steps_.size(); ++i) {
    if (gone[i] || !steps_[i].sum) continue;
    std::vector<size_t> members{i};
    std::vector<int32_t> written;  // by the steps between
    for (size_t j = i + 1; j < steps_.size() && j <= i + kLookahead; ++j) {
      if (gone[j]) continue;
      const Step& t = steps_[j];
      bool depends = false;
      for (int32_t r : t.reads)
        depends = depends || std::find(written.begin(), written.end(), r) != written.end();
      if (t.sum && !depends && t.sum->in == steps_[i].sum->in &&
          t.sum->attrs == steps_[i].sum->attrs) {
        members.push_back(j);
        gone[j] = true;
        continue;
      }
      const std::vector<int32_t> w = t.writes();
      written.insert(written.end(), w.begin(), w.end());
    }
    if (members.size() == 1) continue;
    Step& s = steps_[i];
    SumParts parts;
    for (size_t m : members) {
      parts.emplace_back(steps_[m].node, steps_[m].sum);
      if (m == i) continue;
      s.extras.push_back(steps_[m].node);
      for (int32_t r : steps_[m].reads)
        if (std::find(s.reads.begin(), s.reads.end(), r) == s.reads.end()) s.reads.push_back(r);
      s.detail += "; " + steps_[m].detail;
    }
    s.label = "sums";
    s.sum = nullptr;
    s.run = run_sums(std::move(parts));
  }
  std::vector<Step> kept;
  for (size_t i = 0; i < steps_.size(); ++i)
    if (!gone[i]) kept.push_back(std::move(steps_[i]));
  steps_ = std::move(kept);
}

void CpuExecutable::add_step(int32_t id) {
  const ir::GraphNode& n = g_.nodes[id];
  Step step;
  step.node = id;
  step.label = ir::op_info(n.op).name;
  const bool f32 = is_f32(g_, id);
  if (fusible(g_, id)) {
    auto tree = std::make_shared<FusedTree>(g_, id, absorbed_, &blocked_, blocked_[id]);
    step.reads = tree->leaf_nodes();
    step.label = "fused";
    step.detail = tree->describe();
    step.fused = std::make_shared<FusedMembers>(1, std::make_pair(id, tree));
    step.run = run_fused(step.fused);
  } else if ((n.op == Op::MatMul && all_f32(id)) || transposed_matmul(id)) {
    // A matmul; or the transpose of one, computed directly as B^T A^T. Operands that are
    // transposes are read through swapped strides instead of being copied.
    const bool flip = n.op == Op::Permute;
    const ir::GraphNode& mm_node = flip ? g_.nodes[n.operands[0]] : n;
    int32_t operand[2] = {mm_node.operands[0], mm_node.operands[1]};
    if (flip) std::swap(operand[0], operand[1]);
    Shape shape[2];
    std::vector<int64_t> strides[2];
    for (int k = 0; k < 2; ++k) {
      const ir::GraphNode& o = g_.nodes[operand[k]];
      bool transposed = flip;  // (A B)^T = B^T A^T: each operand is read transposed
      int32_t source = operand[k];
      // A transpose feeding the matmul: read its input instead.
      if (is_last_two_swap(o) && run_time_[operand[k]]) {
        source = o.operands[0];
        transposed = !transposed;
      }
      operand[k] = source;
      const Shape& ss = g_.nodes[source].shape;
      strides[k] = ref::strides_of(ss);
      shape[k] = ss;
      if (transposed) {
        const size_t r = ss.size();
        std::swap(strides[k][r - 1], strides[k][r - 2]);
        std::swap(shape[k][r - 1], shape[k][r - 2]);
      }
    }
    auto mm = std::make_shared<DnnlMatMul>(shape[0], strides[0], shape[1], strides[1], n.shape);
    step.scratch_bytes = mm->scratch_bytes();
    step.reads = {operand[0], operand[1]};
    step.label = "mat_mul";
    const int32_t a = operand[0], b = operand[1];
    step.run = [mm, a, b, id](Ctx& c) {
      mm->run(static_cast<const float*>(c.ptr[a]), static_cast<const float*>(c.ptr[b]),
              static_cast<float*>(c.ptr[id]));
    };
  } else if (dnnl_conv(id)) {
    const ir::GraphNode& a = g_.nodes[n.operands[0]];
    const ir::GraphNode& b = g_.nodes[n.operands[1]];
    std::shared_ptr<DnnlConv> conv;
    const DnnlConv::Blocked blocked{blocked_[n.operands[0]], blocked_[n.operands[1]], blocked_[id]};
    if (n.op == Op::Conv2d)
      conv = std::make_shared<DnnlConv>(DnnlConv::Kind::Forward, a.shape, b.shape, n.shape, n.attrs,
                                        blocked);
    else if (n.op == Op::Conv2dBackwardInput)
      conv = std::make_shared<DnnlConv>(DnnlConv::Kind::BackwardData, n.shape, b.shape, a.shape,
                                        n.attrs, blocked);
    else
      conv = std::make_shared<DnnlConv>(DnnlConv::Kind::BackwardWeights, a.shape, n.shape, b.shape,
                                        n.attrs, blocked);
    step.reads = n.operands;
    step.conv = conv;
    step.scratch_bytes = conv->scratch_bytes();
    step.run = run_conv_step(conv, n.operands[0], n.operands[1], id);
  } else if ((n.op == Op::Sum || n.op == Op::Max || n.op == Op::Min) && f32 &&
             absorbed_[n.operands[0]]) {
    const bool walk_blocked = blocked_walk_[id];
    auto tree = std::make_shared<FusedTree>(g_, n.operands[0], absorbed_, &blocked_, walk_blocked);
    step.reads = tree->leaf_nodes();
    step.label = "fused_reduce";
    step.detail = tree->describe();
    if (n.op == Op::Sum) {
      auto [in, attrs] = walk_blocked ? blocked_sum(g_.nodes[n.operands[0]].shape, n.attrs)
                                      : std::make_pair(g_.nodes[n.operands[0]].shape, n.attrs);
      step.sum = std::make_shared<SumOf>(SumOf{in, attrs, tree, -1});
      step.run = run_sums({{id, step.sum}});
    } else {
      const ReduceLayout layout = reduce_layout(g_.nodes[n.operands[0]].shape, n.attrs);
      const Op op = n.op;
      step.run = [tree, layout, op, id](Ctx& c) {
        std::vector<std::vector<float>> expanded;
        const std::vector<const void*> leaves = tree->bind(c.ptr, expanded);
        reduce_f32(
            op, layout,
            [&](int64_t off, int64_t len, float* tmp) {
              return tree->eval(leaves, off, len, tmp, nullptr);
            },
            static_cast<float*>(c.ptr[id]), tree->scratch_floats());
      };
    }
  } else if ((n.op == Op::Sum || n.op == Op::Max || n.op == Op::Min) && all_f32(id)) {
    step.reads = n.operands;
    const int32_t x = n.operands[0];
    const Shape in = g_.nodes[x].shape;
    const std::vector<int64_t> attrs = n.attrs;
    const Op op = n.op;
    if (blocked_walk_[id]) {
      auto [in5, attrs5] = blocked_sum(in, attrs);
      step.sum = std::make_shared<SumOf>(SumOf{in5, attrs5, nullptr, x});
      step.run = run_sums({{id, step.sum}});
    } else if (n.op == Op::Sum && reduce_layout(in, attrs).inner >= 2) {
      step.sum = std::make_shared<SumOf>(SumOf{in, attrs, nullptr, x});
      step.run = run_sums({{id, step.sum}});
    } else {  // Max, Min, and sums over axes below kept ones (by rows, see reduce_f32)
      step.run = [=](Ctx& c) {
        reduce_f32(op, static_cast<const float*>(c.ptr[x]), in, attrs,
                   static_cast<float*>(c.ptr[id]));
      };
    }
  } else if ((n.op == Op::MaxPool2d || n.op == Op::MaxPool2dIndices) && is_f32(g_, n.operands[0]) &&
             shape_numel(n.shape) > 0) {
    // Values and indices of the same pooling come from one pass.
    const int32_t x = n.operands[0];
    const Op other = n.op == Op::MaxPool2d ? Op::MaxPool2dIndices : Op::MaxPool2d;
    for (int32_t k : consumers_[x])
      if (k != id && g_.nodes[k].op == other && g_.nodes[k].attrs == n.attrs && !absorbed_[k] &&
          run_time_[k]) {
        step.extras = {k};
        merged_[k] = true;
        break;
      }
    step.reads = n.operands;
    const int32_t other_id = step.extras.empty() ? -1 : step.extras[0];
    const int32_t values = n.op == Op::MaxPool2d ? id : other_id;
    const int32_t indices = n.op == Op::MaxPool2d ? other_id : id;
    const Shape in = g_.nodes[x].shape, out = n.shape;
    const std::vector<int64_t> attrs = n.attrs;
    const bool blocked = blocked_[x];
    LS_INTERNAL_CHECK(blocked_[id] == blocked && (other_id < 0 || blocked_[other_id] == blocked),
                      "max pooling's input, values and indices in different layouts");
    if (blocked) runtime::count("blocked_max_pooling");
    step.run = [=](Ctx& c) {
      float* v = values >= 0 ? static_cast<float*>(c.ptr[values]) : nullptr;
      int64_t* i = indices >= 0 ? static_cast<int64_t*>(c.ptr[indices]) : nullptr;
      if (blocked)
        max_pool2d_blocked_f32(static_cast<const float*>(c.ptr[x]), in, out, attrs, v, i);
      else
        max_pool2d_f32(static_cast<const float*>(c.ptr[x]), in, out, attrs, v, i);
    };
  } else if ((n.op == Op::AvgPool2d || n.op == Op::AvgPool2dBackward) && all_f32(id) &&
             DnnlAvgPool::fits(pool_input(n), pool_output(n), n.attrs)) {
    auto pool = std::make_shared<DnnlAvgPool>(n.op == Op::AvgPool2dBackward, pool_input(n),
                                              pool_output(n), n.attrs);
    step.scratch_bytes = pool->scratch_bytes();
    step.reads = n.operands;
    const int32_t x = n.operands[0];
    step.run = [pool, x, id](Ctx& c) {
      pool->run(static_cast<const float*>(c.ptr[x]), static_cast<float*>(c.ptr[id]));
    };
  } else if (n.op == Op::MaxPool2dBackward && f32 && shape_numel(n.shape) > 0) {
    step.reads = n.operands;
    const int32_t gy = n.operands[0], idx = n.operands[1];
    const Shape gys = g_.nodes[gy].shape, in = n.shape;
    const bool blocked = blocked_[id];
    LS_INTERNAL_CHECK(blocked_[gy] == blocked && blocked_[idx] == blocked,
                      "max pooling's gradient, output gradient and indices in different layouts");
    if (blocked) runtime::count("blocked_max_pooling");
    // Its indices are checked against the plane, but they come from the forward pooling: a
    // failure there is a fault, not the data's, and poisons what it had overwritten.
    step.run = [=](Ctx& c) {
      const float* g = static_cast<const float*>(c.ptr[gy]);
      const int64_t* i = static_cast<const int64_t*>(c.ptr[idx]);
      float* dx = static_cast<float*>(c.ptr[id]);
      if (blocked)
        max_pool2d_backward_blocked_f32(g, i, gys, in, dx);
      else
        max_pool2d_backward_f32(g, i, gys, in, dx);
    };
  } else if ((n.op == Op::Permute || n.op == Op::Slice) && dtype_size(n.dtype) == 4) {
    step.reads = n.operands;
    const int32_t x = n.operands[0];
    const std::vector<int64_t> xs = ref::strides_of(g_.nodes[x].shape);
    std::vector<int64_t> st;
    int64_t offset = 0;
    if (n.op == Op::Permute) {
      for (int64_t a : n.attrs) st.push_back(xs[a]);
    } else {
      st = xs;
      st[n.attrs[0]] *= n.attrs[3];
      offset = n.attrs[1] * xs[n.attrs[0]];
    }
    const Shape out = n.shape;
    step.run = [=](Ctx& c) { strided_copy_4(c.ptr[x], out, st, offset, c.ptr[id]); };
  } else if (n.op == Op::Reshape) {
    step.reads = n.operands;
    const int32_t x = n.operands[0];
    const size_t bytes = bytes_of(n);
    // Usually an alias (no step runs); a copy only when the result must own its memory.
    step.run = [=](Ctx& c) {
      if (c.ptr[id] != c.ptr[x] && bytes) std::memcpy(c.ptr[id], c.ptr[x], bytes);
    };
  } else {
    // Everything else: the ref kernel, single-threaded.
    step.reads = n.operands;
    static const std::vector<std::string> ref_labels = [] {
      std::vector<std::string> v;
      for (int k = 0; k < ir::kNumOps; ++k)
        v.push_back(std::string("ref:") + ir::op_info(static_cast<Op>(k)).name);
      return v;
    }();
    step.label = ref_labels[static_cast<int>(n.op)].c_str();
    const ir::GraphNode node = n;
    std::vector<std::pair<Shape, DType>> args;
    for (int32_t o : n.operands) args.emplace_back(g_.nodes[o].shape, g_.nodes[o].dtype);
    const std::vector<int32_t> ops = n.operands;
    // The ref kernels that check their data: indices (checked ahead, see add_checks), integer
    // division and integer powers (checked where they run).
    const bool integer = !is_floating(n.dtype);
    step.can_fail = integer && (n.op == Op::Div || n.op == Op::Pow);
    if (n.op == Op::Gather || n.op == Op::ScatterAdd) {
      const int32_t index = n.operands[1];
      const Shape index_shape = g_.nodes[index].shape;
      const int64_t axis = n.attrs[0], size = g_.nodes[n.operands[0]].shape[axis];
      const char* name = ir::op_info(n.op).name;
      step.checked = index;
      step.check = [=](Ctx& c) {
        ref::check_indices(name, {c.ptr[index], index_shape, DType::I64}, size, axis);
      };
    }
    step.run = [node, args, ops, id](Ctx& c) {
      std::vector<ref::Arr> arr;
      for (size_t k = 0; k < ops.size(); ++k)
        arr.push_back({c.ptr[ops[k]], args[k].first, args[k].second});
      ref::eval_node(node, arr, *c.scalars, c.ptr[id]);
    };
  }
  steps_.push_back(std::move(step));
}

// Each data check (an index range) runs as early as it can: first when the value it checks is an
// input, or computed from inputs alone by small steps (nll_loss's masked labels), which move to
// the front with it; else right after the step that computes the value. A failing check then
// comes before any parameter is updated in place and before the outputs are allocated, so a
// failed run has nothing to put back and a passing one keeps nothing aside (see run).
void CpuExecutable::add_checks() {
  const size_t n = g_.nodes.size();
  std::vector<int> producer(n, -1);
  for (size_t k = 0; k < steps_.size(); ++k)
    for (int32_t w : steps_[k].writes()) producer[w] = static_cast<int>(k);
  // Values available before any step runs, and the small steps that may move to the front.
  constexpr size_t kSmallBytes = size_t{1} << 20;
  std::vector<char> early(n, 0);  // 0 unknown, 1 early, 2 not
  std::vector<bool> hoisted(steps_.size(), false);
  std::function<bool(int32_t)> is_early = [&](int32_t v) -> bool {
    if (early[v]) return early[v] == 1;
    early[v] = 2;
    const int p = producer[v];
    if (p < 0) {
      early[v] = 1;  // an input or a constant
      return true;
    }
    const Step& s = steps_[p];
    bool ok = !s.is_check && !s.fused && !s.conv && !s.can_fail;
    for (int32_t w : s.writes()) ok = ok && bytes_of(g_.nodes[w]) <= kSmallBytes && !is_output_[w];
    for (int32_t r : s.reads) ok = ok && is_early(r);
    if (ok) {
      hoisted[p] = true;
      for (int32_t w : s.writes()) early[w] = 1;
    }
    return ok;
  };
  for (const Step& s : steps_)
    if (s.check) is_early(s.checked);
  // position[v]: 1 + the index of the step that computes v in the new order; 0 for values
  // available before the first step that is not hoisted.
  std::vector<int> position(n, 0);
  for (size_t k = 0; k < steps_.size(); ++k)
    if (!hoisted[k])
      for (int32_t w : steps_[k].writes()) position[w] = static_cast<int>(k) + 1;
  std::vector<std::vector<Step>> after(steps_.size() + 1);  // the checks after step k - 1
  for (Step& s : steps_) {
    if (!s.check) continue;
    Step check;
    check.label = "check";
    check.detail = util::cat("check of ", ir::op_info(g_.nodes[s.node].op).name, " %", s.node);
    check.node = s.node;
    check.reads = {s.checked};
    check.run = std::move(s.check);
    check.can_fail = true;
    check.is_check = true;
    s.check = nullptr;
    after[position[s.checked]].push_back(std::move(check));
  }
  std::vector<Step> out;
  out.reserve(steps_.size());
  for (size_t k = 0; k < steps_.size(); ++k)
    if (hoisted[k]) out.push_back(std::move(steps_[k]));
  for (Step& c : after[0]) out.push_back(std::move(c));
  for (size_t k = 0; k < steps_.size(); ++k) {
    if (!hoisted[k]) out.push_back(std::move(steps_[k]));
    for (Step& c : after[k + 1]) out.push_back(std::move(c));
  }
  steps_ = std::move(out);
}

void CpuExecutable::plan_memory() {
  const size_t n = g_.nodes.size();
  slot_.assign(n, Slot{});
  for (size_t i = 0; i < n; ++i) {
    if (g_.nodes[i].op == Op::Data) slot_[i] = {Slot::Input, g_.nodes[i].input};
    if (constant_at_[i] >= 0) slot_[i] = {Slot::Constant, constant_at_[i]};
  }
  for (int32_t o : g_.outputs) slot_[o] = {Slot::Output, 0};
  // Reshapes that are not outputs alias their operand's memory.
  std::vector<int32_t> root(n);
  for (size_t i = 0; i < n; ++i) root[i] = static_cast<int32_t>(i);
  for (const Step& s : steps_) {
    const ir::GraphNode& node = g_.nodes[s.node];
    if (node.op == Op::Reshape && slot_[s.node].kind != Slot::Output) {
      slot_[s.node] = {Slot::Alias, node.operands[0]};
      root[s.node] = root[node.operands[0]];
    }
  }
  // Liveness in step order, by the memory each value really lives in.
  std::vector<int> first(n, -1), last(n, -1);
  for (size_t s = 0; s < steps_.size(); ++s) {
    for (int32_t written : steps_[s].writes()) {
      const int32_t w = root[written];
      if (first[w] < 0) first[w] = static_cast<int>(s);
      last[w] = std::max(last[w], static_cast<int>(s));
    }
    for (int32_t r : steps_[s].reads) last[root[r]] = std::max(last[root[r]], static_cast<int>(s));
  }
  // Greedy first-fit offsets in one arena, 64-byte aligned.
  FirstFit fit;
  for (size_t s = 0; s < steps_.size(); ++s) {
    for (int32_t id : steps_[s].writes()) {
      if (slot_[id].kind != Slot::None || root[id] != id) continue;
      const size_t size = (bytes_of(g_.nodes[id]) + 63) / 64 * 64;
      slot_[id] = {Slot::Arena,
                   static_cast<int64_t>(fit.place(size, static_cast<int64_t>(s), last[id]))};
    }
  }
  arena_bytes_ = fit.peak();
  plan_donations(last, root);

  // What a run takes: the arena, the outputs (all allocated: the most, when none is updated in
  // place), the shared copies in oneDNN's layouts, the largest scratch one step takes, constants.
  planned_ = {};
  planned_.arena = arena_bytes_;
  for (int32_t o : g_.outputs) planned_.outputs += bytes_of(g_.nodes[o]);
  planned_.copies = copies_floats_ * sizeof(float);
  for (const Step& s : steps_) planned_.scratch = std::max(planned_.scratch, s.scratch_bytes);
  planned_.constants = constants_ ? constants_->bytes() : 0;
  // The arena values live together at the step where the most bytes are live (the arena is at
  // least that big; first fit may leave gaps).
  std::vector<int64_t> delta(steps_.size() + 1, 0);
  for (size_t i = 0; i < n; ++i)
    if (slot_[i].kind == Slot::Arena && first[i] >= 0) {
      delta[first[i]] += static_cast<int64_t>(bytes_of(g_.nodes[i]));
      delta[last[i] + 1] -= static_cast<int64_t>(bytes_of(g_.nodes[i]));
    }
  int64_t live = 0, most = -1;
  int peak = 0;
  for (size_t s = 0; s < steps_.size(); ++s) {
    live += delta[s];
    if (live > most) most = live, peak = static_cast<int>(s);
  }
  live_at_peak_.clear();
  for (size_t i = 0; i < n; ++i)
    if (slot_[i].kind == Slot::Arena && first[i] >= 0 && first[i] <= peak && last[i] >= peak)
      live_at_peak_.push_back(static_cast<int32_t>(i));
}

// Bytes as "1.50 GiB (1610612736 bytes)".
std::string format_bytes(size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  char text[32];
  std::snprintf(text, sizeof text, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return u == 0 ? std::string(text) : util::cat(text, " (", bytes, " bytes)");
}

// The memory preflight: a program whose plan needs more than the limit fails before it runs,
// naming what it needs and the values that need it most.
void CpuExecutable::check_memory(size_t limit) const {
  const size_t need = planned_.total();
  if (need <= limit) return;
  // The largest values: outputs and the arena values live together at the peak.
  std::vector<std::pair<int32_t, bool>> values;  // node, is an output
  for (int32_t o : g_.outputs) values.emplace_back(o, true);
  for (int32_t v : live_at_peak_) values.emplace_back(v, false);
  std::sort(values.begin(), values.end(), [&](const auto& a, const auto& b) {
    const size_t x = bytes_of(g_.nodes[a.first]), y = bytes_of(g_.nodes[b.first]);
    return x != y ? x > y : a.first < b.first;
  });
  values.erase(std::unique(values.begin(), values.end(),
                           [](const auto& a, const auto& b) { return a.first == b.first; }),
               values.end());
  std::string largest;
  for (size_t k = 0; k < values.size() && k < 5; ++k) {
    const ir::GraphNode& node = g_.nodes[values[k].first];
    std::ostringstream shape;
    shape << node.dtype << "[";
    for (size_t d = 0; d < node.shape.size(); ++d) shape << (d ? ", " : "") << node.shape[d];
    shape << "]";
    largest += util::cat(k ? "; " : "", shape.str(), " ", format_bytes(bytes_of(node)), " from ",
                         ir::user_name(node.op), values[k].second ? " (an output)" : "", " at ",
                         util::where(node.loc));
  }
  throw Error(util::cat(
      "cpu: the program needs ", format_bytes(need),
      " when it runs, more than the memory limit of ", format_bytes(limit),
      " (ls::set_memory_limit; default: the machine's memory). Planned: ",
      format_bytes(planned_.arena), " of intermediate values, ", format_bytes(planned_.outputs),
      " of outputs, ", format_bytes(planned_.copies + planned_.scratch),
      " of oneDNN copies and scratch, ", format_bytes(planned_.constants),
      " of constants. Largest values (outputs and those live at the peak): ", largest,
      ". Nothing ran. Use smaller batches or layers, or raise the limit with "
      "ls::set_memory_limit if the machine has the memory"));
}

// An output computed by a fused step may take over the memory of an input (a Data node) that
// the step reads element for element and nothing reads afterwards: an optimizer's update writes
// the new parameter where the old one was. Whether it may, the runtime says per run (no one else
// may still hold the old value); this plans which input each output would take.
void CpuExecutable::plan_donations(const std::vector<int>& last, const std::vector<int32_t>& root) {
  donor_.assign(g_.outputs.size(), -1);
  donor_step_.assign(g_.outputs.size(), -1);
  last_can_fail_ = -1;
  for (size_t si = 0; si < steps_.size(); ++si)
    if (steps_[si].can_fail) last_can_fail_ = static_cast<int>(si);
  std::vector<bool> taken(g_.nodes.size(), false);
  std::vector<int> output_number(g_.nodes.size(), -1);
  for (size_t k = 0; k < g_.outputs.size(); ++k)
    if (output_number[g_.outputs[k]] < 0) output_number[g_.outputs[k]] = static_cast<int>(k);
  for (size_t si = 0; si < steps_.size(); ++si) {
    if (!steps_[si].fused) continue;
    const FusedMembers& members = *steps_[si].fused;
    for (size_t m = 0; m < members.size(); ++m) {
      const auto& [id, tree] = members[m];
      if (output_number[id] < 0) continue;
      for (size_t l = 0; l < tree->leaf_nodes().size(); ++l) {
        const int32_t in = tree->leaf_nodes()[l];
        const ir::GraphNode& src = g_.nodes[in];
        if (src.op != Op::Data || taken[in] || is_output_[in] || !tree->leaf_is_elementwise(l) ||
            src.dtype != g_.nodes[id].dtype || bytes_of(src) != bytes_of(g_.nodes[id]) ||
            last[root[in]] != static_cast<int>(si))
          continue;
        // Later trees of the group must not read the old value after this one overwrote it.
        bool later_reads = false;
        for (size_t m2 = m + 1; m2 < members.size(); ++m2) {
          const auto& ls = members[m2].second->leaf_nodes();
          later_reads = later_reads || std::find(ls.begin(), ls.end(), in) != ls.end();
        }
        if (later_reads) continue;
        taken[in] = true;
        donor_[output_number[id]] = src.input;
        donor_step_[output_number[id]] = static_cast<int>(si);
        break;
      }
    }
  }
}

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  std::shared_ptr<Storage> alloc(size_t bytes) override { return alloc_host(bytes); }
  void copy_in(Storage& dst, const void* src, size_t bytes) override {
    std::memcpy(dst.data(), src, bytes);
  }
  void copy_out(Storage& src, void* dst, size_t bytes) override {
    std::memcpy(dst, src.data(), bytes);
  }
  std::unique_ptr<Executable> compile(const ir::Graph& graph) override {
    return std::make_unique<CpuExecutable>(graph);
  }
};

}  // namespace

Backend& backend() {
  static CpuBackend* b = new CpuBackend;
  return *b;
}

void set_num_threads(int n) { g_threads.store(n < 0 ? 0 : n); }
int num_threads() {
  const int n = g_threads.load();
  return n > 0 ? n : omp_get_num_procs();
}

}  // namespace lockstep::backends::cpu
