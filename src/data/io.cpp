// File reading for the dataset readers: plain files directly, ".gz" files through zlib's gzread.
// Not for parsing formats (idx.cpp, cifar.cpp).
#include "data/io.h"

#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "util/check.h"
#include "util/files.h"

namespace lockstep::data::io {

namespace fs = std::filesystem;
using util::cat;

void fail(const std::string& path, const std::string& what) { throw Error(cat(path, ": ", what)); }

bool is_file(const std::string& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

bool is_directory(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec);
}

std::string join(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  if (dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

std::string find_plain_or_gz(const std::string& dir, const std::string& base) {
  const std::string plain = join(dir, base);
  if (is_file(plain)) return plain;
  if (is_file(plain + ".gz")) return plain + ".gz";
  fail(plain, cat("no such file (nor ", base, ".gz) in ", dir));
}

uint32_t be32(const std::vector<uint8_t>& bytes, size_t offset) {
  return (uint32_t{bytes[offset]} << 24) | (uint32_t{bytes[offset + 1]} << 16) |
         (uint32_t{bytes[offset + 2]} << 8) | uint32_t{bytes[offset + 3]};
}

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Closes a FILE* / gzFile on every path out.
struct FileCloser {
  FILE* f;
  ~FileCloser() {
    if (f) std::fclose(f);
  }
};
struct GzCloser {
  gzFile f;
  ~GzCloser() {
    if (f) gzclose(f);
  }
};

// A descriptor to read `path`: a FIFO, device or directory is refused without blocking on it
// (util/files.h).
int open_fd_or_fail(const std::string& path) {
  const util::RegularFile f = util::open_regular(path);
  if (!f.problem.empty()) fail(util::shown(path), cat("cannot open: ", f.problem));
  if (f.fd < 0) fail(path, cat("cannot open: ", std::strerror(f.error)));
  return f.fd;
}

FILE* open_or_fail(const std::string& path) {
  const int fd = open_fd_or_fail(path);
  errno = 0;
  FILE* f = ::fdopen(fd, "rb");
  if (!f) {
    const int err = errno;
    ::close(fd);
    fail(path, cat("cannot open: ", err ? std::strerror(err) : "out of memory"));
  }
  return f;
}

gzFile gz_open_or_fail(const std::string& path) {
  const int fd = open_fd_or_fail(path);
  errno = 0;
  gzFile f = gzdopen(fd, "rb");
  if (!f) {
    const int err = errno;
    ::close(fd);
    fail(path, cat("cannot open: ", err ? std::strerror(err) : "out of memory"));
  }
  return f;
}

// Reads `f` to its end into `out`, in chunks that start at `first` bytes and double (a small
// file costs a small buffer, a large one a few reallocations).
// Stops, with an Error naming `path`, once more than `max_bytes` have come.
template <typename Read>
void read_all(std::vector<uint8_t>& out, size_t first, Read read, const std::string& path,
              uint64_t max_bytes) {
  size_t chunk = std::max<size_t>(first, 4096);
  for (;;) {
    const size_t at = out.size();
    // One byte past the limit is enough to know it is passed.
    chunk = static_cast<size_t>(
        std::min<uint64_t>(chunk, max_bytes - std::min<uint64_t>(at, max_bytes) + 1));
    out.resize(at + chunk);
    const size_t got = read(out.data() + at, chunk);
    out.resize(at + got);
    if (out.size() > max_bytes)
      fail(path, cat("holds more than ", max_bytes,
                     " bytes, more than its header allows (or this machine's memory): a damaged "
                     "file or a decompression bomb; nothing past that was read"));
    if (got < chunk) return;
    chunk = std::min<size_t>(chunk * 2, size_t{1} << 26);
  }
}

// The machine's memory: no content larger than it can be read.
uint64_t memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), size = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && size > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(size)
                               : UINT64_MAX;
}

std::vector<uint8_t> read_plain(const std::string& path, uint64_t max_bytes) {
  FileCloser file{open_or_fail(path)};
  struct stat st {};
  // The size is a hint (the file may change while it is read): one byte more, so that reading
  // the whole file ends in a short read.
  const size_t hint = ::fstat(::fileno(file.f), &st) == 0 && st.st_size > 0
                          ? static_cast<size_t>(st.st_size) + 1
                          : 0;
  std::vector<uint8_t> out;
  read_all(
      out, static_cast<size_t>(std::min<uint64_t>(hint, max_bytes + 1)),
      [&](uint8_t* p, size_t n) { return std::fread(p, 1, n, file.f); }, path, max_bytes);
  if (std::ferror(file.f)) fail(path, cat("read error at byte ", out.size()));
  return out;
}

// Throws the stream's error, if any, as "corrupt gzip data at byte <at> ..." naming `path`.
void check_gz(const std::string& path, gzFile f, size_t at) {
  int err = Z_OK;
  const char* msg = gzerror(f, &err);
  if (err != Z_OK) {
    const std::string why = err == Z_BUF_ERROR ? "gzip data ends early" : "corrupt gzip data";
    fail(path, cat(why, " at byte ", at, " of the uncompressed data (compressed byte ",
                   static_cast<long long>(gzoffset(f)), "): zlib: ", msg ? msg : "?"));
  }
}

std::vector<uint8_t> read_gz(const std::string& path, uint64_t max_bytes, bool magic_only = false) {
  // gzread reads non-gzip data as-is ("transparent" mode); a ".gz" name promises gzip, so check
  // its magic first and report a mislabeled or damaged file as such.
  {
    FileCloser file{open_or_fail(path)};
    unsigned char magic[2] = {0, 0};
    const size_t got = std::fread(magic, 1, 2, file.f);
    if (got == 0) fail(path, "empty file at byte 0: expected gzip data");
    if (got < 2 || magic[0] != 0x1f || magic[1] != 0x8b)
      fail(path, "not gzip data: bad gzip magic at byte 0 (expected 1f 8b)");
  }
  if (magic_only) return {};
  GzCloser file{gz_open_or_fail(path)};
  std::vector<uint8_t> out;
  read_all(
      out, size_t{1} << 16,
      [&](uint8_t* p, size_t n) -> size_t {
        const int got = gzread(file.f, p, static_cast<unsigned>(n));
        return got < 0 ? 0 : static_cast<size_t>(got);
      },
      path, max_bytes);
  check_gz(path, file.f, out.size());
  return out;
}

}  // namespace

std::vector<uint8_t> read_file(const std::string& path, uint64_t max_bytes) {
  max_bytes = std::min(max_bytes, memory_bytes());
  if (ends_with(path, ".gz")) return read_gz(path, max_bytes);
  return read_plain(path, max_bytes);
}

std::vector<uint8_t> read_prefix(const std::string& path, size_t bytes) {
  std::vector<uint8_t> out(bytes);
  if (ends_with(path, ".gz")) {
    read_gz(path, 0, /*magic_only=*/true);  // a missing, empty or non-gzip file, said as such
    GzCloser file{gz_open_or_fail(path)};
    const int got = gzread(file.f, out.data(), static_cast<unsigned>(bytes));
    if (got < 0) check_gz(path, file.f, 0);
    out.resize(got < 0 ? 0 : static_cast<size_t>(got));
  } else {
    FileCloser file{open_or_fail(path)};
    out.resize(std::fread(out.data(), 1, bytes, file.f));
  }
  return out;
}

}  // namespace lockstep::data::io
