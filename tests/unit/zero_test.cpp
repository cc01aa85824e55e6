// ZeroRedundancyOptimizer in one process (world size 1: this rank owns every parameter), against
// the optimizer it wraps: the same updates with parameter groups, a scheduler and gradient
// clipping; its state named by the parameters' indices and loaded back; bad local optimizers
// refused. The sharding over several ranks is tested under mpirun (tests/dist); its layout (which
// rank keeps what) here.
#include <gtest/gtest.h>

#include <lockstep/lockstep.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "dist/partition.h"

namespace ls = lockstep;

namespace {

struct Net {
  ls::nn::Linear a{6, 5}, b{5, 3};
  std::vector<ls::Tensor> first() { return a.parameters(); }
  std::vector<ls::Tensor> second() { return b.parameters(); }
  ls::Tensor loss(const ls::Tensor& x) { return ls::sum(ls::square(b(ls::relu(a(x))))); }
};

// Trains `net` for a few steps with `opt` (a StepLR on it, the gradients clipped), returning
// the parameters' values.
std::vector<std::vector<float>> train(Net& net, ls::optim::Optimizer& opt) {
  ls::optim::StepLR schedule(opt, 2, 0.5);
  for (int s = 0; s < 5; ++s) {
    ls::step([&] {
      opt.zero_grad();
      net.loss(ls::full({4, 6}, 0.1 * (s + 1)) + ls::arange(6)).backward();
      std::vector<ls::Tensor> all = net.first();
      for (const ls::Tensor& p : net.second()) all.push_back(p);
      ls::optim::clip_grad_norm_(all, 5.0);
      opt.step();
    });
    schedule.step();
  }
  std::vector<std::vector<float>> out;
  for (auto* params : {&net.a, &net.b})
    for (const ls::Tensor& p : params->parameters()) out.push_back(p.to_vector<float>());
  return out;
}

ls::optim::AdamOptions adam() { return {.lr = 0.05, .weight_decay = 0.01}; }

TEST(ZeroRedundancyOptimizer, OnOneRankUpdatesAsTheOptimizerItWraps) {
  ls::manual_seed(3);
  Net plain_net;
  ls::manual_seed(3);
  Net zero_net;
  ls::optim::AdamW plain(plain_net.first(), adam());
  plain.add_param_group({plain_net.second(), 0.02, 0.0});
  ls::dist::ZeroRedundancyOptimizer zero(zero_net.first(), [](std::vector<ls::Tensor> mine) {
    return std::make_unique<ls::optim::AdamW>(std::move(mine), adam());
  });
  zero.add_param_group({zero_net.second(), 0.02, 0.0});
  EXPECT_EQ(zero.num_param_groups(), 2u);
  EXPECT_DOUBLE_EQ(zero.group_weight_decay(0), 0.01);  // the local optimizer's default
  for (size_t i = 0; i < zero.params().size(); ++i) EXPECT_EQ(zero.owner(i), 0);
  const auto want = train(plain_net, plain), got = train(zero_net, zero);
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(want[i], got[i]) << "parameter " << i;
  // Two moments per element of every parameter, all on this rank.
  int64_t elements = 0;
  for (const ls::Tensor& p : zero.params()) elements += p.numel();
  EXPECT_EQ(zero.local_state_numel(), 2 * elements);
}

TEST(ZeroRedundancyOptimizer, ItsStateIsNamedByTheParametersAndLoadsBack) {
  ls::manual_seed(4);
  Net net;
  ls::dist::ZeroRedundancyOptimizer zero(net.first(), [](std::vector<ls::Tensor> mine) {
    return std::make_unique<ls::optim::SGD>(std::move(mine),
                                            ls::optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
  });
  zero.add_param_group({net.second()});
  train(net, zero);
  const ls::nn::NamedTensors state = zero.state_dict();
  std::vector<std::string> names;
  for (const auto& [name, t] : state) names.push_back(name);
  for (const char* name :
       {"step", "0.momentum_buffer", "1.momentum_buffer", "2.momentum_buffer", "3.momentum_buffer"})
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
  auto buffer = [](const ls::nn::NamedTensors& named, const std::string& name) {
    for (const auto& [n, t] : named)
      if (n == name) return t.to_vector<float>();
    return std::vector<float>();
  };
  const std::vector<float> before = buffer(state, "3.momentum_buffer");
  ASSERT_EQ(before.size(), 3u);
  ls::nn::NamedTensors changed, saved;  // (the state's own handles see what is loaded)
  for (const auto& [name, t] : state) {
    changed.emplace_back(name, ls::zeros_like(t));
    saved.emplace_back(name, ls::zeros_like(t) + t);
  }
  zero.load_state_dict(changed);
  EXPECT_EQ(buffer(zero.state_dict(), "3.momentum_buffer"), std::vector<float>(3, 0.0f));
  zero.load_state_dict(saved);
  EXPECT_EQ(buffer(zero.state_dict(), "3.momentum_buffer"), before);
}

TEST(ZeroRedundancyOptimizer, RefusesALocalOptimizerOverOtherParameters) {
  Net net;
  const auto none = [](std::vector<ls::Tensor>) -> std::unique_ptr<ls::optim::Optimizer> {
    return nullptr;
  };
  EXPECT_THROW(ls::dist::ZeroRedundancyOptimizer(net.first(), none), ls::Error);
  const auto others = [&](std::vector<ls::Tensor>) -> std::unique_ptr<ls::optim::Optimizer> {
    return std::make_unique<ls::optim::SGD>(net.second(), ls::optim::SGDOptions{});
  };
  try {
    ls::dist::ZeroRedundancyOptimizer zero(net.first(), others);
    FAIL() << "an optimizer over other parameters was taken";
  } catch (const ls::Error& e) {
    EXPECT_NE(std::string(e.what()).find("exactly the parameters"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ls::dist::ZeroRedundancyOptimizer(net.first(), nullptr), ls::Error);
}

}  // namespace

// The tensors larger than an even share are split, the others kept whole; the split ones' runs
// cover each of them once, in rank order, and every rank holds the same number of elements to
// one, unless a whole tensor already gives one rank more (then the others are even).
TEST(ZeroRedundancyOptimizer, SplitsTheTensorsLargerThanAnEvenShareSoThatEveryRankHoldsAsMany) {
  struct Case {
    std::vector<int64_t> sizes;
    int world;
  };
  for (const Case& c : std::vector<Case>{{{8000, 125, 500, 4}, 3},
                                         {{8000, 125, 500, 4}, 4},
                                         {{24}, 2},
                                         {{7, 5, 3}, 4},
                                         {{1001, 999, 3, 2, 1}, 5},
                                         {{4000, 3000, 100}, 2},
                                         {{10, 10, 10, 10}, 4}}) {
    const ls::dist::detail::Layout l = ls::dist::detail::split_layout(c.sizes, c.world);
    int64_t total = 0;
    for (int64_t n : c.sizes) total += n;
    std::vector<int64_t> held(static_cast<size_t>(c.world), 0);
    for (size_t i = 0; i < c.sizes.size(); ++i) {
      const bool large = c.sizes[i] * c.world > total && c.sizes[i] >= c.world;
      EXPECT_EQ(l.owners[i] < 0, large) << "tensor " << i;
      if (l.owners[i] >= 0) {
        EXPECT_TRUE(l.runs[i].empty());
        held[static_cast<size_t>(l.owners[i])] += c.sizes[i];
        continue;
      }
      ASSERT_EQ(l.runs[i].size(), static_cast<size_t>(c.world));
      int64_t at = 0;
      for (size_t r = 0; r < l.runs[i].size(); ++r) {
        EXPECT_EQ(l.runs[i][r].offset, at) << "tensor " << i << " rank " << r;
        at += l.runs[i][r].numel;
        held[r] += l.runs[i][r].numel;
      }
      EXPECT_EQ(at, c.sizes[i]) << "tensor " << i;
    }
    EXPECT_EQ(held, l.load);
    const int64_t most_whole = [&] {
      std::vector<int64_t> whole(static_cast<size_t>(c.world), 0);
      for (size_t i = 0; i < c.sizes.size(); ++i)
        if (l.owners[i] >= 0) whole[static_cast<size_t>(l.owners[i])] += c.sizes[i];
      return *std::max_element(whole.begin(), whole.end());
    }();
    const int64_t lo = *std::min_element(held.begin(), held.end());
    const int64_t hi = *std::max_element(held.begin(), held.end());
    EXPECT_TRUE(hi - lo <= 1 || hi == most_whole) << c.world << " ranks: " << lo << ".." << hi;
  }
  // Without the split every tensor is partitioned whole (PyTorch's partition).
  EXPECT_EQ(ls::dist::detail::partition_by_size({8000, 125}, 2), (std::vector<int>{0, 1}));
}

// load_sharded reads a tensor saved in runs (a split parameter's state: "<name>#<offset>", each
// run in its rank's file) joined into the whole a plain optimizer keeps; runs that leave a gap or
// do not add up to the tensor are an Error naming it, and nothing is loaded.
TEST(ZeroRedundancyOptimizer, ACheckpointOfRunsLoadsJoinedAndRunsThatDoNotJoinUpAreRefused) {
  namespace fs = std::filesystem;
  const std::string dir = (fs::path(testing::TempDir()) / "lockstep_runs_ckpt").string();
  fs::remove_all(dir);
  ls::manual_seed(1);
  ls::nn::Linear saved(2, 11);
  ls::optim::AdamW opt(saved.parameters(), ls::optim::AdamOptions{.lr = 0.1});
  ls::step([&] {
    opt.zero_grad();
    ls::sum(ls::square(saved(ls::full({3, 2}, 0.5)))).backward();
    opt.step();
  });
  ls::dist::save_sharded(dir, saved, &opt);
  const std::string file = dir + "/shard-0-of-1-g1.safetensors";
  const ls::io::Loaded whole = ls::io::load_safetensors(file);
  ls::Tensor exp_avg;
  for (const auto& [name, t] : whole.tensors)
    if (name == "optimizer.0.exp_avg") exp_avg = ls::reshape(t, {22});
  ASSERT_TRUE(exp_avg.defined());
  // The file again with the weight's first moment as runs [offset, end), in place of the whole.
  auto with_runs = [&](const std::vector<std::pair<int64_t, int64_t>>& runs) {
    ls::io::TensorMap out;
    for (const auto& [name, t] : whole.tensors)
      if (name != "optimizer.0.exp_avg") out.emplace_back(name, t);
    for (const auto& [begin, end] : runs)
      out.emplace_back("optimizer.0.exp_avg#" + std::to_string(begin),
                       ls::slice(exp_avg, 0, begin, end));
    ls::io::save_safetensors(file, out, whole.metadata);
  };
  auto expect_refused = [&](const std::string& says) {
    ls::manual_seed(2);
    ls::nn::Linear other(2, 11);
    ls::optim::AdamW other_opt(other.parameters(), ls::optim::AdamOptions{.lr = 0.1});
    const std::vector<float> before = other.weight.to_vector<float>();
    try {
      ls::dist::load_sharded(dir, other, &other_opt);
      ADD_FAILURE() << "loaded runs that do not join up";
    } catch (const ls::Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
    EXPECT_EQ(other.weight.to_vector<float>(), before) << "nothing is loaded";
  };
  with_runs({{0, 10}, {12, 22}});  // elements 10 and 11 missing
  expect_refused("'optimizer.0.exp_avg#12'");
  with_runs({{0, 12}, {12, 21}});  // the last element missing
  expect_refused("runs of 21 elements in all");
  with_runs({{0, 12}, {12, 22}});
  ls::manual_seed(3);
  ls::nn::Linear loaded(2, 11);
  ls::optim::AdamW loaded_opt(loaded.parameters(), ls::optim::AdamOptions{.lr = 0.1});
  ls::dist::load_sharded(dir, loaded, &loaded_opt);
  EXPECT_EQ(loaded.weight.to_vector<float>(), saved.weight.to_vector<float>());
  int found = 0;
  for (const auto& [name, t] : loaded_opt.state_dict()) {
    if (name != "0.exp_avg") continue;
    EXPECT_EQ(t.to_vector<float>(), exp_avg.to_vector<float>());
    ++found;
  }
  EXPECT_EQ(found, 1);
  fs::remove_all(dir);
}

// Under stage 3 a split parameter itself is saved in runs ("model.<name>#<offset>"), which the
// file's metadata names with the parameter's shape ("run.model.weight#0" = "11,2"): load_sharded
// joins them into a model that holds the parameter whole, and the export joins them into one
// tensor of that shape; runs with a gap, or of a parameter of another shape, are an Error naming
// the run (the load changes nothing), and the export refuses runs that do not join up.
TEST(ZeroRedundancyOptimizer, AParametersRunsLoadAndExportJoined) {
  namespace fs = std::filesystem;
  const std::string dir = (fs::path(testing::TempDir()) / "lockstep_model_runs_ckpt").string();
  const std::string exported = dir + ".safetensors";
  fs::remove_all(dir);
  ls::manual_seed(1);
  ls::nn::Linear saved(2, 11);
  ls::dist::save_sharded(dir, saved);
  const std::string file = dir + "/shard-0-of-1-g1.safetensors";
  const ls::io::Loaded whole = ls::io::load_safetensors(file);
  const ls::Tensor weight = ls::reshape(saved.weight, {22});
  auto with_runs = [&](const std::vector<std::pair<int64_t, int64_t>>& runs,
                       const std::string& shape) {
    ls::io::TensorMap out;
    ls::io::Metadata meta = whole.metadata;
    for (const auto& [name, t] : whole.tensors)
      if (name != "model.weight") out.emplace_back(name, t);
    for (const auto& [begin, end] : runs) {
      const std::string entry = "model.weight#" + std::to_string(begin);
      out.emplace_back(entry, ls::slice(weight, 0, begin, end));
      meta["run." + entry] = shape;
    }
    ls::io::save_safetensors(file, out, meta);
  };
  auto expect_refused = [&](const std::string& says) {
    ls::manual_seed(2);
    ls::nn::Linear other(2, 11);
    const std::vector<float> before = other.weight.to_vector<float>();
    try {
      ls::dist::load_sharded(dir, other);
      ADD_FAILURE() << "loaded runs that do not fit";
    } catch (const ls::Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
    EXPECT_EQ(other.weight.to_vector<float>(), before) << "nothing is loaded";
  };
  with_runs({{0, 10}, {12, 22}}, "11,2");  // elements 10 and 11 missing
  expect_refused("'model.weight#12'");
  EXPECT_THROW(ls::dist::export_safetensors(dir, exported), ls::Error);
  with_runs({{0, 12}, {12, 22}}, "2,11");  // a parameter of another shape
  expect_refused("(a run of [2, 11])");
  with_runs({{0, 12}, {12, 22}}, "11,2");
  ls::manual_seed(3);
  ls::nn::Linear loaded(2, 11);
  ls::dist::load_sharded(dir, loaded);
  EXPECT_EQ(loaded.weight.to_vector<float>(), saved.weight.to_vector<float>());
  ls::dist::export_safetensors(dir, exported);
  bool found = false;
  for (const auto& [name, t] : ls::io::load_safetensors(exported).tensors) {
    if (name != "weight") continue;
    EXPECT_EQ(t.shape(), saved.weight.shape());
    EXPECT_EQ(t.to_vector<float>(), saved.weight.to_vector<float>());
    found = true;
  }
  EXPECT_TRUE(found);
  fs::remove_all(dir);
  fs::remove(exported);
}
