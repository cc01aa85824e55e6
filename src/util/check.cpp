// Error formatting shared by every part of lockstep.
#include "util/check.h"

#include <string>

#include "util/frames.h"

namespace lockstep::util {

std::string where(const Loc& loc) {
  std::string file = loc.file_name();
  if (file.empty()) return "unknown location";
  return cat(file, ":", loc.line());
}

void fail(const Loc& loc, std::string_view op, const std::string& what, const std::string& fix) {
  // Inside a module call, the user's line and the module (util/frames.h).
  const std::shared_ptr<const std::string>& path = current_module_path();
  std::string msg = cat(op, ": ", what, " (at ", where(user_loc(loc)),
                        path && !path->empty() ? " in " + *path : std::string(), ")");
  if (!fix.empty()) msg += ". " + fix;
  throw Error(msg);
}

void internal_fail(const char* file, int line, const std::string& what) {
  throw InternalError(cat("lockstep internal error at ", file, ":", line, ": ", what,
                          " (this is a bug in lockstep; please report it)"));
}

}  // namespace lockstep::util
