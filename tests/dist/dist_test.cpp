// Data parallel training over MPI, end to end: dist_worker under `mpirun --oversubscribe` with 1,
// 2 and 4 ranks. N ranks with batch B train as one process with batch N*B (same losses and
// weights within f32 reduction-order tolerance: see expect_same_training), the replicas stay
// bit-identical, over shared memory and over TCP; a rank that records another graph makes every
// rank fail with the ranks' hashes and the first differing node, well before the deadline; a rank
// that sleeps past the deadline or is killed ends the job with an error naming it.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <lockstep/io.h>
#include <lockstep/lockstep.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace ls = lockstep;

namespace {

struct Job {
  int exit_code = -1;
  std::string out;  // stdout and stderr
  double seconds = 0;
};

// Runs a shell command (killed after 120 s: a hang fails the test, never the suite).
Job run(const std::string& command) {
  const std::string cmd = "timeout -k 5 120 " + command + " 2>&1";
  Job r;
  const auto t0 = std::chrono::steady_clock::now();
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// Runs the worker under mpirun.
Job mpirun(int np, const std::string& args, const std::string& env = "",
           const std::string& mca = "") {
  return run(std::string("env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ") +
             "OMP_NUM_THREADS=1 " + env + " " + LOCKSTEP_MPIRUN +
             " --oversubscribe --bind-to none " + mca + " -np " + std::to_string(np) + " " +
             LOCKSTEP_DIST_WORKER + " " + args);
}

// "rank R step S loss L" lines: loss per (rank, step).
std::map<std::pair<int, int>, double> losses(const std::string& out) {
  std::map<std::pair<int, int>, double> m;
  std::regex line(R"(rank (\d+) step (\d+) loss (\S+))");
  for (std::sregex_iterator it(out.begin(), out.end(), line), end; it != end; ++it)
    m[{std::stoi((*it)[1]), std::stoi((*it)[2])}] = std::stod((*it)[3]);
  return m;
}

std::vector<std::string> hashes(const std::string& out) {
  std::vector<std::string> h;
  std::regex line(R"(rank \d+ final hash (\w+))");
  for (std::sregex_iterator it(out.begin(), out.end(), line), end; it != end; ++it)
    h.push_back((*it)[1]);
  return h;
}

std::string tmp(const std::string& name) {
  return testing::TempDir() + "/dist_" + std::to_string(getpid()) + "_" + name;
}

// The largest relative differences between two parameter files: element by element (relative
// to at least 1e-3), and of each tensor as a whole (|u - v| / |u| in the L2 norm).
struct WeightDiff {
  double per_element = 0, per_tensor = 0;
};
WeightDiff weight_diff(const std::string& a, const std::string& b) {
  const ls::io::Loaded x = ls::io::load_safetensors(a), y = ls::io::load_safetensors(b);
  EXPECT_EQ(x.tensors.size(), y.tensors.size());
  WeightDiff worst;
  for (size_t k = 0; k < x.tensors.size() && k < y.tensors.size(); ++k) {
    const std::vector<float> u = x.tensors[k].second.to_vector<float>();
    const std::vector<float> v = y.tensors[k].second.to_vector<float>();
    EXPECT_EQ(u.size(), v.size());
    double diff = 0, norm = 0;
    for (size_t i = 0; i < u.size() && i < v.size(); ++i) {
      const double d = 1.0 * u[i] - v[i];
      worst.per_element =
          std::max(worst.per_element, std::fabs(d) / std::max(1e-3, std::fabs(1.0 * u[i])));
      diff += d * d;
      norm += 1.0 * u[i] * u[i];
    }
    worst.per_tensor = std::max(worst.per_tensor, std::sqrt(diff / std::max(norm, 1e-30)));
  }
  return worst;
}

// N ranks with batch 16/N against one process with batch 16. The weights agree within 1e-5
// relative after SGD; AdamW divides by the root of the squared gradients' average, which
// magnifies the reduction-order differences of small gradients: 1e-4.
void expect_same_training(const std::string& model, const std::string& optim, int np,
                          const std::string& mca = "") {
  const double weight_tolerance = optim == "adamw" ? 1e-4 : 1e-5;
  const int steps = 6, global = 16;
  const std::string one = tmp(model + optim + "1.safetensors");
  const std::string many = tmp(model + optim + std::to_string(np) + ".safetensors");
  const Job ref = mpirun(1, "train " + model + " " + optim + " " + std::to_string(steps) + " " +
                                std::to_string(global) + " " + one);
  ASSERT_EQ(ref.exit_code, 0) << ref.out;
  const Job dp = mpirun(np,
                        "train " + model + " " + optim + " " + std::to_string(steps) + " " +
                            std::to_string(global / np) + " " + many,
                        "", mca);
  ASSERT_EQ(dp.exit_code, 0) << dp.out;
  const auto a = losses(ref.out), b = losses(dp.out);
  ASSERT_EQ(a.size(), static_cast<size_t>(steps)) << ref.out;
  ASSERT_EQ(b.size(), static_cast<size_t>(steps * np)) << dp.out;
  for (int s = 1; s <= steps; ++s)
    for (int r = 0; r < np; ++r) {
      const double want = a.at({0, s}), got = b.at({r, s});
      EXPECT_NEAR(got, want, 1e-5 * std::max(1.0, std::fabs(want)))
          << "rank " << r << " step " << s;
    }
  const std::vector<std::string> h = hashes(dp.out);
  ASSERT_EQ(h.size(), static_cast<size_t>(np)) << dp.out;
  for (const std::string& x : h) EXPECT_EQ(x, h[0]) << "replicas differ:\n" << dp.out;
  EXPECT_LT(weight_diff(one, many).per_element, weight_tolerance);
  std::remove(one.c_str());
  std::remove(many.c_str());
}

}  // namespace

TEST(DataParallel, MlpSgdTwoRanksTrainAsOneProcessWithTheGlobalBatch) {
  expect_same_training("mlp", "sgd", 2);
}
TEST(DataParallel, MlpAdamWFourRanks) { expect_same_training("mlp", "adamw", 4); }
TEST(DataParallel, CnnSgdTwoRanks) { expect_same_training("cnn", "sgd", 2); }
TEST(DataParallel, OverTcp) { expect_same_training("mlp", "sgd", 2, "--mca btl tcp,self"); }

// ZeRO stage 1 (ZeroRedundancyOptimizer) against DataParallel with the whole optimizer on each
// rank, same ranks, same data: every rank updates only the parameters it owns and broadcasts them,
// so the training is the same to the bit (the same per-rank losses, the same final hash), and the
// optimizer state is split: each rank keeps less than the whole, all of it together exactly once.
void expect_zero_trains_as_data_parallel(const std::string& model, const std::string& optim,
                                         int np) {
  const std::string args = "train " + model + " " + optim + " 5 4 " + tmp("zero.safetensors");
  const Job dp = mpirun(np, args);
  const Job zero = mpirun(np, args + " zero1");
  ASSERT_EQ(dp.exit_code, 0) << dp.out;
  ASSERT_EQ(zero.exit_code, 0) << zero.out;
  EXPECT_EQ(losses(zero.out), losses(dp.out)) << zero.out << dp.out;
  const std::vector<std::string> a = hashes(dp.out), b = hashes(zero.out);
  ASSERT_EQ(b.size(), static_cast<size_t>(np)) << zero.out;
  for (const std::string& h : b) EXPECT_EQ(h, a.at(0)) << zero.out << dp.out;
  std::regex line(R"(rank (\d+) zero state (\d+) of (\d+))");
  int64_t total = 0, whole = 0;
  int ranks = 0;
  for (std::sregex_iterator it(zero.out.begin(), zero.out.end(), line), end; it != end; ++it) {
    const int64_t mine = std::stoll((*it)[2]);
    whole = std::stoll((*it)[3]);
    EXPECT_GT(mine, 0) << "every rank keeps a share:\n" << zero.out;
    EXPECT_LT(mine, whole) << zero.out;
    total += mine;
    ++ranks;
  }
  EXPECT_EQ(ranks, np) << zero.out;
  EXPECT_EQ(total, whole) << "each element of state is kept once:\n" << zero.out;
  std::remove(tmp("zero.safetensors").c_str());
}

TEST(DataParallel, ZeroStage1TrainsBitForBitAsDataParallel) {
  expect_zero_trains_as_data_parallel("mlp", "adamw", 2);
  expect_zero_trains_as_data_parallel("cnn", "sgd", 4);
  // Batch norm's buffers are broadcast from rank 0 each step as well (broadcast_buffers).
  expect_zero_trains_as_data_parallel("bn", "adamw", 4);
}

// ZeRO stage 2 (`stage` "zero2") against DataParallel: each gradient reduced to its owner alone,
// the others dropped (stage 1, "zero1", keeps them: only the state is checked split).
// The same training (each step's loss within 1e-5 relative: a reduce may sum the ranks in
// another order than an all-reduce; to the bit with 2 ranks, whose sum has one order, unless the
// norm is clipped: a sum of the ranks' shares, not of all the squares in one order), the
// replicas bit-identical to each other, the optimizer state and the gradients each rank holds
// after the step split over the ranks (all of them together exactly once; each rank a share
// unless the model has fewer parameters than ranks: `shares`, how many ranks hold one). `env`:
// CLIP, NAN_AT (both runs); `mca`: the transport.
void expect_zero_trains_as_data_parallel(const std::string& stage, const std::string& model,
                                         const std::string& optim, int np,
                                         const std::string& env = "", const std::string& mca = "",
                                         int shares = -1) {
  if (shares < 0) shares = np;
  const std::string args = "train " + model + " " + optim + " 5 4 " + tmp("zero2.safetensors");
  const Job dp = mpirun(np, args, env, mca);
  const Job zero = mpirun(np, args + " " + stage, env, mca);
  ASSERT_EQ(dp.exit_code, 0) << dp.out;
  ASSERT_EQ(zero.exit_code, 0) << zero.out;
  const auto want = losses(dp.out), got = losses(zero.out);
  ASSERT_EQ(got.size(), want.size()) << zero.out;
  for (const auto& [key, loss] : want) {
    if (std::isnan(loss)) {  // the step NAN_AT made non-finite on rank 1, skipped by all
      EXPECT_TRUE(std::isnan(got.at(key))) << zero.out;
      continue;
    }
    EXPECT_NEAR(got.at(key), loss, 1e-5 * std::abs(loss))
        << "rank " << key.first << " step " << key.second << "\n"
        << zero.out;
  }
  if (np == 2 && env.find("CLIP") == std::string::npos) {  // the norm: a sum of shares
    EXPECT_EQ(hashes(zero.out), hashes(dp.out)) << zero.out << dp.out;
  }
  const std::vector<std::string> h = hashes(zero.out);
  ASSERT_EQ(h.size(), static_cast<size_t>(np)) << zero.out;
  for (const std::string& one : h) EXPECT_EQ(one, h.front()) << zero.out;
  for (const char* what : {"state", "grads"}) {
    if (stage == "zero1" && std::string(what) == "grads") continue;  // stage 1 keeps them whole
    std::regex line(std::string(R"(rank (\d+) zero )") + what + R"( (\d+) of (\d+))");
    int64_t total = 0, whole = 0;
    int ranks = 0, holding = 0;
    for (std::sregex_iterator it(zero.out.begin(), zero.out.end(), line), end; it != end; ++it) {
      const int64_t mine = std::stoll((*it)[2]);
      whole = std::stoll((*it)[3]);
      holding += mine > 0;
      EXPECT_LT(mine, whole) << what << "\n" << zero.out;
      total += mine;
      ++ranks;
    }
    EXPECT_EQ(ranks, np) << zero.out;
    EXPECT_EQ(holding, shares) << what << ": the ranks that keep a share\n" << zero.out;
    EXPECT_EQ(total, whole) << what << ": each element is kept once:\n" << zero.out;
  }
  std::remove(tmp("zero2.safetensors").c_str());
}

TEST(DataParallel, ZeroStage2TrainsAsDataParallel) {
  expect_zero_trains_as_data_parallel("zero2", "mlp", "adamw", 2);
  expect_zero_trains_as_data_parallel("zero2", "cnn", "sgd", 4);
  expect_zero_trains_as_data_parallel("zero2", "bn", "adamw", 4);
}

// Under bf16 autocast (the forward's products in bf16, the gradients of the f32 parameters f32).
TEST(DataParallel, ZeroStage2UnderBf16AutocastTrainsAsDataParallel) {
  expect_zero_trains_as_data_parallel("zero2", "mlp", "adamw", 2, "AUTOCAST=1");
  expect_zero_trains_as_data_parallel("zero2", "cnn", "sgd", 4, "AUTOCAST=1");
}

// Clipping to the global norm (each rank's share summed over the ranks) and the skip of a step
// whose gradients are not finite on one rank only (every rank skips it), as DataParallel with
// clip_grad_norm_ and skip_nonfinite; over TCP as well as shared memory. Stage 1 clips by shares
// too (scaling every gradient on every rank made the ranks' programs differ).
TEST(DataParallel, ZeroStage2ClipsAndSkipsAsDataParallel) {
  expect_zero_trains_as_data_parallel("zero1", "mlp", "adamw", 2, "CLIP=0.5 NAN_AT=3");
  expect_zero_trains_as_data_parallel("zero2", "mlp", "adamw", 2, "CLIP=0.5 NAN_AT=3");
  expect_zero_trains_as_data_parallel("zero2", "cnn", "sgd", 4, "CLIP=0.5 NAN_AT=2");
  expect_zero_trains_as_data_parallel("zero2", "mlp", "sgd", 2, "CLIP=0.5", "--mca btl tcp,self");
}

// ZeRO-3 (fully_shard): each parameter held by its owner alone and gathered where ops read it,
// its gradient reduced to the owner, which updates it: the same training as DataParallel (and as
// stage 2: the same checks), over shared memory and TCP, 2 and 4 ranks.
TEST(DataParallel, ZeroStage3TrainsAsDataParallel) {
  expect_zero_trains_as_data_parallel("zero3", "mlp", "adamw", 2);
  expect_zero_trains_as_data_parallel("zero3", "cnn", "sgd", 4);
  expect_zero_trains_as_data_parallel("zero3", "bn", "adamw", 4);
  expect_zero_trains_as_data_parallel("zero3", "deep", "sgd", 2, "", "--mca btl tcp,self");
  // Without reshard_after_forward: the backward reads the forward's gathers.
  expect_zero_trains_as_data_parallel("zero3", "mlp", "adamw", 2, "KEEP_GATHERS=1");
}

// A model of two parameters (a Linear's weight and bias) on 4 ranks: the weight, larger than an
// even share, is split over all four, so every rank keeps a share of the state and gradients
// (and under stage 3 of the parameters), though the bias goes to one rank whole; each stage trains
// as DataParallel. A sharded checkpoint the 4 ranks save resumes in one process with the
// uninterrupted run's losses.
TEST(DataParallel, EveryZeroStageTrainsWithFewerParametersThanRanks) {
  for (const char* stage : {"zero1", "zero2", "zero3"})
    expect_zero_trains_as_data_parallel(stage, "linear", "adamw", 4, "CLIP=0.5");
  const std::string dir = tmp("sharded_linear"), out = tmp("sharded_linear.safetensors");
  const Job whole = mpirun(4, "train linear adamw 6 4 " + out + " zero3");
  ASSERT_EQ(whole.exit_code, 0) << whole.out;
  const Job save =
      mpirun(4, "train linear adamw 3 4 " + out + " zero3", "CKPT_SAVE=" + dir + " CKPT_AT=3");
  ASSERT_EQ(save.exit_code, 0) << save.out;
  const Job resume = mpirun(1, "train linear adamw 6 16 " + out, "CKPT_LOAD=" + dir);
  ASSERT_EQ(resume.exit_code, 0) << resume.out;
  EXPECT_NEAR(losses(resume.out).at({0, 6}), losses(whole.out).at({0, 6}), 1e-5) << resume.out;
  std::filesystem::remove_all(dir);
  std::remove(out.c_str());
}

// Every stage splits a parameter larger than an even share of all the elements (`wide`'s first
// weight: 8,000 of 8,629), one run per rank (on 3 ranks runs of 2,666 and 2,667 elements): each
// rank updates its run and keeps its state (under stage 2 its gradient; under stage 3 the
// parameter's run too, gathered from the runs where ops read it), and the training is
// DataParallel's (the checks above: losses, replicas, every element of state kept once). No rank
// keeps more than 1.1 times an even share of the state (whole, one rank would keep 93% of it),
// nor under stage 3 plans more than 1.1 times what the 3-rank stage 3 run plans on average.
// A sharded checkpoint of runs loads at another world size and into another stage or none: 4
// ranks under stage 3 save after step 2 (the parameter's runs too; the export joins them into the
// weights the run ends with, bit for bit), 3 under stage 1 go on to step 4 (other runs, of uneven
// sizes) and save, 1 process with the plain optimizer to step 6 and saves (the whole from runs),
// 2 ranks under stage 3 to step 8 (runs from the whole), 3 ranks under stage 2 to step 10 (runs
// cut from other runs), each step's loss the uninterrupted 4-rank run's (the same global batch of
// 12 throughout).
TEST(DataParallel, ZeroSplitsAParameterLargerThanAnEvenShare) {
  expect_zero_trains_as_data_parallel("zero1", "wide", "adamw", 3);
  expect_zero_trains_as_data_parallel("zero2", "wide", "sgd", 3, "CLIP=0.5 NAN_AT=3");
  expect_zero_trains_as_data_parallel("zero3", "wide", "adamw", 3, "CLIP=0.5 NAN_AT=3");
  expect_zero_trains_as_data_parallel("zero3", "wide", "sgd", 3, "KEEP_GATHERS=1");
  const std::string out = tmp("wide.safetensors");
  for (const char* stage : {"zero2", "zero3"}) {
    const Job three = mpirun(3, std::string("train wide adamw 1 4 ") + out + " " + stage);
    ASSERT_EQ(three.exit_code, 0) << three.out;
    std::regex line(R"(rank (\d+) zero state (\d+) of (\d+))");
    int ranks = 0;
    for (std::sregex_iterator it(three.out.begin(), three.out.end(), line), end; it != end; ++it) {
      EXPECT_LE(std::stod((*it)[2]), 1.1 * std::stod((*it)[3]) / 3) << three.out;
      ++ranks;
    }
    EXPECT_EQ(ranks, 3) << three.out;
    std::regex planned(R"(rank (\d+) planned bytes (\d+))");
    std::vector<double> bytes;
    for (std::sregex_iterator it(three.out.begin(), three.out.end(), planned), end; it != end; ++it)
      bytes.push_back(std::stod((*it)[2]));
    ASSERT_EQ(bytes.size(), 3u) << three.out;
    const double mean = (bytes[0] + bytes[1] + bytes[2]) / 3;
    for (double b : bytes) EXPECT_LE(b, 1.1 * mean) << stage << "\n" << three.out;
  }

  const std::string dir = tmp("sharded_wide");
  std::filesystem::remove_all(dir);
  auto job = [&](int np, int steps, const std::string& stage, const std::string& env) {
    return mpirun(np,
                  "train wide adamw " + std::to_string(steps) + " " + std::to_string(12 / np) +
                      " " + out + (stage.empty() ? "" : " " + stage),
                  env);
  };
  const Job whole = job(4, 10, "zero2", "");
  ASSERT_EQ(whole.exit_code, 0) << whole.out;
  const auto want = losses(whole.out);
  struct Leg {
    int np, last;
    const char* stage;
  };
  const Leg legs[] = {
      {4, 2, "zero3"}, {3, 4, "zero1"}, {1, 6, ""}, {2, 8, "zero3"}, {3, 10, "zero2"}};
  for (const Leg& leg : legs) {
    const std::string env = std::string(leg.last > 2 ? "CKPT_LOAD=" + dir + " " : "") +
                            "CKPT_SAVE=" + dir + " CKPT_AT=" + std::to_string(leg.last);
    const Job got = job(leg.np, leg.last, leg.stage, env);
    ASSERT_EQ(got.exit_code, 0) << got.out;
    if (leg.last == 2) {  // the export of the runs: the weights the run ended with
      const std::string exported = tmp("wide_exported.safetensors");
      ls::dist::export_safetensors(dir, exported);
      const ls::io::Loaded x = ls::io::load_safetensors(exported),
                           y = ls::io::load_safetensors(out);
      ASSERT_EQ(x.tensors.size(), y.tensors.size());
      std::map<std::string, std::vector<float>> ended;
      for (const auto& [name, t] : y.tensors) ended[name] = t.to_vector<float>();
      for (const auto& [name, t] : x.tensors) {
        ASSERT_TRUE(ended.count(name)) << name;
        EXPECT_EQ(t.to_vector<float>(), ended[name]) << name;
      }
      std::remove(exported.c_str());
    }
    const auto l = losses(got.out);
    EXPECT_EQ(l.size(), static_cast<size_t>(2 * leg.np)) << got.out;
    for (const auto& [key, loss] : l)
      EXPECT_NEAR(loss, want.at({0, key.second}), 1e-5)
          << leg.np << " ranks " << leg.stage << ", rank " << key.first << " step " << key.second;
  }
  std::filesystem::remove_all(dir);
  std::remove(out.c_str());
}

TEST(DataParallel, ZeroStage3ClipsSkipsAndAutocastsAsDataParallel) {
  expect_zero_trains_as_data_parallel("zero3", "mlp", "adamw", 2, "CLIP=0.5 NAN_AT=3");
  expect_zero_trains_as_data_parallel("zero3", "cnn", "sgd", 4, "AUTOCAST=1");
}

// The per-rank memory limit under which a DataParallel step fails the preflight (it plans the
// whole model's parameters, gradients and AdamW state: 8.9 MB for `deep`, 544,772 parameters),
// and so does ZeRO-2's (4.8 MB: the parameters whole), while the same step under ZeRO-3 on 4
// ranks trains: each rank plans its shard of the parameters, gradients and state, the gathered
// working set, and the gradient buckets in flight (4.3 MB at most, with buckets of one layer
// and gathers in flight up to two layers' weights; 3.8 MB when each gather started one ahead, 5.2
// MB when every gradient was planned at once). Without reshard_after_forward the gathered
// parameters live from the forward to the backward: 5.1 MB, over the limit too.
TEST(DataParallel, ZeroStage3TrainsUnderAMemoryLimitDataParallelExceeds) {
  const std::string args = "train deep adamw 3 4 " + tmp("limit.safetensors");
  const int64_t limit = 4'500'000;
  const std::string env = "BUCKET_BYTES=262144 MEMORY_LIMIT=" + std::to_string(limit);
  for (const char* stage : {"", " zero2", " zero3"}) {
    const Job whole =
        mpirun(4, args + stage, env + (std::string(stage) == " zero3" ? " KEEP_GATHERS=1" : ""));
    EXPECT_NE(whole.exit_code, 0) << whole.out;
    EXPECT_NE(whole.out.find("more than the memory limit"), std::string::npos) << whole.out;
  }
  const Job zero = mpirun(4, args + " zero3", env);
  ASSERT_EQ(zero.exit_code, 0) << zero.out;
  EXPECT_EQ(losses(zero.out).size(), 12u) << zero.out;
  std::regex line(R"(rank \d+ planned bytes (\d+))");
  int ranks = 0;
  for (std::sregex_iterator it(zero.out.begin(), zero.out.end(), line), end; it != end; ++it) {
    EXPECT_LE(std::stoll((*it)[1]), limit) << zero.out;
    ++ranks;
  }
  EXPECT_EQ(ranks, 4) << zero.out;
}

// Every stage over 50 steps on 4 ranks, over shared memory and TCP, against DataParallel with the
// same ranks: each step's loss within 1e-5 relative, the final weights (rank 0's file; under
// stage 3 the gathered parameters) within 1e-5 relative with SGD and 1e-4 with AdamW, each
// tensor as a whole (L2). Stages 2 and 3 reduce in another summation order than DataParallel's
// all-reduce; element by element (relative to at least 1e-3) SGD's weights differ by up to
// 5.2e-5 after the 50 steps, AdamW's (whose division by the root of the squared gradients
// magnifies it) within 1e-4 still.
TEST(DataParallel, EveryZeroStageTrainsFiftyStepsAsDataParallel) {
  for (const char* optim : {"sgd", "adamw"}) {
    const double weight_tolerance = std::string(optim) == "adamw" ? 1e-4 : 1e-5;
    const std::string mca = std::string(optim) == "sgd" ? "--mca btl tcp,self" : "";
    const std::string want_file = tmp(std::string("fifty_dp_") + optim + ".safetensors");
    const Job dp = mpirun(4, std::string("train mlp ") + optim + " 50 4 " + want_file, "", mca);
    ASSERT_EQ(dp.exit_code, 0) << dp.out;
    const auto want = losses(dp.out);
    ASSERT_EQ(want.size(), 200u) << dp.out;
    for (const char* stage : {"zero1", "zero2", "zero3"}) {
      const std::string file = tmp(std::string("fifty_") + stage + optim + ".safetensors");
      const Job zero =
          mpirun(4, std::string("train mlp ") + optim + " 50 4 " + file + " " + stage, "", mca);
      ASSERT_EQ(zero.exit_code, 0) << zero.out;
      const auto got = losses(zero.out);
      ASSERT_EQ(got.size(), want.size()) << zero.out;
      for (const auto& [key, loss] : want)
        EXPECT_NEAR(got.at(key), loss, 1e-5 * std::abs(loss))
            << stage << " " << optim << " rank " << key.first << " step " << key.second;
      const WeightDiff d = weight_diff(want_file, file);
      EXPECT_LT(d.per_tensor, weight_tolerance) << stage << " " << optim;
      EXPECT_LT(d.per_element, 1e-4) << stage << " " << optim;
      std::printf("%s %s: weights' largest difference %.3g per tensor, %.3g per element\n", stage,
                  optim, d.per_tensor, d.per_element);
      std::remove(file.c_str());
    }
    std::remove(want_file.c_str());
  }
}

// ZeRO-3's checkpoints: each parameter written by the rank that holds it (its own value, not a
// gather), loaded at any world size: 4 ranks save after step 3 (asynchronously), 2 ranks under
// ZeRO-3 resume and 1 process with the plain optimizer resumes, each step's loss the
// uninterrupted 4-rank run's; the export holds every parameter.
TEST(DataParallel, ZeroStage3CheckpointsResumeAtAnyWorldSize) {
  const std::string dir = tmp("sharded3"), out = tmp("sharded3.safetensors");
  auto job = [&](int np, const std::string& env, int steps, const std::string& extra) {
    return mpirun(np,
                  "train mlp adamw " + std::to_string(steps) + " " + std::to_string(16 / np) + " " +
                      out + extra,
                  env);
  };
  const Job whole = job(4, "", 6, " zero3");
  ASSERT_EQ(whole.exit_code, 0) << whole.out;
  const auto want = losses(whole.out);
  const Job save4 = job(4, "CKPT_ASYNC=1 CKPT_SAVE=" + dir + " CKPT_AT=3", 3, " zero3");
  ASSERT_EQ(save4.exit_code, 0) << save4.out;
  const std::string exported = tmp("exported3.safetensors");
  EXPECT_EQ(ls::dist::export_safetensors(dir, exported).at("step"), "3");
  EXPECT_EQ(ls::io::load_safetensors(exported).tensors.size(), 4u);  // 2 weights, 2 biases
  std::remove(exported.c_str());
  const Job resume2 = job(2, "CKPT_LOAD=" + dir, 6, " zero3");
  ASSERT_EQ(resume2.exit_code, 0) << resume2.out;
  const auto got2 = losses(resume2.out);
  for (int s = 4; s <= 6; ++s)
    for (int r = 0; r < 2; ++r)
      EXPECT_NEAR(got2.at({r, s}), want.at({0, s}), 1e-5) << "rank " << r << " step " << s;
  const Job resume1 = job(1, "CKPT_LOAD=" + dir, 6, "");
  ASSERT_EQ(resume1.exit_code, 0) << resume1.out;
  EXPECT_NEAR(losses(resume1.out).at({0, 6}), want.at({0, 6}), 1e-5) << resume1.out;
  std::filesystem::remove_all(dir);
  std::remove(out.c_str());
}

// A rank killed at a random moment of a run that saves a sharded checkpoint after every step
// (most kills land in a save: the steps are short): whatever the moment, the directory holds a
// checkpoint that loads whole (every tensor, every checksum). `trials` trials (LOCKSTEP_KILL_TRIALS
// sets another count); the kill moments are a fixed pseudo-random sequence. `env`: CKPT_ASYNC=1
// saves asynchronously (the kill then lands while the writer threads write or commit, or while
// the next steps run).
void expect_kills_leave_a_checkpoint_that_loads(int trials, const std::string& env) {
  if (const char* n = std::getenv("LOCKSTEP_KILL_TRIALS")) trials = std::atoi(n);
  const std::string dir = tmp("killed"), out = tmp("killed.safetensors");
  std::filesystem::remove_all(dir);
  std::mt19937 rng(12345);
  int killed = 0;
  for (int t = 0; t < trials; ++t) {
    const int ms = 100 + static_cast<int>(rng() % 200);
    const Job job =
        mpirun(2, "train mlp adamw 80 4 " + out + " zero1",
               env + " CKPT_SAVE=" + dir +
                   " CKPT_AT=0 LOCKSTEP_DIST_TIMEOUT=10 KILL_AFTER_MS=" + std::to_string(ms));
    killed += job.exit_code != 0;
    if (!std::filesystem::exists(dir + "/index.safetensors")) continue;  // killed before a save
    const Job load = mpirun(1, "train mlp adamw 0 16 " + out, "CKPT_LOAD=" + dir);
    ASSERT_EQ(load.exit_code, 0) << "trial " << t << ", killed after " << ms << " ms:\n"
                                 << job.out << "\nloading:\n"
                                 << load.out;
  }
  EXPECT_GT(killed, trials / 2) << "the kills must land inside the runs";
  std::filesystem::remove_all(dir);
  std::remove(out.c_str());
}

TEST(DataParallel, ARankKilledDuringShardedSavesLeavesACheckpointThatLoads) {
  expect_kills_leave_a_checkpoint_that_loads(20, "");
}

TEST(DataParallel, ARankKilledDuringAsynchronousSavesLeavesACheckpointThatLoads) {
  expect_kills_leave_a_checkpoint_that_loads(10, "CKPT_ASYNC=1");
}

TEST(DataParallel, ARankWithAnotherOpMakesEveryRankFailNamingTheNode) {
  const Job r = mpirun(2, "diverge-op 5", "LOCKSTEP_DIST_TIMEOUT=20");
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_LT(r.seconds, 15) << "must fail well before the 20 s deadline:\n" << r.out;
  for (int rank : {0, 1}) {
    const std::string prefix = "rank " + std::to_string(rank) +
                               " error: dist: the ranks are about "
                               "to run different programs";
    EXPECT_NE(r.out.find(prefix), std::string::npos) << r.out;
  }
  EXPECT_NE(r.out.find("First difference"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("dist_worker.cpp:"), std::string::npos) << "names the user's line:\n"
                                                               << r.out;
  EXPECT_EQ(r.out.find("rank 0 step 3"), std::string::npos) << "step 3 must not complete:\n"
                                                            << r.out;
}

namespace {

// A 2-rank run (worker `mode`) in which rank 0 alone prints "rank 0 step S local <what>" each
// step: every step completes on both ranks and the replicas stay identical. Returns the run.
Job expect_rank_zero_alone_does_not_stop_the_run(const std::string& mode, int steps,
                                                 const std::string& what) {
  const Job r = mpirun(2, mode + " " + std::to_string(steps), "LOCKSTEP_DIST_TIMEOUT=20");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  for (int s = 1; s <= steps; ++s) {
    EXPECT_NE(r.out.find("rank 0 step " + std::to_string(s) + " local " + what), std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("rank 1 step " + std::to_string(s) + " loss"), std::string::npos) << r.out;
  }
  const std::vector<std::string> h = hashes(r.out);
  EXPECT_EQ(h.size(), 2u) << r.out;
  if (h.size() == 2) {
    EXPECT_EQ(h[0], h[1]) << "replicas agree:\n" << r.out;
  }
  return r;
}

}  // namespace

// Rank 0 keeps its local loss and an accuracy of its own in a step closure, for its log: its
// program has more nodes and outputs, but the same replicated part (the collectives, what they
// read and what reads them), so the ranks train on and stay identical (issue 30, item 14).
TEST(DataParallel, ValuesKeptByRankZeroAloneDoNotStopTheRun) {
  const Job r = expect_rank_zero_alone_does_not_stop_the_run("log-rank0", 4, "loss");
  EXPECT_EQ(r.out.find("rank 1 step 1 local loss"), std::string::npos) << r.out;
}

// A read inside the step on rank 0 alone (of a value no collective reads), after the gradients'
// all-reduce was recorded: the read computes its own value only (outside data parallel it
// computes the step's work so far), so rank 0 runs no collective that rank 1 does not.
TEST(DataParallel, AReadInsideTheStepOnOneRankDoesNotStopTheRun) {
  expect_rank_zero_alone_does_not_stop_the_run("read-rank0", 3, "logits");
}

// The natural error path of a data-parallel program (issue 30, item 4): a divergence error is
// caught and main returns 1 while the earlier steps' programs are still queued (a closure holds
// the runtime thread). Exit drains them before oneDNN's static state is gone: every rank exits 1
// with its message, none dies of a signal (it was SIGSEGV on every rank, every time).
TEST(DataParallel, ReturningFromMainWithWorkQueuedExitsCleanly) {
  const Job r = mpirun(2, "diverge-queued 5", "LOCKSTEP_DIST_TIMEOUT=20");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  for (int rank : {0, 1})
    EXPECT_NE(r.out.find("rank " + std::to_string(rank) +
                         " error: dist: the ranks are about to run different programs"),
              std::string::npos)
        << r.out;
  for (const char* crash : {"Segmentation", "signal 11", "SIGSEGV", "Aborted", "core dumped"})
    EXPECT_EQ(r.out.find(crash), std::string::npos) << r.out;
}

TEST(DataParallel, ARankWithAnotherBatchShapeMakesEveryRankFail) {
  const Job r = mpirun(2, "diverge-batch 5", "LOCKSTEP_DIST_TIMEOUT=20");
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_LT(r.seconds, 15) << r.out;
  EXPECT_NE(r.out.find("rank 0 error: dist: the ranks are about to run different programs"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("rank 1 error: dist: the ranks are about to run different programs"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("[4, "), std::string::npos) << "names rank 1's shape:\n" << r.out;
}

TEST(DataParallel, ARankPastTheDeadlineIsNamedAndTheJobEnds) {
  const Job r = mpirun(2, "sleep 5 60", "LOCKSTEP_DIST_TIMEOUT=2");
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_LT(r.seconds, 30) << r.out;
  EXPECT_NE(r.out.find("rank 0 error: dist: rank 1 did not reach"), std::string::npos) << r.out;
}

// Rank 1 is stuck while its programs run (its runtime thread sleeps in a step closure): rank 0's
// all-reduce passes its deadline, and the probe that follows names rank 1 as not answering.
TEST(DataParallel, ARankStuckMidProgramIsNamedAndTheJobEnds) {
  const Job r = mpirun(2, "stall 6 60", "LOCKSTEP_DIST_TIMEOUT=2");
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_LT(r.seconds, 30) << r.out;
  EXPECT_NE(r.out.find("did not complete within 2 s on rank 0 of 2: rank 1 does not answer"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("the step was rolled back"), std::string::npos) << r.out;
}

TEST(DataParallel, AKilledRankEndsTheJob) {
  const Job r = mpirun(2, "kill 5", "LOCKSTEP_DIST_TIMEOUT=20");
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_LT(r.seconds, 15) << r.out;
  EXPECT_NE(r.out.find("rank 1"), std::string::npos) << r.out;
}

// Under ZeRO-3 too (gathers in flight, every step): a rank killed mid-run ends the job, which
// names it, well before the deadline.
TEST(DataParallel, AKilledRankEndsAZeroStage3Job) {
  const Job r = mpirun(2, "train deep adamw 100000 4 " + tmp("killed3.safetensors") + " zero3",
                       "LOCKSTEP_DIST_TIMEOUT=10 KILL_AFTER_MS=1500");
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_LT(r.seconds, 30) << r.out;
  EXPECT_NE(r.out.find("rank 0 step 1 loss"), std::string::npos) << "it trained first:\n" << r.out;
  EXPECT_NE(r.out.find("rank 1"), std::string::npos) << r.out;
}

// lockstep-train --nprocs 2 starts two replicas through mpirun: the header names the global
// batch, and each replica prints the seed's lines (the loss of its own shard) and its total.
TEST(DataParallel, LockstepTrainNprocs) {
  const Job r = run(std::string("env OMP_NUM_THREADS=1 ") + LOCKSTEP_TRAIN_EXE +
                    " --nprocs 2 --model mlp --data fake --num-steps 12 --log-steps 4 "
                    "--batch-size 16 --workers 0");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::string& out = r.out;
  EXPECT_NE(out.find("batch 32 (2 replicas x 16)"), std::string::npos) << out;
  EXPECT_NE(out.find("replica 0 of 2"), std::string::npos) << out;
  EXPECT_NE(out.find("replica 1 of 2"), std::string::npos) << out;
  std::regex line(R"(epoch: 1, step: (\d+), loss: \S+, rate: \S+)");
  int lines = 0;
  for (std::sregex_iterator it(out.begin(), out.end(), line), end; it != end; ++it) ++lines;
  EXPECT_EQ(lines, 6) << "3 logged steps x 2 replicas:\n" << out;
  size_t totals = 0;
  for (size_t at = out.find("total: images/s"); at != std::string::npos;
       at = out.find("total: images/s", at + 1))
    ++totals;
  EXPECT_EQ(totals, 2u) << out;
}

// lockstep-train --nprocs 2 --zero 1: the optimizer's state sharded, the same training (each
// replica's logged losses equal those of the run without it); its --checkpoint is a directory of
// one file per replica, which --resume loads with another --nprocs.
TEST(DataParallel, LockstepTrainZeroTrainsAsWithout) {
  const std::string args = std::string("env OMP_NUM_THREADS=1 ") + LOCKSTEP_TRAIN_EXE +
                           " --nprocs 2 --model mlp --data fake --num-steps 12 --log-steps 4 "
                           "--batch-size 16 --workers 0";
  const Job plain = run(args), zero = run(args + " --zero 1"), zero2 = run(args + " --zero 2"),
            zero3 = run(args + " --zero 3");
  ASSERT_EQ(plain.exit_code, 0) << plain.out;
  ASSERT_EQ(zero.exit_code, 0) << zero.out;
  ASSERT_EQ(zero2.exit_code, 0) << zero2.out;
  ASSERT_EQ(zero3.exit_code, 0) << zero3.out;
  auto logged = [](const std::string& out) {
    std::regex line(R"(epoch: 1, step: (\d+), loss: ([0-9.]+))");
    std::vector<std::string> v;
    for (std::sregex_iterator it(out.begin(), out.end(), line), end; it != end; ++it)
      v.push_back((*it)[1].str() + " " + (*it)[2].str());
    std::sort(v.begin(), v.end());
    return v;
  };
  EXPECT_EQ(logged(zero.out).size(), 6u) << zero.out;
  EXPECT_EQ(logged(zero.out), logged(plain.out)) << zero.out << plain.out;
  EXPECT_EQ(logged(zero2.out), logged(plain.out)) << zero2.out << plain.out;
  EXPECT_EQ(logged(zero3.out), logged(plain.out)) << zero3.out << plain.out;
  // Saved under stage 2 by 2 replicas, resumed under stage 1 by one.
  const std::string dir = tmp("zero_ckpt");
  const Job saved = run(args + " --zero 2 --checkpoint " + dir);
  ASSERT_EQ(saved.exit_code, 0) << saved.out;
  EXPECT_TRUE(std::filesystem::exists(dir + "/shard-1-of-2-g1.safetensors")) << saved.out;
  const Job resumed = run(std::string("env OMP_NUM_THREADS=1 ") + LOCKSTEP_TRAIN_EXE +
                          " --model mlp --data fake --num-steps 12 --num-epochs 2 --log-steps 4 "
                          "--batch-size 16 --workers 0 --zero 1 --resume --checkpoint " +
                          dir);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("resuming from " + dir + " at epoch 2, step 0"), std::string::npos)
      << resumed.out;
  EXPECT_TRUE(std::filesystem::exists(dir + "/shard-0-of-1-g2.safetensors")) << resumed.out;
  std::filesystem::remove_all(dir);
}

// A model with batch norm: every step the ranks take rank 0's running statistics
// (broadcast_buffers), so the replicas stay whole copies and check_replicas_agree passes at the
// end of training (issue 30, item 15).
TEST(DataParallel, BatchNormReplicasAgreeAfterTraining) {
  const std::string out = tmp("bn2.safetensors");
  const Job r = mpirun(2, "train bn sgd 4 8 " + out);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::vector<std::string> h = hashes(r.out);
  ASSERT_EQ(h.size(), 2u) << r.out;
  EXPECT_EQ(h[0], h[1]) << r.out;
  std::remove(out.c_str());
}

// Ranks started with another learning rate run the same program with other host values: every
// rank fails before the program runs, naming the scalar's values (issue 30, item 16).
TEST(DataParallel, RanksWithAnotherLearningRateFailNamingTheValues) {
  const Job r = mpirun(2, "diverge-lr 3", "LOCKSTEP_DIST_TIMEOUT=20");
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("with other host values"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("has 0.2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("has 0.1"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("rank 0 step 1 loss"), std::string::npos) << r.out;
}

// Ranks under other ZeRO stages (or one sharded and one not) run other programs: every rank fails
// at its first program that differs (the first step; under stage 3, fully_shard's own start on
// the ranks that call it), before any collective of it runs, naming the first node that differs.
TEST(DataParallel, RanksWithAnotherZeroStageFailBeforeAnyCollective) {
  const std::pair<const char*, const char*> stages[] = {
      {"zero1", "zero2"}, {"zero1", "plain"}, {"zero3", "zero2"}, {"zero3", "plain"}};
  for (const auto& [stage, other] : stages) {
    const Job r = mpirun(2, "train mlp adamw 3 4 " + tmp("stage.safetensors") + " " + stage,
                         std::string("LOCKSTEP_DIST_TIMEOUT=20 ZERO_RANK1=") + other);
    EXPECT_NE(r.exit_code, 0) << r.out;
    EXPECT_LT(r.seconds, 15) << "must fail well before the 20 s deadline:\n" << r.out;
    for (int rank : {0, 1})
      EXPECT_NE(r.out.find("rank " + std::to_string(rank) +
                           " error: dist: the ranks are about to run different programs"),
                std::string::npos)
          << r.out;
    EXPECT_NE(r.out.find("Nothing of this program ran"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("step 1 loss"), std::string::npos) << r.out;
  }
}

// Ranks with other thread counts: the message names the thread counts, not the batch size.
TEST(DataParallel, RanksWithOtherThreadCountsFailNamingThem) {
  const Job r = mpirun(2, "threads 3", "LOCKSTEP_DIST_TIMEOUT=20");
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("compiled for other backend settings"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("thread count"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("same batch size"), std::string::npos) << r.out;
}

// lockstep-train --nprocs 2 with rank 1 stopped (SIGSTOP) mid-run: the step whose collective
// misses its deadline fails and runs no closure; the tool raises the library's error instead of
// waiting for that closure for good, and the job ends (issue 30, item 5).
TEST(DataParallel, LockstepTrainWithAStoppedRankEndsNamingIt) {
  const std::string script =
      std::string("env OMP_NUM_THREADS=1 LOCKSTEP_DIST_TIMEOUT=3 timeout 120 ") +
      LOCKSTEP_TRAIN_EXE +
      " --nprocs 2 --model cnn --data fake --image-size 8 --batch-size 16 --num-epochs 20 "
      "--log-steps 100 --workers 0 & "
      // Once training runs, stop the rank whose environment says it is rank 1.
      "sleep 3; for p in $(pgrep -f 'lockstep-train.*--num-epochs 20'); do "
      "if tr '\\0' '\\n' < /proc/$p/environ 2>/dev/null | grep -q '^OMPI_COMM_WORLD_RANK=1$'; "
      "then kill -STOP $p; fi; done; wait $!; status=$?; "
      "pkill -CONT -f 'lockstep-train.*--num-epochs 20'; "
      "pkill -KILL -f 'lockstep-train.*--num-epochs 20'; "
      "exit $status";
  const std::string file = tmp("stopped_rank.sh");
  {
    std::ofstream out(file);
    out << script << "\n";
  }
  const Job r = run("sh " + file);
  std::remove(file.c_str());
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.exit_code, 124) << "hung until the timeout:\n" << r.out;
  EXPECT_LT(r.seconds, 60) << r.out;
  EXPECT_NE(r.out.find("lockstep-train: error: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("within 3 s"), std::string::npos) << r.out;  // names the deadline
}

// lockstep-train --nprocs 2 with a signal reaching one rank only (a scheduler's SIGTERM to one
// process; mpirun forwards Ctrl-C to each rank at its own moment): the ranks agree on it before
// every step, so both stop after the same step, rank 0 saves the checkpoint once, both exit with
// 128 + the signal, and nothing hangs (issue 30, item 7). Before, the signalled rank stopped
// alone and the other waited at the next step's collective.
TEST(DataParallel, LockstepTrainASignalToOneRankStopsEveryRankAtTheSameStep) {
  const std::string ckpt = tmp("signal_one_rank.safetensors");
  std::remove(ckpt.c_str());
  const std::string script =
      std::string("env OMP_NUM_THREADS=1 LOCKSTEP_DIST_TIMEOUT=20 timeout 120 ") +
      LOCKSTEP_TRAIN_EXE +
      " --nprocs 2 --model mlp --data fake --batch-size 16 --num-epochs 40 --log-steps 100 "
      "--workers 0 --checkpoint " +
      ckpt +
      " & "
      // Once training runs, signal the rank whose environment says it is rank 1.
      "sleep 3; for p in $(pgrep -f 'lockstep-train.*--num-epochs 40'); do "
      "if tr '\\0' '\\n' < /proc/$p/environ 2>/dev/null | grep -q '^OMPI_COMM_WORLD_RANK=1$'; "
      "then kill -TERM $p; fi; done; wait $!; status=$?; "
      "pkill -KILL -f 'lockstep-train.*--num-epochs 40'; "
      "exit $status";
  const std::string file = tmp("signal_one_rank.sh");
  {
    std::ofstream out(file);
    out << script << "\n";
  }
  const Job r = run("sh " + file);
  std::remove(file.c_str());
  EXPECT_NE(r.exit_code, 124) << "hung until the timeout:\n" << r.out;
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.out;
  std::regex stopped(R"(interrupted \(SIGTERM\) at epoch (\d+), step (\d+))");
  std::vector<std::string> at;
  for (std::sregex_iterator it(r.out.begin(), r.out.end(), stopped), end; it != end; ++it)
    at.push_back((*it)[1].str() + "/" + (*it)[2].str());
  ASSERT_EQ(at.size(), 2u) << "a line per rank:\n" << r.out;
  EXPECT_EQ(at[0], at[1]) << r.out;
  size_t saved = 0;
  for (size_t p = r.out.find("checkpoint saved to"); p != std::string::npos;
       p = r.out.find("checkpoint saved to", p + 1))
    ++saved;
  EXPECT_EQ(saved, 1u) << "rank 0 saves, once:\n" << r.out;
  std::ifstream written(ckpt);
  EXPECT_TRUE(written.good()) << r.out;
  EXPECT_EQ(r.out.find("lockstep-train: error"), std::string::npos) << r.out;
  std::remove(ckpt.c_str());
}
