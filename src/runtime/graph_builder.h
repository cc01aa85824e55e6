// Turns the live nodes one sync needs into a canonical, data-free ir::Graph, its cache key
// (structure, shapes, dtypes, attributes: never data) and the runtime inputs that go with it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ir/ir.h"
#include "runtime/lazy.h"

namespace lockstep::runtime {

struct BuiltGraph {
  // The program itself is only written out (materialize_graph) when the cache does not have it.
  ir::Graph graph;
  std::vector<const ir::Node*> order;  // node of each graph id (valid while the roots live)
  std::vector<int32_t> outputs;        // graph ids of the outputs
  std::vector<std::shared_ptr<Buffer>> buffers;  // Data inputs, by input index
  std::vector<ir::ScalarValue> scalars;          // Scalar inputs, by input index
  std::vector<uint64_t> key;                     // canonical structure; equal keys, equal programs
  uint64_t hash = 0;
  std::vector<int32_t> root_output;  // for each root, its index in graph.outputs
};

// `roots` must be non-Data nodes on `device`. Nodes are numbered in a canonical post-order, so
// the same program recorded twice gives the same key.
BuiltGraph build_graph(const std::vector<ir::NodePtr>& roots, Device device);
// Fills built.graph from built.order; call before build_graph runs again.
void materialize_graph(BuiltGraph& built);

}  // namespace lockstep::runtime
