// The memory preflight: before a program is queued, its plan's bytes (plan_memory) against
// ls::memory_limit(). Reads only the plan, so every backend that plans memory shares it.
#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/error.h"
#include "plan/passes.h"
#include "util/check.h"

namespace lockstep::plan {

namespace {

// Bytes as "1.50 GiB (1610612736 bytes)".
std::string format_bytes(size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  char text[32];
  std::snprintf(text, sizeof text, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return u == 0 ? std::string(text) : util::cat(text, " (", bytes, " bytes)");
}

}  // namespace

// The memory preflight: a program whose plan needs more than the limit fails before it runs,
// naming what it needs and the values that need it most.
void check_memory(const Plan& p, size_t limit, const char* backend) {
  const size_t need = p.planned.total();
  if (need <= limit) return;
  // The largest values: outputs and the arena values live together at the peak.
  std::vector<std::pair<int32_t, bool>> values;  // node, is an output
  for (int32_t o : p.graph.outputs) values.emplace_back(o, true);
  for (int32_t v : p.live_at_peak) values.emplace_back(v, false);
  std::sort(values.begin(), values.end(), [&](const auto& a, const auto& b) {
    const size_t x = bytes_of(p.graph.nodes[a.first]), y = bytes_of(p.graph.nodes[b.first]);
    return x != y ? x > y : a.first < b.first;
  });
  values.erase(std::unique(values.begin(), values.end(),
                           [](const auto& a, const auto& b) { return a.first == b.first; }),
               values.end());
  std::string largest;
  for (size_t k = 0; k < values.size() && k < 5; ++k) {
    const ir::GraphNode& node = p.graph.nodes[values[k].first];
    std::ostringstream shape;
    shape << node.dtype << "[";
    for (size_t d = 0; d < node.shape.size(); ++d) shape << (d ? ", " : "") << node.shape[d];
    shape << "]";
    largest += util::cat(k ? "; " : "", shape.str(), " ", format_bytes(bytes_of(node)), " from ",
                         ir::user_name(node.op), values[k].second ? " (an output)" : "", " at ",
                         util::where(node.origin.loc));
  }
  throw Error(util::cat(
      backend, ": the program needs ", format_bytes(need),
      " when it runs, more than the memory limit of ", format_bytes(limit),
      " (ls::set_memory_limit; default: the machine's memory). Planned: ",
      format_bytes(p.planned.arena), " of intermediate values, ", format_bytes(p.planned.outputs),
      " of outputs, ", format_bytes(p.planned.copies + p.planned.scratch),
      " of oneDNN copies and scratch, ", format_bytes(p.planned.constants),
      " of constants. Largest values (outputs and those live at the peak): ", largest,
      ". Nothing ran. Use smaller batches or layers, or raise the limit with "
      "ls::set_memory_limit if the machine has the memory"));
}
}  // namespace lockstep::plan
