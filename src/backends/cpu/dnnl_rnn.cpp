// oneDNN's LSTM and linear-before-reset GRU primitives for one layer in one direction; see
// DnnlRnn in dnnl_ops.h.
#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <unordered_map>

#include "backends/cpu/dnnl_common.h"
#include "backends/cpu/dnnl_ops.h"
#include "ir/attrs.h"
#include "util/check.h"

namespace lockstep::backends::cpu {
namespace {

// A weight in PyTorch's plain [G H, in] (oneDNN's ldgoi) and the copy oneDNN's primitive reads or
// writes in its own layout, at `offset` floats into the shared scratch.
struct Weight {
  memory::desc user, prim;
  size_t offset = 0;
  std::unique_ptr<dnnl::reorder> reorder;

  // Returns the floats it takes in the scratch from `at`.
  size_t init(const memory::desc& user_md, const memory::desc& prim_md, bool output, size_t at) {
    user = user_md;
    prim = prim_md;
    offset = at;
    const dnnl::reorder::primitive_desc pd =
        output ? dnnl::reorder::primitive_desc(engine(), prim, engine(), user, user_scratchpad())
               : dnnl::reorder::primitive_desc(engine(), user, engine(), prim, user_scratchpad());
    LS_INTERNAL_CHECK(pd.scratchpad_desc().get_size() == 0, "a recurrent weight's reorder wants ",
                      pd.scratchpad_desc().get_size(), " bytes of scratchpad");
    reorder = std::make_unique<dnnl::reorder>(pd);
    return floats_for(prim);
  }
  memory in_prim(float* base) const { return memory(prim, engine(), base + offset); }
  // Copies `user_data` into the primitive's layout (an input) or back (an output).
  void to_prim(const float* user_data, float* base) const {
    memory u(user, engine(), const_cast<float*>(user_data));
    memory p = in_prim(base);
    reorder->execute(stream(), u, p);
  }
  void to_user(float* user_data, float* base) const {
    memory u(user, engine(), user_data);
    memory p = in_prim(base);
    reorder->execute(stream(), p, u);
    stream().wait();
  }
};

// PyTorch orders a GRU's gates r, z, n; oneDNN u (= z), r, o (= n): the first two blocks of `h`
// rows (of `cols` values each) trade places, the others stay. Its own inverse.
void swap_first_gates(const float* src, float* dst, int64_t blocks, int64_t h, int64_t cols) {
  const size_t block = static_cast<size_t>(h * cols) * sizeof(float);
  std::memcpy(dst, src + h * cols, block);
  std::memcpy(dst + h * cols, src, block);
  std::memcpy(dst + 2 * h * cols, src + 2 * h * cols, block * static_cast<size_t>(blocks - 2));
}

memory::desc arg_md(const dnnl::primitive_desc& pd, int arg) {
  return pd.query_md(dnnl::query::exec_arg_md, arg);
}

}  // namespace

struct DnnlRnn::Impl {
  bool gru;
  int64_t t, n, i, h, g;  // g: the gates per hidden unit (4, or 3)
  memory::desc x_md, state_md, bias_md, y_md, ws_md, fwd_pad_md, bwd_pad_md;
  dnnl::primitive fwd, bwd;
  // Forward: the weights' copies, then the scratchpad. Backward: its weights' copies, their
  // gradients', its scratchpad, then what a recomputed forward takes (the forward's copies and
  // scratchpad at ws_at - fwd_floats, its workspace and results after them), then a GRU's
  // weights and bias with their gates reordered (at gates_at).
  Weight w_ih, w_hh, bw_ih, bw_hh, dw_ih, dw_hh;
  size_t fwd_pad = 0, fwd_floats = 0, bwd_pad = 0, ws_at = 0, y_at = 0, gates_at = 0;
  size_t bwd_floats = 0;

  int64_t state() const { return n * h; }
  // The layer's weights and bias as oneDNN orders their gates: the user's for an LSTM, copies
  // with the first two gates swapped (in the scratch from gates_at) for a GRU.
  std::array<const float*, 3> gate_order(const float* w_ih_user, const float* w_hh_user,
                                         const float* b_user, float* base) const {
    if (!gru) return {w_ih_user, w_hh_user, b_user};
    float* wi = base + gates_at;
    float* wh = wi + g * h * i;
    float* b = wh + g * h * h;
    swap_first_gates(w_ih_user, wi, g, h, i);
    swap_first_gates(w_hh_user, wh, g, h, h);
    swap_first_gates(b_user, b, 4, h, 1);
    return {wi, wh, b};
  }
};

DnnlRnn::DnnlRnn(Cell cell, int64_t t, int64_t n, int64_t i, int64_t h, bool reverse)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.gru = cell == Cell::Gru;
  m.t = t, m.n = n, m.i = i, m.h = h, m.g = m.gru ? 3 : 4;
  try {
    m.x_md = memory::desc({t, n, i}, dt::f32, tag::tnc);
    m.state_md = memory::desc({1, 1, n, h}, dt::f32, tag::ldnc);
    m.bias_md = memory::desc({1, 1, 4, h}, dt::f32, tag::ldgo);  // a GRU's has 4 too
    m.y_md = memory::desc({t, n, h}, dt::f32, tag::tnc);
    const memory::desc wl_user({1, 1, i, m.g, h}, dt::f32, tag::ldgoi);
    const memory::desc wi_user({1, 1, h, m.g, h}, dt::f32, tag::ldgoi);
    const memory::desc wl_any({1, 1, i, m.g, h}, dt::f32, tag::any);
    const memory::desc wi_any({1, 1, h, m.g, h}, dt::f32, tag::any);
    const dnnl::rnn_direction dir = reverse ? dnnl::rnn_direction::unidirectional_right2left
                                            : dnnl::rnn_direction::unidirectional_left2right;
    const dnnl::prop_kind train = dnnl::prop_kind::forward_training;
    const memory::desc &x = m.x_md, &s = m.state_md, &b = m.bias_md, &y = m.y_md;
    dnnl::primitive_desc fwd_pd, bwd_pd;
    if (m.gru) {
      const dnnl::lbr_gru_forward::primitive_desc f(
          dnnl::lbr_gru_forward::desc(train, dir, x, s, wl_any, wi_any, b, y, s), user_scratchpad(),
          engine());
      const dnnl::lbr_gru_backward::desc bd(dnnl::prop_kind::backward, dir, x, s, wl_any, wi_any, b,
                                            y, s, x, s, wl_any, wi_any, b, y, s);
      m.fwd = dnnl::lbr_gru_forward(f);
      const dnnl::lbr_gru_backward::primitive_desc bp(bd, user_scratchpad(), engine(), f);
      m.bwd = dnnl::lbr_gru_backward(bp);
      fwd_pd = f, bwd_pd = bp;
    } else {
      const dnnl::lstm_forward::primitive_desc f(
          dnnl::lstm_forward::desc(train, dir, x, s, s, wl_any, wi_any, b, y, s, s),
          user_scratchpad(), engine());
      const dnnl::lstm_backward::desc bd(dnnl::prop_kind::backward, dir, x, s, s, wl_any, wi_any, b,
                                         y, s, s, x, s, s, wl_any, wi_any, b, y, s, s);
      m.fwd = dnnl::lstm_forward(f);
      const dnnl::lstm_backward::primitive_desc bp(bd, user_scratchpad(), engine(), f);
      m.bwd = dnnl::lstm_backward(bp);
      fwd_pd = f, bwd_pd = bp;
    }
    m.ws_md = fwd_pd.workspace_desc();
    m.fwd_pad_md = fwd_pd.scratchpad_desc();
    m.bwd_pad_md = bwd_pd.scratchpad_desc();
    size_t at = m.w_ih.init(wl_user, arg_md(fwd_pd, DNNL_ARG_WEIGHTS_LAYER), false, 0);
    at += m.w_hh.init(wi_user, arg_md(fwd_pd, DNNL_ARG_WEIGHTS_ITER), false, at);
    m.fwd_pad = at;
    m.fwd_floats = at + floats_for(m.fwd_pad_md);
    at = m.bw_ih.init(wl_user, arg_md(bwd_pd, DNNL_ARG_WEIGHTS_LAYER), false, 0);
    at += m.bw_hh.init(wi_user, arg_md(bwd_pd, DNNL_ARG_WEIGHTS_ITER), false, at);
    at += m.dw_ih.init(wl_user, arg_md(bwd_pd, DNNL_ARG_DIFF_WEIGHTS_LAYER), true, at);
    at += m.dw_hh.init(wi_user, arg_md(bwd_pd, DNNL_ARG_DIFF_WEIGHTS_ITER), true, at);
    m.bwd_pad = at;
    at += floats_for(m.bwd_pad_md);
    m.ws_at = at + m.fwd_floats;
    m.y_at = m.ws_at + floats_for(m.ws_md);
    m.gates_at = m.y_at + static_cast<size_t>((t + 2) * n * h + 16);
    m.bwd_floats = m.gates_at + static_cast<size_t>(2 * m.g * h * (i + h) + 8 * h + 16);
  } catch (const dnnl::error& e) {
    rethrow(e, m.gru ? "gru" : "lstm");
  }
}

DnnlRnn::~DnnlRnn() = default;

size_t DnnlRnn::workspace_bytes() const { return impl_->ws_md.get_size(); }

size_t DnnlRnn::scratch_bytes() const { return impl_->bwd_floats * sizeof(float); }

namespace {

memory mem(const memory::desc& md, const void* p) {
  return memory(md, engine(), const_cast<void*>(p));
}

// The arguments the forward and the backward primitives share: the forward pass's operands, its
// result `y` (the sequence, then the last state and for an LSTM the last cell) and its workspace,
// with the weights in the layout of `w_ih` and `w_hh`.
std::unordered_map<int, memory> pass_args(const DnnlRnn::Impl& m, const float* const* in,
                                          const Weight& w_ih, const Weight& w_hh, const float* b,
                                          const float* y, const void* workspace, float* base) {
  const float* last = y + m.t * m.state();
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC_LAYER, mem(m.x_md, in[0])},     {DNNL_ARG_SRC_ITER, mem(m.state_md, in[1])},
      {DNNL_ARG_WEIGHTS_LAYER, w_ih.in_prim(base)}, {DNNL_ARG_WEIGHTS_ITER, w_hh.in_prim(base)},
      {DNNL_ARG_BIAS, mem(m.bias_md, b)},           {DNNL_ARG_DST_LAYER, mem(m.y_md, y)},
      {DNNL_ARG_DST_ITER, mem(m.state_md, last)},   {DNNL_ARG_WORKSPACE, mem(m.ws_md, workspace)}};
  if (!m.gru) {
    args.insert({DNNL_ARG_SRC_ITER_C, mem(m.state_md, in[2])});
    args.insert({DNNL_ARG_DST_ITER_C, mem(m.state_md, last + m.state())});
  }
  return args;
}

// The forward pass (operands as DnnlRnn::forward's), its scratch from `base`.
void run_forward(const DnnlRnn::Impl& m, const float* const* in, float* out, void* workspace,
                 float* base, float* gates_base) {
  const int k = m.gru ? 2 : 3;  // where the weights start
  const auto [w_ih, w_hh, b] = m.gate_order(in[k], in[k + 1], in[k + 2], gates_base);
  m.w_ih.to_prim(w_ih, base);
  m.w_hh.to_prim(w_hh, base);
  std::unordered_map<int, memory> args = pass_args(m, in, m.w_ih, m.w_hh, b, out, workspace, base);
  add_scratchpad(&args, m.fwd_pad_md, base + m.fwd_pad);
  m.fwd.execute(stream(), args);
}

}  // namespace

void DnnlRnn::forward(const float* const* in, float* out, void* workspace) {
  try {
    float* base = scratch(impl_->bwd_floats);
    run_forward(*impl_, in, out, workspace, base, base);
    stream().wait();
  } catch (const dnnl::error& e) {
    rethrow(e, impl_->gru ? "gru forward" : "lstm forward");
  }
}

void DnnlRnn::backward(const float* const* in, float* grads, const void* workspace) {
  const Impl& m = *impl_;
  try {
    float* base = scratch(m.bwd_floats);
    if (!workspace) {  // the forward pass again, for its workspace
      float* ws = base + m.ws_at;
      run_forward(m, in, base + m.y_at, ws, base + (m.ws_at - m.fwd_floats), base);
      workspace = ws;
    }
    // Operands: x, h0, [c0,] w_ih, w_hh, b, out, gout; gradients x, h0, [c0,] w_ih, w_hh, b.
    const int k = m.gru ? 2 : 3;
    const std::vector<int64_t> at = ir::rnn_grad_offsets(!m.gru, m.t, m.n, m.i, m.h);
    const auto [w_ih, w_hh, b] = m.gate_order(in[k], in[k + 1], in[k + 2], base);
    m.bw_ih.to_prim(w_ih, base);
    m.bw_hh.to_prim(w_hh, base);
    // oneDNN adds the weights' and bias's gradients to what their memory holds. A GRU's come
    // out in oneDNN's gate order, into the scratch, and are put in PyTorch's after.
    for (const Weight* w : {&m.dw_ih, &m.dw_hh})
      std::memset(base + w->offset, 0, w->prim.get_size());
    float* gates = base + m.gates_at + m.g * m.h * (m.i + m.h) + 4 * m.h;
    float* d_ih = m.gru ? gates : grads + at[k];
    float* d_hh = m.gru ? d_ih + m.g * m.h * m.i : grads + at[k + 1];
    float* d_b = m.gru ? d_hh + m.g * m.h * m.h : grads + at[k + 2];
    std::memset(d_b, 0, static_cast<size_t>(4 * m.h) * sizeof(float));
    const float *y = in[k + 3], *gy = in[k + 4];
    const int64_t s = m.state();
    std::unordered_map<int, memory> args =
        pass_args(m, in, m.bw_ih, m.bw_hh, b, y, workspace, base);
    args.insert({{DNNL_ARG_DIFF_DST_LAYER, mem(m.y_md, gy)},
                 {DNNL_ARG_DIFF_DST_ITER, mem(m.state_md, gy + m.t * s)},
                 {DNNL_ARG_DIFF_SRC_LAYER, mem(m.x_md, grads + at[0])},
                 {DNNL_ARG_DIFF_SRC_ITER, mem(m.state_md, grads + at[1])},
                 {DNNL_ARG_DIFF_WEIGHTS_LAYER, m.dw_ih.in_prim(base)},
                 {DNNL_ARG_DIFF_WEIGHTS_ITER, m.dw_hh.in_prim(base)},
                 {DNNL_ARG_DIFF_BIAS, mem(m.bias_md, d_b)}});
    if (!m.gru) {
      args.insert({DNNL_ARG_DIFF_DST_ITER_C, mem(m.state_md, gy + (m.t + 1) * s)});
      args.insert({DNNL_ARG_DIFF_SRC_ITER_C, mem(m.state_md, grads + at[2])});
    }
    add_scratchpad(&args, m.bwd_pad_md, base + m.bwd_pad);
    m.bwd.execute(stream(), args);
    m.dw_ih.to_user(d_ih, base);
    m.dw_hh.to_user(d_hh, base);
    if (m.gru) {
      swap_first_gates(d_ih, grads + at[k], m.g, m.h, m.i);
      swap_first_gates(d_hh, grads + at[k + 1], m.g, m.h, m.h);
      swap_first_gates(d_b, grads + at[k + 2], 4, m.h, 1);
    }
  } catch (const dnnl::error& e) {
    rethrow(e, m.gru ? "gru backward" : "lstm backward");
  }
}

}  // namespace lockstep::backends::cpu
