// What the fuzz harnesses share: the readers under test take file paths, so each input is
// written to a file of this process (on /dev/shm when there is one) and read back from there;
// an ls::Error is the expected outcome of bad bytes, anything else (another exception, a crash, a
// sanitizer report, a message that does not name the file) is a finding.
#pragma once

#include <zlib.h>

#include <unistd.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/error.h"
#include "lockstep/tensor.h"

namespace lockstep::fuzz {

// Reports a finding and aborts, so that libFuzzer keeps the input.
[[noreturn]] inline void die(const std::string& what) {
  std::fprintf(stderr, "\nFUZZ FINDING: %s\n", what.c_str());
  std::abort();
}

// A file named "lockstep-fuzz-<pid>-<tag><suffix>", rewritten with each input.
class InputFile {
 public:
  InputFile(const std::string& tag, const std::string& suffix) {
    const char* dir = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : std::getenv("TMPDIR");
    path_ = std::string(dir && *dir ? dir : "/tmp") + "/lockstep-fuzz-" +
            std::to_string(::getpid()) + "-" + tag + suffix;
  }
  ~InputFile() { std::remove(path_.c_str()); }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  const std::string& write(const void* data, size_t size) {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
    out.close();
    if (!out) die("cannot write the input file " + path_);
    return path_;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// An ls::Error from a reader must name the file it read.
inline void expect_names(const Error& e, const std::string& path) {
  if (std::string_view(e.what()).find(path) == std::string_view::npos)
    die("the error does not name the file '" + path + "': " + e.what());
}

// `bytes` compressed as a gzip stream (what a ".gz" file holds).
inline std::vector<uint8_t> gzip(const uint8_t* data, size_t size) {
  z_stream z{};
  if (deflateInit2(&z, 1, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) die("deflateInit2");
  std::vector<uint8_t> out(deflateBound(&z, size) + 32);
  z.next_in = const_cast<Bytef*>(data);
  z.avail_in = static_cast<uInt>(size);
  z.next_out = out.data();
  z.avail_out = static_cast<uInt>(out.size());
  if (deflate(&z, Z_FINISH) != Z_STREAM_END) die("deflate");
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

// How a dataset harness hands the input to a reader that takes plain or gzip files.
enum class Packing { Plain, GzipHere, RawGz };
// A plain file and a ".gz" file of one harness.
struct DatasetFiles {
  InputFile plain, gz;
  DatasetFiles(const std::string& tag, const std::string& suffix)
      : plain(tag, suffix), gz(tag, suffix + ".gz") {}
  // Writes the input as `packing` says: as it is to the plain file, gzip-compressed (the parser
  // behind zlib), or as it is to the ".gz" file (zlib's handling of a corrupt stream).
  const std::string& write(Packing packing, const uint8_t* data, size_t size) {
    if (packing == Packing::Plain) return plain.write(data, size);
    if (packing == Packing::RawGz) return gz.write(data, size);
    const std::vector<uint8_t> packed = gzip(data, size);
    return gz.write(packed.data(), packed.size());
  }
};

// A tensor's values as bytes (f32, f64, i32, i64, bool as one byte each).
inline std::vector<uint8_t> bytes_of(const Tensor& t) {
  std::vector<uint8_t> out;
  auto append = [&out](const auto& values) {
    const auto* p = reinterpret_cast<const uint8_t*>(values.data());
    out.insert(out.end(), p, p + values.size() * sizeof(values[0]));
  };
  switch (t.dtype()) {
    case DType::F32:
    case DType::BF16:
      append(t.to_vector<float>());
      break;
    case DType::F64:
      append(t.to_vector<double>());
      break;
    case DType::I32:
      append(t.to_vector<int32_t>());
      break;
    case DType::I64:
      append(t.to_vector<int64_t>());
      break;
    case DType::Bool:
      for (bool b : t.to_vector<bool>()) out.push_back(b);
      break;
    default:
      die("unexpected dtype");
  }
  return out;
}

}  // namespace lockstep::fuzz
