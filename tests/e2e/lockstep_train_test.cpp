// End-to-end tests of the lockstep-train program (tools/lockstep-train.cpp): each runs the built
// binary (LOCKSTEP_TRAIN_EXE) with posix_spawn, stdout and stderr going to files, and checks its
// output and exit code. Data is fake or a tiny synthetic IDX dataset written here: no network,
// no Python, no real dataset.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

extern char** environ;

namespace fs = std::filesystem;

namespace {

// A fresh directory under the system temp dir, removed with the object.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "lockstep-train-e2e-XXXXXX").string();
    if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Result {
  int exit_code = -1;  // 128 + signal when killed by one
  std::string out, err;
};

// Starts lockstep-train with `args`, stdout and stderr to files in `dir`.
class Process {
 public:
  Process(const std::vector<std::string>& args, const TempDir& dir, const std::string& tag)
      : out_path_(dir / (tag + ".out")), err_path_(dir / (tag + ".err")) {
    std::vector<std::string> argv_s = {LOCKSTEP_TRAIN_EXE};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int rc = posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) throw std::runtime_error(std::string("posix_spawn failed for ") + argv[0]);
  }
  ~Process() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const { return pid_; }
  std::string out_so_far() const { return read_file(out_path_); }
  Result wait() {
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    Result r;
    r.exit_code = WIFEXITED(status)     ? WEXITSTATUS(status)
                  : WIFSIGNALED(status) ? 128 + WTERMSIG(status)
                                        : -1;
    r.out = read_file(out_path_);
    r.err = read_file(err_path_);
    return r;
  }

 private:
  std::string out_path_, err_path_;
  pid_t pid_ = -1;
};

Result run(const std::vector<std::string>& args, const TempDir& dir, const std::string& tag) {
  return Process(args, dir, tag).wait();
}

std::string describe(const Result& r) {
  return "exit code " + std::to_string(r.exit_code) + "\n--- stdout ---\n" + r.out +
         "--- stderr ---\n" + r.err;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// Matches a whole line against a pattern of literal text and placeholders, each captured:
// {D} one or more digits, {F2} / {F4} digits, '.', exactly 2 / 4 digits. (No std::regex: GCC
// 12 warns inside <regex> in sanitizer builds, and warnings are errors.)
std::optional<std::vector<std::string>> match(const std::string& line, const std::string& pattern) {
  auto digits = [&](size_t& i) {
    const size_t start = i;
    while (i < line.size() && line[i] >= '0' && line[i] <= '9') ++i;
    return i - start;
  };
  std::vector<std::string> captures;
  size_t i = 0, p = 0;
  while (p < pattern.size()) {
    if (pattern[p] == '{') {
      const size_t close = pattern.find('}', p);
      const std::string kind = pattern.substr(p + 1, close - p - 1);
      const size_t start = i;
      if (digits(i) == 0) return std::nullopt;
      if (kind == "F2" || kind == "F4") {
        if (i >= line.size() || line[i] != '.') return std::nullopt;
        ++i;
        if (digits(i) != (kind == "F2" ? 2u : 4u)) return std::nullopt;
      }
      captures.push_back(line.substr(start, i - start));
      p = close + 1;
    } else {
      if (i >= line.size() || line[i] != pattern[p]) return std::nullopt;
      ++i, ++p;
    }
  }
  if (i != line.size()) return std::nullopt;
  return captures;
}

// The captures of the first line of `out` that matches `pattern`.
std::optional<std::vector<std::string>> find_line(const std::string& out,
                                                  const std::string& pattern) {
  for (const std::string& l : lines(out))
    if (auto m = match(l, pattern)) return m;
  return std::nullopt;
}

// "epoch: E, step: S, loss: L, rate: R" lines, by (epoch, step), with the loss as printed.
using StepKey = std::pair<int, int>;
std::map<StepKey, std::string> step_losses(const std::string& out) {
  std::map<StepKey, std::string> losses;
  for (const std::string& l : lines(out))
    if (auto m = match(l, "epoch: {D}, step: {D}, loss: {F4}, rate: {F2}"))
      losses[{std::stoi((*m)[0]), std::stoi((*m)[1])}] = (*m)[2];
  return losses;
}

const std::string kTotal = "total: images/s {F2}, compiles {D}, cache_hits {D}, implicit_syncs {D}";

// Flags every small run shares: one compute thread and one loader thread (ctest runs tests in
// parallel on small machines).
std::vector<std::string> with_common(std::vector<std::string> args) {
  for (const char* a : {"--threads", "1", "--workers", "1"}) args.push_back(a);
  return args;
}

// The small CNN on fake 3x8x8 images: fast, with BatchNorm buffers and momentum state, so a
// resume has all kinds of state to restore.
std::vector<std::string> small_cnn(std::vector<std::string> extra) {
  std::vector<std::string> args = {"--model",      "cnn", "--data",       "fake",
                                   "--image-size", "8",   "--batch-size", "16"};
  args.insert(args.end(), extra.begin(), extra.end());
  return with_common(args);
}

// ---- a tiny IDX dataset --------------------------------------------------------------------
// Three easily separated classes of 28x28 images: a horizontal bar, a vertical bar, four corner
// squares; bright on dark, with noise.
void put_be32(std::string& s, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) s.push_back(static_cast<char>((v >> shift) & 0xff));
}

std::pair<std::string, std::string> make_idx(int count, uint32_t seed) {
  std::string images, labels;
  put_be32(images, 2051);
  put_be32(images, static_cast<uint32_t>(count));
  put_be32(images, 28);
  put_be32(images, 28);
  put_be32(labels, 2049);
  put_be32(labels, static_cast<uint32_t>(count));
  uint32_t state = seed;
  auto noise = [&] {
    state = state * 1664525u + 1013904223u;
    return static_cast<int>((state >> 24) % 61) - 30;  // [-30, 30]
  };
  for (int i = 0; i < count; ++i) {
    const int label = i % 3;
    labels.push_back(static_cast<char>(label));
    for (int r = 0; r < 28; ++r)
      for (int c = 0; c < 28; ++c) {
        bool on = false;
        if (label == 0) on = r >= 10 && r < 18;
        if (label == 1) on = c >= 10 && c < 18;
        if (label == 2) on = (r < 8 || r >= 20) && (c < 8 || c >= 20);
        const int v = (on ? 200 : 30) + noise();
        images.push_back(static_cast<char>(static_cast<uint8_t>(std::clamp(v, 0, 255))));
      }
  }
  return {images, labels};
}

void write_plain(const std::string& path, const std::string& data) {
  std::ofstream(path, std::ios::binary) << data;
}

void write_gz(const std::string& path, const std::string& data) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, data.data(), static_cast<unsigned>(data.size())),
            static_cast<int>(data.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

// Train split plain, test split gzipped (both readers are exercised).
void write_tiny_mnist(const TempDir& dir) {
  auto [train_images, train_labels] = make_idx(300, 1);
  auto [test_images, test_labels] = make_idx(90, 2);
  write_plain(dir / "train-images-idx3-ubyte", train_images);
  write_plain(dir / "train-labels-idx1-ubyte", train_labels);
  write_gz(dir / "t10k-images-idx3-ubyte.gz", test_images);
  write_gz(dir / "t10k-labels-idx1-ubyte.gz", test_labels);
}

// ---- tests ----------------------------------------------------------------------------------

TEST(LockstepTrain, HelpPrintsUsageAndExitsZero) {
  TempDir dir;
  Result r = run({"--help"}, dir, "help");
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.out.find("usage: lockstep-train"), std::string::npos);
  for (const char* flag :
       {"--model", "--data", "--batch-size", "--num-epochs", "--num-steps", "--lr", "--momentum",
        "--weight-decay", "--optimizer", "--image-size", "--threads", "--log-steps", "--seed",
        "--checkpoint", "--resume", "--metrics", "--device", "--stem"})
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag;
  EXPECT_EQ(r.err, "");
}

TEST(LockstepTrain, FakeDataPrintsStepLinesAndTotal) {
  TempDir dir;
  Result r =
      run(with_common({"--model", "mlp", "--data", "fake", "--image-size", "8", "--batch-size",
                       "16", "--num-epochs", "2", "--num-steps", "5", "--log-steps", "2",
                       "--metrics", "--metrics-json", (dir.path() / "metrics.json").string()}),
          dir, "fake");
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const auto losses = step_losses(r.out);
  std::vector<StepKey> keys;
  for (const auto& [k, loss] : losses) keys.push_back(k);
  const std::vector<StepKey> expected = {{1, 0}, {1, 2}, {1, 4}, {2, 0}, {2, 2}, {2, 4}};
  EXPECT_EQ(keys, expected) << describe(r);
  // Random labels over 10 classes: the loss starts near ln(10).
  EXPECT_NEAR(std::stod(losses.at({1, 0})), 2.3, 0.5) << describe(r);
  const auto total = find_line(r.out, kTotal);
  ASSERT_TRUE(total) << describe(r);
  EXPECT_LE(std::stoi((*total)[1]), 2) << "a training loop compiles at most twice\n" << describe(r);
  EXPECT_GE(std::stoi((*total)[2]), 8) << describe(r);
  EXPECT_EQ((*total)[3], "0") << "logging must not force a sync\n" << describe(r);
  EXPECT_NE(r.out.find("compiles"), r.out.rfind("compiles")) << "--metrics prints the report";
  EXPECT_EQ(r.out.find("test_accuracy"), std::string::npos) << "fake data has no test split";
  // The JSON report: 10 steps, and the training step's site among the sites.
  std::ifstream in(dir.path() / "metrics.json");
  const std::string json((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(json.find("\"schema\": \"lockstep-metrics/1\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"steps\": 10"), std::string::npos) << json;
  EXPECT_NE(json.find("\"site\": \"step at "), std::string::npos) << json;
}

// The header line names a resnet's stem, and --stem chooses it: at 32x32 `auto` takes the small
// stem, and `imagenet` gives torchvision's (visible in the checkpoint as a 7x7 conv1).
TEST(LockstepTrain, HeaderNamesTheResNetStem) {
  TempDir dir;
  struct Case {
    std::vector<std::string> stem;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{}, "resnet18 (small stem: 3x3/1 conv, no max-pool, --stem auto) on fake"},
      {{"--stem", "imagenet"}, "resnet18 (imagenet stem: 7x7/2 conv, 3x3/2 max-pool) on fake"},
      {{"--stem", "small"}, "resnet18 (small stem: 3x3/1 conv, no max-pool) on fake"},
  };
  int i = 0;
  for (const Case& c : cases) {
    std::vector<std::string> args = {"--model",      "resnet18", "--data",       "fake",
                                     "--image-size", "32",       "--batch-size", "2",
                                     "--num-steps",  "1"};
    args.insert(args.end(), c.stem.begin(), c.stem.end());
    Result r = run(with_common(args), dir, "stem" + std::to_string(i++));
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    const auto out = lines(r.out);
    ASSERT_FALSE(out.empty()) << describe(r);
    EXPECT_NE(out[0].find(c.expected), std::string::npos) << out[0];
  }
  // A non-resnet's header names no stem.
  Result r = run(with_common({"--model", "mlp", "--data", "fake", "--image-size", "8",
                              "--batch-size", "2", "--num-steps", "1"}),
                 dir, "stem-mlp");
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(r.out.find("stem"), std::string::npos) << r.out;
}

TEST(LockstepTrain, IdxDatasetTrainsAndReportsTestAccuracy) {
  TempDir dir;
  write_tiny_mnist(dir);
  // --strict: the second epoch compiles nothing (training and test programs are the first's).
  Result r =
      run(with_common({"--model", "cnn", "--data", "mnist:" + dir.path().string(), "--batch-size",
                       "30", "--num-epochs", "2", "--log-steps", "5", "--strict"}),
          dir, "idx");
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  // 300 examples in batches of 30: steps 0, 5 of each epoch.
  EXPECT_EQ(step_losses(r.out).size(), 4u) << describe(r);
  std::vector<std::pair<int, double>> accuracies;
  for (const std::string& l : lines(r.out))
    if (auto m = match(l, "epoch: {D}, test_loss: {F4}, test_accuracy: {F4}"))
      accuracies.emplace_back(std::stoi((*m)[0]), std::stod((*m)[2]));
  ASSERT_EQ(accuracies.size(), 2u) << describe(r);
  EXPECT_EQ(accuracies[0].first, 1);
  EXPECT_EQ(accuracies[1].first, 2);
  EXPECT_GE(accuracies[1].second, 0.9) << "three easily separated classes\n" << describe(r);
  const auto total = find_line(r.out, kTotal);
  ASSERT_TRUE(total) << describe(r);
  EXPECT_EQ((*total)[3], "0") << describe(r);
}

// --precision bf16 trains under autocast: the header says so and names the oneDNN kernels (and
// so the instruction set) that run; the tiny dataset is still learned, and a checkpoint written in
// bf16 (f32 weights) resumes in f32.
TEST(LockstepTrain, Bf16PrecisionTrainsAndSaysWhichKernelsRun) {
  TempDir dir;
  write_tiny_mnist(dir);
  const std::string ckpt = (dir.path() / "bf16.ckpt").string();
  Result r = run(with_common({"--model", "cnn", "--data", "mnist:" + dir.path().string(),
                              "--batch-size", "30", "--num-epochs", "2", "--log-steps", "5",
                              "--precision", "bf16", "--checkpoint", ckpt, "--strict"}),
                 dir, "bf16");
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const auto out = lines(r.out);
  ASSERT_FALSE(out.empty()) << describe(r);
  EXPECT_NE(out[0].find(", bf16 [matmul "), std::string::npos) << out[0];
  EXPECT_NE(out[0].find(", convolution "), std::string::npos) << out[0];
  double accuracy = 0;
  for (const std::string& l : out)
    if (auto m = match(l, "epoch: {D}, test_loss: {F4}, test_accuracy: {F4}"))
      accuracy = std::stod((*m)[2]);
  EXPECT_GE(accuracy, 0.9) << describe(r);
  // The same checkpoint continues in f32.
  Result resumed = run(with_common({"--model", "cnn", "--data", "mnist:" + dir.path().string(),
                                    "--batch-size", "30", "--num-epochs", "3", "--log-steps", "5",
                                    "--precision", "f32", "--checkpoint", ckpt, "--resume"}),
                       dir, "bf16-resumed");
  ASSERT_EQ(resumed.exit_code, 0) << describe(resumed);
  EXPECT_NE(lines(resumed.out)[0].find(", f32 [matmul "), std::string::npos) << resumed.out;
}

TEST(LockstepTrain, ResumeAtEpochBoundaryContinuesWithTheSameLosses) {
  TempDir dir;
  // A constant learning rate: the run cut short (1 epoch) then has the schedule of the full one.
  auto args = [&](const std::string& epochs, const std::string& ckpt) {
    return small_cnn({"--num-epochs", epochs, "--num-steps", "4", "--log-steps", "1",
                      "--lr-schedule", "constant", "--checkpoint", dir / ckpt});
  };
  Result full = run(args("3", "full.ckpt"), dir, "full");
  ASSERT_EQ(full.exit_code, 0) << describe(full);
  EXPECT_TRUE(fs::exists(dir / "full.ckpt"));
  Result first = run(args("1", "part.ckpt"), dir, "first");
  ASSERT_EQ(first.exit_code, 0) << describe(first);
  auto resume_args = args("3", "part.ckpt");
  resume_args.push_back("--resume");
  Result rest = run(resume_args, dir, "rest");
  ASSERT_EQ(rest.exit_code, 0) << describe(rest);
  EXPECT_NE(rest.out.find("resuming from"), std::string::npos) << describe(rest);

  const auto all = step_losses(full.out);
  const auto a = step_losses(first.out);
  const auto b = step_losses(rest.out);
  ASSERT_EQ(all.size(), 12u) << describe(full);
  ASSERT_EQ(a.size(), 4u) << describe(first);
  ASSERT_EQ(b.size(), 8u) << describe(rest);
  for (const auto& [key, loss] : a) EXPECT_EQ(loss, all.at(key)) << key.first << "/" << key.second;
  for (const auto& [key, loss] : b) {
    EXPECT_GE(key.first, 2) << "the resumed run starts at epoch 2";
    EXPECT_EQ(loss, all.at(key)) << "epoch " << key.first << ", step " << key.second << "\n"
                                 << describe(full) << describe(rest);
  }
}

TEST(LockstepTrain, CtrlCSavesAndResumeContinuesMidEpoch) {
  TempDir dir;
  // The default cosine schedule, the same flags in all three runs.
  auto args = [&](const std::string& ckpt) {
    auto a = small_cnn({"--num-epochs", "2", "--num-steps", "60", "--log-steps", "1"});
    if (!ckpt.empty()) a.insert(a.end(), {"--checkpoint", dir / ckpt});
    return a;
  };
  Result full = run(args(""), dir, "full");
  ASSERT_EQ(full.exit_code, 0) << describe(full);
  const auto all = step_losses(full.out);
  ASSERT_EQ(all.size(), 120u) << describe(full);

  Result cut;
  {
    Process p(args("cut.ckpt"), dir, "cut");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (p.out_so_far().find("epoch: 1, step: 3,") == std::string::npos &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    kill(p.pid(), SIGINT);
    cut = p.wait();
  }
  ASSERT_EQ(cut.exit_code, 130) << describe(cut);
  EXPECT_NE(cut.err.find("interrupted (SIGINT) at epoch"), std::string::npos) << describe(cut);
  ASSERT_TRUE(fs::exists(dir / "cut.ckpt")) << describe(cut);
  const auto a = step_losses(cut.out);
  ASSERT_GE(a.size(), 4u);
  ASSERT_LT(a.size(), 120u) << "the run was not interrupted";
  EXPECT_TRUE(find_line(cut.out, kTotal)) << describe(cut);

  auto resume_args = args("cut.ckpt");
  resume_args.push_back("--resume");
  Result rest = run(resume_args, dir, "rest");
  ASSERT_EQ(rest.exit_code, 0) << describe(rest);
  const auto b = step_losses(rest.out);
  // Together the two runs log every step exactly once, each with the loss of the full run.
  EXPECT_EQ(a.size() + b.size(), all.size()) << describe(cut) << describe(rest);
  for (const auto& [key, loss] : a) EXPECT_EQ(loss, all.at(key)) << key.first << "/" << key.second;
  for (const auto& [key, loss] : b) {
    EXPECT_EQ(a.count(key), 0u) << "step logged twice: " << key.first << "/" << key.second;
    EXPECT_EQ(loss, all.at(key)) << "epoch " << key.first << ", step " << key.second;
  }
}

TEST(LockstepTrain, BadFlagsExitTwoWithTheUsage) {
  TempDir dir;
  const std::vector<std::vector<std::string>> cases = {
      {"--bogus"},
      {"extra-argument"},
      {"--batch-size"},
      {"--batch-size", "abc"},
      {"--batch-size", "12x"},
      {"--batch-size", "0"},
      {"--batch-size", "-3"},
      {"--batch-size", "99999999999999999999999"},
      {"--num-epochs", "0"},
      {"--num-epochs", "1.5"},
      {"--num-steps", "-1"},
      {"--lr", "0"},
      {"--lr", "nan"},
      {"--lr", "fast"},
      {"--momentum", "1"},
      {"--weight-decay", "-0.1"},
      {"--model", "vgg16"},
      {"--optimizer", "adam"},
      {"--lr-schedule", "linear"},
      {"--device", "cuda"},
      {"--precision", "f16"},
      {"--precision"},
      {"--data", "imagenet"},
      {"--data", "mnist"},
      {"--data", "cifar10:"},
      {"--data", "fake:dir"},
      {"--image-size", "4", "--data", "fake"},
      {"--image-size", "30", "--data", "fake", "--model", "cnn"},
      {"--image-size", "32"},
      {"--threads", "-1"},
      {"--log-steps", "0"},
      {"--log-steps="},
      {"--seed", "-1"},
      {"--resume"},
      {"--checkpoint"},
      {"--help=yes"},
      {"--metrics=1"},
      {"--stem", "tiny", "--model", "resnet18"},
      {"--stem", "small"},
      {"--stem", "imagenet", "--model", "mlp"},
  };
  int i = 0;
  for (const auto& args : cases) {
    std::string shown;
    for (const auto& a : args) shown += a + " ";
    Result r = run(args, dir, "bad" + std::to_string(i++));
    EXPECT_EQ(r.exit_code, 2) << shown << "\n" << describe(r);
    const auto err = lines(r.err);
    ASSERT_FALSE(err.empty()) << shown;
    EXPECT_EQ(err[0].rfind("lockstep-train: error: ", 0), 0u) << shown << "\n" << r.err;
    ASSERT_GE(err.size(), 2u) << shown;
    EXPECT_EQ(err[1], "usage: lockstep-train [options]") << shown << "\n" << r.err;
    EXPECT_EQ(r.out, "") << shown;
  }
}

TEST(LockstepTrain, BadDataExitsOneWithAMessageNamingTheFile) {
  TempDir dir;
  auto [images, labels] = make_idx(40, 3);
  struct Case {
    std::string name;
    std::string data_dir;
    std::string expect_in_message;
  };
  std::vector<Case> cases;

  // Truncated pixel data (plain file).
  fs::create_directories(dir / "truncated");
  write_plain(dir / "truncated/train-images-idx3-ubyte", images.substr(0, 16 + 28 * 28 * 5 + 7));
  write_plain(dir / "truncated/train-labels-idx1-ubyte", labels);
  cases.push_back({"truncated", dir / "truncated", dir / "truncated/train-images-idx3-ubyte"});

  // A ".gz" file that is not gzip data.
  fs::create_directories(dir / "notgzip");
  write_plain(dir / "notgzip/train-images-idx3-ubyte.gz", "this is not gzip data at all\n");
  write_plain(dir / "notgzip/train-labels-idx1-ubyte", labels);
  cases.push_back({"notgzip", dir / "notgzip", dir / "notgzip/train-images-idx3-ubyte.gz"});

  // A bad magic number.
  fs::create_directories(dir / "badmagic");
  std::string bad = images;
  bad[3] = 7;
  write_plain(dir / "badmagic/train-images-idx3-ubyte", bad);
  write_plain(dir / "badmagic/train-labels-idx1-ubyte", labels);
  cases.push_back({"badmagic", dir / "badmagic", dir / "badmagic/train-images-idx3-ubyte"});

  // The labels file is missing.
  fs::create_directories(dir / "nolabels");
  write_plain(dir / "nolabels/train-images-idx3-ubyte", images);
  cases.push_back({"nolabels", dir / "nolabels", "train-labels-idx1-ubyte"});

  // The directory does not exist.
  cases.push_back({"nodir", dir / "does-not-exist", dir / "does-not-exist"});

  // A test split of another image size: refused before training (issue 30, item 12).
  fs::create_directories(dir / "testsize");
  write_plain(dir / "testsize/train-images-idx3-ubyte", images);
  write_plain(dir / "testsize/train-labels-idx1-ubyte", labels);
  std::string small, small_labels;
  for (uint32_t v : {2051u, 10u, 14u, 14u}) put_be32(small, v);
  small.append(10 * 14 * 14, '\0');
  for (uint32_t v : {2049u, 10u}) put_be32(small_labels, v);
  small_labels.append(10, '\1');
  write_plain(dir / "testsize/t10k-images-idx3-ubyte", small);
  write_plain(dir / "testsize/t10k-labels-idx1-ubyte", small_labels);
  cases.push_back({"testsize", dir / "testsize", "the test split"});

  for (const Case& c : cases) {
    Result r = run(with_common({"--model", "mlp", "--data", "mnist:" + c.data_dir}), dir, c.name);
    EXPECT_EQ(r.exit_code, 1) << c.name << "\n" << describe(r);
    EXPECT_NE(r.err.find("lockstep-train: error: "), std::string::npos) << c.name << "\n" << r.err;
    EXPECT_NE(r.err.find(c.expect_in_message), std::string::npos)
        << c.name << ": the message names " << c.expect_in_message << "\n"
        << r.err;
    EXPECT_EQ(r.err.find("usage:"), std::string::npos) << c.name << "\n" << r.err;
  }
}

TEST(LockstepTrain, CorruptCheckpointExitsOne) {
  TempDir dir;
  write_plain(dir / "bad.ckpt", "not a safetensors file");
  Result r = run(small_cnn({"--num-steps", "2", "--checkpoint", dir / "bad.ckpt", "--resume"}), dir,
                 "corrupt");
  EXPECT_EQ(r.exit_code, 1) << describe(r);
  EXPECT_NE(r.err.find(dir / "bad.ckpt"), std::string::npos) << describe(r);

  // A checkpoint of another model does not load either, and is left as it was.
  Result mlp = run(with_common({"--model", "mlp", "--data", "fake", "--image-size", "8",
                                "--num-steps", "1", "--checkpoint", dir / "mlp.ckpt"}),
                   dir, "mlp");
  ASSERT_EQ(mlp.exit_code, 0) << describe(mlp);
  const std::string before = read_file(dir / "mlp.ckpt");
  Result wrong = run(small_cnn({"--num-steps", "2", "--checkpoint", dir / "mlp.ckpt", "--resume"}),
                     dir, "wrong");
  EXPECT_EQ(wrong.exit_code, 1) << describe(wrong);
  EXPECT_NE(wrong.err.find(dir / "mlp.ckpt"), std::string::npos) << describe(wrong);
  EXPECT_EQ(read_file(dir / "mlp.ckpt"), before);
}

// Like run(), but a run still going after `limit` is killed (SIGKILL: exit code 137) and the
// test fails as a hang.
Result run_within(const std::vector<std::string>& args, const TempDir& dir, const std::string& tag,
                  std::chrono::seconds limit) {
  Process p(args, dir, tag);
  std::atomic<bool> done{false};
  std::thread watchdog([&] {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!done && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (!done) {
      ADD_FAILURE() << tag << ": still running after " << limit.count() << " s (a hang)";
      kill(p.pid(), SIGKILL);
    }
  });
  Result r = p.wait();
  done = true;
  watchdog.join();
  return r;
}

// --checkpoint or --metrics-json naming a FIFO or a device: exit 1 with the path and what it is,
// never a run blocked on opening it, and never a save over it. /dev/null is only read (--resume)
// or named for the metrics: a save over it is refused by the same check.
TEST(LockstepTrain, AFifoOrDeviceAsCheckpointOrMetricsFileExitsOne) {
  TempDir dir;
  const std::string fifo = dir / "fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"resume-fifo", {"--checkpoint", fifo, "--resume"}},
      {"save-fifo", {"--checkpoint", fifo}},
      {"metrics-fifo", {"--metrics-json", fifo}},
      {"resume-null", {"--checkpoint", "/dev/null", "--resume"}},
      {"metrics-null", {"--metrics-json", "/dev/null"}}};
  for (const auto& [tag, extra] : cases) {
    std::vector<std::string> args = {"--num-steps", "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    Result r = run_within(small_cnn(args), dir, tag, std::chrono::seconds(60));
    EXPECT_EQ(r.exit_code, 1) << tag << ": " << describe(r);
    const bool null = tag.find("null") != std::string::npos;
    EXPECT_NE(r.err.find(null ? "/dev/null" : fifo), std::string::npos) << tag << describe(r);
    EXPECT_NE(r.err.find(null ? "is a character device" : "is a FIFO"), std::string::npos)
        << tag << ": " << describe(r);
    struct stat st {};
    ASSERT_EQ(lstat(fifo.c_str(), &st), 0);
    EXPECT_TRUE(S_ISFIFO(st.st_mode)) << tag;
  }
}

}  // namespace

// A run whose loss becomes NaN (the learning rate of 10 makes it diverge) stops with exit 1 and a
// message naming the step, and never writes the non-finite model over the last good checkpoint
// (issue 30, item 11).
TEST(LockstepTrain, ANonFiniteLossStopsTheRunWithoutOverwritingTheCheckpoint) {
  TempDir dir;
  Result good = run(small_cnn({"--num-epochs", "1", "--num-steps", "4", "--optimizer", "sgd",
                               "--checkpoint", dir / "c.ckpt"}),
                    dir, "good");
  ASSERT_EQ(good.exit_code, 0) << describe(good);
  const std::string saved = read_file(dir / "c.ckpt");
  Result bad = run(small_cnn({"--num-epochs", "3", "--num-steps", "40", "--optimizer", "sgd",
                              "--lr", "10", "--momentum", "0.99", "--lr-schedule", "constant",
                              "--checkpoint", dir / "c.ckpt", "--resume"}),
                   dir, "bad");
  EXPECT_EQ(bad.exit_code, 1) << describe(bad);
  EXPECT_NE(bad.err.find("the loss is not finite at epoch 2, step "), std::string::npos)
      << describe(bad);
  EXPECT_NE(bad.err.find("keeps the last good state"), std::string::npos) << describe(bad);
  EXPECT_EQ(read_file(dir / "c.ckpt"), saved) << "the checkpoint was overwritten";
  // It still resumes.
  Result again = run(small_cnn({"--num-epochs", "2", "--num-steps", "4", "--optimizer", "sgd",
                                "--checkpoint", dir / "c.ckpt", "--resume"}),
                     dir, "again");
  EXPECT_EQ(again.exit_code, 0) << describe(again);
}

// SIGTERM (schedulers, systemd, containers), SIGHUP and SIGPIPE (`| head`) stop the run as Ctrl-C
// does: after the current step, the checkpoint saved, exit 128 + the signal (issue 30, item 7).
TEST(LockstepTrain, TermHupAndPipeSaveAndExitLikeCtrlC) {
  TempDir dir;
  for (int sig : {SIGTERM, SIGHUP, SIGPIPE}) {
    const std::string ckpt = dir / ("sig" + std::to_string(sig) + ".ckpt");
    Result cut;
    {
      Process p(small_cnn({"--num-epochs", "2", "--num-steps", "400", "--log-steps", "1",
                           "--checkpoint", ckpt}),
                dir, "sig" + std::to_string(sig));
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (p.out_so_far().find("epoch: 1, step: 3,") == std::string::npos &&
             std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      kill(p.pid(), sig);
      cut = p.wait();
    }
    EXPECT_EQ(cut.exit_code, 128 + sig) << describe(cut);
    EXPECT_NE(cut.err.find("interrupted (SIG"), std::string::npos) << describe(cut);
    EXPECT_TRUE(fs::exists(ckpt)) << describe(cut);
    EXPECT_LT(step_losses(cut.out).size(), 800u) << "the run was not interrupted";
  }
}

// How the OpenMP threads wait (ls::apply_thread_wait_default): with neither variable set,
// lockstep-train runs again with GOMP_SPINCOUNT=10000 and says so in its header; a setting of
// the user's stands.
TEST(LockstepTrain, ThreadWaitDefaultsToAShortSpinUnlessTheEnvironmentChooses) {
  TempDir dir;
  struct Saved {
    const char* name;
    std::optional<std::string> value;
  };
  std::vector<Saved> saved;
  for (const char* name : {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"}) {
    const char* v = std::getenv(name);
    saved.push_back({name, v ? std::optional<std::string>(v) : std::nullopt});
    unsetenv(name);
  }
  const std::vector<std::string> args =
      with_common({"--model", "mlp", "--data", "fake", "--image-size", "8", "--batch-size", "2",
                   "--num-steps", "2"});
  Result r = run(args, dir, "wait-default");
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(lines(r.out).at(0).find("threads, GOMP_SPINCOUNT=10000)"), std::string::npos) << r.out;
  setenv("OMP_WAIT_POLICY", "passive", 1);
  r = run(args, dir, "wait-passive");
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(lines(r.out).at(0).find("threads, OMP_WAIT_POLICY=passive)"), std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("GOMP_SPINCOUNT"), std::string::npos) << r.out;
  for (const Saved& s : saved)
    if (s.value)
      setenv(s.name, s.value->c_str(), 1);
    else
      unsetenv(s.name);
}
