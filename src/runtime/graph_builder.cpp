// Graph building and hashing; see graph_builder.h.
#include "runtime/graph_builder.h"

#include <unordered_map>
#include <utility>

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
  BuiltGraph out;
  ir::Graph& g = out.graph;
  g.device = device;
  std::unordered_map<const ir::Node*, int32_t> id_of;
  std::unordered_map<const Buffer*, int32_t> data_node_of;

  auto key = [&](uint64_t w) { out.key.push_back(w); };
  key(static_cast<uint64_t>(device.kind) << 8 | static_cast<uint64_t>(device.index));

  // Iterative post-order DFS: deep graphs (long in-place chains) must not overflow the stack.
  struct Frame {
    const ir::Node* node;
    size_t next;
  };
  std::vector<Frame> stack;
  for (const ir::NodePtr& root : roots) {
    LS_INTERNAL_CHECK(root && root->op != ir::Op::Data, "graph roots must be pending nodes");
    if (id_of.count(root.get())) continue;
    stack.push_back({root.get(), 0});
    while (!stack.empty()) {
      Frame& f = stack.back();
      const ir::Node* n = f.node;
      if (f.next < n->operands.size()) {
        const ir::Node* child = n->operands[f.next++].get();
        if (!id_of.count(child)) stack.push_back({child, 0});
        continue;
      }
      stack.pop_back();
      if (id_of.count(n)) continue;
      LS_INTERNAL_CHECK(n->device == device, "node on ", device_name(n->device), " in a graph for ",
                        device_name(device));
      if (n->op == ir::Op::Data) {
        auto it = data_node_of.find(n->buffer.get());
        if (it != data_node_of.end()) {
          id_of[n] = it->second;
          continue;
        }
      }
      ir::GraphNode gn;
      gn.op = n->op;
      gn.attrs = n->attrs;
      gn.shape = n->shape;
      gn.dtype = n->dtype;
      gn.loc = n->loc;
      gn.operands.reserve(n->operands.size());
      for (const ir::NodePtr& o : n->operands) gn.operands.push_back(id_of.at(o.get()));
      if (n->op == ir::Op::Data) {
        gn.input = g.num_buffer_inputs++;
        out.buffers.push_back(n->buffer);
      } else if (n->op == ir::Op::Scalar) {
        gn.input = g.num_scalar_inputs++;
        out.scalars.push_back(n->scalar);
      }
      key(static_cast<uint64_t>(gn.op) << 8 | static_cast<uint64_t>(gn.dtype));
      key(gn.shape.size());
      for (int64_t d : gn.shape) key(static_cast<uint64_t>(d));
      key(gn.attrs.size());
      for (int64_t a : gn.attrs) key(static_cast<uint64_t>(a));
      key(gn.operands.size());
      for (int32_t o : gn.operands) key(static_cast<uint64_t>(o));
      key(static_cast<uint64_t>(static_cast<int64_t>(gn.input)));
      const int32_t id = static_cast<int32_t>(g.nodes.size());
      g.nodes.push_back(std::move(gn));
      id_of[n] = id;
      if (n->op == ir::Op::Data) data_node_of[n->buffer.get()] = id;
    }
  }
  std::unordered_map<int32_t, int32_t> output_of;
  for (const ir::NodePtr& root : roots) {
    const int32_t id = id_of.at(root.get());
    auto [it, fresh] = output_of.emplace(id, static_cast<int32_t>(g.outputs.size()));
    if (fresh) g.outputs.push_back(id);
    out.root_output.push_back(it->second);
  }
  key(0xFFFFFFFFull);
  for (int32_t o : g.outputs) key(static_cast<uint64_t>(o));
  out.hash = hash_words(out.key);
  return out;
}

}  // namespace lockstep::runtime
