// PyTorch ZeroRedundancyOptimizer's partition of tensors over ranks: the largest first, each to
// the rank holding the fewest elements so far (the lowest such rank). The same on every rank:
// it depends on the sizes alone.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

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

inline std::vector<int64_t> sizes_of(const std::vector<Tensor>& tensors) {
  std::vector<int64_t> sizes;
  for (const Tensor& t : tensors) sizes.push_back(t.numel());
  return sizes;
}

}  // namespace lockstep::dist::detail
