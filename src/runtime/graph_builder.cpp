// Graph building and hashing; see graph_builder.h.
#include "runtime/graph_builder.h"

#include <utility>

#include "runtime/profiler.h"
#include "util/check.h"

namespace lockstep::runtime {
namespace {

uint64_t hash_words(const std::vector<uint64_t>& words) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ words.size();
  for (uint64_t w : words) {
    h ^= w + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 32;
  }
  return h;
}

}  // namespace

BuiltGraph build_graph(const std::vector<ir::NodePtr>& roots, Device device) {
  // Called for every step, so it stays cheap on a cache hit: no maps (each node and buffer keeps
  // its number for the current build), no program written out, buffers sized from last time.
  static uint64_t epoch = 0;
  static size_t last_nodes = 0, last_key = 0;
  prof::Span span("graph", "build graph");
  ++epoch;
  BuiltGraph out;
  out.graph.device = device;
  out.order.reserve(last_nodes);
  out.key.reserve(last_key);
  std::vector<uint64_t>& key = out.key;
  key.push_back(static_cast<uint64_t>(device.kind) << 8 | static_cast<uint64_t>(device.index));
  auto id_of = [](const ir::Node* n) { return n->scratch.epoch == epoch ? n->scratch.id : -1; };

  // Iterative post-order DFS: deep graphs (long in-place chains) must not overflow the stack.
  struct Frame {
    const ir::Node* node;
    size_t next;
  };
  std::vector<Frame> stack;
  int32_t num_buffers = 0, num_scalars = 0;
  for (const ir::NodePtr& root : roots) {
    LS_INTERNAL_CHECK(root && root->op != ir::Op::Data, "graph roots must be pending nodes");
    if (id_of(root.get()) >= 0) continue;
    stack.push_back({root.get(), 0});
    while (!stack.empty()) {
      Frame& f = stack.back();
      const ir::Node* n = f.node;
      if (f.next < n->operands.size()) {
        const ir::Node* child = n->operands[f.next++].get();
        if (id_of(child) < 0) stack.push_back({child, 0});
        continue;
      }
      stack.pop_back();
      if (id_of(n) >= 0) continue;
      LS_INTERNAL_CHECK(n->device == device, "node on ", device_name(n->device), " in a graph for ",
                        device_name(device));
      Buffer* buffer = n->op == ir::Op::Data ? n->binding.buffer.get() : nullptr;
      if (buffer && buffer->build_epoch == epoch) {  // another Data node of the same buffer
        n->scratch.epoch = epoch;
        n->scratch.id = buffer->build_id;
        continue;
      }
      int32_t input = -1;
      if (buffer) {
        input = num_buffers++;
        out.buffers.push_back(n->binding.buffer);
      } else if (n->op == ir::Op::Scalar) {
        input = num_scalars++;
        out.scalars.push_back(n->binding.scalar);
      }
      key.push_back(static_cast<uint64_t>(n->op) << 8 | static_cast<uint64_t>(n->dtype));
      key.push_back(n->shape.size());
      for (int64_t d : n->shape) key.push_back(static_cast<uint64_t>(d));
      key.push_back(n->attrs.size());
      for (int64_t a : n->attrs) key.push_back(static_cast<uint64_t>(a));
      key.push_back(n->operands.size());
      for (const ir::NodePtr& o : n->operands) key.push_back(static_cast<uint64_t>(id_of(o.get())));
      key.push_back(static_cast<uint64_t>(static_cast<int64_t>(input)));
      const int32_t id = static_cast<int32_t>(out.order.size());
      out.order.push_back(n);
      n->scratch.epoch = epoch;
      n->scratch.id = id;
      if (buffer) {
        buffer->build_epoch = epoch;
        buffer->build_id = id;
      }
    }
  }
  out.graph.num_buffer_inputs = num_buffers;
  out.graph.num_scalar_inputs = num_scalars;
  // Outputs in order of first appearance among the roots (a root listed twice is one output).
  std::vector<int32_t> output_of(out.order.size(), -1);
  for (const ir::NodePtr& root : roots) {
    const int32_t id = id_of(root.get());
    if (output_of[id] < 0) {
      output_of[id] = static_cast<int32_t>(out.outputs.size());
      out.outputs.push_back(id);
    }
    out.root_output.push_back(output_of[id]);
  }
  key.push_back(0xFFFFFFFFull);
  for (int32_t o : out.outputs) key.push_back(static_cast<uint64_t>(o));
  prof::Span hashing("graph", "hash");
  out.hash = hash_words(out.key);
  span.arg("nodes", out.order.size());
  last_nodes = out.order.size();
  last_key = out.key.size();
  return out;
}

void materialize_graph(BuiltGraph& built) {
  ir::Graph& g = built.graph;
  g.nodes.clear();
  g.nodes.reserve(built.order.size());
  int32_t buffers = 0, scalars = 0;
  for (const ir::Node* n : built.order) {
    ir::GraphNode gn;
    gn.op = n->op;
    gn.attrs = n->attrs;
    gn.shape = n->shape;
    gn.dtype = n->dtype;
    gn.origin = n->origin;
    gn.operands.reserve(n->operands.size());
    for (const ir::NodePtr& o : n->operands) gn.operands.push_back(o->scratch.id);
    if (n->op == ir::Op::Data) {
      gn.input = buffers++;
      if (n->binding.buffer) gn.name = n->binding.buffer->name;
    }
    if (n->op == ir::Op::Scalar) gn.input = scalars++;
    g.nodes.push_back(std::move(gn));
  }
  g.outputs = built.outputs;
}

}  // namespace lockstep::runtime
