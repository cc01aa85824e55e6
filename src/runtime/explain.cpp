// Cache-miss explanations (explain.h): the nearest earlier graph of the same site and the first
// node that differs, with the field, the old and new values and the user's line.
#include "runtime/explain.h"

#include <algorithm>
#include <map>

#include "util/check.h"

namespace lockstep::runtime {

using util::cat;

namespace {

std::string list(const std::vector<int64_t>& v, const char* prefix = "") {
  std::string out = "{";
  for (size_t i = 0; i < v.size(); ++i) out += cat(i ? ", " : "", prefix, v[i]);
  return out + "}";
}

std::string operands(const ir::GraphNode& n) {
  std::string out = "(";
  for (size_t i = 0; i < n.operands.size(); ++i) out += cat(i ? ", %" : "%", n.operands[i]);
  return out + ")";
}

std::string input(const ir::GraphNode& n) {
  if (n.input < 0) return "none";
  return cat(n.op == ir::Op::Scalar ? "host scalar #" : "input #", n.input);
}

std::string value(const ir::GraphNode& n) { return cat(dtype_name(n.dtype), shape_str(n.shape)); }

// The first field in which two nodes differ (empty: equal), with both values.
std::string compare(const ir::GraphNode& a, const ir::GraphNode& b, std::string* before,
                    std::string* after) {
  if (a.op != b.op) {
    *before = ir::user_name(a.op), *after = ir::user_name(b.op);
    return "op";
  }
  if (a.dtype != b.dtype || a.shape != b.shape) {
    *before = value(a), *after = value(b);
    return a.dtype != b.dtype ? "dtype" : "shape";
  }
  if (a.attrs != b.attrs) {
    *before = list(a.attrs), *after = list(b.attrs);
    return "attributes";
  }
  if (a.operands != b.operands) {
    *before = operands(a), *after = operands(b);
    return "operands";
  }
  if (a.input != b.input) {
    *before = input(a), *after = input(b);
    return "input";
  }
  return "";
}

// What an output is to the user: the op and the line (and module) that made it. Shapes are left
// out, so that a batch size change is explained node by node, not as other outputs.
std::string output_key(const ir::GraphNode& n) {
  std::string key = n.op == ir::Op::Data ? std::string("an input") : ir::user_name(n.op);
  key += cat(" at ", util::where(n.origin.loc));
  if (n.origin.module && !n.origin.module->empty()) key += cat(" in ", *n.origin.module);
  return key;
}

std::map<std::string, int64_t> output_keys(const ir::Graph& g) {
  std::map<std::string, int64_t> keys;
  for (int32_t o : g.outputs) ++keys[output_key(g.nodes[static_cast<size_t>(o)])];
  return keys;
}

// "the sum at train.cpp:57, the mean at train.cpp:60 and 3 more" for the keys counted positive.
std::string describe(const std::map<std::string, int64_t>& keys) {
  std::string out;
  int64_t listed = 0, rest = 0;
  for (const auto& [key, n] : keys) {
    if (n <= 0) continue;
    if (listed == 3) {
      rest += n;
      continue;
    }
    out += cat(listed++ ? ", " : "", n == 1 ? std::string("the ") : cat(n, " x the "), key);
  }
  if (rest > 0) out += cat(" and ", rest, " more");
  return out.empty() ? std::string("nothing") : out;
}

}  // namespace

GraphDifference difference(const ir::Graph& before, const ir::Graph& now) {
  GraphDifference d;
  const size_t common = std::min(before.nodes.size(), now.nodes.size());
  for (size_t i = 0; i < common; ++i) {
    std::string b, a;
    const std::string field = compare(before.nodes[i], now.nodes[i], &b, &a);
    if (field.empty()) continue;
    ++d.differing;
    if (d.node < 0) {
      d.node = static_cast<int64_t>(i);
      d.field = field, d.before = b, d.after = a;
      d.common_prefix = static_cast<int64_t>(i);
    }
  }
  const int64_t extra =
      static_cast<int64_t>(std::max(before.nodes.size(), now.nodes.size()) - common);
  d.differing += extra;
  if (d.node < 0 && extra > 0) {
    d.node = static_cast<int64_t>(common);
    d.field = "nodes";
    d.before = cat(before.nodes.size(), " nodes"), d.after = cat(now.nodes.size(), " nodes");
    d.common_prefix = static_cast<int64_t>(common);
  }
  if (d.node < 0 && before.outputs != now.outputs) {
    d.node = static_cast<int64_t>(common);
    d.field = "outputs";
    d.before = list(std::vector<int64_t>(before.outputs.begin(), before.outputs.end()), "%");
    d.after = list(std::vector<int64_t>(now.outputs.begin(), now.outputs.end()), "%");
    d.common_prefix = static_cast<int64_t>(common);
    d.differing = 1;
  }
  if (d.node < 0) d.common_prefix = static_cast<int64_t>(common);
  return d;
}

int nearest(const std::vector<std::shared_ptr<const ir::Graph>>& candidates, const ir::Graph& now,
            GraphDifference* diff) {
  int best = -1;
  for (size_t k = 0; k < candidates.size(); ++k) {
    const GraphDifference d = difference(*candidates[k], now);
    if (best < 0 || d.common_prefix > diff->common_prefix ||
        (d.common_prefix == diff->common_prefix && d.differing <= diff->differing)) {
      best = static_cast<int>(k);
      *diff = d;
    }
  }
  return best;
}

debug::CacheMiss explain_miss(const std::string& site, int64_t compiles_before,
                              const std::vector<std::shared_ptr<const ir::Graph>>& candidates,
                              const ir::Graph& now, const std::string& setting_change) {
  debug::CacheMiss m;
  m.site = site;
  m.compiles_at_site = compiles_before + 1;
  GraphDifference d;
  const int best = nearest(candidates, now, &d);
  if (best < 0) {
    m.first = true;
    m.text = cat(site, ": first compile at this site (", now.nodes.size(), " nodes)");
    return m;
  }
  // Another set of outputs (a value kept after the step on some steps only) renumbers the whole
  // graph: said as such, by the lines that made the outputs, unless an earlier graph had the same
  // outputs (then the nearest of those is compared node by node).
  const std::map<std::string, int64_t> now_keys = output_keys(now);
  std::vector<std::shared_ptr<const ir::Graph>> same_outputs;
  for (const auto& c : candidates)
    if (output_keys(*c) == now_keys) same_outputs.push_back(c);
  if (same_outputs.empty()) {
    std::map<std::string, int64_t> added = now_keys, dropped = output_keys(*candidates[best]);
    for (auto& [key, n] : added) {
      auto it = dropped.find(key);
      if (it == dropped.end()) continue;
      const int64_t common = std::min(n, it->second);
      n -= common;
      it->second -= common;
    }
    m.field = "outputs";
    m.before = describe(dropped);
    m.after = describe(added);
    // The first output added (else dropped): its op and line.
    for (const std::map<std::string, int64_t>* side : {&added, &dropped})
      for (const auto& [key, n] : *side)
        if (n > 0 && m.where.empty()) {
          const size_t at = key.find(" at ");
          m.op = key.substr(0, at);
          m.where = key.substr(at + 4);
          m.where = m.where.substr(0, m.where.find(" in "));
        }
    m.text = cat(site, ": compile #", m.compiles_at_site,
                 " at this site: the step keeps other values than before: added ", m.after,
                 "; dropped ", m.before,
                 ". A value kept after the step on some steps only (held by a closure or a "
                 "variable) makes another program: keep the same values every step (e.g. hold "
                 "the loss every step and read it only when logging)");
    return m;
  }
  if (same_outputs.size() < candidates.size()) nearest(same_outputs, now, &d);
  if (d.node < 0 && !setting_change.empty()) {
    m.field = "setting";
    m.text = cat(site, ": compile #", m.compiles_at_site,
                 " at this site: the same graph as one compiled here before, for another backend "
                 "setting (",
                 setting_change, "): a program is built for the setting in force");
    return m;
  }
  if (d.node < 0) {
    // The same program as one compiled here before: dropped from the cache since.
    m.field = "evicted";
    m.text = cat(site, ": compile #", m.compiles_at_site,
                 " at this site: the same graph as one compiled here before, dropped from the "
                 "compile cache since (it keeps the most recently used programs: "
                 "ls::set_compile_cache_capacity)");
    return m;
  }
  m.node = d.node;
  m.field = d.field;
  m.before = d.before;
  m.after = d.after;
  m.more = std::max<int64_t>(d.differing - 1, 0);
  const bool in_now = d.node < static_cast<int64_t>(now.nodes.size());
  if (in_now) {
    const ir::GraphNode& n = now.nodes[static_cast<size_t>(d.node)];
    m.op = ir::user_name(n.op);
    m.where = util::where(n.origin.loc);
    if (n.origin.module && !n.origin.module->empty()) m.module = *n.origin.module;
    if (n.origin.backward_of >= 0)
      m.backward_of = ir::user_name(static_cast<ir::Op>(n.origin.backward_of));
  }
  m.text = cat(site, ": compile #", m.compiles_at_site, " at this site: the nearest of ",
               candidates.size(), " earlier graph", candidates.size() == 1 ? "" : "s",
               " differs first at node %", d.node);
  if (in_now)
    m.text += cat(" (", m.op, " at ", m.where, m.module.empty() ? "" : " in " + m.module,
                  m.backward_of.empty() ? "" : ", backward of " + m.backward_of, ")");
  m.text += cat(": ", m.field, " ", m.before, " -> ", m.after);
  if (m.more > 0) m.text += cat("; ", m.more, " more node", m.more == 1 ? "" : "s", " differ");
  return m;
}

}  // namespace lockstep::runtime
