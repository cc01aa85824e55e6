// Native code for fused elementwise trees (see native.h): the C++ each tree becomes, and the
// modules that build, cache and load it.
#include "backends/cpu/native.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>

#include "backends/cpu/vector_math.h"
#include "runtime/metrics.h"
#include "util/check.h"
#include "util/options.h"

extern char** environ;

namespace lockstep::backends::cpu {

using ir::Op;

namespace {

// Trees longer than this stay interpreted (a chain of 100,000 adds would be a source the
// compiler takes minutes over), and a module holds at most kModuleInstrs instructions.
constexpr size_t kMaxInstrs = 512;
constexpr size_t kModuleInstrs = 8192;
// Part of every module's hash: a change to the code below that changes what a source means
// must change it.
constexpr const char* kAbiVersion = "lockstep native 2";

// What every module's source starts with: its vector types and the operations the trees' code
// is written in, for vectors of W floats. NativeCall is fused.h's. `sel` picks by a comparison's
// mask (all ones or zeros per lane); `b01` is a predicate's value (1 or 0); `rb` rounds to bf16
// as lockstep's bfloat16(float) does, NaN kept quiet.
std::string prelude(int w) {
  const bool avx512 = w == 16;
  std::ostringstream o;
  o << "// " << kAbiVersion << ", " << w << " floats a vector\n"
    << "#include <immintrin.h>\n#include <stdint.h>\n#include <string.h>\n"
    << "#define W " << w << "\n"
    << "typedef float V __attribute__((vector_size(W * 4)));\n"
    << "typedef int32_t VI __attribute__((vector_size(W * 4)));\n"
    << "typedef uint32_t VU __attribute__((vector_size(W * 4)));\n"
    << "typedef V (*MathF)(V);\n"
    << "struct Call { int64_t len; const float* const* reg; float* out; int side; "
       "void* const* math; };\n"
    << "#define K extern \"C\" __attribute__((visibility(\"default\"))) void\n"
    << "#define B static inline __attribute__((always_inline)) V\n"
    << "static inline V ld(const float* p) { V v; memcpy(&v, p, sizeof v); return v; }\n"
    << "static inline void st(float* p, V v) { memcpy(p, &v, sizeof v); }\n"
    << "static inline V splat(float x) { return " << (avx512 ? "_mm512_set1_ps" : "_mm256_set1_ps")
    << "(x); }\n"  // (not V{} + x: -0 would become +0)
    << "static inline V sel(VI m, V a, V b) { return (V)((m & (VI)a) | (~m & (VI)b)); }\n"
    << "static inline V b01(VI m) { return sel(m, splat(1.0f), V{}); }\n"
    << "static inline V vabs(V a) { return (V)((VI)a & 0x7fffffff); }\n"
    << "static inline V vsqrt(V a) { return " << (avx512 ? "_mm512_sqrt_ps" : "_mm256_sqrt_ps")
    << "(a); }\n"
    << "static inline V vfloor(V a) { return "
    << (avx512 ? "_mm512_roundscale_ps(a, 9)" : "_mm256_round_ps(a, 9)") << "; }\n"
    << "static inline V vceil(V a) { return "
    << (avx512 ? "_mm512_roundscale_ps(a, 10)" : "_mm256_round_ps(a, 10)") << "; }\n"
    << "static inline V rb(V v) {\n"
       "  const VU u = (VU)v;\n"
       "  const VU r = ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16) << 16;\n"
       "  const VU q = ((u >> 16) | 0x40u) << 16;\n"
       "  return sel((VI)((u & 0x7fffffffu) > 0x7f800000u), (V)q, (V)r);\n"
       "}\n"
    << "#define M(f, x) ((MathF)c_math[f])(x)\n";
  return o.str();
}

// A MathFn's index in NativeCall::math, as the source names it.
int math_index(MathFn f) { return static_cast<int>(f); }

}  // namespace

std::vector<int> FusedTree::native_exports(size_t stage) const {
  const size_t begin = stage == 0 ? 0 : stage_end_[stage - 1], end = stage_end_[stage];
  std::vector<char> later(num_regs_, 0);  // read by a later stage
  for (size_t i = end; i < instrs_.size(); ++i) {
    const Instr& in = instrs_[i];
    if (in.op != Op::Data)
      for (int r : {in.a, in.b, in.c, in.sa, in.sb})
        if (r >= 0) later[r] = 1;
  }
  for (size_t k = stage + 1; k < stage_root_.size(); ++k) later[stage_root_[k]] = 1;
  std::vector<int> out;
  for (size_t i = begin; i < end; ++i)
    if (instrs_[i].op != Op::Data && later[instrs_[i].out]) out.push_back(instrs_[i].out);
  return out;
}

std::string FusedTree::native_source(const std::string& name) const {
  if (instrs_.size() > kMaxInstrs) return {};
  // Each instruction's value as a C++ expression of its operands' variables (v<reg>), or empty
  // when native code does not compute the op.
  auto v = [](int r) { return util::cat("v", r); };
  auto expr = [&](const Instr& in) -> std::string {
    const std::string a = in.a >= 0 ? v(in.a) : "", b = in.b >= 0 ? v(in.b) : "",
                      c = in.c >= 0 ? v(in.c) : "";
    auto math = [&](MathFn f) { return util::cat("M(", math_index(f), ", ", a, ")"); };
    if (in.sa >= 0 || in.sb >= 0 || in.relu) {  // fold_scaled_sums: a * sa +- b * sb, relu
      const std::string x = in.sa >= 0 ? util::cat("(", a, " * ", v(in.sa), ")") : a;
      const std::string z = in.sb >= 0 ? util::cat("(", b, " * ", v(in.sb), ")") : b;
      const std::string s = util::cat("(", x, in.op == Op::Sub ? " - " : " + ", z, ")");
      return in.relu ? util::cat("sel(", s, " < 0.0f, V{}, ", s, ")") : s;
    }
    switch (in.op) {
      case Op::Neg:
        return util::cat("(-", a, ")");
      case Op::Abs:
        return util::cat("vabs(", a, ")");
      case Op::Exp:
        return math(MathFn::Exp);
      case Op::Log:
        return math(MathFn::Log);
      case Op::Tanh:
        return math(MathFn::Tanh);
      case Op::Sin:
        return math(MathFn::Sin);
      case Op::Cos:
        return math(MathFn::Cos);
      case Op::Erf:
        return math(MathFn::Erf);
      case Op::Gelu:
        return math(MathFn::Gelu);
      case Op::GeluDerivative:
        return math(MathFn::GeluDerivative);
      case Op::Sigmoid:
        return util::cat("(1.0f / (1.0f + M(", math_index(MathFn::Exp), ", -", a, ")))");
      case Op::Sqrt:
        return util::cat("vsqrt(", a, ")");
      case Op::Rsqrt:
        return util::cat("(1.0f / vsqrt(", a, "))");
      case Op::Relu:
        return util::cat("sel(", a, " < 0.0f, V{}, ", a, ")");
      case Op::Floor:
        return util::cat("vfloor(", a, ")");
      case Op::Ceil:
        return util::cat("vceil(", a, ")");
      case Op::Sign:
        return util::cat("sel(", a, " != ", a, ", ", a, ", b01(", a, " > 0.0f) - b01(", a,
                         " < 0.0f))");
      case Op::LogicalNot:
        return util::cat("b01(", a, " == 0.0f)");
      case Op::IsFinite:
        return util::cat("b01((", a, " - ", a, ") == 0.0f)");
      case Op::Cast:
        if (in.out_dtype == DType::Bool) return util::cat("b01(", a, " != 0.0f)");
        if (in.out_dtype == DType::BF16 && in.in_dtype == DType::F32)
          return util::cat("rb(", a, ")");
        return a;  // bf16 and bool values are held as the floats they widen to
      case Op::Add:
        return util::cat("(", a, " + ", b, ")");
      case Op::Sub:
        return util::cat("(", a, " - ", b, ")");
      case Op::Mul:
        return util::cat("(", a, " * ", b, ")");
      case Op::Div:
        return util::cat("(", a, " / ", b, ")");
      case Op::Check:
        return a;
      case Op::Maximum:
        return util::cat("sel((", a, " != ", a, ") | (", a, " > ", b, "), ", a, ", ", b, ")");
      case Op::Minimum:
        return util::cat("sel((", a, " != ", a, ") | (", a, " < ", b, "), ", a, ", ", b, ")");
      case Op::Eq:
        return util::cat("b01(", a, " == ", b, ")");
      case Op::Ne:
        return util::cat("b01(", a, " != ", b, ")");
      case Op::Lt:
        return util::cat("b01(", a, " < ", b, ")");
      case Op::Le:
        return util::cat("b01(", a, " <= ", b, ")");
      case Op::Gt:
        return util::cat("b01(", a, " > ", b, ")");
      case Op::Ge:
        return util::cat("b01(", a, " >= ", b, ")");
      case Op::LogicalAnd:
        return util::cat("b01((", a, " != 0.0f) & (", b, " != 0.0f))");
      case Op::LogicalOr:
        return util::cat("b01((", a, " != 0.0f) | (", b, " != 0.0f))");
      case Op::Where:
        return util::cat("sel(", a, " != 0.0f, ", b, ", ", c, ")");
      default:
        return {};
    }
  };
  // The parts a call computes (NativeCall::side): the whole tree; or a root `where` of one
  // condition's two sides, each only the instructions it needs; or a staged tree's stages, each
  // also storing the values later stages read (native_exports). Per part, the body computes the
  // vector at i from its inputs (values it does not compute: the leaves, an earlier stage's) and
  // returns the result; the part's kernel loads the one-value inputs once, runs the body over
  // whole vectors, then over the tail copied into vectors of its own (zeros past the end, as
  // vector_math computes a tail).
  struct Part {
    size_t begin, end;
    const char* needs;
    int result;
  };
  std::vector<Part> parts;
  if (row_ > 0) {
    for (size_t k = 0; k < stage_root_.size(); ++k)
      parts.push_back({k == 0 ? 0 : stage_end_[k - 1], stage_end_[k], nullptr, stage_root_[k]});
  } else if (pick_cond_leaf_ >= 0) {
    parts.push_back({0, instrs_.size(), pick_needs_[0].data(), instrs_.back().b});
    parts.push_back({0, instrs_.size(), pick_needs_[1].data(), instrs_.back().c});
  } else {
    parts.push_back({0, instrs_.size(), nullptr, root_reg_});
  }
  std::ostringstream src;
  std::vector<int> coded;  // the parts with code
  for (size_t part = 0; part < parts.size(); ++part) {
    const Part& pt = parts[part];
    std::vector<char> computed(num_regs_, 0);
    for (size_t i = pt.begin; i < pt.end; ++i)
      if (instrs_[i].op != Op::Data && (!pt.needs || pt.needs[i])) computed[instrs_[i].out] = 1;
    // A stage without instructions is the interpreter's (a leaf or an earlier stage's value, read
    // as it is: stage_coded_); a side of a `where` may be a leaf, which the code copies.
    if (row_ > 0 && !stage_coded_[part]) continue;
    coded.push_back(static_cast<int>(part));
    // Inputs in order of first use: loaded per vector (tiles) or once (one-value registers).
    std::vector<int> tiles, scalars;
    std::vector<char> input(num_regs_, 0);
    std::ostringstream loads, body;
    auto use = [&](int r) {
      if (r < 0 || computed[r] || input[r]) return;
      input[r] = 1;
      if (scalar_reg_[r]) {
        loads << "  const V " << v(r) << " = s[" << scalars.size() << "];\n";
        scalars.push_back(r);
      } else {
        loads << "  const V " << v(r) << " = ld(p[" << tiles.size() << "] + i);\n";
        tiles.push_back(r);
      }
    };
    for (size_t i = pt.begin; i < pt.end; ++i) {
      const Instr& in = instrs_[i];
      if (in.op == Op::Data || (pt.needs && !pt.needs[i])) continue;
      for (int r : {in.a, in.b, in.c, in.sa, in.sb}) use(r);
      std::string e = expr(in);
      if (e.empty()) return {};
      // A bf16 result is rounded as the op's own (fused_eval.cpp's run()).
      const bool rounds = in.op == Op::Cast ? false
                          : (in.sa >= 0 || in.sb >= 0 || in.relu)
                              ? in.out_dtype == DType::BF16
                              : in.out_dtype == DType::BF16 && !exact_in_bf16(in.op, in.in_dtype);
      if (rounds) e = util::cat("rb(", e, ")");
      body << "  const V " << v(in.out) << " = " << e << ";\n";
    }
    use(pt.result);
    std::vector<int> exports;  // (the stage's, with the tiles run_native gives them)
    if (row_ > 0)
      for (const auto& [r, slot] : stage_exports_[part]) exports.push_back(r);
    for (size_t k = 0; k < exports.size(); ++k)
      body << "  st(e[" << k << "] + i, " << v(exports[k]) << ");\n";
    const std::string fn = util::cat(name, "_", part);
    const size_t nt = std::max<size_t>(tiles.size(), 1), ns = std::max<size_t>(scalars.size(), 1),
                 ne = std::max<size_t>(exports.size(), 1);
    src << "B " << fn << "(const float* const* p, float* const* e, int64_t i, const V* s, "
        << "void* const* c_math) {\n"
        << "  (void)p; (void)e; (void)i; (void)s; (void)c_math;\n"
        << loads.str() << body.str() << "  return " << v(pt.result) << ";\n}\n"
        << "static void " << fn << "_run(const Call* c) {\n"
        << "  const float* p[" << nt << "] = {";
    for (int r : tiles) src << "c->reg[" << r << "], ";
    src << "};\n  float* e[" << ne << "] = {";
    for (int r : exports) src << "(float*)c->reg[" << r << "], ";
    src << "};\n  V s[" << ns << "];\n";
    for (size_t k = 0; k < scalars.size(); ++k)
      src << "  s[" << k << "] = splat(c->reg[" << scalars[k] << "][0]);\n";
    src << "  int64_t i = 0;\n"
        << "  for (; i + W <= c->len; i += W) st(c->out + i, " << fn << "(p, e, i, s, c->math));\n"
        << "  if (i == c->len) return;\n"
        << "  const int64_t n = c->len - i;\n"
        << "  float t[" << nt << "][W], te[" << ne << "][W];\n"
        << "  const float* q[" << nt << "];\n  float* qe[" << ne << "];\n"
        << "  for (int k = 0; k < " << tiles.size() << "; ++k) {\n"
        << "    memset(t[k], 0, sizeof t[k]);\n"
        << "    memcpy(t[k], p[k] + i, n * sizeof(float));\n"
        << "    q[k] = t[k];\n  }\n"
        << "  for (int k = 0; k < " << exports.size() << "; ++k) qe[k] = te[k];\n"
        << "  float y[W];\n  st(y, " << fn << "(q, qe, 0, s, c->math));\n"
        << "  memcpy(c->out + i, y, n * sizeof(float));\n"
        << "  for (int k = 0; k < " << exports.size() << "; ++k)\n"
        << "    memcpy(e[k] + i, te[k], n * sizeof(float));\n}\n";
  }
  if (coded.empty()) return {};
  src << "K " << name << "(const Call* c) {\n  switch (c->side) {\n";
  for (int part : coded)
    src << "    case " << part << ": " << name << "_" << part << "_run(c); return;\n";
  src << "  }\n}\n";
  return src.str();
}

namespace {

// A module: one source for several trees, each `k<index>` in it.
struct Module {
  int width;  // floats a vector
  std::string source;
  std::vector<std::shared_ptr<FusedTree>> trees;
};

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

std::string cache_dir() {
  const std::string& set = util::option(util::Option::NativeDir);
  if (!set.empty()) return set;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg == '/')
    return std::string(xdg) + "/lockstep/native";
  if (const char* home = std::getenv("HOME"); home && *home == '/')
    return std::string(home) + "/.cache/lockstep/native";
  return {};
}

// mkdir -p; whether the directory is there.
bool make_dirs(const std::string& dir) {
  for (size_t at = 1; at <= dir.size(); ++at)
    if (at == dir.size() || dir[at] == '/') ::mkdir(dir.substr(0, at).c_str(), 0755);
  struct stat st {};
  return ::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return in ? s.str() : std::string{};
}

std::string compiler() {
  const std::string& set = util::option(util::Option::NativeCxx);
  if (!set.empty()) return set;
#ifdef LOCKSTEP_NATIVE_DEFAULT_CXX
  if (::access(LOCKSTEP_NATIVE_DEFAULT_CXX, X_OK) == 0) return LOCKSTEP_NATIVE_DEFAULT_CXX;
#endif
  return "c++";
}

std::vector<std::string> compile_flags(int width) {
  std::vector<std::string> f{"-x",
                             "c++",
                             "-std=c++17",
                             "-O2",
                             "-fPIC",
                             "-shared",
                             "-ffp-contract=off",
                             "-fno-math-errno",
                             "-fno-trapping-math",
                             "-fvisibility=hidden",
                             "-w"};
  if (width == 16) {
    f.push_back("-mavx512f");
  } else {
    f.push_back("-mavx2");
    f.push_back("-mfma");
  }
  return f;
}

// The shell script a compile runs: the compiler, then the library and its source renamed into
// place (the library first: a source in place always has its library) and the log removed; on
// failure the temporary files removed. The renames are the script's, not this process's, so
// that a compile still running when the process exits completes the cache for the next run.
// $1-$4: the temporary library and source, the cache entry's path without suffix, the log.
constexpr const char* kCompileScript =
    "so=$1 cpp=$2 base=$3 log=$4; shift 4; "
    "\"$@\" || { status=$?; rm -f \"$so\" \"$cpp\"; exit $status; }; "
    "mv -f \"$so\" \"$base.so\" && mv -f \"$cpp\" \"$base.cpp\" && rm -f \"$log\"";

// The compiles: in the caller's thread (NativeMode::Now) or one at a time in a background
// thread at low priority. Never destroyed: at exit a compile in flight goes on in its own
// process and nothing here is touched again (exiting_, under load_mu_).
class Builder {
 public:
  static Builder& get() {
    static Builder* b = [] {
      auto* builder = new Builder;
      std::atexit([] { get().stop(); });
      return builder;
    }();
    return *b;
  }
  // Loads the module's library if the cache has it (true), else false.
  bool load_cached(const Module& m, const std::string& base) {
    if (read_all(base + ".cpp") != m.source) return false;
    return load(m, base + ".so");
  }
  void enqueue(Module m, std::string base) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    jobs_.push_back({std::move(m), std::move(base)});
    if (!started_) {
      started_ = true;
      std::thread([this] { work(); }).detach();
    }
    cv_.notify_one();
  }
  // Compiles and loads it in this thread.
  void build(const Module& m, const std::string& base) {
    if (compile(m, base)) load(m, base + ".so");
  }

 private:
  struct Job {
    Module m;
    std::string base;
  };
  // At exit: queued jobs are dropped, and no library is loaded from now on (a load in progress
  // finishes first).
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopped_ = true;
      jobs_.clear();
    }
    cv_.notify_all();
    std::lock_guard<std::mutex> lock(load_mu_);
    exiting_ = true;
  }
  void work() {
    // Below the training threads: the compiler it starts inherits this thread's niceness.
    ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopped_ || !jobs_.empty(); });
        if (stopped_) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      if (!load_cached(job.m, job.base)) build(job.m, job.base);
    }
  }
  bool load(const Module& m, const std::string& so) {
    std::lock_guard<std::mutex> lock(load_mu_);
    if (exiting_) return false;
    void* h = ::dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) return false;  // (never closed: trees of live programs run its code)
    for (size_t k = 0; k < m.trees.size(); ++k) {
      auto fn = reinterpret_cast<NativeFn>(::dlsym(h, util::cat("k", k).c_str()));
      if (!fn) continue;
      m.trees[k]->set_native(fn);
      runtime::count(runtime::Counter::NativeTrees);
    }
    return true;
  }
  // Writes the source and runs kCompileScript over it.
  bool compile(const Module& m, const std::string& base) {
    const std::string tag = util::cat(".", ::getpid(), ".", ::gettid());
    const std::string cpp = base + tag + ".cpp", so = base + tag + ".so", log = base + tag + ".log";
    {
      std::ofstream out(cpp, std::ios::binary);
      out << m.source;
      if (!out) return fail(util::cat("could not write ", cpp));
    }
    std::vector<std::string> cxx;
    {
      std::istringstream words(compiler());
      for (std::string w; words >> w;) cxx.push_back(w);
    }
    if (cxx.empty()) return fail("LOCKSTEP_NATIVE_CXX names no command");
    std::vector<std::string> args{"/bin/sh", "-c", kCompileScript, "sh", so, cpp, base, log};
    args.insert(args.end(), cxx.begin(), cxx.end());
    for (const std::string& f : compile_flags(m.width)) args.push_back(f);
    for (const std::string& a : {std::string("-o"), so, cpp}) args.push_back(a);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid = -1;
    const int e = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (e != 0) {
      ::unlink(cpp.c_str());
      return fail(util::cat("could not start /bin/sh: ", std::strerror(e)));
    }
    runtime::count(runtime::Counter::NativeCompiles);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 127)  // the shell's "command not found"
      return fail(
          util::cat("could not start ", cxx[0], " (not found; its messages are in ", log, ")"));
    return fail(util::cat(cxx[0], " failed (status ", status, "); its messages are in ", log));
  }
  bool fail(const std::string& why) {
    if (!warned_.exchange(true))
      std::fprintf(stderr,
                   "lockstep: no native code for fused elementwise trees: %s. The interpreter runs "
                   "them (same values, slower); LOCKSTEP_NATIVE=0 skips the attempt.\n",
                   why.c_str());
    return false;
  }

  std::mutex mu_;  // jobs_, started_, stopped_
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool started_ = false, stopped_ = false;
  std::mutex load_mu_;  // exiting_, and each load
  bool exiting_ = false;
  std::atomic<bool> warned_{false};
};

}  // namespace

void* const* native_math() {
  static void* const* table = [] {
    static void* fns[8] = {};
    const MathIsa isa = math_isa();
    for (int f = 0; f < 8; ++f) fns[f] = vector_math_fn(static_cast<MathFn>(f), isa);
    return fns;
  }();
  return table;
}

NativeMode native_mode() {
  const std::string& set = util::option(util::Option::Native);
  if (set == "0" || set == "off") return NativeMode::Off;
  return set == "sync" ? NativeMode::Now : NativeMode::Background;
}

void compile_native(const std::vector<std::shared_ptr<FusedTree>>& trees, NativeMode mode) {
  if (mode == NativeMode::Off || trees.empty()) return;
  const MathIsa isa = math_isa();
  if (isa == MathIsa::Scalar) return;
  const int width = isa == MathIsa::Avx512 ? 16 : 8;
  // The cache, else (no home, or one that cannot be written) a directory of this user's under
  // /tmp, which lasts until the machine restarts.
  std::string dir = cache_dir();
  if (dir.empty() || !make_dirs(dir) || ::access(dir.c_str(), W_OK) != 0) {
    dir = util::cat("/tmp/lockstep-native-", ::getuid());
    if (!make_dirs(dir) || ::access(dir.c_str(), W_OK) != 0) return;
  }
  // Modules of up to kModuleInstrs instructions, each keyed by its source's hash.
  std::vector<Module> modules;
  size_t instrs = kModuleInstrs;
  std::unordered_map<const FusedTree*, bool> seen;
  for (const std::shared_ptr<FusedTree>& t : trees) {
    if (!t || t->has_native() || !seen.emplace(t.get(), true).second) continue;
    if (instrs >= kModuleInstrs) {
      modules.push_back({width, prelude(width), {}});
      instrs = 0;
    }
    Module& m = modules.back();
    const std::string src = t->native_source(util::cat("k", m.trees.size()));
    if (src.empty()) continue;
    m.source += src;
    m.trees.push_back(t);
    instrs += static_cast<size_t>(std::count(src.begin(), src.end(), '\n'));
  }
  Builder& b = Builder::get();
  for (Module& m : modules) {
    if (m.trees.empty()) continue;
    const uint64_t h = fnv1a(util::cat(kAbiVersion, "\n", compiler(), "\n", m.source));
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
    const std::string base = dir + "/" + hex;
    if (b.load_cached(m, base)) continue;
    if (mode == NativeMode::Now)
      b.build(m, base);
    else
      b.enqueue(std::move(m), base);
  }
}

}  // namespace lockstep::backends::cpu
