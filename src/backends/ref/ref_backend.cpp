// The ref backend's interpreter and its elementwise, reduction and movement kernels. Each node
// of the graph is evaluated in order into a fresh array. Clear over fast, on purpose.
#include "backends/ref/ref_backend.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "backends/ref/ref_kernels.h"
#include "dist/comm.h"
#include "ir/attrs.h"
#include "ir/elementwise.h"
#include "ir/random_bits.h"
#include "util/check.h"

namespace lockstep::backends::ref {
namespace {

using ir::Op;
using util::cat;

template <typename T>
constexpr bool kFloat = std::is_floating_point_v<T>;

// An elementwise op (ir/elementwise.h) element by element, its operands read as T (a select's
// condition as bool), each value computed by the table's formula; failures raised as met.
template <typename T>
void elementwise(Op op, const std::vector<Arr>& a, int64_t count, void* out) {
  const bool known = ir::elementwise::with_fn<T>(op, [&](auto fn) {
    using Fn = decltype(fn);
    if constexpr (requires(T v) { Fn::f(v); }) {
      const T* x = a[0].as<T>();
      auto* y = static_cast<decltype(Fn::f(T{}))*>(out);
      for (int64_t i = 0; i < count; ++i) y[i] = Fn::f(x[i]);
    } else if constexpr (requires(T v) { Fn::f(v, v); }) {
      const T* x0 = a[0].as<T>();
      const T* x1 = a[1].as<T>();
      auto* y = static_cast<decltype(Fn::f(T{}, T{}))*>(out);
      for (int64_t i = 0; i < count; ++i) {
        if constexpr (std::is_integral_v<T> && requires { Fn::int_failure(T{}); })
          if (const char* why = Fn::int_failure(x1[i]))
            throw BackendError(cat(ir::op_info(op).name, ": ", why));
        y[i] = Fn::f(x0[i], x1[i]);
      }
    } else {
      const bool* c = a[0].as<bool>();
      const T* x1 = a[1].as<T>();
      const T* x2 = a[2].as<T>();
      T* y = static_cast<T*>(out);
      for (int64_t i = 0; i < count; ++i) y[i] = Fn::f(c[i], x1[i], x2[i]);
    }
  });
  if (!known)
    util::internal_fail(__FILE__, __LINE__,
                        cat("ref: no kernel for ", ir::op_info(op).name, " on this dtype"));
}

void cast(const Arr& x, DType to, void* out, int64_t n) {
  by_dtype<void>(x.dtype, [&](auto from_tag) {
    using From = decltype(from_tag);
    by_dtype<void>(to, [&](auto to_tag) {
      using To = decltype(to_tag);
      const From* src = x.as<From>();
      To* dst = static_cast<To*>(out);
      for (int64_t i = 0; i < n; ++i) dst[i] = ir::elementwise::convert<To>(src[i]);
    });
  });
}

// out shape with keepdim, strides into it (0 on reduced axes), and strides inside the reduced
// block (row-major over the reduced axes, 0 on kept ones).
struct ReduceMap {
  std::vector<int64_t> out_strides, block_strides;
};

ReduceMap reduce_map(const Shape& in, const std::vector<int64_t>& attrs) {
  std::vector<bool> reduced(in.size(), false);
  for (size_t i = 1; i < attrs.size(); ++i) reduced[attrs[i]] = true;
  ReduceMap m;
  m.out_strides.assign(in.size(), 0);
  m.block_strides.assign(in.size(), 0);
  int64_t acc_out = 1, acc_block = 1;
  for (size_t d = in.size(); d-- > 0;) {
    if (reduced[d]) {
      m.block_strides[d] = acc_block;
      acc_block *= in[d];
    } else {
      m.out_strides[d] = acc_out;
      acc_out *= in[d];
    }
  }
  return m;
}

void reduce(const ir::GraphNode& n, const Arr& x, void* out) {
  const int64_t out_n = shape_numel(n.shape);
  const ReduceMap m = reduce_map(x.shape, n.attrs);
  const int64_t in_n = shape_numel(x.shape);
  by_dtype<void>(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* src = x.as<T>();
    if (n.op == Op::Sum) {
      // Floats accumulate in double, integers in int64 (wrapping).
      using Acc = std::conditional_t<kFloat<T>, double, int64_t>;
      std::vector<Acc> acc(out_n, Acc(0));
      IndexWalker w(x.shape, m.out_strides, 0);
      for (int64_t i = 0; i < in_n; ++i, w.next()) {
        if constexpr (kFloat<T>)
          acc[w.offset] += static_cast<double>(src[i]);
        else
          acc[w.offset] =
              ir::elementwise::wrap_add<int64_t>(acc[w.offset], static_cast<int64_t>(src[i]));
      }
      by_dtype<void>(n.dtype, [&](auto otag) {
        using O = decltype(otag);
        O* dst = static_cast<O*>(out);
        for (int64_t i = 0; i < out_n; ++i) dst[i] = static_cast<O>(acc[i]);
      });
      return;
    }
    const bool is_max = n.op == Op::Max || n.op == Op::ArgMax;
    const bool want_index = n.op == Op::ArgMax || n.op == Op::ArgMin;
    std::vector<T> best(out_n);
    std::vector<int64_t> best_at(out_n, -1);
    IndexWalker w(x.shape, m.out_strides, 0);
    IndexWalker b(x.shape, m.block_strides, 0);
    for (int64_t i = 0; i < in_n; ++i, w.next(), b.next()) {
      const T v = src[i];
      const int64_t o = w.offset;
      bool take = best_at[o] < 0;
      if (!take) {
        if constexpr (kFloat<T>) {
          // NaN wins and stays (as PyTorch's max/argmax).
          take = !std::isnan(best[o]) && (std::isnan(v) || (is_max ? v > best[o] : v < best[o]));
        } else {
          take = is_max ? v > best[o] : v < best[o];
        }
      }
      if (take) {
        best[o] = v;
        best_at[o] = b.offset;
      }
    }
    if (want_index) {
      if (out_n) std::memcpy(out, best_at.data(), out_n * sizeof(int64_t));  // out null if empty
    } else {
      T* dst = static_cast<T*>(out);
      for (int64_t i = 0; i < out_n; ++i) dst[i] = best[i];
    }
  });
}

// The sum over the ranks (dist/comm.h; on the root alone for a reduce), then the scale.
void all_reduce(const ir::GraphNode& n, const Arr& x, void* out) {
  const int64_t count = shape_numel(n.shape);
  if (count) std::memcpy(out, x.data, static_cast<size_t>(count) * dtype_size(n.dtype));
  const ir::AllReduceAttrs attrs = ir::AllReduceAttrs::of(n.attrs);
  dist::detail::all_reduce(out, count, n.dtype,
                           util::cat(attrs.root < 0 ? "all_reduce" : "reduce", " recorded at ",
                                     util::where(n.origin.loc)),
                           static_cast<int>(attrs.root));
  const double scale = attrs.scale;
  if (scale == 1) return;
  by_dtype<void>(n.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (kFloat<T>)
      for (int64_t i = 0; i < count; ++i)
        static_cast<T*>(out)[i] = static_cast<T>(static_cast<T*>(out)[i] * scale);
  });
}

void movement(const ir::GraphNode& n, const Arr& x, void* out) {
  const size_t elem = dtype_size(n.dtype);
  const std::vector<int64_t> xs = strides_of(x.shape);
  switch (n.op) {
    case Op::Reshape:
      if (shape_numel(n.shape)) std::memcpy(out, x.data, shape_numel(n.shape) * elem);
      return;
    case Op::Permute: {
      std::vector<int64_t> st;
      for (int64_t a : n.attrs) st.push_back(xs[a]);
      return strided_copy(out, x.data, n.shape, st, 0, elem);
    }
    case Op::Expand: {
      std::vector<int64_t> st(n.shape.size(), 0);
      const size_t lead = n.shape.size() - x.shape.size();
      for (size_t d = 0; d < x.shape.size(); ++d) st[lead + d] = x.shape[d] == 1 ? 0 : xs[d];
      return strided_copy(out, x.data, n.shape, st, 0, elem);
    }
    case Op::Slice: {
      std::vector<int64_t> st = xs;
      const int64_t axis = n.attrs[0];
      st[axis] = xs[axis] * n.attrs[3];
      return strided_copy(out, x.data, n.shape, st, n.attrs[1] * xs[axis], elem);
    }
    default:
      break;
  }
  util::internal_fail(__FILE__, __LINE__, "ref: not a movement op");
}

void concat(const ir::GraphNode& n, const std::vector<Arr>& xs, void* out) {
  const size_t elem = dtype_size(n.dtype);
  const int64_t axis = n.attrs[0];
  int64_t outer = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= n.shape[d];
  int64_t inner = 1;
  for (size_t d = axis + 1; d < n.shape.size(); ++d) inner *= n.shape[d];
  const int64_t out_row = n.shape[axis] * inner;
  int64_t at = 0;
  for (const Arr& x : xs) {
    const int64_t row = x.shape[axis] * inner;
    for (int64_t o = 0; o < outer && row > 0; ++o)
      std::memcpy(static_cast<char*>(out) + (o * out_row + at) * elem,
                  static_cast<const char*>(x.data) + o * row * elem, row * elem);
    at += row;
  }
}

void pad(const ir::GraphNode& n, const Arr& x, const Arr& value, void* out) {
  const size_t elem = dtype_size(n.dtype);
  const int64_t out_n = shape_numel(n.shape);
  for (int64_t i = 0; i < out_n; ++i)
    std::memcpy(static_cast<char*>(out) + i * elem, value.data, elem);
  const std::vector<int64_t> os = strides_of(n.shape);
  int64_t base = 0;
  for (size_t d = 0; d < n.shape.size(); ++d) base += n.attrs[2 * d] * os[d];
  // Walk the input, writing into the interior of the output.
  const int64_t in_n = shape_numel(x.shape);
  IndexWalker w(x.shape, os, base);
  for (int64_t i = 0; i < in_n; ++i, w.next())
    std::memcpy(static_cast<char*>(out) + w.offset * elem,
                static_cast<const char*>(x.data) + i * elem, elem);
}

class RefExecutable final : public Executable {
 public:
  explicit RefExecutable(ir::Graph g) : g_(std::move(g)) {
    last_use_.assign(g_.nodes.size(), -1);
    for (size_t i = 0; i < g_.nodes.size(); ++i)
      for (int32_t o : g_.nodes[i].operands) last_use_[o] = static_cast<int32_t>(i);
    for (int32_t o : g_.outputs) last_use_[o] = static_cast<int32_t>(g_.nodes.size());
  }

  std::vector<std::shared_ptr<Storage>> run(const std::vector<std::shared_ptr<Storage>>& inputs,
                                            const std::vector<ir::ScalarValue>& scalars,
                                            const std::vector<bool>&,
                                            const std::function<void()>&) override {
    // Any node may fail at run time here, and ref never writes an input: the runtime keeps its
    // record of values to restore until the end.
    std::vector<std::shared_ptr<Storage>> values(g_.nodes.size());
    for (size_t i = 0; i < g_.nodes.size(); ++i) {
      const ir::GraphNode& n = g_.nodes[i];
      if (n.op == Op::Data) {
        values[i] = inputs.at(n.input);
      } else {
        std::vector<Arr> args;
        for (int32_t o : n.operands)
          args.push_back({values[o]->data(), g_.nodes[o].shape, g_.nodes[o].dtype});
        try {
          values[i] = alloc_host(static_cast<size_t>(shape_numel(n.shape)) * dtype_size(n.dtype));
          eval_node(n, args, scalars, values[i]->data());
        } catch (const InternalError&) {
          throw;
        } catch (const std::exception& e) {
          fail_at(n, e);  // ref never writes an input: nothing was overwritten
        }
      }
      for (int32_t o : n.operands)  // free what no later node needs
        if (last_use_[o] == static_cast<int32_t>(i)) values[o].reset();
    }
    std::vector<std::shared_ptr<Storage>> outs;
    for (int32_t o : g_.outputs) outs.push_back(values[o]);
    return outs;
  }

 private:
  ir::Graph g_;
  std::vector<int32_t> last_use_;
};

}  // namespace

namespace {
void eval_exact(const ir::GraphNode& n, const std::vector<Arr>& a,
                const std::vector<ir::ScalarValue>& scalars, void* out);
}  // namespace

// bf16 as its definition: operands widened to f32 (exactly), the op computed in f32, the result
// rounded to nearest even. Every other dtype goes straight to its kernel.
void eval_node(const ir::GraphNode& n, const std::vector<Arr>& a,
               const std::vector<ir::ScalarValue>& scalars, void* out) {
  bool any = n.dtype == DType::BF16;
  for (const Arr& x : a) any = any || x.dtype == DType::BF16;
  // (A bf16 draw is bf16 values from the start: see random_uniform_bf16.)
  if (!any || n.op == Op::RandomUniform) return eval_exact(n, a, scalars, out);
  std::vector<std::vector<float>> wide;
  std::vector<Arr> args = a;
  for (Arr& x : args) {
    if (x.dtype != DType::BF16) continue;
    const int64_t k = shape_numel(x.shape);
    std::vector<float>& w = wide.emplace_back(static_cast<size_t>(k));
    const bfloat16* src = static_cast<const bfloat16*>(x.data);
    for (int64_t i = 0; i < k; ++i) w[i] = static_cast<float>(src[i]);
    x = {w.data(), x.shape, DType::F32};
  }
  if (n.dtype != DType::BF16) return eval_exact(n, args, scalars, out);
  ir::GraphNode f = n;
  f.dtype = DType::F32;
  const int64_t count = shape_numel(n.shape);
  std::vector<float> result(static_cast<size_t>(std::max<int64_t>(count, 1)));
  eval_exact(f, args, scalars, result.data());
  bfloat16* dst = static_cast<bfloat16*>(out);
  for (int64_t i = 0; i < count; ++i) dst[i] = bfloat16(result[i]);
}

namespace {
void eval_exact(const ir::GraphNode& n, const std::vector<Arr>& a,
                const std::vector<ir::ScalarValue>& scalars, void* out) {
  const int64_t count = shape_numel(n.shape);
  switch (n.op) {
    case Op::Data:
      util::internal_fail(__FILE__, __LINE__, "data nodes are inputs");
    case Op::Scalar: {
      const ir::ScalarValue v = scalars.at(n.input);
      by_dtype<void>(n.dtype, [&](auto tag) {
        using T = decltype(tag);
        *static_cast<T*>(out) = kFloat<T> ? static_cast<T>(v.f) : static_cast<T>(v.i);
      });
      return;
    }
    case Op::Iota: {
      const std::vector<int64_t> st = strides_of(n.shape);
      const int64_t axis = n.attrs[0];
      by_dtype<void>(n.dtype, [&](auto tag) {
        using T = decltype(tag);
        for (int64_t i = 0; i < count; ++i)
          static_cast<T*>(out)[i] = static_cast<T>((i / st[axis]) % n.shape[axis]);
      });
      return;
    }
    case Op::RandomUniform: {
      const int64_t* state = a[0].as<int64_t>();
      const uint64_t seed = static_cast<uint64_t>(state[0]);
      const uint64_t counter = static_cast<uint64_t>(state[1]);
      for (int64_t i = 0; i < count; ++i) {
        const uint64_t c = counter + static_cast<uint64_t>(i);
        if (n.dtype == DType::F32)
          static_cast<float*>(out)[i] = ir::random_uniform_f32(seed, c);
        else if (n.dtype == DType::BF16)
          static_cast<bfloat16*>(out)[i] = bfloat16(ir::random_uniform_bf16(seed, c));  // exact
        else
          static_cast<double*>(out)[i] = ir::random_uniform_f64(seed, c);
      }
      return;
    }
#define LS_OP(name, arity, family, admits, props, user) LS_IF_ELEMENTWISE_##family(case Op::name:)
#include "ir/ops.def"
#undef LS_OP
      if (n.op == Op::Cast) return cast(a[0], n.dtype, out, count);
      // A select's operand 0 is its condition: its branches have the values' dtype.
      by_dtype<void>(a[ir::op_info(n.op).family == ir::OpFamily::Select ? 1 : 0].dtype,
                     [&](auto tag) { elementwise<decltype(tag)>(n.op, a, count, out); });
      return;
    case Op::Sum:
    case Op::Max:
    case Op::Min:
    case Op::ArgMax:
    case Op::ArgMin:
      return reduce(n, a[0], out);
    case Op::Reshape:
    case Op::Permute:
    case Op::Expand:
    case Op::Slice:
      return movement(n, a[0], out);
    case Op::Concat:
      return concat(n, a, out);
    case Op::Pad:
      return pad(n, a[0], a[1], out);
    case Op::Gather:
      return gather(n, a[0], a[1], out);
    case Op::ScatterAdd:
      return scatter_add(n, a[0], a[1], a[2], out);
    case Op::Argsort:
      return argsort(n, a[0], out);
    case Op::MatMul:
      return matmul(n, a[0], a[1], out);
    case Op::Conv2d:
      return conv2d(n, a[0], a[1], out);
    case Op::Conv2dBackwardInput:
      return conv2d_backward_input(n, a[0], a[1], out);
    case Op::Conv2dBackwardWeight:
      return conv2d_backward_weight(n, a[0], a[1], out);
    case Op::MaxPool2d:
      return max_pool2d(n, a[0], out, false);
    case Op::MaxPool2dIndices:
      return max_pool2d(n, a[0], out, true);
    case Op::MaxPool2dBackward:
      return max_pool2d_backward(n, a[0], a[1], out);
    case Op::AvgPool2d:
      return avg_pool2d(n, a[0], out);
    case Op::AvgPool2dBackward:
      return avg_pool2d_backward(n, a[0], out);
    case Op::Lstm:
      return lstm(n, a, out);
    case Op::LstmBackward:
      return lstm_backward(n, a, out);
    case Op::Gru:
      return gru(n, a, out);
    case Op::GruBackward:
      return gru_backward(n, a, out);
    case Op::AllReduce:
      return all_reduce(n, a[0], out);
    case Op::Broadcast:
      dist::detail::broadcast(out, a.back().data, static_cast<size_t>(count) * dtype_size(n.dtype),
                              static_cast<int>(ir::BroadcastAttrs::of(n.attrs).root),
                              util::cat("broadcast recorded at ", util::where(n.origin.loc)));
      return;
  }
  util::internal_fail(__FILE__, __LINE__, "ref: unknown op");
}
}  // namespace

namespace {

class RefBackend final : public Backend {
 public:
  std::string name() const override { return "ref"; }
  std::shared_ptr<Storage> alloc(size_t bytes) override { return alloc_host(bytes); }
  void copy_in(Storage& dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst.data(), src, bytes);  // empty tensors have null data
  }
  void copy_out(Storage& src, void* dst, size_t bytes) override {
    if (bytes) std::memcpy(dst, src.data(), bytes);
  }
  std::unique_ptr<Executable> compile(const ir::Graph& graph) override {
    return std::make_unique<RefExecutable>(graph);
  }
};

}  // namespace

void strided_copy(void* dst, const void* src, const Shape& out_shape,
                  const std::vector<int64_t>& src_strides, int64_t src_offset, size_t elem) {
  const int64_t n = shape_numel(out_shape);
  IndexWalker w(out_shape, src_strides, src_offset);
  for (int64_t i = 0; i < n; ++i, w.next())
    std::memcpy(static_cast<char*>(dst) + i * elem, static_cast<const char*>(src) + w.offset * elem,
                elem);
}

Backend& backend() {
  static RefBackend* b = new RefBackend;  // used by the runtime thread until the process ends
  return *b;
}

}  // namespace lockstep::backends::ref
