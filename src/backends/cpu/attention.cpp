// Running fused attentions (attention.h): the forward and backward steps over blocks of query
// rows. The products are the BLAS sgemm's (matmul.h's blas_sgemm), one thread each (inside the
// step's parallel loop); the row loops are vectorized for the CPU they run on.

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "backends/cpu/attention.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/lower_rules.h"
#include "backends/cpu/matmul.h"
#include "backends/cpu/parallel.h"
#include "backends/cpu/passes.h"
#include "backends/cpu/vector_math.h"

namespace lockstep::backends::cpu {

namespace {

// ---- The kernels ----

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The row loops, vectorized for the CPU they run on.
LOCKSTEP_TARGET_CLONES void scale_run(float* x, int64_t n, float s, bool divide) {
  if (divide)
    for (int64_t j = 0; j < n; ++j) x[j] = x[j] / s;
  else
    for (int64_t j = 0; j < n; ++j) x[j] = x[j] * s;
}
LOCKSTEP_TARGET_CLONES void add_mask_run(float* x, int64_t n, const float* m, int64_t stride) {
  if (stride == 1)
    for (int64_t j = 0; j < n; ++j) x[j] = x[j] + m[j];
  else
    for (int64_t j = 0; j < n; ++j) x[j] = x[j] + m[j * stride];
}
// x[j] = fill where the mask's (m[j] != 0) equals fill_true.
LOCKSTEP_TARGET_CLONES void fill_run(float* x, int64_t n, const uint8_t* m, int64_t stride,
                                     bool fill_true, float fill) {
  const uint8_t t = fill_true ? 1 : 0;
  if (stride == 1)
    for (int64_t j = 0; j < n; ++j) x[j] = (m[j] != 0) == t ? fill : x[j];
  else
    for (int64_t j = 0; j < n; ++j) x[j] = (m[j * stride] != 0) == t ? fill : x[j];
}
LOCKSTEP_TARGET_CLONES void sub_run(float* x, int64_t n, float m) {
  for (int64_t j = 0; j < n; ++j) x[j] = x[j] - m;
}
// Dropout's x[j] = keep[j] ? x[j] / s : z.
LOCKSTEP_TARGET_CLONES void dropout_run(float* x, int64_t n, const uint8_t* keep, float s,
                                        float z) {
  for (int64_t j = 0; j < n; ++j) x[j] = keep[j] != 0 ? x[j] / s : z;
}
// dS = P (dP - sum(dP P)) in place of dP.
LOCKSTEP_TARGET_CLONES void softmax_grad_run(const float* p, float* d, int64_t n) {
  float s = 0;
  for (int64_t j = 0; j < n; ++j) s += d[j] * p[j];
  for (int64_t j = 0; j < n; ++j) d[j] = p[j] * (d[j] - s);
}

// What a run reads: the operands' memory (f32, or bf16 under autocast) and host scalars.
struct Bound {
  const void *q, *k, *v, *mask, *d_out;
  const uint8_t* keep;                  // dropout's
  float scale = 1, fill = 0, zero = 0;  // as the graph holds them (rounded to bf16 under autocast)
  float drop_scale = 1, drop_zero = 0, drop_zero2 = 0;
  bool skip = false;  // columns past a block's last unmasked one are all -inf: skipped
};

float host(const Ctx& c, int64_t input, bool bf16) {
  if (input < 0) return 0.0f;
  float v = static_cast<float>(c.scalars->at(static_cast<size_t>(input)).f);
  if (bf16) round_to_bf16(&v, 1);
  return v;
}

// The mask's value at score (gi, i, j), as f32 (an added mask) or 0/1 (a where's condition).
float mask_at(const AttentionFusion& a, const Bound& b, int64_t at) {
  if (a.mask_kind != MaskKind::Additive) return static_cast<const uint8_t*>(b.mask)[at];
  return a.bf16 && !a.mask_f32 ? bf16_value(static_cast<const uint16_t*>(b.mask)[at])
                               : static_cast<const float*>(b.mask)[at];
}

// Whether the mask takes score (gi, i, j) out (to the fill, or adds -inf).
bool masked(const AttentionFusion& a, const Bound& b, int64_t gi, int64_t i, int64_t j) {
  const float m =
      mask_at(a, b, a.mask_base[static_cast<size_t>(gi)] + i * a.mask_ls + j * a.mask_ss);
  if (a.mask_kind == MaskKind::Additive) return m == kNegInf;
  return a.mask_kind == MaskKind::FillWhereTrue ? m != 0 : m == 0;
}

// The columns a block of rows needs: one past the last score any row keeps (all columns if a row
// keeps none: its softmax is NaN, as the graph's).
int64_t columns_needed(const AttentionFusion& a, const Bound& b, int64_t gi, int64_t i0,
                       int64_t i1) {
  int64_t hi = 0;
  for (int64_t i = i0; i < i1; ++i) {
    int64_t j = a.s;
    while (j > 0 && masked(a, b, gi, i, j - 1)) --j;
    if (j == 0) return a.s;
    hi = std::max(hi, j);
  }
  return hi;
}

// columns_needed of each entry's blocks of br rows, [g][block]: found once per mask offset (a
// mask broadcast over the batch and the heads has one).
std::vector<int64_t> block_columns(const AttentionFusion& a, const Bound& b, int64_t br,
                                   int64_t blocks) {
  std::vector<int64_t> his(static_cast<size_t>(a.g * blocks), a.s);
  if (!b.skip) return his;
  for (int64_t gi = 0; gi < a.g; ++gi) {
    const auto g = static_cast<size_t>(gi);
    const auto same = std::find(a.mask_base.begin(), a.mask_base.begin() + gi, a.mask_base[g]);
    const int64_t from = same - a.mask_base.begin();
    for (int64_t k = 0; k < blocks; ++k)
      his[g * blocks + k] = from < gi
                                ? his[from * blocks + k]
                                : columns_needed(a, b, gi, k * br, std::min(a.l, (k + 1) * br));
  }
  return his;
}

// The mask's where (or addition) over row i of entry gi, columns [0, n): `fill` where it masks.
void mask_row(const AttentionFusion& a, const Bound& b, int64_t gi, int64_t i, float* x, int64_t n,
              float fill) {
  const int64_t at = a.mask_base[static_cast<size_t>(gi)] + i * a.mask_ls;
  if (a.mask_kind != MaskKind::Additive) {
    fill_run(x, n, static_cast<const uint8_t*>(b.mask) + at, a.mask_ss,
             a.mask_kind == MaskKind::FillWhereTrue, fill);
  } else if (!a.bf16 || a.mask_f32) {
    add_mask_run(x, n, static_cast<const float*>(b.mask) + at, a.mask_ss);
  } else {
    for (int64_t j = 0; j < n; ++j) x[j] = x[j] + mask_at(a, b, at + j * a.mask_ss);
    round_to_bf16(x, n);
  }
}

// A thread's buffers, kept from run to run: 0 scores, 1 their gradients, 2 P in bf16, 3-6 an
// entry's q, k, v and dO widened from bf16, 7 a product before rounding, 8-9 dK and dV summed.
float* buffer(int which, int64_t n) {
  thread_local std::vector<float> bufs[10];
  std::vector<float>& b = bufs[which];
  if (b.size() < static_cast<size_t>(n)) b.resize(static_cast<size_t>(n));
  return b.data();
}

// One batch entry's operand as an f32 matrix: its own memory, or (bf16) its rows widened into
// buffer `which`.
struct Matrix {
  const float* p;
  int64_t ld;
};
Matrix matrix(const AttentionFusion& a, const Operand& o, const void* base, int64_t gi,
              int64_t rows, int64_t cols, int which) {
  const int64_t at = o.rows.base[static_cast<size_t>(gi)];
  if (!a.bf16) return {static_cast<const float*>(base) + at, o.rows.ld};
  float* w = buffer(which, rows * cols);
  bf16_rows_to_f32(static_cast<const uint16_t*>(base) + at, rows, cols, o.rows.ld, w);
  return {w, cols};
}

// C [rows x cols] (leading dimension ldc) = A B as `gemm` computes it into `out`: straight, or
// (bf16) into a buffer and rounded into the bf16 destination.
template <typename Gemm>
void product_into(const AttentionFusion& a, void* out, int64_t at, int64_t ldc, int64_t rows,
                  int64_t cols, Gemm&& gemm) {
  if (!a.bf16) return gemm(static_cast<float*>(out) + at, ldc);
  float* t = buffer(7, rows * cols);
  gemm(t, cols);
  uint16_t* dst = static_cast<uint16_t*>(out) + at;
  for (int64_t r = 0; r < rows; ++r) f32_to_bf16(t + r * cols, cols, dst + r * ldc);
}

// Rounds to bf16 under autocast (where the graph holds a bf16 value).
void round_if(const AttentionFusion& a, float* x, int64_t n) {
  if (a.bf16) round_to_bf16(x, n);
}

// The block's masked, scaled scores x [rows, hi] (leading dimension hi) from Q K^T.
void scores(const AttentionFusion& a, const Bound& b, int64_t gi, const Matrix& q, const Matrix& k,
            int64_t i0, int64_t rows, int64_t hi, float* x) {
  blas_sgemm(false, true, rows, hi, a.e, 1.0f, q.p + i0 * q.ld, q.ld, k.p, k.ld, 0.0f, x, hi);
  round_if(a, x, rows * hi);
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x + r * hi;
    if (a.scale_kind != ScaleKind::None) {
      scale_run(xr, hi, b.scale, a.scale_kind == ScaleKind::Div);
      round_if(a, xr, hi);
    }
    mask_row(a, b, gi, i0 + r, xr, hi, b.fill);
  }
}

// Dropout over the block's rows of x [rows, hi] (columns past hi are P's zeros, which it keeps
// zero: the run skips them only when z is 0), dividing by s where it keeps and `z` elsewhere.
void dropout_rows(const AttentionFusion& a, const Bound& b, int64_t gi, int64_t i0, int64_t rows,
                  int64_t hi, float* x, float z) {
  if (a.keep < 0) return;
  for (int64_t r = 0; r < rows; ++r)
    dropout_run(x + r * hi, hi, b.keep + (gi * a.l + i0 + r) * a.s, b.drop_scale, z);
}

// The softmax of each row of x in place, exp(x - max) / sum; with `find`, max and sum get each
// row's, else the rows are given them (the forward's). Columns past hi, skipped, hold -inf: they
// add nothing.
void softmax_rows(float* x, int64_t rows, int64_t hi, float* max, float* sum, bool find) {
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x + r * hi;
    if (find) {
      bool nan = false;
      max[r] = max_run_f32(xr, hi, &nan);
      if (nan) max[r] = std::numeric_limits<float>::quiet_NaN();
    }
    sub_run(xr, hi, max[r]);
    vector_math(MathFn::Exp, hi, xr, xr);
    if (find) sum[r] = sum_run_f32(xr, hi);
    scale_run(xr, hi, sum[r], true);
  }
}

// Rows per block: 32, the block's scores (and, backward, their gradients) within 64 KiB each
// (16 rows past 512 keys). Measured, forward and backward of a causal [B, H, T, 64]: 32 rows
// 2.5 ms against 64 rows' 2.9 at T 128, 14.6 against 15.2 at T 256; 16 rows no faster at 128 or
// 256 and slower at 512 (17.6-18.8 ms against 16.0-16.4).
int64_t block_rows(const AttentionFusion& a) {
  return std::clamp<int64_t>(16384 / std::max<int64_t>(a.s, 1), 16, 32);
}

// The forward of batch entry gi's blocks [k0, k1).
void forward_blocks(const AttentionFusion& a, const Bound& b, const std::vector<int64_t>& his,
                    int64_t br, int64_t blocks, int64_t gi, int64_t k0, int64_t k1, void* out,
                    float* max, float* sum) {
  const Matrix q = matrix(a, a.q, b.q, gi, a.l, a.e, 3), k = matrix(a, a.k, b.k, gi, a.s, a.e, 4),
               v = matrix(a, a.v, b.v, gi, a.s, a.ev, 5);
  const auto g = static_cast<size_t>(gi);
  for (int64_t blk = k0; blk < k1; ++blk) {
    const int64_t i0 = blk * br, rows = std::min(br, a.l - i0);
    const int64_t hi = his[g * static_cast<size_t>(blocks) + static_cast<size_t>(blk)];
    float* x = buffer(0, rows * hi);
    scores(a, b, gi, q, k, i0, rows, hi, x);
    softmax_rows(x, rows, hi, max + gi * a.l + i0, sum + gi * a.l + i0, true);
    round_if(a, x, rows * hi);  // P, cast to bf16 for the product
    dropout_rows(a, b, gi, i0, rows, hi, x, b.drop_zero);
    product_into(a, out, a.out_rows.base[g] + i0 * a.out_rows.ld, a.out_rows.ld, rows, a.ev,
                 [&](float* c, int64_t ldc) {
                   blas_sgemm(false, false, rows, a.ev, hi, 1.0f, x, hi, v.p, v.ld, 0.0f, c, ldc);
                 });
  }
}

void run_forward(const AttentionFusion& a, const Bound& b, void* out, float* max, float* sum) {
  const int64_t br = std::min(block_rows(a), a.l), blocks = (a.l + br - 1) / br;
  const bool threaded = a.g * a.l * a.s * (a.e + a.ev) >= (1 << 16);
  const std::vector<int64_t> his = block_columns(a, b, br, blocks);
  // f32 by blocks of rows; bf16 by whole entries (each widens its operands once).
  if (a.bf16) {
    parallel_for(threaded, a.g, [&](int64_t gi) {
      forward_blocks(a, b, his, br, blocks, gi, 0, blocks, out, max, sum);
    });
  } else {
    parallel_for(threaded, a.g * blocks, [&](int64_t t) {
      forward_blocks(a, b, his, br, blocks, t / blocks, t % blocks, t % blocks + 1, out, max, sum);
    });
  }
}

// Stores sum [rows x cols] (bf16: rounded) into dst's memory at `at`, rows ld apart.
void store_sum(const AttentionFusion& a, const float* sum, int64_t rows, int64_t cols, void* dst,
               int64_t at, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) {
    if (a.bf16)
      f32_to_bf16(sum + r * cols, cols, static_cast<uint16_t*>(dst) + at + r * ld);
    else
      std::copy_n(sum + r * cols, cols, static_cast<float*>(dst) + at + r * ld);
  }
}

// The backward of each batch entry on one thread: its dK and dV sum over the blocks of rows.
void run_backward(const AttentionFusion& a, const Bound& b, float* max, float* sum, void* dq,
                  void* dk, void* dv) {
  const int64_t br = std::min(block_rows(a), a.l), blocks = (a.l + br - 1) / br;
  const bool threaded = a.g * a.l * a.s * (a.e + a.ev) >= (1 << 15);
  const std::vector<int64_t> his = block_columns(a, b, br, blocks);
  parallel_for(threaded, a.g, [&](int64_t gi) {
    const auto g = static_cast<size_t>(gi);
    const Matrix q = matrix(a, a.q, b.q, gi, a.l, a.e, 3), k = matrix(a, a.k, b.k, gi, a.s, a.e, 4),
                 v = matrix(a, a.v, b.v, gi, a.s, a.ev, 5),
                 d_out = matrix(a, a.d_out, b.d_out, gi, a.l, a.ev, 6);
    // dK ([S, E], or [E, S] when dk_transposed) and dV summed in f32 buffers.
    float* dks = buffer(8, a.s * a.e);
    float* dvs = buffer(9, a.s * a.ev);
    std::fill_n(dks, a.s * a.e, 0.0f);
    std::fill_n(dvs, a.s * a.ev, 0.0f);
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t i0 = blk * br, rows = std::min(br, a.l - i0);
      const int64_t hi = his[g * static_cast<size_t>(blocks) + static_cast<size_t>(blk)];
      float* x = buffer(0, rows * hi);
      float* dp = buffer(1, rows * hi);
      scores(a, b, gi, q, k, i0, rows, hi, x);
      // P, from the forward's row max and sum (the same operations: the same values).
      softmax_rows(x, rows, hi, max + gi * a.l + i0, sum + gi * a.l + i0, false);
      const float* pb = x;  // P as the product reads it (bf16: rounded; dropout: dropped)
      if (a.bf16 || a.keep >= 0) {
        float* r = buffer(2, rows * hi);
        std::copy_n(x, rows * hi, r);
        round_if(a, r, rows * hi);
        dropout_rows(a, b, gi, i0, rows, hi, r, b.drop_zero);
        pb = r;
      }
      const float* dor = d_out.p + i0 * d_out.ld;
      // dV[:hi] += P^T dO; dP = dO V[:hi]^T.
      blas_sgemm(true, false, hi, a.ev, rows, 1.0f, pb, hi, dor, d_out.ld, 1.0f, dvs, a.ev);
      blas_sgemm(false, true, rows, hi, a.ev, 1.0f, dor, d_out.ld, v.p, v.ld, 0.0f, dp, hi);
      round_if(a, dp, rows * hi);
      // Dropout's gradient: where(keep, dP, z2) / s.
      dropout_rows(a, b, gi, i0, rows, hi, dp, b.drop_zero2 / b.drop_scale);
      for (int64_t r = 0; r < rows; ++r) {  // dS = P (dP - sum(dP P)), masked, scaled
        float* dr = dp + r * hi;
        softmax_grad_run(x + r * hi, dr, hi);
        round_if(a, dr, hi);
        if (a.mask_kind != MaskKind::Additive) mask_row(a, b, gi, i0 + r, dr, hi, b.zero);
        if (a.scale_kind != ScaleKind::None) {
          scale_run(dr, hi, b.scale, a.scale_kind == ScaleKind::Div);
          round_if(a, dr, hi);
        }
      }
      // dQ = dS K[:hi]; dK[:hi] += dS^T Q (or dK^T[:, :hi] += Q^T dS).
      product_into(a, dq, a.dq_rows.base[g] + i0 * a.dq_rows.ld, a.dq_rows.ld, rows, a.e,
                   [&](float* c, int64_t ldc) {
                     blas_sgemm(false, false, rows, a.e, hi, 1.0f, dp, hi, k.p, k.ld, 0.0f, c, ldc);
                   });
      const float* qr = q.p + i0 * q.ld;
      if (a.dk_transposed)
        blas_sgemm(true, false, a.e, hi, rows, 1.0f, qr, q.ld, dp, hi, 1.0f, dks, a.s);
      else
        blas_sgemm(true, false, hi, a.e, rows, 1.0f, dp, hi, qr, q.ld, 1.0f, dks, a.e);
    }
    if (a.dk_transposed)
      store_sum(a, dks, a.e, a.s, dk, gi * a.s * a.e, a.s);
    else
      store_sum(a, dks, a.s, a.e, dk, gi * a.s * a.e, a.e);
    store_sum(a, dvs, a.s, a.ev, dv, a.dv_rows.base[g], a.dv_rows.ld);
  });
}

}  // namespace

bool attention_applies(const Lowering& l) {
  const auto* d = static_cast<const CpuDecisions*>(l.p.decisions.get());
  return d && !d->attention.empty() && d->attention[l.id];
}

void lower_attention(Lowering& l) {
  const std::shared_ptr<const AttentionFusion> a = decisions(l.p).attention[l.id];
  const int32_t q = a->q.node, k = a->k.node, v = a->v.node, mask = a->mask;
  l.step.reads = {q, k, v, mask};
  const int32_t d_out = a->backward ? a->d_out.node : -1;
  const int32_t keep = a->keep;
  if (keep >= 0) l.step.reads.push_back(keep);
  const auto bind = [a, q, k, v, mask, d_out, keep](const Ctx& c) {
    Bound b{c.ptr[q],
            c.ptr[k],
            c.ptr[v],
            c.ptr[mask],
            d_out >= 0 ? c.ptr[d_out] : nullptr,
            keep >= 0 ? static_cast<const uint8_t*>(c.ptr[keep]) : nullptr};
    b.scale = host(c, a->scale_input, a->bf16);
    b.fill = host(c, a->fill_input, a->bf16);
    b.zero = host(c, a->zero_input, a->bf16);
    b.drop_scale = keep >= 0 ? host(c, a->drop_scale_input, false) : 1.0f;
    b.drop_zero = host(c, a->drop_zero_input, false);
    b.drop_zero2 = host(c, a->drop_zero2_input, false);
    const bool where =
        a->mask_kind == MaskKind::FillWhereTrue || a->mask_kind == MaskKind::KeepWhereTrue;
    b.skip = (a->mask_kind == MaskKind::Additive ||
              (where && b.fill == kNegInf && (a->zero_input < 0 || b.zero == 0))) &&
             b.drop_zero == 0 && b.drop_zero2 == 0;
    return b;
  };
  const int32_t max = a->max, sum = a->sum;
  if (l.id == a->forward_at) {
    l.step.label = "attention";
    l.step.node = a->out;
    l.step.extras = {max, sum};
    const int32_t out = a->out;
    l.cs.run = [a, bind, max, sum, out](Ctx& c) {
      run_forward(*a, bind(c), c.ptr[out], static_cast<float*>(c.ptr[max]),
                  static_cast<float*>(c.ptr[sum]));
    };
    return;
  }
  l.step.label = "attention_backward";
  for (int32_t r : {max, sum, d_out}) l.step.reads.push_back(r);
  const int32_t dq = a->dq, dk = a->dk, dv = a->dv;
  l.step.node = dq;
  l.step.extras = {dk, dv};
  l.cs.run = [a, bind, max, sum, dq, dk, dv](Ctx& c) {
    run_backward(*a, bind(c), static_cast<float*>(c.ptr[max]), static_cast<float*>(c.ptr[sum]),
                 c.ptr[dq], c.ptr[dk], c.ptr[dv]);
  };
}

}  // namespace lockstep::backends::cpu
