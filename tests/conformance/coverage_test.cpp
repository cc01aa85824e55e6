// The suite's completeness check: every primitive op of the table (ops.def) must be declared by
// some conformance test (LS_COVERS), and every declaration must name a test that exists. Each
// test checks at run time that the ops it declares really were in the graphs it compared.
#include <set>

#include "conformance.h"

namespace conformance {
namespace {

TEST(Coverage, EveryOpHasAConformanceCase) {
  std::set<std::string> tests;
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  for (int i = 0; i < unit.total_test_suite_count(); ++i) {
    const ::testing::TestSuite& suite = *unit.GetTestSuite(i);
    for (int j = 0; j < suite.total_test_count(); ++j)
      tests.insert(std::string(suite.name()) + "." + suite.GetTestInfo(j)->name());
  }
  std::vector<bool> covered(ls::ir::kNumOps, false);
  for (const auto& [test, ops] : declared()) {
    EXPECT_TRUE(tests.count(test)) << "LS_COVERS names " << test << ", which is not a test";
    for (Op op : ops) covered[static_cast<size_t>(op)] = true;
  }
  for (int k = 0; k < ls::ir::kNumOps; ++k)
    EXPECT_TRUE(covered[k]) << "op " << ls::ir::op_info(static_cast<Op>(k)).name
                            << " has no conformance case: add one (and LS_COVERS it)";
}

}  // namespace
}  // namespace conformance
