// Conformance of the recurrent ops: an LSTM or GRU layer and its gradient on the cpu backend
// (oneDNN's LSTM and linear-before-reset GRU primitives for f32) against ref's direct loops, in
// both directions, over sizes that are and are not multiples of oneDNN's blocks; the gradient
// with its forward pass in the same program (it reads the forward's workspace) and in an earlier
// one (it recomputes it).
#include "conformance.h"

namespace conformance {
namespace {

class Recurrent : public Conformance {};

// One cell's ops over every case: `layer` records the layer from its operands (the first
// `operands` inputs), `gradient` its gradient from them, the layer's value and the last input.
void check_cell(
    const std::string& cell, bool lstm,
    const std::function<ls::Tensor(const Tensors&, bool)>& layer,
    const std::function<ls::Tensor(const Tensors&, const ls::Tensor&, bool)>& gradient) {
  struct Case {
    int64_t t, n, i, h;
  };
  const Case cases[] = {{1, 1, 1, 1}, {5, 3, 4, 7}, {12, 4, 9, 16}, {7, 2, 33, 20}};
  const int64_t g = lstm ? 4 : 3;
  for (ls::DType dt : {ls::f32, ls::f64})
    for (const Case& c : cases)
      for (bool reverse : {false, true}) {
        const ls::Shape x{c.t, c.n, c.i}, state{c.n, c.h}, y{c.t + (lstm ? 2 : 1), c.n, c.h};
        std::vector<In> in = {{x, dt}, {state, dt}};
        if (lstm) in.push_back({state, dt});
        for (const ls::Shape& s : {ls::Shape{g * c.h, c.i}, {g * c.h, c.h}, {4 * c.h}, y})
          in.push_back({s, dt});
        const std::string name = "x " + str(x) + " hidden " + std::to_string(c.h) +
                                 (reverse ? " reverse " : " ") + str(dt);
        // Errors compound over the time steps, each a sum over I + H products.
        const double k = static_cast<double>(c.t * (c.i + c.h + 4));
        check(
            cell + " and its gradient in one program, " + name, in,
            [&](const Tensors& v) {
              const ls::Tensor out = layer(v, reverse);
              return Tensors{out, gradient(v, out, reverse)};
            },
            k);
        check(
            cell + "'s gradient of a forward pass computed earlier, " + name, in,
            [&](const Tensors& v) {
              const ls::Tensor out = layer(v, reverse);
              ls::sync();  // the forward pass is a program of its own
              return Tensors{gradient(v, out, reverse)};
            },
            k);
      }
}

LS_COVERS(Recurrent, LstmLayerAndItsGradient, Op::Lstm, Op::LstmBackward);
TEST_F(Recurrent, LstmLayerAndItsGradient) {
  check_cell(
      "lstm", true,
      [](const Tensors& v, bool reverse) {
        return ls::lstm_layer(v[0], v[1], v[2], v[3], v[4], v[5], reverse);
      },
      [](const Tensors& v, const ls::Tensor& out, bool reverse) {
        return ls::lstm_layer_backward(v[0], v[1], v[2], v[3], v[4], v[5], out, v[6], reverse);
      });
}

LS_COVERS(Recurrent, GruLayerAndItsGradient, Op::Gru, Op::GruBackward);
TEST_F(Recurrent, GruLayerAndItsGradient) {
  check_cell(
      "gru", false,
      [](const Tensors& v, bool reverse) {
        return ls::gru_layer(v[0], v[1], v[2], v[3], v[4], reverse);
      },
      [](const Tensors& v, const ls::Tensor& out, bool reverse) {
        return ls::gru_layer_backward(v[0], v[1], v[2], v[3], v[4], out, v[5], reverse);
      });
}

}  // namespace
}  // namespace conformance
