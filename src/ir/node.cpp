// The op table's metadata, node construction and destruction, and IR text.
#include <cctype>
#include <sstream>
#include <string>

#include "ir/ir.h"
#include "util/check.h"

namespace lockstep::ir {
namespace {

// "MaxPool2dIndices" -> "max_pool2d_indices"
std::string snake(const char* camel) {
  std::string s;
  for (const char* p = camel; *p; ++p) {
    const bool upper = std::isupper(static_cast<unsigned char>(*p));
    if (upper && p != camel && !std::isdigit(static_cast<unsigned char>(p[-1]))) s += '_';
    s += static_cast<char>(std::tolower(static_cast<unsigned char>(*p)));
  }
  return s;
}

struct OpTable {
  std::string names[kNumOps];
  OpInfo info[kNumOps];
  OpTable() {
    int i = 0;
#define LS_OP(name, arity, diff) names[i] = snake(#name), info[i] = {nullptr, arity, diff}, ++i;
#include "ir/ops.def"
#undef LS_OP
    for (int k = 0; k < kNumOps; ++k) info[k].name = names[k].c_str();
  }
};

const OpTable& table() {
  static const OpTable t;
  return t;
}

}  // namespace

const OpInfo& op_info(Op op) { return table().info[static_cast<int>(op)]; }

bool op_from_name(const std::string& name, Op* op) {
  for (int k = 0; k < kNumOps; ++k)
    if (table().names[k] == name) {
      *op = static_cast<Op>(k);
      return true;
    }
  return false;
}

namespace {
thread_local bool t_grad_enabled = true;
}

bool grad_enabled() { return t_grad_enabled; }
void set_grad_enabled(bool enabled) { t_grad_enabled = enabled; }

Node::~Node() {
  // Operands whose last owner is this node would be destroyed recursively; instead park them on
  // a per-thread list that the outermost destructor drains.
  static thread_local std::vector<NodePtr>* draining = nullptr;
  if (grad_alias) operands.push_back(std::move(grad_alias));
  if (operands.empty()) return;
  if (draining) {
    for (NodePtr& p : operands) draining->push_back(std::move(p));
    return;
  }
  std::vector<NodePtr> list = std::move(operands);
  draining = &list;
  while (!list.empty()) {
    NodePtr p = std::move(list.back());
    list.pop_back();
    p.reset();  // may push p's operands onto `list`
  }
  draining = nullptr;
}

namespace {

NodePtr new_node(Op op, std::vector<NodePtr> operands, std::vector<int64_t> attrs, Shape shape,
                 DType dtype, Device device, const std::source_location& loc) {
  infer(op, operands, attrs, &shape, &dtype, loc);
  auto node = std::make_shared<Node>();
  node->op = op;
  node->device = device;
  node->operands = std::move(operands);
  node->attrs = std::move(attrs);
  node->shape = std::move(shape);
  node->dtype = dtype;
  node->loc = loc;
  if (t_grad_enabled && op_info(op).differentiable)
    for (const NodePtr& o : node->operands)
      node->requires_grad = node->requires_grad || o->requires_grad;
  return node;
}

}  // namespace

NodePtr make_node(Op op, std::vector<NodePtr> operands, std::vector<int64_t> attrs, Shape shape,
                  DType dtype, const std::source_location& loc) {
  for (size_t i = 0; i < operands.size(); ++i) {
    LS_INTERNAL_CHECK(operands[i] != nullptr, "null operand of ", op_info(op).name);
    if (!(operands[i]->device == operands[0]->device))
      util::fail(loc, op_info(op).name,
                 util::cat("operands are on different devices (", device_name(operands[0]->device),
                           " and ", device_name(operands[i]->device), ")"),
                 "Move one with .to(device) first");
  }
  const Device device = operands.empty() ? default_device() : operands[0]->device;
  return new_node(op, std::move(operands), std::move(attrs), std::move(shape), dtype, device, loc);
}

NodePtr make_leaf(Op op, std::vector<int64_t> attrs, Shape shape, DType dtype, Device device,
                  const std::source_location& loc) {
  return new_node(op, {}, std::move(attrs), std::move(shape), dtype, device, loc);
}

NodePtr make_data(std::shared_ptr<runtime::Buffer> buffer, const Shape& shape, DType dtype,
                  Device device) {
  auto node = std::make_shared<Node>();
  node->op = Op::Data;
  node->shape = shape;
  node->dtype = dtype;
  node->device = device;
  node->buffer = std::move(buffer);
  return node;
}

NodePtr make_scalar(ScalarValue value, DType dtype, Device device,
                    const std::source_location& loc) {
  auto node = std::make_shared<Node>();
  node->op = Op::Scalar;
  node->dtype = dtype;
  node->device = device;
  node->scalar = value;
  node->loc = loc;
  return node;
}

NodePtr annotated(const NodePtr& n, bool requires_grad, std::weak_ptr<detail::TensorImpl> leaf,
                  NodePtr alias, std::shared_ptr<const GradFn> grad_fn) {
  auto c = std::make_shared<Node>();
  c->op = n->op;
  c->operands = n->operands;
  c->attrs = n->attrs;
  c->shape = n->shape;
  c->dtype = n->dtype;
  c->device = n->device;
  c->loc = n->loc;
  c->buffer = n->buffer;
  c->scalar = n->scalar;
  c->requires_grad = requires_grad;
  c->grad_leaf = std::move(leaf);
  c->grad_alias = std::move(alias);
  c->grad_fn = std::move(grad_fn);
  return c;
}

std::string to_text(const Graph& graph) {
  std::ostringstream os;
  os << "graph(" << device_name(graph.device) << ", buffers=" << graph.num_buffer_inputs
     << ", scalars=" << graph.num_scalar_inputs << ")\n";
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const GraphNode& n = graph.nodes[i];
    os << "%" << i << " = " << op_info(n.op).name << "(";
    if (n.input >= 0) os << (n.op == Op::Scalar ? "$" : "#") << n.input;
    for (size_t k = 0; k < n.operands.size(); ++k) os << (k ? ", %" : "%") << n.operands[k];
    os << ")";
    if (!n.attrs.empty()) {
      os << " {";
      for (size_t k = 0; k < n.attrs.size(); ++k) os << (k ? ", " : "") << n.attrs[k];
      os << "}";
    }
    os << " " << dtype_name(n.dtype) << shape_str(n.shape) << "\n";
  }
  os << "return";
  for (size_t k = 0; k < graph.outputs.size(); ++k) os << (k ? ", %" : " %") << graph.outputs[k];
  os << "\n";
  return os.str();
}

}  // namespace lockstep::ir
