// The convolution algorithm pass: which oneDNN convolutions run as Winograd (plan::Plan::
// algorithm), by the rule set_conv_algo selects (dnnl_ops.h).
#include <array>

#include "backends/cpu/passes.h"
#include "ir/attrs.h"

namespace lockstep::backends::cpu {

using ir::Op;

// oneDNN's Winograd (F(4x4, 3x3)) takes 3x3 kernels, stride 1, no dilation or groups. Auto uses
// it for problems of at least 16 channels in and out and 64 output pixels: timed on ResNet-18 and
// -50 (bench/README.md) every such convolution ran 1.5-2.8x faster as Winograd in all three
// directions. A rule, not a timing, so a program computes the same bits in every process (a
// resumed run continues exactly). Winograd mixes the values of a tile: it rounds a little
// differently from direct and spreads a non-finite input (an inf becomes NaNs in its 4x4 output
// tile); small problems keep direct's exact summation order. Where oneDNN has no Winograd for a
// problem (on CPUs without AVX-512), lockstep's own F(4x4, 3x3) runs it where its stricter rule
// says it pays (WinogradConv::pays), else the convolution falls back to direct when it is built
// (lower).
void choose_conv_algorithms(plan::Plan& p) {
  const ConvAlgo setting = conv_algo();
  const ir::Graph& g = p.graph;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const int32_t id = static_cast<int32_t>(i);
    const ir::GraphNode& n = g.nodes[i];
    decisions(p).winograd[i] = false;
    if (setting == ConvAlgo::Direct || !p.run_time[i] || !dnnl_conv(g, id)) continue;
    // The forward problem's weights and output, whichever direction this is.
    const Shape& w = n.op == Op::Conv2dBackwardWeight ? n.shape : g.nodes[n.operands[1]].shape;
    const Shape& y = n.op == Op::Conv2d                ? n.shape
                     : n.op == Op::Conv2dBackwardInput ? g.nodes[n.operands[0]].shape
                                                       : g.nodes[n.operands[1]].shape;
    const ir::ConvAttrs a = ir::ConvAttrs::of(n.attrs);
    const bool candidate = w[2] == 3 && w[3] == 3 && a.stride == std::array<int64_t, 2>{1, 1} &&
                           a.dilation == std::array<int64_t, 2>{1, 1} && a.groups == 1;
    const bool big = w[0] >= 16 && w[1] >= 16 && y[2] * y[3] >= 64;
    if (candidate && (setting == ConvAlgo::Winograd || big)) decisions(p).winograd[i] = true;
  }
}

}  // namespace lockstep::backends::cpu
