// The IR: immutable nodes recorded by tensor operations, and the Graph a step compiles.
// Nodes are shared (a tensor's pending value is a node); a Graph is a flat, canonical, data-free
// copy of the nodes one sync needs, which is what gets hashed, cached and handed to a backend.
//
// Node::attrs per op (all int64):
//   Iota            [axis]                      values 0..n-1 along axis
//   RandomUniform   []                          operand: i64[2] generator state {seed, counter}
//   Sum/Max/Min/ArgMax/ArgMin  [keepdim, axes...]  axes sorted, non-negative, unique
//   Permute         [perm...]
//   Slice           [axis, start, end, step]    normalized: 0 <= start, end <= size, step > 0
//   Concat          [axis]
//   Pad             [before0, after0, before1, after1, ...]   operand 1: the 0-d fill value
//   Gather          [axis]                      operands: x, index
//   ScatterAdd      [axis]                      operands: x, index, src
//   Argsort         [axis, descending]          i64 positions that sort x along axis, stable;
//                                               NaN sorts above every number
//   Conv2d*         [stride h, w, padding h, w, dilation h, w, groups]
//                   Conv2d (x, w); BackwardInput (grad_out, w); BackwardWeight (x, grad_out)
//   *Pool2d*        [kernel h, w, stride h, w, padding h, w, count_include_pad]
//                   MaxPool2dBackward (grad_out, indices); AvgPool2dBackward (grad_out)
//   AllReduce       [scale (a double's bits), order, bucket bytes, first bucket bytes]
//                   sum over the ranks times scale; order >= 0: a gradient DataParallel averages,
//                   bucketed with the others by the backend (order -1: on its own)
//   Broadcast       [root]                      the root rank's value on every rank
// Reshape, Expand, Cast, the conv/pool backward ops take their result shape/dtype from the node.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <source_location>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/dtype.h"

namespace lockstep::runtime {
struct Buffer;
}
namespace lockstep::detail {
struct TensorImpl;
}
namespace lockstep {
class Tensor;
}

namespace lockstep::ir {

enum class Op : uint16_t {
#define LS_OP(name, arity, diff) name,
#include "ir/ops.def"
#undef LS_OP
};

inline constexpr int kNumOps = 0
#define LS_OP(name, arity, diff) +1
#include "ir/ops.def"
#undef LS_OP
    ;

struct OpInfo {
  const char* name;  // snake_case, as printed in IR text
  int arity;         // -1: variadic
  bool differentiable;
};
const OpInfo& op_info(Op op);
// The name users call an op by, for error messages (the IR name differs for a few, e.g.
// mat_mul is matmul).
const char* user_name(Op op);
// Op by its IR name; false if unknown.
bool op_from_name(const std::string& name, Op* op);

// A host scalar's value: `f` for floating dtypes, `i` for integers and bool.
struct ScalarValue {
  double f = 0;
  int64_t i = 0;
};

struct Node;
using NodePtr = std::shared_ptr<const Node>;

// A composite's own gradient rule (e.g. batch norm's): backward hands it the gradient of the
// node's value and gets the gradients of `inputs` (an undefined Tensor where one gets none),
// instead of walking through the primitives the value was recorded from.
struct GradFn {
  std::vector<NodePtr> inputs;
  std::function<std::vector<Tensor>(const Tensor& grad)> fn;
};

struct Node {
  Op op;
  std::vector<NodePtr> operands;
  std::vector<int64_t> attrs;
  Shape shape;
  DType dtype;
  Device device;
  // The user's line that recorded it, and the path of the module it was recorded in (null
  // outside modules): util/frames.h.
  std::source_location loc;
  std::shared_ptr<const std::string> module;
  int16_t backward_of = -1;  // a gradient node: the Op of the node whose gradient it computes
  std::shared_ptr<runtime::Buffer> buffer;  // Data only
  ScalarValue scalar;                       // Scalar only: runtime data, never hashed
  // Autograd annotations (never hashed). A node requires grad when recorded in grad mode from
  // an operand that does. `grad_leaf` marks the value of a leaf tensor (a parameter) whose
  // .grad() receives the gradient; `grad_alias` is the recorded node a materialized Data node
  // stands for, so backward can go on through a value that was already computed.
  bool requires_grad = false;
  std::weak_ptr<detail::TensorImpl> grad_leaf;
  NodePtr grad_alias;
  std::shared_ptr<const GradFn> grad_fn;  // set: backward uses it instead of the op's rule
  // Scratch of the graph builder (runtime/graph_builder.cpp), which runs under the runtime's
  // lock: the node's number in the graph being built, valid while build_epoch is current.
  mutable uint64_t build_epoch = 0;
  mutable int32_t build_id = -1;

  Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
  // Releases operand chains iteratively: a long chain of in-place updates must not overflow
  // the stack when it dies.
  ~Node();
};

// Infers shape and dtype of `op` applied to `operands` with `attrs`; throws Error naming the op,
// the operand shapes, the user's source line and the fix. `dtype` is an in/out hint used by ops
// whose result dtype is chosen by the caller (Cast, Iota, RandomUniform, Scalar, Data), and
// `shape` likewise for ops whose result shape is chosen (Reshape, Expand, Iota, backward ops).
void infer(Op op, const std::vector<NodePtr>& operands, const std::vector<int64_t>& attrs,
           Shape* shape, DType* dtype, const std::source_location& loc);

// Whether ops record gradient information on this thread (see ls::NoGrad).
bool grad_enabled();
// Nodes recorded on this thread since the runtime last reset the count (at each sync).
int64_t& recorded_nodes();

// While alive, the nodes this thread records compute the gradient of `forward` (autograd): they
// carry its op (Node::backward_of), its module path, and its line in place of lockstep's own.
class BackwardOf {
 public:
  explicit BackwardOf(const Node* forward);
  ~BackwardOf();
  BackwardOf(const BackwardOf&) = delete;
  BackwardOf& operator=(const BackwardOf&) = delete;

 private:
  const Node* previous_;
};
void set_grad_enabled(bool enabled);

// Records a node: checks it (infer) and builds it. All operands must be on `device`.
NodePtr make_node(Op op, std::vector<NodePtr> operands, std::vector<int64_t> attrs, Shape shape,
                  DType dtype, const std::source_location& loc);
// A node without operands (Iota) on `device`.
NodePtr make_leaf(Op op, std::vector<int64_t> attrs, Shape shape, DType dtype, Device device,
                  const std::source_location& loc);
// `loc`: the line that made the value (the upload, or the op whose result it holds), for messages.
NodePtr make_data(std::shared_ptr<runtime::Buffer> buffer, const Shape& shape, DType dtype,
                  Device device, const std::source_location& loc = {});
NodePtr make_scalar(ScalarValue value, DType dtype, Device device, const std::source_location& loc);
// A copy of `n` (same op, operands and data) with other autograd annotations.
NodePtr annotated(const NodePtr& n, bool requires_grad, std::weak_ptr<detail::TensorImpl> leaf,
                  NodePtr alias, std::shared_ptr<const GradFn> grad_fn = nullptr);

struct GraphNode {
  Op op;
  std::vector<int32_t> operands;  // indices of earlier nodes
  std::vector<int64_t> attrs;
  Shape shape;
  DType dtype;
  int32_t input = -1;  // Data: index into the buffer inputs; Scalar: into the scalar inputs
  std::source_location loc;
  std::shared_ptr<const std::string> module;  // as Node::module
  int16_t backward_of = -1;                   // as Node::backward_of
  std::shared_ptr<const std::string> name;    // Data: the module parameter or buffer it holds
};

// A data-free program: what a backend compiles. Nodes are in topological order.
struct Graph {
  Device device;
  std::vector<GraphNode> nodes;
  std::vector<int32_t> outputs;
  int32_t num_buffer_inputs = 0;
  int32_t num_scalar_inputs = 0;
};

// IR text, one node per line: "%2 = add(%0, %1) f32[2, 3]" (attrs in braces, inputs numbered).
// With `annotate`, each node line ends with "  # file:line in module.path", the user's line
// that recorded it (LOCKSTEP_DUMP's graph files; from_text skips such comments).
std::string to_text(const Graph& graph, bool annotate = false);
// The graph to_text printed (for tests of passes: graph text in). The header line may be left
// out (device cpu; the input counts are taken from the nodes). Throws Error naming the line.
Graph from_text(std::string_view text);

}  // namespace lockstep::ir
