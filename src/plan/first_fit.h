// Greedy first-fit placement of values in one block of memory, in step order: a value lives from
// the step that places it to its last step; blocks whose values are dead are reused. The arena
// (memory.cpp) and a backend's own copies (the cpu's shared convolution operand copies) use it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <queue>
#include <vector>

namespace lockstep::plan {

class FirstFit {
 public:
  // Where a value of `size` placed at step `now` and last used at step `last` goes: the lowest
  // offset where it fits between the values still live. Live values are kept sorted by offset
  // (and then by placement) and leave through a queue ordered by their last step, so a program of
  // 100,000 small values does not sort them again at every placement.
  size_t place(size_t size, int64_t now, int64_t last) {
    while (!dying_.empty() && dying_.top().last < now) {
      const Block dead = dying_.top();
      dying_.pop();
      live_.erase(std::lower_bound(live_.begin(), live_.end(), dead, by_offset));
    }
    size_t offset = 0;
    for (const Block& b : live_) {
      if (b.offset >= offset + size) break;
      offset = std::max(offset, b.offset + b.size);
    }
    const Block block{offset, size, last, next_++};
    live_.insert(std::upper_bound(live_.begin(), live_.end(), block, by_offset), block);
    dying_.push(block);
    peak_ = std::max(peak_, offset + size);
    return offset;
  }
  size_t peak() const { return peak_; }

 private:
  struct Block {
    size_t offset, size;
    int64_t last;
    uint64_t order;  // placements so far: tells apart empty values at one offset
  };
  static bool by_offset(const Block& a, const Block& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.order < b.order;
  }
  struct LaterLast {
    bool operator()(const Block& a, const Block& b) const { return a.last > b.last; }
  };
  std::vector<Block> live_;  // sorted by_offset
  std::priority_queue<Block, std::vector<Block>, LaterLast> dying_;
  uint64_t next_ = 0;
  size_t peak_ = 0;
};

}  // namespace lockstep::plan
