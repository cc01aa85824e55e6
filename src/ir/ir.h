// The IR: immutable nodes recorded by tensor operations, and the Graph a step compiles.
// Nodes are shared (a tensor's pending value is a node); a Graph is a flat, canonical, data-free
// copy of the nodes one sync needs, which is what gets hashed, cached and handed to a backend.
//
// Node::attrs per op (all int64):
//   Iota            [axis]                      values 0..n-1 along axis
//   RandomUniform   []                          operand: i64[2] generator state {seed, counter}
//   Sum/Max/Min/ArgMax/ArgMin  [keepdim, axes...]  axes sorted, non-negative, unique
//   Permute         [perm...]
//   Slice           ir::SliceAttrs (attrs.h)
//   Concat          [axis]
//   Pad             [before0, after0, before1, after1, ...]   operand 1: the 0-d fill value
//   Gather          [axis]                      operands: x, index
//   ScatterAdd      [axis]                      operands: x, index, src
//   Argsort         [axis, descending]          i64 positions that sort x along axis, stable;
//                                               NaN sorts above every number
//   Conv2d*         ir::ConvAttrs (attrs.h)
//                   Conv2d (x, w); BackwardInput (grad_out, w); BackwardWeight (x, grad_out)
//   *Pool2d*        ir::PoolAttrs (attrs.h)
//                   MaxPool2dBackward (grad_out, indices); AvgPool2dBackward (grad_out)
//   AllReduce       ir::AllReduceAttrs (attrs.h): the sum over the ranks times a scale (or
//                                               a reduce: the sum on one root rank alone)
//   Broadcast       ir::BroadcastAttrs (attrs.h): the root rank's value on every rank: of its
//                                               last operand; any before it only order it after
//                                               them (a gather: a sharded parameter's)
// Reshape, Expand, Cast, the conv/pool backward ops take their result shape/dtype from the node.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/dtype.h"
#include "lockstep/loc.h"

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
#define LS_OP(name, arity, family, admits, props, user) name,
#include "ir/ops.def"
#undef LS_OP
};

inline constexpr int kNumOps = 0
#define LS_OP(name, arity, family, admits, props, user) +1
#include "ir/ops.def"
#undef LS_OP
    ;

// What kind of op it is (the table's family column).
enum class OpFamily : uint8_t {
  Leaf,         // no operands computed: Data, Scalar, Iota
  Random,       // random bits from a generator state
  Unary,        // elementwise, one operand
  Binary,       // elementwise, two operands of one dtype and shape
  Comparison,   // elementwise, two operands of one dtype, a bool result
  Select,       // elementwise where(condition, a, b)
  Reduction,    // over axes (attrs: keepdim, axes)
  Movement,     // rearranges or copies values
  Index,        // reads or writes through index tensors, or computes them
  Contraction,  // matmul
  Convolution,  // conv2d and its gradients (attrs: ir::ConvAttrs)
  Pooling,      // max and average pooling and their gradients (attrs: ir::PoolAttrs)
  Collective,   // communicates with the other ranks of a data parallel job
  Recurrent,    // a recurrent layer over a whole sequence, and its gradient (attrs: RnnAttrs)
};
const char* family_name(OpFamily family);

// For switches over Op that treat every elementwise op (families Unary, Binary, Comparison,
// Select) alike. Inside the switch,
//   #define LS_OP(name, arity, family, admits, props, user) LS_IF_ELEMENTWISE_##family(case
//   Op::name:) #include "ir/ops.def" #undef LS_OP
// expands to their case labels, so a new elementwise op needs no edit there.
#define LS_IF_ELEMENTWISE_Unary(...) __VA_ARGS__
#define LS_IF_ELEMENTWISE_Binary(...) __VA_ARGS__
#define LS_IF_ELEMENTWISE_Comparison(...) __VA_ARGS__
#define LS_IF_ELEMENTWISE_Select(...) __VA_ARGS__
#define LS_IF_ELEMENTWISE_Leaf(...)
#define LS_IF_ELEMENTWISE_Random(...)
#define LS_IF_ELEMENTWISE_Reduction(...)
#define LS_IF_ELEMENTWISE_Movement(...)
#define LS_IF_ELEMENTWISE_Index(...)
#define LS_IF_ELEMENTWISE_Contraction(...)
#define LS_IF_ELEMENTWISE_Convolution(...)
#define LS_IF_ELEMENTWISE_Pooling(...)
#define LS_IF_ELEMENTWISE_Collective(...)
#define LS_IF_ELEMENTWISE_Recurrent(...)

// The operand dtypes an elementwise op computes on (the table's admits column).
enum class Admits : uint8_t {
  Any,      // every dtype, bool included
  Numeric,  // every dtype but bool
  Float,    // f32, f64 and bf16
};
// The admits column, at compile time too (the kernels are instantiated for admitted types only).
constexpr Admits op_admits(Op op) {
  constexpr Admits column[] = {
#define LS_OP(name, arity, family, admits, props, user) Admits::admits,
#include "ir/ops.def"
#undef LS_OP
  };
  return column[static_cast<int>(op)];
}
// Whether `admits` takes a dtype: operands are checked against it when an op is recorded.
bool admits_dtype(Admits admits, DType dtype);

// The table's property bits.
enum OpProp : uint8_t {
  Diff = 1,        // differentiable
  FailsOnInt = 2,  // may fail at run time on integer data
  Fails = 4,       // may fail at run time whatever the data
  Indexed = 8,     // operand 1 holds indices checked before the op runs
};

struct OpInfo {
  const char* name;       // snake_case, as printed in IR text
  const char* user_name;  // as users call it, for messages (mat_mul is matmul)
  int arity;              // -1: variadic
  OpFamily family;
  uint8_t props;  // OpProp bits
  bool differentiable;
};
const OpInfo& op_info(Op op);
// The name users call an op by, for error messages.
const char* user_name(Op op);
// Op by its IR name; false if unknown.
bool op_from_name(const std::string& name, Op* op);

// Why an Op::Check fails: the reasons the composite ops record as its operand 1 (0: it passes);
// the texts are Fn<Op::Check>::int_failure's (ir/elementwise.h).
enum CheckReason : int { kCheckPasses = 0, kCheckWeights = 1, kCheckProbabilities = 2 };

// Predicates over the table.
inline bool is_collective(Op op) { return op_info(op).family == OpFamily::Collective; }
inline bool is_comparison(Op op) { return op_info(op).family == OpFamily::Comparison; }
// Whether a node of `op` whose value has `dtype` may fail at run time: its data is checked
// (indices, integer division) or it waits on other ranks. A backend must not run a step that may
// fail after a write it cannot undo (see plan::Plan::last_can_fail).
bool may_fail(Op op, DType dtype);
// The operand whose values are indices into operand 0 (-1: none), checked before the op runs.
inline int index_operand(Op op) { return (op_info(op).props & Indexed) ? 1 : -1; }
// The range [0, size) the indices of an Indexed op must lie in: along `axis` of operand 0
// (gather, scatter_add), or within a plane of the result (max_pool2d_backward: axis -1).
struct IndexBound {
  int64_t size = 0;
  int64_t axis = -1;
};
IndexBound index_bound(Op op, const std::vector<int64_t>& attrs, const Shape& operand0,
                       const Shape& result);

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

// Where a node came from, for messages, dumps and explanations (never hashed). Copied whole.
struct Origin {
  // The user's line that recorded it, and the path of the module it was recorded in (null
  // outside modules): util/frames.h.
  Loc loc;
  std::shared_ptr<const std::string> module;
  // The user-facing function that recorded it from primitives (util::UserOp; null: the user
  // called the op itself).
  const char* user_op = nullptr;
  int16_t backward_of = -1;  // a gradient node: the Op of the node whose gradient it computes
  // Recorded under RankLocal: work some ranks do and others do not (a ZeRO-3 owner's update of
  // its own parameters), left out of the ranks' agreement on the program (dist/comm_agree.cpp).
  bool rank_local = false;
};

// What a leaf binds at run time (never hashed): Data's device buffer, Scalar's host value.
struct Binding {
  std::shared_ptr<runtime::Buffer> buffer;  // Data only
  ScalarValue scalar;                       // Scalar only
};

// Autograd's annotations (never hashed). A node requires grad when recorded in grad mode from an
// operand that does. `leaf` marks the value of a leaf tensor (a parameter) whose .grad() receives
// the gradient; `alias` is the recorded node a materialized Data node stands for, so backward can
// go on through a value that was already computed.
struct GradInfo {
  bool requires_grad = false;
  std::weak_ptr<detail::TensorImpl> leaf;
  NodePtr alias;
  std::shared_ptr<const GradFn> fn;  // set: backward uses it instead of the op's rule
};

// Scratch of the graph builder (runtime/graph_builder.cpp), which runs under the runtime's lock:
// the node's number in the graph being built, valid while `epoch` is current.
struct BuildScratch {
  uint64_t epoch = 0;
  int32_t id = -1;
};

// A recorded op. The first six fields are the IR (what a graph is built, hashed and compiled
// from); the rest sits beside it, each part copied whole (see annotated).
struct Node {
  Op op;
  std::vector<NodePtr> operands;
  std::vector<int64_t> attrs;
  Shape shape;
  DType dtype;
  Device device;

  Origin origin;
  Binding binding;
  GradInfo grad;
  mutable BuildScratch scratch;

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
           Shape* shape, DType* dtype, const Loc& loc);

// The most bytes one value may take: sizes, offsets and memory plans stay far from int64's limit.
inline constexpr int64_t kMaxValueBytes = int64_t{1} << 60;
// Throws Error at `loc`, naming `op`, when a value of `shape` and `dtype` has a negative size or
// would take more than kMaxValueBytes (its element or byte count would overflow on the way).
void check_size(const Shape& shape, DType dtype, const char* op, const Loc& loc);

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

// While alive, the nodes this thread records are this rank's alone (Origin::rank_local).
class RankLocal {
 public:
  RankLocal();
  ~RankLocal();
  RankLocal(const RankLocal&) = delete;
  RankLocal& operator=(const RankLocal&) = delete;

 private:
  bool previous_;
};

// Records a node: checks it (infer) and builds it. All operands must be on `device`.
NodePtr make_node(Op op, std::vector<NodePtr> operands, std::vector<int64_t> attrs, Shape shape,
                  DType dtype, const Loc& loc);
// A node without operands (Iota) on `device`.
NodePtr make_leaf(Op op, std::vector<int64_t> attrs, Shape shape, DType dtype, Device device,
                  const Loc& loc);
// `loc`: the line that made the value (the upload, or the op whose result it holds), for messages.
NodePtr make_data(std::shared_ptr<runtime::Buffer> buffer, const Shape& shape, DType dtype,
                  Device device, const Loc& loc = {});
NodePtr make_scalar(ScalarValue value, DType dtype, Device device, const Loc& loc);
// A copy of `n` (the same IR, origin and binding) with other autograd annotations.
NodePtr annotated(const NodePtr& n, GradInfo grad);

struct GraphNode {
  Op op;
  std::vector<int32_t> operands;  // indices of earlier nodes
  std::vector<int64_t> attrs;
  Shape shape;
  DType dtype;
  int32_t input = -1;  // Data: index into the buffer inputs; Scalar: into the scalar inputs
  Origin origin;       // as Node::origin
  std::shared_ptr<const std::string> name;  // Data: the module parameter or buffer it holds
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
