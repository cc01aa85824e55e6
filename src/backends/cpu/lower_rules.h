// The cpu lowering's rules as lower.cpp's table sees them: what a rule is given, and the rules
// defined in files of their own (lower_matmul.cpp, lower_pool.cpp, lower_index.cpp,
// lower_rnn.cpp, lower_typed.cpp). Private to those files and lower.cpp; other passes use passes.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backends/cpu/passes.h"

namespace lockstep::backends::cpu {

// What a lowering rule sees: the plan, the node, and the step it fills in.
struct Lowering {
  plan::Plan& p;
  const std::vector<bool>& mask;  // per value: held blocked
  const int32_t id;
  const ir::GraphNode& n;
  plan::Step& step;
  CpuStep& cs;
  const bool f32;      // the node computes f32 values
  int32_t index = -1;  // the value an indexed op's kernel reads its indices from (its check's)

  const ir::GraphNode& node(int32_t value) const { return p.graph.nodes[value]; }
  const ir::GraphNode& operand(size_t k) const { return node(n.operands[k]); }
};

// Each rule: whether it takes the node, and how it lowers it. The table in lower.cpp tries
// them in order.
bool attention_applies(const Lowering& l);  // attention.cpp
void lower_attention(Lowering& l);
bool matmul_applies(const Lowering& l);  // lower_matmul.cpp
void lower_matmul(Lowering& l);
bool max_pooling_applies(const Lowering& l);  // lower_pool.cpp
void lower_max_pooling(Lowering& l);
bool avg_pooling_applies(const Lowering& l);
void lower_avg_pooling(Lowering& l);
bool max_pooling_backward_applies(const Lowering& l);
void lower_max_pooling_backward(Lowering& l);
bool index_applies(const Lowering& l);  // lower_index.cpp
void lower_index(Lowering& l);
bool recurrent_applies(const Lowering& l);  // lower_rnn.cpp
void lower_recurrent(Lowering& l);
bool typed_applies(const Lowering& l);  // lower_typed.cpp
void lower_typed(Lowering& l);
// lower.cpp (its other rules are private to it): strided copies, also what lower_matmul falls
// back to for a permuted result that would cost the product oneDNN's brgemm kernel.
bool strided_copy_applies(const Lowering& l);
void lower_strided_copy(Lowering& l);

}  // namespace lockstep::backends::cpu
