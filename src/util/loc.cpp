// Loc::intern: the strings of places made at run time (a Python frame's file and function),
// stored once each for the life of the process.
#include <mutex>
#include <string>
#include <unordered_set>

#include "lockstep/loc.h"

namespace lockstep {
namespace {

struct Interned {
  std::mutex mu;
  // Node-based: an element's address, and so its c_str(), never moves.
  std::unordered_set<std::string> strings;
};

const char* intern_string(Interned& table, std::string_view s) {
  std::lock_guard lock(table.mu);
  return table.strings.emplace(s).first->c_str();
}

Interned& table() {
  static auto* t = new Interned;  // never destroyed: Locs may be read during static teardown
  return *t;
}

}  // namespace

Loc Loc::intern(std::string_view file, uint32_t line, std::string_view function, uint32_t column) {
  Loc loc;
  loc.file_ = intern_string(table(), file);
  loc.function_ = intern_string(table(), function);
  loc.line_ = line;
  loc.column_ = column;
  return loc;
}

}  // namespace lockstep
