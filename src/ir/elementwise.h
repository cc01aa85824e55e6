// What each elementwise primitive computes on one value, written once: the ref backend, the cpu
// backend's typed kernels and its fused trees' scalar loops all compute with these formulas, so a
// new elementwise op is one entry here. SIMD bodies that replace a formula for speed (the fused
// trees' exp, tanh, erf, GELU, ... in backends/cpu/vector_math) are checked against the ref
// backend's results by the conformance tests. Not here: dtypes and shapes (shape_rules.cpp, the
// admits column of ops.def), gradients (grad_rules.cpp), loops and storage (the backends).
//
// Each entry is a Fn<Op::X> with a static f taking values as computed: float for f32 and bf16
// (bf16 is widened exactly, and the result rounded when stored), double, int32_t, int64_t, bool.
// f is only instantiated for the operand types the op admits (ops.def's admits column). kExact
// marks the ops whose results on bf16 operands are bf16 values as they are (no rounding).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "ir/ir.h"
#include "lockstep/dtype.h"

namespace lockstep::ir::elementwise {

#define LS_ELEMENTWISE_FN __attribute__((always_inline)) static inline

template <typename T>
inline constexpr bool kBool = std::is_same_v<T, bool>;
template <typename T>
inline constexpr bool kFloat = std::is_floating_point_v<T>;
template <typename T>
inline constexpr bool kInt = std::is_integral_v<T> && !kBool<T>;

// Integer arithmetic wraps (two's complement) instead of overflowing.
template <typename T>
T wrap_add(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
}
template <typename T>
T wrap_sub(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(a) - static_cast<U>(b));
}
template <typename T>
T wrap_mul(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
}

template <Op op>
struct Fn;

// ---- unary ------------------------------------------------------------------------------------

template <>
struct Fn<Op::Neg> {
  static constexpr bool kExact = true;
  template <typename T>
  LS_ELEMENTWISE_FN T f(T x) {
    if constexpr (kInt<T>)
      return wrap_sub(T(0), x);
    else
      return -x;
  }
};
template <>
struct Fn<Op::Abs> {
  static constexpr bool kExact = true;
  template <typename T>
  LS_ELEMENTWISE_FN T f(T x) {
    if constexpr (kInt<T>)
      return x < 0 ? wrap_sub(T(0), x) : x;
    else
      return std::abs(x);
  }
};
template <>
struct Fn<Op::Exp> {
  template <typename T>
  LS_ELEMENTWISE_FN T f(T x) {
    return std::exp(x);
  }
};
template <>
struct Fn<Op::Log> {
  template <typename T>
  LS_ELEMENTWISE_FN T f(T x) {
    return std::log(x);
  }
};
template <>
struct Fn<Op::Sqrt> {
  template <typename T>
  LS_ELEMENTWISE_FN T f(T x) {
    return std::sqrt(x);
  }
};
template <>
struct Fn<Op::Rsqrt> {
  template <typename T>
  LS_ELEMENTWISE_FN T f(T x) {
    return T(1) / std::sqrt(x);
  }
};
template <>
struct Fn<Op::Tanh> {
  template <typename T>
  LS_ELEMENTWISE_FN T f(T x) {
    return std::tanh(x);
  }
};
template <>
struct Fn<Op::Sigmoid> {
  template <typename T>
  LS_ELEMENTWISE_FN T f(T x) {
    return T(1) / (T(1) + std::exp(-x));
  }
};
template <>
struct Fn<Op::Relu> {  // NaN stays NaN, -0 stays -0
  static constexpr bool kExact = true;
  template <typename T>
  LS_ELEMENTWISE_FN T f(T x) {
    return x < T(0) ? T(0) : x;
  }
};
template <>
struct Fn<Op::Sin> {
  template <typename T>
  LS_ELEMENTWISE_FN T f(T x) {
    return std::sin(x);
  }
};
template <>
struct Fn<Op::Cos> {
  template <typename T>
  LS_ELEMENTWISE_FN T f(T x) {
    return std::cos(x);
  }
};
template <>
struct Fn<Op::Erf> {
  template <typename T>
  LS_ELEMENTWISE_FN T f(T x) {
    return std::erf(x);
  }
};
template <>
struct Fn<Op::Gelu> {  // x Phi(x), the exact form
  template <typename T>
  LS_ELEMENTWISE_FN T f(T x) {
    return x * T(0.5) * (T(1) + std::erf(x * T(0.70710678118654752440)));
  }
};
template <>
struct Fn<Op::GeluDerivative> {  // Phi(x) + x phi(x)
  template <typename T>
  LS_ELEMENTWISE_FN T f(T x) {
    return T(0.5) * (T(1) + std::erf(x * T(0.70710678118654752440))) +
           x * std::exp(x * x * T(-0.5)) * T(0.39894228040143267794);
  }
};
template <>
struct Fn<Op::Floor> {
  static constexpr bool kExact = true;
  template <typename T>
  LS_ELEMENTWISE_FN T f(T x) {
    if constexpr (kInt<T>)
      return x;
    else
      return std::floor(x);
  }
};
template <>
struct Fn<Op::Ceil> {
  static constexpr bool kExact = true;
  template <typename T>
  LS_ELEMENTWISE_FN T f(T x) {
    if constexpr (kInt<T>)
      return x;
    else
      return std::ceil(x);
  }
};
template <>
struct Fn<Op::Sign> {  // NaN stays NaN
  static constexpr bool kExact = true;
  template <typename T>
  LS_ELEMENTWISE_FN T f(T x) {
    const T s = static_cast<T>((x > T(0)) - (x < T(0)));
    if constexpr (kFloat<T>)
      return x != x ? x : s;
    else
      return s;
  }
};
template <>
struct Fn<Op::LogicalNot> {
  template <typename T>
  LS_ELEMENTWISE_FN bool f(T x) {
    return x == T(0);
  }
};
template <>
struct Fn<Op::IsFinite> {
  template <typename T>
  LS_ELEMENTWISE_FN bool f(T x) {
    if constexpr (kFloat<T>)
      return (x - x) == T(0);  // inf - inf and NaN - NaN are NaN
    else
      return true;
  }
};
// A cast computes the value as it is; storing it in the result's dtype converts it (convert).
template <>
struct Fn<Op::Cast> {
  static constexpr bool kExact = true;
  template <typename T>
  LS_ELEMENTWISE_FN T f(T x) {
    return x;
  }
};

// ---- binary -----------------------------------------------------------------------------------

template <>
struct Fn<Op::Add> {
  template <typename T>
  LS_ELEMENTWISE_FN T f(T a, T b) {
    if constexpr (kInt<T>)
      return wrap_add(a, b);
    else
      return a + b;
  }
};
template <>
struct Fn<Op::Sub> {
  template <typename T>
  LS_ELEMENTWISE_FN T f(T a, T b) {
    if constexpr (kInt<T>)
      return wrap_sub(a, b);
    else
      return a - b;
  }
};
template <>
struct Fn<Op::Mul> {
  template <typename T>
  LS_ELEMENTWISE_FN T f(T a, T b) {
    if constexpr (kInt<T>)
      return wrap_mul(a, b);
    else
      return a * b;
  }
};
// The ops marked FailsOnInt in ops.def say which integer divisors fail (int_failure: the error's
// text, or null); the backends check every element before they write anything.
template <>
struct Fn<Op::Div> {
  template <typename T>
  LS_ELEMENTWISE_FN T f(T a, T b) {
    if constexpr (kInt<T>)
      return b == T(-1) ? wrap_sub(T(0), a) : static_cast<T>(a / b);  // MIN / -1 overflows
    else
      return a / b;
  }
  template <typename T>
  static const char* int_failure(T b) {
    return b == T(0) ? "integer division by zero" : nullptr;
  }
};
template <>
struct Fn<Op::Fmod> {
  template <typename T>
  LS_ELEMENTWISE_FN T f(T a, T b) {
    if constexpr (kInt<T>)
      return b == T(-1) ? T(0) : static_cast<T>(a % b);  // MIN % -1 overflows
    else
      return std::fmod(a, b);
  }
  template <typename T>
  static const char* int_failure(T b) {
    return b == T(0) ? "integer division by zero" : nullptr;
  }
};
template <>
struct Fn<Op::Pow> {
  template <typename T>
  LS_ELEMENTWISE_FN T f(T a, T b) {
    if constexpr (kInt<T>) {
      T result = 1;
      for (; b > 0; b >>= 1) {
        if (b & 1) result = wrap_mul(result, a);
        a = wrap_mul(a, a);
      }
      return result;
    } else {
      return std::pow(a, b);
    }
  }
  template <typename T>
  static const char* int_failure(T b) {
    return b < T(0) ? "integers to negative integer powers are not allowed" : nullptr;
  }
};
template <>
struct Fn<Op::Check> {
  static constexpr bool kExact = true;
  template <typename T>
  LS_ELEMENTWISE_FN T f(T a, T) {
    return a;
  }
  template <typename T>
  static const char* int_failure(T b) {
    switch (static_cast<int>(b)) {
      case kCheckPasses:
        return nullptr;
      case kCheckWeights:
        return "multinomial: the weights hold a negative, infinite or NaN value, or a row of "
               "them sums to 0; pass finite, non-negative weights with a positive sum in each row";
      case kCheckProbabilities:
        return "bernoulli: a probability is below 0, above 1 or NaN; pass probabilities in "
               "[0, 1] (clamp them, or apply sigmoid to logits)";
      default:
        return "a run-time check failed";
    }
  }
};
template <>
struct Fn<Op::Maximum> {  // NaN wins, as PyTorch's maximum
  static constexpr bool kExact = true;
  template <typename T>
  LS_ELEMENTWISE_FN T f(T a, T b) {
    return ((a != a) | (a > b)) ? a : b;
  }
};
template <>
struct Fn<Op::Minimum> {
  static constexpr bool kExact = true;
  template <typename T>
  LS_ELEMENTWISE_FN T f(T a, T b) {
    return ((a != a) | (a < b)) ? a : b;
  }
};

// ---- comparisons and logical connectives --------------------------------------------------------

template <>
struct Fn<Op::Eq> {
  template <typename T>
  LS_ELEMENTWISE_FN bool f(T a, T b) {
    return a == b;
  }
};
template <>
struct Fn<Op::Ne> {
  template <typename T>
  LS_ELEMENTWISE_FN bool f(T a, T b) {
    return a != b;
  }
};
template <>
struct Fn<Op::Lt> {
  template <typename T>
  LS_ELEMENTWISE_FN bool f(T a, T b) {
    return a < b;
  }
};
template <>
struct Fn<Op::Le> {
  template <typename T>
  LS_ELEMENTWISE_FN bool f(T a, T b) {
    return a <= b;
  }
};
template <>
struct Fn<Op::Gt> {
  template <typename T>
  LS_ELEMENTWISE_FN bool f(T a, T b) {
    return a > b;
  }
};
template <>
struct Fn<Op::Ge> {
  template <typename T>
  LS_ELEMENTWISE_FN bool f(T a, T b) {
    return a >= b;
  }
};
template <>
struct Fn<Op::LogicalAnd> {
  template <typename T>
  LS_ELEMENTWISE_FN bool f(T a, T b) {
    return (a != T(0)) & (b != T(0));
  }
};
template <>
struct Fn<Op::LogicalOr> {
  template <typename T>
  LS_ELEMENTWISE_FN bool f(T a, T b) {
    return (a != T(0)) | (b != T(0));
  }
};

// ---- select -----------------------------------------------------------------------------------

template <>
struct Fn<Op::Where> {  // both sides are values already loaded: loops vectorize into a blend
  static constexpr bool kExact = true;
  template <typename T>
  LS_ELEMENTWISE_FN T f(bool c, T a, T b) {
    return c ? a : b;
  }
};

#undef LS_ELEMENTWISE_FN

// ---- dispatch ---------------------------------------------------------------------------------

// Whether op computes on operands held as T (float for f32 and bf16; bool for bool).
template <Op op, typename T>
constexpr bool admits() {
  constexpr Admits a = op_admits(op);
  if constexpr (a == Admits::Float)
    return kFloat<T>;
  else if constexpr (a == Admits::Numeric)
    return !kBool<T>;
  else
    return true;
}

// Calls visit(Fn<op>{}) for the elementwise op `op` on operands held as T, and returns true;
// false when op is not elementwise or does not admit T. The cases come from the table, so a new
// elementwise op needs no edit here.
#define LS_ELEMENTWISE_CASE(name)                                            \
  case Op::name:                                                             \
    if constexpr (admits<Op::name, T>()) return visit(Fn<Op::name>{}), true; \
    return false;
template <typename T, typename F>
__attribute__((always_inline)) inline bool with_fn(Op op, F&& visit) {
  switch (op) {
#define LS_OP(name, arity, family, admits, props, user) \
  LS_IF_ELEMENTWISE_##family(LS_ELEMENTWISE_CASE(name))
#include "ir/ops.def"
#undef LS_OP
    default:  // not elementwise
      return false;
  }
}
#undef LS_ELEMENTWISE_CASE

// Whether an elementwise op's formula is a predicate: its result is bool.
inline bool yields_bool(Op op) {
  bool predicate = false;
  with_fn<float>(op, [&](auto fn) {
    using Fn = decltype(fn);
    if constexpr (requires(float v) { Fn::f(v); })
      predicate = std::is_same_v<decltype(Fn::f(0.0f)), bool>;
    else if constexpr (requires(float v) { Fn::f(v, v); })
      predicate = std::is_same_v<decltype(Fn::f(0.0f, 0.0f)), bool>;
  });
  return predicate;
}

// Float -> integer conversion is defined for every input: NaN gives 0, out-of-range values
// saturate; bf16 goes through f32 both ways; to bool is "!= 0" (NaN is true).
template <typename To, typename From>
To convert(From v) {
  if constexpr (std::is_same_v<From, bfloat16>) {
    return convert<To>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, bfloat16>) {
    return bfloat16(convert<float>(v));
  } else if constexpr (kBool<To>) {
    return v != From(0);
  } else if constexpr (kFloat<From> && kInt<To>) {
    if (std::isnan(v)) return 0;
    if (v >= static_cast<From>(std::numeric_limits<To>::max()))
      return std::numeric_limits<To>::max();
    if (v <= static_cast<From>(std::numeric_limits<To>::min()))
      return std::numeric_limits<To>::min();
    return static_cast<To>(v);
  } else {
    return static_cast<To>(v);
  }
}

}  // namespace lockstep::ir::elementwise
