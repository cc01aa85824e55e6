// The library's environment variables (options.def): each declared once with its default and
// meaning, all read together the first time any is asked for. Not for the settings a program
// makes through the API (ls::set_num_threads, ls::dist::set_timeout, ...), which take precedence
// where both exist.
#pragma once

#include <span>
#include <string>

namespace lockstep::util {

enum class Option {
#define LS_OPTION(id, name, fallback, meaning) id,
#include "util/options.def"
#undef LS_OPTION
};

struct OptionInfo {
  const char* name;      // LOCKSTEP_...
  const char* fallback;  // the value when unset or empty
  const char* meaning;
};
std::span<const OptionInfo> options();
const OptionInfo& option_info(Option option);

// The option's value from the environment, else its default.
const std::string& option(Option option);
// Whether it is on: set to anything but "" or "0".
bool option_on(Option option);

}  // namespace lockstep::util
