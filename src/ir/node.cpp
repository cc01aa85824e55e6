// The op table's metadata, node construction and destruction, and IR text.
#include <algorithm>
#include <cctype>
#include <sstream>
#include <string>

#include "ir/ir.h"
#include "util/check.h"
#include "util/frames.h"

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
#define LS_OP(name, arity, family, admits, props, user) \
  names[i] = snake(#name),                              \
  info[i] = {nullptr, user, arity, OpFamily::family, static_cast<uint8_t>(props), false}, ++i;
#include "ir/ops.def"
#undef LS_OP
    for (int k = 0; k < kNumOps; ++k) {
      info[k].name = names[k].c_str();
      if (!*info[k].user_name) info[k].user_name = info[k].name;
      info[k].differentiable = (info[k].props & Diff) != 0;
    }
  }
};

const OpTable& table() {
  static const OpTable t;
  return t;
}

}  // namespace

const OpInfo& op_info(Op op) { return table().info[static_cast<int>(op)]; }

const char* user_name(Op op) { return op_info(op).user_name; }

bool admits_dtype(Admits admits, DType dtype) {
  switch (admits) {
    case Admits::Any:
      return true;
    case Admits::Numeric:
      return dtype != DType::Bool;
    case Admits::Float:
      return is_floating(dtype);
  }
  return false;
}

const char* family_name(OpFamily family) {
  switch (family) {
    case OpFamily::Leaf:
      return "leaf";
    case OpFamily::Random:
      return "random";
    case OpFamily::Unary:
      return "unary";
    case OpFamily::Binary:
      return "binary";
    case OpFamily::Comparison:
      return "comparison";
    case OpFamily::Select:
      return "select";
    case OpFamily::Reduction:
      return "reduction";
    case OpFamily::Movement:
      return "movement";
    case OpFamily::Index:
      return "index";
    case OpFamily::Contraction:
      return "contraction";
    case OpFamily::Convolution:
      return "convolution";
    case OpFamily::Pooling:
      return "pooling";
    case OpFamily::Collective:
      return "collective";
    case OpFamily::Recurrent:
      return "recurrent";
  }
  return "?";
}

IndexBound index_bound(Op op, const std::vector<int64_t>& attrs, const Shape& operand0,
                       const Shape& result) {
  LS_INTERNAL_CHECK(index_operand(op) >= 0, op_info(op).name, " has no indices");
  if (op_info(op).family == OpFamily::Pooling) return {result[2] * result[3], -1};
  return {operand0[static_cast<size_t>(attrs[0])], attrs[0]};
}

void check_size(const Shape& shape, DType dtype, const char* op, const Loc& loc) {
  // The product of the non-zero sizes counts even for an empty value: kernels and passes multiply
  // sizes in any order, and none of those products may overflow.
  int64_t bytes = static_cast<int64_t>(dtype_size(dtype));
  bool too_large = false;
  for (int64_t d : shape) {
    if (d < 0)
      util::fail(loc, op, util::cat("negative size in shape ", shape_str(shape)),
                 "Sizes must be >= 0");
    too_large = too_large ||
                (d != 0 && (__builtin_mul_overflow(bytes, d, &bytes) || bytes > kMaxValueBytes));
  }
  if (too_large)
    util::fail(loc, op,
               util::cat("shape ", shape_str(shape), " of ", dtype_name(dtype),
                         " is too large: its byte count overflows or exceeds 2^60 bytes"),
               "Check the sizes (a negative or huge value computed by mistake?)");
}

bool may_fail(Op op, DType dtype) {
  const uint8_t props = op_info(op).props;
  return (props & (Fails | Indexed)) || ((props & FailsOnInt) && !is_floating(dtype));
}

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

namespace {
thread_local const Node* t_backward_of = nullptr;
}  // namespace

BackwardOf::BackwardOf(const Node* forward) : previous_(t_backward_of) { t_backward_of = forward; }
BackwardOf::~BackwardOf() { t_backward_of = previous_; }

namespace {
thread_local bool t_rank_local = false;
}  // namespace

RankLocal::RankLocal() : previous_(t_rank_local) { t_rank_local = true; }
RankLocal::~RankLocal() { t_rank_local = previous_; }

int64_t& recorded_nodes() {
  thread_local int64_t count = 0;
  return count;
}
void set_grad_enabled(bool enabled) { t_grad_enabled = enabled; }

Node::~Node() {
  // Operands whose last owner is this node would be destroyed recursively; instead park them on
  // a per-thread list that the outermost destructor drains.
  static thread_local std::vector<NodePtr>* draining = nullptr;
  if (grad.alias) operands.push_back(std::move(grad.alias));
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
                 DType dtype, Device device, const Loc& loc) {
  infer(op, operands, attrs, &shape, &dtype, loc);
  check_size(shape, dtype, user_name(op), loc);
  ++recorded_nodes();
  auto node = std::make_shared<Node>();
  node->op = op;
  node->device = device;
  node->operands = std::move(operands);
  node->attrs = std::move(attrs);
  node->shape = std::move(shape);
  node->dtype = dtype;
  node->origin.loc = util::user_loc(loc);
  node->origin.module = util::current_module_path();
  node->origin.user_op = util::current_user_op();
  node->origin.rank_local = t_rank_local;
  if (const Node* f = t_backward_of) {
    node->origin.backward_of = static_cast<int16_t>(f->op);
    node->origin.module = f->origin.module;
    node->origin.user_op = f->origin.user_op;
    if (util::in_library(loc)) node->origin.loc = f->origin.loc;
  }
  if (t_grad_enabled && op_info(op).differentiable)
    for (const NodePtr& o : node->operands)
      node->grad.requires_grad = node->grad.requires_grad || o->grad.requires_grad;
  return node;
}

}  // namespace

NodePtr make_node(Op op, std::vector<NodePtr> operands, std::vector<int64_t> attrs, Shape shape,
                  DType dtype, const Loc& loc) {
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
                  const Loc& loc) {
  return new_node(op, {}, std::move(attrs), std::move(shape), dtype, device, loc);
}

NodePtr make_data(std::shared_ptr<runtime::Buffer> buffer, const Shape& shape, DType dtype,
                  Device device, const Loc& loc) {
  auto node = std::make_shared<Node>();
  node->op = Op::Data;
  node->origin.loc = loc;
  node->shape = shape;
  node->dtype = dtype;
  node->device = device;
  node->binding.buffer = std::move(buffer);
  return node;
}

NodePtr make_scalar(ScalarValue value, DType dtype, Device device, const Loc& loc) {
  auto node = std::make_shared<Node>();
  node->op = Op::Scalar;
  node->dtype = dtype;
  node->device = device;
  node->binding.scalar = value;
  node->origin.loc = loc;
  return node;
}

NodePtr annotated(const NodePtr& n, GradInfo grad) {
  auto c = std::make_shared<Node>();
  c->op = n->op;
  c->operands = n->operands;
  c->attrs = n->attrs;
  c->shape = n->shape;
  c->dtype = n->dtype;
  c->device = n->device;
  c->origin = n->origin;
  c->binding = n->binding;
  c->grad = std::move(grad);
  return c;
}

std::string to_text(const Graph& graph, bool annotate) {
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
    os << " " << dtype_name(n.dtype) << shape_str(n.shape);
    if (annotate && n.origin.loc.file_name()[0] != '\0') {
      os << "  # " << util::where(n.origin.loc);
      if (n.origin.module && !n.origin.module->empty()) os << " in " << *n.origin.module;
      if (n.origin.backward_of >= 0)
        os << " (backward of " << user_name(static_cast<Op>(n.origin.backward_of)) << ")";
    }
    if (annotate && n.name)
      os << (n.origin.loc.file_name()[0] != '\0' ? ", " : "  # ") << "holds " << *n.name;
    os << "\n";
  }
  os << "return";
  for (size_t k = 0; k < graph.outputs.size(); ++k) os << (k ? ", %" : " %") << graph.outputs[k];
  os << "\n";
  return os.str();
}

namespace {

// A cursor over one line of graph text.
struct Line {
  std::string_view text;
  size_t at = 0;
  int number;
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(util::cat("ir::from_text: line ", number, ": ", what, " in '", text, "'"));
  }
  void skip_spaces() {
    while (at < text.size() && text[at] == ' ') ++at;
  }
  bool take(char c) {
    skip_spaces();
    if (at < text.size() && text[at] == c) return ++at, true;
    return false;
  }
  void expect(char c) {
    if (!take(c)) fail(util::cat("expected '", c, "'"));
  }
  int64_t integer() {
    skip_spaces();
    size_t end = at + (at < text.size() && text[at] == '-');
    while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
    if (end == at || (end == at + 1 && text[at] == '-')) fail("expected a number");
    const int64_t v = std::stoll(std::string(text.substr(at, end - at)));
    at = end;
    return v;
  }
  std::string_view word() {
    skip_spaces();
    const size_t start = at;
    while (at < text.size() &&
           (std::isalnum(static_cast<unsigned char>(text[at])) || text[at] == '_'))
      ++at;
    if (at == start) fail("expected a name");
    return text.substr(start, at - start);
  }
};

}  // namespace

Graph from_text(std::string_view text) {
  Graph g;
  g.device = Device{};
  bool header = false;
  int number = 0;
  while (!text.empty()) {
    const size_t eol = text.find('\n');
    std::string_view content = text.substr(0, eol);
    if (const size_t comment = content.find("  # "); comment != std::string_view::npos)
      content = content.substr(0, comment);
    Line line{content, 0, ++number};
    text = eol == std::string_view::npos ? std::string_view() : text.substr(eol + 1);
    line.skip_spaces();
    if (line.at == line.text.size()) continue;
    if (line.text.substr(line.at).rfind("graph(", 0) == 0) {
      if (header || !g.nodes.empty()) line.fail("a header after the first line");
      header = true;
      line.at += 6;
      g.device = parse_device(std::string(line.word()));
      continue;  // the counts follow from the nodes
    }
    if (line.text.substr(line.at).rfind("return", 0) == 0) {
      line.at += 6;
      while (line.take('%')) {
        const int64_t v = line.integer();
        if (v < 0 || v >= static_cast<int64_t>(g.nodes.size())) line.fail("no such node");
        g.outputs.push_back(static_cast<int32_t>(v));
        line.take(',');
      }
      continue;
    }
    line.expect('%');
    if (line.integer() != static_cast<int64_t>(g.nodes.size()))
      line.fail(util::cat("expected node %", g.nodes.size(), " (nodes are numbered in order)"));
    line.expect('=');
    GraphNode n;
    const std::string name(line.word());
    if (!op_from_name(name, &n.op)) line.fail("unknown op '" + name + "'");
    line.expect('(');
    while (!line.take(')')) {
      if (line.take('#') || line.take('$')) {
        n.input = static_cast<int32_t>(line.integer());
      } else {
        line.expect('%');
        const int64_t v = line.integer();
        if (v < 0 || v >= static_cast<int64_t>(g.nodes.size())) line.fail("no such operand");
        n.operands.push_back(static_cast<int32_t>(v));
      }
      line.take(',');
    }
    if (line.take('{')) {
      while (!line.take('}')) {
        n.attrs.push_back(line.integer());
        line.take(',');
      }
    }
    const std::string_view dtype = line.word();
    bool known = false;
    for (DType d :
         {DType::F32, DType::F64, DType::I32, DType::I64, DType::Bool, DType::BF16, DType::U8})
      if (dtype == dtype_name(d)) n.dtype = d, known = true;
    if (!known) line.fail(util::cat("unknown dtype '", dtype, "'"));
    line.expect('[');
    while (!line.take(']')) {
      n.shape.push_back(line.integer());
      line.take(',');
    }
    if (n.op == Op::Data) {
      if (n.input < 0) n.input = g.num_buffer_inputs;
      g.num_buffer_inputs = std::max(g.num_buffer_inputs, n.input + 1);
    } else if (n.op == Op::Scalar) {
      if (n.input < 0) n.input = g.num_scalar_inputs;
      g.num_scalar_inputs = std::max(g.num_scalar_inputs, n.input + 1);
    }
    g.nodes.push_back(std::move(n));
  }
  return g;
}

}  // namespace lockstep::ir
