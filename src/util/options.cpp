// The environment variables of options.def, read once.
#include "util/options.h"

#include <cstdlib>
#include <vector>

namespace lockstep::util {
namespace {

constexpr OptionInfo kOptions[] = {
#define LS_OPTION(id, name, fallback, meaning) {name, fallback, meaning},
#include "util/options.def"
#undef LS_OPTION
};

const std::vector<std::string>& values() {
  static const std::vector<std::string> v = [] {
    std::vector<std::string> out;
    for (const OptionInfo& o : kOptions) {
      const char* e = std::getenv(o.name);
      out.emplace_back(e && *e ? e : o.fallback);
    }
    return out;
  }();
  return v;
}

}  // namespace

std::span<const OptionInfo> options() { return kOptions; }

const OptionInfo& option_info(Option option) { return kOptions[static_cast<int>(option)]; }

const std::string& option(Option option) { return values()[static_cast<size_t>(option)]; }

bool option_on(Option option) {
  const std::string& v = util::option(option);
  return !v.empty() && v != "0";
}

}  // namespace lockstep::util
