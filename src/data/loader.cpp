// DataLoader: batches of host examples made by worker threads into a bounded queue and returned
// in order, with seeded shuffling and error propagation. Not the device upload (device_loader.cpp).
//
// Threads: the consumer (whoever calls next(), holding `consumer_mu`) owns the epoch: it writes
// `epoch` and `order` and starts/joins the workers; workers only read those while they run.
// Everything else the two sides share is guarded by `mu`; `cancel` mirrors `stop` for a lock-free
// check between examples. Several consumer threads take turns on `consumer_mu`; set_epoch never
// waits for it (see set_epoch).
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <numeric>
#include <system_error>
#include <thread>
#include <utility>

#include "data/epoch_readers.h"
#include "lockstep/data.h"
#include "runtime/profiler.h"
#include "util/check.h"

namespace lockstep::data {

using util::cat;

namespace {
constexpr uint64_t kShuffleTag = 0x53485546464c4521ull;  // "SHUFFLE!"

// Thrown inside make_batch when the epoch is abandoned; caught by the worker or next().
struct Cancelled {};

// A made batch, or the error making it raised.
struct Slot {
  std::optional<HostBatch> batch;
  std::exception_ptr error;
};
}  // namespace

struct DataLoader::Impl {
  std::shared_ptr<const Dataset> dataset;
  LoaderOptions options;
  int64_t size = 0;          // examples an epoch reads (this rank's shard)
  int64_t dataset_size = 0;  // examples the epoch's order is a permutation of
  int64_t num_classes = 0;
  int64_t num_batches = 0;

  // Consumer-owned (see the top of this file).
  std::mutex consumer_mu;
  detail::EpochReaders readers;
  std::atomic<int64_t> epoch{0};  // also read by epoch() from any thread
  bool started = false;
  std::vector<int64_t> order;
  std::vector<std::thread> workers;

  std::mutex mu;
  std::condition_variable work_cv;       // workers wait for room ahead of the consumer, or stop
  std::condition_variable ready_cv;      // the consumer waits for its batch, interrupt or fatal
  int64_t next_claim = 0;                // first batch no worker has taken
  int64_t consumed = 0;                  // batches returned by next() this epoch
  std::map<int64_t, Slot> ready;         // made batches not yet returned
  bool stop = true;                      // workers must exit (true while no epoch runs)
  bool interrupted = false;              // next() returns nullopt until set_epoch()
  std::exception_ptr fatal;              // a worker failed outside any batch
  std::optional<int64_t> pending_epoch;  // set_epoch while a next() ran: the epoch after this one
  std::atomic<bool> cancel{true};

  ~Impl() { stop_epoch(); }

  void start_epoch() {
    order.resize(static_cast<size_t>(dataset_size));
    std::iota(order.begin(), order.end(), int64_t{0});
    if (options.shuffle) {
      Rng rng(Rng::mix({options.seed, kShuffleTag, static_cast<uint64_t>(epoch)}));
      for (size_t i = order.size(); i > 1; --i)
        std::swap(order[i - 1], order[static_cast<size_t>(rng.below(i))]);
    }
    if (options.num_replicas > 1 && dataset_size > 0) {
      const int64_t r = options.num_replicas;
      std::vector<int64_t> shard;
      shard.reserve(static_cast<size_t>(size));
      for (int64_t i = options.rank; static_cast<int64_t>(shard.size()) < size; i += r)
        shard.push_back(order[static_cast<size_t>(i % dataset_size)]);  // padded from the start
      order = std::move(shard);
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      next_claim = 0;
      consumed = 0;
      ready.clear();
      fatal = nullptr;
      stop = interrupted;
      cancel = interrupted;
    }
    started = true;
    const int64_t n = std::min<int64_t>(options.num_workers, num_batches);
    try {
      for (int64_t i = 0; i < n; ++i) workers.emplace_back([this] { worker(); });
    } catch (const std::system_error& e) {  // out of threads: the started ones are joined
      stop_epoch();
      throw Error(cat("DataLoader: cannot start worker thread ", workers.size() + 1, " of ", n,
                      ": ", e.what(), "; use fewer num_workers"));
    } catch (...) {
      stop_epoch();
      throw;
    }
  }

  // Stops and joins the workers; made batches are dropped. Safe to call when none run.
  void stop_epoch() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
      cancel = true;
    }
    work_cv.notify_all();
    ready_cv.notify_all();
    for (std::thread& t : workers) t.join();
    workers.clear();
    std::lock_guard<std::mutex> lock(mu);
    ready.clear();
    started = false;
  }

  void interrupt() {
    {
      std::lock_guard<std::mutex> lock(mu);
      interrupted = true;
      stop = true;
      cancel = true;
    }
    work_cv.notify_all();
    ready_cv.notify_all();
  }

  void worker() {
    runtime::prof::name_thread("lockstep loader");
    try {
      for (;;) {
        int64_t k = 0;
        {
          std::unique_lock<std::mutex> lock(mu);
          work_cv.wait(lock, [&] {
            return stop || next_claim >= num_batches ||
                   next_claim < consumed + options.queue_capacity;
          });
          if (stop || next_claim >= num_batches) return;
          k = next_claim++;
        }
        Slot slot;
        try {
          runtime::prof::Span span("data", "load batch");
          slot.batch = make_batch(k);
        } catch (const Cancelled&) {
          return;
        } catch (...) {
          slot.error = std::current_exception();
        }
        {
          std::lock_guard<std::mutex> lock(mu);
          if (stop) return;
          ready.emplace(k, std::move(slot));
        }
        ready_cv.notify_all();
      }
    } catch (...) {  // never std::terminate: hand anything unexpected to the consumer
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!fatal) fatal = std::current_exception();
      }
      ready_cv.notify_all();
    }
  }

  HostBatch make_batch(int64_t k) const {
    const int64_t begin = k * options.batch_size;
    const int64_t end = std::min(begin + options.batch_size, size);
    const int64_t epoch = this->epoch.load(std::memory_order_relaxed);
    HostBatch b;
    b.epoch = epoch;
    b.index = k;
    b.labels.reserve(static_cast<size_t>(end - begin));
    Shape shape;
    int64_t first = 0;
    for (int64_t i = begin; i < end; ++i) {
      if (cancel.load(std::memory_order_relaxed)) throw Cancelled{};
      const int64_t idx = order[static_cast<size_t>(i)];
      Example ex = dataset->get(idx);
      apply_transforms(ex, options.transforms, options.seed, epoch, idx);
      const int64_t numel = shape_numel(ex.shape);
      if (static_cast<int64_t>(ex.image.size()) != numel)
        throw Error(cat("DataLoader: ", dataset->name(), ": example ", idx, " holds ",
                        ex.image.size(), " values but its shape ", shape_str(ex.shape), " needs ",
                        numel));
      if (ex.label < 0 || ex.label >= num_classes)
        throw Error(cat("DataLoader: ", dataset->name(), ": example ", idx, " has label ", ex.label,
                        ", outside [0, ", num_classes, ")"));
      if (i == begin) {
        shape = ex.shape;
        first = idx;
        b.images.reserve(static_cast<size_t>(numel * (end - begin)));
      } else if (ex.shape != shape) {
        throw Error(cat("DataLoader: ", dataset->name(), ": example ", idx, " has shape ",
                        shape_str(ex.shape), " but example ", first, " in the same batch has ",
                        shape_str(shape),
                        "; batched examples need one shape (add a transform such as random_crop)"));
      }
      b.images.insert(b.images.end(), ex.image.begin(), ex.image.end());
      b.labels.push_back(ex.label);
    }
    b.images_shape = {end - begin};
    b.images_shape.insert(b.images_shape.end(), shape.begin(), shape.end());
    return b;
  }

  // The current epoch is over (its end reached, or a fatal error): the next one starts at the
  // next next(), as the epoch a set_epoch() during this one asked for, or the following one.
  void end_epoch() {
    stop_epoch();
    readers.end_epoch();
    std::lock_guard<std::mutex> lock(mu);
    epoch = pending_epoch ? *pending_epoch : epoch + 1;
    pending_epoch.reset();
  }

  std::optional<HostBatch> next() {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (interrupted) return std::nullopt;
    }
    std::lock_guard<std::mutex> consumer(consumer_mu);
    if (readers.take_end()) return std::nullopt;  // another thread ended this one's epoch
    if (!started) start_epoch();
    std::unique_lock<std::mutex> lock(mu);
    const int64_t k = consumed;
    if (k >= num_batches) {
      lock.unlock();
      end_epoch();
      return std::nullopt;
    }
    readers.drew();
    if (options.num_workers == 0) {
      consumed = k + 1;
      lock.unlock();
      try {
        return make_batch(k);
      } catch (const Cancelled&) {
        return std::nullopt;
      }
    }
    runtime::prof::Span waiting("data", "next batch");
    ready_cv.wait(lock, [&] { return interrupted || fatal || ready.count(k) > 0; });
    if (auto it = ready.find(k); it != ready.end()) {
      Slot slot = std::move(it->second);
      ready.erase(it);
      consumed = k + 1;
      lock.unlock();
      work_cv.notify_all();
      if (slot.error) std::rethrow_exception(slot.error);
      return std::move(slot.batch);
    }
    if (interrupted) return std::nullopt;
    // A worker failed outside any batch (e.g. out of memory queueing one): the epoch ends here.
    std::exception_ptr error = fatal;
    lock.unlock();
    end_epoch();
    std::rethrow_exception(error);
  }
};

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, LoaderOptions options)
    : impl_(std::make_unique<Impl>()) {
  if (!dataset) throw Error("DataLoader: the dataset is null");
  if (options.batch_size < 1)
    throw Error(cat("DataLoader: batch_size is ", options.batch_size, "; it must be at least 1"));
  if (options.num_workers < 0)
    throw Error(cat("DataLoader: num_workers is ", options.num_workers,
                    "; use 0 (batches made in next()) or more"));
  if (options.queue_capacity < 1)
    throw Error(
        cat("DataLoader: queue_capacity is ", options.queue_capacity, "; it must be at least 1"));
  for (const auto& t : options.transforms)
    if (!t) throw Error("DataLoader: a transform is null");
  Impl& s = *impl_;
  if (options.num_replicas < 1 || options.rank < 0 || options.rank >= options.num_replicas)
    throw Error(cat("DataLoader: rank ", options.rank, " of ", options.num_replicas,
                    " replicas; num_replicas must be at least 1 and rank in [0, num_replicas) "
                    "(ls::dist::world_size() and ls::dist::rank())"));
  s.dataset_size = dataset->size();
  s.num_classes = dataset->num_classes();
  if (s.dataset_size < 0) throw Error(cat("DataLoader: ", dataset->name(), " has negative size"));
  {
    const int64_t n = s.dataset_size, r = options.num_replicas;
    s.size = r == 1 ? n : (options.shard_drop_last ? n / r : (n + r - 1) / r);
  }
  s.num_batches = options.drop_last ? s.size / options.batch_size
                                    : (s.size + options.batch_size - 1) / options.batch_size;
  s.dataset = std::move(dataset);
  s.options = std::move(options);
}

DataLoader::~DataLoader() = default;
DataLoader::DataLoader(DataLoader&&) noexcept = default;
DataLoader& DataLoader::operator=(DataLoader&&) noexcept = default;

std::optional<HostBatch> DataLoader::next() { return impl_->next(); }
int64_t DataLoader::epoch() const { return impl_->epoch; }
int64_t DataLoader::batches_per_epoch() const { return impl_->num_batches; }
const Dataset& DataLoader::dataset() const { return *impl_->dataset; }
const LoaderOptions& DataLoader::options() const { return impl_->options; }
void DataLoader::interrupt() { impl_->interrupt(); }

void DataLoader::set_epoch(int64_t epoch) {
  if (epoch < 0) throw Error(cat("DataLoader::set_epoch: epoch ", epoch, " is negative"));
  Impl& s = *impl_;
  std::unique_lock<std::mutex> consumer(s.consumer_mu, std::try_to_lock);
  if (!consumer.owns_lock()) {  // another thread is inside next(): at the end of its epoch
    std::lock_guard<std::mutex> lock(s.mu);
    s.pending_epoch = epoch;
    return;
  }
  s.stop_epoch();
  s.readers.end_epoch();
  std::lock_guard<std::mutex> lock(s.mu);
  s.interrupted = false;
  s.pending_epoch.reset();
  s.epoch = epoch;
}

}  // namespace lockstep::data
