// Which backend serves which device, and host memory shared by the host backends.
#include <cstdlib>
#include <cstring>
#include <new>

#include "backends/backend.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/ref/ref_backend.h"
#include "util/check.h"

namespace lockstep::backends {
namespace {

class HostStorage final : public Storage {
 public:
  explicit HostStorage(size_t bytes) : bytes_(bytes) {
    const size_t rounded = (bytes + 63) / 64 * 64;
    data_ = rounded ? std::aligned_alloc(64, rounded) : nullptr;
    if (rounded && !data_) throw std::bad_alloc();
  }
  ~HostStorage() override { std::free(data_); }
  void* data() override { return data_; }
  size_t bytes() const override { return bytes_; }

 private:
  void* data_;
  size_t bytes_;
};

}  // namespace

std::shared_ptr<Storage> alloc_host(size_t bytes) { return std::make_shared<HostStorage>(bytes); }

Backend& backend_for(Device device) {
  switch (device.kind) {
    case DeviceKind::Ref:
      if (device.index == 0) return ref::backend();
      break;
    case DeviceKind::Cpu:
      if (device.index == 0) return cpu::backend();
      break;
    case DeviceKind::Cuda:
      break;
  }
  throw Error(util::cat(
      "device ", device_name(device),
      " is not available in this build of lockstep; use ls::Device{ls::DeviceKind::Ref}"));
}

}  // namespace lockstep::backends
