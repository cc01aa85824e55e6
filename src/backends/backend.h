// The narrow boundary between the runtime and a backend: memory, copies, compile, run.
// A backend sees only data-free ir::Graphs and opaque storage; it knows nothing of tensors,
// steps or the cache.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "ir/ir.h"

namespace lockstep::backends {

// A block of device memory. Host backends (ref, cpu) allocate plain aligned host memory.
class Storage {
 public:
  virtual ~Storage() = default;
  virtual void* data() = 0;
  virtual size_t bytes() const = 0;
};

class Executable {
 public:
  virtual ~Executable() = default;
  // Runs the program. inputs[k] is the storage of Data input #k, scalars[k] the value of Scalar
  // input #k. Returns one storage per graph output. Throws BackendError on a run-time failure
  // (e.g. an index out of range); the runtime then poisons the step's outputs.
  // donatable[k] (when the vector has that entry) says nothing but this run references input k:
  // the program may overwrite it and return it as an output (a parameter updated in place).
  virtual std::vector<std::shared_ptr<Storage>> run(
      const std::vector<std::shared_ptr<Storage>>& inputs,
      const std::vector<ir::ScalarValue>& scalars, const std::vector<bool>& donatable) = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual std::shared_ptr<Storage> alloc(size_t bytes) = 0;
  virtual void copy_in(Storage& dst, const void* src, size_t bytes) = 0;
  virtual void copy_out(Storage& src, void* dst, size_t bytes) = 0;
  virtual std::unique_ptr<Executable> compile(const ir::Graph& graph) = 0;
  // Waits for all work this backend has queued on its device (no-op for host backends).
  virtual void synchronize() {}
};

// The backend serving `device`; throws Error if it is not available in this build or machine.
Backend& backend_for(Device device);

// Host memory, 64-byte aligned, shared by the host backends.
std::shared_ptr<Storage> alloc_host(size_t bytes);

}  // namespace lockstep::backends
