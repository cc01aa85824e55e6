// PyTorch ZeroRedundancyOptimizer's partition of tensors over ranks: the largest first, each to
// the rank holding the fewest elements so far (the lowest such rank). The same on every rank:
// it depends on the sizes alone.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "lockstep/dist.h"
#include "lockstep/tensor.h"

namespace lockstep::dist::detail {

// The rank of each size's tensor; `load` (the elements each rank holds already) is added to.
inline std::vector<int> partition_by_size(const std::vector<int64_t>& sizes,
                                          std::vector<int64_t>& load) {
  std::vector<size_t> order(sizes.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return sizes[a] > sizes[b]; });
  std::vector<int> owners(sizes.size(), 0);
  for (size_t i : order) {
    const auto lightest = std::min_element(load.begin(), load.end()) - load.begin();
    owners[i] = static_cast<int>(lightest);
    load[static_cast<size_t>(lightest)] += std::max<int64_t>(sizes[i], 1);
  }
  return owners;
}

// The same from nothing held yet, over `world` ranks.
inline std::vector<int> partition_by_size(const std::vector<int64_t>& sizes, int world) {
  std::vector<int64_t> load(static_cast<size_t>(world), 0);
  return partition_by_size(sizes, load);
}

using Run = ZeroRedundancyOptimizer::Run;

// ZeRO's layout, every stage (DeepSpeed's flat partition, for the tensors that need it): a
// tensor larger than an even share of all the elements (`sizes`' sum over `world`) is split; the
// others are partitioned whole (partition_by_size), then the split ones, laid end to end, are
// cut into one run per rank so that every rank holds the same number of elements to one (or, when
// a whole tensor already gives a rank more than that, the others even). `owners`: per tensor, its
// rank, or -1 when split; `runs`: per tensor, each rank's run (empty when whole; a run of 0
// elements when that rank has none of it); `load`: the elements each rank holds.
struct Layout {
  std::vector<int> owners;
  std::vector<std::vector<Run>> runs;
  std::vector<int64_t> load;
};

inline Layout split_layout(const std::vector<int64_t>& sizes, int world) {
  Layout l;
  const size_t ranks = static_cast<size_t>(world);
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  std::vector<size_t> whole;
  std::vector<int64_t> whole_sizes;
  int64_t flat = 0;  // the split tensors' elements
  l.owners.assign(sizes.size(), -1);
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (world > 1 && sizes[i] >= world && sizes[i] * world > total) {
      flat += sizes[i];
      continue;
    }
    whole.push_back(i);
    whole_sizes.push_back(sizes[i]);
  }
  l.load.assign(ranks, 0);
  const std::vector<int> owners = partition_by_size(whole_sizes, l.load);
  for (size_t k = 0; k < whole.size(); ++k) l.owners[whole[k]] = owners[k];
  l.runs.assign(sizes.size(), {});
  if (flat == 0) return l;
  // Each rank's quota of the split elements: the lowest level every rank is filled to.
  auto filled = [&](int64_t level) {
    int64_t n = 0;
    for (int64_t held : l.load) n += std::max<int64_t>(0, level - held);
    return n;
  };
  int64_t lo = 0, hi = total;  // filled(hi) >= flat
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (filled(mid) >= flat)
      hi = mid;
    else
      lo = mid + 1;
  }
  std::vector<int64_t> quota(ranks);
  int64_t left = flat;
  for (size_t r = 0; r < ranks; ++r) left -= quota[r] = std::max<int64_t>(0, lo - 1 - l.load[r]);
  for (size_t r = 0; r < ranks && left > 0; ++r)
    if (l.load[r] < lo) ++quota[r], --left;
  // The split tensors end to end, rank r's quota after rank r - 1's.
  std::vector<int64_t> begin(ranks + 1, 0);
  for (size_t r = 0; r < ranks; ++r) begin[r + 1] = begin[r] + quota[r];
  int64_t base = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (l.owners[i] >= 0) continue;
    for (size_t r = 0; r < ranks; ++r) {
      const int64_t a = std::clamp(begin[r], base, base + sizes[i]);
      const int64_t b = std::clamp(begin[r + 1], base, base + sizes[i]);
      l.runs[i].push_back({a - base, b - a});
      l.load[r] += b - a;
    }
    base += sizes[i];
  }
  return l;
}

inline std::vector<int64_t> sizes_of(const std::vector<Tensor>& tensors) {
  std::vector<int64_t> sizes;
  for (const Tensor& t : tensors) sizes.push_back(t.numel());
  return sizes;
}

}  // namespace lockstep::dist::detail
