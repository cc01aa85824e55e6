// The ref backend's recurrent kernels: one LSTM or GRU layer in one direction and its gradient,
// direct loops over the time steps in double (ir/ops.def says what they compute).
#include <array>
#include <cmath>
#include <vector>

#include "backends/ref/ref_kernels.h"
#include "ir/attrs.h"

namespace lockstep::backends::ref {
namespace {

double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

// One layer's forward pass, every time step's gates (after their activations: i, f, g, o) and
// cell state kept for the gradient. Time steps in processing order k map to positions t(k).
template <typename T>
struct LstmRun {
  int64_t t, n, in, h;
  bool reverse;
  std::vector<double> gates;  // [T][N][4H], by position
  std::vector<double> c, hs;  // [T][N][H], by position: the cell and hidden state after it

  int64_t pos(int64_t k) const { return reverse ? t - 1 - k : k; }

  LstmRun(const ir::GraphNode& n_, const std::vector<Arr>& a)
      : t(a[0].shape[0]),
        n(a[0].shape[1]),
        in(a[0].shape[2]),
        h(a[1].shape[1]),
        reverse(ir::RnnAttrs::of(n_.attrs).reverse),
        gates(static_cast<size_t>(t * n * 4 * h)),
        c(static_cast<size_t>(t * n * h)),
        hs(static_cast<size_t>(t * n * h)) {
    const T *x = a[0].as<T>(), *w_ih = a[3].as<T>(), *w_hh = a[4].as<T>(), *b = a[5].as<T>();
    for (int64_t k = 0; k < t; ++k) {
      const int64_t s = pos(k), prev = k == 0 ? -1 : pos(k - 1);
      for (int64_t r = 0; r < n; ++r) {
        const T* xr = x + (s * n + r) * in;
        double* g = &gates[static_cast<size_t>((s * n + r) * 4 * h)];
        for (int64_t j = 0; j < 4 * h; ++j) {
          double acc = b[j];
          for (int64_t q = 0; q < in; ++q) acc += static_cast<double>(xr[q]) * w_ih[j * in + q];
          for (int64_t q = 0; q < h; ++q) acc += h_prev(a, prev, r, q) * w_hh[j * h + q];
          g[j] = acc;
        }
        for (int64_t j = 0; j < h; ++j) {
          const double i = sigmoid(g[j]), f = sigmoid(g[h + j]), cand = std::tanh(g[2 * h + j]),
                       o = sigmoid(g[3 * h + j]);
          g[j] = i, g[h + j] = f, g[2 * h + j] = cand, g[3 * h + j] = o;
          const size_t at = static_cast<size_t>((s * n + r) * h + j);
          c[at] = f * c_prev(a, prev, r, j) + i * cand;
          hs[at] = o * std::tanh(c[at]);
        }
      }
    }
  }
  // The state before the step at position `prev` (-1: the initial one).
  double h_prev(const std::vector<Arr>& a, int64_t prev, int64_t r, int64_t j) const {
    return prev < 0 ? static_cast<double>(a[1].as<T>()[r * h + j])
                    : hs[static_cast<size_t>((prev * n + r) * h + j)];
  }
  double c_prev(const std::vector<Arr>& a, int64_t prev, int64_t r, int64_t j) const {
    return prev < 0 ? static_cast<double>(a[2].as<T>()[r * h + j])
                    : c[static_cast<size_t>((prev * n + r) * h + j)];
  }
};

template <typename T>
void lstm_typed(const ir::GraphNode& node, const std::vector<Arr>& a, void* out) {
  const LstmRun<T> run(node, a);
  T* o = static_cast<T*>(out);
  const size_t state = static_cast<size_t>(run.n * run.h);
  const int64_t last = run.pos(run.t - 1);
  for (size_t k = 0; k < run.hs.size(); ++k) o[k] = static_cast<T>(run.hs[k]);
  for (size_t k = 0; k < state; ++k) {
    o[run.hs.size() + k] = static_cast<T>(run.hs[last * state + k]);
    o[run.hs.size() + state + k] = static_cast<T>(run.c[last * state + k]);
  }
}

template <typename T>
void lstm_backward_typed(const ir::GraphNode& node, const std::vector<Arr>& a, void* out) {
  const LstmRun<T> run(node, a);
  const int64_t t = run.t, n = run.n, in = run.in, h = run.h;
  const T *x = a[0].as<T>(), *w_ih = a[3].as<T>(), *w_hh = a[4].as<T>(), *gout = a[7].as<T>();
  const std::array<int64_t, 7> at = ir::lstm_grad_offsets(t, n, in, h);
  std::vector<double> grad(static_cast<size_t>(at[6]), 0.0);
  // The gradients flowing back into the state before each step, from the last h and c's.
  std::vector<double> dh(gout + t * n * h, gout + (t + 1) * n * h),
      dc(gout + (t + 1) * n * h, gout + (t + 2) * n * h), da(static_cast<size_t>(4 * h));
  for (int64_t k = t - 1; k >= 0; --k) {
    const int64_t s = run.pos(k), prev = k == 0 ? -1 : run.pos(k - 1);
    std::vector<double> dh_prev(static_cast<size_t>(n * h), 0.0);
    for (int64_t r = 0; r < n; ++r) {
      const double* g = &run.gates[static_cast<size_t>((s * n + r) * 4 * h)];
      for (int64_t j = 0; j < h; ++j) {
        const size_t sj = static_cast<size_t>(r * h + j);
        const double i = g[j], f = g[h + j], cand = g[2 * h + j], o = g[3 * h + j];
        const double tc = std::tanh(run.c[static_cast<size_t>((s * n + r) * h + j)]);
        const double dht = dh[sj] + gout[(s * n + r) * h + j];
        const double dct = dc[sj] + dht * o * (1 - tc * tc);
        da[static_cast<size_t>(j)] = dct * cand * i * (1 - i);
        da[static_cast<size_t>(h + j)] = dct * run.c_prev(a, prev, r, j) * f * (1 - f);
        da[static_cast<size_t>(2 * h + j)] = dct * i * (1 - cand * cand);
        da[static_cast<size_t>(3 * h + j)] = dht * tc * o * (1 - o);
        dc[sj] = dct * f;
      }
      const T* xr = x + (s * n + r) * in;
      double* dx = &grad[static_cast<size_t>(at[0] + (s * n + r) * in)];
      for (int64_t j = 0; j < 4 * h; ++j) {
        const double d = da[static_cast<size_t>(j)];
        for (int64_t q = 0; q < in; ++q) {
          dx[q] += d * w_ih[j * in + q];
          grad[static_cast<size_t>(at[3] + j * in + q)] += d * xr[q];
        }
        for (int64_t q = 0; q < h; ++q) {
          dh_prev[static_cast<size_t>(r * h + q)] += d * w_hh[j * h + q];
          grad[static_cast<size_t>(at[4] + j * h + q)] += d * run.h_prev(a, prev, r, q);
        }
        grad[static_cast<size_t>(at[5] + j)] += d;
      }
    }
    dh = std::move(dh_prev);
  }
  for (size_t k = 0; k < dh.size(); ++k) {
    grad[static_cast<size_t>(at[1]) + k] = dh[k];
    grad[static_cast<size_t>(at[2]) + k] = dc[k];
  }
  T* o = static_cast<T*>(out);
  for (size_t k = 0; k < grad.size(); ++k) o[k] = static_cast<T>(grad[k]);
}

// One GRU layer's forward pass, every time step's gates r, z, n and W_hn h + b_hn kept for the
// gradient (by position, [T][N][4H]), and the hidden states ([T][N][H]).
template <typename T>
struct GruRun {
  int64_t t, n, in, h;
  bool reverse;
  std::vector<double> gates, hs;

  int64_t pos(int64_t k) const { return reverse ? t - 1 - k : k; }

  GruRun(const ir::GraphNode& n_, const std::vector<Arr>& a)
      : t(a[0].shape[0]),
        n(a[0].shape[1]),
        in(a[0].shape[2]),
        h(a[1].shape[1]),
        reverse(ir::RnnAttrs::of(n_.attrs).reverse),
        gates(static_cast<size_t>(t * n * 4 * h)),
        hs(static_cast<size_t>(t * n * h)) {
    const T *x = a[0].as<T>(), *w_ih = a[2].as<T>(), *w_hh = a[3].as<T>(), *b = a[4].as<T>();
    std::vector<double> gi(static_cast<size_t>(3 * h)), gh(static_cast<size_t>(3 * h));
    for (int64_t k = 0; k < t; ++k) {
      const int64_t s = pos(k), prev = k == 0 ? -1 : pos(k - 1);
      for (int64_t r = 0; r < n; ++r) {
        const T* xr = x + (s * n + r) * in;
        for (int64_t j = 0; j < 3 * h; ++j) {
          double ai = 0, ah = 0;
          for (int64_t q = 0; q < in; ++q) ai += static_cast<double>(xr[q]) * w_ih[j * in + q];
          for (int64_t q = 0; q < h; ++q) ah += h_prev(a, prev, r, q) * w_hh[j * h + q];
          gi[static_cast<size_t>(j)] = ai, gh[static_cast<size_t>(j)] = ah;
        }
        double* g = &gates[static_cast<size_t>((s * n + r) * 4 * h)];
        for (int64_t j = 0; j < h; ++j) {
          const size_t u = static_cast<size_t>(j);
          const double rg = sigmoid(gi[u] + gh[u] + b[j]);
          const double z = sigmoid(gi[h + u] + gh[h + u] + b[h + j]);
          const double hn = gh[2 * h + u] + b[3 * h + j];
          const double cand = std::tanh(gi[2 * h + u] + b[2 * h + j] + rg * hn);
          g[j] = rg, g[h + j] = z, g[2 * h + j] = cand, g[3 * h + j] = hn;
          hs[static_cast<size_t>((s * n + r) * h + j)] = (1 - z) * cand + z * h_prev(a, prev, r, j);
        }
      }
    }
  }
  double h_prev(const std::vector<Arr>& a, int64_t prev, int64_t r, int64_t j) const {
    return prev < 0 ? static_cast<double>(a[1].as<T>()[r * h + j])
                    : hs[static_cast<size_t>((prev * n + r) * h + j)];
  }
};

template <typename T>
void gru_typed(const ir::GraphNode& node, const std::vector<Arr>& a, void* out) {
  const GruRun<T> run(node, a);
  T* o = static_cast<T*>(out);
  const size_t state = static_cast<size_t>(run.n * run.h);
  const int64_t last = run.pos(run.t - 1);
  for (size_t k = 0; k < run.hs.size(); ++k) o[k] = static_cast<T>(run.hs[k]);
  for (size_t k = 0; k < state; ++k)
    o[run.hs.size() + k] = static_cast<T>(run.hs[last * state + k]);
}

template <typename T>
void gru_backward_typed(const ir::GraphNode& node, const std::vector<Arr>& a, void* out) {
  const GruRun<T> run(node, a);
  const int64_t t = run.t, n = run.n, in = run.in, h = run.h;
  const T *x = a[0].as<T>(), *w_ih = a[2].as<T>(), *w_hh = a[3].as<T>(), *gout = a[6].as<T>();
  const std::array<int64_t, 6> at = ir::gru_grad_offsets(t, n, in, h);
  std::vector<double> grad(static_cast<size_t>(at[5]), 0.0);
  std::vector<double> dh(gout + t * n * h, gout + (t + 1) * n * h);
  std::vector<double> dai(static_cast<size_t>(3 * h)), dah(static_cast<size_t>(3 * h));
  for (int64_t k = t - 1; k >= 0; --k) {
    const int64_t s = run.pos(k), prev = k == 0 ? -1 : run.pos(k - 1);
    std::vector<double> dh_prev(static_cast<size_t>(n * h), 0.0);
    for (int64_t r = 0; r < n; ++r) {
      const double* g = &run.gates[static_cast<size_t>((s * n + r) * 4 * h)];
      for (int64_t j = 0; j < h; ++j) {
        const size_t u = static_cast<size_t>(j), sj = static_cast<size_t>(r * h + j);
        const double rg = g[j], z = g[h + j], cand = g[2 * h + j], hn = g[3 * h + j];
        const double hp = run.h_prev(a, prev, r, j);
        const double dht = dh[sj] + gout[(s * n + r) * h + j];
        const double dan = dht * (1 - z) * (1 - cand * cand);
        const double dar = dan * hn * rg * (1 - rg), daz = dht * (hp - cand) * z * (1 - z);
        dai[u] = dar, dai[h + u] = daz, dai[2 * h + u] = dan;
        dah[u] = dar, dah[h + u] = daz, dah[2 * h + u] = dan * rg;
        dh_prev[sj] += dht * z;
        grad[static_cast<size_t>(at[4]) + u] += dar;
        grad[static_cast<size_t>(at[4] + h) + u] += daz;
        grad[static_cast<size_t>(at[4] + 2 * h) + u] += dan;
        grad[static_cast<size_t>(at[4] + 3 * h) + u] += dan * rg;
      }
      const T* xr = x + (s * n + r) * in;
      double* dx = &grad[static_cast<size_t>(at[0] + (s * n + r) * in)];
      for (int64_t j = 0; j < 3 * h; ++j) {
        const double di = dai[static_cast<size_t>(j)], dhh = dah[static_cast<size_t>(j)];
        for (int64_t q = 0; q < in; ++q) {
          dx[q] += di * w_ih[j * in + q];
          grad[static_cast<size_t>(at[2] + j * in + q)] += di * xr[q];
        }
        for (int64_t q = 0; q < h; ++q) {
          dh_prev[static_cast<size_t>(r * h + q)] += dhh * w_hh[j * h + q];
          grad[static_cast<size_t>(at[3] + j * h + q)] += dhh * run.h_prev(a, prev, r, q);
        }
      }
    }
    dh = std::move(dh_prev);
  }
  for (size_t k = 0; k < dh.size(); ++k) grad[static_cast<size_t>(at[1]) + k] = dh[k];
  T* o = static_cast<T*>(out);
  for (size_t k = 0; k < grad.size(); ++k) o[k] = static_cast<T>(grad[k]);
}

}  // namespace

void lstm(const ir::GraphNode& n, const std::vector<Arr>& a, void* out) {
  if (n.dtype == DType::F64) return lstm_typed<double>(n, a, out);
  lstm_typed<float>(n, a, out);
}

void lstm_backward(const ir::GraphNode& n, const std::vector<Arr>& a, void* out) {
  if (n.dtype == DType::F64) return lstm_backward_typed<double>(n, a, out);
  lstm_backward_typed<float>(n, a, out);
}

void gru(const ir::GraphNode& n, const std::vector<Arr>& a, void* out) {
  if (n.dtype == DType::F64) return gru_typed<double>(n, a, out);
  gru_typed<float>(n, a, out);
}

void gru_backward(const ir::GraphNode& n, const std::vector<Arr>& a, void* out) {
  if (n.dtype == DType::F64) return gru_backward_typed<double>(n, a, out);
  gru_backward_typed<float>(n, a, out);
}

}  // namespace lockstep::backends::ref
