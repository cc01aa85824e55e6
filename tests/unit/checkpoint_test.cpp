// Tests of checkpoint.h: an exact round trip (training resumed from a checkpoint gives the very
// losses of uninterrupted training), atomic saving, and loading of damaged or mismatched files:
// each an ls::Error naming the problem, with the model, optimizer and generator left unchanged.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>

#include "unit/train_test_util.h"

namespace {

using ::testing::HasSubstr;
using train_test::differences;
using train_test::full_snapshot;
using train_test::raw;
using train_test::Snapshot;

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "lockstep_ckpt_" + std::to_string(::getpid()) + "_" + name;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// One training step of the CNN on a batch drawn from the generator; returns the loss bits.
uint32_t train_step(ls::nn::Module& model, ls::optim::Optimizer& opt) {
  ls::Tensor loss;
  ls::step([&] {
    opt.zero_grad();
    ls::Tensor x = ls::randn({4, 1, 8, 8});
    ls::Tensor y = ls::randint(0, 10, {4});
    loss = ls::nn::cross_entropy(model(x), y);
    loss.backward();
    opt.step();
  });
  const float v = loss.item<float>();
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return bits;
}

// Loading `path` must throw ls::Error mentioning every part and change nothing.
void expect_load_fails(const std::string& path, ls::nn::Module& model, ls::optim::Optimizer* opt,
                       const std::vector<std::string>& parts) {
  const Snapshot before = full_snapshot(model, opt);
  try {
    ls::load_checkpoint(path, model, opt);
    ADD_FAILURE() << "loading did not throw";
  } catch (const ls::Error& e) {
    for (const std::string& p : parts) EXPECT_THAT(e.what(), HasSubstr(p));
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a std::exception that is not ls::Error: " << e.what();
  }
  EXPECT_EQ(differences(before, full_snapshot(model, opt)), std::vector<std::string>{});
}

}  // namespace

TEST(Checkpoint, ResumedTrainingGivesTheSameLossesBitForBit) {
  const std::string path = temp_path("resume.safetensors");
  ls::manual_seed(1);
  ls::models::FashionCNN a(10, 1, 8);
  ls::optim::SGD opt_a(a.parameters(), {.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-4});
  for (int i = 0; i < 2; ++i) train_step(a, opt_a);
  ls::save_checkpoint(path, a, &opt_a, {{"epoch", "2"}});
  const Snapshot at_save = full_snapshot(a, &opt_a);
  std::vector<uint32_t> uninterrupted;
  for (int i = 0; i < 3; ++i) uninterrupted.push_back(train_step(a, opt_a));

  // A fresh model, optimizer and generator, all different, with some training of their own.
  ls::manual_seed(999);
  ls::models::FashionCNN b(10, 1, 8);
  ls::optim::SGD opt_b(b.parameters(), {.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-4});
  train_step(b, opt_b);
  EXPECT_FALSE(differences(at_save, full_snapshot(b, &opt_b)).empty());
  const ls::io::Metadata meta = ls::load_checkpoint(path, b, &opt_b);
  EXPECT_EQ(meta.at("epoch"), "2");
  EXPECT_EQ(meta.at("format"), "lockstep-checkpoint");
  EXPECT_EQ(differences(at_save, full_snapshot(b, &opt_b)), std::vector<std::string>{});
  std::vector<uint32_t> resumed;
  for (int i = 0; i < 3; ++i) resumed.push_back(train_step(b, opt_b));
  EXPECT_EQ(resumed, uninterrupted);
  EXPECT_EQ(differences(full_snapshot(a, &opt_a), full_snapshot(b, &opt_b)),
            std::vector<std::string>{});
  std::remove(path.c_str());
}

TEST(Checkpoint, AdamStateAndModelOnlyCheckpointsRoundTrip) {
  const std::string path = temp_path("adam.safetensors");
  ls::manual_seed(3);
  ls::models::FashionCNN a(10, 1, 8);
  ls::optim::AdamW opt_a(a.parameters(), {.lr = 1e-3, .weight_decay = 0.01});
  train_step(a, opt_a);
  ls::save_checkpoint(path, a, &opt_a);
  ls::models::FashionCNN b(10, 1, 8);
  ls::optim::AdamW opt_b(b.parameters(), {.lr = 1e-3, .weight_decay = 0.01});
  ls::load_checkpoint(path, b, &opt_b);
  EXPECT_EQ(differences(full_snapshot(a, &opt_a), full_snapshot(b, &opt_b)),
            std::vector<std::string>{});
  EXPECT_EQ(opt_b.step_count().item<int64_t>(), 1);
  // Without an optimizer: the model and the generator only.
  ls::models::FashionCNN c(10, 1, 8);
  ls::load_checkpoint(path, c);
  EXPECT_EQ(differences(full_snapshot(a, nullptr), full_snapshot(c, nullptr)),
            std::vector<std::string>{});
  // The file is plain safetensors with the documented names.
  const ls::io::Loaded file = ls::io::load_safetensors(path);
  std::vector<std::string> names;
  for (const auto& [n, t] : file.tensors) names.push_back(n);
  for (const char* n : {"model.conv1.weight", "model.bn1.running_var", "model.fc2.bias",
                        "optimizer.step", "optimizer.0.exp_avg", "generator.state"})
    EXPECT_THAT(names, ::testing::Contains(std::string(n)));
  std::remove(path.c_str());
}

TEST(Checkpoint, ReservedMetadataKeysAreRefused) {
  // "format" and "version" are the checkpoint's own: a user's value would be replaced silently.
  const std::string path = temp_path("reserved.safetensors");
  ls::models::MLP model({4, 8, 3});
  for (const char* key : {"format", "version"}) {
    try {
      ls::save_checkpoint(path, model, nullptr, {{key, "7"}});
      ADD_FAILURE() << key << " was taken";
    } catch (const ls::Error& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr(std::string("metadata key '") + key + "'"));
    }
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  ls::save_checkpoint(path, model, nullptr, {{"run_version", "7"}});
  ls::models::MLP other({4, 8, 3});
  EXPECT_EQ(ls::load_checkpoint(path, other).at("run_version"), "7");
  std::remove(path.c_str());
}

TEST(Checkpoint, AFailedSaveLeavesTheExistingCheckpoint) {
  const std::string path = temp_path("atomic.safetensors");
  ls::manual_seed(4);
  ls::models::MLP model({4, 8, 3});
  ls::optim::SGD opt(model.parameters(), {.lr = 0.1, .momentum = 0.9});
  ls::save_checkpoint(path, model, &opt);
  const std::string original = read_file(path);
  ASSERT_FALSE(original.empty());
  // Make the save fail: its temporary file's name is taken by a directory.
  const std::string blocker = path + ".tmp-" + std::to_string(::getpid());
  ASSERT_EQ(::mkdir(blocker.c_str(), 0700), 0);
  {
    ls::NoGrad ng;
    model.parameters()[0].add_(1.0f);
  }
  EXPECT_THROW(ls::save_checkpoint(path, model, &opt), ls::Error);
  ::rmdir(blocker.c_str());
  EXPECT_EQ(read_file(path), original);
  // Loading it brings back the values saved, not the changed ones.
  ls::models::MLP other({4, 8, 3});
  ls::load_checkpoint(path, other);
  EXPECT_NE(raw(other.parameters()[0]), raw(model.parameters()[0]));
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(::testing::TempDir()))
    if (e.path().string().rfind(path + ".tmp", 0) == 0) left.push_back(e.path().string());
  EXPECT_EQ(left, std::vector<std::string>{});
  std::remove(path.c_str());
}

TEST(Checkpoint, TruncatedFilesAreRefusedAndChangeNothing) {
  const std::string path = temp_path("truncated.safetensors");
  const std::string damaged = temp_path("truncated_damaged.safetensors");
  ls::manual_seed(5);
  ls::models::MLP a({4, 8, 3}), b({4, 8, 3});
  ls::optim::SGD opt_a(a.parameters(), {.lr = 0.1, .momentum = 0.9});
  ls::optim::SGD opt_b(b.parameters(), {.lr = 0.1, .momentum = 0.9});
  ls::save_checkpoint(path, a, &opt_a);
  const std::string bytes = read_file(path);
  uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = header << 8 | static_cast<unsigned char>(bytes[i]);
  for (size_t keep :
       {size_t{0}, size_t{5}, size_t{8}, static_cast<size_t>(8 + header / 2),
        static_cast<size_t>(8 + header), static_cast<size_t>(8 + header + 10), bytes.size() - 1}) {
    SCOPED_TRACE(::testing::Message() << "kept " << keep << " of " << bytes.size() << " bytes");
    write_file(damaged, bytes.substr(0, keep));
    expect_load_fails(damaged, b, &opt_b, {damaged});
  }
  expect_load_fails(temp_path("does_not_exist.safetensors"), b, &opt_b, {"does_not_exist"});
  std::remove(path.c_str());
  std::remove(damaged.c_str());
}

TEST(Checkpoint, EveryFlippedHeaderByteIsRefusedAndChangesNothing) {
  const std::string path = temp_path("flip.safetensors");
  const std::string damaged = temp_path("flip_damaged.safetensors");
  ls::manual_seed(6);
  ls::models::MLP a({3, 4, 2}), b({3, 4, 2});
  ls::optim::SGD opt_a(a.parameters(), {.lr = 0.1, .momentum = 0.9});
  ls::optim::SGD opt_b(b.parameters(), {.lr = 0.1, .momentum = 0.9});
  ls::manual_seed(7);  // b's generator state differs from the saved one
  ls::save_checkpoint(path, a, &opt_a);
  ls::manual_seed(8);
  const std::string bytes = read_file(path);
  uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = header << 8 | static_cast<unsigned char>(bytes[i]);
  ASSERT_LT(8 + header, bytes.size());
  const Snapshot before = full_snapshot(b, &opt_b);
  std::vector<std::string> accepted;
  for (size_t pos = 0; pos < 8 + header; ++pos) {
    std::string flipped = bytes;
    flipped[pos] = static_cast<char>(flipped[pos] ^ 0x01);
    write_file(damaged, flipped);
    try {
      ls::load_checkpoint(damaged, b, &opt_b);
      accepted.push_back(std::to_string(pos) + " ('" + bytes[pos] + "' in \"" +
                         bytes.substr(pos < 20 ? 0 : pos - 20, 40) + "\")");
    } catch (const ls::Error&) {
    }
    if (!differences(before, full_snapshot(b, &opt_b)).empty()) {
      ADD_FAILURE() << "flipping byte " << pos << " changed the model, optimizer or generator";
      break;
    }
  }
  EXPECT_EQ(accepted, std::vector<std::string>{});
  std::remove(path.c_str());
  std::remove(damaged.c_str());
}

TEST(Checkpoint, MismatchedModelsAndOptimizersAreRefused) {
  const std::string path = temp_path("mismatch.safetensors");
  const std::string no_opt = temp_path("mismatch_no_opt.safetensors");
  ls::manual_seed(9);
  ls::models::FashionCNN five(5, 1, 8);
  ls::optim::SGD opt5(five.parameters(), {.lr = 0.1, .momentum = 0.9});
  ls::save_checkpoint(path, five, &opt5);
  ls::save_checkpoint(no_opt, five);

  ls::models::FashionCNN ten(10, 1, 8);
  ls::optim::SGD opt10(ten.parameters(), {.lr = 0.1, .momentum = 0.9});
  expect_load_fails(path, ten, &opt10, {path, "fc2.weight", "[10, 128]", "[5, 128]"});
  ls::models::MLP mlp({4, 8, 3});
  ls::optim::SGD opt_mlp(mlp.parameters(), {.lr = 0.1, .momentum = 0.9});
  expect_load_fails(path, mlp, &opt_mlp, {path, "missing", "layers.0.weight", "unexpected"});
  // The right model but no optimizer state in the file, or another optimizer's state.
  ls::models::FashionCNN five_b(5, 1, 8);
  ls::optim::SGD opt5b(five_b.parameters(), {.lr = 0.1, .momentum = 0.9});
  expect_load_fails(no_opt, five_b, &opt5b, {no_opt, "optimizer"});
  ls::optim::Adam adam(five_b.parameters(), {});
  expect_load_fails(path, five_b, &adam, {path, "exp_avg"});
  ls::optim::SGD plain(five_b.parameters(), {.lr = 0.1});  // no momentum buffers
  expect_load_fails(path, five_b, &plain, {path});
  // An optimizer over fewer parameters than the file holds state for.
  ls::optim::SGD partial({five_b.fc2->weight}, {.lr = 0.1, .momentum = 0.9});
  expect_load_fails(path, five_b, &partial, {path});
  ls::load_checkpoint(path, five_b, &opt5b);  // and the matching pair loads
  EXPECT_EQ(differences(full_snapshot(five, &opt5), full_snapshot(five_b, &opt5b)),
            std::vector<std::string>{});
  std::remove(path.c_str());
  std::remove(no_opt.c_str());
}

TEST(Checkpoint, PlainSafetensorsAndOtherVersionsAreRefused) {
  const std::string path = temp_path("plain.safetensors");
  ls::manual_seed(10);
  ls::models::MLP m({4, 8, 3});
  ls::optim::SGD opt(m.parameters(), {.lr = 0.1, .momentum = 0.9});
  ls::io::save_safetensors(path, m.state_dict());
  expect_load_fails(path, m, &opt, {path, "not a lockstep checkpoint"});
  expect_load_fails(path, m, nullptr, {path, "not a lockstep checkpoint"});
  // A checkpoint from a newer lockstep: its layout may mean something else.
  ls::io::TensorMap tensors;
  for (auto& [n, t] : m.state_dict()) tensors.emplace_back("model." + n, t);
  for (auto& [n, t] : opt.state_dict()) tensors.emplace_back("optimizer." + n, t);
  tensors.emplace_back("generator.state", ls::generator_state());
  ls::io::save_safetensors(path, tensors, {{"format", "lockstep-checkpoint"}, {"version", "3"}});
  expect_load_fails(path, m, &opt, {path, "version"});
  ls::io::save_safetensors(path, tensors, {{"format", "lockstep-checkpoint"}});
  expect_load_fails(path, m, &opt, {path, "version"});
  ls::io::save_safetensors(path, tensors, {{"format", "lockstep-checkpoint"}, {"version", "1"}});
  ls::load_checkpoint(path, m, &opt);  // the same content, version 1: fine
  // An unknown tensor or a missing generator state.
  tensors.emplace_back("extra", ls::zeros({1}));
  ls::io::save_safetensors(path, tensors, {{"format", "lockstep-checkpoint"}, {"version", "1"}});
  expect_load_fails(path, m, &opt, {path, "extra"});
  tensors.pop_back();
  tensors.pop_back();
  ls::io::save_safetensors(path, tensors, {{"format", "lockstep-checkpoint"}, {"version", "1"}});
  expect_load_fails(path, m, &opt, {path, "generator"});
  std::remove(path.c_str());
}

// A schedule resumed from a checkpoint continues exactly where it was: the same lrs and losses as
// an uninterrupted run (issue 32, item 3), for a count-based schedule with two parameter groups
// and for ReduceLROnPlateau, which keeps its own counters and the lrs it lowered.
TEST(Checkpoint, ResumedSchedulesContinueExactly) {
  const std::string path = temp_path("schedule.safetensors");
  auto groups = [](ls::models::FashionCNN& m) {
    std::vector<ls::Tensor> decayed, rest;
    for (auto& [name, p] : m.named_parameters())
      (name.find("bias") == std::string::npos ? decayed : rest).push_back(p);
    auto opt = std::make_unique<ls::optim::AdamW>(decayed, ls::optim::AdamOptions{.lr = 2e-3});
    opt->add_param_group({rest, 1e-3, 0.0});
    return opt;
  };
  ls::manual_seed(5);
  ls::models::FashionCNN a(10, 1, 8);
  auto opt_a = groups(a);
  ls::optim::CosineWarmupLR sched_a(*opt_a, 3, 12, 1e-5);
  for (int i = 0; i < 4; ++i) train_step(a, *opt_a), sched_a.step();
  ls::save_checkpoint(path, a, opt_a.get(), &sched_a);
  std::vector<uint32_t> uninterrupted;
  std::vector<double> lrs_a;
  for (int i = 0; i < 5; ++i) {
    uninterrupted.push_back(train_step(a, *opt_a));
    sched_a.step();
    lrs_a.push_back(opt_a->group_lr(0)), lrs_a.push_back(opt_a->group_lr(1));
  }

  ls::manual_seed(77);
  ls::models::FashionCNN b(10, 1, 8);
  auto opt_b = groups(b);
  ls::optim::CosineWarmupLR sched_b(*opt_b, 3, 12, 1e-5);
  ls::load_checkpoint(path, b, opt_b.get(), &sched_b);
  EXPECT_EQ(sched_b.count(), 4);
  std::vector<uint32_t> resumed;
  std::vector<double> lrs_b;
  for (int i = 0; i < 5; ++i) {
    resumed.push_back(train_step(b, *opt_b));
    sched_b.step();
    lrs_b.push_back(opt_b->group_lr(0)), lrs_b.push_back(opt_b->group_lr(1));
  }
  EXPECT_EQ(resumed, uninterrupted);
  EXPECT_EQ(lrs_b, lrs_a);
  // The file names it by PyTorch's names.
  const ls::io::Loaded file = ls::io::load_safetensors(path);
  EXPECT_EQ(file.metadata.at("scheduler"), "CosineWarmupLR");
  std::vector<std::string> names;
  for (const auto& [n, t] : file.tensors) names.push_back(n);
  EXPECT_THAT(names, ::testing::Contains(std::string("scheduler.last_epoch")));
  EXPECT_THAT(names, ::testing::Contains(std::string("scheduler.base_lrs")));

  // Another kind of scheduler, or none saved: refused before anything changes.
  ls::optim::StepLR step_lr(*opt_b, 2);
  const Snapshot before = full_snapshot(b, opt_b.get());
  try {
    ls::load_checkpoint(path, b, opt_b.get(), &step_lr);
    ADD_FAILURE() << "loaded a CosineWarmupLR's state into a StepLR";
  } catch (const ls::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("holds the state of a CosineWarmupLR, not of a StepLR"));
  }
  ls::save_checkpoint(path, b, opt_b.get());
  try {
    ls::load_checkpoint(path, b, opt_b.get(), &sched_b);
    ADD_FAILURE() << "loaded a scheduler from a file without one";
  } catch (const ls::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("holds no scheduler state"));
  }
  EXPECT_EQ(differences(before, full_snapshot(b, opt_b.get())), std::vector<std::string>{});

  // A state with a bad entry is refused by name.
  ls::nn::NamedTensors bad = sched_b.state_dict();
  bad[0].second = ls::scalar_tensor(-3, ls::i64);
  try {
    sched_b.load_state_dict(bad);
    ADD_FAILURE() << "loaded a negative count";
  } catch (const ls::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("'last_epoch' = -3 is negative"));
  }
  EXPECT_EQ(sched_b.count(), 9);

  // ReduceLROnPlateau: its counters and the lr it lowered come back.
  ls::optim::SGD sgd_a(a.parameters(), {.lr = 0.1});
  ls::optim::ReduceLROnPlateau plateau_a(sgd_a, {.factor = 0.5, .patience = 1, .cooldown = 1});
  for (double metric : {1.0, 1.0, 1.0, 0.5}) plateau_a.step(metric);
  ls::save_checkpoint(path, a, &sgd_a, &plateau_a);
  ls::optim::SGD sgd_b(b.parameters(), {.lr = 0.1});
  ls::optim::ReduceLROnPlateau plateau_b(sgd_b, {.factor = 0.5, .patience = 1, .cooldown = 1});
  ls::load_checkpoint(path, b, &sgd_b, &plateau_b);
  EXPECT_EQ(sgd_b.group_lr(0), 0.05);
  for (double metric : {0.6, 0.7, 0.8, 0.9, 1.0}) {
    plateau_a.step(metric);
    plateau_b.step(metric);
    EXPECT_EQ(sgd_b.group_lr(0), sgd_a.group_lr(0));
    EXPECT_EQ(plateau_b.num_bad_epochs(), plateau_a.num_bad_epochs());
  }
  EXPECT_LT(sgd_b.group_lr(0), 0.05);
  std::remove(path.c_str());
}

namespace {

// The file at `path` rewritten with `edit` applied to its header's JSON text (re-padded), its
// data as it was.
void rewrite_header(const std::string& path, const std::function<void(std::string&)>& edit) {
  const std::string bytes = read_file(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  std::string header = bytes.substr(8, n);
  header.erase(header.find_last_not_of(' ') + 1);
  edit(header);
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string out;
  for (int i = 0; i < 8; ++i) out += static_cast<char>((header.size() >> (8 * i)) & 0xFF);
  write_file(path, out + header + bytes.substr(8 + n));
}

}  // namespace

// Checkpoints written before checksums (version 1, no "lockstep.crc32") still load; a version 2
// file whose checksums were lost from its header does not; flipped data bits are refused by the
// checksum, naming the tensor, with nothing changed (issue 30, item 9).
TEST(Checkpoint, ChecksumsGuardTheDataAndOlderCheckpointsStillLoad) {
  const std::string path = temp_path("v1.safetensors");
  ls::manual_seed(4);
  ls::models::MLP a({6, 8, 3});
  ls::optim::SGD opt_a(a.parameters(), {.lr = 0.1, .momentum = 0.9});
  ls::save_checkpoint(path, a, &opt_a);
  const std::string v2 = read_file(path);
  // Version 1 as the previous release wrote it.
  rewrite_header(path, [](std::string& h) {
    const size_t at = h.find("\"lockstep.crc32\"");
    ASSERT_NE(at, std::string::npos);
    const size_t end = h.find("}\"", at);
    h.erase(at - 1, end + 2 - (at - 1));  // with the comma before it
    h.replace(h.find("\"version\":\"2\""), 13, "\"version\":\"1\"");
  });
  ls::models::MLP b({6, 8, 3});
  ls::optim::SGD opt_b(b.parameters(), {.lr = 0.1, .momentum = 0.9});
  ls::load_checkpoint(path, b, &opt_b);
  EXPECT_EQ(differences(full_snapshot(a, &opt_a), full_snapshot(b, &opt_b)),
            std::vector<std::string>{});
  // Version 2 without its checksums: refused.
  write_file(path, v2);
  rewrite_header(path, [](std::string& h) {
    h.replace(h.find("\"lockstep.crc32\""), 16, "\"lockstep.crc33\"");
  });
  ls::models::MLP c({6, 8, 3});
  ls::optim::SGD opt_c(c.parameters(), {.lr = 0.1, .momentum = 0.9});
  expect_load_fails(path, c, &opt_c, {path, "without the checksums"});
  // A flipped bit in the last tensor's data (the generator state): refused by name.
  std::string flipped = v2;
  flipped[flipped.size() - 3] = static_cast<char>(flipped[flipped.size() - 3] ^ 4);
  write_file(path, flipped);
  expect_load_fails(path, c, &opt_c, {path, "generator.state", "CRC-32"});
  std::remove(path.c_str());
}

// A checkpoint whose header claims a 4 GiB tensor (a sparse file) where the model has a small
// one is refused from its header, without reading the data (issue 30, item 10).
TEST(Checkpoint, AClaimedHugeTensorIsRefusedUnread) {
  const std::string path = temp_path("huge.safetensors");
  ls::manual_seed(4);
  ls::models::MLP a({6, 8, 3});
  ls::save_checkpoint(path, a);
  const uint64_t huge = uint64_t{4} << 30;
  uint64_t old_end = 0;
  rewrite_header(path, [&](std::string& h) {
    // layers.0.weight is f32[8, 6] at [0, 192]: make it [2^28, 4] and move the others after it.
    const size_t at = h.find("\"model.layers.0.weight\"");
    ASSERT_NE(at, std::string::npos);
    const size_t shape = h.find("\"shape\":[8,6]", at);
    ASSERT_NE(shape, std::string::npos);
    h.replace(shape, 13, "\"shape\":[268435456,4]");
    const size_t offsets = h.find("\"data_offsets\":[0,192]", at);
    ASSERT_NE(offsets, std::string::npos);
    h.replace(offsets, 22, "\"data_offsets\":[0," + std::to_string(huge) + "]");
    // Every later offset moves by huge - 192.
    for (size_t p = h.find("\"data_offsets\":["); p != std::string::npos;
         p = h.find("\"data_offsets\":[", p + 1)) {
      if (p == offsets) continue;
      const size_t open = p + 16, comma = h.find(',', open), close = h.find(']', comma);
      const uint64_t b = std::stoull(h.substr(open, comma - open));
      const uint64_t e = std::stoull(h.substr(comma + 1, close - comma - 1));
      old_end = std::max(old_end, e);
      h.replace(open, close - open,
                std::to_string(b + huge - 192) + "," + std::to_string(e + huge - 192));
    }
  });
  std::filesystem::resize_file(path, std::filesystem::file_size(path) + huge - 192);
  ls::models::MLP b({6, 8, 3});
  const auto start = std::chrono::steady_clock::now();
  expect_load_fails(path, b, nullptr,
                    {path, "does not fit", "model.layers.0.weight (f32[268435456, 4] in the file"});
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0)
      << "the data was read";
  std::remove(path.c_str());
}

// save_checkpoint inside a step writes the state as of the call once the step commits; a step
// that fails afterwards, as it traces or as it runs, writes nothing (issue 30, item 13).
TEST(Checkpoint, ASaveInsideAStepIsWrittenOnlyIfTheStepCommits) {
  const std::string path = temp_path("in_step.safetensors");
  std::remove(path.c_str());
  ls::manual_seed(6);
  ls::models::MLP m({4, 3});
  ls::Tensor w = m.named_parameters().front().second;
  const std::vector<float> before = w.to_vector<float>();
  // Fails while tracing, after the save.
  EXPECT_THROW(ls::step([&] {
                 ls::NoGrad no_grad;
                 w.add_(1.0);
                 ls::save_checkpoint(path, m);
                 throw std::runtime_error("later in the step");
               }),
               std::runtime_error);
  EXPECT_FALSE(std::filesystem::exists(path));
  // Fails as it runs, after the save: an index out of range.
  ls::Tensor bad;
  ls::step([&] {
    ls::NoGrad no_grad;
    w.add_(1.0);
    ls::save_checkpoint(path, m);
    bad = ls::gather(w, 0, ls::full({1, 4}, 99, ls::i64));
    w.add_(bad);
  });
  EXPECT_THROW(ls::wait(), ls::Error);
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_EQ(w.to_vector<float>(), before);
  // Commits: the file holds the values as of the save (the update after it is not in it).
  ls::step([&] {
    ls::NoGrad no_grad;
    w.add_(1.0);
    ls::save_checkpoint(path, m);
    w.add_(5.0);
  });
  ls::wait();
  ls::models::MLP loaded({4, 3});
  ls::load_checkpoint(path, loaded);
  const std::vector<float> saved = loaded.named_parameters().front().second.to_vector<float>();
  ASSERT_EQ(saved.size(), before.size());
  for (size_t i = 0; i < saved.size(); ++i) EXPECT_EQ(saved[i], before[i] + 1.0f);
  std::remove(path.c_str());
}

// Values a training state cannot hold are refused on load, naming the tensor, the element and
// the file, with nothing changed: NaN or infinite weights, a negative variance or second moment,
// a negative or absurd step count (issue 30, item 11).
TEST(Checkpoint, ImpossibleValuesAreRefusedNamingTheTensor) {
  const std::string path = temp_path("values.safetensors");
  ls::manual_seed(8);
  ls::models::FashionCNN a(10, 1, 8);
  ls::optim::Adam opt_a(a.parameters(), {});
  train_step(a, opt_a);
  struct Case {
    std::string tensor;
    std::function<void()> spoil, restore;
    std::string says;
  };
  auto find = [](const ls::nn::NamedTensors& ts, const std::string& name) {
    for (const auto& [n, t] : ts)
      if (n == name) return t;
    return ls::Tensor();
  };
  ls::NoGrad no_grad;
  ls::Tensor w = find(a.state_dict(), "fc2.weight"), var = find(a.state_dict(), "bn1.running_var");
  ls::Tensor sq = find(opt_a.state_dict(), "0.exp_avg_sq"), step = find(opt_a.state_dict(), "step");
  ASSERT_TRUE(w.defined() && var.defined() && sq.defined() && step.defined());
  const ls::Tensor w0 = w.detach(), var0 = var.detach(), sq0 = sq.detach(), step0 = step.detach();
  auto set_first = [](ls::Tensor& t, double v) {
    ls::Tensor flat = ls::reshape(t, {-1});
    ls::Tensor mask = ls::reshape(ls::eq(ls::arange(flat.numel()), 0), t.shape());
    t.copy_(ls::where(mask, ls::full_like(t, v), t));
  };
  const std::vector<Case> cases = {
      {"model.fc2.weight", [&] { set_first(w, NAN); }, [&] { w.copy_(w0); }, "nan at element 0"},
      {"model.fc2.weight", [&] { set_first(w, INFINITY); }, [&] { w.copy_(w0); }, "inf"},
      {"model.bn1.running_var", [&] { set_first(var, -1.0); }, [&] { var.copy_(var0); },
       "never negative"},
      {"optimizer.0.exp_avg_sq", [&] { set_first(sq, -0.5); }, [&] { sq.copy_(sq0); },
       "never negative"},
      {"optimizer.step", [&] { step.copy_(ls::full_like(step, -1)); }, [&] { step.copy_(step0); },
       "a count lies in [0, 2^53]"},
      {"optimizer.step", [&] { step.copy_(ls::full_like(step, INT64_MAX)); },
       [&] { step.copy_(step0); }, "a count lies in [0, 2^53]"},
  };
  auto live = [&](const std::string& name) {
    for (const auto& [n, t] : a.state_dict())
      if ("model." + n == name) return t;
    return find(opt_a.state_dict(), name.substr(std::string("optimizer.").size()));
  };
  for (const Case& c : cases) {
    c.spoil();
    // Saving refuses the state before anything is written (CheckpointSave.*)...
    EXPECT_THROW(ls::save_checkpoint(path, a, &opt_a), ls::Error);
    const ls::Tensor spoiled = live(c.tensor).detach();
    c.restore();
    // ... so a file holding it was written otherwise (edited, or by another writer): the good
    // checkpoint with that one tensor replaced, its checksums recomputed.
    ls::save_checkpoint(path, a, &opt_a);
    ls::io::Loaded file = ls::io::load_safetensors(path);
    for (auto& [name, t] : file.tensors)
      if (name == c.tensor) t = spoiled;
    ls::io::save_safetensors(path, file.tensors, file.metadata);
    ls::models::FashionCNN b(10, 1, 8);
    ls::optim::Adam opt_b(b.parameters(), {});
    expect_load_fails(path, b, &opt_b, {path, "'" + c.tensor + "'", c.says});
  }
  ls::save_checkpoint(path, a, &opt_a);  // restored: loads
  ls::models::FashionCNN b(10, 1, 8);
  ls::optim::Adam opt_b(b.parameters(), {});
  ls::load_checkpoint(path, b, &opt_b);
  std::remove(path.c_str());
}
