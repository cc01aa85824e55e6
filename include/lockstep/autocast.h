// Mixed precision: autocast, PyTorch's CPU policy. Under `auto scope = ls::autocast(ls::bf16);`
// (or ls::step's StepOptions::autocast) the ops recorded on this thread run as follows:
//   - bf16: matmul (and linear, attention's products) and conv2d with both its gradients cast
//     their floating operands to bf16 (the products accumulate in f32; results are bf16). The
//     casts are ops of the step's graph, so parameters stay f32 master weights and their
//     gradients come back through the casts in f32.
//   - f32: sum and mean, softmax, log_softmax and logsumexp, the losses, and batch-norm and
//     layer-norm statistics read bf16 values as f32. Batch norm gives its input's dtype back (so
//     activations stay bf16 between convolutions); layer norm gives f32.
//   - f32 too: the recurrent layers (nn::LSTM, nn::GRU with f32 parameters) read a bf16 input
//     as f32 and run each layer as one f32 op (oneDNN's f32 LSTM, 66 ms a step for the suite's
//     LSTM language model against 79 with its cell unrolled into bf16 products, AMD Zen 4).
//   - everything else runs in its operands' dtype (PyTorch's promotion: bf16 with f32 is f32).
// The backward pass runs in the forward's dtypes whatever the scope: gradients flow back in the
// dtype of their forward value. The optimizer's update is f32 (it reads the f32 weights and their
// f32 gradients). There is no loss scaling: bf16 has f32's range.
#pragma once

#include <memory>
#include <optional>

#include "lockstep/tensor.h"

namespace lockstep {

namespace detail {
struct AutocastEntry;
}

class AutocastScope {
 public:
  // `dtype`: bf16 turns autocast on, f32 turns it off inside an enclosing scope; anything else is
  // an Error. The scope is the constructing thread's; ending it on another thread (a Python
  // context exited there) ends it for the constructing thread too, which then records as the
  // scopes still open on it say.
  explicit AutocastScope(DType dtype, Loc loc = Loc::current());
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  std::shared_ptr<detail::AutocastEntry> entry_;
};

// `auto scope = ls::autocast(ls::bf16);`: autocast until the scope ends (see above).
[[nodiscard]] inline AutocastScope autocast(DType dtype = DType::BF16, Loc loc = Loc::current()) {
  return AutocastScope(dtype, loc);
}

// The lower-precision dtype ops recorded on this thread autocast to now, if any.
std::optional<DType> autocast_dtype();

}  // namespace lockstep
