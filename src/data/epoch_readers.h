// The threads drawing from a loader's epoch, so that a loader shared by several threads ends each
// one's epoch once: the thread that meets the end gets std::nullopt, and every other thread that
// took batches of that epoch gets std::nullopt at its next call, instead of a batch of the next
// epoch (two threads' range-for loops over one loader cover one epoch between them, not two).
// Not a lock: the loader's consumer lock guards it.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>

namespace lockstep::data::detail {

class EpochReaders {
 public:
  // A number per thread that no later thread gets (std::thread::id values are reused, and a new
  // thread must not inherit a finished one's place in an epoch).
  static uint64_t thread_token() {
    static std::atomic<uint64_t> last{0};
    thread_local const uint64_t token = ++last;
    return token;
  }

  // True (once) when the calling thread took batches of an epoch that has ended since.
  bool take_end() {
    auto it = drew_from_.find(thread_token());
    if (it == drew_from_.end() || it->second == generation_) return false;
    drew_from_.erase(it);
    return true;
  }
  void drew() { drew_from_[thread_token()] = generation_; }
  // The epoch ended or was abandoned by the calling thread, which knows it.
  void end_epoch() {
    ++generation_;
    drew_from_.erase(thread_token());
  }

 private:
  std::map<uint64_t, int64_t> drew_from_;  // thread -> generation it drew from
  int64_t generation_ = 0;
};

}  // namespace lockstep::data::detail
