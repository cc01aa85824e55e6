// The library's environment variables (src/util/options.def) and the "Debug switches" table of
// docs/debugging.md list the same names, so a new switch cannot go undocumented nor a documented
// one stop existing.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "util/options.h"

namespace util = lockstep::util;

TEST(Options, DebugDocListsExactlyTheDeclaredEnvironmentVariables) {
  std::ifstream in(LOCKSTEP_DEBUG_DOC);
  ASSERT_TRUE(in) << "cannot read " << LOCKSTEP_DEBUG_DOC;
  std::set<std::string> documented;
  bool in_table = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("## ", 0) == 0) in_table = line == "## Debug switches";
    if (!in_table || line.rfind("| `LOCKSTEP_", 0) != 0) continue;
    const size_t end = line.find_first_of("=`", 3);
    documented.insert(line.substr(3, end - 3));
  }
  std::set<std::string> declared;
  for (const util::OptionInfo& o : util::options()) {
    declared.insert(o.name);
    EXPECT_NE(std::string(o.meaning), "") << o.name;
  }
  EXPECT_EQ(documented, declared);
}

TEST(Options, UnsetOptionsTakeTheirDefaults) {
  for (const char* name : {"LOCKSTEP_CONV_ALGO", "LOCKSTEP_DIST_TIMEOUT", "LOCKSTEP_DUMP_PASSES"})
    if (std::getenv(name)) GTEST_SKIP() << name << " is set in this environment";
  EXPECT_EQ(util::option(util::Option::ConvAlgo), "auto");
  EXPECT_EQ(util::option(util::Option::DistTimeout), "30");
  EXPECT_FALSE(util::option_on(util::Option::DumpPasses));
}
