// The bucket pass: the gradients DataParallel averages (AllReduce nodes with an order >= 0) are
// all-reduced in buckets, as PyTorch DDP does, in the order backward produces them (their order
// attribute), a bucket closing once it holds its size (the first bucket's smaller, so that
// communication starts early) or when the next gradient has another dtype or scale. The gradients
// ZeroRedundancyOptimizer's stage 2 reduces to their owners (a root >= 0) go in buckets of their
// own, each run of one owner's gradients in a bucket one reduce.
// Each bucket is a region of the plan where its gradients and then their sums live side by side
// (place_gradients) and becomes two steps: a start, right after the last of its gradients is
// computed, that copies in those not computed there and starts a non-blocking all-reduce in
// place; and a wait, which waits for it and scales the sums in place (a reduce's: copies this
// rank's own sums out of the region, which then dies, and scales them there). The
// steps that read the sums (the optimizer's updates, and what depends on them) move after
// everything else (the rest of the backward), grouped by the last bucket they read, each group
// behind its bucket's wait, in the order the buckets started: the communication overlaps the rest
// of the backward and the first buckets' updates (the executable calls into MPI between its
// steps, dist::detail::progress, and so may a progress thread: LOCKSTEP_DIST_PROGRESS_US).
// A reduce's wait comes earlier, before the start of the reduce two after it, so that its region
// (which then holds nothing this rank reads) is free again and the backward does not hold every
// gradient at once. Updates made in place before the last wait, which may fail, keep a copy of
// what they overwrite until it passes (the executable's rollback).
#include <algorithm>
#include <cstring>

#include "backends/cpu/passes.h"
#include "dist/comm.h"
#include "ir/attrs.h"
#include "lockstep/dist.h"
#include "runtime/metrics.h"
#include "util/check.h"

namespace lockstep::backends::cpu {

using plan::bytes_of;

namespace {

// A bucket: its region of the plan (plan::Plan::regions), where its sums live side by side, and
// the collective in flight, shared by its start and wait steps.
struct Bucket {
  std::vector<int32_t> members, operands;
  std::vector<size_t> offset;  // bytes into the region
  std::vector<int64_t> count;  // elements
  DType dtype = DType::F32;
  std::vector<int64_t> root;  // per member: the rank it is reduced to (-1: all of them)
  double scale = 1;
  size_t bytes = 0;
  int32_t region = -1;
  std::vector<std::shared_ptr<dist::detail::InFlight>> ops;
  std::string what;
};

// bf16 gradients are not packed yet: each is summed on its own, in f32 (lower_collective); nor
// are integers with a scale (whose sums are not scaled, as ref computes them).
bool bucketable(const ir::GraphNode& n) {
  if (n.op != ir::Op::AllReduce || n.dtype == DType::BF16) return false;
  const ir::AllReduceAttrs a = ir::AllReduceAttrs::of(n.attrs);
  if (a.order < 0) return false;
  return n.dtype == DType::F32 || n.dtype == DType::F64 || a.scale == 1.0;
}

template <typename T>
void scale_in_place(void* data, int64_t n, double scale) {
  T* d = static_cast<T*>(data);
  for (int64_t i = 0; i < n; ++i) d[i] = static_cast<T>(d[i] * scale);  // as ref's all_reduce
}

std::string describe(const ir::Graph& g, const Bucket& b, int number, size_t in_place) {
  const ir::GraphNode& first = g.nodes[b.members.front()];
  return util::cat(b.root.front() < 0 ? "all_reduce" : "reduce", " of bucket ", number, " (",
                   b.members.size(), " gradient", b.members.size() > 1 ? "s" : "", ", ", b.bytes,
                   " bytes, ", in_place, " computed in place) recorded at ",
                   util::where(first.origin.loc));
}

// The bytes into its memory root (plan::memory_roots) at which value `v` lives: 0 for the root,
// each contiguous slice's offset added along the aliases between.
int64_t alias_offset(const ir::Graph& g, const std::vector<int32_t>& root, int32_t v) {
  int64_t at = 0;
  while (v != root[v]) {
    at += std::max<int64_t>(0, plan::slice_offset(g, v));
    v = g.nodes[v].operands[0];
  }
  return at;
}

// Whether `step` reads value `r` only to be ordered after it: a broadcast's operands before its
// value (ir.h).
bool orders_only(const ir::Graph& g, const plan::Step& step, int32_t r) {
  if (step.kind == plan::StepKind::Check || step.node < 0) return false;
  const ir::GraphNode& n = g.nodes[step.node];
  return n.op == ir::Op::Broadcast && r != n.operands.back();
}

// A sharded parameter's gather (fully_shard): a broadcast with a gather.
bool is_gather(const ir::GraphNode& n) {
  return n.op == ir::Op::Broadcast &&
         ir::BroadcastAttrs::of(n.attrs).gather != ir::BroadcastAttrs::Gather::None;
}

// Gradients the backward computes straight into their bucket's region (as PyTorch DDP's
// gradient_as_bucket_view), so that the start packs nothing for them and the all-reduce sums
// them in place: a member's operand, through the reshapes that alias it, when it is a value of
// the program's own (not an input, a constant or an output), held plain, of the member's size,
// and read by nothing after the bucket starts (the all-reduce overwrites it with the sum).
// `start` per bucket: its start step's place in the final order. Returns per bucket how many.
std::vector<size_t> place_gradients(plan::Plan& p,
                                    const std::vector<std::shared_ptr<Bucket>>& buckets,
                                    const std::vector<size_t>& start) {
  const ir::Graph& g = p.graph;
  const size_t n = g.nodes.size();
  const std::vector<int32_t> root = plan::memory_roots(p);
  // Per memory, the last step that reads it (or a value aliasing it).
  std::vector<int> last_read(n, -1);
  for (size_t s = 0; s < p.steps.size(); ++s)
    for (int32_t r : p.steps[s].reads) last_read[root[r]] = static_cast<int>(s);
  const std::vector<int> producer = p.producers();
  p.placed.assign(n, {-1, 0});
  std::vector<size_t> in_place(buckets.size(), 0);
  for (size_t k = 0; k < buckets.size(); ++k) {
    Bucket& b = *buckets[k];
    const bool reduce = b.root.front() >= 0;
    auto slot = [&](size_t m) {
      return std::pair<int32_t, int64_t>{b.region, static_cast<int64_t>(b.offset[m])};
    };
    // This rank's results of a reduce are not kept in the region: the wait copies them out, so
    // that what it keeps after the step (its own gradients) holds no other rank's share alive.
    // The others' stay there (nothing meaningful: the broadcasts' reads of them only ordered
    // them, and drop_ordering_reads takes those away).
    for (size_t m = 0; m < b.members.size(); ++m)
      if (!reduce || b.root[m] != dist::rank()) p.placed[b.members[m]] = slot(m);
    for (size_t m = 0; m < b.members.size(); ++m) {
      // The members whose operands are runs of one value, side by side in the region as in it
      // (ZeroRedundancyOptimizer's runs of a split gradient, each reduced to its rank): that
      // value goes where the first run is, and each run is already in place.
      const int32_t r = root[b.operands[m]];
      size_t runs = 1;
      size_t bytes = plan::bytes_of(g.nodes[b.members[m]]);
      if (r != b.operands[m]) {
        if (alias_offset(g, root, b.operands[m]) != 0) continue;
        while (m + runs < b.members.size() && root[b.operands[m + runs]] == r &&
               alias_offset(g, root, b.operands[m + runs]) == static_cast<int64_t>(bytes) &&
               b.offset[m + runs] == b.offset[m] + bytes)
          bytes += plan::bytes_of(g.nodes[b.members[m + runs++]]);
      }
      const ir::GraphNode& value = g.nodes[r];
      if (value.op == ir::Op::Data || p.constant_at[r] >= 0 || p.is_output[r] || producer[r] < 0 ||
          p.placed[r].first >= 0 || decisions(p).blocked[r] || value.dtype != b.dtype ||
          plan::bytes_of(value) != bytes || last_read[r] > static_cast<int>(start[k]))
        continue;
      p.placed[r] = slot(m);
      in_place[k] += runs;
      m += runs - 1;
    }
  }
  return in_place;
}

// The graph's canonical order puts the small steps that finish a gradient (a reshape of a sum, a
// cast) next to their reader, the update, long after the backward computed what they read: the
// steps up to kFinishDepth links up each bucketed gradient's chain move to right after the steps
// they read, so that its bucket can start as soon as the backward has computed it.
constexpr int kFinishDepth = 3;

// Reduces to owners (ZeroRedundancyOptimizer's stages 2 and 3) in flight at once.
constexpr size_t kReducesInFlight = 2;

// fully_shard's gathers in flight at once: up to this many times the largest one's bytes.
constexpr size_t kGatherWindow = 2;

void hoist_gradient_finish(plan::Plan& p, const std::vector<int32_t>& nodes) {
  const std::vector<int> producer = p.producers();
  std::vector<bool> hoist(p.steps.size(), false);
  std::vector<std::pair<int32_t, int>> todo;  // value, depth
  for (int32_t id : nodes) todo.emplace_back(p.graph.nodes[id].operands[0], 0);
  while (!todo.empty()) {
    const auto [v, depth] = todo.back();
    todo.pop_back();
    const int s = producer[v];
    if (s < 0 || hoist[s]) continue;
    hoist[s] = true;
    if (depth + 1 < kFinishDepth)
      for (int32_t r : p.steps[s].reads) todo.emplace_back(r, depth + 1);
  }
  // In order, each hoisted step goes right after the last step (in the new order) it reads from.
  std::vector<plan::Step> order;
  std::vector<bool> moved;                        // per step of `order`: hoisted
  std::vector<int> at(p.graph.nodes.size(), -1);  // position in `order` of each value's writer
  for (size_t s = 0; s < p.steps.size(); ++s) {
    plan::Step& step = p.steps[s];
    size_t pos = order.size();
    if (hoist[s] && step.kind != plan::StepKind::Check) {
      int after = -1;
      for (int32_t r : step.reads) after = std::max(after, at[r]);
      pos = static_cast<size_t>(after + 1);
      while (pos < order.size() && moved[pos]) ++pos;  // after those hoisted there before it
    }
    for (int32_t w : step.writes()) at[w] = static_cast<int>(pos);
    order.insert(order.begin() + static_cast<std::ptrdiff_t>(pos), std::move(step));
    moved.insert(moved.begin() + static_cast<std::ptrdiff_t>(pos), hoist[s]);
    for (size_t k = pos + 1; k < order.size(); ++k)
      for (int32_t w : order[k].writes()) at[w] = static_cast<int>(k);
  }
  p.steps = std::move(order);
}

// A reduce leaves the other ranks' sums meaningless here; the broadcasts after it read them only
// to be ordered after it (a broadcast's operands before its value only order it: ir.h). Once the
// steps are in their final order those reads go, so that the bucket's region (where they are
// placed) dies at its wait rather than at the last broadcast (plan_memory).
void drop_ordering_reads(plan::Plan& p, const std::vector<std::shared_ptr<Bucket>>& buckets) {
  const ir::Graph& g = p.graph;
  std::vector<bool> others(g.nodes.size(), false);
  for (const auto& b : buckets)
    for (size_t m = 0; m < b->members.size(); ++m)
      if (b->root[m] >= 0 && b->root[m] != dist::rank()) others[b->members[m]] = true;
  for (plan::Step& step : p.steps)
    std::erase_if(step.reads, [&](int32_t r) { return others[r] && orders_only(g, step, r); });
}

}  // namespace

void bucket_all_reduces(plan::Plan& p) {
  const ir::Graph& g = p.graph;
  std::vector<int32_t> nodes;
  for (const plan::Step& s : p.steps)
    if (s.kind != plan::StepKind::Check && s.node >= 0 && bucketable(g.nodes[s.node]) &&
        !bucketable(g.nodes[g.nodes[s.node].operands[0]]))
      nodes.push_back(s.node);
  if (nodes.empty()) return;
  std::stable_sort(nodes.begin(), nodes.end(), [&](int32_t a, int32_t b) {
    return ir::AllReduceAttrs::of(g.nodes[a].attrs).order <
           ir::AllReduceAttrs::of(g.nodes[b].attrs).order;
  });
  hoist_gradient_finish(p, nodes);
  const std::vector<int> producer = p.producers();

  // PyTorch's assignment (reducer.cpp, compute_bucket_assignment_by_size): a gradient joins the
  // open bucket, which closes once it holds its size or more; so a large gradient shares its
  // bucket with the small ones before it, and the last bucket (the first layers', computed last)
  // holds what is left rather than a whole bucket's size.
  std::vector<std::shared_ptr<Bucket>> buckets;
  const std::vector<int32_t> root = plan::memory_roots(p);
  bool full = true;  // the last bucket reached its size
  size_t end = 0;    // where the open bucket's last member ends (its bytes are padded to 64)
  for (int32_t id : nodes) {
    const ir::GraphNode& n = g.nodes[id];
    const ir::AllReduceAttrs attrs = ir::AllReduceAttrs::of(n.attrs);
    const double scale = attrs.scale;
    // A run of the value the member before it is a run of, right after that one in it
    // (ZeroRedundancyOptimizer's runs of a split gradient): in the same bucket, right after it in
    // the region too, so that the value can be computed there (place_gradients).
    const int32_t x = n.operands[0];
    Bucket* open = buckets.empty() ? nullptr : buckets.back().get();
    const bool follows = open && root[x] != x && root[x] == root[open->operands.back()] &&
                         open->dtype == n.dtype && open->scale == scale &&
                         open->root.front() >= 0 && attrs.root >= 0 &&
                         alias_offset(g, root, x) ==
                             alias_offset(g, root, open->operands.back()) +
                                 static_cast<int64_t>(bytes_of(g.nodes[open->members.back()]));
    Bucket* b = full && !follows ? nullptr : open;
    if (!b || b->dtype != n.dtype || b->scale != scale ||
        (b->root.front() < 0) != (attrs.root < 0)) {
      buckets.push_back(std::make_shared<Bucket>());
      b = buckets.back().get();
      b->dtype = n.dtype;
      b->scale = scale;
    }
    const size_t at = follows ? end : b->bytes;
    b->members.push_back(id);
    b->root.push_back(attrs.root);
    b->operands.push_back(x);
    b->offset.push_back(at);
    b->count.push_back(shape_numel(n.shape));
    end = at + bytes_of(n);
    b->bytes = (end + 63) / 64 * 64;
    full = b->bytes >=
           static_cast<size_t>(buckets.size() == 1 ? attrs.first_bucket_bytes : attrs.bucket_bytes);
  }

  // Per bucket, its start (after the step `start_after`) and its wait.
  std::vector<plan::Step> starts, waits;
  std::vector<int> start_after;
  std::vector<bool> removed(g.nodes.size(), false);
  for (size_t k = 0; k < buckets.size(); ++k) {
    const std::shared_ptr<Bucket> b = buckets[k];
    b->region = static_cast<int32_t>(p.regions.size());
    p.regions.push_back(b->bytes);
    int made = -1;
    for (size_t m = 0; m < b->members.size(); ++m) {
      made = std::max(made, producer[b->operands[m]]);
      removed[b->members[m]] = true;
    }
    plan::Step start;
    start.label = "all_reduce_start";
    start.kind = plan::StepKind::Start;
    start.node = b->members.front();
    start.reads = b->operands;
    start.region = b->region;
    start.can_fail = true;
    auto sp = std::make_shared<CpuStep>();
    sp->run = [b](Ctx& c) {
      // The gradients not computed in place are copied in (the region holds each one).
      const std::shared_ptr<Storage>& region = (*c.regions)[static_cast<size_t>(b->region)];
      for (size_t m = 0; m < b->members.size(); ++m) {
        const size_t bytes = static_cast<size_t>(b->count[m]) * dtype_size(b->dtype);
        char* slot = static_cast<char*>(region->data()) + b->offset[m];
        if (bytes && c.ptr[b->operands[m]] != slot) std::memcpy(slot, c.ptr[b->operands[m]], bytes);
      }
      const size_t elem = dtype_size(b->dtype);
      // One all-reduce of the region; or one reduce per run of members with the same root.
      for (size_t m = 0; m < b->members.size();) {
        size_t end = m + 1;
        while (b->root[m] >= 0 && end < b->members.size() && b->root[end] == b->root[m]) ++end;
        if (b->root[m] < 0) end = b->members.size();
        const size_t to = end < b->members.size() ? b->offset[end] : b->bytes;
        b->ops.push_back(dist::detail::start_all_reduce(
            static_cast<char*>(region->data()) + b->offset[m],
            static_cast<int64_t>((to - b->offset[m]) / elem), b->dtype, region, b->what,
            static_cast<int>(b->root[m])));
        m = end;
      }
    };
    start.payload = sp;
    plan::Step wait;
    wait.label = "all_reduce_wait";
    wait.node = b->members.front();
    wait.extras.assign(b->members.begin() + 1, b->members.end());
    wait.region = b->region;
    wait.can_fail = true;
    auto wp = std::make_shared<CpuStep>();
    wp->run = [b](Ctx& c) {
      std::vector<std::shared_ptr<dist::detail::InFlight>> ops = std::move(b->ops);
      b->ops.clear();
      LS_INTERNAL_CHECK(!ops.empty(), "an all-reduce wait without its start");
      // The communication not hidden behind the steps since the start (metrics timer).
      const int64_t t0 = runtime::now_ns();
      for (const auto& op : ops) dist::detail::wait(*op);
      runtime::time_ns(runtime::Timer::AllReduceWait, runtime::now_ns() - t0);
      if (b->root.front() >= 0) {
        // This rank's sums out of the region (the others' members hold nothing meaningful).
        const char* region =
            static_cast<const char*>((*c.regions)[static_cast<size_t>(b->region)]->data());
        for (size_t m = 0; m < b->members.size(); ++m) {
          if (b->root[m] != dist::rank()) continue;
          const size_t bytes = static_cast<size_t>(b->count[m]) * dtype_size(b->dtype);
          if (bytes) std::memcpy(c.ptr[b->members[m]], region + b->offset[m], bytes);
        }
      }
      if (b->scale == 1.0) return;  // integers are bucketed only so (bucketable)
      for (size_t m = 0; m < b->members.size(); ++m) {
        if (b->root[m] >= 0 && b->root[m] != dist::rank()) continue;
        if (b->dtype == DType::F32)
          scale_in_place<float>(c.ptr[b->members[m]], b->count[m], b->scale);
        else
          scale_in_place<double>(c.ptr[b->members[m]], b->count[m], b->scale);
      }
    };
    wait.payload = wp;
    starts.push_back(std::move(start));
    start_after.push_back(made);
    waits.push_back(std::move(wait));
  }
  // Buckets in the order they start; each member value's bucket, in that order.
  std::vector<size_t> by_start(buckets.size());
  for (size_t k = 0; k < by_start.size(); ++k) by_start[k] = k;
  std::stable_sort(by_start.begin(), by_start.end(),
                   [&](size_t a, size_t b) { return start_after[a] < start_after[b]; });
  std::vector<int> need(g.nodes.size(), -1);  // per value: the last bucket (rank) it waits for
  for (size_t r = 0; r < by_start.size(); ++r)
    for (int32_t m : buckets[by_start[r]]->members) need[m] = static_cast<int>(r);
  // What reads a sum, directly or not, goes after the rest: behind the wait of the last bucket it
  // reads, in the order the buckets started (the first updates run while later buckets are still
  // in flight).
  // A reduce's wait goes before the start of the reduce kReducesInFlight after it: the sums are
  // copied out to their owner there, and its region is free again (plan_memory), so that the
  // backward holds at most that many reduce buckets' gradients besides the one it is filling, not
  // every gradient at once.
  std::vector<size_t> rank_of(buckets.size());
  for (size_t r = 0; r < by_start.size(); ++r) rank_of[by_start[r]] = r;
  const auto is_reduce = [&](size_t k) { return buckets[k]->root.front() >= 0; };
  std::vector<bool> waited(buckets.size(), false);
  std::vector<plan::Step> early;
  std::vector<std::vector<plan::Step>> late(buckets.size());
  auto emit_starts = [&](int after) {
    for (size_t k = 0; k < starts.size(); ++k) {
      if (start_after[k] != after) continue;
      if (is_reduce(k) && rank_of[k] >= kReducesInFlight) {
        const size_t w = by_start[rank_of[k] - kReducesInFlight];
        if (is_reduce(w) && !waited[w]) {
          early.push_back(std::move(waits[w]));
          waited[w] = true;
        }
      }
      early.push_back(std::move(starts[k]));
    }
  };
  emit_starts(-1);
  for (size_t s = 0; s < p.steps.size(); ++s) {
    plan::Step& step = p.steps[s];
    const bool member = step.kind != plan::StepKind::Check && step.node >= 0 &&
                        removed[step.node] && step.extras.empty();
    if (!member) {
      int waits_for = -1;
      for (int32_t r : step.reads) waits_for = std::max(waits_for, need[r]);
      if (waits_for >= 0) {
        for (int32_t w : step.writes()) need[w] = waits_for;
        late[static_cast<size_t>(waits_for)].push_back(std::move(step));
      } else {
        early.push_back(std::move(step));
      }
    }
    emit_starts(static_cast<int>(s));
  }
  for (size_t r = 0; r < by_start.size(); ++r) {
    if (!waited[by_start[r]]) early.push_back(std::move(waits[by_start[r]]));
    for (plan::Step& l : late[r]) early.push_back(std::move(l));
  }
  p.steps = std::move(early);
  // Each start's place in the final order (a start and its wait write the bucket's first
  // member), then the gradients computed in their region, then the steps' description.
  std::vector<int> bucket_of(g.nodes.size(), -1);
  for (size_t k = 0; k < buckets.size(); ++k)
    bucket_of[buckets[k]->members.front()] = static_cast<int>(k);
  std::vector<size_t> start(buckets.size(), 0);
  std::vector<std::vector<plan::Step*>> described(buckets.size());
  for (size_t s = 0; s < p.steps.size(); ++s) {
    plan::Step& step = p.steps[s];
    const int k = step.node >= 0 && step.kind != plan::StepKind::Check ? bucket_of[step.node] : -1;
    if (k < 0) continue;
    if (step.kind == plan::StepKind::Start) start[static_cast<size_t>(k)] = s;
    described[static_cast<size_t>(k)].push_back(&step);
  }
  const std::vector<size_t> in_place = place_gradients(p, buckets, start);
  drop_ordering_reads(p, buckets);
  for (size_t k = 0; k < buckets.size(); ++k) {
    buckets[k]->what = describe(g, *buckets[k], static_cast<int>(k) + 1, in_place[k]);
    for (plan::Step* step : described[k]) step->detail = buckets[k]->what;
  }
  runtime::count(runtime::Counter::AllReduceBuckets, static_cast<int64_t>(buckets.size()));
}

// A concatenation of broadcasts read by nothing else (ZeroRedundancyOptimizer's join of a split
// parameter's runs, each from its rank; under fully_shard, the runs' gathers): each broadcast
// receives straight into its place in the concatenation, which lives in a region of its own with
// the outputs that reshape it (the parameter's new value), so the join copies nothing and the
// step holds the runs once, not as the runs, their concatenation and the parameter.
void join_broadcasts(plan::Plan& p) {
  const ir::Graph& g = p.graph;
  const size_t n = g.nodes.size();
  // The steps reading each value, and the last of them; a broadcast's operands before its value
  // only order it (ir.h: the join's runs are broadcast one after the other), not read.
  std::vector<int> readers(n, 0), reader(n, -1);
  for (size_t s = 0; s < p.steps.size(); ++s)
    for (int32_t r : p.steps[s].reads)
      if (!orders_only(g, p.steps[s], r)) ++readers[r], reader[r] = static_cast<int>(s);
  auto free_to_place = [&](int32_t v) {
    return p.run_time[v] && p.constant_at[v] < 0 && g.nodes[v].op != ir::Op::Data &&
           (p.placed.empty() || p.placed[v].first < 0);
  };
  for (const plan::Step& step : p.steps) {
    const int32_t c = step.node;
    const ir::GraphNode& cat = g.nodes[c];
    if (step.kind == plan::StepKind::Check || cat.op != ir::Op::Concat || !free_to_place(c))
      continue;
    bool joins = true;  // each operand a contiguous block of the result
    for (int64_t d = 0; d < cat.attrs[0]; ++d) joins = joins && cat.shape[d] == 1;
    for (int32_t o : cat.operands) {  // (one operand twice: read twice, by the concatenation)
      const ir::GraphNode& b = g.nodes[o];
      joins = joins && b.op == ir::Op::Broadcast && free_to_place(o) && !p.is_output[o] &&
              readers[o] == 1 && b.dtype == cat.dtype;
    }
    if (!joins) continue;
    if (p.placed.empty()) p.placed.assign(n, {-1, 0});
    const auto region = static_cast<int32_t>(p.regions.size());
    p.regions.push_back(bytes_of(cat));
    p.placed[c] = {region, 0};
    int64_t at = 0;
    for (int32_t o : cat.operands) {
      p.placed[o] = {region, at};
      at += static_cast<int64_t>(bytes_of(g.nodes[o]));
    }
    // The reshapes of it that are outputs hold the same bytes (a reshape that aliases it lives
    // there anyway): its readers', one after the other, while each is its value's only reader.
    for (int32_t v = c; readers[v] == 1;) {
      const int32_t r = p.steps[static_cast<size_t>(reader[v])].node;
      if (g.nodes[r].op != ir::Op::Reshape || !free_to_place(r)) break;
      if (p.is_output[r]) p.placed[r] = {region, 0};
      v = r;
    }
  }
}

namespace {

// Broadcast step `step` split in two: returns its start (reading `reads`, receiving its value,
// which the start keeps alive past a failure: Ctx::held) and makes `step` its wait, timed by
// `timer`. `gather`: fully_shard's (gather_start and gather_wait; it may start the progress
// thread), else a plain broadcast's (broadcast_start and broadcast_wait).
plan::Step start_and_wait(const ir::Graph& g, plan::Step& step, std::vector<int32_t> reads,
                          bool gather, const std::string& what) {
  const int32_t id = step.node, x = g.nodes[id].operands.back();
  const int root = static_cast<int>(ir::BroadcastAttrs::of(g.nodes[id].attrs).root);
  const size_t bytes = bytes_of(g.nodes[id]);
  const runtime::Timer timer = gather ? runtime::Timer::GatherWait : runtime::Timer::BroadcastWait;
  auto in_flight = std::make_shared<std::shared_ptr<dist::detail::InFlight>>();
  plan::Step start;
  start.label = gather ? "gather_start" : "broadcast_start";
  start.kind = plan::StepKind::Start;
  start.node = id;
  start.reads = std::move(reads);
  start.receives = {id};
  start.can_fail = true;
  start.detail = what;
  auto sp = std::make_shared<CpuStep>();
  sp->run = [=](Ctx& c) {
    *in_flight =
        dist::detail::start_broadcast(c.ptr[id], c.ptr[x], bytes, root, c.held(), what, gather);
  };
  start.payload = sp;
  auto wp = std::make_shared<CpuStep>();
  wp->run = [=](Ctx&) {
    const std::shared_ptr<dist::detail::InFlight> op = std::move(*in_flight);
    in_flight->reset();
    LS_INTERNAL_CHECK(op != nullptr, util::cat(what, ": a wait without its start"));
    // The communication not hidden behind the steps since the start (metrics timer).
    const int64_t t0 = runtime::now_ns();
    dist::detail::wait(*op);
    runtime::time_ns(timer, runtime::now_ns() - t0);
  };
  step.label = gather ? "gather_wait" : "broadcast_wait";
  step.detail = what;
  step.reads.clear();
  step.can_fail = true;
  step.payload = wp;
  return start;
}

}  // namespace

// The gathers of sharded parameters (fully_shard: a Broadcast with a gather, lowered as a blocking
// broadcast) become a start and a wait: the wait where the broadcast was, the start as early as
// the gathers in flight allow (FSDP's prefetch of the next modules' all-gathers): right after the
// wait of the earliest gather before it such that the gathers started and not yet waited for
// hold at most kGatherWindow times the largest gather's bytes (at least right after the wait of
// the one before it; never before what computes its value). One ahead was not enough: a layer's
// small gathers (a batch norm's weight and bias) sit between a convolution's weight and the
// next's, so the next convolution's weight was in flight only while the batch norm ran. Its
// memory is in use from the start (Step::receives). Every rank starts them in the same order.
void prefetch_gathers(plan::Plan& p) {
  const ir::Graph& g = p.graph;
  std::vector<size_t> at;  // the gathers' steps, in order
  for (size_t s = 0; s < p.steps.size(); ++s) {
    const plan::Step& step = p.steps[s];
    if (step.kind != plan::StepKind::Check && step.node >= 0 && is_gather(g.nodes[step.node]))
      at.push_back(s);
  }
  if (at.empty()) return;
  const std::vector<int> producer = p.producers();
  std::vector<size_t> sizes(at.size());
  for (size_t k = 0; k < at.size(); ++k) sizes[k] = bytes_of(g.nodes[p.steps[at[k]].node]);
  // The window is of whole parameters: a split one's gather is its runs' together (joined by a
  // concatenation), so that the next parameter's runs start while this one's are in use.
  size_t largest = *std::max_element(sizes.begin(), sizes.end());
  for (const plan::Step& step : p.steps)
    if (step.kind != plan::StepKind::Check && step.node >= 0 &&
        g.nodes[step.node].op == ir::Op::Concat)
      for (int32_t o : g.nodes[step.node].operands)
        if (is_gather(g.nodes[o])) largest = std::max(largest, bytes_of(g.nodes[step.node]));
  const size_t window = kGatherWindow * largest;
  size_t first = 0, in_flight_bytes = 0;  // gathers first..k would be in flight at k's start
  int previous = -1;                      // where the gather before k starts after
  std::vector<std::vector<plan::Step>> before(p.steps.size());  // starts, by the step they precede
  for (size_t k = 0; k < at.size(); ++k) {
    plan::Step& step = p.steps[at[k]];
    const int32_t id = step.node, x = g.nodes[id].operands.back();
    const std::string what =
        util::cat("gather of ", g.nodes[x].name ? *g.nodes[x].name : "a parameter", " recorded at ",
                  util::where(g.nodes[id].origin.loc));
    plan::Step start = start_and_wait(g, step, step.reads, true, what);
    in_flight_bytes += sizes[k];
    while (first < k && in_flight_bytes > window) in_flight_bytes -= sizes[first++];
    int after = first == 0 ? -1 : static_cast<int>(at[first - 1]);
    for (int32_t r : start.reads) after = std::max(after, producer[r]);
    after = std::max(after, previous);
    previous = after;
    before[static_cast<size_t>(after + 1)].push_back(std::move(start));
  }
  std::vector<plan::Step> order;
  order.reserve(p.steps.size() + at.size());
  for (size_t s = 0; s < p.steps.size(); ++s) {
    for (plan::Step& start : before[s]) order.push_back(std::move(start));
    order.push_back(std::move(p.steps[s]));
  }
  p.steps = std::move(order);
}

// The step's plain broadcasts (not gathers: ZeroRedundancyOptimizer's, each parameter or run from
// the rank that updated it; DataParallel's buffers from rank 0) become a start and a wait: the
// start where the broadcast was, so every rank starts them in the same order, the wait right
// before the first step that reads the value (else at the program's end). The broadcasts of a
// step are then in flight together and behind the updates after them: a split parameter's runs,
// each from its rank, move both ways at once instead of one rank's after another's. A broadcast's
// read of an earlier broadcast only orders it (ir.h): its start follows that one's start, which
// the order of the starts keeps. Its memory is in use from the start (Step::receives), and kept
// alive by it past a failure (Ctx::held).
void overlap_broadcasts(plan::Plan& p) {
  const ir::Graph& g = p.graph;
  auto plain_broadcast = [&](const plan::Step& step) {
    if (step.kind != plan::StepKind::Kernel || step.node < 0) return false;
    const ir::GraphNode& n = g.nodes[step.node];
    return n.op == ir::Op::Broadcast && !is_gather(n);
  };
  std::vector<bool> broadcast(g.nodes.size(), false);
  for (const plan::Step& step : p.steps)
    if (plain_broadcast(step)) broadcast[step.node] = true;
  if (std::find(broadcast.begin(), broadcast.end(), true) == broadcast.end()) return;
  // Each broadcast's first reader (an ordering read by another broadcast is none).
  std::vector<int> first_reader(g.nodes.size(), -1);
  for (size_t s = 0; s < p.steps.size(); ++s)
    for (int32_t r : p.steps[s].reads)
      if (broadcast[r] && first_reader[r] < 0 && !orders_only(g, p.steps[s], r))
        first_reader[r] = static_cast<int>(s);
  std::vector<std::vector<plan::Step>> waits_before(p.steps.size() + 1);
  std::vector<plan::Step> order;
  order.reserve(p.steps.size() * 2);
  for (size_t s = 0; s < p.steps.size(); ++s) {
    for (plan::Step& wait : waits_before[s]) order.push_back(std::move(wait));
    plan::Step& step = p.steps[s];
    if (!plain_broadcast(step)) {
      order.push_back(std::move(step));
      continue;
    }
    const int32_t id = step.node;
    std::vector<int32_t> reads;
    for (int32_t r : step.reads)
      if (!broadcast[r]) reads.push_back(r);
    plan::Step start =
        start_and_wait(g, step, std::move(reads), false,
                       util::cat("broadcast recorded at ", util::where(g.nodes[id].origin.loc)));
    order.push_back(std::move(start));
    const int reader = first_reader[id];
    waits_before[reader < 0 ? p.steps.size() : static_cast<size_t>(reader)].push_back(
        std::move(step));
  }
  for (plan::Step& wait : waits_before.back()) order.push_back(std::move(wait));
  p.steps = std::move(order);
}

}  // namespace lockstep::backends::cpu
