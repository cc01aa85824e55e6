// Conformance of the elementwise ops and the leaves (data, scalars, iota, random numbers): every
// op over the generated shapes, every dtype it admits, NaN/inf/denormal inputs, broadcasting and
// non-contiguous (permuted, strided) operands.
#include <array>

#include "conformance.h"

namespace conformance {
namespace {

class Elementwise : public Conformance {};

const std::vector<ls::DType> kFloats = {ls::f32, ls::f64, ls::bf16};
const std::vector<ls::DType> kNumeric = {ls::f32, ls::f64, ls::bf16, ls::i32, ls::i64, ls::u8};
const std::vector<ls::DType> kAll = {ls::f32, ls::f64, ls::bf16,   ls::i32,
                                     ls::i64, ls::u8,  ls::boolean};

using Unary = ls::Tensor (*)(const ls::Tensor&, ls::Loc);
struct NamedUnary {
  const char* name;
  Unary fn;
};

// A strided, permuted view of x (rank >= 2): slice every other row, then swap the last axes.
ls::Tensor scrambled(const ls::Tensor& x) {
  ls::Tensor s = ls::slice(x, 0, 1, x.size(0), 2);
  return ls::transpose(s, 0, -1);
}

void unary_cases(const std::vector<NamedUnary>& ops, const std::vector<ls::DType>& dtypes) {
  for (const NamedUnary& op : ops)
    for (ls::DType dt : dtypes) {
      for (const ls::Shape& s : shapes_all()) {
        const std::string what = std::string(op.name) + " " + str(dt);
        check1(what, {{s, dt}}, [&](const Tensors& x) { return op.fn(x[0], ls::Loc::current()); });
        if (s.size() == 2 && ls::shape_numel(s) < 10000)
          check1(what + " special", {{s, dt, Fill::Special}},
                 [&](const Tensors& x) { return op.fn(x[0], ls::Loc::current()); });
        if (s.size() >= 2)
          check1(what + " of a strided view", {{s, dt}},
                 [&](const Tensors& x) { return op.fn(scrambled(x[0]), ls::Loc::current()); });
      }
    }
}

LS_COVERS(Elementwise, FloatUnary, Op::Exp, Op::Log, Op::Sqrt, Op::Rsqrt, Op::Tanh, Op::Sigmoid,
          Op::Sin, Op::Cos, Op::Erf, Op::Gelu, Op::Slice, Op::Permute);
TEST_F(Elementwise, FloatUnary) {
  unary_cases(
      {{"exp", ls::exp},
       {"log", ls::log},
       {"sqrt", ls::sqrt},
       {"rsqrt", ls::rsqrt},
       {"tanh", ls::tanh},
       {"sigmoid", ls::sigmoid},
       {"sin", ls::sin},
       {"cos", ls::cos},
       {"erf", ls::erf},
       {"gelu", [](const ls::Tensor& x,
                   ls::Loc loc) { return ls::nn::gelu(x, ls::nn::GeluApproximation::None, loc); }}},
      kFloats);
}

// GELU's gradient is its own op (Phi(x) + x phi(x), recomputed from x), special values too.
LS_COVERS(Elementwise, GeluGradient, Op::Gelu, Op::GeluDerivative);
TEST_F(Elementwise, GeluGradient) {
  for (ls::DType dt : {ls::f32, ls::f64})
    for (const ls::Shape& s : shapes_small())
      for (Fill fill : {Fill::Normal, Fill::Special}) {
        check(std::string("gelu gradient ") + str(dt) + (fill == Fill::Special ? " special" : ""),
              {{s, dt, fill}}, [](const Tensors& in) {
                const ls::Tensor x = in[0].detach().set_requires_grad();
                const ls::Tensor y = ls::nn::gelu(x);
                ls::backward(ls::sum(y * 0.5));
                return Tensors{y, x.grad()};
              });
      }
}

LS_COVERS(Elementwise, NumericUnary, Op::Neg, Op::Abs, Op::Relu, Op::Sign, Op::Floor, Op::Ceil);
TEST_F(Elementwise, NumericUnary) {
  unary_cases({{"neg", ls::neg},
               {"abs", ls::abs},
               {"relu", ls::relu},
               {"sign", ls::sign},
               {"floor", ls::floor},
               {"ceil", ls::ceil}},
              kNumeric);
}

LS_COVERS(Elementwise, LogicalNotAndIsFinite, Op::LogicalNot, Op::IsFinite);
TEST_F(Elementwise, LogicalNotAndIsFinite) {
  unary_cases({{"logical_not", ls::logical_not}, {"isfinite", ls::isfinite}}, kAll);
}

LS_COVERS(Elementwise, Cast, Op::Cast);
TEST_F(Elementwise, Cast) {
  for (ls::DType from : kAll)
    for (ls::DType to : kAll) {
      if (from == to) continue;
      for (const ls::Shape& s : shapes_all())
        check1("cast " + str(from) + " to " + str(to), {{s, from, Fill::Special}},
               [&](const Tensors& x) { return ls::cast(x[0], to); });
      check1("cast of a view " + str(from) + " to " + str(to), {{{5, 9}, from, Fill::Special}},
             [&](const Tensors& x) { return ls::cast(scrambled(x[0]), to); });
    }
}

using Binary = ls::Tensor (*)(const ls::Tensor&, const ls::Tensor&, ls::Loc);
struct NamedBinary {
  const char* name;
  Binary fn;
};

// Operand shape pairs that broadcast (including 0-d, empty and > 100k-element results).
std::vector<std::pair<ls::Shape, ls::Shape>> broadcast_pairs() {
  return {{{}, {}},
          {{}, {7}},
          {{7}, {}},
          {{3, 1}, {1, 4}},
          {{1}, {0}},
          {{2, 0, 3}, {1, 3}},
          {{5, 1, 7}, {4, 1}},
          {{3, 5, 7}, {3, 5, 7}},
          {{1, 3, 1, 5}, {2, 1, 4, 1}},
          {{2, 1, 33}, {2, 17, 33}},
          {{129, 33}, {129, 33}},
          {{129, 1}, {1, 1031}},
          {{1031, 131}, {131}},
          {{3, 1, 1}, {1, 1031, 67}}};
}

void binary_cases(const std::vector<NamedBinary>& ops, const std::vector<ls::DType>& dtypes,
                  Fill fa, Fill fb) {
  for (const NamedBinary& op : ops)
    for (ls::DType dt : dtypes) {
      const std::string name = std::string(op.name) + " " + str(dt);
      auto fn = [&](const Tensors& x) { return op.fn(x[0], x[1], ls::Loc::current()); };
      for (const auto& [a, b] : broadcast_pairs()) check1(name, {{a, dt, fa}, {b, dt, fb}}, fn);
      if (!ls::is_integral(dt) && dt != ls::boolean)
        check1(name + " special", {{{7, 13}, dt, Fill::Special}, {{7, 13}, dt, Fill::Special}}, fn);
      // Views: a strided, transposed left operand; a column broadcast against it.
      check1(name + " of views", {{{9, 6}, dt, fa}, {{6, 1}, dt, fb}},
             [&](const Tensors& x) { return op.fn(scrambled(x[0]), x[1], ls::Loc::current()); });
    }
}

LS_COVERS(Elementwise, Arithmetic, Op::Add, Op::Sub, Op::Mul, Op::Maximum, Op::Minimum, Op::Expand);
TEST_F(Elementwise, Arithmetic) {
  binary_cases({{"add", ls::add},
                {"sub", ls::sub},
                {"mul", ls::mul},
                {"maximum", ls::maximum},
                {"minimum", ls::minimum}},
               kNumeric, Fill::Normal, Fill::Normal);
  binary_cases({{"add", ls::add}, {"mul", ls::mul}}, {ls::i32, ls::i64, ls::u8}, Fill::Special,
               Fill::Special);  // wrapping
}

LS_COVERS(Elementwise, DivAndPow, Op::Div, Op::Fmod, Op::Pow);
TEST_F(Elementwise, DivAndPow) {
  binary_cases({{"div", ls::div}}, kFloats, Fill::Normal, Fill::Normal);
  // Integers: `/` is true division (f32); floor_divide is the integer Div (and an Fmod).
  binary_cases({{"div", ls::div}, {"floor_divide", ls::floor_divide}}, {ls::i32, ls::i64, ls::u8},
               Fill::Normal, Fill::Positive);
  binary_cases({{"fmod", ls::fmod}, {"remainder", ls::remainder}}, kFloats, Fill::Normal,
               Fill::Normal);
  binary_cases({{"fmod", ls::fmod}, {"remainder", ls::remainder}}, kFloats, Fill::Special,
               Fill::Special);
  binary_cases({{"fmod", ls::fmod}, {"remainder", ls::remainder}}, {ls::i32, ls::i64, ls::u8},
               Fill::Normal, Fill::Positive);
  binary_cases({{"pow", ls::pow}}, kFloats, Fill::Positive, Fill::Normal);
  binary_cases({{"pow", ls::pow}}, kFloats, Fill::Normal, Fill::Normal);  // NaN for x<0
  binary_cases({{"pow", ls::pow}}, {ls::i32, ls::i64, ls::u8}, Fill::Normal, Fill::Positive);
}

LS_COVERS(Elementwise, Comparison, Op::Eq, Op::Ne, Op::Lt, Op::Le, Op::Gt, Op::Ge, Op::LogicalAnd,
          Op::LogicalOr);
TEST_F(Elementwise, Comparison) {
  // Small integers in floats give ties, so == and <= see equal operands.
  for (ls::DType dt : kAll) {
    const Fill f = ls::is_floating(dt) ? Fill::Range : Fill::Normal;
    for (const auto& [a, b] : broadcast_pairs()) {
      In x{a, dt, f, -2, 3}, y{b, dt, f, -2, 3};
      if (dt == ls::boolean) x.fill = y.fill = Fill::Normal;
      check("comparisons " + str(dt), {x, y}, [](const Tensors& v) {
        const ls::Tensor a = ls::floor(ls::cast(v[0], ls::f32));
        const ls::Tensor b = ls::floor(ls::cast(v[1], ls::f32));
        return Tensors{ls::eq(v[0], v[1]),
                       ls::ne(v[0], v[1]),
                       ls::lt(v[0], v[1]),
                       ls::le(v[0], v[1]),
                       ls::gt(v[0], v[1]),
                       ls::ge(v[0], v[1]),
                       ls::logical_and(v[0], v[1]),
                       ls::logical_or(v[0], v[1]),
                       ls::eq(a, b),
                       ls::le(a, b)};
      });
    }
    if (ls::is_floating(dt))
      check("comparisons special " + str(dt),
            {{{11, 7}, dt, Fill::Special}, {{11, 7}, dt, Fill::Special}}, [](const Tensors& v) {
              return Tensors{ls::eq(v[0], v[1]),          ls::ne(v[0], v[1]),
                             ls::lt(v[0], v[1]),          ls::ge(v[0], v[1]),
                             ls::logical_and(v[0], v[1]), ls::logical_or(v[0], v[1])};
            });
  }
}

LS_COVERS(Elementwise, Where, Op::Where, Op::Scalar);
TEST_F(Elementwise, Where) {
  const std::vector<std::array<ls::Shape, 3>> shapes = {{{{}, {}, {}}},
                                                        {{{7}, {}, {7}}},
                                                        {{{3, 1}, {1, 4}, {3, 4}}},
                                                        {{{0, 3}, {1, 3}, {}}},
                                                        {{{2, 1, 5}, {3, 1}, {1, 5}}},
                                                        {{{1031, 131}, {131}, {1031, 1}}}};
  for (ls::DType dt : kAll)
    for (const auto& s : shapes) {
      check1("where " + str(dt), {{s[0], ls::boolean}, {s[1], dt}, {s[2], dt}},
             [](const Tensors& x) { return ls::where(x[0], x[1], x[2]); });
      check1("where scalar " + str(dt), {{s[0], ls::boolean}, {s[1], dt}}, [dt](const Tensors& x) {
        return dt == ls::boolean ? ls::where(x[0], x[1], true) : ls::where(x[0], 2, x[1]);
      });
    }
  check1("where special", {{{9, 9}, ls::boolean}, {{9, 9}, ls::f32, Fill::Special}, {{9}}},
         [](const Tensors& x) { return ls::where(x[0], x[1], x[2]); });
}

LS_COVERS(Elementwise, ScalarOperands, Op::Scalar, Op::Add, Op::Mul, Op::Sub, Op::Div);
TEST_F(Elementwise, ScalarOperands) {
  for (ls::DType dt : kNumeric)
    for (const ls::Shape& s : shapes_all())
      check1("scalars " + str(dt), {{s, dt, Fill::Positive}}, [](const Tensors& x) {
        return ls::div(ls::sub(ls::mul(x[0], 3) + 2, ls::sub(7, x[0])), ls::add(x[0], 1));
      });
}

class Creation : public Conformance {};

LS_COVERS(Creation, IotaAndRandom, Op::Iota, Op::RandomUniform, Op::Data);
TEST_F(Creation, IotaAndRandom) {
  for (ls::DType dt : kNumeric) {
    for (int64_t n : {0, 1, 7, 129, 150001})
      check1("arange " + str(dt), {}, [&](const Tensors&) { return ls::arange(n, dt); });
    check1("arange(start, end, step) " + str(dt), {},
           [&](const Tensors&) { return ls::arange(3, 40, 3, dt); });
  }
  for (ls::DType dt : kFloats)
    for (const ls::Shape& s : shapes_all()) {
      check1("rand " + str(dt), {}, [&](const Tensors&) { return ls::rand(s, dt); });
      check("randn and randint " + str(dt), {}, [&](const Tensors&) {
        return Tensors{ls::randn(s, dt), ls::randint(-5, 9, s), ls::rand(s, dt)};
      });
    }
  // Data nodes as outputs of arithmetic on inputs.
  check1("data", {{{3, 4}}}, [](const Tensors& x) { return x[0] + 0.0f; });
}

// The run-time argument checks of sampling ops, on arguments that pass: the draws agree.
LS_COVERS(Elementwise, SamplingChecks, Op::Check);
TEST_F(Elementwise, SamplingChecks) {
  check1("multinomial", {{{4, 7}, ls::f32, Fill::Positive}},
         [](const Tensors& x) { return ls::multinomial(x[0], 3, true); });
  check1("multinomial without replacement", {{{4, 7}, ls::f32, Fill::Positive}},
         [](const Tensors& x) { return ls::multinomial(x[0], 5, false); });
  check1("bernoulli", {{{5, 6}, ls::f32, Fill::Normal}},
         [](const Tensors& x) { return ls::bernoulli(ls::sigmoid(x[0])); });
}

}  // namespace
}  // namespace conformance
