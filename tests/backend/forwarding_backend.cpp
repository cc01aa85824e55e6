// A backend built as a library of its own, the way a GPU backend would be: loading it registers
// it for device cuda:0 (backends::register_backend, from a static initializer). It forwards every
// call to the ref backend and counts what it compiled, so the test can tell it served the device.
#include <atomic>

#include "backends/backend.h"
#include "backends/ref/ref_backend.h"

namespace lockstep::backends {
namespace {

std::atomic<int> g_compiles{0};

class ForwardingBackend final : public Backend {
 public:
  std::string name() const override { return "forwarding"; }
  std::shared_ptr<Storage> alloc(size_t bytes) override { return ref::backend().alloc(bytes); }
  void copy_in(Storage& dst, const void* src, size_t bytes) override {
    ref::backend().copy_in(dst, src, bytes);
  }
  void copy_out(Storage& src, void* dst, size_t bytes) override {
    ref::backend().copy_out(src, dst, bytes);
  }
  std::unique_ptr<Executable> compile(const ir::Graph& graph) override {
    ++g_compiles;
    ir::Graph on_ref = graph;
    on_ref.device = Device{DeviceKind::Ref, 0};
    return ref::backend().compile(on_ref);
  }
};

const bool registered = [] {
  static ForwardingBackend backend;
  register_backend(Device{DeviceKind::Cuda, 0}, &backend);
  return true;
}();

}  // namespace
}  // namespace lockstep::backends

// How many programs the forwarding backend compiled (the test finds it with dlsym).
extern "C" int lockstep_forwarding_backend_compiles() {
  return lockstep::backends::g_compiles.load();
}
