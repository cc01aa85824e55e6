// Crash-consistent checkpoints: a process saving checkpoints in a loop is killed with SIGKILL at
// random moments (LOCKSTEP_CRASH_RUNS times, default 100); every time the file at the path
// loads cleanly and is one of the saved versions, and the next save leaves no temporary file.
// A save that runs out of space (a file size limit) fails with ls::Error and keeps the previous
// checkpoint.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <lockstep/lockstep.h>
#include "crash/checkpoint_model.h"

namespace ls = lockstep;
namespace fs = std::filesystem;
using ::testing::HasSubstr;

extern char** environ;

namespace {

struct Child {
  pid_t pid = -1;
  FILE* out = nullptr;  // its standard output
};

Child spawn(const std::vector<std::string>& args) {
  int fds[2];
  if (::pipe(fds) != 0) return {};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  Child c;
  if (posix_spawn(&c.pid, argv[0], &actions, nullptr, argv.data(), environ) != 0) c.pid = -1;
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  c.out = ::fdopen(fds[0], "r");
  return c;
}

int wait_exit(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::vector<std::string> temporaries(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp-") != std::string::npos)
      out.push_back(e.path().filename().string());
  return out;
}

// The version the checkpoint at `path` holds, checked whole: every value and the metadata agree.
int64_t loaded_version(const std::string& path) {
  crash::Trainee t;
  const ls::io::Metadata meta = ls::load_checkpoint(path, t.model, &t.opt);
  const int64_t v = std::stoll(meta.at("test_version"));
  EXPECT_EQ(t.uniform_value(), static_cast<double>(v)) << "a mix of versions";
  return v;
}

struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/lockstep-crash-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path); }
};

}  // namespace

TEST(CheckpointCrash, KilledWhileSavingLeavesALoadableSavedVersion) {
  const char* env = std::getenv("LOCKSTEP_CRASH_RUNS");
  const int runs = env ? std::atoi(env) : 100;
  TempDir dir;
  const std::string path = (dir.path / "ckpt.safetensors").string();
  std::mt19937 rng(12345);
  int64_t highest = 0;
  int mid_save = 0;  // runs killed while a temporary file was being written
  for (int run = 0; run < runs; ++run) {
    Child c = spawn({LOCKSTEP_CHECKPOINT_WRITER, path, "loop"});
    ASSERT_GT(c.pid, 0);
    // Wait for its first save, then kill it at a random moment of a later one.
    long long printed = 0;
    ASSERT_EQ(std::fscanf(c.out, "%lld", &printed), 1) << "the writer saved nothing";
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 40000));
    ::kill(c.pid, SIGKILL);
    while (std::fscanf(c.out, "%lld", &printed) == 1) {
    }
    std::fclose(c.out);
    EXPECT_EQ(wait_exit(c.pid), 128 + SIGKILL);
    // One of the versions it saved: the last one it reported, or the one whose rename it had
    // done when it died.
    const int64_t v = loaded_version(path);
    EXPECT_TRUE(v == printed || v == printed + 1)
        << "run " << run << ": " << v << " after " << printed;
    highest = std::max(highest, v);
    if (!temporaries(dir.path).empty()) ++mid_save;
    // The next save (another process) leaves no temporary file behind.
    Child next = spawn({LOCKSTEP_CHECKPOINT_WRITER, path, "once", "1000000"});
    std::fclose(next.out);
    ASSERT_EQ(wait_exit(next.pid), 0);
    EXPECT_EQ(temporaries(dir.path), std::vector<std::string>{}) << "run " << run;
    EXPECT_EQ(loaded_version(path), 1000000);
  }
  EXPECT_GT(highest, 1) << "the writer was always killed during its second save";
  EXPECT_GT(mid_save, 0) << "no kill came while a save was being written";
  std::printf("%d of %d runs killed the writer while it was writing a checkpoint\n", mid_save,
              runs);
}

TEST(CheckpointCrash, AFullDiskFailsTheSaveAndKeepsThePreviousCheckpoint) {
  TempDir dir;
  const std::string path = (dir.path / "ckpt.safetensors").string();
  Child first = spawn({LOCKSTEP_CHECKPOINT_WRITER, path, "once", "5"});
  std::fclose(first.out);
  ASSERT_EQ(wait_exit(first.pid), 0);
  const auto size = fs::file_size(path);
  // Room for half the file.
  Child full = spawn({LOCKSTEP_CHECKPOINT_WRITER, path, "full", "6", std::to_string(size / 2)});
  char line[1024] = {};
  const bool said = std::fgets(line, sizeof line, full.out) != nullptr;
  std::fclose(full.out);
  EXPECT_EQ(wait_exit(full.pid), 3) << "the save should fail with ls::Error";
  ASSERT_TRUE(said);
  EXPECT_THAT(line, HasSubstr("cannot write"));
  EXPECT_THAT(line, HasSubstr(path));
  EXPECT_EQ(loaded_version(path), 5);
  EXPECT_EQ(temporaries(dir.path), std::vector<std::string>{});
}
