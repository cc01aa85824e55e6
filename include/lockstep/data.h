// The data pipeline: datasets of host examples (fake data, MNIST/Fashion-MNIST IDX files, CIFAR-10
// binaries), seeded transforms, a multi-threaded batching DataLoader with a bounded prefetch queue,
// and a DeviceLoader that uploads upcoming batches to a device in the background.
// Not here: anything that records ops. Datasets, transforms and DataLoader workers only touch host
// memory; the lazy runtime is entered only by DeviceLoader's upload (ls::from_blob).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/dtype.h"
#include "lockstep/tensor.h"

namespace lockstep::data {

// ---- examples and datasets ------------------------------------------------------------------

// One example as host data: an image of `shape` (C, H, W), row-major, and its class.
struct Example {
  std::vector<float> image = {};
  Shape shape = {};
  int64_t label = 0;
};

// A random-access collection of examples. `get` is called concurrently from DataLoader workers,
// so it must be safe to call from several threads at once (the datasets here hold their data in
// memory, read-only, after construction).
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // Throws Error for an index outside [0, size()).
  virtual Example get(int64_t index) const = 0;
  // The (C, H, W) shape of every example as stored (before transforms), and the number of
  // classes (labels lie in [0, num_classes())).
  virtual Shape example_shape() const = 0;
  virtual int64_t num_classes() const = 0;
  // For messages, e.g. "fashion-mnist (test, /usr/share/datasets/fashion-mnist)".
  virtual std::string name() const = 0;
};

// The fake data of the seed's ResNet example: `fixed` gives the same all-zero image with label 0
// for every index (a fixed batch, so input costs nothing); otherwise example i has pixels uniform
// in [0, 1) and a label uniform in [0, num_classes), both determined by (seed, i) alone.
struct FakeDataOptions {
  Shape shape = {3, 224, 224};
  int64_t num_classes = 1000;
  int64_t size = 1024;
  uint64_t seed = 0;
  bool fixed = false;
};

class FakeData : public Dataset {
 public:
  explicit FakeData(FakeDataOptions options = {});
  int64_t size() const override { return options_.size; }
  Example get(int64_t index) const override;
  Shape example_shape() const override { return options_.shape; }
  int64_t num_classes() const override { return options_.num_classes; }
  std::string name() const override;

 private:
  FakeDataOptions options_;
};

// An IDX image file (magic 2051: count, rows, cols, then count*rows*cols bytes) as read.
struct IdxImages {
  int64_t count = 0, rows = 0, cols = 0;
  std::vector<uint8_t> pixels = {};
};
// Readers of one IDX file, plain or gzip-compressed (a name ending in ".gz"). A missing,
// truncated or malformed file throws Error naming the file and the byte offset (in the
// uncompressed data) where it went wrong.
IdxImages read_idx_images(const std::string& path);
std::vector<uint8_t> read_idx_labels(const std::string& path);

// MNIST or Fashion-MNIST: `dir` holds {train,t10k}-images-idx3-ubyte and
// {train,t10k}-labels-idx1-ubyte, each plain or with ".gz" (plain is preferred when both exist).
// Pixels become floats in [0, 1]; shape (1, rows, cols); labels checked to lie in [0, 10).
class MnistDataset : public Dataset {
 public:
  MnistDataset(const std::string& dir, bool train, std::string display_name = "mnist");
  // Two explicit files.
  MnistDataset(const std::string& images_path, const std::string& labels_path,
               std::string display_name);
  int64_t size() const override { return images_.count; }
  Example get(int64_t index) const override;
  Shape example_shape() const override { return {1, images_.rows, images_.cols}; }
  int64_t num_classes() const override { return 10; }
  std::string name() const override { return name_; }

 private:
  IdxImages images_;
  std::vector<uint8_t> labels_;
  std::string name_;
};

// CIFAR-10 binary version: `dir` (or `dir`/cifar-10-batches-bin) holds data_batch_1.bin ..
// data_batch_5.bin (train) or test_batch.bin (test), each plain or ".gz": records of one label
// byte and 3072 pixel bytes (1024 red, 1024 green, 1024 blue, rows of 32). Shape (3, 32, 32).
class Cifar10Dataset : public Dataset {
 public:
  Cifar10Dataset(const std::string& dir, bool train);
  // Explicit batch files, read in order.
  explicit Cifar10Dataset(const std::vector<std::string>& files);
  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }
  Example get(int64_t index) const override;
  Shape example_shape() const override { return {3, 32, 32}; }
  int64_t num_classes() const override { return 10; }
  std::string name() const override { return name_; }

 private:
  void read(const std::vector<std::string>& files);
  std::vector<uint8_t> pixels_;
  std::vector<uint8_t> labels_;
  std::string name_;
};

// A dataset by name, for command lines:
//   "fake"                   FakeData(fake) (the test split uses seed fake.seed + 1)
//   "fashion-mnist[:DIR]"    DIR defaults to /usr/share/datasets/fashion-mnist
//   "mnist:DIR"              MNIST IDX files in DIR
//   "cifar10:DIR"            CIFAR-10 binary batches in DIR
// Throws Error for an unknown name, a missing DIR argument or a directory that does not exist.
std::shared_ptr<Dataset> make_dataset(const std::string& spec, bool train,
                                      const FakeDataOptions& fake = {});

// ---- transforms -----------------------------------------------------------------------------

// A small counter-based generator (SplitMix64): the same seed gives the same numbers on every
// platform and standard library.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  // Mixes several values into one seed, e.g. Rng(Rng::mix({seed, epoch, index})).
  static uint64_t mix(std::initializer_list<uint64_t> values);
  uint64_t next();
  // Uniform in [0, 1).
  double uniform();
  // Uniform in [0, n); n > 0.
  uint64_t below(uint64_t n);

 private:
  uint64_t state_;
};

// Changes one example in place. A DataLoader gives each example an Rng seeded from
// (loader seed, epoch, dataset index), so augmentations are the same whatever the worker count
// or scheduling, and differ from epoch to epoch. Must be safe to call from several threads.
class Transform {
 public:
  virtual ~Transform() = default;
  virtual void apply(Example& example, Rng& rng) const = 0;
};
using TransformList = std::vector<std::shared_ptr<const Transform>>;

// (x - mean[c]) / std[c] per channel; mean and std hold one value per channel (or one for all).
std::shared_ptr<const Transform> normalize(std::vector<float> mean, std::vector<float> std);
// Pads each side with `padding` zeros, then takes a random size x size window.
std::shared_ptr<const Transform> random_crop(int64_t size, int64_t padding = 0);
// Mirrors left-right with probability p.
std::shared_ptr<const Transform> random_horizontal_flip(double p = 0.5);

// Applies `transforms` in order with the Rng a DataLoader would use for (seed, epoch, index).
void apply_transforms(Example& example, const TransformList& transforms, uint64_t seed,
                      int64_t epoch, int64_t index);

// ---- loading --------------------------------------------------------------------------------

struct LoaderOptions {
  int64_t batch_size = 1;
  // Order of each epoch: a permutation determined by (seed, epoch) when shuffling.
  bool shuffle = false;
  uint64_t seed = 0;
  // Drop a last batch smaller than batch_size.
  bool drop_last = false;
  // Threads making batches; 0 makes them on the caller's thread inside next().
  int num_workers = 0;
  // Most batches made ahead of the consumer (in the queue or being made); at least 1.
  int queue_capacity = 4;
  TransformList transforms = {};
  // Data parallel (PyTorch's DistributedSampler): this rank's shard of every epoch's order. The
  // order (the same on every rank: use the same seed) is padded by repeating its start to a
  // multiple of num_replicas, or cut to one with shard_drop_last; rank r takes every
  // num_replicas-th example from position r. Batches are then made from the shard.
  int64_t num_replicas = 1;  // ls::dist::world_size()
  int64_t rank = 0;          // ls::dist::rank()
  bool shard_drop_last = false;
};

// A batch as host data: images [B, C, H, W] contiguous, labels [B].
struct HostBatch {
  std::vector<float> images = {};
  Shape images_shape = {};
  std::vector<int64_t> labels = {};
  int64_t epoch = 0;
  int64_t index = 0;  // position of the batch in its epoch
  int64_t size() const { return static_cast<int64_t>(labels.size()); }
};

namespace detail {
// Range-for over the rest of a loader's current epoch.
template <typename Loader, typename Item>
class EpochIterator {
 public:
  using iterator_category = std::input_iterator_tag;
  using value_type = Item;
  using difference_type = std::ptrdiff_t;
  using pointer = Item*;
  using reference = Item&;
  struct Sentinel {};

  explicit EpochIterator(Loader* loader) : loader_(loader), item_(loader->next()) {}
  Item& operator*() { return *item_; }
  Item* operator->() { return &*item_; }
  EpochIterator& operator++() {
    item_.reset();  // frees the batch before making room for the next one
    item_ = loader_->next();
    return *this;
  }
  void operator++(int) { ++*this; }
  friend bool operator==(const EpochIterator& it, Sentinel) { return !it.item_.has_value(); }

 private:
  Loader* loader_;
  std::optional<Item> item_;
};
}  // namespace detail

// Batches of a dataset, made by `num_workers` threads into a bounded queue and returned in order.
//
// Epochs: next() returns the batches of the current epoch, then std::nullopt once, after which
// the loader is at the start of the next epoch. Range-for covers the rest of the current epoch:
// `for (HostBatch& b : loader)` twice is two epochs.
//
// Errors: an exception thrown while making batch k (a read error, a bad transform) is rethrown,
// unchanged, by the next() that would have returned batch k (so errors surface at the same point
// whatever the scheduling); the loader stays usable and the following next() returns batch k+1.
//
// Destroying the loader (or set_epoch) mid-epoch stops and joins its workers; a worker finishes at
// most the example it is reading.
//
// Threads: a loader may be shared by several threads. Their next() calls take turns, and each
// batch goes to exactly one of them; an epoch ends once for all: the thread that meets its end
// gets std::nullopt, and every other thread that took batches of that epoch gets std::nullopt at
// its next call (so several threads' range-for loops over one loader cover one epoch between
// them, not one each). set_epoch and epoch() may be called from any thread and never wait for a
// batch: while another thread is inside next(), set_epoch takes effect when the current epoch
// ends (its remaining batches are still delivered); otherwise it abandons the current epoch at
// once, and a thread that was drawing from it gets std::nullopt. Destroying a loader while
// another thread uses it is the caller's bug.
class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, LoaderOptions options);
  ~DataLoader();
  DataLoader(DataLoader&&) noexcept;
  DataLoader& operator=(DataLoader&&) noexcept;
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  std::optional<HostBatch> next();
  // The epoch next() draws from (0-based).
  int64_t epoch() const;
  // Abandons the current epoch and starts `epoch` at its first batch (e.g. when resuming).
  void set_epoch(int64_t epoch);
  int64_t batches_per_epoch() const;
  const Dataset& dataset() const;
  const LoaderOptions& options() const;

  using iterator = detail::EpochIterator<DataLoader, HostBatch>;
  iterator begin() { return iterator(this); }
  iterator::Sentinel end() { return {}; }

  struct Impl;

 private:
  friend class DeviceLoader;
  // Makes a next() blocked in another thread return std::nullopt soon (used on shutdown).
  void interrupt();
  std::unique_ptr<Impl> impl_;
};

// One batch on a device: images f32 [B, C, H, W], labels i64 [B], both materialized.
struct Batch {
  Tensor images = {};
  Tensor labels = {};
};

struct DeviceLoaderOptions {
  // Unset: default_device() at construction.
  std::optional<Device> device = std::nullopt;
  // Most uploaded batches waiting for the consumer; at least 1.
  int prefetch = 2;
};

// The seed's ParallelLoader: wraps a DataLoader and, in a background thread, uploads upcoming
// batches to the device (ls::from_blob) so that input never stalls a step. Same epoch, order and
// error rules as DataLoader, and the same rules for threads sharing it (each batch to one thread,
// one end of epoch for all, set_epoch from another thread at the end of the current epoch); the
// upload thread starts at the first next() of an epoch and stops at its end, so nothing of an
// epoch is uploaded before it is asked for.
//
//   for (auto& [images, labels] : device_loader) ls::step([&] { ... });   // one epoch
class DeviceLoader {
 public:
  explicit DeviceLoader(DataLoader loader, DeviceLoaderOptions options = {});
  ~DeviceLoader();
  DeviceLoader(const DeviceLoader&) = delete;
  DeviceLoader& operator=(const DeviceLoader&) = delete;

  std::optional<Batch> next();
  int64_t epoch() const;
  void set_epoch(int64_t epoch);
  int64_t batches_per_epoch() const;
  Device device() const;
  const Dataset& dataset() const;

  using iterator = detail::EpochIterator<DeviceLoader, Batch>;
  iterator begin() { return iterator(this); }
  iterator::Sentinel end() { return {}; }

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace lockstep::data
