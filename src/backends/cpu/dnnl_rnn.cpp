// oneDNN's LSTM primitive for one layer in one direction; see DnnlLstm in dnnl_ops.h.
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

// A weight in PyTorch's plain [4H, in] (oneDNN's ldgoi) and the copy oneDNN's primitive reads or
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
    LS_INTERNAL_CHECK(pd.scratchpad_desc().get_size() == 0, "an LSTM weight's reorder wants ",
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
  }
};

}  // namespace

struct DnnlLstm::Impl {
  int64_t t, n, i, h;
  memory::desc x_md, state_md, bias_md, y_md, ws_md;
  std::unique_ptr<dnnl::lstm_forward::primitive_desc> fwd_pd;
  std::unique_ptr<dnnl::lstm_backward::primitive_desc> bwd_pd;
  std::unique_ptr<dnnl::lstm_forward> fwd;
  std::unique_ptr<dnnl::lstm_backward> bwd;
  // Forward: the weights' copies, then the scratchpad. Backward: its weights' copies, their
  // gradients', its scratchpad, then what a recomputed forward takes (the forward's copies and
  // scratchpad at fwd_at, its workspace and results after them).
  Weight w_ih, w_hh, bw_ih, bw_hh, dw_ih, dw_hh;
  size_t fwd_pad = 0, fwd_floats = 0, bwd_pad = 0, ws_at = 0, y_at = 0, bwd_floats = 0;
};

DnnlLstm::DnnlLstm(int64_t t, int64_t n, int64_t i, int64_t h, bool reverse)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.t = t, m.n = n, m.i = i, m.h = h;
  try {
    m.x_md = memory::desc({t, n, i}, dt::f32, tag::tnc);
    m.state_md = memory::desc({1, 1, n, h}, dt::f32, tag::ldnc);
    m.bias_md = memory::desc({1, 1, 4, h}, dt::f32, tag::ldgo);
    m.y_md = memory::desc({t, n, h}, dt::f32, tag::tnc);
    const memory::desc wl_user({1, 1, i, 4, h}, dt::f32, tag::ldgoi);
    const memory::desc wi_user({1, 1, h, 4, h}, dt::f32, tag::ldgoi);
    const memory::desc wl_any({1, 1, i, 4, h}, dt::f32, tag::any);
    const memory::desc wi_any({1, 1, h, 4, h}, dt::f32, tag::any);
    const dnnl::rnn_direction dir = reverse ? dnnl::rnn_direction::unidirectional_right2left
                                            : dnnl::rnn_direction::unidirectional_left2right;
    const dnnl::lstm_forward::desc fd(dnnl::prop_kind::forward_training, dir, m.x_md, m.state_md,
                                      m.state_md, wl_any, wi_any, m.bias_md, m.y_md, m.state_md,
                                      m.state_md);
    m.fwd_pd =
        std::make_unique<dnnl::lstm_forward::primitive_desc>(fd, user_scratchpad(), engine());
    m.fwd = std::make_unique<dnnl::lstm_forward>(*m.fwd_pd);
    m.ws_md = m.fwd_pd->workspace_desc();
    size_t at = m.w_ih.init(wl_user, m.fwd_pd->weights_layer_desc(), false, 0);
    at += m.w_hh.init(wi_user, m.fwd_pd->weights_iter_desc(), false, at);
    m.fwd_pad = at;
    m.fwd_floats = at + floats_for(m.fwd_pd->scratchpad_desc());

    const dnnl::lstm_backward::desc bd(dnnl::prop_kind::backward, dir, m.x_md, m.state_md,
                                       m.state_md, wl_any, wi_any, m.bias_md, m.y_md, m.state_md,
                                       m.state_md, m.x_md, m.state_md, m.state_md, wl_any, wi_any,
                                       m.bias_md, m.y_md, m.state_md, m.state_md);
    m.bwd_pd = std::make_unique<dnnl::lstm_backward::primitive_desc>(bd, user_scratchpad(),
                                                                     engine(), *m.fwd_pd);
    m.bwd = std::make_unique<dnnl::lstm_backward>(*m.bwd_pd);
    at = m.bw_ih.init(wl_user, m.bwd_pd->weights_layer_desc(), false, 0);
    at += m.bw_hh.init(wi_user, m.bwd_pd->weights_iter_desc(), false, at);
    at += m.dw_ih.init(wl_user, m.bwd_pd->diff_weights_layer_desc(), true, at);
    at += m.dw_hh.init(wi_user, m.bwd_pd->diff_weights_iter_desc(), true, at);
    m.bwd_pad = at;
    at += floats_for(m.bwd_pd->scratchpad_desc());
    // A recomputed forward's copies and scratchpad, workspace, results: after the backward's.
    m.ws_at = at + m.fwd_floats;
    m.y_at = m.ws_at + floats_for(m.ws_md);
    m.bwd_floats = m.y_at + static_cast<size_t>((t + 2) * n * h + 16);
  } catch (const dnnl::error& e) {
    rethrow(e, "lstm");
  }
}

DnnlLstm::~DnnlLstm() = default;

size_t DnnlLstm::workspace_bytes() const { return impl_->ws_md.get_size(); }

size_t DnnlLstm::scratch_bytes() const {
  return std::max(impl_->fwd_floats, impl_->bwd_floats) * sizeof(float);
}

namespace {

// The forward pass with its weights' copies and scratchpad from `base`.
void run_forward(const DnnlLstm::Impl& m, const float* const in[6], float* out, void* workspace,
                 float* base) {
  m.w_ih.to_prim(in[3], base);
  m.w_hh.to_prim(in[4], base);
  const size_t state = static_cast<size_t>(m.n * m.h);
  float* y = out;
  float* hn = out + m.t * static_cast<int64_t>(state);
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC_LAYER, memory(m.x_md, engine(), const_cast<float*>(in[0]))},
      {DNNL_ARG_SRC_ITER, memory(m.state_md, engine(), const_cast<float*>(in[1]))},
      {DNNL_ARG_SRC_ITER_C, memory(m.state_md, engine(), const_cast<float*>(in[2]))},
      {DNNL_ARG_WEIGHTS_LAYER, m.w_ih.in_prim(base)},
      {DNNL_ARG_WEIGHTS_ITER, m.w_hh.in_prim(base)},
      {DNNL_ARG_BIAS, memory(m.bias_md, engine(), const_cast<float*>(in[5]))},
      {DNNL_ARG_DST_LAYER, memory(m.y_md, engine(), y)},
      {DNNL_ARG_DST_ITER, memory(m.state_md, engine(), hn)},
      {DNNL_ARG_DST_ITER_C, memory(m.state_md, engine(), hn + state)},
      {DNNL_ARG_WORKSPACE, memory(m.ws_md, engine(), workspace)}};
  add_scratchpad(&args, m.fwd_pd->scratchpad_desc(), base + m.fwd_pad);
  m.fwd->execute(stream(), args);
}

}  // namespace

void DnnlLstm::forward(const float* const in[6], float* out, void* workspace) {
  try {
    run_forward(*impl_, in, out, workspace, scratch(impl_->fwd_floats));
    stream().wait();
  } catch (const dnnl::error& e) {
    rethrow(e, "lstm forward");
  }
}

void DnnlLstm::backward(const float* const in[8], float* grads, const void* workspace) {
  const Impl& m = *impl_;
  try {
    float* base = scratch(m.bwd_floats);
    if (!workspace) {  // the forward pass again, for its workspace
      float* ws = base + m.ws_at;
      run_forward(m, in, base + m.y_at, ws, base + (m.ws_at - m.fwd_floats));
      workspace = ws;
    }
    const std::array<int64_t, 7> at = ir::lstm_grad_offsets(m.t, m.n, m.i, m.h);
    const size_t state = static_cast<size_t>(m.n * m.h);
    m.bw_ih.to_prim(in[3], base);
    m.bw_hh.to_prim(in[4], base);
    // oneDNN adds the weights' and bias's gradients to what their memory holds.
    for (const Weight* w : {&m.dw_ih, &m.dw_hh})
      std::memset(base + w->offset, 0, w->prim.get_size());
    std::memset(grads + at[5], 0, static_cast<size_t>(4 * m.h) * sizeof(float));
    auto mem = [](const memory::desc& md, const float* p) {
      return memory(md, engine(), const_cast<float*>(p));
    };
    const float *y = in[6], *gy = in[7];
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC_LAYER, mem(m.x_md, in[0])},
        {DNNL_ARG_SRC_ITER, mem(m.state_md, in[1])},
        {DNNL_ARG_SRC_ITER_C, mem(m.state_md, in[2])},
        {DNNL_ARG_WEIGHTS_LAYER, m.bw_ih.in_prim(base)},
        {DNNL_ARG_WEIGHTS_ITER, m.bw_hh.in_prim(base)},
        {DNNL_ARG_BIAS, mem(m.bias_md, in[5])},
        {DNNL_ARG_DST_LAYER, mem(m.y_md, y)},
        {DNNL_ARG_DST_ITER, mem(m.state_md, y + m.t * static_cast<int64_t>(state))},
        {DNNL_ARG_DST_ITER_C, mem(m.state_md, y + (m.t + 1) * static_cast<int64_t>(state))},
        {DNNL_ARG_DIFF_DST_LAYER, mem(m.y_md, gy)},
        {DNNL_ARG_DIFF_DST_ITER, mem(m.state_md, gy + m.t * static_cast<int64_t>(state))},
        {DNNL_ARG_DIFF_DST_ITER_C, mem(m.state_md, gy + (m.t + 1) * static_cast<int64_t>(state))},
        {DNNL_ARG_WORKSPACE, mem(m.ws_md, static_cast<const float*>(workspace))},
        {DNNL_ARG_DIFF_SRC_LAYER, mem(m.x_md, grads + at[0])},
        {DNNL_ARG_DIFF_SRC_ITER, mem(m.state_md, grads + at[1])},
        {DNNL_ARG_DIFF_SRC_ITER_C, mem(m.state_md, grads + at[2])},
        {DNNL_ARG_DIFF_WEIGHTS_LAYER, m.dw_ih.in_prim(base)},
        {DNNL_ARG_DIFF_WEIGHTS_ITER, m.dw_hh.in_prim(base)},
        {DNNL_ARG_DIFF_BIAS, mem(m.bias_md, grads + at[5])}};
    add_scratchpad(&args, m.bwd_pd->scratchpad_desc(), base + m.bwd_pad);
    m.bwd->execute(stream(), args);
    m.dw_ih.to_user(grads + at[3], base);
    m.dw_hh.to_user(grads + at[4], base);
    stream().wait();
  } catch (const dnnl::error& e) {
    rethrow(e, "lstm backward");
  }
}

}  // namespace lockstep::backends::cpu
