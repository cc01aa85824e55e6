// How lockstep reports errors: user errors name the op, what was wrong, where (the user's line)
// and how to fix it; internal checks name the broken invariant.
#pragma once

#include <sstream>
#include <string>
#include <string_view>

#include "lockstep/error.h"
#include "lockstep/loc.h"

namespace lockstep::util {

std::string where(const Loc& loc);

// Throws Error("<op>: <what> (at <file:line>). <fix>").
[[noreturn]] void fail(const Loc& loc, std::string_view op, const std::string& what,
                       const std::string& fix);

[[noreturn]] void internal_fail(const char* file, int line, const std::string& what);

// Concatenates anything streamable into a string.
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

}  // namespace lockstep::util

#define LS_INTERNAL_CHECK(cond, ...)                                                      \
  do {                                                                                    \
    if (!(cond))                                                                          \
      ::lockstep::util::internal_fail(__FILE__, __LINE__,                                 \
                                      ::lockstep::util::cat(#cond, ": ", ##__VA_ARGS__)); \
  } while (0)
