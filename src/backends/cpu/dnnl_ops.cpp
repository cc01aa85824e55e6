// oneDNN primitives for matmul, convolution and average pooling; see dnnl_ops.h.
#include "backends/cpu/dnnl_ops.h"

#include <omp.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#if defined(__SSE__)
#include <immintrin.h>
#endif

#include "backends/cpu/dnnl_common.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/parallel.h"
#include "backends/cpu/winograd.h"
#include "ir/attrs.h"
#include "lockstep/error.h"
#include "runtime/metrics.h"
#include "util/check.h"
#include "util/options.h"

namespace lockstep::backends::cpu {

dnnl::engine& engine() {
  static dnnl::engine* e = [] {
    auto* made = new dnnl::engine(dnnl::engine::kind::cpu, 0);
    // oneDNN builds its gemm kernels once per process, in function-local statics, at the first
    // gemm (matmuls, and convolutions, on CPUs without brgemm kernels: AVX2). Built here, where
    // the first program is compiled, they are destroyed at exit after the runtime's drain (which
    // registers as that program is queued) instead of under a program the drain waits for.
    // On one thread: this is the compiling thread (the user's), and an OpenMP team of its own
    // would leave libgomp with more threads than cores, which then makes every team's idle
    // threads sleep at once instead of spinning
    // (Parallel.CompilingOnAUsersThreadStartsNoTeamThere).
    std::vector<float> a(64 * 64, 0.0f), c(64 * 64);
    const ThreadCount one(1);
    dnnl::sgemm('N', 'N', 64, 64, 64, 1.0f, a.data(), 64, a.data(), 64, 0.0f, c.data(), 64);
    return made;
  }();
  return *e;
}

dnnl::stream& stream() {
  static dnnl::stream* s = new dnnl::stream(engine());
  return *s;
}

// Every primitive takes its scratchpad from the caller (scratchpad_mode::user). oneDNN 2.x's
// library-managed scratchpad belongs to the thread that created the primitive, and primitives are
// created where a program is compiled but run on the runtime thread: gemm-based convolutions
// (e.g. dilated ones) then write through a scratchpad that does not exist and crash.
dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

size_t floats_for(const memory::desc& md) {
  const size_t floats = (md.get_size() + sizeof(float) - 1) / sizeof(float);
  return (floats + 15) / 16 * 16;
}

void add_scratchpad(std::unordered_map<int, memory>* args, const memory::desc& md, float* at) {
  if (md.get_size() > 0) args->insert({DNNL_ARG_SCRATCHPAD, memory(md, engine(), at)});
}

[[noreturn]] void rethrow(const dnnl::error& e, const char* what) {
  throw BackendError(util::cat("oneDNN ", what, ": ", e.what(), " (status ", e.status, ")"));
}

float* scratch(size_t floats) {
  thread_local std::unique_ptr<float[], void (*)(void*)> buf(nullptr, std::free);
  thread_local size_t size = 0;
  if (floats > size) {
    buf.reset(static_cast<float*>(std::aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64)));
    if (!buf) throw std::bad_alloc();
    size = floats;
  }
  return buf.get();
}

namespace {

// A primitive's arguments, made once and pointed at each run's memory: making a dnnl::memory and
// the map that holds it allocates, and a small product spent about as long on that as on its
// arithmetic. Primitives run one at a time on the runtime thread (as scratch() assumes).
class BoundArgs {
 public:
  // An argument of layout `md` (none for an empty scratchpad).
  void add(int arg, const memory::desc& md) {
    if (arg == DNNL_ARG_SCRATCHPAD && md.get_size() == 0) return;
    map_.emplace(arg, memory(md, engine(), nullptr));
  }
  // The run's memory for `arg`, if it has one.
  void bind(int arg, const void* at) {
    const auto it = map_.find(arg);
    if (it != map_.end()) it->second.set_data_handle(const_cast<void*>(at));
  }
  const std::unordered_map<int, memory>& map() const { return map_; }

 private:
  std::unordered_map<int, memory> map_;
};

memory::dims dims_of(const Shape& s) { return memory::dims(s.begin(), s.end()); }

// Elements a memory descriptor spans (its buffer's size in elements; 0 for an empty one).
int64_t span_of(const memory::desc& md) {
  const size_t bytes = md.get_size();
  return bytes ? static_cast<int64_t>(bytes / memory::data_type_size(md.data_type())) : 0;
}

// bf16 where oneDNN has no bf16 kernel (CPUs without AVX512-BF16 or AMX, or ONEDNN_MAX_CPU_ISA
// below them): the operands widened to f32 (exact), the f32 primitive, the result rounded to
// bf16 once. The same values as a bf16 kernel (bf16 inputs, f32 accumulation), only slower.
// Widened copies live in per-thread buffers, kept from run to run.
struct Bf16Emulation {
  bool on = false;
  int64_t numel[3] = {0, 0, 0};  // of the two operands' and the result's memory

  // Turns it on for operands and a result of these descriptors (in1 empty: one operand).
  void enable(const memory::desc& in0, const memory::desc& in1, const memory::desc& out) {
    on = true;
    numel[0] = span_of(in0);
    numel[1] = span_of(in1);
    numel[2] = span_of(out);
    runtime::count(runtime::Counter::Bf16EmulatedPrimitives);
  }

  const float* widen(int k, const void* src) const {
    float* dst = buffer(k);
    bf16_to_f32(static_cast<const uint16_t*>(src), numel[k], dst);
    return dst;
  }
  float* result() const { return buffer(2); }
  void round(void* dst) const { f32_to_bf16(buffer(2), numel[2], static_cast<uint16_t*>(dst)); }

 private:
  float* buffer(int k) const {
    thread_local std::vector<float> b[3];
    if (b[k].size() < static_cast<size_t>(numel[k])) b[k].resize(numel[k]);
    return b[k].data();
  }
};

dt dnnl_dtype(DType d) {
  LS_INTERNAL_CHECK(d == DType::F32 || d == DType::BF16, "oneDNN takes f32 or bf16 here, not ",
                    dtype_name(d));
  return d == DType::BF16 ? dt::bf16 : dt::f32;
}

// Blocked OIhw16i16o weights ([O/16][I/16][H][W][16 i][16 o]) to plain OIHW: oneDNN's reorder
// for this direction ran at ~5 GB/s here (a third of the machine's bandwidth; the opposite
// direction runs at full speed), and it is what every convolution's weight gradient goes
// through. Each 16 x 16 x H x W block is transposed in a small buffer, then written as 16 rows
// of 16 * H * W values with non-temporal stores: the gradient is read again only by the
// optimizer, after the rest of the backward pass, and stores that bypass the cache skip reading
// each destination line first (ResNet-50's 85 MB of weight gradients: ~5 against ~9.4 ms alone).
void unblock_weights(const float* in, const memory::dims& d, float* out) {
  const int64_t O = d[0], I = d[1], HW = d[2] * d[3];
  const int64_t ob_n = O / 16, ib_n = I / 16, run = 16 * HW;
#if defined(__SSE__)
  const bool stream = reinterpret_cast<uintptr_t>(out) % 16 == 0;
#endif
#pragma omp parallel
  {
    thread_local std::vector<float> t;
    if (t.size() < static_cast<size_t>(16 * run)) t.resize(16 * run);
#pragma omp for collapse(2) schedule(static) nowait
    for (int64_t ob = 0; ob < ob_n; ++ob)
      for (int64_t ib = 0; ib < ib_n; ++ib) {
        const float* blk = in + (ob * ib_n + ib) * HW * 256;
        for (int64_t hw = 0; hw < HW; ++hw)
          for (int64_t ii = 0; ii < 16; ++ii) {
            const float* src = blk + (hw * 16 + ii) * 16;
            float* dst = t.data() + ii * HW + hw;
            for (int64_t oo = 0; oo < 16; ++oo) dst[oo * run] = src[oo];
          }
        for (int64_t oo = 0; oo < 16; ++oo) {
          float* row = out + ((ob * 16 + oo) * I + ib * 16) * HW;
          const float* r = t.data() + oo * run;
#if defined(__SSE__)
          if (stream) {
            for (int64_t k = 0; k < run; k += 4) _mm_stream_ps(row + k, _mm_loadu_ps(r + k));
            continue;
          }
#endif
          std::memcpy(row, r, run * sizeof(float));
        }
      }
#if defined(__SSE__)
    _mm_sfence();  // this thread's streamed rows, before the region's closing barrier
#endif
  }
}

// A user-side (plain) memory and, when oneDNN prefers another layout, the reorders to and from
// a blocked copy that lives in the shared scratch at `offset` floats.
struct Operand {
  memory::desc user_md;
  memory::desc prim_md;
  bool reorder = false;
  size_t offset = 0, floats = 0;
  memory::desc pad_md;  // the reorder's scratchpad, after the blocked copy
  std::unique_ptr<dnnl::reorder> to_prim, from_prim;
  bool own_unblock = false;  // an output in OIhw16i16o, unblocked by unblock_weights

  // Returns the scratch floats it needs.
  size_t init(const memory::desc& user, const memory::desc& prim, bool is_output, size_t at) {
    user_md = user;
    prim_md = prim;
    if (user == prim) return 0;
    reorder = true;
    offset = at;
    const memory::dims d = user.dims();
    if (is_output && d.size() == 4 && d[0] % 16 == 0 && d[1] % 16 == 0 &&
        user == memory::desc(d, dt::f32, tag::oihw) &&
        prim == memory::desc(d, dt::f32, tag::OIhw16i16o)) {
      own_unblock = true;
      floats = floats_for(prim);
      return floats;
    }
    const dnnl::reorder::primitive_desc pd =
        is_output
            ? dnnl::reorder::primitive_desc(engine(), prim, engine(), user, user_scratchpad())
            : dnnl::reorder::primitive_desc(engine(), user, engine(), prim, user_scratchpad());
    (is_output ? from_prim : to_prim) = std::make_unique<dnnl::reorder>(pd);
    pad_md = pd.scratchpad_desc();
    floats = floats_for(prim) + floats_for(pad_md);
    return floats;
  }

  void run_reorder(dnnl::reorder& r, memory& from, memory& to, float* base) {
    std::unordered_map<int, memory> args{{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
    add_scratchpad(&args, pad_md, base + offset + floats_for(prim_md));
    r.execute(stream(), args);
  }

  memory input(const void* ptr, float* base, DnnlConv::Copy copy) {
    memory user(user_md, engine(), const_cast<void*>(ptr));
    if (!reorder) return user;
    if (copy.ready) return memory(prim_md, engine(), const_cast<float*>(copy.ready));
    memory blocked(prim_md, engine(), copy.keep ? copy.keep : base + offset);
    run_reorder(*to_prim, user, blocked, base);
    return blocked;
  }
  memory output(void* ptr, float* base) {
    if (!reorder) return memory(user_md, engine(), ptr);
    return memory(prim_md, engine(), base + offset);
  }
  void finish_output(void* ptr, float* base) {
    if (!reorder) return;
    if (own_unblock) {
      stream().wait();
      unblock_weights(base + offset, user_md.dims(), static_cast<float*>(ptr));
      return;
    }
    memory user(user_md, engine(), ptr);
    memory blocked(prim_md, engine(), base + offset);
    run_reorder(*from_prim, blocked, user, base);
  }
};

}  // namespace

// ---- matmul ---------------------------------------------------------------------------------

// A product of at most this many flops runs on one thread: splitting it costs more than it
// saves (oneDNN 2.6, brg:avx512_core, two Zen 5 cores: [64 x 64] x [64 x 64] 2.5 us on one
// thread, 5.5 us on two; [128 x 64] x [64 x 64] 4.8 against 6.8; even at twice this size).
constexpr int64_t kOneThreadFlops = int64_t{1} << 20;

struct DnnlMatMul::Impl {
  memory::desc a_md, b_md, c_md, pad_md;
  std::string implementation;
  std::unique_ptr<dnnl::matmul> prim;
  BoundArgs args;
  Bf16Emulation emulation;
  bool one_thread = false;  // a small product (kOneThreadFlops)
};

DnnlMatMul::DnnlMatMul(const Shape& a, const std::vector<int64_t>& as, const Shape& b,
                       const std::vector<int64_t>& bs, const Shape& out, DType in, DType out_dtype,
                       const std::vector<int64_t>& out_strides)
    : impl_(std::make_unique<Impl>()) {
  Shape cs(out.size());  // contiguous unless given
  int64_t acc = 1;
  for (size_t i = out.size(); i-- > 0;) {
    cs[i] = acc;
    acc *= out[i];
  }
  if (!out_strides.empty()) cs = Shape(out_strides.begin(), out_strides.end());
  impl_->one_thread = !a.empty() && 2 * shape_numel(out) * a.back() <= kOneThreadFlops;
  const ThreadCount count(impl_->one_thread ? 1 : omp_get_max_threads());
  auto build = [&](dt in_dt, dt out_dt) {
    impl_->a_md = memory::desc(dims_of(a), in_dt, memory::dims(as.begin(), as.end()));
    impl_->b_md = memory::desc(dims_of(b), in_dt, memory::dims(bs.begin(), bs.end()));
    impl_->c_md = memory::desc(dims_of(out), out_dt, memory::dims(cs.begin(), cs.end()));
    dnnl::matmul::desc d(impl_->a_md, impl_->b_md, impl_->c_md);
    dnnl::matmul::primitive_desc pd(d, user_scratchpad(), engine());
    impl_->pad_md = pd.scratchpad_desc();
    impl_->implementation = pd.impl_info_str();
    impl_->prim = std::make_unique<dnnl::matmul>(pd);
    impl_->args = BoundArgs();
    impl_->args.add(DNNL_ARG_SRC, impl_->a_md);
    impl_->args.add(DNNL_ARG_WEIGHTS, impl_->b_md);
    impl_->args.add(DNNL_ARG_DST, impl_->c_md);
    impl_->args.add(DNNL_ARG_SCRATCHPAD, impl_->pad_md);
  };
  try {
    try {
      build(dnnl_dtype(in), dnnl_dtype(out_dtype));
    } catch (const dnnl::error&) {
      if (in != DType::BF16 || out_dtype != DType::BF16) throw;
      build(dt::f32, dt::f32);  // no bf16 matmul on this CPU: emulated
      impl_->emulation.enable(impl_->a_md, impl_->b_md, impl_->c_md);
    }
  } catch (const dnnl::error& e) {
    rethrow(e, "matmul setup");
  }
}

DnnlMatMul::~DnnlMatMul() = default;

size_t DnnlMatMul::scratch_bytes() const { return floats_for(impl_->pad_md) * sizeof(float); }

std::string DnnlMatMul::implementation() const { return impl_->implementation; }

std::string onednn_version() {
  const dnnl_version_t* v = dnnl_version();
  return util::cat(v->major, ".", v->minor, ".", v->patch);
}

std::string matmul_implementation(const Shape& a, const std::vector<int64_t>& as, const Shape& b,
                                  const std::vector<int64_t>& bs, const Shape& out,
                                  const std::vector<int64_t>& os, DType dtype) {
  try {
    const dt d = dnnl_dtype(dtype);
    const memory::desc a_md(dims_of(a), d, memory::dims(as.begin(), as.end()));
    const memory::desc b_md(dims_of(b), d, memory::dims(bs.begin(), bs.end()));
    const memory::desc c_md(dims_of(out), d, memory::dims(os.begin(), os.end()));
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), engine())
        .impl_info_str();
  } catch (const dnnl::error&) {
    return "";
  }
}

void DnnlMatMul::run(const void* a, const void* b, void* out) {
  const Bf16Emulation& e = impl_->emulation;
  if (e.on) {
    a = e.widen(0, a);
    b = e.widen(1, b);
  }
  try {
    BoundArgs& args = impl_->args;
    args.bind(DNNL_ARG_SRC, a);
    args.bind(DNNL_ARG_WEIGHTS, b);
    args.bind(DNNL_ARG_DST, e.on ? e.result() : out);
    args.bind(DNNL_ARG_SCRATCHPAD, scratch(floats_for(impl_->pad_md)));
    {
      const ThreadCount count(impl_->one_thread ? 1 : omp_get_max_threads());
      impl_->prim->execute(stream(), args.map());
      stream().wait();
    }
    if (e.on) e.round(out);
  } catch (const dnnl::error& e) {
    rethrow(e, "matmul");
  }
}

// ---- convolution ----------------------------------------------------------------------------

struct DnnlConv::Impl {
  Kind kind;
  std::unique_ptr<WinogradConv> own_winograd;  // lockstep's, where oneDNN has no Winograd
  Bf16Emulation emulation;
  Operand in0, in1, out;
  memory::desc pad_md;  // the primitive's scratchpad, after the operands' blocked copies
  size_t pad_offset = 0;
  size_t scratch_floats = 0;
  std::unique_ptr<dnnl::primitive> prim;
  int arg0, arg1, arg_out;
};

namespace {

// Fills `impl` for one algorithm; throws dnnl::error when oneDNN has no implementation of it.
void build_conv(DnnlConv::Kind kind, const Shape& x, const Shape& w, const Shape& y,
                const std::vector<int64_t>& a, DnnlConv::Blocked blocked, dnnl::algorithm alg,
                dt ddt, DnnlConv::Impl& impl) {
  using Kind = DnnlConv::Kind;
  impl.kind = kind;
  const ir::ConvAttrs conv = ir::ConvAttrs::of(a);
  const int64_t g = conv.groups;
  const memory::dims strides{conv.stride[0], conv.stride[1]};
  const memory::dims dilates{conv.dilation[0] - 1, conv.dilation[1] - 1};
  const memory::dims pad_l{conv.padding[0], conv.padding[1]};
  // oneDNN wants the right padding that makes its output size equal PyTorch's floor formula.
  memory::dims pad_r(2);
  for (int d = 0; d < 2; ++d)
    pad_r[d] = (y[2 + d] - 1) * conv.stride[d] + (w[2 + d] - 1) * conv.dilation[d] + 1 - x[2 + d] -
               conv.padding[d];
  const memory::dims xd = dims_of(x), yd = dims_of(y);
  memory::dims wd = g == 1 ? dims_of(w) : memory::dims{g, w[0] / g, w[1], w[2], w[3]};
  const tag wtag = g == 1 ? tag::oihw : tag::goihw;
  auto act = [ddt](const memory::dims& d, bool b) {
    return memory::desc(d, ddt, b ? tag::nChw16c : tag::nchw);
  };
  const memory::desc w_user(wd, ddt, wtag);
  const memory::desc x_any(xd, ddt, tag::any), y_any(yd, ddt, tag::any);
  const memory::desc w_any(wd, ddt, tag::any);
  dnnl::convolution_forward::desc fd(dnnl::prop_kind::forward_training, alg, x_any, w_any, y_any,
                                     strides, dilates, pad_l, pad_r);
  const dnnl::primitive_attr attr = user_scratchpad();
  dnnl::convolution_forward::primitive_desc fpd(fd, attr, engine());
  // Per kind: the primitive, and for its two operands and result the plain memory, the layout
  // oneDNN chose and the argument it is passed as.
  struct Wire {
    memory::desc user;
    memory::desc prim;
    int arg;
  };
  Wire in0, in1, out;
  switch (kind) {
    case Kind::Forward:
      in0 = {act(xd, blocked.in0), fpd.src_desc(), DNNL_ARG_SRC};
      in1 = {w_user, fpd.weights_desc(), DNNL_ARG_WEIGHTS};
      out = {act(yd, blocked.out), fpd.dst_desc(), DNNL_ARG_DST};
      impl.pad_md = fpd.scratchpad_desc();
      impl.prim = std::make_unique<dnnl::convolution_forward>(fpd);
      break;
    case Kind::BackwardData: {
      dnnl::convolution_backward_data::desc bd(alg, x_any, w_any, y_any, strides, dilates, pad_l,
                                               pad_r);
      dnnl::convolution_backward_data::primitive_desc bpd(bd, attr, engine(), fpd);
      in0 = {act(yd, blocked.in0), bpd.diff_dst_desc(), DNNL_ARG_DIFF_DST};
      in1 = {w_user, bpd.weights_desc(), DNNL_ARG_WEIGHTS};
      out = {act(xd, blocked.out), bpd.diff_src_desc(), DNNL_ARG_DIFF_SRC};
      impl.pad_md = bpd.scratchpad_desc();
      impl.prim = std::make_unique<dnnl::convolution_backward_data>(bpd);
      break;
    }
    case Kind::BackwardWeights: {
      dnnl::convolution_backward_weights::desc bd(alg, x_any, w_any, y_any, strides, dilates, pad_l,
                                                  pad_r);
      dnnl::convolution_backward_weights::primitive_desc bpd(bd, attr, engine(), fpd);
      in0 = {act(xd, blocked.in0), bpd.src_desc(), DNNL_ARG_SRC};
      in1 = {act(yd, blocked.in1), bpd.diff_dst_desc(), DNNL_ARG_DIFF_DST};
      out = {w_user, bpd.diff_weights_desc(), DNNL_ARG_DIFF_WEIGHTS};
      impl.pad_md = bpd.scratchpad_desc();
      impl.prim = std::make_unique<dnnl::convolution_backward_weights>(bpd);
      break;
    }
  }
  impl.scratch_floats += impl.in0.init(in0.user, in0.prim, false, impl.scratch_floats);
  impl.scratch_floats += impl.in1.init(in1.user, in1.prim, false, impl.scratch_floats);
  impl.scratch_floats += impl.out.init(out.user, out.prim, true, impl.scratch_floats);
  impl.arg0 = in0.arg;
  impl.arg1 = in1.arg;
  impl.arg_out = out.arg;
  impl.pad_offset = impl.scratch_floats;
  impl.scratch_floats += floats_for(impl.pad_md);
}

void run_conv(DnnlConv::Impl& impl, const void* in0, const void* in1, void* out,
              DnnlConv::Copy copy0, DnnlConv::Copy copy1) {
  float* base = scratch(impl.scratch_floats);
  memory m0 = impl.in0.input(in0, base, copy0);
  memory m1 = impl.in1.input(in1, base, copy1);
  memory mo = impl.out.output(out, base);
  std::unordered_map<int, memory> args{{impl.arg0, m0}, {impl.arg1, m1}, {impl.arg_out, mo}};
  add_scratchpad(&args, impl.pad_md, base + impl.pad_offset);
  impl.prim->execute(stream(), args);
  impl.out.finish_output(out, base);
  stream().wait();
}

// Whether oneDNN's kernels run AVX-512 here (its ISA values are bit sets: avx2_vnni's is
// numerically larger than avx512_core's without containing it).
bool direct_avx512() {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto avx512 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core);
  return (isa & avx512) == avx512;
}

std::atomic<int>& conv_algo_knob() {
  static std::atomic<int> knob{[] {
    const std::string& s = util::option(util::Option::ConvAlgo);
    if (s == "direct") return static_cast<int>(ConvAlgo::Direct);
    if (s == "winograd") return static_cast<int>(ConvAlgo::Winograd);
    return static_cast<int>(ConvAlgo::Auto);  // unset, "auto", or unknown
  }()};
  return knob;
}

}  // namespace

DnnlConv::DnnlConv(Kind kind, const Shape& x, const Shape& w, const Shape& y,
                   const std::vector<int64_t>& a, Blocked blocked, bool winograd, DType dtype)
    : impl_(std::make_unique<Impl>()) {
  try {
    const dt ddt = dnnl_dtype(dtype);
    if (winograd) {
      try {
        build_conv(kind, x, w, y, a, blocked, dnnl::algorithm::convolution_winograd, ddt, *impl_);
        runtime::count(runtime::Counter::WinogradConvolutions);
        return;
      } catch (const dnnl::error&) {
        impl_ = std::make_unique<Impl>();  // not implemented for this problem or machine
      }
    }
    // lockstep's own Winograd where oneDNN's did not take the problem: by its own rule under
    // ConvAlgo::Auto (on CPUs without AVX-512 its rule also takes the small maps the pass leaves
    // to direct: they have few tiles, run whole), wherever it takes the problem when Winograd is
    // asked for everywhere, never under ConvAlgo::Direct.
    const ConvAlgo setting = conv_algo();
    const auto wk = kind == Kind::Forward        ? WinogradConv::Kind::Forward
                    : kind == Kind::BackwardData ? WinogradConv::Kind::BackwardData
                                                 : WinogradConv::Kind::BackwardWeights;
    if (dtype == DType::F32 && setting != ConvAlgo::Direct && WinogradConv::takes(x, w, a) &&
        ((setting == ConvAlgo::Winograd && winograd) ||
         WinogradConv::pays(wk, x, w, y, blocked.in0, blocked.in1, blocked.out, direct_avx512()))) {
      impl_->kind = kind;
      impl_->own_winograd =
          std::make_unique<WinogradConv>(wk, x, w, y, a, blocked.in0, blocked.in1, blocked.out);
      impl_->scratch_floats = impl_->own_winograd->scratch_floats();
      runtime::count(runtime::Counter::WinogradConvolutions);
      return;
    }
    try {
      build_conv(kind, x, w, y, a, blocked, dnnl::algorithm::convolution_direct, ddt, *impl_);
    } catch (const dnnl::error&) {
      if (dtype != DType::BF16) throw;
      // No bf16 convolution on this CPU: emulated (Bf16Emulation).
      impl_ = std::make_unique<Impl>();
      build_conv(kind, x, w, y, a, blocked, dnnl::algorithm::convolution_direct, dt::f32, *impl_);
      impl_->emulation.enable(impl_->in0.user_md, impl_->in1.user_md, impl_->out.user_md);
    }
  } catch (const dnnl::error& e) {
    rethrow(e, "convolution setup");
  }
}

DnnlConv::~DnnlConv() = default;

void DnnlConv::run(const void* in0, const void* in1, void* out, Copy copy0, Copy copy1) {
  if (impl_->own_winograd) {
    impl_->own_winograd->run(static_cast<const float*>(in0), static_cast<const float*>(in1),
                             static_cast<float*>(out), scratch(impl_->scratch_floats));
    return;
  }
  const Bf16Emulation& e = impl_->emulation;
  try {
    if (e.on) {
      // (A copy another convolution kept is f32 already: that operand is not read then.)
      run_conv(*impl_, copy0.ready ? in0 : e.widen(0, in0), copy1.ready ? in1 : e.widen(1, in1),
               e.result(), copy0, copy1);
      e.round(out);
      return;
    }
    run_conv(*impl_, in0, in1, out, copy0, copy1);
  } catch (const dnnl::error& e) {
    rethrow(e, "convolution");
  }
}

// ---- average pooling -----------------------------------------------------------------------

struct DnnlAvgPool::Impl {
  memory::desc in_md, out_md, pad_md;
  std::unique_ptr<dnnl::primitive> prim;
  bool backward = false;
  BoundArgs args;
  int in_arg = 0, out_arg = 0;
  Bf16Emulation emulation;
};

// oneDNN's right padding: what makes its output size PyTorch's floor formula.
static int64_t pool_pad_r(const Shape& x, const Shape& y, const ir::PoolAttrs& pool, int d) {
  return (y[2 + d] - 1) * pool.stride[d] + pool.kernel[d] - x[2 + d] - pool.padding[d];
}

bool DnnlAvgPool::fits(const Shape& x, const Shape& y, const std::vector<int64_t>& a) {
  const ir::PoolAttrs pool = ir::PoolAttrs::of(a);
  for (int d = 0; d < 2; ++d) {
    const int64_t pad_r = pool_pad_r(x, y, pool, d);
    if (pad_r < 0 || (pool.count_include_pad && pad_r > pool.padding[d])) return false;
  }
  return true;
}

DnnlAvgPool::DnnlAvgPool(bool backward, const Shape& x, const Shape& y,
                         const std::vector<int64_t>& a, DType dtype)
    : impl_(std::make_unique<Impl>()) {
  if (!fits(x, y, a)) throw BackendError("average pooling: padding oneDNN does not take");
  auto build = [&](dt ddt) {
    const memory::desc x_md(dims_of(x), ddt, tag::nchw), y_md(dims_of(y), ddt, tag::nchw);
    const ir::PoolAttrs pool = ir::PoolAttrs::of(a);
    const memory::dims kernel{pool.kernel[0], pool.kernel[1]};
    const memory::dims strides{pool.stride[0], pool.stride[1]};
    const memory::dims pad_l{pool.padding[0], pool.padding[1]};
    const memory::dims pad_r{pool_pad_r(x, y, pool, 0), pool_pad_r(x, y, pool, 1)};
    const dnnl::algorithm alg = pool.count_include_pad
                                    ? dnnl::algorithm::pooling_avg_include_padding
                                    : dnnl::algorithm::pooling_avg_exclude_padding;
    const dnnl::primitive_attr attr = user_scratchpad();
    dnnl::pooling_forward::desc fd(dnnl::prop_kind::forward_training, alg, x_md, y_md, strides,
                                   kernel, pad_l, pad_r);
    dnnl::pooling_forward::primitive_desc fpd(fd, attr, engine());
    impl_->backward = backward;
    if (!backward) {
      impl_->in_md = x_md;
      impl_->out_md = y_md;
      impl_->pad_md = fpd.scratchpad_desc();
      impl_->prim = std::make_unique<dnnl::pooling_forward>(fpd);
    } else {
      dnnl::pooling_backward::desc bd(alg, x_md, y_md, strides, kernel, pad_l, pad_r);
      dnnl::pooling_backward::primitive_desc bpd(bd, attr, engine(), fpd);
      impl_->in_md = y_md;
      impl_->out_md = x_md;
      impl_->pad_md = bpd.scratchpad_desc();
      impl_->prim = std::make_unique<dnnl::pooling_backward>(bpd);
    }
    impl_->in_arg = backward ? DNNL_ARG_DIFF_DST : DNNL_ARG_SRC;
    impl_->out_arg = backward ? DNNL_ARG_DIFF_SRC : DNNL_ARG_DST;
    impl_->args = BoundArgs();
    impl_->args.add(impl_->in_arg, impl_->in_md);
    impl_->args.add(impl_->out_arg, impl_->out_md);
    impl_->args.add(DNNL_ARG_SCRATCHPAD, impl_->pad_md);
  };
  try {
    try {
      build(dnnl_dtype(dtype));
    } catch (const dnnl::error&) {
      if (dtype != DType::BF16) throw;
      build(dt::f32);  // no bf16 pooling on this CPU: emulated
      impl_->emulation.enable(impl_->in_md, memory::desc(), impl_->out_md);
    }
  } catch (const dnnl::error& e) {
    rethrow(e, "average pooling setup");
  }
}

DnnlAvgPool::~DnnlAvgPool() = default;

size_t DnnlAvgPool::scratch_bytes() const { return floats_for(impl_->pad_md) * sizeof(float); }

void DnnlAvgPool::run(const void* in, void* out) {
  const Bf16Emulation& e = impl_->emulation;
  void* const dst = out;
  if (e.on) {
    in = e.widen(0, in);
    out = e.result();
  }
  try {
    BoundArgs& args = impl_->args;
    args.bind(impl_->in_arg, in);
    args.bind(impl_->out_arg, out);
    args.bind(DNNL_ARG_SCRATCHPAD, scratch(floats_for(impl_->pad_md)));
    impl_->prim->execute(stream(), args.map());
    stream().wait();
    if (e.on) e.round(dst);
  } catch (const dnnl::error& e) {
    rethrow(e, "average pooling");
  }
}

size_t DnnlConv::scratch_bytes() const { return impl_->scratch_floats * sizeof(float); }

size_t DnnlConv::copy_floats(int k) const {
  const Operand& o = k == 0 ? impl_->in0 : impl_->in1;
  return o.reorder ? floats_for(o.prim_md) : 0;
}

bool DnnlConv::same_copy(int k, const DnnlConv& other, int other_k) const {
  const Operand& a = k == 0 ? impl_->in0 : impl_->in1;
  const Operand& b = other_k == 0 ? other.impl_->in0 : other.impl_->in1;
  return a.reorder && b.reorder && a.user_md == b.user_md && a.prim_md == b.prim_md;
}

void set_conv_algo(ConvAlgo algo) { conv_algo_knob().store(static_cast<int>(algo)); }
ConvAlgo conv_algo() { return static_cast<ConvAlgo>(conv_algo_knob().load()); }

void set_threads(int n) { omp_set_num_threads(n); }
int threads() { return omp_get_max_threads(); }

}  // namespace lockstep::backends::cpu

namespace lockstep {

std::string cpu_kernels(DType dtype) {
  using dnnl::memory;
  using dt = memory::data_type;
  using tag = memory::format_tag;
  if (dtype != DType::F32 && dtype != DType::BF16)
    throw Error(util::cat("cpu_kernels: takes f32 or bf16, got ", dtype_name(dtype)));
  // What runs a primitive of `d`: its implementation, or for bf16 without one the f32 one that
  // emulates it (see Bf16Emulation).
  auto kernel = [](dt d, const char* what) -> std::string {
    const memory::desc a({256, 256}, d, tag::ab);
    const memory::desc x({16, 64, 14, 14}, d, tag::any), w({64, 64, 3, 3}, d, tag::any);
    if (std::string(what) == "matmul")
      return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, a, a), backends::cpu::engine())
          .impl_info_str();
    dnnl::convolution_forward::desc cd(dnnl::prop_kind::forward_training,
                                       dnnl::algorithm::convolution_direct, x, w, x, {1, 1}, {1, 1},
                                       {1, 1});
    return dnnl::convolution_forward::primitive_desc(cd, backends::cpu::engine()).impl_info_str();
  };
  auto describe = [&](const char* what) {
    try {
      return kernel(backends::cpu::dnnl_dtype(dtype), what);
    } catch (const dnnl::error&) {
      if (dtype != DType::BF16) throw;
      return kernel(dt::f32, what) + " (bf16 emulated in f32: no bf16 kernel on this CPU)";
    }
  };
  try {
    return util::cat("matmul ", describe("matmul"), ", convolution ", describe("convolution"));
  } catch (const dnnl::error& e) {
    backends::cpu::rethrow(e, "kernel query");
  }
}

}  // namespace lockstep
