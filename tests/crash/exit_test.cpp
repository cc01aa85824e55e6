// Exit with work queued (tests/crash/exit_worker.cpp): the queued programs and closures run
// before the process's static state goes, and an error nothing raised fails the process.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct Result {
  std::string out;
  int status = -1;  // exit status, or 128 + signal
};

Result run_worker(const std::string& mode) {
  Result r;
  FILE* p = ::popen((std::string(LOCKSTEP_EXIT_WORKER) + " " + mode + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

}  // namespace

TEST(Exit, QueuedStepsAndClosuresRunBeforeTheProcessEnds) {
  for (int round = 0; round < 5; ++round) {
    const Result r = run_worker("queued");
    EXPECT_EQ(r.status, 3) << r.out;
    for (int s = 0; s < 6; ++s)
      EXPECT_THAT(r.out, HasSubstr("step " + std::to_string(s) + " loss"));
    EXPECT_THAT(r.out, HasSubstr("main returns"));
  }
}

TEST(Exit, AnErrorNothingRaisedFailsTheProcess) {
  Result r = run_worker("throws");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("lockstep: error: thread #1: the log file is gone"));
  EXPECT_THAT(r.out, HasSubstr("nothing reported it"));
  r = run_worker("fails");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("cross_entropy at "));
  EXPECT_THAT(r.out, HasSubstr("is out of range"));
  EXPECT_THAT(r.out, Not(HasSubstr("step 5 loss")));
}
