// The fuzzer's random graph builder, part one (elementwise, masks, reductions, movement,
// indexing, and the loop that builds a graph); see fuzz_graph.h. Each op family is one function
// that picks operands among the values built so far (or fresh inputs), checks the shape rules
// itself and returns false when it cannot apply, so only valid graphs are recorded.
#include "fuzz_graph.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace conformance {
namespace {

namespace ls = lockstep;

bool broadcast(const ls::Shape& a, const ls::Shape& b, ls::Shape* out) {
  const size_t r = std::max(a.size(), b.size());
  out->assign(r, 1);
  for (size_t i = 0; i < r; ++i) {
    const int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    const int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da != db && da != 1 && db != 1) return false;
    (*out)[i] = da == 1 ? db : da;
  }
  return ls::shape_numel(*out) <= kFuzzMaxNumel;
}

}  // namespace

FuzzGraph::FuzzGraph(uint64_t seed, ls::DType dtype, ls::Device device)
    : rng_(seed), seed_(seed), dtype_(dtype), device_(device) {}

int64_t FuzzGraph::uni(int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
}
bool FuzzGraph::coin(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }

size_t FuzzGraph::pick(bool exact_only) {
  std::vector<size_t> c;
  for (size_t i = 0; i < values_.size(); ++i)
    if (!exact_only || values_[i].exact) c.push_back(i);
  if (c.empty()) return SIZE_MAX;
  if (coin(0.6))
    return c[c.size() - 1 - static_cast<size_t>(uni(0, std::min<int64_t>(3, c.size() - 1)))];
  return c[static_cast<size_t>(uni(0, static_cast<int64_t>(c.size()) - 1))];
}

FuzzValue FuzzGraph::input(const Shape& shape, double lo, double hi) {
  // Values rounded to f32, so the f32 and f64 graphs start from the same numbers.
  std::mt19937_64 r(seed_ * 1000003 + static_cast<uint64_t>(inputs_++));
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(static_cast<size_t>(ls::shape_numel(shape)));
  for (double& x : v) x = static_cast<double>(static_cast<float>(u(r)));
  ls::Tensor t;
  if (dtype_ == ls::f32) {
    std::vector<float> f(v.begin(), v.end());
    t = ls::from_vector<float>(f, shape, device_);
  } else {
    t = ls::from_vector<double>(v, shape, device_);
  }
  return {t, true, 0, std::max(std::abs(lo), std::abs(hi))};
}

ls::Tensor FuzzGraph::index_input(const Shape& shape, int64_t n) {
  std::mt19937_64 r(seed_ * 1000003 + static_cast<uint64_t>(inputs_++));
  std::vector<int64_t> v(static_cast<size_t>(ls::shape_numel(shape)));
  for (int64_t& x : v) x = std::uniform_int_distribution<int64_t>(0, n - 1)(r);
  return ls::from_vector<int64_t>(v, shape, device_);
}

void FuzzGraph::add(FuzzValue v, const std::string& what) {
  if (v.exact) v.err = 0;
  if (v.bound > 1e4) {  // keep magnitudes where f32 has room (tanh: vector math, see unary)
    v.t = ls::tanh(v.t);
    v.bound = 1;
    v.exact = false;
    v.err += 10;
  }
  log_ += "  v" + std::to_string(values_.size()) + " = " + what + " -> " +
          ls::dtype_name(v.t.dtype()) + ls::shape_str(v.t.shape()) + (v.exact ? " exact" : "") +
          "\n";
  values_.push_back(std::move(v));
  ++ops_;
}

FuzzValue FuzzGraph::squashed(const FuzzValue& v) {
  if (v.bound <= 8) return v;
  return {ls::tanh(v.t), false, v.err + 10, 1};  // vector math, as in unary
}

ls::Shape FuzzGraph::random_shape(int max_rank) {
  static const int64_t dims[] = {1, 1, 2, 3, 4, 5, 7, 8, 13, 17};
  Shape s(static_cast<size_t>(uni(0, max_rank)));
  for (int64_t& d : s) d = coin(0.03) ? 0 : dims[uni(0, 9)];
  while (ls::shape_numel(s) > 2048)
    for (int64_t& d : s) d = std::max<int64_t>(1, d / 2);
  return s;
}

ls::Shape FuzzGraph::broadcast_partner(const Shape& a) {
  Shape b = a;
  for (int64_t& d : b)
    if (coin(0.35)) d = 1;
  if (!b.empty() && coin(0.3))
    b.erase(b.begin(), b.begin() + uni(1, static_cast<int64_t>(b.size())));
  if (coin(0.15))  // b stretches a's size-1 dims
    for (size_t i = 0; i < b.size(); ++i)
      if (a[a.size() - b.size() + i] == 1 && coin(0.7)) b[i] = uni(2, 3);
  return b;
}

bool FuzzGraph::unary() {
  const FuzzValue a = values_[pick()];
  int64_t op = uni(0, 14);
  if (!a.exact && op >= 11 && op <= 13) op = 0;  // floor/ceil/sign only of exact values
  if (op == 14 && a.bound > 100) op = 1;
  const double b = a.bound;
  // Each op: its result, a bound on |derivative| and a bound on the result.
  struct Unary {
    const char* name;
    ls::Tensor t;
    double slope, bound;
  };
  const auto [name, t, slope, bound] = [&]() -> Unary {
    switch (op) {
      case 0:
        return {"tanh", ls::tanh(a.t), 1, 1};
      case 1:
        return {"sigmoid", ls::sigmoid(a.t), 0.25, 1};
      case 2:
        return {"sin", ls::sin(a.t), 1, 1};
      case 3:
        return {"cos", ls::cos(a.t), 1, 1};
      case 4:
        return {"abs", ls::abs(a.t), 1, b};
      case 5:
        return {"neg", ls::neg(a.t), 1, b};
      case 6:
        return {"relu", ls::relu(a.t), 1, b};
      case 7:
        return {"exp(tanh)", ls::exp(ls::tanh(a.t)), 2.8, 3};
      case 8:
        return {"log(abs+1)", ls::log(ls::abs(a.t) + 1.0), 1, std::log(b + 1) + 1};
      case 9:
        return {"sqrt(abs+0.1)", ls::sqrt(ls::abs(a.t) + 0.1), 1.6, std::sqrt(b + 0.1) + 1};
      case 10:
        return {"rsqrt(abs+0.5)", ls::rsqrt(ls::abs(a.t) + 0.5), 1.5, 1.5};
      case 11:
        return {"floor(2x)", ls::floor(a.t * 2.0), 0, 2 * b + 1};
      case 12:
        return {"ceil", ls::ceil(a.t), 0, b + 1};
      case 13:
        return {"sign", ls::sign(a.t), 0, 1};
      default:
        return {"square", ls::square(a.t), 2 * b, b * b};
    }
  }();
  // The operand's error through the slope, plus a rounding of each op at either end. The
  // transcendental functions are not exact: cpu computes them with glibc's vector math, within
  // 4 ulp (8 units of the result's bound) of ref's scalar libm.
  const bool vector_math = op <= 3 || op == 7 || op == 8;
  add({t, a.exact && !vector_math, slope * (a.err + 2 * b) + (vector_math ? 10 : 2) * bound, bound},
      name);
  return true;
}

bool FuzzGraph::binary() {
  FuzzValue a = values_[pick()];
  FuzzValue b;
  bool scalar = false;
  const double s = static_cast<float>(std::uniform_real_distribution<double>(-2, 2)(rng_));
  Shape out;
  if (coin(0.25)) {
    scalar = true;
    b.bound = std::abs(s);
    out = a.t.shape();
  } else {
    std::vector<size_t> partners;
    for (size_t i = 0; i < values_.size(); ++i)
      if (broadcast(a.t.shape(), values_[i].t.shape(), &out)) partners.push_back(i);
    if (!partners.empty() && coin(0.5)) {
      b = values_[partners[static_cast<size_t>(uni(0, static_cast<int64_t>(partners.size()) - 1))]];
    } else {
      const Shape bs = broadcast_partner(a.t.shape());
      if (!broadcast(a.t.shape(), bs, &out)) return false;
      b = input(bs);
    }
    broadcast(a.t.shape(), b.t.shape(), &out);
  }
  const int64_t op = uni(0, 6);
  if (op == 2 && a.bound * b.bound > 1e4) {
    a = squashed(a);
    b = scalar ? b : squashed(b);
  }
  FuzzValue r{{}, a.exact && b.exact, 0, 0};
  const char* name = "";
  switch (op) {
    case 0:
      r.t = scalar ? a.t + s : a.t + b.t;
      r.bound = a.bound + b.bound, name = "add";
      r.err = a.err + b.err + r.bound;
      break;
    case 1:
      r.t = scalar ? s - a.t : a.t - b.t;
      r.bound = a.bound + b.bound, name = "sub";
      r.err = a.err + b.err + r.bound;
      break;
    case 2:
      r.t = scalar ? a.t * s : a.t * b.t;
      r.bound = std::max(1.0, a.bound * b.bound), name = "mul";
      r.err = a.err * b.bound + b.err * a.bound + a.err * b.err + r.bound;
      break;
    case 3:
      r.t = scalar ? ls::maximum(a.t, s) : ls::maximum(a.t, b.t);
      r.bound = std::max(a.bound, b.bound), name = "maximum";
      r.err = std::max(a.err, b.err);
      break;
    case 4:
      r.t = scalar ? ls::minimum(s, a.t) : ls::minimum(a.t, b.t);
      r.bound = std::max(a.bound, b.bound), name = "minimum";
      r.err = std::max(a.err, b.err);
      break;
    case 5:  // |divisor| >= 1
      r.t = scalar ? a.t / (std::abs(s) + 1) : a.t / (ls::abs(b.t) + 1.0);
      r.bound = a.bound, name = "div";
      r.err = a.err + a.bound * (b.err + b.bound + 1) + 3 * r.bound;
      break;
    default:  // positive base, bounded exponent
      r.t = scalar ? ls::pow(ls::abs(a.t) + 0.5, std::clamp(s, -2.0, 2.0))
                   : ls::pow(ls::abs(a.t) + 0.5, ls::clamp(b.t, -2.0, 2.0));
      r.bound = std::max(4.0, (a.bound + 0.5) * (a.bound + 0.5)), name = "pow";
      // d/dbase = e base^(e-1) <= 2 max(base, 8); d/de = base^e ln(base).
      r.err = 2 * std::max(a.bound + 0.5, 8.0) * (a.err + a.bound + 1) +
              r.bound * std::max(std::log(a.bound + 0.5), 0.7) * b.err + 3 * r.bound;
      break;
  }
  std::string what = name;
  what += scalar ? std::string(" with a scalar") : ls::shape_str(b.t.shape());
  add(r, what);
  return true;
}

bool FuzzGraph::mask() {
  const size_t ai = pick(true);
  if (ai == SIZE_MAX) return false;
  const FuzzValue a = values_[ai];
  const double s = static_cast<float>(std::uniform_real_distribution<double>(-1, 1)(rng_));
  std::vector<size_t> partners;
  Shape out;
  for (size_t i = 0; i < values_.size(); ++i)
    if (values_[i].exact && broadcast(a.t.shape(), values_[i].t.shape(), &out))
      partners.push_back(i);
  const bool use_value = coin(0.5) && !partners.empty();
  const ls::Tensor other = use_value ? values_[partners[static_cast<size_t>(uni(
                                                   0, static_cast<int64_t>(partners.size()) - 1))]]
                                           .t
                                     : ls::full_like(a.t, s);
  ls::Tensor cond;
  switch (uni(0, 5)) {
    case 0:
      cond = a.t > other;
      break;
    case 1:
      cond = a.t < other;
      break;
    case 2:
      cond = a.t >= s;
      break;
    case 3:
      cond = a.t <= other;
      break;
    case 4:
      cond = a.t == ls::floor(other);
      break;
    default:
      cond = a.t != other;
      break;
  }
  if (coin(0.3)) cond = !cond;
  if (coin(0.3)) cond = coin(0.5) ? (cond && (a.t > 0.0)) : (cond || (a.t < -0.5));
  if (coin(0.3)) outputs_.push_back({cond, true, 0, 1});
  switch (uni(0, 2)) {
    case 0: {
      const FuzzValue x = values_[pick()];
      if (!broadcast(cond.shape(), x.t.shape(), &out)) return false;
      add({ls::where(cond, x.t, a.t), x.exact && a.exact, std::max(x.err, a.err),
           std::max(x.bound, a.bound)},
          "where(mask, v, v)");
      return true;
    }
    case 1:
      add({ls::cast(cond, dtype_), true, 0, 1}, "cast(mask)");
      return true;
    default:
      add({ls::where(cond, s, a.t), a.exact, a.err, std::max(a.bound, 1.0)}, "where(mask, s, v)");
  }
  return true;
}

bool FuzzGraph::reduce() {
  const FuzzValue a = values_[pick()];
  const Shape& s = a.t.shape();
  std::vector<int64_t> axes;
  for (size_t d = 0; d < s.size(); ++d)
    if (coin(0.5)) axes.push_back(static_cast<int64_t>(d));
  const bool keep = coin(0.5);
  double n = 1;
  bool empty = false;
  for (size_t d = 0; d < s.size(); ++d)
    if (axes.empty() ||
        std::find(axes.begin(), axes.end(), static_cast<int64_t>(d)) != axes.end()) {
      n *= static_cast<double>(s[d]);
      empty = empty || s[d] == 0;
    }
  int64_t op = uni(0, 4);
  if (empty || (op == 4 && !a.exact)) op = op == 1 ? 1 : 0;
  const std::string what = " axes " + ls::shape_str(axes) + (keep ? " keepdim" : "");
  switch (op) {
    case 0:
      add({ls::sum(a.t, axes, keep), false, n * a.err + accumulation_error(n, a.bound),
           a.bound * std::max(n, 1.0)},
          "sum" + what);
      break;
    case 1:
      add({ls::mean(a.t, axes, keep), false,
           a.err + accumulation_error(n, a.bound) / std::max(n, 1.0) + 2 * a.bound, a.bound},
          "mean" + what);
      break;
    case 2:
      add({ls::max(a.t, axes, keep), a.exact, a.err, a.bound}, "max" + what);
      break;
    case 3:
      add({ls::min(a.t, axes, keep), a.exact, a.err, a.bound}, "min" + what);
      break;
    default: {
      const ls::Tensor i = coin(0.5) ? ls::argmax(a.t, axes, keep) : ls::argmin(a.t, axes, keep);
      if (coin(0.3)) outputs_.push_back({i, true, 0, n});
      add({ls::cast(i, dtype_), true, 0, std::max(n, 1.0)}, "argmax/argmin" + what);
    }
  }
  return true;
}

bool FuzzGraph::movement() {
  const FuzzValue a = values_[pick()];
  const Shape s = a.t.shape();
  const int64_t r = static_cast<int64_t>(s.size());
  FuzzValue v = a;
  switch (uni(0, 6)) {
    case 0: {  // reshape: flatten, split a dim, merge two, or add a size-1 dim
      Shape t = s;
      const int64_t how = uni(0, 3);
      if (how == 0 || r == 0) {
        t = {ls::shape_numel(s)};
      } else if (how == 1) {
        const int64_t d = uni(0, r - 1);
        const int64_t f = s[d] % 2 == 0 ? 2 : s[d] % 3 == 0 ? 3 : 1;
        t[d] = s[d] / f;
        t.insert(t.begin() + d, f);
      } else if (how == 2 && r >= 2) {
        const int64_t d = uni(0, r - 2);
        t[d] *= t[d + 1];
        t.erase(t.begin() + d + 1);
      } else {
        t.insert(t.begin() + uni(0, r), 1);
      }
      v.t = ls::reshape(a.t, t);
      add(v, "reshape");
      return true;
    }
    case 1: {
      if (r < 2) return false;
      std::vector<int64_t> p(static_cast<size_t>(r));
      std::iota(p.begin(), p.end(), 0);
      std::shuffle(p.begin(), p.end(), rng_);
      v.t = ls::permute(a.t, p);
      add(v, "permute " + ls::shape_str(p));
      return true;
    }
    case 2: {
      if (r < 2) return false;
      const int64_t i = uni(0, r - 1), j = (i + uni(1, r - 1)) % r;
      v.t = ls::transpose(a.t, i, j);
      add(v, "transpose");
      return true;
    }
    case 3: {
      Shape t = s;
      for (int64_t& d : t)
        if (d == 1 && coin(0.5)) d = uni(2, 4);
      if (coin(0.4)) t.insert(t.begin(), uni(1, 3));
      if (t == s || ls::shape_numel(t) > kFuzzMaxNumel) return false;
      v.t = ls::expand(a.t, t);
      add(v, "expand");
      return true;
    }
    case 4: {
      if (r == 0) return false;
      const int64_t axis = uni(0, r - 1), n = s[axis];
      const int64_t start = uni(-n - 1, n), end = uni(-n - 1, n + 1), step = uni(1, 3);
      v.t = ls::slice(a.t, axis, start, end, step);
      add(v, "slice axis " + std::to_string(axis) + " " + ls::shape_str({start, end, step}));
      return true;
    }
    case 5: {
      if (r == 0) return false;
      const int64_t axis = uni(0, r - 1);
      std::vector<size_t> partners;
      for (size_t i = 0; i < values_.size(); ++i) {
        const Shape& o = values_[i].t.shape();
        bool ok = o.size() == s.size();
        for (int64_t d = 0; ok && d < r; ++d) ok = d == axis || o[d] == s[d];
        if (ok && ls::shape_numel(s) * 2 + ls::shape_numel(o) <= kFuzzMaxNumel)
          partners.push_back(i);
      }
      if (partners.empty()) return false;
      const FuzzValue& b =
          values_[partners[static_cast<size_t>(uni(0, static_cast<int64_t>(partners.size()) - 1))]];
      const bool three = coin(0.5);
      v.t = three ? ls::concat({a.t, b.t, a.t}, axis) : ls::concat({b.t, a.t}, axis);
      v.exact = a.exact && b.exact;
      v.err = std::max(a.err, b.err);
      v.bound = std::max(a.bound, b.bound);
      add(v, "concat axis " + std::to_string(axis));
      return true;
    }
    default: {
      std::vector<std::pair<int64_t, int64_t>> pads;
      Shape t = s;
      for (int64_t d = 0; d < r; ++d) {
        pads.push_back({uni(0, 2), uni(0, 2)});
        t[d] += pads.back().first + pads.back().second;
      }
      if (ls::shape_numel(t) > kFuzzMaxNumel) return false;
      const double value = static_cast<float>(std::uniform_real_distribution<double>(-1, 1)(rng_));
      v.t = ls::pad(a.t, pads, value);
      v.bound = std::max(a.bound, 1.0);
      add(v, "pad");
      return true;
    }
  }
}

bool FuzzGraph::indexing() {
  const FuzzValue a = values_[pick()];
  const Shape& s = a.t.shape();
  if (s.empty()) return false;
  const int64_t axis = uni(0, static_cast<int64_t>(s.size()) - 1), n = s[axis];
  if (n == 0) return false;
  Shape is = s;
  for (size_t d = 0; d < s.size(); ++d)
    is[d] = static_cast<int64_t>(d) == axis ? uni(1, 5) : s[d] == 0 ? 0 : uni(1, s[d]);
  if (ls::shape_numel(is) > kFuzzMaxNumel) return false;
  const ls::Tensor index = index_input(is, n);
  if (coin(0.5)) {
    add({ls::gather(a.t, axis, index), a.exact, a.err, a.bound},
        "gather axis " + std::to_string(axis));
  } else {
    const FuzzValue src = input(is);
    const double n = static_cast<double>(is[axis]) + 1;
    add({ls::scatter_add(a.t, axis, index, src.t), false,
         a.err + accumulation_error(n, std::max(a.bound, 2.0)), a.bound + 2 * n},
        "scatter_add axis " + std::to_string(axis));
  }
  return true;
}

void FuzzGraph::build() {
  const int64_t first = uni(1, 3);
  for (int64_t i = 0; i < first; ++i) add(input(random_shape(4)), "input");
  if (coin(0.4)) add(input({uni(1, 3), uni(1, 6), uni(1, 12), uni(1, 12)}), "input");
  const int64_t n = uni(5, 40);
  // Weights of the op families: unary, binary, mask, reduce, movement, indexing, matmul, conv,
  // pool, leaf.
  const std::vector<int> weights = {3, 4, 2, 2, 4, 1, 2, 1, 1, 1};
  std::discrete_distribution<int> family(weights.begin(), weights.end());
  for (int64_t i = 0; i < n; ++i)
    for (int attempt = 0; attempt < 10; ++attempt) {
      bool done = false;
      switch (family(rng_)) {
        case 0:
          done = unary();
          break;
        case 1:
          done = binary();
          break;
        case 2:
          done = mask();
          break;
        case 3:
          done = reduce();
          break;
        case 4:
          done = movement();
          break;
        case 5:
          done = indexing();
          break;
        case 6:
          done = matmul();
          break;
        case 7:
          done = conv();
          break;
        case 8:
          done = pool();
          break;
        default:
          done = leaf();
          break;
      }
      if (done) break;
    }
  for (size_t i = 0; i + 1 < values_.size(); ++i)
    if (coin(0.2)) outputs_.push_back(values_[i]);
  outputs_.push_back(values_.back());
}

}  // namespace conformance
