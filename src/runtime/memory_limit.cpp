// ls::set_memory_limit: the most memory one compiled program may plan to take (the cpu backend
// checks its plan against it at compile time), by default what the machine has.
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <fstream>
#include <string>

#include "lockstep/runtime.h"

namespace lockstep {
namespace {

std::atomic<size_t> g_limit{0};

// A cgroup limit file's value ("max" or a number of bytes); 0 when absent or unlimited.
size_t read_limit(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return 0;
  try {
    const unsigned long long v = std::stoull(text);
    return v >= (1ull << 62) ? 0 : static_cast<size_t>(v);  // v1 says "unlimited" with ~2^63
  } catch (const std::exception&) {
    return 0;
  }
}

// The memory limit of this process's cgroup (v2, else v1); 0 if none.
size_t cgroup_limit() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("0::", 0) == 0) {  // cgroup v2: "0::/path"
      const std::string dir = "/sys/fs/cgroup" + line.substr(3);
      if (size_t v = read_limit(dir + "/memory.max")) return v;
      return read_limit("/sys/fs/cgroup/memory.max");
    }
  }
  return read_limit("/sys/fs/cgroup/memory/memory.limit_in_bytes");
}

size_t machine_memory() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  size_t total =
      pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : SIZE_MAX;
  const size_t group = cgroup_limit();
  if (group > 0 && group < total) total = group;
  return total;
}

}  // namespace

void set_memory_limit(size_t bytes) { g_limit.store(bytes); }

size_t memory_limit() {
  const size_t set = g_limit.load();
  if (set > 0) return set;
  static const size_t machine = machine_memory();
  return machine;
}

}  // namespace lockstep
