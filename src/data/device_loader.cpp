// DeviceLoader: a background thread that takes batches from a DataLoader and uploads them to a
// device (ls::from_blob) ahead of the consumer. Not batch making (loader.cpp).
//
// Threads: the upload thread ("pump") runs one epoch: it alone calls the DataLoader's next()
// while it runs, and ends after queueing the epoch's end. The consumer starts it at the first
// next() of an epoch and joins it at that end (or on set_epoch / destruction, after setting
// `stop` and interrupting the DataLoader). The queue and flags are guarded by `mu`. Consumers
// (next(), and set_epoch when no next() runs) hold `consumer_mu`, so several threads take turns
// and only one of them ever starts or joins the upload thread.
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

#include "data/epoch_readers.h"
#include "lockstep/data.h"
#include "lockstep/ops.h"
#include "runtime/profiler.h"
#include "util/check.h"

namespace lockstep::data {

using util::cat;

namespace {
// One entry of the queue: a batch, the error making or uploading it, or the end of the epoch.
struct Item {
  std::optional<Batch> batch;
  std::exception_ptr error;
  bool end = false;
};
}  // namespace

struct DeviceLoader::Impl {
  DataLoader loader;
  Device device;
  size_t prefetch = 2;

  // Consumer-owned.
  std::mutex consumer_mu;
  detail::EpochReaders readers;
  std::atomic<int64_t> epoch{0};  // also read by epoch() from any thread
  std::thread pump;

  std::mutex mu;
  std::condition_variable items_cv;  // the consumer waits for an item (or a fatal error)
  std::condition_variable room_cv;   // the pump waits for room in the queue (or stop)
  std::deque<Item> queue;
  bool stop = false;
  std::exception_ptr fatal;              // the pump failed outside any batch
  std::optional<int64_t> pending_epoch;  // set_epoch while a next() ran: the epoch after this one

  Impl(DataLoader l, Device d, size_t p) : loader(std::move(l)), device(d), prefetch(p) {}
  ~Impl() { stop_pump(); }

  Item fetch() {
    Item item;
    try {
      std::optional<HostBatch> hb = loader.next();
      if (!hb) {
        item.end = true;
        return item;
      }
      Batch b;
      b.images = from_blob(hb->images.data(), hb->images_shape, DType::F32, device);
      b.labels = from_blob(hb->labels.data(), {hb->size()}, DType::I64, device);
      item.batch = std::move(b);
    } catch (...) {
      item.error = std::current_exception();
    }
    return item;
  }

  void run_pump() {
    runtime::prof::name_thread("lockstep upload");
    try {
      for (;;) {
        Item item = fetch();
        const bool end = item.end;
        {
          std::unique_lock<std::mutex> lock(mu);
          // A DataLoader interrupted by stop_pump() also answers "no batch"; that is no end.
          room_cv.wait(lock, [&] { return stop || queue.size() < prefetch; });
          if (stop) return;
          queue.push_back(std::move(item));
        }
        items_cv.notify_all();
        if (end) return;
      }
    } catch (...) {  // never std::terminate: hand anything unexpected to the consumer
      {
        std::lock_guard<std::mutex> lock(mu);
        fatal = std::current_exception();
      }
      items_cv.notify_all();
    }
  }

  // Stops and joins the upload thread and drops what it uploaded. The DataLoader is left
  // interrupted (set_epoch clears that).
  void stop_pump() {
    if (!pump.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    room_cv.notify_all();
    loader.interrupt();
    pump.join();
    std::lock_guard<std::mutex> lock(mu);
    queue.clear();
    fatal = nullptr;
    stop = false;
  }

  // The epoch is over: the next one is the one a set_epoch() during it asked for, or the
  // following one (where the DataLoader already is).
  void end_epoch() {
    readers.end_epoch();
    std::optional<int64_t> pending;
    {
      std::lock_guard<std::mutex> lock(mu);
      pending.swap(pending_epoch);
    }
    if (pending) loader.set_epoch(*pending);
    epoch = pending ? *pending : epoch + 1;
  }

  std::optional<Batch> next() {
    std::lock_guard<std::mutex> consumer(consumer_mu);
    if (readers.take_end()) return std::nullopt;  // another thread ended this one's epoch
    if (!pump.joinable()) {
      try {
        pump = std::thread([this] { run_pump(); });
      } catch (const std::system_error& e) {
        throw Error(cat("DeviceLoader: cannot start the upload thread: ", e.what()));
      }
    }
    readers.drew();
    Item item;
    {
      std::unique_lock<std::mutex> lock(mu);
      runtime::prof::Span waiting("data", "next batch");
      items_cv.wait(lock, [&] { return !queue.empty() || fatal; });
      if (queue.empty()) {
        std::exception_ptr error = fatal;
        lock.unlock();
        // The epoch cannot go on: drop it, as DataLoader does after a fatal worker error.
        stop_pump();
        loader.set_epoch(epoch + 1);
        end_epoch();
        std::rethrow_exception(error);
      }
      item = std::move(queue.front());
      queue.pop_front();
    }
    room_cv.notify_all();
    if (item.end) {
      pump.join();
      end_epoch();
      return std::nullopt;
    }
    if (item.error) std::rethrow_exception(item.error);
    return std::move(item.batch);
  }
};

DeviceLoader::DeviceLoader(DataLoader loader, DeviceLoaderOptions options) {
  if (options.prefetch < 1)
    throw Error(cat("DeviceLoader: prefetch is ", options.prefetch, "; it must be at least 1"));
  const Device device = options.device ? *options.device : default_device();
  const int64_t epoch = loader.epoch();
  impl_ = std::make_unique<Impl>(std::move(loader), device, static_cast<size_t>(options.prefetch));
  impl_->epoch = epoch;
}

DeviceLoader::~DeviceLoader() = default;

std::optional<Batch> DeviceLoader::next() { return impl_->next(); }
int64_t DeviceLoader::epoch() const { return impl_->epoch; }
int64_t DeviceLoader::batches_per_epoch() const { return impl_->loader.batches_per_epoch(); }
Device DeviceLoader::device() const { return impl_->device; }
const Dataset& DeviceLoader::dataset() const { return impl_->loader.dataset(); }

void DeviceLoader::set_epoch(int64_t epoch) {
  if (epoch < 0) throw Error(cat("DeviceLoader::set_epoch: epoch ", epoch, " is negative"));
  Impl& s = *impl_;
  std::unique_lock<std::mutex> consumer(s.consumer_mu, std::try_to_lock);
  if (!consumer.owns_lock()) {  // another thread is inside next(): at the end of its epoch
    std::lock_guard<std::mutex> lock(s.mu);
    s.pending_epoch = epoch;
    return;
  }
  s.stop_pump();
  s.loader.set_epoch(epoch);
  s.readers.end_epoch();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.pending_epoch.reset();
  }
  s.epoch = epoch;
}

}  // namespace lockstep::data
