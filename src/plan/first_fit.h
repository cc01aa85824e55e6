// Greedy first-fit placement of values in one block of memory, in step order: a value lives from
// the step that places it to its last step; blocks whose values are dead are reused. The arena
// (memory.cpp) and a backend's own copies (the cpu's shared convolution operand copies) use it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace lockstep::plan {

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

}  // namespace lockstep::plan
