// Tests of the dataset readers (IDX plain and gzipped, CIFAR-10 binary), FakeData and
// make_dataset: values read back, and every bad file named with its byte offset.
// Not for loaders or transforms (data_loader_test.cpp).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <lockstep/lockstep.h>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <numeric>
#include <string>
#include <vector>

namespace ls = lockstep;
namespace lsd = lockstep::data;
namespace fs = std::filesystem;
using ::testing::HasSubstr;

namespace {

// A fresh directory under the system temp dir, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = fs::temp_directory_path() /
            ("lockstep-data-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string str() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

using Bytes = std::vector<uint8_t>;

void write_plain(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

void write_gz(const std::string& path, const Bytes& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  if (!bytes.empty()) {
    ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
  }
  ASSERT_EQ(gzclose(f), Z_OK);
}

Bytes read_raw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

void put32(Bytes& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(v >> s));
}

Bytes idx_images(uint32_t count, uint32_t rows, uint32_t cols, const Bytes& pixels) {
  Bytes b;
  put32(b, 2051);
  put32(b, count);
  put32(b, rows);
  put32(b, cols);
  b.insert(b.end(), pixels.begin(), pixels.end());
  return b;
}

Bytes idx_labels(const Bytes& labels, uint32_t count) {
  Bytes b;
  put32(b, 2049);
  put32(b, count);
  b.insert(b.end(), labels.begin(), labels.end());
  return b;
}
Bytes idx_labels(const Bytes& labels) {
  return idx_labels(labels, static_cast<uint32_t>(labels.size()));
}

Bytes iota_bytes(size_t n, int start = 0) {
  Bytes b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>((start + i * 7) % 256);
  return b;
}

// Runs fn; expects an ls::Error whose message holds every one of `parts`.
void expect_error(const std::function<void()>& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "no ls::Error thrown";
  } catch (const ls::Error& e) {
    for (const std::string& p : parts) EXPECT_THAT(e.what(), HasSubstr(p));
  }
}

// A valid 3-image, 2x3 test split in `dir` (images plain, labels gzipped).
void write_small_mnist(const TempDir& dir, const std::string& split = "t10k") {
  write_plain(dir.file(split + "-images-idx3-ubyte"), idx_images(3, 2, 3, iota_bytes(18)));
  write_gz(dir.file(split + "-labels-idx1-ubyte.gz"), idx_labels({7, 0, 9}));
}

}  // namespace

TEST(DataIdx, ReadsPlainAndGzippedFiles) {
  TempDir dir;
  write_small_mnist(dir);
  lsd::MnistDataset ds(dir.str(), /*train=*/false);
  ASSERT_EQ(ds.size(), 3);
  EXPECT_EQ(ds.example_shape(), (ls::Shape{1, 2, 3}));
  EXPECT_EQ(ds.num_classes(), 10);
  EXPECT_THAT(ds.name(), HasSubstr("test"));
  const Bytes px = iota_bytes(18);
  for (int64_t i = 0; i < 3; ++i) {
    lsd::Example ex = ds.get(i);
    EXPECT_EQ(ex.shape, (ls::Shape{1, 2, 3}));
    ASSERT_EQ(ex.image.size(), 6u);
    for (size_t j = 0; j < 6; ++j) EXPECT_FLOAT_EQ(ex.image[j], px[i * 6 + j] / 255.0f);
  }
  EXPECT_EQ(ds.get(0).label, 7);
  EXPECT_EQ(ds.get(2).label, 9);
  EXPECT_THROW(ds.get(3), ls::Error);
  EXPECT_THROW(ds.get(-1), ls::Error);
}

TEST(DataIdx, GzAndPlainGiveTheSameValuesAndPixelsSpanZeroToOne) {
  TempDir a, b;
  const Bytes px = {0, 255, 128, 1};
  write_plain(a.file("train-images-idx3-ubyte"), idx_images(1, 2, 2, px));
  write_plain(a.file("train-labels-idx1-ubyte"), idx_labels({3}));
  write_gz(b.file("train-images-idx3-ubyte.gz"), idx_images(1, 2, 2, px));
  write_gz(b.file("train-labels-idx1-ubyte.gz"), idx_labels({3}));
  lsd::MnistDataset da(a.str(), true), db(b.str(), true);
  EXPECT_EQ(da.get(0).image, db.get(0).image);
  EXPECT_EQ(da.get(0).image, (std::vector<float>{0.0f, 1.0f, 128 / 255.0f, 1 / 255.0f}));
  EXPECT_EQ(db.get(0).label, 3);
}

TEST(DataIdx, LowLevelReaders) {
  TempDir dir;
  write_gz(dir.file("x.gz"), idx_images(2, 1, 4, iota_bytes(8)));
  lsd::IdxImages im = lsd::read_idx_images(dir.file("x.gz"));
  EXPECT_EQ(im.count, 2);
  EXPECT_EQ(im.rows, 1);
  EXPECT_EQ(im.cols, 4);
  EXPECT_EQ(im.pixels, iota_bytes(8));
  write_plain(dir.file("l"), idx_labels({1, 2, 3}));
  EXPECT_EQ(lsd::read_idx_labels(dir.file("l")), (Bytes{1, 2, 3}));
}

TEST(DataIdx, MissingFileAndDirectory) {
  TempDir dir;
  write_plain(dir.file("t10k-images-idx3-ubyte"), idx_images(3, 2, 3, iota_bytes(18)));
  expect_error([&] { lsd::MnistDataset(dir.str(), false); },
               {"t10k-labels-idx1-ubyte", "no such file"});
  expect_error([&] { lsd::MnistDataset(dir.file("nope"), false); }, {"nope", "no such directory"});
  expect_error([&] { lsd::read_idx_labels(dir.file("absent-labels")); },
               {"absent-labels", "cannot open"});
}

TEST(DataIdx, EmptyFiles) {
  TempDir dir;
  write_plain(dir.file("empty"), {});
  expect_error([&] { lsd::read_idx_images(dir.file("empty")); }, {"empty", "at byte 0"});
  write_plain(dir.file("empty.gz"), {});
  expect_error([&] { lsd::read_idx_labels(dir.file("empty.gz")); }, {"empty.gz", "at byte 0"});
  write_gz(dir.file("nothing.gz"), {});  // valid gzip of zero bytes
  expect_error([&] { lsd::read_idx_labels(dir.file("nothing.gz")); },
               {"nothing.gz", "empty file", "at byte 0"});
}

TEST(DataIdx, BadMagic) {
  TempDir dir;
  Bytes b = idx_images(1, 1, 1, {5});
  b[3] = 0x04;
  write_plain(dir.file("img"), b);
  expect_error([&] { lsd::read_idx_images(dir.file("img")); },
               {"img", "bad magic number 2052", "at byte 0", "expected 2051"});
  // A label file given as images is named as such.
  write_gz(dir.file("lab.gz"), idx_labels({1}));
  expect_error([&] { lsd::read_idx_images(dir.file("lab.gz")); },
               {"lab.gz", "at byte 0", "this is an IDX label file"});
}

TEST(DataIdx, TruncatedHeader) {
  TempDir dir;
  Bytes b = idx_images(3, 2, 3, {});
  b.resize(10);
  write_plain(dir.file("img"), b);
  expect_error([&] { lsd::read_idx_images(dir.file("img")); },
               {"img", "truncated at byte 10", "16-byte"});
  Bytes l = idx_labels({});
  l.resize(6);
  write_gz(dir.file("lab.gz"), l);
  expect_error([&] { lsd::read_idx_labels(dir.file("lab.gz")); },
               {"lab.gz", "truncated at byte 6"});
}

TEST(DataIdx, TruncatedData) {
  TempDir dir;
  write_plain(dir.file("img"), idx_images(3, 2, 3, iota_bytes(17)));
  expect_error([&] { lsd::read_idx_images(dir.file("img")); },
               {"img", "truncated at byte 33", "expected 3 images of 2x3"});
  // The example: a label header promising 10000 labels, and nothing after it.
  write_gz(dir.file("t10k-labels-idx1-ubyte.gz"), idx_labels({}, 10000));
  expect_error([&] { lsd::read_idx_labels(dir.file("t10k-labels-idx1-ubyte.gz")); },
               {"t10k-labels-idx1-ubyte.gz: truncated at byte 8: expected 10000 labels"});
  // A huge count must not overflow the size check.
  write_plain(dir.file("huge"), idx_images(0xffffffffu, 0xffffffffu, 0xffffffffu, {1, 2}));
  expect_error([&] { lsd::read_idx_images(dir.file("huge")); }, {"huge", "truncated at byte 18"});
}

TEST(DataIdx, TrailingBytesAndZeroDims) {
  TempDir dir;
  write_plain(dir.file("lab"), idx_labels({1, 2, 3}, 2));
  expect_error([&] { lsd::read_idx_labels(dir.file("lab")); },
               {"lab", "1 unexpected bytes at byte 10"});
  write_plain(dir.file("img"), idx_images(1, 0, 3, {}));
  expect_error([&] { lsd::read_idx_images(dir.file("img")); }, {"img", "byte 8", "0x3"});
}

TEST(DataIdx, CountMismatch) {
  TempDir dir;
  write_plain(dir.file("train-images-idx3-ubyte"), idx_images(3, 2, 3, iota_bytes(18)));
  write_plain(dir.file("train-labels-idx1-ubyte"), idx_labels({1, 2}));
  expect_error(
      [&] { lsd::MnistDataset(dir.str(), true); },
      {"train-images-idx3-ubyte: 3 images", "train-labels-idx1-ubyte: 2 labels", "byte 4"});
}

TEST(DataIdx, LabelOutOfRange) {
  TempDir dir;
  write_plain(dir.file("t10k-images-idx3-ubyte"), idx_images(3, 2, 3, iota_bytes(18)));
  write_gz(dir.file("t10k-labels-idx1-ubyte.gz"), idx_labels({1, 10, 2}));
  expect_error([&] { lsd::MnistDataset(dir.str(), false); },
               {"t10k-labels-idx1-ubyte.gz", "label 10 at byte 9", "out of range [0, 10)"});
}

TEST(DataIdx, CorruptGzip) {
  TempDir dir;
  write_gz(dir.file("good.gz"), idx_images(50, 10, 10, iota_bytes(5000)));
  const Bytes good = read_raw(dir.file("good.gz"));
  ASSERT_GT(good.size(), 40u);
  // Cut short: the stream ends early.
  write_plain(dir.file("cut.gz"), Bytes(good.begin(), good.begin() + good.size() / 2));
  expect_error([&] { lsd::read_idx_images(dir.file("cut.gz")); },
               {"cut.gz", "gzip data ends early at byte", "compressed byte"});
  // A flipped CRC: the data decompresses but fails its check.
  Bytes crc = good;
  crc[crc.size() - 6] ^= 0xff;
  write_plain(dir.file("crc.gz"), crc);
  expect_error([&] { lsd::read_idx_images(dir.file("crc.gz")); },
               {"crc.gz", "corrupt gzip data at byte", "zlib:"});
  // A ".gz" that is not gzip at all.
  write_plain(dir.file("plain.gz"), idx_labels({1}));
  expect_error([&] { lsd::read_idx_labels(dir.file("plain.gz")); },
               {"plain.gz", "bad gzip magic at byte 0"});
}

TEST(DataIdx, PlainPreferredOverGz) {
  TempDir dir;
  write_small_mnist(dir, "train");
  write_gz(dir.file("train-images-idx3-ubyte.gz"), Bytes{1, 2, 3});  // broken, must be unused
  EXPECT_EQ(lsd::MnistDataset(dir.str(), true).size(), 3);
}

// ---- CIFAR-10 --------------------------------------------------------------------------------

namespace {
constexpr size_t kRecord = 3073;

Bytes cifar_records(const Bytes& labels, int salt) {
  Bytes b;
  for (size_t r = 0; r < labels.size(); ++r) {
    b.push_back(labels[r]);
    Bytes px = iota_bytes(3072, salt + static_cast<int>(r));
    b.insert(b.end(), px.begin(), px.end());
  }
  return b;
}

void write_cifar(const std::string& dir) {
  for (int i = 1; i <= 5; ++i)
    write_plain(dir + "/data_batch_" + std::to_string(i) + ".bin",
                cifar_records({static_cast<uint8_t>(i), static_cast<uint8_t>(i + 4)}, i * 10));
  write_gz(dir + "/test_batch.bin.gz", cifar_records({9, 0, 5}, 100));
}
}  // namespace

TEST(DataCifar, ReadsTrainAndTestSplits) {
  TempDir dir;
  write_cifar(dir.str());
  lsd::Cifar10Dataset train(dir.str(), true), test(dir.str(), false);
  ASSERT_EQ(train.size(), 10);
  ASSERT_EQ(test.size(), 3);
  EXPECT_EQ(train.example_shape(), (ls::Shape{3, 32, 32}));
  EXPECT_EQ(train.get(0).label, 1);
  EXPECT_EQ(train.get(1).label, 5);
  EXPECT_EQ(train.get(9).label, 9);
  EXPECT_EQ(test.get(0).label, 9);
  EXPECT_EQ(test.get(2).label, 5);
  // Record 3 is batch 2's second record: pixels iota from salt 21; channel-major layout kept.
  lsd::Example ex = train.get(3);
  const Bytes px = iota_bytes(3072, 21);
  ASSERT_EQ(ex.image.size(), 3072u);
  for (size_t i : {size_t{0}, size_t{31}, size_t{1024}, size_t{2047}, size_t{3071}})
    EXPECT_FLOAT_EQ(ex.image[i], px[i] / 255.0f) << i;
}

TEST(DataCifar, AcceptsTheArchiveSubdirectory) {
  TempDir dir;
  fs::create_directories(dir.file("cifar-10-batches-bin"));
  write_cifar(dir.file("cifar-10-batches-bin"));
  EXPECT_EQ(lsd::Cifar10Dataset(dir.str(), false).size(), 3);
}

TEST(DataCifar, BadFiles) {
  TempDir dir;
  write_cifar(dir.str());
  fs::remove(dir.file("data_batch_4.bin"));
  expect_error([&] { lsd::Cifar10Dataset(dir.str(), true); }, {"data_batch_4.bin", "no such file"});

  Bytes cut = cifar_records({1, 2}, 0);
  cut.resize(kRecord + 100);
  write_plain(dir.file("data_batch_4.bin"), cut);
  expect_error([&] { lsd::Cifar10Dataset(dir.str(), true); },
               {"data_batch_4.bin", "truncated at byte 3173", "record 1 (from byte 3073)"});

  write_plain(dir.file("data_batch_4.bin"), cifar_records({1, 10}, 0));
  expect_error([&] { lsd::Cifar10Dataset(dir.str(), true); },
               {"data_batch_4.bin", "label 10 at byte 3073", "record 1", "[0, 10)"});

  write_plain(dir.file("data_batch_4.bin"), {});
  expect_error([&] { lsd::Cifar10Dataset(dir.str(), true); },
               {"data_batch_4.bin", "empty file", "byte 0"});

  Bytes gz_cut = read_raw(dir.file("test_batch.bin.gz"));
  gz_cut.resize(gz_cut.size() / 2);
  write_plain(dir.file("test_batch.bin.gz"), gz_cut);
  expect_error([&] { lsd::Cifar10Dataset(dir.str(), false); },
               {"test_batch.bin.gz", "ends early at byte"});
  expect_error([&] { lsd::Cifar10Dataset(dir.file("missing"), false); },
               {"missing", "no such directory"});
}

// ---- FakeData ----------------------------------------------------------------------------------

TEST(DataFake, RandomIsDeterministicFromSeedAndIndex) {
  lsd::FakeData a({.shape = {2, 3, 4}, .num_classes = 5, .size = 50, .seed = 7});
  lsd::FakeData b({.shape = {2, 3, 4}, .num_classes = 5, .size = 50, .seed = 7});
  lsd::FakeData c({.shape = {2, 3, 4}, .num_classes = 5, .size = 50, .seed = 8});
  EXPECT_EQ(a.size(), 50);
  EXPECT_EQ(a.example_shape(), (ls::Shape{2, 3, 4}));
  // Order of calls does not matter.
  lsd::Example late = b.get(49);
  EXPECT_EQ(a.get(49).image, late.image);
  bool differs = false;
  std::vector<int> seen(5, 0);
  for (int64_t i = 0; i < 50; ++i) {
    lsd::Example x = a.get(i), y = b.get(i), z = c.get(i);
    EXPECT_EQ(x.image, y.image);
    EXPECT_EQ(x.label, y.label);
    EXPECT_EQ(x.shape, (ls::Shape{2, 3, 4}));
    ASSERT_EQ(x.image.size(), 24u);
    for (float v : x.image) {
      EXPECT_GE(v, 0.0f);
      EXPECT_LT(v, 1.0f);
    }
    ASSERT_GE(x.label, 0);
    ASSERT_LT(x.label, 5);
    ++seen[static_cast<size_t>(x.label)];
    differs = differs || x.image != z.image;
  }
  EXPECT_TRUE(differs);
  for (int n : seen) EXPECT_GT(n, 0);  // 50 draws of 5 classes
  EXPECT_NE(a.get(0).image, a.get(1).image);
}

TEST(DataFake, FixedIsAllZerosLabelZero) {
  lsd::FakeData f({.shape = {3, 4, 4}, .num_classes = 10, .size = 3, .fixed = true});
  for (int64_t i = 0; i < 3; ++i) {
    lsd::Example ex = f.get(i);
    EXPECT_EQ(ex.image, std::vector<float>(48, 0.0f));
    EXPECT_EQ(ex.label, 0);
  }
  EXPECT_THROW(f.get(3), ls::Error);
}

TEST(DataFake, BadOptions) {
  EXPECT_THROW(lsd::FakeData({.shape = {3, 4}}), ls::Error);
  EXPECT_THROW(lsd::FakeData({.shape = {3, 0, 4}}), ls::Error);
  EXPECT_THROW(lsd::FakeData({.num_classes = 0}), ls::Error);
  EXPECT_THROW(lsd::FakeData({.size = -1}), ls::Error);
}

// ---- make_dataset ------------------------------------------------------------------------------

TEST(DataSpec, MakesDatasetsByName) {
  auto fake = lsd::make_dataset("fake", true, {.shape = {1, 2, 2}, .num_classes = 3, .size = 4});
  EXPECT_EQ(fake->size(), 4);
  EXPECT_EQ(fake->num_classes(), 3);
  auto fake_test = lsd::make_dataset("fake", false, {.shape = {1, 2, 2}, .size = 4});
  EXPECT_NE(fake_test->get(0).image,
            lsd::make_dataset("fake", true, {.shape = {1, 2, 2}, .size = 4})->get(0).image);

  TempDir dir;
  write_small_mnist(dir);
  auto m = lsd::make_dataset("mnist:" + dir.str(), false);
  EXPECT_EQ(m->size(), 3);
  EXPECT_THAT(m->name(), HasSubstr("mnist"));
  auto fm = lsd::make_dataset("fashion-mnist:" + dir.str(), false);
  EXPECT_THAT(fm->name(), HasSubstr("fashion-mnist"));

  TempDir cdir;
  write_cifar(cdir.str());
  EXPECT_EQ(lsd::make_dataset("cifar10:" + cdir.str(), true)->size(), 10);
}

TEST(DataSpec, ClearErrors) {
  expect_error([] { lsd::make_dataset("imagenet:/x", true); },
               {"unknown dataset 'imagenet'", "fake, fashion-mnist[:DIR], mnist:DIR, cifar10:DIR"});
  expect_error([] { lsd::make_dataset("mnist", true); }, {"mnist:DIR"});
  expect_error([] { lsd::make_dataset("cifar10:", true); }, {"cifar10:DIR"});
  expect_error([] { lsd::make_dataset("mnist:/no/such/dir", true); },
               {"/no/such/dir", "does not exist"});
  expect_error([] { lsd::make_dataset("fake:3", true); }, {"fake takes no argument"});
}

// ---- the real Fashion-MNIST, when installed (Debian package dataset-fashion-mnist) -------------

namespace {
const char* kFashionDir = "/usr/share/datasets/fashion-mnist";
}

TEST(DataFashionMnist, RealTestSplit) {
  if (!fs::is_directory(kFashionDir)) GTEST_SKIP() << kFashionDir << " is absent";
  auto ds = lsd::make_dataset("fashion-mnist", /*train=*/false);
  ASSERT_EQ(ds->size(), 10000);
  EXPECT_EQ(ds->example_shape(), (ls::Shape{1, 28, 28}));
  std::vector<int> per_class(10, 0);
  for (int64_t i = 0; i < ds->size(); ++i) ++per_class[static_cast<size_t>(ds->get(i).label)];
  EXPECT_EQ(per_class, std::vector<int>(10, 1000));  // the test split is balanced
  const std::vector<int64_t> first = {9, 2, 1, 1, 6, 1, 4, 6, 5, 7};
  for (size_t i = 0; i < first.size(); ++i)
    EXPECT_EQ(ds->get(static_cast<int64_t>(i)).label, first[i]);
  lsd::Example ex = ds->get(0);
  double sum = 0;
  for (float v : ex.image) {
    ASSERT_GE(v, 0.0f);
    ASSERT_LE(v, 1.0f);
    sum += v;
  }
  EXPECT_NEAR(sum, 33456.0 / 255.0, 1e-3);  // the bytes of test image 0 sum to 33456
}

TEST(DataFashionMnist, RealTrainSplitCount) {
  if (!fs::is_directory(kFashionDir)) GTEST_SKIP() << kFashionDir << " is absent";
  lsd::MnistDataset ds(kFashionDir, /*train=*/true, "fashion-mnist");
  EXPECT_EQ(ds.size(), 60000);
  EXPECT_EQ(ds.get(0).label, 9);
}

// A gzip bomb in place of an IDX file: its header claims 10 labels, the stream inflates to 64 MiB.
// Reading stops a few KiB past what the header allows, naming the file (issue 30, item 10).
TEST(DataIdx, AGzipBombIsNotInflatedPastWhatTheHeaderAllows) {
  TempDir dir;
  Bytes bomb = idx_labels({1, 2, 3, 4, 5, 6, 7, 8, 9, 0});
  bomb.resize(size_t{64} << 20, 0);
  write_gz(dir.file("bomb.gz"), bomb);
  expect_error([&] { lsd::read_idx_labels(dir.file("bomb.gz")); },
               {"bomb.gz", "more than its header allows", "decompression bomb"});
  Bytes images = idx_images(2, 3, 3, iota_bytes(18));
  images.resize(size_t{64} << 20, 0);
  write_gz(dir.file("images.gz"), images);
  expect_error([&] { lsd::read_idx_images(dir.file("images.gz")); },
               {"images.gz", "decompression bomb"});
}
