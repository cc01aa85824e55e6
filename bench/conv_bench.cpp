// lockstep's own Winograd convolution (backends/cpu/winograd.h) against oneDNN's direct one on
// one problem, all three directions, alternating, best of `rounds`; the figures behind
// WinogradConv::pays. On an AVX-512 machine, ONEDNN_MAX_CPU_ISA=AVX2 shows what an AVX2 one
// (where oneDNN has no Winograd) gets.
//   conv_bench N C K H [pad=1] [blocked=1] [rounds=5]
// Prints per direction both times, their ratio, the largest difference over the largest value,
// and whether pays() takes the problem.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "backends/cpu/dnnl_ops.h"
#include "backends/cpu/winograd.h"

namespace cpu = lockstep::backends::cpu;

namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: conv_bench N C K H [pad=1] [blocked=1] [rounds=5]\n");
    return 2;
  }
  const int64_t n = std::atoll(argv[1]), c = std::atoll(argv[2]), k = std::atoll(argv[3]),
                h = std::atoll(argv[4]);
  const int64_t pad = argc > 5 ? std::atoll(argv[5]) : 1;
  const bool blocked = argc > 6 ? std::atoi(argv[6]) != 0 : true;
  const int rounds = argc > 7 ? std::atoi(argv[7]) : 5;
  const lockstep::Shape x{n, c, h, h}, w{k, c, 3, 3};
  const lockstep::Shape y{n, k, h + 2 * pad - 2, h + 2 * pad - 2};
  const std::vector<int64_t> attrs{1, 1, pad, pad, 1, 1, 1};
  if (n < 1 || c < 1 || k < 1 || rounds < 1 || !cpu::WinogradConv::takes(x, w, attrs) ||
      (blocked && (c % 16 || k % 16))) {
    std::fprintf(stderr, "conv_bench: not a problem the Winograd convolution takes\n");
    return 2;
  }
  auto numel = [](const lockstep::Shape& s) {
    int64_t e = 1;
    for (int64_t d : s) e *= d;
    return static_cast<size_t>(e);
  };
  std::mt19937 gen(1);
  std::normal_distribution<float> dist;
  auto random = [&](size_t count) {
    std::vector<float> v(count);
    for (float& e : v) e = dist(gen);
    return v;
  };
  const std::vector<float> xv = random(numel(x)), wv = random(numel(w)), dyv = random(numel(y));
  const char* names[3] = {"forward", "backward_data", "backward_weights"};
  for (int d = 0; d < 3; ++d) {
    const auto dk = static_cast<cpu::DnnlConv::Kind>(d);
    const auto wk = static_cast<cpu::WinogradConv::Kind>(d);
    const bool weights = d == 2;
    const cpu::ConvBlocked b{blocked, weights && blocked, !weights && blocked};
    const cpu::ConvAlgo was = cpu::conv_algo();
    cpu::set_conv_algo(cpu::ConvAlgo::Direct);  // else DnnlConv may run lockstep's Winograd
    cpu::DnnlConv direct(dk, x, w, y, attrs, b, false);
    cpu::set_conv_algo(was);
    cpu::WinogradConv own(wk, x, w, y, attrs, b.in0, b.in1, b.out);
    std::vector<float> scratch(own.scratch_floats() + 16);
    float* aligned =
        reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(scratch.data()) + 63) / 64 * 64);
    const float* in0 = d == 1 ? dyv.data() : xv.data();
    const float* in1 = d == 2 ? dyv.data() : wv.data();
    const size_t out_n = numel(d == 0 ? y : d == 1 ? x : w);
    std::vector<float> a(out_n), o(out_n);
    double direct_ms = 1e30, own_ms = 1e30;
    for (int r = 0; r < rounds; ++r) {
      const double t0 = now_ms();
      direct.run(in0, in1, a.data());
      const double t1 = now_ms();
      own.run(in0, in1, o.data(), aligned);
      const double t2 = now_ms();
      direct_ms = std::min(direct_ms, t1 - t0);
      own_ms = std::min(own_ms, t2 - t1);
    }
    double diff = 0, scale = 0;
    for (size_t i = 0; i < out_n; ++i) {
      diff = std::max(diff, static_cast<double>(std::fabs(a[i] - o[i])));
      scale = std::max(scale, static_cast<double>(std::fabs(a[i])));
    }
    const bool pays = cpu::WinogradConv::pays(wk, x, w, y, b.in0, b.in1, b.out, false);
    std::printf(
        "%-17s N%lld C%lld K%lld %lldx%lld pad %lld %s: direct %.3f ms, winograd %.3f ms, "
        "%.2fx, difference %.1e of the largest value, pays on AVX2: %s\n",
        names[d], static_cast<long long>(n), static_cast<long long>(c), static_cast<long long>(k),
        static_cast<long long>(h), static_cast<long long>(h), static_cast<long long>(pad),
        blocked ? "nChw16c" : "nchw", direct_ms, own_ms, direct_ms / own_ms,
        diff / std::max(scale, 1e-30), pays ? "yes" : "no");
  }
  return 0;
}
