// Checkpoints on top of the safetensors reader and writer: naming, and loading all or nothing.
#include "lockstep/checkpoint.h"

#include <cmath>
#include <map>
#include <set>

#include "lockstep/autograd.h"
#include "lockstep/runtime.h"
#include "nn/training_state.h"
#include "runtime/profiler.h"
#include "util/check.h"

namespace lockstep {

using util::cat;

namespace {
const std::string& kModel = nn::kModelPrefix;
const std::string& kOptimizer = nn::kOptimizerPrefix;
const std::string& kScheduler = nn::kSchedulerPrefix;
const std::string& kGenerator = nn::kGeneratorName;
// Version 2 records checksums of the data (io::kChecksumKey), which loading then requires;
// version 1 files (before them) still load.
const std::string kVersion = "2";
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// What a training state can hold: finite floats; second moments, variances and sums of squares
// that are not negative; counts (steps, batches tracked, a scheduler's epoch) in [0, 2^53]. A
// file that passes its checksum may still hold them (written from a diverged run, or edited):
// refused naming the tensor, the element and the file, so that a resume never starts from NaN.
// Saving checks the same before anything is written: what save_checkpoint writes,
// load_checkpoint accepts, and a diverged state never replaces the last good file.
void check_values(const std::string& path, const std::string& name, const Tensor& t, const Loc& loc,
                  bool saving = false, const char* loader = "load_checkpoint") {
  auto refuse = [&](size_t at, const std::string& value, const std::string& why) {
    if (saving)
      util::fail(loc, "save_checkpoint",
                 cat("not saving '", path, "': tensor '", name, "' holds ", value, " at element ",
                     at, ": ", why, " (a resume would refuse the file)"),
                 "The run has diverged (an overflow, a learning rate too high): the file already "
                 "at the path, if any, is kept; resume from it with a lower learning rate or "
                 "gradient clipping");
    util::fail(
        loc, loader,
        cat("'", path, "': tensor '", name, "' holds ", value, " at element ", at, ": ", why),
        "The file was written from a diverged run or edited: resume from an earlier "
        "checkpoint");
  };
  if (is_floating(t.dtype())) {
    // Read as the file's values, on the host (a cast would compile a program per tensor).
    std::vector<double> v;
    if (t.dtype() == DType::F64) {
      v = t.to_vector<double>(loc);
    } else {  // f32, and bf16 (read as float exactly)
      const std::vector<float> f = t.to_vector<float>(loc);
      v.assign(f.begin(), f.end());
    }
    const bool non_negative = ends_with(name, "running_var") || ends_with(name, "exp_avg_sq") ||
                              ends_with(name, "square_avg") || ends_with(name, ".sum") ||
                              ends_with(name, "base_lrs") || ends_with(name, "_last_lr");
    for (size_t i = 0; i < v.size(); ++i) {
      if (std::isnan(v[i]) || (std::isinf(v[i]) && !ends_with(name, "best")))
        refuse(i, cat(v[i]), "a training state is finite");
      if (non_negative && v[i] < 0) refuse(i, cat(v[i]), "this quantity is never negative");
    }
  } else if (t.dtype() == DType::I64 &&
             (name == "optimizer.step" || ends_with(name, ".step") ||
              ends_with(name, "num_batches_tracked") || ends_with(name, "skipped_updates") ||
              ends_with(name, "last_epoch") || ends_with(name, "num_bad_epochs") ||
              ends_with(name, "cooldown_counter"))) {
    const std::vector<int64_t> v = t.to_vector<int64_t>(loc);
    for (size_t i = 0; i < v.size(); ++i)
      if (v[i] < 0 || v[i] > (int64_t{1} << 53)) refuse(i, cat(v[i]), "a count lies in [0, 2^53]");
  }
}

}  // namespace

void save_checkpoint(const std::string& path, const nn::Module& model,
                     const optim::Optimizer* optimizer, const io::Metadata& metadata, Loc loc) {
  save_checkpoint(path, model, optimizer, nullptr, metadata, loc);
}

void save_checkpoint(const std::string& path, const nn::Module& model,
                     const optim::Optimizer* optimizer, const optim::Scheduler* scheduler,
                     const io::Metadata& metadata, Loc loc) {
  runtime::prof::Span span("io", "save checkpoint");
  span.arg("path", path);
  io::TensorMap tensors;
  for (auto& [name, t] : model.state_dict()) tensors.emplace_back(cat(kModel, name), t);
  if (optimizer)
    for (auto& [name, t] : optimizer->state_dict()) tensors.emplace_back(cat(kOptimizer, name), t);
  if (scheduler)
    for (auto& [name, t] : scheduler->state_dict()) tensors.emplace_back(cat(kScheduler, name), t);
  tensors.emplace_back(kGenerator, generator_state());
  io::Metadata meta{{"format", "lockstep-checkpoint"}, {"version", kVersion}};
  for (const auto& [key, value] : metadata)
    if (meta.count(key) || key == "scheduler")
      util::fail(loc, "save_checkpoint",
                 cat("metadata key '", key,
                     "' is the checkpoint's own (its format, version and scheduler kind)"),
                 "Name it otherwise, e.g. 'run_" + key + "'");
  if (scheduler) meta.emplace("scheduler", scheduler->kind());
  meta.insert(metadata.begin(), metadata.end());
  if (in_step()) {
    // The state as of this call, written once the step commits: a step that fails afterwards
    // (as it traces or as it runs) must not leave its never-committed state in a file.
    for (auto& [name, t] : tensors) t = t.detach(loc);
    add_step_closure(
        [path, tensors, meta, loc] {
          for (const auto& [name, t] : tensors) check_values(path, name, t, loc, true);
          io::save_safetensors(path, tensors, meta, loc);
        },
        loc);
    return;
  }
  sync(loc);  // one program for every pending value, not one read each
  for (const auto& [name, t] : tensors) check_values(path, name, t, loc, true);
  io::save_safetensors(path, tensors, meta, loc);
}

io::Metadata load_checkpoint(const std::string& path, nn::Module& model,
                             optim::Optimizer* optimizer, Loc loc) {
  return load_checkpoint(path, model, optimizer, nullptr, loc);
}

io::Metadata load_checkpoint(const std::string& path, nn::Module& model,
                             optim::Optimizer* optimizer, optim::Scheduler* scheduler, Loc loc) {
  // What the file may hold: the header is compared with it before any data is read, so a file
  // claiming sizes the model does not have is refused without reading them.
  std::map<std::string, std::pair<DType, Shape>> expected;
  uint64_t expected_bytes = 0;
  auto expect = [&](const std::string& prefix, const nn::NamedTensors& state) {
    for (const auto& [name, t] : state) {
      expected[prefix + name] = {t.dtype(), t.shape()};
      expected_bytes += static_cast<uint64_t>(t.numel()) * dtype_size(t.dtype());
    }
  };
  expect(kModel, model.state_dict());
  if (optimizer) expect(kOptimizer, optimizer->state_dict());
  if (scheduler) expect(kScheduler, scheduler->state_dict());
  expect(kGenerator, {{"", generator_state()}});
  // The file is read only when its tensors take no more than the ones expected (and 1 MiB):
  // within that, the checks below name every difference; a header claiming more is refused
  // unread, naming the tensors that do not fit.
  auto vet = [&](const io::Metadata&, const std::vector<io::TensorInfo>& infos) {
    std::set<std::string> read;
    uint64_t bytes = 0;
    std::vector<std::string> differ;
    for (const io::TensorInfo& info : infos) {
      if ((!optimizer && info.name.rfind(kOptimizer, 0) == 0) ||
          (!scheduler && info.name.rfind(kScheduler, 0) == 0))
        continue;  // not asked for: not read
      read.insert(info.name);
      bytes += static_cast<uint64_t>(shape_numel(info.shape)) * dtype_size(info.dtype);
      auto it = expected.find(info.name);
      if (it == expected.end())
        differ.push_back(cat(info.name, " (not here)"));
      else if (it->second.first != info.dtype || it->second.second != info.shape)
        differ.push_back(cat(info.name, " (", dtype_name(info.dtype), shape_str(info.shape),
                             " in the file, ", dtype_name(it->second.first),
                             shape_str(it->second.second), " here)"));
    }
    if (bytes > expected_bytes + (uint64_t{1} << 20)) {
      std::string list;
      for (size_t i = 0; i < differ.size() && i < 5; ++i) list += cat(i ? ", " : "", differ[i]);
      if (differ.size() > 5) list += cat(" and ", differ.size() - 5, " more");
      util::fail(loc, "load_checkpoint",
                 cat("'", path, "' does not fit: its tensors take ", bytes,
                     " bytes, the model's (and optimizer's) ", expected_bytes, ": ", list),
                 "Load it into the model (and optimizer) that saved it");
    }
    return read;
  };
  io::Loaded file = io::load_safetensors(path, default_device(), vet, loc);
  auto it = file.metadata.find("format");
  if (it == file.metadata.end() || it->second != "lockstep-checkpoint")
    util::fail(loc, "load_checkpoint",
               cat("'", path, "' is a safetensors file but not a lockstep checkpoint"),
               "Load plain tensors with ls::io::load_safetensors and Module::load_state_dict");
  auto version = file.metadata.find("version");
  const bool known_version =
      version != file.metadata.end() && (version->second == kVersion || version->second == "1");
  if (!known_version)
    util::fail(loc, "load_checkpoint",
               cat("'", path, "' is a lockstep checkpoint of version '",
                   version == file.metadata.end() ? std::string("(none)") : version->second,
                   "', this build reads versions 1 and ", kVersion),
               "Load it with the lockstep version that wrote it");
  if (version->second == kVersion && !file.checksummed)
    util::fail(loc, "load_checkpoint",
               cat("'", path, "' is a version ", kVersion,
                   " checkpoint without the checksums of its data: its header was damaged"),
               "Use another copy of the checkpoint");
  nn::NamedTensors model_state, optimizer_state, scheduler_state;
  Tensor generator;
  for (auto& [name, t] : file.tensors) {
    if (name.rfind(kModel, 0) == 0)
      model_state.emplace_back(name.substr(kModel.size()), t);
    else if (name.rfind(kOptimizer, 0) == 0)
      optimizer_state.emplace_back(name.substr(kOptimizer.size()), t);
    else if (name.rfind(kScheduler, 0) == 0)
      scheduler_state.emplace_back(name.substr(kScheduler.size()), t);
    else if (name == kGenerator)
      generator = t;
    else
      util::fail(loc, "load_checkpoint", cat("'", path, "' has an unknown tensor '", name, "'"),
                 "The file was not written by ls::save_checkpoint");
  }
  const Tensor& gen = generator_state();
  if (!generator.defined() || generator.shape() != gen.shape() || generator.dtype() != gen.dtype())
    util::fail(loc, "load_checkpoint", cat("'", path, "' has no valid generator state"),
               "The file was not written by ls::save_checkpoint");
  if (optimizer && optimizer_state.empty())
    util::fail(loc, "load_checkpoint", cat("'", path, "' holds no optimizer state"),
               "Load it without an optimizer, or use a checkpoint saved with one");
  if (scheduler) {
    auto kind = file.metadata.find("scheduler");
    if (kind == file.metadata.end() || scheduler_state.empty())
      util::fail(loc, "load_checkpoint", cat("'", path, "' holds no scheduler state"),
                 "Load it without a scheduler and set the scheduler's count "
                 "(LRScheduler::set_count), or use a checkpoint saved with one");
    if (kind->second != scheduler->kind())
      util::fail(
          loc, "load_checkpoint",
          cat("'", path, "' holds the state of a ", kind->second, ", not of a ", scheduler->kind()),
          "Make the same kind of scheduler as the run that saved it");
  }
  nn::load_training_state(
      "load_checkpoint", path, model, optimizer, scheduler,
      {std::move(model_state), std::move(optimizer_state), std::move(scheduler_state), generator},
      loc);
  return file.metadata;
}

void nn::load_training_state(const char* who, const std::string& source, Module& model,
                             optim::Optimizer* optimizer, optim::Scheduler* scheduler,
                             const TrainingState& state, const Loc& loc) {
  // Everything is checked before anything changes: the values too.
  for (const auto& [prefix, named] : {std::pair{&kModel, &state.model},
                                      {&kOptimizer, &state.optimizer},
                                      {&kScheduler, &state.scheduler}})
    for (const auto& [name, t] : *named) check_values(source, *prefix + name, t, loc, false, who);
  check_values(source, kGenerator, state.generator, loc, false, who);
  try {
    model.check_state_dict(state.model, true);
    if (optimizer) optimizer->check_state_dict(state.optimizer);
    if (scheduler) scheduler->check_state_dict(state.scheduler);
  } catch (const Error& e) {
    util::fail(loc, who, cat("'", source, "' does not fit: ", e.what()), "");
  }
  model.load_state_dict(state.model, true);
  if (optimizer) optimizer->load_state_dict(state.optimizer);
  // After the optimizer's: the scheduler sets the groups' lrs.
  if (scheduler) scheduler->load_state_dict(state.scheduler);
  NoGrad no_grad;
  generator_state().copy_(state.generator);
}

}  // namespace lockstep
