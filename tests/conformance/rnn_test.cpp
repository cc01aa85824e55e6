// Conformance of the recurrent ops: an LSTM or GRU layer and its gradient on the cpu backend
// (oneDNN's LSTM and linear-before-reset GRU primitives for f32) against ref's direct loops, in
// both directions, over sizes that are and are not multiples of oneDNN's blocks; the gradient with
// its forward pass in the same program (it reads the forward's workspace) and in an earlier one (it
// recomputes it).
#include "conformance.h"

namespace conformance {
namespace {

class Lstm : public Conformance {};

struct LstmCase {
  int64_t t, n, i, h;
};

LS_COVERS(Lstm, LayerAndItsGradient, Op::Lstm, Op::LstmBackward);
TEST_F(Lstm, LayerAndItsGradient) {
  const LstmCase cases[] = {{1, 1, 1, 1}, {5, 3, 4, 7}, {12, 4, 9, 16}, {7, 2, 33, 20}};
  for (ls::DType dt : {ls::f32, ls::f64})
    for (const LstmCase& c : cases)
      for (bool reverse : {false, true}) {
        const ls::Shape x{c.t, c.n, c.i}, state{c.n, c.h}, y{c.t + 2, c.n, c.h};
        const std::vector<In> in = {
            {x, dt},         {state, dt}, {state, dt}, {{4 * c.h, c.i}, dt}, {{4 * c.h, c.h}, dt},
            {{4 * c.h}, dt}, {y, dt}};
        const std::string name = "x " + str(x) + " hidden " + std::to_string(c.h) +
                                 (reverse ? " reverse " : " ") + str(dt);
        // Errors compound over the time steps, each a sum over I + H products.
        const double k = static_cast<double>(c.t * (c.i + c.h + 4));
        auto layer = [reverse](const Tensors& v) {
          return ls::lstm_layer(v[0], v[1], v[2], v[3], v[4], v[5], reverse);
        };
        auto gradient = [reverse](const Tensors& v, const ls::Tensor& out) {
          return ls::lstm_layer_backward(v[0], v[1], v[2], v[3], v[4], v[5], out, v[6], reverse);
        };
        check(
            "lstm and lstm_backward in one program, " + name, in,
            [&](const Tensors& v) {
              const ls::Tensor out = layer(v);
              return Tensors{out, gradient(v, out)};
            },
            k);
        check(
            "lstm_backward of a forward pass computed earlier, " + name, in,
            [&](const Tensors& v) {
              const ls::Tensor out = layer(v);
              ls::sync();  // the forward pass is a program of its own
              return Tensors{gradient(v, out)};
            },
            k);
      }
}

LS_COVERS(Lstm, GruLayerAndItsGradient, Op::Gru, Op::GruBackward);
TEST_F(Lstm, GruLayerAndItsGradient) {
  const LstmCase cases[] = {{1, 1, 1, 1}, {5, 3, 4, 7}, {12, 4, 9, 16}, {7, 2, 33, 20}};
  for (ls::DType dt : {ls::f32, ls::f64})
    for (const LstmCase& c : cases)
      for (bool reverse : {false, true}) {
        const ls::Shape x{c.t, c.n, c.i}, state{c.n, c.h}, y{c.t + 1, c.n, c.h};
        const std::vector<In> in = {
            {x, dt},         {state, dt}, {{3 * c.h, c.i}, dt}, {{3 * c.h, c.h}, dt},
            {{4 * c.h}, dt}, {y, dt}};
        const std::string name = "x " + str(x) + " hidden " + std::to_string(c.h) +
                                 (reverse ? " reverse " : " ") + str(dt);
        const double k = static_cast<double>(c.t * (c.i + c.h + 4));
        auto layer = [reverse](const Tensors& v) {
          return ls::gru_layer(v[0], v[1], v[2], v[3], v[4], reverse);
        };
        auto gradient = [reverse](const Tensors& v, const ls::Tensor& out) {
          return ls::gru_layer_backward(v[0], v[1], v[2], v[3], v[4], out, v[5], reverse);
        };
        check(
            "gru and gru_backward in one program, " + name, in,
            [&](const Tensors& v) {
              const ls::Tensor out = layer(v);
              return Tensors{out, gradient(v, out)};
            },
            k);
        check(
            "gru_backward of a forward pass computed earlier, " + name, in,
            [&](const Tensors& v) {
              const ls::Tensor out = layer(v);
              ls::sync();
              return Tensors{gradient(v, out)};
            },
            k);
      }
}

}  // namespace
}  // namespace conformance
