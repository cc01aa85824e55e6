// The ref backend's recurrent kernels: one LSTM or GRU layer in one direction and its gradient,
// direct loops over the time steps in double (ir/ops.def says what they compute).
#include <cmath>
#include <vector>

#include "backends/ref/ref_kernels.h"
#include "ir/attrs.h"

namespace lockstep::backends::ref {
namespace {

using Values = std::vector<double>;

double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

// What an LSTM's and a GRU's forward passes share: the operands widened to double (f32 or f64),
// the sizes, the direction (time steps in processing order k sit at positions pos(k)), every
// step's gates for the gradient ([T][N][4H] by position) and hidden states ([T][N][H]).
struct RnnRun {
  std::vector<Values> v;
  int64_t t, n, in, h;
  bool reverse;
  Values gates, hs;

  RnnRun(const ir::GraphNode& node, const std::vector<Arr>& a)
      : v(widen(node.dtype, a)),
        t(a[0].shape[0]),
        n(a[0].shape[1]),
        in(a[0].shape[2]),
        h(a[1].shape[1]),
        reverse(ir::RnnAttrs::of(node.attrs).reverse),
        gates(static_cast<size_t>(t * n * 4 * h)),
        hs(static_cast<size_t>(t * n * h)) {}
  static std::vector<Values> widen(DType dtype, const std::vector<Arr>& a) {
    std::vector<Values> v;
    for (const Arr& x : a) {
      const size_t count = static_cast<size_t>(shape_numel(x.shape));
      if (dtype == DType::F64)
        v.emplace_back(x.as<double>(), x.as<double>() + count);
      else
        v.emplace_back(x.as<float>(), x.as<float>() + count);
    }
    return v;
  }
  int64_t pos(int64_t k) const { return reverse ? t - 1 - k : k; }
  size_t at(int64_t s, int64_t r, int64_t j) const {
    return static_cast<size_t>((s * n + r) * h + j);
  }
  // The hidden state before the step at position `prev` (-1: the initial one, operand 1).
  double h_prev(int64_t prev, int64_t r, int64_t j) const {
    return prev < 0 ? v[1][static_cast<size_t>(r * h + j)] : hs[at(prev, r, j)];
  }
  // Sum over q of x[s, r, q] w[j, q] (operand w: [*, I]) and of h_prev[r, q] u[j, q] ([*, H]).
  double x_times(int64_t s, int64_t r, const Values& w, int64_t j) const {
    double acc = 0;
    for (int64_t q = 0; q < in; ++q)
      acc += v[0][static_cast<size_t>((s * n + r) * in + q)] * w[static_cast<size_t>(j * in + q)];
    return acc;
  }
  double h_times(int64_t prev, int64_t r, const Values& u, int64_t j) const {
    double acc = 0;
    for (int64_t q = 0; q < h; ++q) acc += h_prev(prev, r, q) * u[static_cast<size_t>(j * h + q)];
    return acc;
  }
  // The gradient's share of a step for batch row r, given the gradients of its gates'
  // pre-activations as the input and the hidden projections see them (da_x, da_h: G H values):
  // into x's gradient (at the start of `grad`, for both cells), the weights' (at offsets wi and
  // wh) and the hidden state's before the step.
  void back_project(int64_t s, int64_t prev, int64_t r, int64_t gates_n, const Values& da_x,
                    const Values& da_h, const Values& w_ih, const Values& w_hh, int64_t wi,
                    int64_t wh, Values& grad, Values& dh_prev) const {
    for (int64_t j = 0; j < gates_n * h; ++j) {
      const double dx = da_x[static_cast<size_t>(j)], dhh = da_h[static_cast<size_t>(j)];
      for (int64_t q = 0; q < in; ++q) {
        const size_t xq = static_cast<size_t>((s * n + r) * in + q);
        grad[xq] += dx * w_ih[static_cast<size_t>(j * in + q)];
        grad[static_cast<size_t>(wi + j * in + q)] += dx * v[0][xq];
      }
      for (int64_t q = 0; q < h; ++q) {
        dh_prev[static_cast<size_t>(r * h + q)] += dhh * w_hh[static_cast<size_t>(j * h + q)];
        grad[static_cast<size_t>(wh + j * h + q)] += dhh * h_prev(prev, r, q);
      }
    }
  }
  // The layer's value: every step's h, then the last h (and the last of `c`, an LSTM's).
  Values value(const Values* c) const {
    Values out(hs);
    const size_t state = static_cast<size_t>(n * h), last = static_cast<size_t>(pos(t - 1));
    out.insert(out.end(), hs.begin() + last * state, hs.begin() + (last + 1) * state);
    if (c) out.insert(out.end(), c->begin() + last * state, c->begin() + (last + 1) * state);
    return out;
  }
};

// Operands x, h0, c0, w_ih [4H, I], w_hh [4H, H], b [4H]; the gates kept after their
// activations (i, f, g, o), and the cell states.
struct LstmRun : RnnRun {
  Values c;

  LstmRun(const ir::GraphNode& node, const std::vector<Arr>& a)
      : RnnRun(node, a), c(static_cast<size_t>(t * n * h)) {
    for (int64_t k = 0; k < t; ++k) {
      const int64_t s = pos(k), prev = k == 0 ? -1 : pos(k - 1);
      for (int64_t r = 0; r < n; ++r) {
        double* g = &gates[static_cast<size_t>((s * n + r) * 4 * h)];
        for (int64_t j = 0; j < 4 * h; ++j)
          g[j] = v[5][static_cast<size_t>(j)] + x_times(s, r, v[3], j) + h_times(prev, r, v[4], j);
        for (int64_t j = 0; j < h; ++j) {
          const double i = sigmoid(g[j]), f = sigmoid(g[h + j]), cand = std::tanh(g[2 * h + j]),
                       o = sigmoid(g[3 * h + j]);
          g[j] = i, g[h + j] = f, g[2 * h + j] = cand, g[3 * h + j] = o;
          c[at(s, r, j)] = f * c_prev(prev, r, j) + i * cand;
          hs[at(s, r, j)] = o * std::tanh(c[at(s, r, j)]);
        }
      }
    }
  }
  double c_prev(int64_t prev, int64_t r, int64_t j) const {
    return prev < 0 ? v[2][static_cast<size_t>(r * h + j)] : c[at(prev, r, j)];
  }

  // Operands 6 and 7: the value and its gradient. Returns the gradients (rnn_grad_offsets).
  Values gradient() const {
    const std::vector<int64_t> o = ir::rnn_grad_offsets(true, t, n, in, h);
    const Values& gout = v[7];
    const size_t state = static_cast<size_t>(n * h);
    Values grad(static_cast<size_t>(o.back()), 0.0), da(static_cast<size_t>(4 * h));
    Values dh(gout.begin() + t * state, gout.begin() + (t + 1) * state);
    Values dc(gout.begin() + (t + 1) * state, gout.begin() + (t + 2) * state);
    for (int64_t k = t - 1; k >= 0; --k) {
      const int64_t s = pos(k), prev = k == 0 ? -1 : pos(k - 1);
      Values dh_prev(state, 0.0);
      for (int64_t r = 0; r < n; ++r) {
        const double* g = &gates[static_cast<size_t>((s * n + r) * 4 * h)];
        for (int64_t j = 0; j < h; ++j) {
          const size_t u = static_cast<size_t>(j), sj = static_cast<size_t>(r * h + j);
          const double i = g[j], f = g[h + j], cand = g[2 * h + j], og = g[3 * h + j];
          const double tc = std::tanh(c[at(s, r, j)]);
          const double dht = dh[sj] + gout[at(s, r, j)];
          const double dct = dc[sj] + dht * og * (1 - tc * tc);
          da[u] = dct * cand * i * (1 - i);
          da[h + u] = dct * c_prev(prev, r, j) * f * (1 - f);
          da[2 * h + u] = dct * i * (1 - cand * cand);
          da[3 * h + u] = dht * tc * og * (1 - og);
          dc[sj] = dct * f;
        }
        for (size_t j = 0; j < da.size(); ++j) grad[static_cast<size_t>(o[5]) + j] += da[j];
        back_project(s, prev, r, 4, da, da, v[3], v[4], o[3], o[4], grad, dh_prev);
      }
      dh = std::move(dh_prev);
    }
    std::copy(dh.begin(), dh.end(), grad.begin() + o[1]);
    std::copy(dc.begin(), dc.end(), grad.begin() + o[2]);
    return grad;
  }
};

// Operands x, h0, w_ih [3H, I], w_hh [3H, H], b [4H]; the gates kept: r, z, n and W_hn h + b_hn.
struct GruRun : RnnRun {
  GruRun(const ir::GraphNode& node, const std::vector<Arr>& a) : RnnRun(node, a) {
    const Values& b = v[4];
    for (int64_t k = 0; k < t; ++k) {
      const int64_t s = pos(k), prev = k == 0 ? -1 : pos(k - 1);
      for (int64_t r = 0; r < n; ++r) {
        double* g = &gates[static_cast<size_t>((s * n + r) * 4 * h)];
        for (int64_t j = 0; j < h; ++j) {
          const size_t u = static_cast<size_t>(j);
          auto both = [&](int64_t gate) {
            return x_times(s, r, v[2], gate * h + j) + h_times(prev, r, v[3], gate * h + j);
          };
          const double rg = sigmoid(both(0) + b[u]), z = sigmoid(both(1) + b[h + u]);
          const double hn = h_times(prev, r, v[3], 2 * h + j) + b[3 * h + u];
          const double cand = std::tanh(x_times(s, r, v[2], 2 * h + j) + b[2 * h + u] + rg * hn);
          g[j] = rg, g[h + j] = z, g[2 * h + j] = cand, g[3 * h + j] = hn;
          hs[at(s, r, j)] = (1 - z) * cand + z * h_prev(prev, r, j);
        }
      }
    }
  }

  // Operands 5 and 6: the value and its gradient. Returns the gradients (rnn_grad_offsets).
  Values gradient() const {
    const std::vector<int64_t> o = ir::rnn_grad_offsets(false, t, n, in, h);
    const Values& gout = v[6];
    const size_t state = static_cast<size_t>(n * h);
    Values grad(static_cast<size_t>(o.back()), 0.0);
    Values dh(gout.begin() + t * state, gout.begin() + (t + 1) * state);
    Values dai(static_cast<size_t>(3 * h)), dah(static_cast<size_t>(3 * h));
    for (int64_t k = t - 1; k >= 0; --k) {
      const int64_t s = pos(k), prev = k == 0 ? -1 : pos(k - 1);
      Values dh_prev(state, 0.0);
      for (int64_t r = 0; r < n; ++r) {
        const double* g = &gates[static_cast<size_t>((s * n + r) * 4 * h)];
        for (int64_t j = 0; j < h; ++j) {
          const size_t u = static_cast<size_t>(j), sj = static_cast<size_t>(r * h + j);
          const double rg = g[j], z = g[h + j], cand = g[2 * h + j], hn = g[3 * h + j];
          const double dht = dh[sj] + gout[at(s, r, j)];
          const double dan = dht * (1 - z) * (1 - cand * cand);
          const double dar = dan * hn * rg * (1 - rg);
          const double daz = dht * (h_prev(prev, r, j) - cand) * z * (1 - z);
          dai[u] = dah[u] = dar;
          dai[h + u] = dah[h + u] = daz;
          dai[2 * h + u] = dan;
          dah[2 * h + u] = dan * rg;
          dh_prev[sj] += dht * z;
          const size_t b = static_cast<size_t>(o[4]) + u;
          grad[b] += dar, grad[b + h] += daz, grad[b + 2 * h] += dan, grad[b + 3 * h] += dan * rg;
        }
        back_project(s, prev, r, 3, dai, dah, v[2], v[3], o[2], o[3], grad, dh_prev);
      }
      dh = std::move(dh_prev);
    }
    std::copy(dh.begin(), dh.end(), grad.begin() + o[1]);
    return grad;
  }
};

// Values narrowed to the node's dtype into `out`.
void store(const ir::GraphNode& node, const Values& values, void* out) {
  for (size_t k = 0; k < values.size(); ++k) {
    if (node.dtype == DType::F64)
      static_cast<double*>(out)[k] = values[k];
    else
      static_cast<float*>(out)[k] = static_cast<float>(values[k]);
  }
}

}  // namespace

void lstm(const ir::GraphNode& n, const std::vector<Arr>& a, void* out) {
  const LstmRun run(n, a);
  store(n, run.value(&run.c), out);
}

void lstm_backward(const ir::GraphNode& n, const std::vector<Arr>& a, void* out) {
  store(n, LstmRun(n, a).gradient(), out);
}

void gru(const ir::GraphNode& n, const std::vector<Arr>& a, void* out) {
  store(n, GruRun(n, a).value(nullptr), out);
}

void gru_backward(const ir::GraphNode& n, const std::vector<Arr>& a, void* out) {
  store(n, GruRun(n, a).gradient(), out);
}

}  // namespace lockstep::backends::ref
