// The lowering rule for matrix products: f32 and bf16 matmuls, and a transpose or permute of one,
// through oneDNN (matmul.h), reading operands and writing results through strides where that
// keeps oneDNN on brgemm. Not products of other dtypes or empty shapes (lower_typed.cpp).
#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "backends/cpu/lower_rules.h"
#include "backends/cpu/matmul.h"
#include "backends/ref/ref_kernels.h"

namespace lockstep::backends::cpu {

using ir::Op;

namespace {

// Whether a matmul's right-hand operand is one matrix for its whole batch ([1..., K, N]).
bool shared_right(const ir::Graph& g, const ir::GraphNode& mm) {
  const Shape& b = g.nodes[mm.operands[1]].shape;
  if (mm.shape.size() < 3) return false;
  for (size_t d = 0; d + 2 < b.size(); ++d)
    if (b[d] != 1) return false;
  return true;
}

// A last-two-axes transpose, or a permute that keeps the last axis, of an f32 or bf16 matmul that
// nothing else reads: the matmul writes the permuted layout itself.
bool transposed_matmul(const plan::Plan& p, int32_t id) {
  const ir::GraphNode& n = p.graph.nodes[id];
  if (!(swaps_last_two(n) || keeps_last_axis(n)) ||
      (n.dtype != DType::F32 && n.dtype != DType::BF16) || shape_numel(n.shape) == 0)
    return false;
  const int32_t m = n.operands[0];
  const ir::GraphNode& mm = p.graph.nodes[m];
  if (mm.op != Op::MatMul || p.is_output[m] || p.consumers[m].size() != 1 || !p.run_time[m] ||
      p.merged[m])
    return false;
  // A batch over one right-hand matrix folds into one product instead (fold_matmul_batch), worth
  // more than the permute's copy.
  if (!swaps_last_two(n) && shared_right(p.graph, mm)) return false;
  for (int32_t o : mm.operands)
    if (p.graph.nodes[o].dtype != n.dtype || shape_numel(p.graph.nodes[o].shape) == 0) return false;
  return true;
}

// A batch of products with one right-hand matrix ([P..., M, K] x [1..., K, N]: a linear layer
// applied to [B, T, D], and its input gradient) is one product of [P M, K] by [K, N] when the
// left operand's rows lie contiguously across the batch: the output [P..., M, N] is the same
// memory. oneDNN would otherwise run P small products with the right-hand matrix reread for
// each (measured on a GPT's [64, 32, 128] x [1, 128, 128]: 1.5-9 ms against ~0.5 ms).
void fold_matmul_batch(Shape (&shape)[2], std::vector<int64_t> (&strides)[2], Shape& out) {
  const size_t r = shape[0].size();
  if (r < 3 || out.size() != r) return;
  for (size_t d = 0; d + 2 < shape[1].size(); ++d)
    if (shape[1][d] != 1) return;
  if (strides[0] != ref::strides_of(shape[0])) return;
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < r; ++d) rows *= shape[0][d];
  const size_t rb = shape[1].size();
  const int64_t k = shape[0][r - 1], n = shape[1][rb - 1];
  shape[0] = {rows, k};
  strides[0] = {k, 1};
  shape[1] = {shape[1][rb - 2], n};
  strides[1] = {strides[1][rb - 2], strides[1][rb - 1]};
  out = {rows, n};
}

// How a product reads its operands and writes its result: the layout lower_matmul gives it.
struct ProductLayout {
  int32_t operand[2] = {-1, -1};
  Shape shape[2], out_shape;
  std::vector<int64_t> strides[2], out_strides;
  bool through_permute = false;  // an operand read through a permute's strides, or the result
                                 // written through them
  bool permuted_out = false;     // the node is a permute of the product (not a transpose)
};

// The layout of `n`'s product: a matmul; or the transpose of one, computed directly as B^T A^T;
// or a permute of one that keeps the last axis, written through the strides of the permuted
// layout. Operands that are transposes are read through their strides instead of being copied,
// and with `through_permutes` so are permutes of them (see lower_matmul).
ProductLayout product_layout(const plan::Plan& p, const ir::GraphNode& n, bool through_permutes) {
  ProductLayout pl;
  const bool flip = swaps_last_two(n);
  pl.permuted_out = !flip && n.op == Op::Permute;
  const ir::GraphNode& mm_node = n.op == Op::Permute ? p.graph.nodes[n.operands[0]] : n;
  int32_t* operand = pl.operand;
  operand[0] = mm_node.operands[0];
  operand[1] = mm_node.operands[1];
  if (flip) std::swap(operand[0], operand[1]);
  Shape* shape = pl.shape;
  std::vector<int64_t>* strides = pl.strides;
  for (int k = 0; k < 2; ++k) {
    const ir::GraphNode& o = p.graph.nodes[operand[k]];
    bool transposed = flip;  // (A B)^T = B^T A^T: each operand is read transposed
    int32_t source = operand[k];
    // Views read through instead of copied, in any order: transposes of the last two axes (read
    // with those strides swapped) and reshapes that only put 1-dims in front (a linear layer's
    // transposed weight as [1, in, out] against a [B, T, in] batch, and its gradient's transpose
    // of that).
    size_t lead = 0;
    for (;;) {
      const ir::GraphNode& v = p.graph.nodes[source];
      if (!p.run_time[source]) break;
      if (swaps_last_two(v)) {
        source = v.operands[0];
        transposed = !transposed;
        continue;
      }
      if (v.op != Op::Reshape) break;
      const Shape& us = p.graph.nodes[v.operands[0]].shape;
      if (us.size() < 2 || us.size() >= v.shape.size()) break;
      const auto added = static_cast<ptrdiff_t>(v.shape.size() - us.size());
      if (!std::all_of(v.shape.begin(), v.shape.begin() + added,
                       [](int64_t d) { return d == 1; }) ||
          !std::equal(us.begin(), us.end(), v.shape.begin() + added))
        break;
      lead += static_cast<size_t>(added);
      source = v.operands[0];
    }
    const Shape& ss = p.graph.nodes[source].shape;
    strides[k] = ref::strides_of(ss);
    shape[k] = ss;
    // A permute keeping the last axis (or swapping it with the next): read through its strides
    // when one of the two matrix axes stays contiguous (oneDNN's gemm takes such views).
    // Not the left operand of a product with one right-hand matrix for the batch: that one is
    // worth its copy, which lets the batch fold into one product (fold_matmul_batch).
    const bool keep_for_fold = k == (flip ? 1 : 0) && shared_right(p.graph, mm_node);
    if (through_permutes && source == operand[k] && o.op == Op::Permute && p.run_time[operand[k]] &&
        !keep_for_fold && o.dtype == p.graph.nodes[o.operands[0]].dtype) {
      const std::vector<int64_t> in = ref::strides_of(p.graph.nodes[o.operands[0]].shape);
      std::vector<int64_t> st;
      for (int64_t a : o.attrs) st.push_back(in[static_cast<size_t>(a)]);
      const size_t r = st.size();
      if (r >= 2 && (st[r - 1] == 1 || st[r - 2] == 1)) {
        source = o.operands[0];
        strides[k] = st;
        pl.through_permute = true;
      }
    }
    operand[k] = source;
    if (transposed) {
      const size_t r = ss.size();
      std::swap(strides[k][r - 1], strides[k][r - 2]);
      std::swap(shape[k][r - 1], shape[k][r - 2]);
    }
    shape[k].insert(shape[k].begin(), lead, 1);
    strides[k].insert(strides[k].begin(), lead, shape_numel(ss));
  }
  pl.out_shape = mm_node.shape;
  pl.out_strides = ref::strides_of(pl.out_shape);
  if (pl.permuted_out) {  // matmul axis attrs[i] lands at axis i of the permute's contiguous output
    const std::vector<int64_t> contiguous = ref::strides_of(n.shape);
    for (size_t i = 0; i < n.attrs.size(); ++i)
      pl.out_strides[static_cast<size_t>(n.attrs[i])] = contiguous[i];
    pl.through_permute = true;
  } else {
    pl.out_shape = n.shape;
    fold_matmul_batch(pl.shape, pl.strides, pl.out_shape);
    pl.out_strides = ref::strides_of(pl.out_shape);
  }
  return pl;
}

// Whether oneDNN runs the product on a brgemm kernel ("brg:avx512_core_bf16", ...), not on its
// older gemm ("gemm:jit").
bool on_brgemm(const ProductLayout& pl, DType dtype) {
  return matmul_implementation(pl.shape[0], pl.strides[0], pl.shape[1], pl.strides[1], pl.out_shape,
                               pl.out_strides, dtype)
      .starts_with("brg");
}

}  // namespace

// f32 and bf16 matmuls through oneDNN; also the transpose of one, computed directly as B^T A^T.
bool matmul_applies(const Lowering& l) {
  return (l.n.op == Op::MatMul && (all_f32(l.p.graph, l.id) || all_bf16(l.p.graph, l.id))) ||
         transposed_matmul(l.p, l.id);
}

void lower_matmul(Lowering& l) {
  const ir::GraphNode& mm_node = l.n.op == Op::Permute ? l.operand(0) : l.n;
  // Permuted operands and results are read and written through their strides, without a copy,
  // unless that costs the product its brgemm kernel: oneDNN 2.x runs a batch whose matrices
  // interleave in memory (an attention's heads over a sequence-first [T, B H, E]) on gemm:jit,
  // which on AVX512-BF16 takes 1.2-1.5 ms where brgemm over dense copies takes 0.95-1.2 plus
  // 0.07 for the copy ([96, 256, 64] x [96, 64, 256] bf16, two Zen 5 cores). Then the
  // permutes are copied (their own steps) and the product reads or writes the copies.
  ProductLayout pl = product_layout(l.p, l.n, true);
  if (pl.through_permute && !on_brgemm(pl, mm_node.dtype)) {
    const ProductLayout dense = product_layout(l.p, pl.permuted_out ? mm_node : l.n, false);
    bool copies_ready = true;  // each permute read as a copy is a step of its own
    for (int k = 0; k < 2; ++k) copies_ready = copies_ready && !l.p.absorbed[dense.operand[k]];
    if (copies_ready && on_brgemm(dense, mm_node.dtype)) {
      if (pl.permuted_out) return lower_strided_copy(l);  // the matmul is a step of its own
      pl = dense;
    }
  }
  auto mm =
      std::make_shared<cpu::MatMul>(pl.shape[0], pl.strides[0], pl.shape[1], pl.strides[1],
                                    pl.out_shape, mm_node.dtype, mm_node.dtype, pl.out_strides);
  l.step.scratch_bytes = mm->scratch_bytes();
  l.step.reads = {pl.operand[0], pl.operand[1]};
  l.step.label = "mat_mul";
  const int32_t a = pl.operand[0], b = pl.operand[1], id = l.id;
  l.cs.run = [mm, a, b, id](Ctx& c) { mm->run(c.ptr[a], c.ptr[b], c.ptr[id]); };
}

}  // namespace lockstep::backends::cpu
