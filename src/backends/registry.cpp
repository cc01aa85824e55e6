// Which backend serves which device, and host memory shared by the host backends.
#include <cstdlib>
#include <cstring>
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
// here). Sizes are rounded up to 16 classes per power of two (at most 1/16 more memory); what
// is kept is bounded by kMaxKept, beyond which released buffers go back to the system.
class HostCache {
 public:
  static constexpr size_t kMinBytes = size_t{64} << 10;
#if defined(__SANITIZE_ADDRESS__)
  // Under AddressSanitizer every buffer goes back to the system, so a use after release is caught.
  static constexpr size_t kMaxKept = 0;
#else
  static constexpr size_t kMaxKept = size_t{1} << 30;
#endif

  // The size a buffer of `bytes` is allocated with (a multiple of 64).
  static size_t rounded(size_t bytes) {
    if (bytes < kMinBytes) return (bytes + 63) / 64 * 64;
    size_t top = kMinBytes;
    while (top * 2 <= bytes) top *= 2;
    const size_t step = top / 16;
    return (bytes + step - 1) / step * step;
  }
  void* take(size_t size) {
    if (size < kMinBytes) return nullptr;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(size);
    if (it == free_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    kept_ -= size;
    return p;
  }
  // Whether the cache took the buffer (else the caller frees it).
  bool give(void* p, size_t size) {
    if (size < kMinBytes) return false;
    std::lock_guard<std::mutex> lock(mu_);
    if (kept_ + size > kMaxKept) return false;
    free_[size].push_back(p);
    kept_ += size;
    return true;
  }

 private:
  std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t kept_ = 0;
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
  }
  ~HostStorage() override {
    if (data_ && !host_cache().give(data_, size_)) std::free(data_);
  }
  void* data() override { return data_; }
  size_t bytes() const override { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_, size_;
};

}  // namespace

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
