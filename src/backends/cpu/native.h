// Native code for fused elementwise trees: each tree's instructions as one C++ loop over vectors
// (FusedTree::native_source), all the trees of a program in one source built by the C++ compiler
// into a shared library, cached on disk by the source's hash and loaded with dlopen. The leaves
// are still loaded by the interpreter's code (FusedTree::load_data); the native loop then reads
// each tile once and keeps every intermediate value in registers, where the interpreter makes a
// pass over the tile per instruction. Its values are the interpreter's bit for bit (the same
// operations in the same order, no fused multiply-adds, vector_math's own functions for exp, erf,
// ...), so a tree may switch to it between two runs of a program. LOCKSTEP_NATIVE says when
// (docs/debugging.md).
#pragma once

#include <memory>
#include <vector>

#include "backends/cpu/fused.h"

namespace lockstep::backends::cpu {

// When trees get native code: never, compiled in the background while the interpreter runs
// them, or compiled before compile_native returns.
enum class NativeMode { Off, Background, Now };
// LOCKSTEP_NATIVE's: 0 (or off) Off, sync Now, anything else Background.
NativeMode native_mode();

// Gives the trees native code: loaded now when the cache has it, else compiled as `mode` says.
// Trees it does not compile (see native_source) and CPUs without AVX2 keep the interpreter. A
// compiler that fails or is missing is reported once on stderr; nothing else changes.
void compile_native(const std::vector<std::shared_ptr<FusedTree>>& trees,
                    NativeMode mode = native_mode());

// NativeCall::math for this CPU: vector_math_fn(f, math_isa()) for each MathFn.
void* const* native_math();

}  // namespace lockstep::backends::cpu
