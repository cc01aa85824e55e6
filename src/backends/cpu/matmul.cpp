// The cpu backend's matrix products, on oneDNN or OpenBLAS; see matmul.h.
#include "backends/cpu/matmul.h"

#include <cblas.h>
#include <dnnl.h>
#include <fcntl.h>
#include <strings.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <unordered_map>

#include "backends/cpu/dnnl_common.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/parallel.h"
#include "backends/cpu/vector_math.h"
#include "backends/ref/ref_kernels.h"
#include "runtime/metrics.h"
#include "util/check.h"
#include "util/options.h"

namespace lockstep::backends::cpu {
namespace {

// Products smaller than this many multiply-adds stay on oneDNN untimed: timing them costs more
// than either library could save.
constexpr int64_t kMinTunedMacs = int64_t{1} << 21;
// A record larger than this is read only this far and not added to (it holds one short line per
// problem a program on this machine has used).
constexpr size_t kMaxRecordBytes = size_t{4} << 20;

std::atomic<int>& choice_knob() {
  static std::atomic<int> knob{[] {
    const std::string& s = util::option(util::Option::MatMul);
    if (s == "onednn") return static_cast<int>(MatMulChoice::OneDnn);
    if (s == "openblas") return static_cast<int>(MatMulChoice::OpenBlas);
    if (s == "onednn_sgemm") return static_cast<int>(MatMulChoice::OneDnnSgemm);
    return static_cast<int>(MatMulChoice::Auto);  // unset, "auto", or unknown
  }()};
  return knob;
}

// The CPU's model name, as /proc/cpuinfo gives it (tabs, the record's separator, removed).
std::string cpu_model() {
  static const std::string model = [] {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("model name", 0) != 0) continue;
      const size_t colon = line.find(':');
      std::string m = colon == std::string::npos ? line : line.substr(colon + 1);
      m.erase(0, m.find_first_not_of(' '));
      std::replace(m.begin(), m.end(), '\t', ' ');
      return m;
    }
    return std::string("unknown cpu");
  }();
  return model;
}

bool valid_library(const std::string& s, MatMulLibrary* lib) {
  if (s == "onednn") return *lib = MatMulLibrary::OneDnn, true;
  if (s == "openblas") return *lib = MatMulLibrary::OpenBlas, true;
  if (s == "onednn_sgemm") return *lib = MatMulLibrary::OneDnnSgemm, true;
  return false;
}

// The choices this process has made or read, and the record on disk.
class TuningRecord {
 public:
  static TuningRecord& get() {
    static TuningRecord* r = new TuningRecord();  // used by programs compiled until exit
    return *r;
  }

  // The library for `key` if this process or the record knows it.
  std::optional<MatMulLibrary> lookup(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    return known(key);
  }

  // The library for `key`: known, else recorded by some process, else `time` decides (and is
  // recorded; the record's first line for the key wins over a concurrent process's).
  template <class Time>
  MatMulLibrary choose(const std::string& key, Time&& time) {
    std::lock_guard<std::mutex> lock(mu_);
    if (const auto lib = known(key)) return *lib;
    const auto [lib, onednn_ms, blas_ms] = time();
    if (util::option_on(util::Option::Debug))
      std::fprintf(stderr, "lockstep: matmul %s: onednn %.3f ms, %s %.3f ms: %s\n", key.c_str(),
                   onednn_ms, library_name(blas_library()), blas_ms, library_name(lib));
    char times[64];
    std::snprintf(times, sizeof times, "\t%.4f\t%.4f\n", onednn_ms, blas_ms);
    if (append(key + "\t" + library_name(lib) + times) && read(key)) return known_.at(key);
    known_[key] = lib;
    return lib;
  }

  void forget() {
    std::lock_guard<std::mutex> lock(mu_);
    known_.clear();
  }

  std::string path() {
    std::lock_guard<std::mutex> lock(mu_);
    return path_;
  }
  void set_path(const std::string& path) {
    std::lock_guard<std::mutex> lock(mu_);
    path_ = path;
    known_.clear();
  }

 private:
  TuningRecord() {
    const std::string& set = util::option(util::Option::TuningFile);
    if (set == "none") return;
    if (!set.empty()) {
      path_ = set;
      return;
    }
    if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg == '/')
      path_ = std::string(xdg) + "/lockstep/matmul.tsv";
    else if (const char* home = std::getenv("HOME"); home && *home == '/')
      path_ = std::string(home) + "/.cache/lockstep/matmul.tsv";
  }

  // lookup's answer; mu_ held.
  std::optional<MatMulLibrary> known(const std::string& key) {
    if (auto it = known_.find(key); it != known_.end()) return it->second;
    if (read(key)) return known_.at(key);
    return std::nullopt;
  }

  // Reads the record, keeping each key's first valid line; whether it has `key`. Lines that are
  // not "key <tab> onednn|openblas <tab> ..." are skipped: the record only ever speeds things up.
  bool read(const std::string& key) {
    if (path_.empty()) return false;
    std::ifstream in(path_, std::ios::binary);
    if (!in) return false;
    std::string text(kMaxRecordBytes, '\0');
    in.read(text.data(), static_cast<std::streamsize>(text.size()));
    text.resize(static_cast<size_t>(in.gcount()));
    size_t start = 0;
    while (start < text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) break;  // a line still being written, or cut by the limit
      const std::string line = text.substr(start, end - start);
      start = end + 1;
      const size_t t1 = line.find('\t');
      if (t1 == std::string::npos) continue;
      const size_t t2 = line.find('\t', t1 + 1);
      MatMulLibrary lib;
      if (!valid_library(line.substr(t1 + 1, t2 == std::string::npos ? t2 : t2 - t1 - 1), &lib))
        continue;
      known_.emplace(line.substr(0, t1), lib);  // the first line for a key wins
    }
    return known_.count(key) > 0;
  }

  // Appends one line in one write (O_APPEND: lines from concurrent processes do not interleave);
  // false when the record cannot be written (a read-only home, a full disk).
  bool append(const std::string& line) {
    if (path_.empty()) return false;
    std::error_code ec;
    const std::filesystem::path p(path_);
    if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path(), ec);
    const int fd = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return false;
    bool ok = false;
    const off_t size = ::lseek(fd, 0, SEEK_END);
    if (size >= 0 && static_cast<size_t>(size) + line.size() <= kMaxRecordBytes)
      ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
    ::close(fd);
    return ok;
  }

  std::mutex mu_;
  std::string path_;
  std::unordered_map<std::string, MatMulLibrary> known_;
};

// Whether OpenBLAS's run-time dispatch picked kernels for this CPU's widest vectors (its core
// names: OpenBLAS's driver/others/dynamic.c).
bool openblas_suits_cpu() {
  static const bool suits = [] {
    const std::string core = openblas_get_corename();
    auto one_of = [&](std::initializer_list<const char*> names) {
      for (const char* n : names)
        if (strcasecmp(core.c_str(), n) == 0) return true;
      return false;
    };
    const MathIsa isa = math_isa();
    const bool ok = isa == MathIsa::Avx512 ? one_of({"SkylakeX", "Cooperlake", "SapphireRapids"})
                    : isa == MathIsa::Avx2
                        ? one_of({"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids"})
                        : true;
    if (!ok && util::option_on(util::Option::Debug))
      std::fprintf(stderr,
                   "lockstep: OpenBLAS runs its %s kernels on this %s CPU (%s): f32 products "
                   "take oneDNN's sgemm instead\n",
                   core.c_str(), isa == MathIsa::Avx512 ? "AVX-512" : "AVX2", cpu_model().c_str());
    return ok;
  }();
  return suits;
}

// c = alpha op(a) op(b) + beta c, row-major, on `lib` (OpenBLAS or oneDNN's sgemm).
void sgemm_on(MatMulLibrary lib, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
              float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
              float* c, int64_t ldc) {
  if (lib == MatMulLibrary::OneDnnSgemm) {
    // Only invalid sizes fail, and the callers' are valid by construction.
    const dnnl_status_t status = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k,
                                            alpha, a, lda, b, ldb, beta, c, ldc);
    LS_INTERNAL_CHECK(status == dnnl_success, "dnnl_sgemm failed: ", static_cast<int>(status));
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m), static_cast<blasint>(n),
              static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

void sgemm(MatMulLibrary lib, const GemmCall& c, const float* a, const float* b, float* out) {
  if (!c.c_col_major)
    return sgemm_on(lib, c.trans_a, c.trans_b, c.m, c.n, c.k, 1.0f, a, c.lda, b, c.ldb, 0.0f, out,
                    c.ldc);
  // A column-major C is the row-major C^T = op(B)^T op(A)^T.
  sgemm_on(lib, !c.trans_b, !c.trans_a, c.n, c.m, c.k, 1.0f, b, c.ldb, a, c.lda, 0.0f, out, c.ldc);
}

// The floats a widened bf16 product takes in the shared scratch: its right operand (after the
// swap below) in f32.
int64_t widened_floats(const GemmCall& c) { return c.k * (c.c_col_major ? c.m : c.n); }

// A bf16 product computed in f32 on `lib`'s sgemm: the operands widened (exactly), the product
// accumulated in f32 as oneDNN's bf16 kernels accumulate, the result rounded to bf16 (or written
// in f32). It gives what the bf16 kernel gives, up to summation order. The right operand is
// widened whole into the shared scratch; the result is computed by tiles, each on one thread
// (its left rows widened, its product into a buffer the thread keeps in cache, then rounded into
// the result). Widened whole instead, with the f32 result a trip through memory and back, a
// weight gradient's [512 x 2048] x [2048 x 128] took 1.22 ms where by tiles it takes 0.81-0.85
// (f32: 0.73; two Xeon model 207 cores).
void widened_sgemm(MatMulLibrary lib, const GemmCall& c, DType out_dtype, const uint16_t* a,
                   const uint16_t* b, void* out) {
  // A column-major result is the row-major C^T = op(B)^T op(A)^T: the result row-major
  // [m x n] = op(l) [m x k] op(r) [k x n], each operand stored plain or transposed.
  const bool swap = c.c_col_major;
  const int64_t m = swap ? c.n : c.m, n = swap ? c.m : c.n, k = c.k;
  const uint16_t* l = swap ? b : a;
  const uint16_t* r = swap ? a : b;
  const bool lt = swap ? !c.trans_b : c.trans_a, rt = swap ? !c.trans_a : c.trans_b;
  const int64_t ll = swap ? c.ldb : c.lda, rl = swap ? c.lda : c.ldb;
  // op(r) widened into a dense copy, stored as r is.
  const int64_t r_rows = rt ? n : k, r_cols = rt ? k : n;
  float* wr = scratch(static_cast<size_t>(widened_floats(c)));
  parallel_for(k * n >= (int64_t{1} << 15), r_rows,
               [&](int64_t i) { bf16_to_f32(r + i * rl, r_cols, wr + i * r_cols); });
  // Tiles of the result: 64 rows of up to 1024 columns (16 rows when that leaves a thread idle).
  const int64_t tc = std::min<int64_t>(n, 1024);
  const int64_t col_tiles = (n + tc - 1) / tc;
  int64_t tr = 64;
  while (tr > 16 && ((m + tr - 1) / tr) * col_tiles < 2 * threads()) tr /= 2;
  const int64_t row_tiles = (m + tr - 1) / tr;
  const bool to_f32 = out_dtype == DType::F32;
  parallel_for(m * n * k >= (int64_t{1} << 16), row_tiles * col_tiles, [&](int64_t t) {
    const int64_t i0 = (t / col_tiles) * tr, j0 = (t % col_tiles) * tc;
    const int64_t rows = std::min(tr, m - i0), cols = std::min(tc, n - j0);
    RunBuffers buffers;
    // op(l)'s rows [i0, i0 + rows): plain, `rows` runs of k; transposed, k runs of `rows`.
    float* wl = buffers.take(rows * k);
    if (!lt)
      bf16_rows_to_f32(l + i0 * ll, rows, k, ll, wl);
    else
      bf16_rows_to_f32(l + i0, k, rows, ll, wl);
    const float* rp = wr + (rt ? j0 * r_cols : j0);
    float* y = to_f32 ? static_cast<float*>(out) + i0 * c.ldc + j0 : buffers.take(rows * cols);
    sgemm_on(lib, lt, rt, rows, cols, k, 1.0f, wl, lt ? rows : k, rp, r_cols, 0.0f, y,
             to_f32 ? c.ldc : cols);
    if (to_f32) return;
    auto* dst = static_cast<uint16_t*>(out) + i0 * c.ldc + j0;
    for (int64_t i = 0; i < rows; ++i) f32_to_bf16(y + i * cols, cols, dst + i * c.ldc);
  });
}

}  // namespace

const char* library_name(MatMulLibrary lib) {
  switch (lib) {
    case MatMulLibrary::OpenBlas:
      return "openblas";
    case MatMulLibrary::OneDnnSgemm:
      return "onednn_sgemm";
    case MatMulLibrary::OneDnn:
      break;
  }
  return "onednn";
}

MatMulLibrary blas_library() {
  const auto choice = static_cast<MatMulChoice>(choice_knob().load(std::memory_order_relaxed));
  if (choice == MatMulChoice::OpenBlas) return MatMulLibrary::OpenBlas;
  if (choice == MatMulChoice::OneDnnSgemm) return MatMulLibrary::OneDnnSgemm;
  return openblas_suits_cpu() ? MatMulLibrary::OpenBlas : MatMulLibrary::OneDnnSgemm;
}

void blas_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                int64_t ldc) {
  sgemm_on(blas_library(), trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void set_matmul_choice(MatMulChoice choice) { choice_knob().store(static_cast<int>(choice)); }

bool gemm_call(const Shape& a, const std::vector<int64_t>& as, const Shape& b,
               const std::vector<int64_t>& bs, const Shape& out, const std::vector<int64_t>& os,
               GemmCall* call) {
  const size_t r = out.size();
  if (r < 2 || a.size() != r || b.size() != r || as.size() != r || bs.size() != r || os.size() != r)
    return false;
  for (size_t d = 0; d + 2 < r; ++d)
    if (a[d] != 1 || b[d] != 1 || out[d] != 1) return false;
  GemmCall c;
  c.m = a[r - 2], c.k = a[r - 1], c.n = b[r - 1];
  if (b[r - 2] != c.k || out[r - 2] != c.m || out[r - 1] != c.n) return false;
  // Degenerate sizes leave strides free; oneDNN takes those (and they are never worth timing).
  if (c.m < 2 || c.n < 2 || c.k < 2) return false;
  const int64_t limit = int64_t{1} << 31;  // blasint
  if (c.m >= limit || c.n >= limit || c.k >= limit) return false;
  // Operand x [rows x cols] with strides (sr, sc): plain (sc == 1, ld = sr) or transposed.
  auto layout = [&](int64_t rows, int64_t cols, int64_t sr, int64_t sc, bool* trans, int64_t* ld) {
    if (sc == 1 && sr >= cols && sr < limit) return *trans = false, *ld = sr, true;
    if (sr == 1 && sc >= rows && sc < limit) return *trans = true, *ld = sc, true;
    return false;
  };
  if (!layout(c.m, c.k, as[r - 2], as[r - 1], &c.trans_a, &c.lda)) return false;
  if (!layout(c.k, c.n, bs[r - 2], bs[r - 1], &c.trans_b, &c.ldb)) return false;
  if (!layout(c.m, c.n, os[r - 2], os[r - 1], &c.c_col_major, &c.ldc)) return false;
  *call = c;
  return true;
}

MatMul::MatMul(const Shape& a, const std::vector<int64_t>& as, const Shape& b,
               const std::vector<int64_t>& bs, const Shape& out, DType in, DType out_dtype,
               const std::vector<int64_t>& out_strides)
    : dnnl_(std::make_unique<DnnlMatMul>(a, as, b, bs, out, in, out_dtype, out_strides)),
      in_(in),
      out_dtype_(out_dtype) {
  const auto choice = static_cast<MatMulChoice>(choice_knob().load());
  const std::vector<int64_t> os = out_strides.empty() ? ref::strides_of(out) : out_strides;
  const bool f32 = in == DType::F32 && out_dtype == DType::F32;
  const bool bf16 = in == DType::BF16 && (out_dtype == DType::BF16 || out_dtype == DType::F32);
  if (choice == MatMulChoice::OneDnn || !(f32 || bf16) || !gemm_call(a, as, b, bs, out, os, &call_))
    return;
  if (choice != MatMulChoice::Auto) {  // OpenBLAS or oneDNN's sgemm, pinned
    library_ = blas_library();
    runtime::count(runtime::Counter::BlasProducts);
    return;
  }
  if (call_.m * call_.n * call_.k < kMinTunedMacs) return;
  std::ostringstream key;
  const char* isa = std::getenv("ONEDNN_MAX_CPU_ISA");
  // "timing 3": choices timed by three rounds in a row (before tune() ran them over 50 ms), and
  // those timed against an OpenBLAS that did not suit the CPU (before blas_library()), are timed
  // again.
  key << cpu_model() << "|timing 3|isa " << (isa ? isa : "max") << "|threads " << threads()
      << (bf16 ? (out_dtype == DType::F32 ? "|bf16 to f32" : "|bf16") : "") << "|onednn "
      << onednn_version() << " " << dnnl_->implementation() << "|" << openblas_get_config() << "|"
      << call_.m << "x" << call_.k << "x" << call_.n << (call_.trans_a ? " ta" : "")
      << (call_.trans_b ? " tb" : "") << (call_.c_col_major ? " ct" : "") << " ld " << call_.lda
      << "," << call_.ldb << "," << call_.ldc;
  key_ = key.str();
  if (const auto known = TuningRecord::get().lookup(key_)) {
    library_ = *known;
    if (library_ != MatMulLibrary::OneDnn) runtime::count(runtime::Counter::BlasProducts);
    return;
  }
  // Timed at its first run, where the program runs: on the runtime thread, with nothing of this
  // process competing for the cores (timed here, while the runtime thread ran the previous
  // program, the figures were off by up to 2x) and on the real operands.
  tuned_.store(false, std::memory_order_release);
}

void MatMul::tune(const void* a, const void* b, void* out) {
  std::lock_guard<std::mutex> lock(tune_mu_);
  if (tuned_.load(std::memory_order_acquire)) return;
  library_ = TuningRecord::get().choose(key_, [&] {
    // Each run once untimed, then alternating, each at its best of the rounds run until 50 ms
    // have passed (at least three rounds, at most 64, at most 400 ms unless three take longer):
    // on a shared machine the second core is taken away now and then for a few ms (a region that
    // takes 0.17 ms took 0.5-1.1 ms one time in ten; AMD Zen 4 VM), and at the start of a process
    // for up to ~20 ms both libraries' runs took 3-4x their later time (2048x64x192 on 2 threads:
    // oneDNN 0.95-1.1 ms, then 0.24), so a best of three runs in a row picked OpenBLAS for good
    // where oneDNN was 1.3x faster.
    const MatMulLibrary blas = blas_library();
    dnnl_->run(a, b, out);
    run_on(blas, a, b, out);
    double best[2] = {1e30, 1e30};
    const auto start = std::chrono::steady_clock::now();
    for (int round = 0; round < 64; ++round) {
      for (int lib = 0; lib < 2; ++lib) {
        const auto t0 = std::chrono::steady_clock::now();
        if (lib == 0)
          dnnl_->run(a, b, out);
        else
          run_on(blas, a, b, out);
        const std::chrono::duration<double, std::milli> t = std::chrono::steady_clock::now() - t0;
        best[lib] = std::min(best[lib], t.count());
      }
      const auto spent = std::chrono::steady_clock::now() - start;
      if (spent > std::chrono::milliseconds(round >= 2 ? 50 : 400)) break;
    }
    // The BLAS only when clearly faster: a near tie keeps oneDNN's matmul (which also runs the
    // rest).
    const MatMulLibrary lib = best[1] * 1.05 < best[0] ? blas : MatMulLibrary::OneDnn;
    return std::make_tuple(lib, best[0], best[1]);
  });
  if (library_ != MatMulLibrary::OneDnn) runtime::count(runtime::Counter::BlasProducts);
  tuned_.store(true, std::memory_order_release);
}

MatMul::~MatMul() = default;

void MatMul::run(const void* a, const void* b, void* out) {
  // After tuning, the chosen library computes the result (the last timing run may have been
  // the other), so every run, in this process and others, gives the same bits.
  if (!tuned_.load(std::memory_order_acquire)) tune(a, b, out);
  if (library_ == MatMulLibrary::OneDnn) return dnnl_->run(a, b, out);
  run_on(library_, a, b, out);
}

void MatMul::run_on(MatMulLibrary blas, const void* a, const void* b, void* out) {
  if (in_ == DType::BF16)
    return widened_sgemm(blas, call_, out_dtype_, static_cast<const uint16_t*>(a),
                         static_cast<const uint16_t*>(b), out);
  sgemm(blas, call_, static_cast<const float*>(a), static_cast<const float*>(b),
        static_cast<float*>(out));
}

size_t MatMul::scratch_bytes() const {
  // Until a product to be timed has run, either may run it.
  const size_t widened = in_ == DType::BF16 && call_.m > 0
                             ? static_cast<size_t>(widened_floats(call_)) * sizeof(float)
                             : 0;
  if (!tuned_.load(std::memory_order_acquire)) return std::max(dnnl_->scratch_bytes(), widened);
  return library_ == MatMulLibrary::OneDnn ? dnnl_->scratch_bytes() : widened;
}

namespace detail {
std::string tuning_file() { return TuningRecord::get().path(); }
void set_tuning_file(const std::string& path) { TuningRecord::get().set_path(path); }
void forget_matmul_choices() { TuningRecord::get().forget(); }
}  // namespace detail

}  // namespace lockstep::backends::cpu
