// safetensors files (lockstep/io.h): an 8-byte little-endian header length N, N bytes of JSON
// header (padded with spaces to a multiple of 8), then the raw data buffer. Saving is atomic
// (temporary file, fsync, rename, directory fsync); loading checks the whole header against the
// file before creating any tensor. Not here: JSON itself (json.h), what a checkpoint contains.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <vector>

#include <zlib.h>

#include "io/json.h"
#include "lockstep/io.h"
#include "lockstep/ops.h"
#include "runtime/lazy.h"
#include "util/check.h"
#include "util/files.h"

namespace lockstep::io {

// Data is written and read as the host's bytes; the format is little-endian.
static_assert(std::endian::native == std::endian::little,
              "safetensors I/O assumes a little-endian host");

namespace {

using util::cat;

// The reference implementation refuses headers this large; so do we.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kMetadataKey = "__metadata__";

const char* format_name(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return "F32";
    case DType::F64:
      return "F64";
    case DType::I32:
      return "I32";
    case DType::I64:
      return "I64";
    case DType::Bool:
      return "BOOL";
    case DType::BF16:
      return "BF16";
    case DType::U8:
      return "U8";
  }
  return "?";
}

std::optional<DType> parse_format_name(const std::string& name) {
  for (DType d :
       {DType::F32, DType::F64, DType::I32, DType::I64, DType::Bool, DType::BF16, DType::U8})
    if (name == format_name(d)) return d;
  return std::nullopt;
}

std::string os_error(int err) { return std::generic_category().message(err); }

std::string quoted_list(const std::vector<int64_t>& values) {
  std::string s = "[";
  for (size_t i = 0; i < values.size(); ++i) s += cat(i ? ", " : "", values[i]);
  return s + "]";
}

// Little-endian u64 from/to 8 bytes.
uint64_t decode_u64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

uint32_t checksum(const unsigned char* data, size_t bytes) {
  uLong crc = ::crc32(0L, Z_NULL, 0);
  while (bytes > 0) {  // zlib takes uInt lengths
    const auto n = static_cast<uInt>(std::min<size_t>(bytes, size_t{1} << 30));
    crc = ::crc32(crc, data, n);
    data += n;
    bytes -= n;
  }
  return static_cast<uint32_t>(crc);
}

std::string hex8(uint32_t v) {
  static const char* digits = "0123456789abcdef";
  std::string s(8, '0');
  for (int i = 7; i >= 0; --i, v >>= 4) s[static_cast<size_t>(i)] = digits[v & 15];
  return s;
}

std::string encode_u64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return s;
}

// ---- saving ----------------------------------------------------------------------------------

// A file written under a temporary name ("<path>.tmp-<pid>") and renamed over `path` by
// commit(); destroyed without commit (an exception), it closes and removes the temporary file.
// A process killed while saving leaves its temporary file: the next save removes those of
// processes that no longer run.
// Only a regular file (or nothing) at `path` is replaced (util/files.h: never a FIFO, a device,
// a directory or a symbolic link), and it keeps its permission bits. The rename gives the path a
// new file: other hard links to the old one keep the old contents (never half of a save).
class AtomicFile {
 public:
  AtomicFile(const std::string& path, const Loc& loc)
      : path_(path), temp_(cat(path, ".tmp-", ::getpid())), loc_(loc) {
    remove_stale_temporaries();  // before writing: on a nearly full disk they may be the room
    int mode = -1;
    if (!util::unsavable(path, &mode).empty()) check_save_path(path, loc);
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0666);
    if (fd_ < 0)
      fail_os("cannot create the temporary file", temp_, "",
              "Check that the directory exists and is writable");
    if (mode >= 0 && ::fchmod(fd_, static_cast<mode_t>(mode)) != 0)
      fail_os("cannot give the temporary file", temp_, " the permissions of the file it replaces",
              "Check the directory's permissions");
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!renamed_) ::unlink(temp_.c_str());
  }

  void write(const void* data, size_t bytes) {
    const char* p = static_cast<const char*>(data);
    while (bytes > 0) {
      const ssize_t n = ::write(fd_, p, std::min<size_t>(bytes, size_t{1} << 30));
      if (n < 0 && errno == EINTR) continue;
      if (n == 0) errno = EIO;
      if (n <= 0) {
        const int err = n == 0 ? EIO : errno;
        const std::string others = live_temporaries();
        errno = err;
        fail_os("cannot write", temp_, "",
                others.empty() ? "Check free disk space and quotas"
                               : cat("Check free disk space and quotas; the directory also holds ",
                                     others, " of saves still running")
                                     .c_str());
      }
      p += n;
      bytes -= static_cast<size_t>(n);
    }
  }

  void commit() {
    if (::fsync(fd_) != 0) fail_os("cannot fsync", temp_, "", "Check the disk");
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail_os("cannot close", temp_, "", "Check the disk");
    if (::rename(temp_.c_str(), path_.c_str()) != 0)
      fail_os("cannot rename", temp_, " over it",
              "Check that the path is not a directory and the directory is writable");
    renamed_ = true;
    const std::string dir = directory_of(path_);
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
      fail_os("the file is written, but cannot open its directory", dir, " to fsync it",
              "The new file may not survive a power loss");
    // Some file systems cannot fsync a directory (EINVAL): nothing more can be done there.
    if (::fsync(dfd) != 0 && errno != EINVAL && errno != ENOTSUP) {
      const int err = errno;
      ::close(dfd);
      errno = err;
      fail_os("the file is written, but cannot fsync its directory", dir, "",
              "The new file may not survive a power loss");
    }
    ::close(dfd);
    remove_stale_temporaries();
  }

 private:
  // Temporary files of this path of other processes that still run (or cannot be checked):
  // "2 temporary files (1.5 GiB: a.tmp-123, a.tmp-456)", empty when there are none.
  std::string live_temporaries() const {
    const std::string dir = directory_of(path_);
    const std::string prefix = cat(base_name(), ".tmp-");
    DIR* d = ::opendir(dir.c_str());
    if (!d) return "";
    std::string names;
    int64_t count = 0;
    uint64_t bytes = 0;
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name.compare(0, prefix.size(), prefix) != 0 || cat(dir, "/", name) == temp_) continue;
      struct stat st {};
      if (::stat(cat(dir, "/", name).c_str(), &st) == 0) bytes += static_cast<uint64_t>(st.st_size);
      names += cat(count++ ? ", " : "", name);
    }
    ::closedir(d);
    if (count == 0) return "";
    return cat(count, " temporary file", count == 1 ? "" : "s", " (",
               static_cast<double>(bytes) / (1 << 20), " MiB: ", names, ")");
  }

  std::string base_name() const {
    const size_t slash = path_.find_last_of('/');
    return slash == std::string::npos ? path_ : path_.substr(slash + 1);
  }

  // Temporary files of this path left by processes that are gone (killed while saving).
  void remove_stale_temporaries() const {
    const std::string dir = directory_of(path_);
    const size_t slash = path_.find_last_of('/');
    const std::string prefix =
        cat(slash == std::string::npos ? path_ : path_.substr(slash + 1), ".tmp-");
    DIR* d = ::opendir(dir.c_str());
    if (!d) return;  // the save itself succeeded; the leftovers stay
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name.compare(0, prefix.size(), prefix) != 0) continue;
      const char* digits = name.c_str() + prefix.size();
      char* end = nullptr;
      const long pid = std::strtol(digits, &end, 10);
      if (end == digits || *end != '\0' || pid <= 0) continue;
      if (pid == ::getpid() || ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH)
        continue;  // ours (another save of this process), or a process still running
      ::unlink(cat(dir, "/", name).c_str());
    }
    ::closedir(d);
  }

  static std::string directory_of(const std::string& path) {
    const size_t slash = path.find_last_of('/');
    if (slash == std::string::npos) return ".";
    if (slash == 0) return "/";
    return path.substr(0, slash);
  }

  // Takes errno as set by the failed call: callers pass only string literals and members, whose
  // concatenation happens inside, after errno is saved.
  [[noreturn]] void fail_os(const char* what, const std::string& file, const char* more,
                            const char* fix) const {
    const int err = errno;
    util::fail(loc_, "save_safetensors",
               cat("saving '", path_, "': ", what, " '", file, "'", more, ": ", os_error(err)),
               fix);
  }

  std::string path_;
  std::string temp_;
  Loc loc_;
  int fd_ = -1;
  bool renamed_ = false;
};

void check_text(const std::string& text, const std::string& what, const std::string& path,
                const Loc& loc) {
  if (!json::is_valid_utf8(text))
    util::fail(loc, "save_safetensors", cat("saving '", path, "': ", what, " is not valid UTF-8"),
               "Use UTF-8 names and metadata: other tools cannot read anything else");
}

// The header of `tensors`, padded with spaces to a multiple of 8 bytes as the reference
// implementation does, with each tensor's data placed right after the previous one's.
std::string make_header(const std::vector<TensorSource>& tensors, const Metadata& metadata) {
  std::string h = "{";
  bool first = true;
  if (!metadata.empty()) {
    json::append_string(h, kMetadataKey);
    h += ":{";
    for (const auto& [key, value] : metadata) {
      if (!first) h += ',';
      first = false;
      json::append_string(h, key);
      h += ':';
      json::append_string(h, value);
    }
    h += '}';
    first = false;
  }
  uint64_t offset = 0;
  for (const TensorSource& t : tensors) {
    const uint64_t bytes = static_cast<uint64_t>(shape_numel(t.shape)) * dtype_size(t.dtype);
    if (!first) h += ',';
    first = false;
    json::append_string(h, t.name);
    h += cat(":{\"dtype\":\"", format_name(t.dtype), "\",\"shape\":[");
    for (size_t i = 0; i < t.shape.size(); ++i) h += cat(i ? "," : "", t.shape[i]);
    h += cat("],\"data_offsets\":[", offset, ",", offset + bytes, "]}");
    offset += bytes;
  }
  h += '}';
  h.append((8 - h.size() % 8) % 8, ' ');
  return h;
}

// ---- loading ---------------------------------------------------------------------------------

// An open file descriptor, closed on scope exit.
struct FileHandle {
  int fd = -1;
  ~FileHandle() {
    if (fd >= 0) ::close(fd);
  }
};

struct Entry {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

class Loader {
 public:
  Loader(const std::string& path, const Loc& loc) : path_(path), loc_(loc) {}

  Loaded load(Device device, const Vet& vet) {
    open_file();
    const std::string header = read_header();
    json::Value root;
    try {
      root = json::parse(header);
    } catch (const json::ParseError& e) {
      fail(cat("invalid JSON in the header at byte ", e.offset(), " of ", header.size(), ": ",
               e.what()));
    }
    Loaded out;
    const std::vector<Entry> entries = check_header(root, out.metadata);
    check_layout(entries);
    const std::map<std::string, uint32_t> checksums = read_checksums(out.metadata, entries);
    out.metadata.erase(kChecksumKey);
    out.checksummed = !checksums.empty() || entries.empty();
    std::set<std::string> wanted;
    if (vet) {
      std::vector<TensorInfo> infos;
      for (const Entry& e : entries) infos.push_back({e.name, e.dtype, e.shape});
      wanted = vet(out.metadata, infos);
    }
    // What is read must fit in memory: a bad_alloc would name nothing.
    uint64_t total = 0;
    for (const Entry& e : entries)
      if (!vet || wanted.count(e.name)) total += e.end - e.begin;
    const uint64_t memory = static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) *
                            static_cast<uint64_t>(::sysconf(_SC_PAGE_SIZE));
    if (memory > 0 && total > memory)
      fail(cat("its tensors need ", total, " bytes, more than this machine's memory (", memory,
               " bytes): the header claims sizes the data cannot have"));
    for (const Entry& e : entries) {
      if (vet && !wanted.count(e.name)) continue;
      std::vector<unsigned char> data;
      try {
        data.resize(e.end - e.begin);
      } catch (const std::bad_alloc&) {
        fail_tensor(e.name, cat("needs ", e.end - e.begin, " bytes, which cannot be allocated"));
      }
      read_at(data.data(), data.size(), data_start_ + e.begin, e.name);
      if (auto c = checksums.find(e.name); c != checksums.end()) {
        const uint32_t crc = checksum(data.data(), data.size());
        if (crc != c->second)
          fail_tensor(e.name,
                      cat("has data whose CRC-32 is ", hex8(crc), ", not the ", hex8(c->second),
                          " recorded when it was written: the file is "
                          "corrupted (bit flips, or a write that did not complete)"));
      }
      // Only 0 and 1 are valid bools; any other byte is taken as true rather than left to become
      // undefined behaviour in a kernel.
      if (e.dtype == DType::Bool)
        for (unsigned char& b : data) b = b != 0;
      out.tensors.emplace_back(e.name, from_blob(data.data(), e.shape, e.dtype, device, loc_));
    }
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    util::fail(loc_, "load_safetensors", cat("'", path_, "': ", what),
               "Check that the file is a complete safetensors file (re-save or re-download it)");
  }
  [[noreturn]] void fail_tensor(const std::string& name, const std::string& what) const {
    fail(cat("tensor '", name, "' ", what));
  }

  void open_file() {
    util::RegularFile f = util::open_regular(path_);
    if (!f.problem.empty())
      util::fail(loc_, "load_safetensors",
                 cat("'", util::shown(path_), "' ", f.problem, ", not a file to load"),
                 "Give the path of a safetensors file");
    if (f.fd < 0)
      util::fail(loc_, "load_safetensors", cat("cannot open '", path_, "': ", os_error(f.error)),
                 "Check the path and its permissions");
    file_.fd = f.fd;
    struct stat st {};
    if (::fstat(file_.fd, &st) != 0) fail(cat("cannot stat it: ", os_error(errno)));
    size_ = static_cast<uint64_t>(st.st_size);
  }

  void read_at(void* dst, size_t bytes, uint64_t offset, const std::string& what) {
    char* p = static_cast<char*>(dst);
    while (bytes > 0) {
      const ssize_t n = ::pread(file_.fd, p, std::min<size_t>(bytes, size_t{1} << 30),
                                static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail(cat("cannot read ", what, ": ", os_error(errno)));
      if (n == 0)
        fail(cat("truncated: the file ended while reading ", what, " at byte ", offset,
                 " (it changed while being read?)"));
      p += n;
      bytes -= static_cast<size_t>(n);
      offset += static_cast<uint64_t>(n);
    }
  }

  std::string read_header() {
    if (size_ < 8)
      fail(cat("the file is ", size_, " bytes, too short for the 8-byte header length",
               size_ == 0 ? " (empty file)" : " (truncated)"));
    unsigned char len[8];
    read_at(len, 8, 0, "the header length");
    const uint64_t n = decode_u64(len);
    if (n > size_ - 8)
      fail(cat("header length ", n, " is larger than the file allows (the file is ", size_,
               " bytes, so at most ", size_ - 8, "): the file is truncated or not safetensors"));
    if (n >= kMaxHeaderBytes)
      fail(cat("header length ", n, " is over the limit of ", kMaxHeaderBytes, " bytes"));
    std::string header(n, '\0');
    read_at(header.data(), n, 8, "the header");
    data_start_ = 8 + n;
    return header;
  }

  // Checks the header's shape and returns its tensors in header order.
  std::vector<Entry> check_header(const json::Value& root, Metadata& metadata) {
    if (root.kind != json::Value::Kind::Object)
      fail(cat("the header must be a JSON object, found ", json::kind_name(root.kind)));
    std::vector<Entry> entries;
    std::set<std::string> names;
    bool seen_metadata = false;
    for (const auto& [key, value] : root.object) {
      if (key == kMetadataKey) {
        if (seen_metadata) fail("the header has \"__metadata__\" twice");
        seen_metadata = true;
        read_metadata(value, metadata);
        continue;
      }
      if (!names.insert(key).second) fail_tensor(key, "appears twice: duplicate tensor name");
      entries.push_back(read_entry(key, value));
    }
    return entries;
  }

  void read_metadata(const json::Value& value, Metadata& metadata) {
    if (value.kind == json::Value::Kind::Null) return;
    if (value.kind != json::Value::Kind::Object)
      fail(cat("\"__metadata__\" must be an object of strings, found ",
               json::kind_name(value.kind)));
    for (const auto& [key, item] : value.object) {
      if (item.kind != json::Value::Kind::String)
        fail(cat("\"__metadata__\" value of '", key, "' must be a string, found ",
                 json::kind_name(item.kind)));
      if (!metadata.emplace(key, item.text).second)
        fail(cat("\"__metadata__\" has the key '", key, "' twice"));
    }
  }

  // The integers of a JSON array, or a failure naming `field` of tensor `name`.
  std::vector<int64_t> integers(const std::string& name, const char* field,
                                const json::Value& value) {
    if (value.kind != json::Value::Kind::Array)
      fail_tensor(name, cat("has \"", field, "\" that is ", json::kind_name(value.kind),
                            ", not an array of integers"));
    std::vector<int64_t> out;
    for (const json::Value& v : value.array) {
      if (v.kind != json::Value::Kind::Integer)
        fail_tensor(name, cat("has \"", field, "\" holding ", json::kind_name(v.kind),
                              v.kind == json::Value::Kind::Number ? " (" + v.text + ")" : "",
                              ", not an integer"));
      out.push_back(v.integer);
    }
    return out;
  }

  Entry read_entry(const std::string& name, const json::Value& value) {
    if (value.kind != json::Value::Kind::Object)
      fail_tensor(name, cat("must be an object with dtype, shape and data_offsets, found ",
                            json::kind_name(value.kind)));
    const json::Value* fields[3] = {nullptr, nullptr, nullptr};
    static constexpr const char* kFields[3] = {"dtype", "shape", "data_offsets"};
    for (const auto& [key, item] : value.object) {
      for (int f = 0; f < 3; ++f) {
        if (key != kFields[f]) continue;
        if (fields[f]) fail_tensor(name, cat("has \"", key, "\" twice"));
        fields[f] = &item;
      }
    }
    for (int f = 0; f < 3; ++f)
      if (!fields[f]) fail_tensor(name, cat("has no \"", kFields[f], "\""));

    Entry e;
    e.name = name;
    if (fields[0]->kind != json::Value::Kind::String)
      fail_tensor(name,
                  cat("has a dtype that is ", json::kind_name(fields[0]->kind), ", not a string"));
    const std::optional<DType> dtype = parse_format_name(fields[0]->text);
    if (!dtype)
      fail_tensor(name, cat("has unsupported dtype '", fields[0]->text,
                            "' (lockstep reads F32, F64, I32, I64 and BOOL)"));
    e.dtype = *dtype;

    e.shape = integers(name, "shape", *fields[1]);
    for (int64_t d : e.shape)
      if (d < 0) fail_tensor(name, cat("has a negative dimension in shape ", shape_str(e.shape)));
    // numel * dtype_size, refusing overflow (a shape cannot need more bytes than the file has).
    uint64_t bytes = dtype_size(e.dtype);
    for (int64_t d : e.shape)
      if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes))
        fail_tensor(name, cat("has shape ", shape_str(e.shape), ", too large to exist"));

    const std::vector<int64_t> offsets = integers(name, "data_offsets", *fields[2]);
    if (offsets.size() != 2)
      fail_tensor(name,
                  cat("has data_offsets ", quoted_list(offsets), ", not a pair [begin, end]"));
    if (offsets[0] < 0 || offsets[1] < 0)
      fail_tensor(name, cat("has negative data_offsets ", quoted_list(offsets)));
    if (offsets[0] > offsets[1])
      fail_tensor(
          name, cat("has data_offsets ", quoted_list(offsets), " out of order (begin after end)"));
    e.begin = static_cast<uint64_t>(offsets[0]);
    e.end = static_cast<uint64_t>(offsets[1]);
    const uint64_t data_size = size_ - data_start_;
    if (e.end > data_size)
      fail(cat("truncated or offsets out of range: the data ends at byte ", size_, " but tensor '",
               name, "' needs bytes up to ", data_start_ + e.end, " (its data_offsets ",
               quoted_list(offsets), " reach past the ", data_size, "-byte data buffer)"));
    if (e.end - e.begin != bytes)
      fail_tensor(
          name, cat("has shape ", shape_str(e.shape), " of ", format_name(e.dtype),
                    ", which needs ", bytes, " bytes, but its data_offsets ", quoted_list(offsets),
                    " span ", e.end - e.begin, " bytes: size mismatch"));
    return e;
  }

  // The tensors cover the data buffer exactly, in offset order: no two share a byte, no byte
  // lies between two or after the last (the reference reader's rule; a header length changed
  // by a few bytes of its padding shifts every tensor, and is caught here).
  void check_layout(const std::vector<Entry>& entries) const {
    std::vector<const Entry*> by_begin;
    for (const Entry& e : entries) by_begin.push_back(&e);
    std::stable_sort(by_begin.begin(), by_begin.end(), [](const Entry* a, const Entry* b) {
      return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
    });
    uint64_t covered = 0;
    const Entry* prev = nullptr;
    for (const Entry* next : by_begin) {
      if (next->begin < covered)
        fail(cat("tensors '", prev->name, "' (data_offsets [", prev->begin, ", ", prev->end,
                 "]) and '", next->name, "' (data_offsets [", next->begin, ", ", next->end,
                 "]) overlap"));
      if (next->begin > covered)
        fail(cat("bytes [", covered, ", ", next->begin, ") of the data belong to no tensor (",
                 prev ? cat("between '", prev->name, "' and '", next->name, "'")
                      : cat("before '", next->name, "'"),
                 "): safetensors data is contiguous, so the header or its length is wrong"));
      covered = next->end;
      prev = next;
    }
    const uint64_t data_size = size_ - data_start_;
    if (covered != data_size)
      fail(cat("the data area has ", data_size, " bytes but its tensors cover ", covered,
               ": the header length is wrong (every tensor would be read shifted) or the file "
               "has bytes after its last tensor"));
  }

  // The checksums the writer recorded (kChecksumKey), by tensor; none when the file has none.
  std::map<std::string, uint32_t> read_checksums(const Metadata& metadata,
                                                 const std::vector<Entry>& entries) const {
    std::map<std::string, uint32_t> out;
    auto it = metadata.find(kChecksumKey);
    if (it == metadata.end()) return out;
    json::Value v;
    try {
      v = json::parse(it->second);
    } catch (const json::ParseError& e) {
      fail(cat("its checksums (metadata \"", kChecksumKey, "\") are not JSON: ", e.what()));
    }
    if (v.kind != json::Value::Kind::Object)
      fail(cat("its checksums (metadata \"", kChecksumKey, "\") are not a JSON object"));
    for (const auto& [name, crc] : v.object) {
      char* end = nullptr;
      const unsigned long value =
          crc.kind == json::Value::Kind::String ? std::strtoul(crc.text.c_str(), &end, 16) : 0;
      if (crc.kind != json::Value::Kind::String || crc.text.size() != 8 || *end != '\0')
        fail(cat("its checksum of '", name, "' is not 8 hex digits"));
      out[name] = static_cast<uint32_t>(value);
    }
    for (const Entry& e : entries)
      if (!out.count(e.name)) fail_tensor(e.name, "has no checksum, though the file records them");
    if (out.size() != entries.size()) fail("its checksums name tensors the file does not have");
    return out;
  }

  std::string path_;
  Loc loc_;
  FileHandle file_;
  uint64_t size_ = 0;
  uint64_t data_start_ = 0;
};

}  // namespace

void check_save_path(const std::string& path, Loc loc) {
  int mode = -1;
  if (const std::string problem = util::unsavable(path, &mode); !problem.empty())
    util::fail(loc, "save_safetensors", cat("saving '", util::shown(path), "': the path ", problem),
               "Save to a regular file or a new path");
}

std::vector<TensorSource> sources_of(const TensorMap& tensors, const std::string& path, Loc loc) {
  std::vector<TensorSource> sources;
  for (const auto& [name, t] : tensors) {
    if (!t.defined())
      util::fail(loc, "save_safetensors",
                 cat("saving '", path, "': tensor '", name, "' is an empty handle"),
                 "Pass only defined tensors");
    // Its bytes as they go to the file (bools as 0/1).
    // (An init-capture: clang's OpenMP mode cannot capture a structured binding.)
    sources.push_back({name, t.dtype(), t.shape(), [t = t, loc] {
                         std::vector<unsigned char> bytes = runtime::read_bytes(t, loc, "save");
                         if (t.dtype() == DType::Bool)
                           for (unsigned char& b : bytes) b = b != 0;
                         return bytes;
                       }});
  }
  return sources;
}

void save_safetensors(const std::string& path, const TensorMap& tensors, const Metadata& metadata,
                      Loc loc) {
  save_safetensors_streamed(path, sources_of(tensors, path, loc), metadata, loc);
}

void save_safetensors_streamed(const std::string& path, const std::vector<TensorSource>& tensors,
                               const Metadata& metadata, Loc loc) {
  std::set<std::string> names;
  for (const TensorSource& t : tensors) {
    if (t.name == kMetadataKey)
      util::fail(loc, "save_safetensors",
                 cat("saving '", path, "': \"__metadata__\" cannot name a tensor"),
                 "Rename the tensor; pass metadata as the metadata argument");
    if (!names.insert(t.name).second)
      util::fail(loc, "save_safetensors",
                 cat("saving '", path, "': duplicate tensor name '", t.name, "'"),
                 "Give each tensor its own name");
    check_text(t.name, cat("tensor name '", t.name, "'"), path, loc);
  }
  for (const auto& [key, value] : metadata) {
    check_text(key, cat("metadata key '", key, "'"), path, loc);
    check_text(value, cat("metadata value of '", key, "'"), path, loc);
    if (key == kChecksumKey)
      util::fail(loc, "save_safetensors",
                 cat("saving '", path, "': metadata key '", key, "' is the writer's own"),
                 "Name it otherwise");
  }
  auto bytes_of = [&](const TensorSource& t) {
    std::vector<unsigned char> bytes = t.read();
    LS_INTERNAL_CHECK(
        bytes.size() == static_cast<size_t>(shape_numel(t.shape)) * dtype_size(t.dtype), "tensor '",
        t.name, "' read ", bytes.size(), " bytes");
    return bytes;
  };
  // The checksums go in the header, before the data: a first pass computes them (one tensor's
  // bytes in memory at a time).
  std::string checksums = "{";
  for (const TensorSource& t : tensors) {
    const std::vector<unsigned char> bytes = bytes_of(t);
    if (checksums.size() > 1) checksums += ',';
    json::append_string(checksums, t.name);
    checksums += cat(":\"", hex8(checksum(bytes.data(), bytes.size())), "\"");
  }
  checksums += '}';
  Metadata with_checksums = metadata;
  with_checksums.emplace(kChecksumKey, checksums);
  const std::string header = make_header(tensors, with_checksums);

  AtomicFile file(path, loc);
  file.write(encode_u64(header.size()).data(), 8);
  file.write(header.data(), header.size());
  for (const TensorSource& t : tensors) {
    const std::vector<unsigned char> bytes = bytes_of(t);
    file.write(bytes.data(), bytes.size());
  }
  file.commit();
}

Loaded load_safetensors(const std::string& path, Device device, Loc loc) {
  return Loader(path, loc).load(device, nullptr);
}

Loaded load_safetensors(const std::string& path, Device device, const Vet& vet, Loc loc) {
  return Loader(path, loc).load(device, vet);
}

}  // namespace lockstep::io
