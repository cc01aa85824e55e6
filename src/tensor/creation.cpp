// Creation functions: constants as runtime scalars broadcast to a shape, host data uploads,
// index ramps, and the counter-based random generator whose state is a tensor.
#include <atomic>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <numbers>

#include "tensor/frontend.h"
#include "util/check.h"

namespace lockstep {

using frontend::make;
using frontend::node;
using ir::Op;
using util::cat;

namespace {

void check_shape(const Shape& shape, DType dtype, const char* op, const Loc& loc) {
  ir::check_size(shape, dtype, op, loc);
}

// The integer value `value`, unless `bad` (bool, broadcast to its shape) holds true somewhere:
// then the run that computes it fails with `reason`'s text (an Op::Check), as an index out of
// range does: checked when the program runs, without a sync when it is recorded.
Tensor checked(const Tensor& value, const Tensor& bad, ir::CheckReason reason, const Loc& loc) {
  const DType t = value.dtype();
  const Tensor code = mul(cast(expand(bad, value.shape(), loc), t, loc), int64_t{reason}, loc);
  return frontend::record(Op::Check, {node(value, "check", loc), node(code, "check", loc)}, {},
                          loc);
}

}  // namespace

Tensor full(const Shape& shape, Scalar value, TensorOptions options, Loc loc) {
  check_shape(shape, options.dtype, "full", loc);
  const Device device = frontend::device_of(options);
  backends::backend_for(device);
  ir::NodePtr s = frontend::scalar_node(value, options.dtype, device, "full", loc);
  return runtime::new_tensor(frontend::expand_to(s, shape, loc));
}

Tensor zeros(const Shape& shape, TensorOptions options, Loc loc) {
  return full(shape, 0, options, loc);
}
Tensor ones(const Shape& shape, TensorOptions options, Loc loc) {
  return full(shape, 1, options, loc);
}
Tensor scalar_tensor(Scalar value, TensorOptions options, Loc loc) {
  return full({}, value, options, loc);
}

Tensor full_like(const Tensor& t, Scalar value, Loc loc) {
  const ir::NodePtr& n = node(t, "full_like", loc);
  return full(n->shape, value, TensorOptions(n->dtype, n->device), loc);
}
Tensor zeros_like(const Tensor& t, Loc loc) { return full_like(t, 0, loc); }
Tensor ones_like(const Tensor& t, Loc loc) { return full_like(t, 1, loc); }

namespace {

// arange(end) is the index ramp itself, with no host scalars: a constant the compiler can fold
// (a table computed from it is computed once, at compile time). arange(start, end, step) keeps
// start and step as runtime scalars, so changing them never recompiles.
Tensor arange_of(Scalar start, Scalar end, Scalar step, TensorOptions options, Loc loc,
                 bool ramp_only) {
  if (options.dtype == DType::Bool)
    util::fail(loc, "arange", "cannot count in bool", "Use an integer or floating dtype");
  if (step.to_double() == 0) util::fail(loc, "arange", "step is 0", "Use a non-zero step");
  const double span = (end.to_double() - start.to_double()) / step.to_double();
  if (!std::isfinite(span))
    util::fail(loc, "arange", "start, end and step give no finite length", "Use finite bounds");
  // Converting a length beyond int64 would be undefined; anything near it could never be stored.
  if (span >= 9.0e18)
    util::fail(loc, "arange", cat("start, end and step give ", span, " elements"),
               "Use a larger step or a smaller range");
  const int64_t n = std::max<int64_t>(0, static_cast<int64_t>(std::ceil(span)));
  const Device device = frontend::device_of(options);
  const DType dt = options.dtype;
  ir::NodePtr ramp = ir::make_leaf(Op::Iota, {0}, {n}, dt, device, loc);
  if (ramp_only) return runtime::new_tensor(std::move(ramp));
  ir::NodePtr st =
      frontend::expand_to(frontend::scalar_node(step, dt, device, "arange", loc), {n}, loc);
  ir::NodePtr s0 =
      frontend::expand_to(frontend::scalar_node(start, dt, device, "arange", loc), {n}, loc);
  return frontend::record(Op::Add, {make(Op::Mul, {ramp, st}, {}, loc), s0}, {}, loc);
}

}  // namespace

Tensor arange(Scalar end, TensorOptions options, Loc loc) {
  return arange_of(0, end, 1, options, loc, true);
}
Tensor arange(Scalar start, Scalar end, Scalar step, TensorOptions options, Loc loc) {
  return arange_of(start, end, step, options, loc, false);
}

Tensor from_blob(const void* data, const Shape& shape, DType dtype, Device device, Loc loc) {
  check_shape(shape, dtype, "from_blob", loc);
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  if (bytes && !data)
    util::fail(loc, "from_blob", "data is null", "Pass a pointer to the host values");
  return runtime::new_tensor(
      ir::make_data(runtime::upload(device, data, bytes), shape, dtype, device, loc));
}

template <typename T>
Tensor from_vector(const std::vector<T>& data, const Shape& shape, Device device, Loc loc) {
  const Shape s = shape.empty() ? Shape{static_cast<int64_t>(data.size())} : shape;
  check_shape(s, dtype_of<T>(), "from_vector", loc);
  if (shape_numel(s) != static_cast<int64_t>(data.size()))
    util::fail(loc, "from_vector",
               cat(data.size(), " values do not fill shape ", shape_str(s), " (", shape_numel(s),
                   " elements)"),
               "Pass as many values as the shape holds, or an empty shape for 1-d");
  if constexpr (std::is_same_v<T, bool>) {
    std::vector<unsigned char> bytes(data.begin(), data.end());
    return from_blob(bytes.data(), s, DType::Bool, device, loc);
  } else {
    return from_blob(data.data(), s, dtype_of<T>(), device, loc);
  }
}

template Tensor from_vector<float>(const std::vector<float>&, const Shape&, Device, Loc);
template Tensor from_vector<double>(const std::vector<double>&, const Shape&, Device, Loc);
template Tensor from_vector<int32_t>(const std::vector<int32_t>&, const Shape&, Device, Loc);
template Tensor from_vector<int64_t>(const std::vector<int64_t>&, const Shape&, Device, Loc);
template Tensor from_vector<bool>(const std::vector<bool>&, const Shape&, Device, Loc);

// ---- random --------------------------------------------------------------------------------
namespace {

// Each thread has its own generator (a state tensor per device), so threads that train their own
// models draw without sharing a tensor. A thread's generator starts from the seed of the last
// manual_seed call made anywhere before its first draw (0 if none); manual_seed reseeds the
// calling thread's generator.
std::atomic<uint64_t> g_default_seed{0};

struct Generators {
  uint64_t seed = g_default_seed.load();
  std::map<std::pair<int, int>, Tensor> state;  // per device
};

Generators& gens() {
  thread_local Generators g;
  return g;
}

Tensor make_state(uint64_t seed, Device device) {
  const int64_t v[2] = {static_cast<int64_t>(seed), 0};
  // Not a tensor of any step: a step that first draws random numbers must not poison the
  // generator if it rolls back.
  return runtime::new_tensor(
      ir::make_data(runtime::upload(device, v, sizeof v), {2}, DType::I64, device), false);
}

Tensor& state_for(Device device) {
  Generators& g = gens();
  auto key = std::make_pair(static_cast<int>(device.kind), device.index);
  auto it = g.state.find(key);
  if (it == g.state.end()) it = g.state.emplace(key, make_state(g.seed, device)).first;
  return it->second;
}

// Draws uniform [0, 1) numbers of `shape` and advances the generator by their count.
ir::NodePtr draw_uniform(const Shape& shape, DType dtype, Device device, const char* op,
                         const Loc& loc) {
  check_shape(shape, dtype, op, loc);
  if (!is_floating(dtype))
    util::fail(loc, op, cat("random values must be floating-point, not ", dtype_name(dtype)),
               "Use ls::f32 or ls::f64 (ls::randint for integers)");
  Tensor& state = state_for(device);
  const ir::NodePtr& sn = node(state, op, loc);
  ir::NodePtr u = make(Op::RandomUniform, {sn}, {}, loc, shape, dtype);
  // state + [0, numel]: the count is a runtime scalar, so draws of any size share programs.
  ir::NodePtr ramp = ir::make_leaf(Op::Iota, {0}, {2}, DType::I64, device, loc);
  ir::NodePtr n = frontend::expand_to(
      frontend::scalar_node(shape_numel(shape), DType::I64, device, op, loc), {2}, loc);
  runtime::set_value(*state.impl(),
                     make(Op::Add, {sn, make(Op::Mul, {ramp, n}, {}, loc)}, {}, loc));
  return u;
}

}  // namespace

void manual_seed(uint64_t seed) {
  g_default_seed.store(seed);
  Generators& g = gens();
  g.seed = seed;
  std::vector<std::pair<Device, Tensor*>> states;
  for (auto& [key, t] : g.state)
    states.push_back({Device{static_cast<DeviceKind>(key.first), key.second}, &t});
  for (auto& [device, t] : states) {
    Tensor fresh = make_state(seed, device);
    runtime::set_value(*t->impl(), runtime::current_node(*fresh.impl()), "manual_seed");
  }
}

Tensor& generator_state() { return state_for(default_device()); }

Tensor rand(const Shape& shape, TensorOptions options, Loc loc) {
  const Device device = frontend::device_of(options);
  return runtime::new_tensor(draw_uniform(shape, options.dtype, device, "rand", loc));
}

Tensor randn(const Shape& shape, TensorOptions options, Loc loc) {
  // Box-Muller: z = sqrt(-2 log(1 - u1)) cos(2 pi u2), from one draw of shape [2, ...].
  const Device device = frontend::device_of(options);
  Shape two = shape;
  two.insert(two.begin(), 2);
  Tensor u = runtime::new_tensor(draw_uniform(two, options.dtype, device, "randn", loc));
  Tensor u1 = squeeze(slice(u, 0, 0, 1, 1, loc), 0, loc);
  Tensor u2 = squeeze(slice(u, 0, 1, 2, 1, loc), 0, loc);
  Tensor r = sqrt(mul(log(sub(1.0, u1, loc), loc), -2.0, loc), loc);
  return mul(r, cos(mul(u2, 2.0 * std::numbers::pi, loc), loc), loc);
}

Tensor rand_like(const Tensor& t, Loc loc) {
  const ir::NodePtr& n = node(t, "rand_like", loc);
  return rand(n->shape, TensorOptions(n->dtype, n->device), loc);
}
Tensor randn_like(const Tensor& t, Loc loc) {
  const ir::NodePtr& n = node(t, "randn_like", loc);
  return randn(n->shape, TensorOptions(n->dtype, n->device), loc);
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions options, Loc loc) {
  if (high <= low)
    util::fail(loc, "randint", cat("empty range [", low, ", ", high, ")"), "Pass low < high");
  if (!is_integral(options.dtype))
    util::fail(loc, "randint", cat("dtype must be u8, i32 or i64, got ", dtype_name(options.dtype)),
               "Use ls::rand for floating-point values");
  if (options.dtype == DType::I32 && (low < INT32_MIN || high - 1 > INT32_MAX))
    util::fail(loc, "randint", cat("range [", low, ", ", high, ") does not fit in i32"),
               "Use ls::i64, or a range within i32");
  if (options.dtype == DType::U8 && (low < 0 || high - 1 > 255))
    util::fail(loc, "randint", cat("range [", low, ", ", high, ") does not fit in u8"),
               "Use ls::i64, or a range within [0, 256)");
  const Device device = frontend::device_of(options);
  Tensor u = runtime::new_tensor(draw_uniform(shape, DType::F64, device, "randint", loc));
  // u scaled to the width w of the range and floored is an integral offset in [0, w) (for
  // w > 2^53 the rounding of w to double can reach w itself: clamped below). The offset is added
  // to low in integer arithmetic, so that a range far from 0 stays exact; w itself may not fit
  // in int64 (the full range), so it is computed unsigned.
  const uint64_t w = static_cast<uint64_t>(high) - static_cast<uint64_t>(low);
  Tensor off = floor(mul(u, static_cast<double>(w), loc), loc);
  Tensor r;
  if (w <= uint64_t{1} << 63) {
    r = add(cast(off, DType::I64, loc), low, loc);
  } else {  // low < 0 < high: shift the offset into int64 and add with wrap-around
    const auto low_shifted = static_cast<int64_t>(static_cast<uint64_t>(low) + (uint64_t{1} << 63));
    r = add(cast(sub(off, 9223372036854775808.0, loc), DType::I64, loc), low_shifted, loc);
  }
  if (w > uint64_t{1} << 53) r = minimum(r, high - 1, loc);
  return cast(r, options.dtype, loc);
}

Tensor bernoulli(const Tensor& p, Loc loc) {
  const ir::NodePtr& n = node(p, "bernoulli", loc);
  if (!is_floating(n->dtype))
    util::fail(loc, "bernoulli",
               cat("probabilities must be floating-point, got ", dtype_name(n->dtype)),
               "Cast them with .to(ls::f32)");
  Tensor u = runtime::new_tensor(draw_uniform(n->shape, DType::F64, n->device, "bernoulli", loc));
  const Tensor p64 = cast(p, DType::F64, loc);
  // NaN is neither >= 0 nor <= 1.
  const Tensor bad = logical_not(logical_and(ge(p64, 0.0, loc), le(p64, 1.0, loc), loc), loc);
  const Tensor draw = cast(lt(u, p64, loc), DType::I32, loc);
  return cast(checked(draw, bad, ir::kCheckProbabilities, loc), n->dtype, loc);
}

Tensor bernoulli(const Tensor& x, double p, Loc loc) {
  const ir::NodePtr& n = node(x, "bernoulli", loc);
  if (!(p >= 0 && p <= 1))
    util::fail(loc, "bernoulli", cat("p = ", p, " is not a probability"), "Pass 0 <= p <= 1");
  const DType dtype = is_floating(n->dtype) ? n->dtype : DType::F32;
  Tensor u = runtime::new_tensor(draw_uniform(n->shape, DType::F64, n->device, "bernoulli", loc));
  return cast(lt(u, p, loc), dtype, loc);
}

Tensor multinomial(const Tensor& weights, int64_t num_samples, bool replacement, Loc loc) {
  const ir::NodePtr& n = node(weights, "multinomial", loc);
  if (!is_floating(n->dtype))
    util::fail(loc, "multinomial",
               cat("weights must be floating-point, got ", dtype_name(n->dtype)),
               "Cast them with .to(ls::f32)");
  if (n->shape.size() != 1 && n->shape.size() != 2)
    util::fail(loc, "multinomial", cat("weights must be [K] or [B, K], got ", shape_str(n->shape)),
               "Flatten the leading axes into one");
  const int64_t k = n->shape.back();
  if (k == 0)
    util::fail(loc, "multinomial", "weights have no category (K = 0)", "Pass K >= 1 weights");
  if (num_samples <= 0)
    util::fail(loc, "multinomial", cat("num_samples = ", num_samples, " must be positive"), "");
  if (!replacement && num_samples > k)
    util::fail(
        loc, "multinomial",
        cat("cannot draw ", num_samples, " samples without replacement from ", k, " categories"),
        "Draw at most K, or pass replacement = true");
  const bool one_row = n->shape.size() == 1;
  const int64_t rows = one_row ? 1 : n->shape[0];
  const Tensor w = reshape(cast(weights, DType::F64, loc), {rows, k}, loc);
  // PyTorch's argument checks, at run time: every weight finite and >= 0, each row's sum > 0.
  const Tensor bad_weight = logical_not(logical_and(isfinite(w, loc), ge(w, 0.0, loc), loc), loc);
  const Tensor bad_row =
      logical_or(gt(sum(cast(bad_weight, DType::I64, loc), {1}, true, loc), int64_t{0}, loc),
                 le(sum(w, {1}, true, loc), 0.0, loc), loc);
  Tensor out;
  if (replacement) {
    // Inverse transform: the category is how many cumulative weights lie at or below
    // u * total (zero-weight categories share their predecessor's sum and are skipped).
    const Tensor cdf = cumsum(w, 1, loc);
    const Tensor total = slice(cdf, 1, k - 1, k, 1, loc);
    Tensor u = runtime::new_tensor(
        draw_uniform({rows, num_samples}, DType::F64, n->device, "multinomial", loc));
    u = mul(u, expand(total, {rows, num_samples}, loc), loc);
    const Tensor below = le(expand(unsqueeze(cdf, 1, loc), {rows, num_samples, k}, loc),
                            expand(unsqueeze(u, 2, loc), {rows, num_samples, k}, loc), loc);
    out = minimum(sum(cast(below, DType::I64, loc), {2}, false, loc), k - 1, loc);
  } else {
    // PyTorch's way: the largest weight / E with E ~ Exp(1) per category is a draw, the next
    // largest the draw after it without replacement, and so on.
    Tensor u =
        runtime::new_tensor(draw_uniform({rows, k}, DType::F64, n->device, "multinomial", loc));
    const Tensor keys = div(w, neg(log1p(neg(u, loc), loc), loc), loc);
    out = num_samples == 1 ? argmax(keys, {1}, true, loc)
                           : slice(argsort(keys, 1, true, loc), 1, 0, num_samples, 1, loc);
  }
  out = checked(out, bad_row, ir::kCheckWeights, loc);
  return one_row ? reshape(out, {num_samples}, loc) : out;
}

}  // namespace lockstep
