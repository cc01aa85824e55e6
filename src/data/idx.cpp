// The IDX format of MNIST and Fashion-MNIST (big-endian header, then unsigned bytes) and the
// MnistDataset built on it. Not for other IDX element types (only ubyte, as those datasets use).
#include <cstdint>
#include <utility>

#include "data/io.h"
#include "lockstep/data.h"
#include "util/check.h"

namespace lockstep::data {

using util::cat;

namespace {

constexpr uint32_t kImagesMagic = 2051;  // 0x00000803: ubyte, 3 dimensions
constexpr uint32_t kLabelsMagic = 2049;  // 0x00000801: ubyte, 1 dimension

std::string hex32(uint32_t v) {
  static const char* digits = "0123456789abcdef";
  std::string s = "0x00000000";
  for (int i = 0; i < 8; ++i) s[9 - i] = digits[(v >> (4 * i)) & 0xf];
  return s;
}

void check_magic(const std::string& path, const std::vector<uint8_t>& bytes, uint32_t expected,
                 const char* kind) {
  const uint32_t magic = io::be32(bytes, 0);
  if (magic == expected) return;
  std::string hint;
  if (magic == kImagesMagic) hint = " (this is an IDX image file)";
  if (magic == kLabelsMagic) hint = " (this is an IDX label file)";
  io::fail(path, cat("bad magic number ", magic, " (", hex32(magic), ") at byte 0: expected ",
                     expected, " (", hex32(expected), ") for an IDX ", kind, " file", hint));
}

// The header is checked before its magic number, which is checked as soon as 4 bytes exist (a
// wrong kind of file is reported as such, even when it is also short).
void check_header(const std::string& path, const std::vector<uint8_t>& bytes, size_t header,
                  uint32_t magic, const char* kind) {
  if (bytes.empty())
    io::fail(path, cat("empty file: expected a ", header, "-byte IDX ", kind, " header at byte 0"));
  if (bytes.size() >= 4) check_magic(path, bytes, magic, kind);
  if (bytes.size() < header)
    io::fail(path, cat("truncated at byte ", bytes.size(), ": expected a ", header, "-byte IDX ",
                       kind, " header"));
}

// The data after the header must be exactly `need` bytes.
void check_length(const std::string& path, const std::vector<uint8_t>& bytes, size_t header,
                  uint64_t need, const std::string& what) {
  const uint64_t have = bytes.size() - header;
  if (have < need)
    io::fail(path, cat("truncated at byte ", bytes.size(), ": expected ", what, " (", header + need,
                       " bytes in all)"));
  if (have > need)
    io::fail(path, cat(have - need, " unexpected bytes at byte ", header + need, " after ", what));
}

// The content of an IDX file whose header (`header` bytes, checked) says how many data bytes
// follow: read no further than that (a gzip bomb is not inflated past it).
template <typename Need>
std::vector<uint8_t> read_idx(const std::string& path, size_t header, uint32_t magic,
                              const char* kind, Need need) {
  const std::vector<uint8_t> prefix = io::read_prefix(path, header);
  check_header(path, prefix, header, magic, kind);
  // A few bytes of slack, so that a small excess is reported as such by check_length.
  const uint64_t data = need(prefix);
  return io::read_file(path, data > UINT64_MAX - header - 4096 ? UINT64_MAX : header + data + 4096);
}

// count * per_image, saturated (a header that claims that much fails as truncated).
uint64_t saturating_mul(uint64_t a, uint64_t b) {
  uint64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

}  // namespace

IdxImages read_idx_images(const std::string& path) {
  std::vector<uint8_t> bytes = read_idx(path, 16, kImagesMagic, "image", [](const auto& h) {
    return saturating_mul(io::be32(h, 4), static_cast<uint64_t>(io::be32(h, 8)) * io::be32(h, 12));
  });
  check_header(path, bytes, 16, kImagesMagic, "image");
  IdxImages out;
  out.count = io::be32(bytes, 4);
  out.rows = io::be32(bytes, 8);
  out.cols = io::be32(bytes, 12);
  if (out.rows == 0 || out.cols == 0)
    io::fail(path, cat("bad image size ", out.rows, "x", out.cols,
                       " in the header at byte 8: rows and columns must be positive"));
  // rows * cols < 2^64; the product with count is compared without overflowing.
  const uint64_t per_image = static_cast<uint64_t>(out.rows) * static_cast<uint64_t>(out.cols);
  const uint64_t have = bytes.size() - 16;
  const std::string what = cat(out.count, " images of ", out.rows, "x", out.cols);
  if (static_cast<uint64_t>(out.count) > have / per_image)
    io::fail(path, cat("truncated at byte ", bytes.size(), ": expected ", what, " (", out.count,
                       " * ", per_image, " bytes after the 16-byte header)"));
  check_length(path, bytes, 16, static_cast<uint64_t>(out.count) * per_image, what);
  bytes.erase(bytes.begin(), bytes.begin() + 16);
  out.pixels = std::move(bytes);
  return out;
}

std::vector<uint8_t> read_idx_labels(const std::string& path) {
  std::vector<uint8_t> bytes = read_idx(path, 8, kLabelsMagic, "label",
                                        [](const auto& h) { return uint64_t{io::be32(h, 4)}; });
  check_header(path, bytes, 8, kLabelsMagic, "label");
  const uint32_t count = io::be32(bytes, 4);
  check_length(path, bytes, 8, count, cat(count, " labels"));
  bytes.erase(bytes.begin(), bytes.begin() + 8);
  return bytes;
}

MnistDataset::MnistDataset(const std::string& images_path, const std::string& labels_path,
                           std::string display_name)
    : images_(read_idx_images(images_path)),
      labels_(read_idx_labels(labels_path)),
      name_(std::move(display_name)) {
  if (static_cast<int64_t>(labels_.size()) != images_.count)
    throw Error(cat(images_path, ": ", images_.count, " images (count at byte 4) but ", labels_path,
                    ": ", labels_.size(),
                    " labels (count at byte 4); both files must hold the same number of examples"));
  for (size_t i = 0; i < labels_.size(); ++i)
    if (labels_[i] >= 10)
      io::fail(labels_path, cat("label ", int{labels_[i]}, " at byte ", 8 + i, " (example ", i,
                                ") is out of range [0, 10)"));
}

namespace {
std::string split_file(const std::string& dir, bool train, const char* what) {
  if (!io::is_directory(dir)) io::fail(dir, "no such directory (expected MNIST-style IDX files)");
  return io::find_plain_or_gz(dir, cat(train ? "train" : "t10k", what));
}
}  // namespace

MnistDataset::MnistDataset(const std::string& dir, bool train, std::string display_name)
    : MnistDataset(split_file(dir, train, "-images-idx3-ubyte"),
                   split_file(dir, train, "-labels-idx1-ubyte"),
                   cat(display_name, " (", train ? "train" : "test", ", ", dir, ")")) {}

Example MnistDataset::get(int64_t index) const {
  if (index < 0 || index >= size())
    throw Error(cat(name_, ": index ", index, " is out of range [0, ", size(), ")"));
  const int64_t n = images_.rows * images_.cols;
  Example ex;
  ex.shape = {1, images_.rows, images_.cols};
  ex.label = labels_[static_cast<size_t>(index)];
  ex.image.resize(static_cast<size_t>(n));
  const uint8_t* src = images_.pixels.data() + index * n;
  for (int64_t i = 0; i < n; ++i) ex.image[static_cast<size_t>(i)] = src[i] / 255.0f;
  return ex;
}

}  // namespace lockstep::data
