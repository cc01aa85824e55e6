// The CIFAR-10 binary format (records of 1 label byte + 3072 pixel bytes) and Cifar10Dataset.
// Not for the Python-pickle version of CIFAR-10, nor CIFAR-100 (two label bytes per record).
#include "data/io.h"
#include "lockstep/data.h"
#include "util/check.h"

namespace lockstep::data {

using util::cat;

namespace {
constexpr size_t kPixels = 3 * 32 * 32;
constexpr size_t kRecord = 1 + kPixels;

std::vector<std::string> split_files(const std::string& given, bool train) {
  if (!io::is_directory(given))
    io::fail(given, "no such directory (expected CIFAR-10 binary batches)");
  // The archive unpacks to cifar-10-batches-bin/; accept its parent too.
  std::string dir = given;
  const std::string first = train ? "data_batch_1.bin" : "test_batch.bin";
  if (!io::is_file(io::join(dir, first)) && !io::is_file(io::join(dir, first + ".gz")) &&
      io::is_directory(io::join(dir, "cifar-10-batches-bin")))
    dir = io::join(dir, "cifar-10-batches-bin");
  std::vector<std::string> files;
  if (train) {
    for (int i = 1; i <= 5; ++i)
      files.push_back(io::find_plain_or_gz(dir, cat("data_batch_", i, ".bin")));
  } else {
    files.push_back(io::find_plain_or_gz(dir, "test_batch.bin"));
  }
  return files;
}
}  // namespace

Cifar10Dataset::Cifar10Dataset(const std::string& dir, bool train) {
  read(split_files(dir, train));
  name_ = cat("cifar10 (", train ? "train" : "test", ", ", dir, ")");
}

Cifar10Dataset::Cifar10Dataset(const std::vector<std::string>& files) {
  if (files.empty()) throw Error("Cifar10Dataset: no files given");
  read(files);
  name_ = cat("cifar10 (", files.front(), files.size() > 1 ? ", ..." : "", ")");
}

void Cifar10Dataset::read(const std::vector<std::string>& files) {
  for (const std::string& path : files) {
    const std::vector<uint8_t> bytes = io::read_file(path);
    if (bytes.empty())
      io::fail(path, cat("empty file: expected records of ", kRecord, " bytes at byte 0"));
    const size_t records = bytes.size() / kRecord;
    if (bytes.size() % kRecord != 0)
      io::fail(path, cat("truncated at byte ", bytes.size(), ": record ", records, " (from byte ",
                         records * kRecord, ") needs ", kRecord, " bytes, only ",
                         bytes.size() % kRecord, " remain"));
    labels_.reserve(labels_.size() + records);
    pixels_.reserve(pixels_.size() + records * kPixels);
    for (size_t r = 0; r < records; ++r) {
      const uint8_t* rec = bytes.data() + r * kRecord;
      if (rec[0] >= 10)
        io::fail(path, cat("label ", int{rec[0]}, " at byte ", r * kRecord, " (record ", r,
                           ") is out of range [0, 10)"));
      labels_.push_back(rec[0]);
      pixels_.insert(pixels_.end(), rec + 1, rec + kRecord);
    }
  }
}

Example Cifar10Dataset::get(int64_t index) const {
  if (index < 0 || index >= size())
    throw Error(cat(name_, ": index ", index, " is out of range [0, ", size(), ")"));
  Example ex;
  ex.shape = {3, 32, 32};
  ex.label = labels_[static_cast<size_t>(index)];
  ex.image.resize(kPixels);
  const uint8_t* src = pixels_.data() + static_cast<size_t>(index) * kPixels;
  for (size_t i = 0; i < kPixels; ++i) ex.image[i] = src[i] / 255.0f;
  return ex;
}

}  // namespace lockstep::data
