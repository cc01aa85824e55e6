// Fused attention (attention_match.cpp finds it, attention.cpp runs it): a scaled dot-product
// attention written from primitives (the way nanoGPT, PyTorch's MultiheadAttention and
// ls::nn::scaled_dot_product_attention write it), run as two steps whose scores never go to
// memory:
//   forward   S = Q K^T, scaled (times or divided by a host scalar), masked (masked_fill, a where
//             that keeps, or an added float mask), softmax, dropout (f32: a where over a bool
//             value of keeps), times V; one block of query rows at a time, its scores in a
//             per-thread buffer. It also writes the softmax's row max and row sum, values of the
//             graph's own Max and Sum nodes.
//   backward  dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(dP P)), masked and scaled as the
//             forward, dQ = dS K, dK^T = Q^T dS: P recomputed a block at a time from Q, K and the
//             forward's row max and sum.
// Each value is the same float operations as the primitives' (the products summed in another
// order): the graph's nodes keep their meaning, only the intermediate values [..., L, S] are
// never written. Where the mask takes every score past a column of a block of rows to -inf (a
// causal mask), the products and the softmax stop at that column: their terms there are 0. An
// attention without a mask keeps its primitives (nothing to skip, and the backward's recomputed
// scores are one product more than they do).
// Private to those two files (the pass and the lowering rule are in passes.h, lower_rules.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "lockstep/dtype.h"

namespace lockstep::backends::cpu {

enum class MaskKind { None, FillWhereTrue, KeepWhereTrue, Additive };
enum class ScaleKind { None, Mul, Div };

// A matrix of each of the G batch entries: entry g's row i at base[g] + i * ld, columns
// contiguous.
struct Rows {
  std::vector<int64_t> base;
  int64_t ld = 0;
};

// An operand read from a node's memory (through the strides of the views it was recorded
// through: nanoGPT's q, k and v are permutes of reshapes of slices of one product).
struct Operand {
  int32_t node = -1;
  Rows rows;
};

struct AttentionFusion {
  // Shapes: G batch entries (the scores' leading axes), L queries, S keys, E and Ev features.
  int64_t g = 0, l = 0, s = 0, e = 0, ev = 0;
  MaskKind mask_kind = MaskKind::None;
  ScaleKind scale_kind = ScaleKind::None;
  int64_t scale_input = -1, fill_input = -1, zero_input = -1;  // host scalars' numbers
  // Graph nodes: the operands, what the forward writes, and the backward's.
  Operand q, k, v, d_out;
  int32_t mask = -1;
  int32_t max = -1, sum = -1, out = -1;  // out: the product P V, or the permute it is written as
  int32_t dq = -1, dk = -1, dv = -1;
  bool dk_transposed = true;  // dk is the product Q^T dS [.., E, S] (else its transpose)
  bool backward = false;
  bool bf16 = false;  // bf16 products, the softmax in f32 (autocast): each rounding emulated
  // Under autocast, an f32 added mask: added in f32 to the widened scores (else, as the scores,
  // bf16, and the sum rounded).
  bool mask_f32 = false;
  // Dropout on P (f32): the product reads where(keep, P / s, z), the gradient is where(keep, g,
  // z2) / s (host scalars s, z, z2; keep a bool value of the scores' shape); keep -1: none.
  int32_t keep = -1;
  int64_t drop_scale_input = -1, drop_zero_input = -1, drop_zero2_input = -1;
  int32_t forward_at = -1;  // the node the forward's step is lowered at
  Rows out_rows, dq_rows, dv_rows;
  // The mask's element offset of entry g, and its row and column strides (0: broadcast).
  std::vector<int64_t> mask_base;
  int64_t mask_ls = 0, mask_ss = 0;
};

}  // namespace lockstep::backends::cpu
