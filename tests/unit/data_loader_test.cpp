// Tests of transforms, DataLoader (order, shuffling, drop_last, workers, errors, shutdown) and
// DeviceLoader (uploaded tensors, errors, shutdown), both shared by threads. Not for file readers
// (data_test.cpp).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <lockstep/lockstep.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>
#include <vector>

namespace ls = lockstep;
namespace lsd = lockstep::data;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

namespace {

// Example i is the single value i (shape 1x1x1), label i % 10. Optionally throws at one index
// and sleeps per example (to shuffle worker finishing order).
class RangeDataset : public lsd::Dataset {
 public:
  explicit RangeDataset(int64_t n, int64_t throw_at = -1, bool jitter = false)
      : n_(n), throw_at_(throw_at), jitter_(jitter) {}
  int64_t size() const override { return n_; }
  lsd::Example get(int64_t i) const override {
    gets_.fetch_add(1);
    if (jitter_) std::this_thread::sleep_for(std::chrono::microseconds((i * 7919) % 3000));
    if (i == throw_at_) throw ls::Error("range: read error at example " + std::to_string(i));
    return {{static_cast<float>(i)}, {1, 1, 1}, i % 10};
  }
  ls::Shape example_shape() const override { return {1, 1, 1}; }
  int64_t num_classes() const override { return 10; }
  std::string name() const override { return "range"; }
  int64_t gets() const { return gets_.load(); }

 private:
  int64_t n_, throw_at_;
  bool jitter_;
  mutable std::atomic<int64_t> gets_{0};
};

// A dataset whose reads take a while, to catch a loader mid-epoch.
class SlowDataset : public RangeDataset {
 public:
  using RangeDataset::RangeDataset;
  lsd::Example get(int64_t i) const override {
    std::this_thread::sleep_for(2ms);
    return RangeDataset::get(i);
  }
};

// The example indices of every batch of one epoch.
std::vector<std::vector<int64_t>> epoch_of(lsd::DataLoader& loader) {
  std::vector<std::vector<int64_t>> out;
  while (auto b = loader.next()) {
    std::vector<int64_t> ids;
    for (float v : b->images) ids.push_back(static_cast<int64_t>(v));
    EXPECT_EQ(b->index, static_cast<int64_t>(out.size()));
    out.push_back(ids);
  }
  return out;
}

std::vector<int64_t> flat(const std::vector<std::vector<int64_t>>& batches) {
  std::vector<int64_t> out;
  for (const auto& b : batches) out.insert(out.end(), b.begin(), b.end());
  return out;
}

// Runs fn on another thread; fails (instead of hanging) if it does not finish within `limit`.
void within(std::chrono::milliseconds limit, std::function<void()> fn) {
  std::packaged_task<void()> task(std::move(fn));
  std::future<void> done = task.get_future();
  std::thread t(std::move(task));
  if (done.wait_for(limit) != std::future_status::ready) {
    t.detach();  // only on failure: the hung thread is abandoned so the test run can go on
    FAIL() << "did not finish within " << limit.count() << " ms (a hang)";
  }
  t.join();
  done.get();
}

std::shared_ptr<RangeDataset> range(int64_t n, int64_t throw_at = -1, bool jitter = false) {
  return std::make_shared<RangeDataset>(n, throw_at, jitter);
}

}  // namespace

// ---- transforms ------------------------------------------------------------------------------

TEST(DataTransforms, Normalize) {
  lsd::Example ex{{1, 2, 3, 4, 5, 6, 7, 8}, {2, 2, 2}, 0};
  lsd::Rng rng(0);
  lsd::normalize({1, 5}, {2, 0.5})->apply(ex, rng);
  EXPECT_EQ(ex.image, (std::vector<float>{0, 0.5, 1, 1.5, 0, 2, 4, 6}));
  lsd::Example one{{2, 4}, {2, 1, 1}, 0};
  lsd::normalize({1}, {2})->apply(one, rng);  // one value for every channel
  EXPECT_EQ(one.image, (std::vector<float>{0.5, 1.5}));
  lsd::Example three{{0, 0, 0}, {3, 1, 1}, 0};
  try {
    lsd::normalize({1, 2}, {1, 1})->apply(three, rng);
    ADD_FAILURE() << "no error";
  } catch (const ls::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("2 means for an example with 3 channels"));
  }
  EXPECT_THROW(lsd::normalize({0}, {0}), ls::Error);
}

TEST(DataTransforms, RandomCropIsAShiftedZeroPaddedWindow) {
  // 1 channel 3x3 image 1..9, crop 3 with padding 1: the window is the image shifted by
  // (dy, dx) in [-1, 1]^2, zeros outside.
  std::set<std::pair<int, int>> shifts;
  for (int64_t index = 0; index < 200; ++index) {
    lsd::Example ex{{1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 3, 3}, 0};
    lsd::apply_transforms(ex, {lsd::random_crop(3, 1)}, 5, 0, index);
    ASSERT_EQ(ex.shape, (ls::Shape{1, 3, 3}));
    bool matched = false;
    for (int dy = -1; dy <= 1 && !matched; ++dy)
      for (int dx = -1; dx <= 1 && !matched; ++dx) {
        std::vector<float> want(9, 0);
        for (int y = 0; y < 3; ++y)
          for (int x = 0; x < 3; ++x) {
            const int sy = y + dy, sx = x + dx;
            if (sy >= 0 && sy < 3 && sx >= 0 && sx < 3) want[y * 3 + x] = sy * 3 + sx + 1.0f;
          }
        if (want == ex.image) {
          matched = true;
          shifts.insert({dy, dx});
        }
      }
    EXPECT_TRUE(matched) << "index " << index;
  }
  EXPECT_EQ(shifts.size(), 9u);  // every offset occurs

  lsd::Example big{std::vector<float>(2 * 4 * 5, 1.0f), {2, 4, 5}, 0};
  lsd::apply_transforms(big, {lsd::random_crop(2)}, 0, 0, 0);
  EXPECT_EQ(big.shape, (ls::Shape{2, 2, 2}));
  EXPECT_EQ(big.image, std::vector<float>(8, 1.0f));  // no padding: never zeros
  lsd::Example small{std::vector<float>(4, 1.0f), {1, 2, 2}, 0};
  EXPECT_THROW(lsd::apply_transforms(small, {lsd::random_crop(5, 1)}, 0, 0, 0), ls::Error);
  EXPECT_THROW(lsd::random_crop(0), ls::Error);
}

TEST(DataTransforms, HorizontalFlip) {
  lsd::Example ex{{1, 2, 3, 4, 5, 6}, {1, 2, 3}, 0};
  lsd::Rng rng(1);
  lsd::random_horizontal_flip(1.0)->apply(ex, rng);
  EXPECT_EQ(ex.image, (std::vector<float>{3, 2, 1, 6, 5, 4}));
  lsd::random_horizontal_flip(0.0)->apply(ex, rng);
  EXPECT_EQ(ex.image, (std::vector<float>{3, 2, 1, 6, 5, 4}));
  int flipped = 0;
  for (int64_t i = 0; i < 1000; ++i) {
    lsd::Example e{{1, 2}, {1, 1, 2}, 0};
    lsd::apply_transforms(e, {lsd::random_horizontal_flip(0.5)}, 3, 0, i);
    flipped += e.image[0] == 2;
  }
  EXPECT_GT(flipped, 400);
  EXPECT_LT(flipped, 600);
  EXPECT_THROW(lsd::random_horizontal_flip(1.5), ls::Error);
}

TEST(DataTransforms, DeterministicPerSeedEpochIndex) {
  const lsd::TransformList t = {lsd::random_crop(4, 2), lsd::random_horizontal_flip()};
  lsd::FakeData fake({.shape = {3, 4, 4}, .num_classes = 2, .size = 8});
  auto run = [&](uint64_t seed, int64_t epoch, int64_t index) {
    lsd::Example ex = fake.get(index);
    lsd::apply_transforms(ex, t, seed, epoch, index);
    return ex.image;
  };
  EXPECT_EQ(run(1, 2, 3), run(1, 2, 3));
  int differ_epoch = 0, differ_seed = 0;
  for (int64_t i = 0; i < 8; ++i) {
    differ_epoch += run(1, 0, i) != run(1, 1, i);
    differ_seed += run(1, 0, i) != run(2, 0, i);
  }
  EXPECT_GT(differ_epoch, 0);
  EXPECT_GT(differ_seed, 0);
}

// ---- DataLoader ------------------------------------------------------------------------------

TEST(DataLoader, SequentialBatchesAndEpochs) {
  auto ds = range(10);
  lsd::DataLoader loader(ds, {.batch_size = 4});
  EXPECT_EQ(loader.batches_per_epoch(), 3);
  EXPECT_EQ(loader.epoch(), 0);
  auto b0 = loader.next();
  ASSERT_TRUE(b0);
  EXPECT_EQ(b0->images_shape, (ls::Shape{4, 1, 1, 1}));
  EXPECT_EQ(b0->images, (std::vector<float>{0, 1, 2, 3}));
  EXPECT_EQ(b0->labels, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(b0->epoch, 0);
  auto b1 = loader.next();
  auto b2 = loader.next();
  ASSERT_TRUE(b2);
  EXPECT_EQ(b2->images_shape, (ls::Shape{2, 1, 1, 1}));
  EXPECT_EQ(b2->labels, (std::vector<int64_t>{8, 9}));
  EXPECT_FALSE(loader.next());
  EXPECT_EQ(loader.epoch(), 1);
  auto again = loader.next();
  ASSERT_TRUE(again);
  EXPECT_EQ(again->epoch, 1);
  EXPECT_EQ(again->images, b0->images);
}

TEST(DataLoader, DropLast) {
  lsd::DataLoader keep(range(10), {.batch_size = 4});
  lsd::DataLoader drop(range(10), {.batch_size = 4, .drop_last = true});
  EXPECT_EQ(epoch_of(keep).size(), 3u);
  auto batches = epoch_of(drop);
  EXPECT_EQ(drop.batches_per_epoch(), 2);
  ASSERT_EQ(batches.size(), 2u);
  for (const auto& b : batches) EXPECT_EQ(b.size(), 4u);
  lsd::DataLoader too_small(range(3), {.batch_size = 4, .drop_last = true, .num_workers = 2});
  EXPECT_TRUE(epoch_of(too_small).empty());
  lsd::DataLoader empty(range(0), {.batch_size = 4, .num_workers = 2});
  EXPECT_TRUE(epoch_of(empty).empty());
}

TEST(DataLoader, ShuffleIsDeterministicAndCoversEveryExampleOnce) {
  const lsd::LoaderOptions opts{.batch_size = 7, .shuffle = true, .seed = 42};
  lsd::DataLoader a(range(100), opts), b(range(100), opts);
  lsd::LoaderOptions other = opts;
  other.seed = 43;
  lsd::DataLoader c(range(100), other);
  std::vector<int64_t> all(100);
  std::iota(all.begin(), all.end(), int64_t{0});
  std::vector<int64_t> prev;
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::vector<int64_t> ea = flat(epoch_of(a)), eb = flat(epoch_of(b)), ec = flat(epoch_of(c));
    EXPECT_EQ(ea, eb) << "same seed, epoch " << epoch;
    EXPECT_NE(ea, ec) << "other seed, epoch " << epoch;
    EXPECT_NE(ea, all) << "shuffled";
    EXPECT_NE(ea, prev) << "reshuffled each epoch";
    std::vector<int64_t> sorted = ea;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, all) << "each example once";
    prev = ea;
  }
  // set_epoch gives the same order as reaching that epoch by iterating.
  lsd::DataLoader d(range(100), opts);
  d.set_epoch(2);
  EXPECT_EQ(flat(epoch_of(d)), prev);
}

// DistributedSampler's semantics: the epoch's order (one permutation for every rank) padded by
// repeating its start to a multiple of the replicas (10 examples, 4 replicas: 12 positions),
// or cut to one (8), rank r taking positions r, r + 4, ...
TEST(DataLoader, ShardsOfEveryEpochForDataParallelRanks) {
  const lsd::LoaderOptions whole{.batch_size = 2, .shuffle = true, .seed = 5};
  for (bool drop : {false, true}) {
    lsd::DataLoader one(range(10), whole);
    std::vector<lsd::DataLoader> ranks;
    for (int64_t r = 0; r < 4; ++r) {
      lsd::LoaderOptions o = whole;
      o.num_replicas = 4;
      o.rank = r;
      o.shard_drop_last = drop;
      ranks.emplace_back(range(10), o);
    }
    for (int epoch = 0; epoch < 2; ++epoch) {
      std::vector<int64_t> order = flat(epoch_of(one));
      std::vector<int64_t> padded = order;
      if (drop)
        padded.resize(8);
      else
        padded.insert(padded.end(), order.begin(), order.begin() + 2);
      std::vector<int64_t> seen;
      for (int64_t r = 0; r < 4; ++r) {
        std::vector<int64_t> want;
        for (size_t i = static_cast<size_t>(r); i < padded.size(); i += 4)
          want.push_back(padded[i]);
        const std::vector<int64_t> got = flat(epoch_of(ranks[static_cast<size_t>(r)]));
        EXPECT_EQ(got, want) << "rank " << r << " epoch " << epoch << " drop " << drop;
        EXPECT_EQ(ranks[static_cast<size_t>(r)].batches_per_epoch(), drop ? 1 : 2);
        seen.insert(seen.end(), got.begin(), got.end());
      }
      std::sort(seen.begin(), seen.end());
      EXPECT_EQ(std::unique(seen.begin(), seen.end()) - seen.begin(), drop ? 8 : 10)
          << "disjoint shards covering the epoch (padding repeats only the start)";
    }
  }
  lsd::LoaderOptions bad = whole;
  bad.num_replicas = 2;
  bad.rank = 2;
  EXPECT_THROW(lsd::DataLoader(range(10), bad), ls::Error);
}

TEST(DataLoader, WorkersDeliverInOrder) {
  const lsd::LoaderOptions base{.batch_size = 3, .shuffle = true, .seed = 9};
  lsd::DataLoader serial(range(61), base);
  const auto want0 = epoch_of(serial), want1 = epoch_of(serial);
  for (int workers : {1, 2, 4, 8}) {
    for (int capacity : {1, 3, 16}) {
      lsd::LoaderOptions o = base;
      o.num_workers = workers;
      o.queue_capacity = capacity;
      auto ds = range(61, -1, /*jitter=*/true);
      lsd::DataLoader loader(ds, o);
      within(20s, [&] {
        EXPECT_EQ(epoch_of(loader), want0) << workers << " workers, capacity " << capacity;
        EXPECT_EQ(epoch_of(loader), want1) << workers << " workers, capacity " << capacity;
      });
      EXPECT_EQ(ds->gets(), 122);  // nothing read twice, nothing read ahead into epoch 2
    }
  }
}

TEST(DataLoader, RangeForIsOneEpoch) {
  lsd::DataLoader loader(range(10), {.batch_size = 3, .num_workers = 2});
  int n = 0;
  for (lsd::HostBatch& b : loader) {
    EXPECT_EQ(b.epoch, 0);
    ++n;
  }
  EXPECT_EQ(n, 4);
  n = 0;
  for (auto& b : loader) n += static_cast<int>(b.size());
  EXPECT_EQ(n, 10);
  EXPECT_EQ(loader.epoch(), 2);
}

TEST(DataLoader, WorkerErrorReachesTheConsumerInOrder) {
  for (int workers : {0, 1, 3}) {
    lsd::DataLoader loader(range(20, /*throw_at=*/13, /*jitter=*/true),
                           {.batch_size = 4, .num_workers = workers, .queue_capacity = 8});
    within(20s, [&] {
      for (int k = 0; k < 3; ++k) ASSERT_TRUE(loader.next()) << k;
      try {
        loader.next();
        ADD_FAILURE() << "batch 3 (examples 12..15) should fail, workers " << workers;
      } catch (const ls::Error& e) {
        EXPECT_THAT(e.what(), HasSubstr("read error at example 13"));
      }
      auto b4 = loader.next();  // the loader goes on after the failed batch
      ASSERT_TRUE(b4);
      EXPECT_EQ(b4->labels, (std::vector<int64_t>{6, 7, 8, 9}));  // examples 16..19
      EXPECT_FALSE(loader.next());
    });
  }
}

TEST(DataLoader, ShapeAndLabelChecks) {
  class Odd : public RangeDataset {
   public:
    Odd() : RangeDataset(4) {}
    lsd::Example get(int64_t i) const override {
      if (i == 1) return {{1, 2}, {1, 1, 2}, 0};
      if (i == 2) return {{1}, {1, 1, 1}, 10};
      if (i == 3) return {{1, 2}, {1, 1, 1}, 0};
      return RangeDataset::get(i);
    }
  };
  lsd::DataLoader loader(std::make_shared<Odd>(), {.batch_size = 2});
  try {
    loader.next();
    ADD_FAILURE();
  } catch (const ls::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("example 1 has shape [1, 1, 2] but example 0"));
  }
  try {
    loader.next();
    ADD_FAILURE();
  } catch (const ls::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("example 2 has label 10, outside [0, 10)"));
  }
}

TEST(DataLoader, BadOptions) {
  EXPECT_THROW(lsd::DataLoader(nullptr, {}), ls::Error);
  EXPECT_THROW(lsd::DataLoader(range(3), {.batch_size = 0}), ls::Error);
  EXPECT_THROW(lsd::DataLoader(range(3), {.num_workers = -1}), ls::Error);
  EXPECT_THROW(lsd::DataLoader(range(3), {.queue_capacity = 0}), ls::Error);
  EXPECT_THROW(lsd::DataLoader(range(3), {.transforms = {nullptr}}), ls::Error);
}

TEST(DataLoader, DestroyMidEpochJoinsWorkers) {
  auto ds = std::make_shared<SlowDataset>(2000);
  within(10s, [&] {
    lsd::DataLoader loader(ds, {.batch_size = 8, .num_workers = 4, .queue_capacity = 2});
    ASSERT_TRUE(loader.next());
    ASSERT_TRUE(loader.next());
  });  // destroyed here with workers busy and the queue full
  const int64_t read = ds->gets();
  EXPECT_LT(read, 2000);
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(ds->gets(), read) << "no worker runs after the loader is gone";
  // Also before the first batch, and via set_epoch.
  within(10s, [&] {
    lsd::DataLoader never(ds, {.batch_size = 8, .num_workers = 4});
    lsd::DataLoader moved = std::move(never);
    ASSERT_TRUE(moved.next());
    moved.set_epoch(5);
    auto b = moved.next();
    ASSERT_TRUE(b);
    EXPECT_EQ(b->epoch, 5);
  });
}

TEST(DataLoader, TransformsDoNotDependOnWorkers) {
  auto fake = std::make_shared<lsd::FakeData>(
      lsd::FakeDataOptions{.shape = {3, 8, 8}, .num_classes = 10, .size = 40, .seed = 1});
  lsd::LoaderOptions o{.batch_size = 5, .shuffle = true, .seed = 3};
  o.transforms = {lsd::random_crop(6, 2), lsd::random_horizontal_flip(),
                  lsd::normalize({0.5f, 0.5f, 0.5f}, {0.25f, 0.25f, 0.25f})};
  lsd::DataLoader serial(fake, o);
  o.num_workers = 3;
  lsd::DataLoader parallel(fake, o);
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::vector<lsd::HostBatch> a, b;
    for (auto& x : serial) a.push_back(x);
    for (auto& x : parallel) b.push_back(x);
    ASSERT_EQ(a.size(), 8u);
    ASSERT_EQ(b.size(), 8u);
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].images_shape, (ls::Shape{5, 3, 6, 6}));
      EXPECT_EQ(a[i].images, b[i].images);
      EXPECT_EQ(a[i].labels, b[i].labels);
    }
  }
}

// ---- DeviceLoader ----------------------------------------------------------------------------

TEST(DeviceLoader, YieldsUploadedBatchesInOrder) {
  auto fake = std::make_shared<lsd::FakeData>(
      lsd::FakeDataOptions{.shape = {2, 3, 3}, .num_classes = 4, .size = 10, .seed = 5});
  lsd::DeviceLoader dl(lsd::DataLoader(fake, {.batch_size = 4, .num_workers = 2}),
                       {.device = ls::Device{ls::DeviceKind::Ref}, .prefetch = 2});
  EXPECT_EQ(dl.batches_per_epoch(), 3);
  EXPECT_EQ(dl.device(), ls::Device{ls::DeviceKind::Ref});
  int64_t seen = 0, batches = 0;
  for (auto& [images, labels] : dl) {
    const int64_t b = images.size(0);
    EXPECT_EQ(images.shape(), (ls::Shape{b, 2, 3, 3}));
    EXPECT_EQ(labels.shape(), (ls::Shape{b}));
    EXPECT_EQ(images.dtype(), ls::DType::F32);
    EXPECT_EQ(labels.dtype(), ls::DType::I64);
    EXPECT_FALSE(images.is_pending());
    EXPECT_EQ(images.device(), ls::Device{ls::DeviceKind::Ref});
    const std::vector<float> px = images.to_vector<float>();
    const std::vector<int64_t> lab = labels.to_vector<int64_t>();
    for (int64_t j = 0; j < b; ++j) {
      lsd::Example ex = fake->get(seen + j);
      EXPECT_EQ(lab[static_cast<size_t>(j)], ex.label);
      EXPECT_TRUE(std::equal(ex.image.begin(), ex.image.end(), px.begin() + j * 18));
    }
    seen += b;
    ++batches;
  }
  EXPECT_EQ(seen, 10);
  EXPECT_EQ(batches, 3);
  EXPECT_EQ(dl.epoch(), 1);
  // The next epoch through next().
  auto first = dl.next();
  ASSERT_TRUE(first);
  EXPECT_EQ(first->images.shape(), (ls::Shape{4, 2, 3, 3}));
  EXPECT_EQ(first->labels.to_vector<int64_t>()[0], fake->get(0).label);
}

TEST(DeviceLoader, ImagesFeedOps) {
  auto fake = std::make_shared<lsd::FakeData>(
      lsd::FakeDataOptions{.shape = {1, 2, 2}, .num_classes = 3, .size = 4, .fixed = true});
  lsd::DeviceLoader dl(lsd::DataLoader(fake, {.batch_size = 2}));
  auto b = dl.next();
  ASSERT_TRUE(b);
  EXPECT_FLOAT_EQ((b->images + 1.0f).sum().item<float>(), 8.0f);
}

TEST(DeviceLoader, ErrorsPropagateInOrder) {
  for (int workers : {0, 2}) {
    lsd::DeviceLoader dl(lsd::DataLoader(range(12, /*throw_at=*/5, /*jitter=*/true),
                                         {.batch_size = 2, .num_workers = workers}));
    within(20s, [&] {
      ASSERT_TRUE(dl.next());
      ASSERT_TRUE(dl.next());
      try {
        dl.next();
        ADD_FAILURE() << "batch 2 (examples 4, 5) should fail";
      } catch (const ls::Error& e) {
        EXPECT_THAT(e.what(), HasSubstr("read error at example 5"));
      }
      int rest = 0;
      while (auto b = dl.next()) {
        EXPECT_EQ(b->labels.to_vector<int64_t>()[0], (6 + 2 * rest) % 10);
        ++rest;
      }
      EXPECT_EQ(rest, 3);
    });
  }
}

TEST(DeviceLoader, DestroyMidEpochAndSetEpoch) {
  auto ds = std::make_shared<SlowDataset>(1000);
  within(10s, [&] {
    lsd::DeviceLoader dl(lsd::DataLoader(ds, {.batch_size = 4, .num_workers = 3}), {.prefetch = 1});
    ASSERT_TRUE(dl.next());
  });
  within(10s, [&] {
    lsd::DeviceLoader dl(lsd::DataLoader(ds, {.batch_size = 4, .shuffle = true, .seed = 1}));
    ASSERT_TRUE(dl.next());
    dl.set_epoch(3);
    EXPECT_EQ(dl.epoch(), 3);
    auto b = dl.next();
    ASSERT_TRUE(b);
    lsd::DataLoader ref(ds, {.batch_size = 4, .shuffle = true, .seed = 1});
    ref.set_epoch(3);
    EXPECT_EQ(b->labels.to_vector<int64_t>(), ref.next()->labels);
  });
  within(10s, [&] {
    lsd::DeviceLoader unused(lsd::DataLoader(ds, {.batch_size = 4, .num_workers = 2}));
  });
  EXPECT_THROW(lsd::DeviceLoader(lsd::DataLoader(range(3), {}), {.prefetch = 0}), ls::Error);
}

// ---- loaders shared by threads ---------------------------------------------------------------

namespace {

// Example `gate_at` waits in get() until open(): holds a loader inside next() (num_workers 0) or
// its upload thread inside the DataLoader's.
class GatedDataset : public RangeDataset {
 public:
  GatedDataset(int64_t n, int64_t gate_at) : RangeDataset(n), gate_at_(gate_at) {}
  lsd::Example get(int64_t i) const override {
    if (i == gate_at_) {
      std::unique_lock<std::mutex> lock(mu_);
      reached_ = true;
      cv_.notify_all();
      cv_.wait(lock, [&] { return open_; });
    }
    return RangeDataset::get(i);
  }
  void wait_reached() const {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return reached_; });
  }
  void open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  int64_t gate_at_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  mutable bool reached_ = false;
  bool open_ = false;
};

// `threads` threads each take one batch, wait until all have one, then loop to the end of the
// epoch; returns the example ids each batch held, as the threads got them.
template <typename Loader, typename Ids>
std::vector<std::vector<int64_t>> share(Loader& loader, int threads, Ids ids_of) {
  std::vector<std::vector<int64_t>> got(static_cast<size_t>(threads));
  std::atomic<int> took{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      auto& mine = got[static_cast<size_t>(t)];
      auto first = loader.next();
      if (!first) return;
      for (int64_t id : ids_of(*first)) mine.push_back(id);
      ++took;
      while (took.load() < threads) std::this_thread::yield();
      while (auto b = loader.next())
        for (int64_t id : ids_of(*b)) mine.push_back(id);
    });
  for (std::thread& t : pool) t.join();
  return got;
}

std::vector<int64_t> ids_of_host(const lsd::HostBatch& b) {
  std::vector<int64_t> ids;
  for (float v : b.images) ids.push_back(static_cast<int64_t>(v));
  return ids;
}

std::vector<int64_t> ids_of_device(const lsd::Batch& b) {
  std::vector<int64_t> ids;
  for (float v : b.images.to_vector<float>()) ids.push_back(static_cast<int64_t>(v));
  return ids;
}

void expect_one_epoch(const std::vector<std::vector<int64_t>>& got, int64_t n) {
  std::vector<int64_t> all = flat(got);
  std::sort(all.begin(), all.end());
  std::vector<int64_t> expected(static_cast<size_t>(n));
  std::iota(expected.begin(), expected.end(), int64_t{0});
  EXPECT_EQ(all, expected) << "every example once, one epoch in total";
  for (const auto& mine : got) EXPECT_FALSE(mine.empty());
}

}  // namespace

TEST(DataLoader, ThreadsSharingALoaderTakeEachBatchOnceInOneEpoch) {
  for (int workers : {0, 3})
    for (int round = 0; round < 10; ++round)
      within(30s, [&] {
        lsd::DataLoader loader(range(120, -1, round % 2 == 1),
                               {.batch_size = 3, .shuffle = true, .num_workers = workers});
        expect_one_epoch(share(loader, 4, ids_of_host), 120);
        EXPECT_EQ(loader.epoch(), 1);
        auto next = loader.next();  // a thread that took nothing starts the next epoch
        ASSERT_TRUE(next);
        EXPECT_EQ(next->epoch, 1);
        EXPECT_EQ(next->index, 0);
      });
}

TEST(DataLoader, SetEpochFromAnotherThreadTakesEffectAtTheNextEpochWithoutBlocking) {
  auto ds = std::make_shared<GatedDataset>(40, 21);
  lsd::DataLoader loader(ds, {.batch_size = 4, .shuffle = true, .seed = 3});
  std::vector<int64_t> epochs;
  std::thread consumer([&] {
    while (auto b = loader.next()) epochs.push_back(b->epoch);
  });
  ds->wait_reached();  // the consumer is inside next(), making the batch with example 21
  within(5s, [&] { loader.set_epoch(7); });
  ds->open();
  within(10s, [&] { consumer.join(); });
  EXPECT_EQ(epochs, std::vector<int64_t>(10, 0)) << "the epoch under way is delivered whole";
  EXPECT_EQ(loader.epoch(), 7);
  auto b = loader.next();
  ASSERT_TRUE(b);
  lsd::DataLoader ref(range(40), {.batch_size = 4, .shuffle = true, .seed = 3});
  ref.set_epoch(7);
  EXPECT_EQ(b->epoch, 7);
  EXPECT_EQ(b->images, ref.next()->images);
}

TEST(DeviceLoader, ThreadsSharingALoaderTakeEachBatchOnceInOneEpoch) {
  for (int workers : {0, 2})
    for (int round = 0; round < 10; ++round)
      within(30s, [&] {
        lsd::DeviceLoader dl(lsd::DataLoader(range(60), {.batch_size = 2, .num_workers = workers}),
                             {.device = ls::Device{ls::DeviceKind::Ref}, .prefetch = 2});
        expect_one_epoch(share(dl, 4, ids_of_device), 60);
        EXPECT_EQ(dl.epoch(), 1);
      });
}

TEST(DeviceLoader, SetEpochFromAnotherThreadTakesEffectAtTheNextEpochWithoutBlocking) {
  auto ds = std::make_shared<GatedDataset>(40, 21);
  lsd::DeviceLoader dl(lsd::DataLoader(ds, {.batch_size = 4, .shuffle = true, .seed = 3}),
                       {.device = ls::Device{ls::DeviceKind::Ref}, .prefetch = 1});
  std::atomic<int> batches{0};
  std::thread consumer([&] {
    while (auto b = dl.next()) ++batches;
  });
  ds->wait_reached();                 // the upload thread is making the batch with example 21
  std::this_thread::sleep_for(50ms);  // the consumer is then inside next(), waiting for it
  within(5s, [&] { dl.set_epoch(7); });
  ds->open();
  within(10s, [&] { consumer.join(); });
  EXPECT_EQ(batches.load(), 10) << "the epoch under way is delivered whole";
  EXPECT_EQ(dl.epoch(), 7);
  auto b = dl.next();
  ASSERT_TRUE(b);
  lsd::DataLoader ref(range(40), {.batch_size = 4, .shuffle = true, .seed = 3});
  ref.set_epoch(7);
  EXPECT_EQ(b->labels.to_vector<int64_t>(), ref.next()->labels);
}
