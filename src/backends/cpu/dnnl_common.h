// What the oneDNN adapter's files share (dnnl_ops.cpp: products, convolutions, pooling;
// dnnl_rnn.cpp: recurrent layers): the engine and stream, user scratchpads, the shared scratch.
// Only those files include it (and dnnl.hpp).
#pragma once

#include <cstddef>
#include <unordered_map>

#include <dnnl.hpp>

namespace lockstep::backends::cpu {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

// The cpu engine (made at the first program's compile) and the stream primitives run on.
dnnl::engine& engine();
dnnl::stream& stream();

// Every primitive takes its scratchpad from the caller (scratchpad_mode::user). oneDNN 2.x's
// library-managed scratchpad belongs to the thread that created the primitive, and primitives are
// created where a program is compiled but run on the runtime thread: gemm-based convolutions
// (e.g. dilated ones) then write through a scratchpad that does not exist and crash.
dnnl::primitive_attr user_scratchpad();

// Floats to reserve in the shared scratch for `md`, rounded up to whole 64-byte lines.
size_t floats_for(const memory::desc& md);
void add_scratchpad(std::unordered_map<int, memory>* args, const memory::desc& md, float* at);

// A dnnl::error as a BackendError naming `what` failed.
[[noreturn]] void rethrow(const dnnl::error& e, const char* what);

// Scratch for blocked copies and scratchpads, shared by every primitive (they run one at a time
// on the runtime thread), so a program's memory does not grow with its number of primitives: at
// least `floats`, 64-byte aligned, kept by the calling thread.
float* scratch(size_t floats);

}  // namespace lockstep::backends::cpu
