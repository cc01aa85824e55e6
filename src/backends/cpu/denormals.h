// Denormal floats in the cpu backend's programs: flushed to zero by default, as XLA's CPU
// runtime and TensorFlow's thread pools do (PyTorch: torch.set_flush_denormal(True)). A gradient
// on its way to zero passes through values below 1.2e-38 (f32), and every product or sum that
// meets one then takes a microcode assist of ~100 cycles: a wide MLP trained to a zero loss ran
// 30 ms steps at 530-640 ms for eight steps. Flushing (MXCSR's FTZ and DAZ bits) makes them
// zeros. The public switch is ls::set_flush_denormal (lockstep/runtime.h).
#pragma once

namespace lockstep::backends::cpu {

bool flush_denormal();

// While alive, the calling thread flushes denormals when ls::flush_denormal() is on (and
// otherwise does not), and so do the OpenMP threads of its parallel regions (up to `threads`;
// they keep it); then the calling thread's setting is what it was.
class DenormalScope {
 public:
  explicit DenormalScope(int threads);
  ~DenormalScope();
  DenormalScope(const DenormalScope&) = delete;
  DenormalScope& operator=(const DenormalScope&) = delete;

 private:
  unsigned before_;
};

}  // namespace lockstep::backends::cpu
