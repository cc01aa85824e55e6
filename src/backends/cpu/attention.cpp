// Running fused attentions (attention.h): the forward and backward steps over blocks of query
// rows. The products are OpenBLAS's sgemm, one thread each (inside the step's parallel loop);
// the row loops are vectorized for the CPU they run on.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "backends/cpu/attention.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/lower_rules.h"
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
// dS = P (dP - sum(dP P)) in place of dP.
LOCKSTEP_TARGET_CLONES void softmax_grad_run(const float* p, float* d, int64_t n) {
  float s = 0;
  for (int64_t j = 0; j < n; ++j) s += d[j] * p[j];
  for (int64_t j = 0; j < n; ++j) d[j] = p[j] * (d[j] - s);
}

// What a run reads: operands' memory and host scalars.
struct Bound {
  const float *q, *k, *v;
  const void* mask;
  float scale = 1, fill = 0, zero = 0;
  bool skip = false;  // columns past a block's last unmasked one are all -inf: skipped
};

float host(const Ctx& c, int64_t input) {
  return input < 0 ? 0.0f : static_cast<float>(c.scalars->at(static_cast<size_t>(input)).f);
}

// Whether the mask takes score (gi, i, j) out (to the fill, or adds -inf).
bool masked(const AttentionFusion& a, const Bound& b, int64_t gi, int64_t i, int64_t j) {
  const int64_t at = a.mask_base[static_cast<size_t>(gi)] + i * a.mask_ls + j * a.mask_ss;
  if (a.mask_kind == MaskKind::Additive) return static_cast<const float*>(b.mask)[at] == kNegInf;
  const bool c = static_cast<const uint8_t*>(b.mask)[at] != 0;
  return a.mask_kind == MaskKind::FillWhereTrue ? c : !c;
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
  if (a.mask_kind == MaskKind::None) return;
  const int64_t at = a.mask_base[static_cast<size_t>(gi)] + i * a.mask_ls;
  if (a.mask_kind == MaskKind::Additive)
    add_mask_run(x, n, static_cast<const float*>(b.mask) + at, a.mask_ss);
  else
    fill_run(x, n, static_cast<const uint8_t*>(b.mask) + at, a.mask_ss,
             a.mask_kind == MaskKind::FillWhereTrue, fill);
}

// The block's masked, scaled scores x [rows, hi] (leading dimension hi) from Q K^T.
void scores(const AttentionFusion& a, const Bound& b, int64_t gi, int64_t i0, int64_t rows,
            int64_t hi, float* x) {
  const auto g = static_cast<size_t>(gi);
  const float* q = b.q + a.q.rows.base[g] + i0 * a.q.rows.ld;
  const float* k = b.k + a.k.rows.base[g];
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(rows),
              static_cast<blasint>(hi), static_cast<blasint>(a.e), 1.0f, q,
              static_cast<blasint>(a.q.rows.ld), k, static_cast<blasint>(a.k.rows.ld), 0.0f, x,
              static_cast<blasint>(hi));
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x + r * hi;
    if (a.scale_kind != ScaleKind::None) scale_run(xr, hi, b.scale, a.scale_kind == ScaleKind::Div);
    mask_row(a, b, gi, i0 + r, xr, hi, b.fill);
  }
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

std::vector<float>& buffer(int which, size_t n) {
  thread_local std::vector<float> bufs[2];
  if (bufs[which].size() < n) bufs[which].resize(n);
  return bufs[which];
}

// Rows per block: the block's scores (and, backward, their gradients) stay in the core's L2
// (64 KiB each); up to 64 rows (more measured no faster on gpt_long's [4, 4, 512, 64]).
int64_t block_rows(const AttentionFusion& a) {
  return std::clamp<int64_t>(16384 / std::max<int64_t>(a.s, 1), 16, 64);
}

blasint bi(int64_t n) { return static_cast<blasint>(n); }

void run_forward(const AttentionFusion& a, const Bound& b, float* out, float* max, float* sum) {
  const int64_t br = std::min(block_rows(a), a.l), blocks = (a.l + br - 1) / br;
  const bool threaded = a.g * a.l * a.s * (a.e + a.ev) >= (1 << 16);
  const std::vector<int64_t> his = block_columns(a, b, br, blocks);
  parallel_for(threaded, a.g * blocks, [&](int64_t t) {
    const int64_t gi = t / blocks, i0 = t % blocks * br, rows = std::min(br, a.l - i0);
    const int64_t hi = his[static_cast<size_t>(t)];
    float* x = buffer(0, static_cast<size_t>(rows * hi)).data();
    scores(a, b, gi, i0, rows, hi, x);
    softmax_rows(x, rows, hi, max + gi * a.l + i0, sum + gi * a.l + i0, true);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, bi(rows), bi(a.ev), bi(hi), 1.0f, x,
                bi(hi), b.v + a.v.rows.base[static_cast<size_t>(gi)], bi(a.v.rows.ld), 0.0f,
                out + a.out_rows.base[static_cast<size_t>(gi)] + i0 * a.out_rows.ld,
                bi(a.out_rows.ld));
  });
}

// The backward of each batch entry on one thread: its dK and dV sum over the blocks of rows.
void run_backward(const AttentionFusion& a, const Bound& b, float* max, float* sum,
                  const float* d_out, float* dq, float* dk, float* dv) {
  const int64_t br = std::min(block_rows(a), a.l), blocks = (a.l + br - 1) / br;
  const bool threaded = a.g * a.l * a.s * (a.e + a.ev) >= (1 << 15);
  const std::vector<int64_t> his = block_columns(a, b, br, blocks);
  parallel_for(threaded, a.g, [&](int64_t gi) {
    float* dvg = dv + a.dv_rows.base[static_cast<size_t>(gi)];
    float* dkg = dk + gi * a.s * a.e;  // [S, E], or [E, S] when dk_transposed
    for (int64_t j = 0; j < a.s; ++j) std::fill_n(dvg + j * a.dv_rows.ld, a.ev, 0.0f);
    std::fill_n(dkg, a.s * a.e, 0.0f);
    const auto g = static_cast<size_t>(gi);
    const float* qg = b.q + a.q.rows.base[g];
    const float* kg = b.k + a.k.rows.base[g];
    const float* vg = b.v + a.v.rows.base[g];
    const int64_t ldq = a.q.rows.ld, ldk = a.k.rows.ld, ldv = a.v.rows.ld, ldo = a.d_out.rows.ld;
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t i0 = blk * br, rows = std::min(br, a.l - i0);
      const int64_t hi = his[g * static_cast<size_t>(blocks) + static_cast<size_t>(blk)];
      float* x = buffer(0, static_cast<size_t>(rows * hi)).data();
      float* dp = buffer(1, static_cast<size_t>(rows * hi)).data();
      scores(a, b, gi, i0, rows, hi, x);
      // P, from the forward's row max and sum (the same operations: the same values).
      softmax_rows(x, rows, hi, max + gi * a.l + i0, sum + gi * a.l + i0, false);
      const float* dog = d_out + a.d_out.rows.base[g] + i0 * ldo;
      // dV[:hi] += P^T dO; dP = dO V[:hi]^T.
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, bi(hi), bi(a.ev), bi(rows), 1.0f, x,
                  bi(hi), dog, bi(ldo), 1.0f, dvg, bi(a.dv_rows.ld));
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bi(rows), bi(hi), bi(a.ev), 1.0f, dog,
                  bi(ldo), vg, bi(ldv), 0.0f, dp, bi(hi));
      for (int64_t r = 0; r < rows; ++r) {  // dS = P (dP - sum(dP P)), masked, scaled
        float* dr = dp + r * hi;
        softmax_grad_run(x + r * hi, dr, hi);
        if (a.mask_kind != MaskKind::Additive) mask_row(a, b, gi, i0 + r, dr, hi, b.zero);
        if (a.scale_kind != ScaleKind::None)
          scale_run(dr, hi, b.scale, a.scale_kind == ScaleKind::Div);
      }
      // dQ = dS K[:hi]; dK[:hi] += dS^T Q (or dK^T[:, :hi] += Q^T dS).
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, bi(rows), bi(a.e), bi(hi), 1.0f, dp,
                  bi(hi), kg, bi(ldk), 0.0f,
                  dq + a.dq_rows.base[static_cast<size_t>(gi)] + i0 * a.dq_rows.ld,
                  bi(a.dq_rows.ld));
      if (a.dk_transposed)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, bi(a.e), bi(hi), bi(rows), 1.0f,
                    qg + i0 * ldq, bi(ldq), dp, bi(hi), 1.0f, dkg, bi(a.s));
      else
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, bi(hi), bi(a.e), bi(rows), 1.0f, dp,
                    bi(hi), qg + i0 * ldq, bi(ldq), 1.0f, dkg, bi(a.e));
    }
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
  l.step.reads = {q, k, v};
  if (mask >= 0) l.step.reads.push_back(mask);
  const auto bind = [a, q, k, v, mask](const Ctx& c) {
    Bound b{static_cast<const float*>(c.ptr[q]), static_cast<const float*>(c.ptr[k]),
            static_cast<const float*>(c.ptr[v]), mask >= 0 ? c.ptr[mask] : nullptr};
    b.scale = host(c, a->scale_input);
    b.fill = host(c, a->fill_input);
    b.zero = host(c, a->zero_input);
    const bool where =
        a->mask_kind == MaskKind::FillWhereTrue || a->mask_kind == MaskKind::KeepWhereTrue;
    b.skip = a->mask_kind == MaskKind::Additive ||
             (where && b.fill == kNegInf && (a->zero_input < 0 || b.zero == 0));
    return b;
  };
  const int32_t max = a->max, sum = a->sum;
  if (l.id == a->forward_at) {
    l.step.label = "attention";
    l.step.node = a->out;
    l.step.extras = {max, sum};
    const int32_t out = a->out;
    l.cs.run = [a, bind, max, sum, out](Ctx& c) {
      run_forward(*a, bind(c), static_cast<float*>(c.ptr[out]), static_cast<float*>(c.ptr[max]),
                  static_cast<float*>(c.ptr[sum]));
    };
    return;
  }
  l.step.label = "attention_backward";
  for (int32_t r : {max, sum, a->d_out.node}) l.step.reads.push_back(r);
  const int32_t d_out = a->d_out.node, dq = a->dq, dk = a->dk, dv = a->dv;
  l.step.node = dq;
  l.step.extras = {dk, dv};
  l.cs.run = [a, bind, max, sum, d_out, dq, dk, dv](Ctx& c) {
    run_backward(*a, bind(c), static_cast<float*>(c.ptr[max]), static_cast<float*>(c.ptr[sum]),
                 static_cast<const float*>(c.ptr[d_out]), static_cast<float*>(c.ptr[dq]),
                 static_cast<float*>(c.ptr[dk]), static_cast<float*>(c.ptr[dv]));
  };
}

}  // namespace lockstep::backends::cpu
