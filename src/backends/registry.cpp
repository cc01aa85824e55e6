// Which backend serves which device, and host memory shared by the host backends.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <list>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "backends/backend.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/ref/ref_backend.h"
#include "util/check.h"

namespace lockstep::backends {
namespace {

// Large host buffers are kept for reuse when released: a training step releases the previous
// step's gradients and allocates its own, of the same sizes, and memory fresh from the system
// costs a page fault and a zeroed page for every page touched (measured: ~10% of a ResNet-50 step
// here). Sizes are rounded up to 16 classes per power of two (at most 1/16 more memory). What is
// kept is bounded: a buffer not taken again within kMaxAge of its release goes back to the
// system, and the bytes kept are at most those in use (at least kMinKept, at most kMaxKept), the
// oldest going back first: a step takes back what the previous one released, while the sizes of
// shapes no longer run go back (a loop over thousands of batch sizes kept 1 GiB of them before).
class HostCache {
 public:
  static constexpr size_t kMinBytes = size_t{64} << 10;
#if defined(__SANITIZE_ADDRESS__)
  // Under AddressSanitizer every buffer goes back to the system, so a use after release is caught.
  static constexpr size_t kMaxKept = 0;
#else
  static constexpr size_t kMaxKept = size_t{1} << 30;
#endif
  static constexpr size_t kMinKept = size_t{64} << 20;
  static constexpr std::chrono::steady_clock::duration kMaxAge = std::chrono::seconds(10);

  // The size a buffer of `bytes` is allocated with (a multiple of 64).
  static size_t rounded(size_t bytes) {
    if (bytes < kMinBytes) return (bytes + 63) / 64 * 64;
    size_t top = kMinBytes;
    while (top * 2 <= bytes) top *= 2;
    const size_t step = top / 16;
    return (bytes + step - 1) / step * step;
  }
  // A buffer of `size` bytes (rounded) for a new storage, or null: allocate one.
  void* take(size_t size) {
    if (size < kMinBytes) return nullptr;
    std::vector<void*> expired;
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      expire_locked(std::chrono::steady_clock::now(), expired);
      auto it = by_size_.find(size);
      if (it != by_size_.end() && !it->second.empty()) {
        const auto at = it->second.back();  // the most recently released of this size
        it->second.pop_back();
        p = at->data;
        kept_ -= size;
        lru_.erase(at);
      }
    }
    for (void* e : expired) std::free(e);
    return p;
  }
  // A storage's buffer released: whether the cache took it (else the caller frees it).
  bool give(void* p, size_t size) {
    in_use_ -= size;
    if (size < kMinBytes || size > kMaxKept) return false;
    std::vector<void*> expired;
    bool taken = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const auto now = std::chrono::steady_clock::now();
      expire_locked(now, expired);
      const size_t limit = std::min(std::max(in_use_.load(), kMinKept), kMaxKept);
      while (!lru_.empty() && kept_ + size > limit) drop_oldest_locked(expired);
      if (kept_ + size <= limit) {
        lru_.push_front({p, size, now});
        by_size_[size].push_back(lru_.begin());
        kept_ += size;
        taken = true;
      }
    }
    for (void* e : expired) std::free(e);
    return taken;
  }
  // A buffer of `size` bytes now in use by a storage (taken from here or allocated).
  void in_use(size_t size) { in_use_ += size; }
  size_t in_use_bytes() const { return in_use_.load(); }
  size_t kept_bytes() {
    std::lock_guard<std::mutex> lock(mu_);
    return kept_;
  }

 private:
  struct Kept {
    void* data;
    size_t size;
    std::chrono::steady_clock::time_point released;
  };
  // Oldest at the back; each size's entries in release order, the newest last.
  void drop_oldest_locked(std::vector<void*>& out) {
    const Kept& k = lru_.back();
    std::vector<std::list<Kept>::iterator>& same = by_size_[k.size];
    same.erase(same.begin());  // the oldest of its size is the first
    if (same.empty()) by_size_.erase(k.size);
    kept_ -= k.size;
    out.push_back(k.data);
    lru_.pop_back();
  }
  void expire_locked(std::chrono::steady_clock::time_point now, std::vector<void*>& out) {
    while (!lru_.empty() && now - lru_.back().released > kMaxAge) drop_oldest_locked(out);
  }

  std::mutex mu_;
  std::list<Kept> lru_;
  std::unordered_map<size_t, std::vector<std::list<Kept>::iterator>> by_size_;
  size_t kept_ = 0;
  std::atomic<size_t> in_use_{0};  // the bytes of live storages
};

HostCache& host_cache() {
  static HostCache* c = new HostCache;  // never destroyed: storage may outlive static objects
  return *c;
}

class HostStorage final : public Storage {
 public:
  explicit HostStorage(size_t bytes) : bytes_(bytes), size_(HostCache::rounded(bytes)) {
    if (!size_) return;
    data_ = host_cache().take(size_);
    if (!data_) data_ = std::aligned_alloc(64, size_);
    if (!data_) throw std::bad_alloc();
    host_cache().in_use(size_);
  }
  ~HostStorage() override {
    if (size_ && !host_cache().give(data_, size_)) std::free(data_);
  }
  void* data() override { return data_; }
  size_t bytes() const override { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_, size_;
};

}  // namespace

size_t host_memory_in_use() { return host_cache().in_use_bytes(); }
size_t host_memory_kept() { return host_cache().kept_bytes(); }

std::shared_ptr<Storage> alloc_host(size_t bytes) { return std::make_shared<HostStorage>(bytes); }

std::shared_ptr<Storage> slice_of(std::shared_ptr<Storage> parent, size_t offset, size_t bytes) {
  class Slice final : public Storage {
   public:
    Slice(std::shared_ptr<Storage> parent, size_t offset, size_t bytes)
        : parent_(std::move(parent)), offset_(offset), bytes_(bytes) {}
    void* data() override { return static_cast<char*>(parent_->data()) + offset_; }
    size_t bytes() const override { return bytes_; }

   private:
    std::shared_ptr<Storage> parent_;
    size_t offset_, bytes_;
  };
  LS_INTERNAL_CHECK(offset + bytes <= parent->bytes(), "a slice past the end of its storage");
  return std::make_shared<Slice>(std::move(parent), offset, bytes);
}

namespace {

struct Registry {
  std::mutex mu;
  std::vector<std::pair<Device, Backend*>> served{{Device{DeviceKind::Ref, 0}, &ref::backend()},
                                                  {Device{DeviceKind::Cpu, 0}, &cpu::backend()}};
};

Registry& registry() {
  static Registry* r = new Registry;  // backends serve until the process ends
  return *r;
}

}  // namespace

Backend& backend_for(Device device) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const auto& [d, b] : r.served)
    if (d == device) return *b;
  throw Error(util::cat(
      "device ", device_name(device),
      " is not available in this build of lockstep; use ls::Device{ls::DeviceKind::Ref}"));
}

void register_backend(Device device, Backend* backend) {
  LS_INTERNAL_CHECK(backend != nullptr, "a null backend for ", device_name(device));
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const auto& [d, b] : r.served)
    if (d == device)
      throw Error(util::cat("device ", device_name(device), " is already served by the ", b->name(),
                            " backend; a backend library was loaded twice?"));
  r.served.emplace_back(device, backend);
}

void fail_at(const ir::GraphNode& n, const std::exception& e,
             std::vector<int32_t> overwritten_inputs) {
  const std::string where = util::where(n.origin.loc);
  const std::string in = n.origin.module && !n.origin.module->empty()
                             ? util::cat(" in ", *n.origin.module)
                             : std::string();
  std::string what = n.origin.user_op
                         ? util::cat(n.origin.user_op, " at ", where, in, ": ", e.what())
                         : util::cat(e.what(), " (at ", where, in, ")");
  throw RunError(std::move(what), std::move(overwritten_inputs));
}

}  // namespace lockstep::backends
