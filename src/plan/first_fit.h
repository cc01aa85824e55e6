// Greedy first-fit placement of values in one block of memory, in step order: a value lives from
// the step that places it to its last step; blocks whose values are dead are reused. The arena
// (memory.cpp) and a backend's own copies (the cpu's shared convolution operand copies) use it.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <map>
#include <queue>
#include <set>
#include <vector>

namespace lockstep::plan {

class FirstFit {
 public:
  // Where a value of `size` placed at step `now` and last used at step `last` goes: the lowest
  // offset where it fits between the values still live (the start of the lowest free gap that is
  // long enough, else the top). Values leave through a queue ordered by their last step; free gaps
  // are indexed by their length's power of two, so a placement costs O(log n) however many values
  // are live (a graph of a million values, a backward keeping 100,000 activations).
  size_t place(size_t size, int64_t now, int64_t last) {
    while (!dying_.empty() && dying_.top().last < now) {
      const Dying dead = dying_.top();
      dying_.pop();
      remove(dead.offset);
    }
    if (size == 0) return 0;  // takes no memory: nothing to keep
    size_t offset = top_;
    bool in_gap = false;
    const int cls = size_class(size);
    // The lowest-offset gap of a longer class always fits; in the request's own class, some may
    // be too short, so that class is searched in offset order.
    for (size_t g : by_class_[static_cast<size_t>(cls)]) {
      if (g >= offset) break;
      if (gaps_.at(g) >= size) {
        offset = g, in_gap = true;
        break;
      }
    }
    for (int c = cls + 1; c < kClasses; ++c) {
      const auto& set = by_class_[static_cast<size_t>(c)];
      if (!set.empty() && *set.begin() < offset) offset = *set.begin(), in_gap = true;
    }
    if (in_gap) {
      const size_t len = gaps_.at(offset);
      erase_gap(offset);
      if (len > size) add_gap(offset + size, len - size);
    } else {
      top_ = offset + size;
    }
    live_.emplace(offset, size);
    dying_.push({offset, last});
    peak_ = std::max(peak_, offset + size);
    return offset;
  }
  size_t peak() const { return peak_; }

 private:
  static constexpr int kClasses = 64;
  static int size_class(size_t n) { return std::bit_width(n) - 1; }  // n > 0

  void add_gap(size_t start, size_t len) {
    gaps_.emplace(start, len);
    by_class_[static_cast<size_t>(size_class(len))].insert(start);
  }
  void erase_gap(size_t start) {
    auto it = gaps_.find(start);
    by_class_[static_cast<size_t>(size_class(it->second))].erase(start);
    gaps_.erase(it);
  }

  // Frees the value at `offset`, merging the gaps on either side (or lowering the top).
  void remove(size_t offset) {
    auto it = live_.find(offset);
    const size_t end = offset + it->second;
    size_t start = offset;
    if (it != live_.begin()) {
      const auto prev = std::prev(it);
      const size_t prev_end = prev->first + prev->second;
      if (prev_end < offset) erase_gap(prev_end), start = prev_end;
    } else if (offset > 0) {
      erase_gap(0), start = 0;
    }
    const auto next = std::next(it);
    live_.erase(it);
    if (next == live_.end()) {
      top_ = start;
      return;
    }
    if (next->first > end) erase_gap(end);
    add_gap(start, next->first - start);
  }

  struct Dying {
    size_t offset;
    int64_t last;
  };
  struct LaterLast {
    bool operator()(const Dying& a, const Dying& b) const { return a.last > b.last; }
  };
  std::map<size_t, size_t> live_;  // offset -> size, values of nonzero size (they never overlap)
  std::map<size_t, size_t> gaps_;  // start -> length of each free gap below top_
  std::array<std::set<size_t>, kClasses> by_class_;  // gap starts by floor(log2(length))
  std::priority_queue<Dying, std::vector<Dying>, LaterLast> dying_;
  size_t top_ = 0;  // the end of the highest live value
  size_t peak_ = 0;
};

}  // namespace lockstep::plan
