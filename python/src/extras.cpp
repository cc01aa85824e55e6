// Checkpoints, safetensors files, data parallel training (lockstep.dist) and the data loaders
// (lockstep.data). Loaders' next batch and every collective-bearing call release the GIL.
#include <memory>

#include "common.h"

namespace lockstep::python {
namespace {

io::Metadata metadata_of(const py::object& o) {
  io::Metadata m;
  if (o.is_none()) return m;
  for (const auto& kv : o.cast<py::dict>())
    m[kv.first.cast<std::string>()] = py::str(kv.second).cast<std::string>();
  return m;
}

template <typename T>
T* ptr_of(const py::object& o) {
  return o.is_none() ? nullptr : &o.cast<T&>();
}

// A loader as a Python iterator: each next() releases the GIL while it waits for the batch.
template <typename Loader>
py::object next_of(Loader& l) {
  auto batch = [&] {
    NoGil release;
    return l.next();
  }();
  if (!batch) throw py::stop_iteration();
  return py::cast(std::move(*batch));
}

// save_checkpoint and dist.save_sharded: (where, model, optimizer=None, scheduler=None,
// metadata=None); load_checkpoint and dist.load_sharded the same without metadata, returning it.
using SaveFn = void (*)(const std::string&, const nn::Module&, const optim::Optimizer*,
                        const optim::Scheduler*, const io::Metadata&, Loc);
using LoadFn = io::Metadata (*)(const std::string&, nn::Module&, optim::Optimizer*,
                                optim::Scheduler*, Loc);

template <SaveFn Save>
void def_save(py::module_& m, const char* name, const char* where, const char* doc) {
  m.def(
      name,
      [](const std::string& path, const nn::Module& model, const py::object& optimizer,
         const py::object& scheduler, const py::object& metadata) {
        const Loc loc = user_place();
        const io::Metadata meta = metadata_of(metadata);
        const optim::Optimizer* o = ptr_of<optim::Optimizer>(optimizer);
        const optim::Scheduler* s = ptr_of<optim::Scheduler>(scheduler);
        NoGil release;
        Save(path, model, o, s, meta, loc);
      },
      py::arg(where), py::arg("model"), py::arg("optimizer") = py::none(),
      py::arg("scheduler") = py::none(), py::arg("metadata") = py::none(), doc);
}

template <LoadFn Load>
void def_load(py::module_& m, const char* name, const char* where, const char* doc) {
  m.def(
      name,
      [](const std::string& path, nn::Module& model, const py::object& optimizer,
         const py::object& scheduler) {
        const Loc loc = user_place();
        optim::Optimizer* o = ptr_of<optim::Optimizer>(optimizer);
        optim::Scheduler* s = ptr_of<optim::Scheduler>(scheduler);
        io::Metadata meta;
        {
          NoGil release;
          meta = Load(path, model, o, s, loc);
        }
        return meta;
      },
      py::arg(where), py::arg("model"), py::arg("optimizer") = py::none(),
      py::arg("scheduler") = py::none(), doc);
}

}  // namespace

void init_extras(py::module_& m) {
  using py::arg;
  const auto none = py::none();
  def_save<static_cast<SaveFn>(&save_checkpoint)>(
      m, "save_checkpoint", "path",
      "Saves the model, optimizer and scheduler state in one safetensors file, atomically.");
  def_load<static_cast<LoadFn>(&load_checkpoint)>(
      m, "load_checkpoint", "path",
      "Loads a checkpoint into the model (and optimizer, scheduler); returns its metadata.");
  m.def(
      "save_file",
      [](const py::dict& tensors, const std::string& path, const py::object& metadata) {
        io::TensorMap named;
        for (const auto& kv : tensors)
          named.emplace_back(kv.first.cast<std::string>(), kv.second.cast<Tensor>());
        const Loc loc = user_place();
        const io::Metadata meta = metadata_of(metadata);
        NoGil release;
        io::save_safetensors(path, named, meta, loc);
      },
      arg("tensors"), arg("path"), arg("metadata") = none);
  m.def("load_file", [](const std::string& path) {
    const Loc loc = user_place();
    io::Loaded loaded;
    {
      NoGil release;
      loaded = io::load_safetensors(path, default_device(), loc);
    }
    py::dict out;
    for (const auto& [name, t] : loaded.tensors) out[py::str(name)] = t;
    return out;
  });

  py::module_ dist = m.def_submodule("dist", "Data parallel training over MPI (mpirun -np N).");
  dist.def("init", [] {
    NoGil release;
    dist::init();
  });
  dist.def("is_initialized", &dist::initialized);
  dist.def("finalize", [] {
    NoGil release;
    dist::finalize();
  });
  dist.def("rank", &dist::rank);
  dist.def("world_size", &dist::world_size);
  dist.def("local_rank", &dist::local_rank);
  dist.def("barrier", [] {
    NoGil release;
    dist::barrier();
  });
  dist.def(
      "all_reduce", [](const Tensor& x, double scale) { return dist::all_reduce(x, scale); },
      arg("tensor"), arg("scale") = 1.0);
  dist.def(
      "broadcast", [](const Tensor& x, int root) { return dist::broadcast(x, root); },
      arg("tensor"), arg("src") = 0);
  // PyTorch's signature: ZeroRedundancyOptimizer(params, optimizer_class, **defaults), the local
  // optimizer made as optimizer_class(this rank's parameters, **defaults); and lockstep's
  // keywords: stage (1 or 2; 3 is fully_shard's), max_grad_norm, skip_nonfinite.
  py::class_<dist::ZeroRedundancyOptimizer, optim::Optimizer,
             std::shared_ptr<dist::ZeroRedundancyOptimizer>>(dist, "ZeroRedundancyOptimizer")
      .def(py::init([](const std::vector<Tensor>& params, const py::object& optimizer_class,
                       int stage, double max_grad_norm, bool skip_nonfinite, int64_t bucket_bytes,
                       const py::kwargs& defaults) {
             const Loc loc = user_place();
             auto make = [&](std::vector<Tensor> mine) {
               return optimizer_class(mine, **defaults).cast<std::shared_ptr<optim::Optimizer>>();
             };
             return std::make_shared<dist::ZeroRedundancyOptimizer>(
                 params, make,
                 dist::ZeroOptions{.stage = stage,
                                   .max_grad_norm = max_grad_norm,
                                   .skip_nonfinite = skip_nonfinite,
                                   .bucket_bytes = bucket_bytes},
                 loc);
           }),
           arg("params"), arg("optimizer_class"), py::kw_only(), arg("stage") = 1,
           arg("max_grad_norm") = 0.0, arg("skip_nonfinite") = false,
           arg("bucket_bytes") = dist::ZeroOptions{}.bucket_bytes)
      .def_property_readonly("stage", &dist::ZeroRedundancyOptimizer::stage)
      .def_property_readonly("last_grad_norm", &dist::ZeroRedundancyOptimizer::last_grad_norm)
      .def("owner", &dist::ZeroRedundancyOptimizer::owner, arg("index"))
      .def(
          "run",
          [](const dist::ZeroRedundancyOptimizer& z, size_t i) {
            const dist::ZeroRedundancyOptimizer::Run r = z.run(i);
            return py::make_tuple(r.offset, r.numel);
          },
          arg("index"))
      .def("local_grad_numel", &dist::ZeroRedundancyOptimizer::local_grad_numel)
      .def_property_readonly("local_optimizer", &dist::ZeroRedundancyOptimizer::local)
      .def("local_state_numel", &dist::ZeroRedundancyOptimizer::local_state_numel);
  // ZeRO-3: fully_shard(model, optimizer_class, **defaults) shards the model's parameters and
  // returns the ZeroRedundancyOptimizer (stage 3) that updates them.
  dist.def(
      "fully_shard",
      [](nn::Module& model, const py::object& optimizer_class, double max_grad_norm,
         bool skip_nonfinite, bool reshard_after_forward, int64_t bucket_bytes,
         const py::kwargs& defaults) {
        const Loc loc = user_place();
        auto make = [&](std::vector<Tensor> mine) {
          return optimizer_class(mine, **defaults).cast<std::shared_ptr<optim::Optimizer>>();
        };
        return dist::fully_shard(model, make,
                                 dist::ZeroOptions{.max_grad_norm = max_grad_norm,
                                                   .skip_nonfinite = skip_nonfinite,
                                                   .reshard_after_forward = reshard_after_forward,
                                                   .bucket_bytes = bucket_bytes},
                                 loc);
      },
      arg("model"), arg("optimizer_class"), py::kw_only(), arg("max_grad_norm") = 0.0,
      arg("skip_nonfinite") = false, arg("reshard_after_forward") = true,
      arg("bucket_bytes") = dist::ZeroOptions{}.bucket_bytes,
      "Shards the model's parameters over the ranks (ZeRO-3, FSDP2's fully_shard): each lives "
      "on its owner and is gathered where ops read it. Returns the optimizer, a "
      "ZeroRedundancyOptimizer of stage 3 over optimizer_class(this rank's parameters, "
      "**defaults).");
  def_save<&dist::save_sharded>(
      dist, "save_sharded", "dir",
      "Each rank writes its part of the training state to dir; rank 0 commits an index last.");
  def_save<&dist::save_sharded_async>(
      dist, "save_sharded_async", "dir",
      "As save_sharded, but returns once this rank's part is copied: a thread writes and commits "
      "it while training goes on (the next save or load, wait_for_save and the exit wait).");
  dist.def(
      "wait_for_save",
      [] {
        NoGil release;
        dist::wait_for_save();
      },
      "Waits for this process's asynchronous save in flight; raises what its writer raised.");
  dist.def(
      "export_safetensors",
      [](const std::string& dir, const std::string& path) {
        const Loc loc = user_place();
        NoGil release;
        return dist::export_safetensors(dir, path, loc);
      },
      arg("dir"), arg("path"),
      "Writes the model's tensors of the sharded checkpoint in dir to one safetensors file at "
      "path (PyTorch's names), one tensor in memory at a time; returns its metadata.");
  def_load<&dist::load_sharded>(
      dist, "load_sharded", "dir",
      "Loads a sharded checkpoint at any world size; returns its metadata.");
  py::class_<dist::DataParallel>(dist, "DataParallel")
      .def(py::init([](nn::Module& model) {
             const Loc loc = user_place();
             NoGil release;
             return std::make_unique<dist::DataParallel>(model, dist::DataParallelOptions{}, loc);
           }),
           arg("model"), py::keep_alive<1, 2>())
      .def("average_gradients", [](dist::DataParallel& dp) { dp.average_gradients(); })
      .def("state_hash",
           [](const dist::DataParallel& dp) {
             const Loc loc = user_place();
             NoGil release;
             return dp.state_hash(loc);
           })
      .def("check_replicas_agree", [](const dist::DataParallel& dp) {
        const Loc loc = user_place();
        NoGil release;
        dp.check_replicas_agree(loc);
      });

  py::module_ data = m.def_submodule("data", "Datasets and loaders.");
  py::class_<data::Dataset, std::shared_ptr<data::Dataset>>(data, "Dataset")
      .def("__len__", &data::Dataset::size)
      .def_property_readonly("num_classes", &data::Dataset::num_classes)
      .def_property_readonly("example_shape", &data::Dataset::example_shape)
      .def_property_readonly("name", &data::Dataset::name);
  data.def(
      "dataset",
      [](const std::string& spec, bool train, const Shape& shape, int64_t num_classes, int64_t size,
         uint64_t seed) {
        data::FakeDataOptions fake;
        fake.shape = shape;
        fake.num_classes = num_classes;
        fake.size = size;
        fake.seed = seed;
        return data::make_dataset(spec, train, fake);
      },
      arg("spec"), arg("train") = true, arg("shape") = Shape{3, 224, 224},
      arg("num_classes") = 1000, arg("size") = 1024, arg("seed") = 0,
      "A dataset by name: 'fake', 'fashion-mnist[:DIR]', 'mnist:DIR', 'cifar10:DIR'.");
  py::class_<data::Batch>(data, "Batch")
      .def_readonly("images", &data::Batch::images)
      .def_readonly("labels", &data::Batch::labels)
      .def("__iter__",
           [](const data::Batch& b) { return py::iter(py::make_tuple(b.images, b.labels)); });
  py::class_<data::DeviceLoader>(data, "DataLoader",
                                 "Batches of (images, labels) on the device, prepared by worker "
                                 "threads and uploaded ahead of the step that uses them.")
      .def(py::init([](std::shared_ptr<data::Dataset> ds, int64_t batch_size, bool shuffle,
                       uint64_t seed, bool drop_last, int num_workers, bool shard) {
             data::LoaderOptions o;
             o.batch_size = batch_size;
             o.shuffle = shuffle;
             o.seed = seed;
             o.drop_last = drop_last;
             o.num_workers = num_workers;
             if (shard) {
               o.num_replicas = dist::world_size();
               o.rank = dist::rank();
             }
             return std::make_unique<data::DeviceLoader>(data::DataLoader(std::move(ds), o));
           }),
           arg("dataset"), arg("batch_size") = 1, arg("shuffle") = false, arg("seed") = 0,
           arg("drop_last") = false, arg("num_workers") = 0, arg("shard") = true)
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__", [](data::DeviceLoader& l) { return next_of(l); })
      .def("__len__", &data::DeviceLoader::batches_per_epoch)
      .def_property("epoch", &data::DeviceLoader::epoch, &data::DeviceLoader::set_epoch);
}

}  // namespace lockstep::python
