// Sharded checkpoints (save_sharded, load_sharded in lockstep/dist.h): one safetensors file per
// rank with its part of the state, committed by an index rank 0 writes last; loaded at any world
// size by reading from each file the tensors this rank keeps.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dist/comm.h"
#include "dist/fully_shard.h"
#include "dist/partition.h"
#include "lockstep/dist.h"
#include "lockstep/runtime.h"
#include "nn/training_state.h"
#include "runtime/lazy.h"
#include "util/check.h"

namespace lockstep::dist {

using util::cat;

namespace {

const char* const kFormat = "lockstep-sharded-checkpoint";
const std::string& kModel = nn::kModelPrefix;
const std::string& kOptimizer = nn::kOptimizerPrefix;
const std::string& kScheduler = nn::kSchedulerPrefix;
const std::string& kGenerator = nn::kGeneratorName;
const std::string kMeta = "meta.";  // the index's keys for the caller's metadata
// A run of a split parameter's state (ZeroRedundancyOptimizer::run), or of the split parameter
// itself (fully_shard): "<name>#<offset>", each rank's in its own file. A file's metadata names
// the parameters' runs, with the whole's shape: "run.<entry>" = "64,125".
const char kRunMark = '#';
const std::string kRunKey = "run.";

std::string shape_list(const Shape& shape) {
  std::string out;
  for (size_t d = 0; d < shape.size(); ++d) out += cat(d ? "," : "", shape[d]);
  return out;
}

// A run's whole shape as its file's metadata gives it, or nothing (an optimizer state's run).
std::optional<Shape> run_shape(const io::Metadata& meta, const std::string& entry) {
  auto it = meta.find(kRunKey + entry);
  if (it == meta.end()) return std::nullopt;
  Shape shape;
  std::stringstream in(it->second);
  for (std::string dim; std::getline(in, dim, ',');) {
    try {
      size_t used = 0;
      shape.push_back(std::stoll(dim, &used));
      if (used != dim.size() || shape.back() < 0) return Shape{-1};
    } catch (const std::exception&) {
      return Shape{-1};
    }
  }
  return shape;
}

std::string index_path(const std::string& dir) { return dir + "/index.safetensors"; }
std::string shard_name(int rank, int world, int64_t generation) {
  return cat("shard-", rank, "-of-", world, "-g", generation, ".safetensors");
}

// The parameter an optimizer entry belongs to ("3.exp_avg": 3), or -1 for the optimizer's own
// counters ("step", "skipped_updates") and each parameter's update count ("3.step"), which every
// rank holds alike.
int64_t param_of(const std::string& name) {
  const size_t dot = name.find('.');
  if (dot == std::string::npos || dot == 0 || name.compare(dot + 1, std::string::npos, "step") == 0)
    return -1;
  for (size_t k = 0; k < dot; ++k)
    if (name[k] < '0' || name[k] > '9') return -1;
  return std::stoll(name.substr(0, dot));
}

// The index's metadata, or an empty map when `dir` holds none.
io::Metadata read_index(const std::string& dir, const Loc& loc, bool required) {
  std::error_code ec;
  if (!std::filesystem::exists(index_path(dir), ec)) {
    if (required)
      util::fail(loc, "load_sharded", cat("'", dir, "' holds no index.safetensors"),
                 "Pass the directory save_sharded wrote (its index is written last: a save that "
                 "was interrupted before it left none)");
    return {};
  }
  io::Metadata meta =
      io::load_safetensors(index_path(dir), Device{DeviceKind::Cpu, 0}, loc).metadata;
  auto it = meta.find("format");
  if (it == meta.end() || it->second != kFormat)
    util::fail(loc, required ? "load_sharded" : "save_sharded",
               cat("'", index_path(dir), "' is not the index of a sharded lockstep checkpoint"),
               "Use another directory");
  return meta;
}

// The path of rank r's file, as the index names it.
std::string shard_path(const std::string& dir, const io::Metadata& index, int64_t r,
                       const Loc& loc) {
  auto it = index.find(cat("file.", r));
  if (it == index.end() || it->second.find('/') != std::string::npos)
    util::fail(loc, "load_sharded", cat("'", index_path(dir), "' names no valid file.", r),
               "The index was not written by save_sharded");
  return dir + "/" + it->second;
}

int64_t meta_int(const io::Metadata& meta, const std::string& key, const std::string& path,
                 const Loc& loc) {
  auto it = meta.find(key);
  try {
    if (it != meta.end()) return std::stoll(it->second);
  } catch (const std::exception&) {
  }
  util::fail(loc, "load_sharded", cat("'", path, "' has no valid '", key, "'"),
             "The index was not written by save_sharded");
}

// A save after the ranks agreed on its generation: this rank's file, then the commit.
struct ShardSave {
  std::string dir;
  int me = 0, world = 1;
  int64_t generation = 0;
  io::TensorMap mine;  // this rank's part of the state
  io::Metadata runs;   // its runs of split parameters, with their shapes (kRunKey)
  io::Metadata metadata;
  std::string scheduler_kind;  // empty: no scheduler
};

ShardSave prepare(const std::string& dir, const nn::Module& model,
                  const optim::Optimizer* optimizer, const optim::Scheduler* scheduler,
                  const io::Metadata& metadata, const char* api, const Loc& loc) {
  if (in_step())
    util::fail(loc, api, "called inside a step",
               "Call it between steps, on every rank (the ranks meet in it)");
  ShardSave s;
  s.dir = dir;
  s.me = rank();
  s.world = world_size();
  s.metadata = metadata;
  if (scheduler) s.scheduler_kind = scheduler->kind();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    util::fail(loc, api, cat("cannot create '", dir, "': ", ec.message()),
               "Pass a directory this process may write");
  // A new generation's files: the previous checkpoint stays whole until the index names these.
  const io::Metadata previous = read_index(dir, loc, false);
  s.generation =
      max_on_all_ranks(previous.empty() ? 1 : meta_int(previous, "generation", dir, loc) + 1,
                       cat(api, "'s generation"));
  // This rank's share: its part of the model's tensors, its parameters' optimizer buffers, and
  // on rank 0 what every rank holds alike.
  const nn::NamedTensors state = model.state_dict();
  std::vector<int64_t> sizes;
  for (const auto& [name, t] : state) sizes.push_back(t.numel());
  std::vector<int> writer = detail::partition_by_size(sizes, s.world);
  for (size_t k = 0; k < state.size(); ++k) {
    const lockstep::detail::TensorImpl& impl = *state[k].second.impl();
    // A split parameter (fully_shard): each rank's run by it.
    if (impl.gather_runs) {
      const auto [offset, numel] = impl.gather_runs->runs[static_cast<size_t>(s.me)];
      if (numel == 0) continue;
      const std::string entry = cat(kModel, state[k].first, kRunMark, offset);
      s.mine.emplace_back(entry, impl.gather_runs->own);
      s.runs.emplace(kRunKey + entry, shape_list(state[k].second.shape()));
      continue;
    }
    // A sharded parameter (fully_shard): by the rank that holds it.
    if (const int root = impl.gather_root; root >= 0) writer[k] = root;
    if (writer[k] == s.me) s.mine.emplace_back(kModel + state[k].first, state[k].second);
  }
  if (optimizer) {
    const auto* zero = dynamic_cast<const ZeroRedundancyOptimizer*>(optimizer);
    std::vector<int> owner;
    if (!zero) owner = detail::partition_by_size(detail::sizes_of(optimizer->params()), s.world);
    for (const auto& [name, t] : optimizer->state_dict()) {
      const int64_t i = param_of(name);
      if (const ZeroRedundancyOptimizer::Run run =
              zero && i >= 0 ? zero->run(static_cast<size_t>(i)) : ZeroRedundancyOptimizer::Run{};
          run.numel > 0) {
        s.mine.emplace_back(cat(kOptimizer, name, kRunMark, run.offset), t);
        continue;
      }
      const int who = i < 0 ? 0 : zero ? zero->owner(static_cast<size_t>(i)) : owner.at(i);
      if (who == s.me) s.mine.emplace_back(kOptimizer + name, t);
    }
  }
  if (s.me == 0) {
    if (scheduler)
      for (const auto& [name, t] : scheduler->state_dict())
        s.mine.emplace_back(kScheduler + name, t);
    s.mine.emplace_back(kGenerator, generator_state());
  }
  return s;
}

// Writes this rank's file (from `tensors`), then, once every rank's is on disk (`barrier`),
// rank 0 commits the index and removes the previous generation's files; no rank returns before
// the index is in place.
void write_and_commit(const ShardSave& s, const std::vector<io::TensorSource>& tensors,
                      const std::function<void()>& barrier_fn, const Loc& loc) {
  io::Metadata shard_meta{{"format", kFormat},
                          {"rank", std::to_string(s.me)},
                          {"world_size", std::to_string(s.world)},
                          {"generation", std::to_string(s.generation)}};
  shard_meta.insert(s.runs.begin(), s.runs.end());
  io::save_safetensors_streamed(s.dir + "/" + shard_name(s.me, s.world, s.generation), tensors,
                                shard_meta, loc);
  barrier_fn();  // every shard is on disk before the index names them
  if (s.me == 0) {
    io::Metadata index{{"format", kFormat},
                       {"version", "1"},
                       {"world_size", std::to_string(s.world)},
                       {"generation", std::to_string(s.generation)}};
    if (!s.scheduler_kind.empty()) index.emplace("scheduler", s.scheduler_kind);
    for (int r = 0; r < s.world; ++r)
      index.emplace(cat("file.", r), shard_name(r, s.world, s.generation));
    for (const auto& [key, value] : s.metadata) index.emplace(kMeta + key, value);
    io::save_safetensors(index_path(s.dir), io::TensorMap{}, index, loc);
    // The files of earlier generations (of any world size) are no longer named by the index.
    std::set<std::string> current;
    for (int r = 0; r < s.world; ++r) current.insert(shard_name(r, s.world, s.generation));
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(s.dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("shard-", 0) == 0 && !current.count(name))
        std::filesystem::remove(entry.path(), ec);
    }
  }
  barrier_fn();  // no rank returns (and maybe saves again) before the index is in place
}

// This process's asynchronous save in flight: its writer thread and what it threw. Waited for by
// the next save or load, wait_for_save, finalize, and at exit.
struct PendingSave {
  std::mutex mu;
  std::thread thread;
  std::exception_ptr error;
};
PendingSave& pending_save() {
  // Never destroyed: finalize, from its own exit handler, may still wait for it. The exit waits
  // for a save in flight (registered after MPI's handler, this one runs before it).
  static PendingSave* p = [] {
    auto* made = new PendingSave;
    std::atexit([] {
      try {
        wait_for_save();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "lockstep: dist: rank %d: an asynchronous save failed: %s\n", rank(),
                     e.what());
      }
    });
    return made;
  }();
  return *p;
}

// A tensor load_sharded reads: its shape and dtype here, and for a split parameter's state this
// rank's run of the whole's `whole_numel` elements.
struct Wanted {
  explicit Wanted(const Tensor* t = nullptr) : like(t) {}
  const Tensor* like;
  ZeroRedundancyOptimizer::Run run;  // numel 0: the whole tensor
  int64_t whole_numel = 0;
};

// Where a checkpoint holds a tensor: whole in one file, or in runs over several.
struct Held {
  int64_t file = 0;
  io::TensorInfo info;
  int64_t offset = -1;         // -1: whole
  std::optional<Shape> whole;  // a split parameter's run: the parameter's shape
};

// The tensor a file's entry is, or a run of: its name, and the run's offset (-1: whole) and
// the whole's shape if its file gives it. Only optimizer state and the runs a file's metadata
// names are runs (a model tensor's own name may hold the mark).
struct Entry {
  std::string tensor;
  int64_t offset = -1;
  std::optional<Shape> whole;
};
Entry entry_of(const io::Metadata& meta, const io::TensorInfo& info, const std::string& path,
               const Loc& loc, const char* api) {
  std::optional<Shape> whole = run_shape(meta, info.name);
  const size_t mark =
      whole || info.name.rfind(kOptimizer, 0) == 0 ? info.name.rfind(kRunMark) : std::string::npos;
  if (mark == std::string::npos) return {info.name, -1, std::nullopt};
  int64_t offset = -1;
  try {
    offset = std::stoll(info.name.substr(mark + 1));
  } catch (const std::exception&) {
  }
  if (offset < 0 || info.shape.size() != 1 || (whole && !whole->empty() && whole->at(0) < 0))
    util::fail(loc, api, cat("'", path, "': tensor '", info.name, "' is no valid run"),
               "Use a checkpoint save_sharded wrote");
  return {info.name.substr(0, mark), offset, std::move(whole)};
}

// Reads each wanted tensor from the files of the checkpoint in `dir`: the headers first, then,
// from each file, only what this rank needs (of a tensor saved in runs, the runs overlapping the
// run wanted, or all of them for the whole), each checked against its checksum, joined or cut to
// what is wanted. A tensor of another shape or dtype, runs that do not join up into it, or none
// held: an Error naming the file or the tensor.
std::map<std::string, Tensor> read_wanted(const std::string& dir, const io::Metadata& index,
                                          int64_t world,
                                          const std::map<std::string, Wanted>& wanted,
                                          const Loc& loc) {
  std::vector<std::string> paths;
  std::map<std::string, std::vector<Held>> held;
  for (int64_t r = 0; r < world; ++r) {
    paths.push_back(shard_path(dir, index, r, loc));
    auto list = [&](const io::Metadata& meta, const std::vector<io::TensorInfo>& infos) {
      for (const io::TensorInfo& info : infos) {
        Entry e = entry_of(meta, info, paths.back(), loc, "load_sharded");
        held[e.tensor].push_back({r, info, e.offset, std::move(e.whole)});
      }
      return std::set<std::string>{};
    };
    io::load_safetensors(paths.back(), Device{DeviceKind::Cpu, 0}, list, loc);
  }
  // Per wanted tensor, the entries read and the run of the whole they give.
  std::vector<std::set<std::string>> to_read(static_cast<size_t>(world));
  std::map<std::string, std::vector<Held>> parts;
  for (const auto& [key, w] : wanted) {
    auto it = held.find(key);
    if (it == held.end())
      util::fail(loc, "load_sharded", cat("no file of '", dir, "' holds tensor '", key, "'"),
                 "Load it into the model (and optimizer) that saved it");
    std::vector<Held> entries = it->second;
    const int64_t whole = w.run.numel > 0 ? w.whole_numel : w.like->numel();
    const int64_t begin = w.run.numel > 0 ? w.run.offset : 0;
    const int64_t end = w.run.numel > 0 ? begin + w.run.numel : whole;
    auto mismatch = [&](const Held& e, const std::string& here) {
      util::fail(loc, "load_sharded",
                 cat("'", paths[static_cast<size_t>(e.file)], "': tensor '", e.info.name, "' is ",
                     dtype_name(e.info.dtype), shape_str(e.info.shape),
                     e.whole ? cat(" (a run of ", shape_str(*e.whole), ")") : std::string(),
                     ", here ", here),
                 "Load it into the model (and optimizer) that saved it");
    };
    const std::string here = cat(dtype_name(w.like->dtype()), shape_str(w.like->shape()));
    if (entries.size() == 1 && entries[0].offset < 0) {
      const Held& e = entries[0];
      if (e.info.dtype != w.like->dtype() ||
          (w.run.numel > 0 ? shape_numel(e.info.shape) != whole : e.info.shape != w.like->shape()))
        mismatch(e, here);
    } else {
      std::sort(entries.begin(), entries.end(),
                [](const Held& a, const Held& b) { return a.offset < b.offset; });
      int64_t joined = 0;
      for (const Held& e : entries) {
        if (e.offset != joined || e.info.dtype != w.like->dtype() ||
            (e.whole && *e.whole != w.like->shape()))
          mismatch(e, here);
        joined += e.info.shape[0];
      }
      if (joined != whole)
        util::fail(loc, "load_sharded",
                   cat("tensor '", key, "' is saved in runs of ", joined, " elements in all, here ",
                       here, w.run.numel > 0 ? cat(" of ", whole, " elements") : std::string()),
                   "Load it into the model (and optimizer) that saved it");
      std::erase_if(entries, [&](const Held& e) {
        return e.offset >= end || e.offset + e.info.shape[0] <= begin;
      });
    }
    for (const Held& e : entries) to_read[static_cast<size_t>(e.file)].insert(e.info.name);
    parts[key] = std::move(entries);
  }
  std::map<std::string, Tensor> read;
  for (int64_t r = 0; r < world; ++r) {
    const std::set<std::string>& names = to_read[static_cast<size_t>(r)];
    if (names.empty()) continue;
    const std::string& path = paths[static_cast<size_t>(r)];
    io::Loaded file = io::load_safetensors(
        path, default_device(),
        [&](const io::Metadata&, const std::vector<io::TensorInfo>&) { return names; }, loc);
    if (!file.checksummed)
      util::fail(loc, "load_sharded", cat("'", path, "' has no checksums of its data"),
                 "Use another copy of the checkpoint");
    for (auto& [name, t] : file.tensors) read[name] = std::move(t);
  }
  std::map<std::string, Tensor> found;
  for (const auto& [key, w] : wanted) {
    const std::vector<Held>& entries = parts.at(key);
    const Tensor& first = read.at(entries[0].info.name);
    if (entries.size() == 1 && entries[0].offset < 0 && w.run.numel == 0) {
      found[key] = first;
      continue;
    }
    // The wanted run of the whole (all of it: [0, numel)) from the runs or the whole read.
    const int64_t begin = w.run.numel > 0 ? w.run.offset : 0;
    const int64_t end = begin + (w.run.numel > 0 ? w.run.numel : w.like->numel());
    std::vector<Tensor> pieces;
    for (const Held& e : entries) {
      const Tensor& t = read.at(e.info.name);
      const int64_t at = std::max<int64_t>(e.offset, 0);
      pieces.push_back(slice(reshape(t, {t.numel()}), 0, std::max(begin, at) - at,
                             std::min(end, at + t.numel()) - at));
    }
    found[key] = reshape(pieces.size() == 1 ? pieces[0] : concat(pieces, 0), w.like->shape());
  }
  return found;
}

}  // namespace

void wait_for_save() {
  PendingSave& p = pending_save();
  std::lock_guard<std::mutex> lock(p.mu);
  if (p.thread.joinable()) p.thread.join();
  if (std::exception_ptr e = std::exchange(p.error, nullptr)) std::rethrow_exception(e);
}

void save_sharded(const std::string& dir, const nn::Module& model,
                  const optim::Optimizer* optimizer, const optim::Scheduler* scheduler,
                  const io::Metadata& metadata, Loc loc) {
  wait_for_save();
  const ShardSave s = prepare(dir, model, optimizer, scheduler, metadata, "save_sharded", loc);
  sync(loc);
  const runtime::OwnValues own;  // this rank's parameters as it holds them, not gathered
  write_and_commit(
      s, io::sources_of(s.mine, dir, loc), [] { barrier(); }, loc);
}

void save_sharded_async(const std::string& dir, const nn::Module& model,
                        const optim::Optimizer* optimizer, const optim::Scheduler* scheduler,
                        const io::Metadata& metadata, Loc loc) {
  wait_for_save();
  auto s = std::make_shared<ShardSave>(
      prepare(dir, model, optimizer, scheduler, metadata, "save_sharded_async", loc));
  // A copy of the values as they are now: the next steps update the tensors in place.
  sync(loc);
  std::vector<io::TensorSource> tensors = io::sources_of(s->mine, dir, loc);
  const runtime::OwnValues own;  // this rank's parameters as it holds them, not gathered
  for (io::TensorSource& t : tensors) {
    auto bytes = std::make_shared<const std::vector<unsigned char>>(t.read());
    t.read = [bytes] { return *bytes; };
  }
  s->mine.clear();
  PendingSave& p = pending_save();
  std::lock_guard<std::mutex> lock(p.mu);
  p.thread = std::thread([s, tensors = std::move(tensors), loc, &p] {
    try {
      write_and_commit(
          *s, tensors, [] { detail::save_barrier("the commit of an asynchronous sharded save"); },
          loc);
    } catch (...) {
      p.error = std::current_exception();  // read after the join, under p.mu
    }
  });
}

io::Metadata export_safetensors(const std::string& dir, const std::string& path, Loc loc) {
  wait_for_save();
  const io::Metadata index = read_index(dir, loc, true);
  const int64_t world = meta_int(index, "world_size", index_path(dir), loc);
  const Device cpu{DeviceKind::Cpu, 0};
  std::vector<io::TensorSource> sources;
  // A split parameter's runs, from the files that hold them, joined as it is exported.
  struct Runs {
    size_t source = 0;  // its place among `sources`
    Shape shape;
    std::map<int64_t, std::pair<std::string, io::TensorInfo>> at;  // by offset: file, entry
  };
  std::map<std::string, Runs> split;
  // Reads one entry of a file when the export needs its bytes, checked against its checksum.
  auto read_entry = [loc](const std::string& file, const std::string& name) {
    auto one = [&](const io::Metadata&, const std::vector<io::TensorInfo>&) {
      return std::set<std::string>{name};
    };
    io::Loaded l = io::load_safetensors(file, Device{DeviceKind::Cpu, 0}, one, loc);
    if (!l.checksummed)
      util::fail(loc, "export_safetensors", cat("'", file, "' has no checksums of its data"),
                 "Use another copy of the checkpoint");
    return runtime::read_bytes(l.tensors.at(0).second, loc, "export_safetensors");
  };
  for (int64_t r = 0; r < world; ++r) {
    const std::string file = shard_path(dir, index, r, loc);
    // The header alone: which model tensors this file holds.
    auto list = [&](const io::Metadata& meta, const std::vector<io::TensorInfo>& infos) {
      for (const io::TensorInfo& info : infos) {
        if (info.name.rfind(kModel, 0) != 0) continue;
        Entry e = entry_of(meta, info, file, loc, "export_safetensors");
        const std::string name = e.tensor.substr(kModel.size());
        if (e.offset < 0) {
          sources.push_back({name, info.dtype, info.shape, [read_entry, file, entry = info.name] {
                               return read_entry(file, entry);
                             }});
          continue;
        }
        auto [it, added] = split.try_emplace(name);
        if (added) {
          it->second.source = sources.size();
          it->second.shape = e.whole.value_or(Shape{});
          sources.push_back({name, info.dtype, it->second.shape, nullptr});
        }
        if (sources[it->second.source].dtype != info.dtype || it->second.shape != e.whole)
          util::fail(
              loc, "export_safetensors",
              cat("'", file, "': run '", info.name, "' is not of the tensor the other runs are"),
              "Use a checkpoint save_sharded wrote");
        it->second.at.emplace(e.offset, std::pair{file, info});
      }
      return std::set<std::string>{};
    };
    io::load_safetensors(file, cpu, list, loc);
  }
  for (auto& [name, runs] : split) {
    int64_t joined = 0;
    for (const auto& [offset, held] : runs.at) {
      if (offset != joined) break;
      joined += held.second.shape[0];
    }
    if (joined != shape_numel(runs.shape))
      util::fail(loc, "export_safetensors",
                 cat("'", dir, "': the runs of '", name, "' do not join up into its ",
                     shape_str(runs.shape)),
                 "Use a checkpoint save_sharded wrote, with all of its files");
    sources[runs.source].read = [read_entry, at = runs.at] {
      std::vector<unsigned char> bytes;
      for (const auto& [offset, held] : at) {
        const std::vector<unsigned char> run = read_entry(held.first, held.second.name);
        bytes.insert(bytes.end(), run.begin(), run.end());
      }
      return bytes;
    };
  }
  if (sources.empty())
    util::fail(loc, "export_safetensors", cat("no file of '", dir, "' holds a model tensor"),
               "Pass a checkpoint save_sharded wrote with the model");
  io::Metadata meta;
  for (const auto& [key, value] : index)
    if (key.rfind(kMeta, 0) == 0) meta.emplace(key.substr(kMeta.size()), value);
  io::Metadata file_meta = meta;
  file_meta["format"] = "pt";
  io::save_safetensors_streamed(path, sources, file_meta, loc);
  return meta;
}

io::Metadata load_sharded(const std::string& dir, nn::Module& model, optim::Optimizer* optimizer,
                          optim::Scheduler* scheduler, Loc loc) {
  wait_for_save();
  const io::Metadata index = read_index(dir, loc, true);
  const int64_t world = meta_int(index, "world_size", index_path(dir), loc);
  if (scheduler) {
    auto kind = index.find("scheduler");
    if (kind == index.end() || kind->second != scheduler->kind())
      util::fail(loc, "load_sharded",
                 cat("'", dir, "' holds ",
                     kind == index.end() ? std::string("no scheduler state")
                                         : "the state of a " + kind->second,
                     ", not of a ", scheduler->kind()),
                 "Make the same kind of scheduler as the run that saved it");
  }
  // What this rank needs: every model tensor (a sharded parameter's too, dropped again after the
  // load by the ranks that do not own it), the optimizer state it keeps now (of a split
  // parameter, its run), the scheduler's and the generator's, each as its file names it, with its
  // shape and dtype here.
  std::map<std::string, Wanted> wanted;
  const nn::NamedTensors model_state = model.state_dict();
  const nn::NamedTensors optimizer_state = optimizer ? optimizer->state_dict() : nn::NamedTensors{};
  const nn::NamedTensors scheduler_state = scheduler ? scheduler->state_dict() : nn::NamedTensors{};
  const auto* zero = dynamic_cast<const ZeroRedundancyOptimizer*>(optimizer);
  for (const auto& [name, t] : model_state) wanted[kModel + name] = Wanted(&t);
  for (const auto& [name, t] : optimizer_state) {
    Wanted w(&t);
    const int64_t i = param_of(name);
    if (zero && i >= 0) {
      w.run = zero->run(static_cast<size_t>(i));
      if (w.run.numel > 0) w.whole_numel = zero->params().at(static_cast<size_t>(i)).numel();
    }
    wanted[kOptimizer + name] = w;
  }
  for (const auto& [name, t] : scheduler_state) wanted[kScheduler + name] = Wanted(&t);
  wanted[kGenerator] = Wanted(&generator_state());
  const std::map<std::string, Tensor> found = read_wanted(dir, index, world, wanted, loc);
  auto named = [&](const std::string& prefix, const nn::NamedTensors& like) {
    nn::NamedTensors out;
    for (const auto& [name, t] : like) out.emplace_back(name, found.at(prefix + name));
    return out;
  };
  nn::load_training_state("load_sharded", dir, model, optimizer, scheduler,
                          {named(kModel, model_state), named(kOptimizer, optimizer_state),
                           named(kScheduler, scheduler_state), found.at(kGenerator)},
                          loc);
  detail::drop_unowned(model.parameters(), loc);  // sharded parameters: their owners' alone
  io::Metadata out;
  for (const auto& [key, value] : index)
    if (key.rfind(kMeta, 0) == 0) out.emplace(key.substr(kMeta.size()), value);
  return out;
}

}  // namespace lockstep::dist
