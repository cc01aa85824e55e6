// ls::SummaryWriter (lockstep/summary.h) and the bytes of its event files (io/tfevents.h).
// Events are encoded by the caller and queued; a background thread writes them in batches, so a
// step closure that logs never waits for a disk. Not here: reading event files (TensorBoard's).
//
// The protobuf messages are encoded by hand: the library would otherwise need TensorFlow's
// .proto files (event.proto, summary.proto, tensor.proto, tensor_shape.proto), protoc and
// libprotobuf for five messages of a few fields each. The field numbers and wire types below are
// those of tensorflow/core/util/event.proto and tensorflow/core/framework/{summary,tensor,
// tensor_shape,types}.proto; python/tests/test_tensorboard.py checks every record against
// TensorBoard's own protobuf classes byte for byte.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <isa-l/crc.h>

#include "io/tfevents.h"
#include "lockstep/error.h"
#include "lockstep/summary.h"

namespace lockstep::io::tfevents {

// CRC-32C from Intel's ISA-L (hardware instructions where the CPU has them). Debian 12 does not
// package Google's crc32c library; ISA-L's crc32_iscsi is the same CRC (iSCSI's, RFC 3720)
// without the final inversion.
uint32_t crc32c(std::string_view data) {
  uint32_t crc = 0xFFFFFFFFu;
  // crc32_iscsi takes an int length: long data in pieces.
  constexpr size_t kPiece = size_t{1} << 30;
  for (size_t at = 0; at < data.size(); at += kPiece) {
    const size_t n = std::min(kPiece, data.size() - at);
    crc = crc32_iscsi(reinterpret_cast<unsigned char*>(const_cast<char*>(data.data() + at)),
                      static_cast<int>(n), crc);
  }
  return ~crc;
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t crc = crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

namespace {

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

// The protobuf wire format, for the fields these messages use.
class Proto {
 public:
  enum Wire { Varint = 0, Fixed64 = 1, Bytes = 2, Fixed32 = 5 };
  Proto& varint(int field, uint64_t v) {
    key(field, Varint);
    raw_varint(v);
    return *this;
  }
  Proto& fixed64(int field, double v) {
    key(field, Fixed64);
    put_le(bytes_, std::bit_cast<uint64_t>(v), 8);
    return *this;
  }
  Proto& fixed32(int field, float v) {
    key(field, Fixed32);
    put_le(bytes_, std::bit_cast<uint32_t>(v), 4);
    return *this;
  }
  Proto& bytes(int field, std::string_view s) {
    key(field, Bytes);
    raw_varint(s.size());
    bytes_.append(s);
    return *this;
  }
  Proto& message(int field, const Proto& m) { return bytes(field, m.bytes_); }
  const std::string& str() const { return bytes_; }

 private:
  void key(int field, Wire wire) { raw_varint((static_cast<uint64_t>(field) << 3) | wire); }
  void raw_varint(uint64_t v) {
    while (v >= 0x80) {
      bytes_.push_back(static_cast<char>((v & 0x7F) | 0x80));
      v >>= 7;
    }
    bytes_.push_back(static_cast<char>(v));
  }
  std::string bytes_;
};

// tensorflow.Event: wall_time = 1 (double), step = 2 (int64), file_version = 3 (string),
// summary = 5 (Summary), session_log = 7 (SessionLog); proto3, so zero scalars are not written.
Proto event_head(double wall_time, int64_t step) {
  Proto e;
  if (wall_time != 0) e.fixed64(1, wall_time);
  if (step != 0) e.varint(2, static_cast<uint64_t>(step));  // int64: two's complement
  return e;
}

// tensorflow.Summary: value = 1 (Summary.Value).
std::string summary_event(double wall_time, int64_t step, const Proto& value) {
  return event_head(wall_time, step).message(5, Proto().message(1, value)).str();
}

}  // namespace

std::string frame_record(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  put_le(out, data.size(), 8);
  put_le(out, masked_crc32c(out), 4);
  out.append(data);
  put_le(out, masked_crc32c(data), 4);
  return out;
}

std::string file_version_event(double wall_time, int64_t step) {
  return event_head(wall_time, step).bytes(3, "brain.Event:2").str();
}

std::string session_start_event(double wall_time, int64_t step) {
  // tensorflow.SessionLog: status = 1 (enum SessionStatus; START = 1).
  return event_head(wall_time, step).message(7, Proto().varint(1, 1)).str();
}

std::string scalar_event(double wall_time, int64_t step, std::string_view tag, float value) {
  // Summary.Value: tag = 1, simple_value = 2 (float; in a oneof, so written even when 0).
  return summary_event(wall_time, step, Proto().bytes(1, tag).fixed32(2, value));
}

std::string text_event(double wall_time, int64_t step, std::string_view tag,
                       std::string_view text) {
  // TensorProto: dtype = 1 (DT_STRING = 7), tensor_shape = 2, string_val = 8.
  // TensorShapeProto: dim = 2; Dim: size = 1.
  Proto tensor;
  tensor.varint(1, 7).message(2, Proto().message(2, Proto().varint(1, 1))).bytes(8, text);
  // SummaryMetadata: plugin_data = 1; PluginData: plugin_name = 1 (its content, the text plugin's
  // empty TextPluginData, is not written).
  Proto metadata;
  metadata.message(1, Proto().bytes(1, "text"));
  // Summary.Value: tag = 1, tensor = 8, metadata = 9.
  return summary_event(wall_time, step,
                       Proto().bytes(1, tag).message(8, tensor).message(9, metadata));
}

}  // namespace lockstep::io::tfevents

namespace lockstep {

namespace tfevents = io::tfevents;

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) return "localhost";
  return host;
}

// PyTorch's default: runs/<%b%d_%H-%M-%S>_<host><comment>, local time, English month names
// whatever the locale.
std::string default_log_dir(const std::string& comment) {
  static const char* const kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                        "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char stamp[32];
  std::snprintf(stamp, sizeof stamp, "%s%02d_%02d-%02d-%02d", kMonths[tm.tm_mon % 12], tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec);
  return "runs/" + std::string(stamp) + "_" + host_name() + comment;
}

// Distinguishes the files one process opens in the same second (TensorFlow's global uid).
std::atomic<int64_t> g_file_count{0};

struct EventFile {
  std::string path;
  std::FILE* file = nullptr;
  std::string pending;  // framed records not yet written (guarded by Impl::mu)
};

}  // namespace

struct SummaryWriter::Impl {
  SummaryWriterOptions options;
  std::string log_dir;

  std::mutex io_mu;  // taken before mu: one batch written at a time, in order
  std::mutex mu;
  std::condition_variable wake;
  std::map<std::string, std::unique_ptr<EventFile>> files;  // by run directory
  EventFile* main = nullptr;
  int64_t queued = 0;
  bool stopping = false, closed = false;
  std::string error;  // a background write's failure, raised by the next call
  std::thread flusher;

  // A new event file in `dir` (created if need be), its file_version event written at once.
  // Called with mu held.
  EventFile& open_file(const std::string& dir) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec)
      throw Error("SummaryWriter: cannot create the log directory '" + dir + "' (" + ec.message() +
                  "): pass a log_dir in a directory you can write to");
    char name[64];
    std::snprintf(name, sizeof name, "%010lld", static_cast<long long>(std::time(nullptr)));
    auto f = std::make_unique<EventFile>();
    f->path = dir + "/events.out.tfevents." + name + "." + host_name() + "." +
              std::to_string(getpid()) + "." + std::to_string(g_file_count++) +
              options.filename_suffix;
    const int fd = ::open(f->path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) f->file = fdopen(fd, "wb");
    if (!f->file) {
      const int err = errno;
      if (fd >= 0) ::close(fd);
      throw Error("SummaryWriter: cannot create the event file '" + f->path + "' (" +
                  std::strerror(err) + "): pass a log_dir in a directory you can write to");
    }
    const std::string first = tfevents::frame_record(tfevents::file_version_event(now_seconds()));
    if (std::fwrite(first.data(), 1, first.size(), f->file) != first.size() ||
        std::fflush(f->file) != 0) {
      const int err = errno;
      std::fclose(f->file);
      throw Error("SummaryWriter: cannot write the event file '" + f->path + "' (" +
                  std::strerror(err) + "): is the disk full?");
    }
    EventFile& ref = *f;
    files.emplace(dir, std::move(f));
    return ref;
  }

  // Raises a background write's failure, and refuses a closed writer. Called with mu held.
  void check_usable() {
    if (!error.empty()) {
      std::string e = std::move(error);
      error.clear();
      throw Error(e);
    }
    if (closed)
      throw Error("SummaryWriter: the writer of '" + log_dir +
                  "' is closed: create a new SummaryWriter to log more");
  }

  void enqueue(EventFile& f, const std::string& event) {  // with mu held
    f.pending += tfevents::frame_record(event);
    if (++queued >= options.max_queue) wake.notify_one();
  }

  // Writes what is queued, in order, and flushes the files. Failures are kept for the next call.
  void write_pending() {
    std::lock_guard<std::mutex> io(io_mu);
    std::vector<std::pair<EventFile*, std::string>> batches;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (auto& [dir, f] : files)
        if (!f->pending.empty() && f->file) batches.emplace_back(f.get(), std::move(f->pending));
      for (auto& b : batches) b.first->pending.clear();
      queued = 0;
    }
    for (auto& [f, data] : batches) {
      if (std::fwrite(data.data(), 1, data.size(), f->file) == data.size() &&
          std::fflush(f->file) == 0)
        continue;
      const std::string e = "SummaryWriter: cannot write the event file '" + f->path + "' (" +
                            std::strerror(errno) + "): is the disk full, or was it removed?";
      std::lock_guard<std::mutex> lock(mu);
      if (error.empty()) error = e;
    }
  }

  void flush_loop() {
    const auto interval = std::chrono::duration<double>(options.flush_secs);
    std::unique_lock<std::mutex> lock(mu);
    while (!stopping) {
      wake.wait_for(lock, interval, [&] { return stopping || queued >= options.max_queue; });
      if (stopping) break;
      lock.unlock();
      write_pending();
      lock.lock();
    }
  }
};

SummaryWriter::SummaryWriter(const std::string& log_dir)
    : SummaryWriter(SummaryWriterOptions{.log_dir = log_dir}) {}

SummaryWriter::SummaryWriter(SummaryWriterOptions options) : impl_(std::make_unique<Impl>()) {
  if (options.max_queue < 1)
    throw Error("SummaryWriter: max_queue must be at least 1, got " +
                std::to_string(options.max_queue));
  if (!(options.flush_secs > 0) || options.flush_secs > 1e9)
    throw Error("SummaryWriter: flush_secs must be a positive number of seconds, got " +
                std::to_string(options.flush_secs));
  Impl& m = *impl_;
  m.log_dir = options.log_dir.empty() ? default_log_dir(options.comment) : options.log_dir;
  m.options = std::move(options);
  std::lock_guard<std::mutex> lock(m.mu);
  m.main = &m.open_file(m.log_dir);
  if (m.options.purge_step) {
    // PyTorch's purge: a file_version and a session-start event at the step.
    const double t = now_seconds();
    m.enqueue(*m.main, tfevents::file_version_event(t, *m.options.purge_step));
    m.enqueue(*m.main, tfevents::session_start_event(t, *m.options.purge_step));
  }
  m.flusher = std::thread([&m] { m.flush_loop(); });
}

SummaryWriter::~SummaryWriter() {
  try {
    close();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lockstep: %s\n", e.what());
  }
}

void SummaryWriter::add_scalar(const std::string& tag, double scalar_value,
                               std::optional<int64_t> global_step, std::optional<double> walltime) {
  const std::string event =
      tfevents::scalar_event(walltime.value_or(now_seconds()), global_step.value_or(0), tag,
                             static_cast<float>(scalar_value));
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->check_usable();
  impl_->enqueue(*impl_->main, event);
}

void SummaryWriter::add_scalars(const std::string& main_tag,
                                const std::vector<std::pair<std::string, double>>& tag_scalar_dict,
                                std::optional<int64_t> global_step,
                                std::optional<double> walltime) {
  const double t = walltime.value_or(now_seconds());
  std::string run_prefix = main_tag;
  std::replace(run_prefix.begin(), run_prefix.end(), '/', '_');
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->check_usable();
  for (const auto& [tag, value] : tag_scalar_dict) {
    const std::string dir = impl_->log_dir + "/" + run_prefix + "_" + tag;
    auto it = impl_->files.find(dir);
    EventFile& f = it != impl_->files.end() ? *it->second : impl_->open_file(dir);
    impl_->enqueue(
        f, tfevents::scalar_event(t, global_step.value_or(0), main_tag, static_cast<float>(value)));
  }
}

void SummaryWriter::add_text(const std::string& tag, const std::string& text_string,
                             std::optional<int64_t> global_step, std::optional<double> walltime) {
  const std::string event =
      tfevents::text_event(walltime.value_or(now_seconds()), global_step.value_or(0),
                           tag + "/text_summary", text_string);
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->check_usable();
  impl_->enqueue(*impl_->main, event);
}

void SummaryWriter::flush() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->closed) return;  // close() flushed
    impl_->check_usable();
  }
  impl_->write_pending();
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->check_usable();
}

void SummaryWriter::close() {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (m.closed) return;
    m.closed = true;
    m.stopping = true;
  }
  m.wake.notify_all();
  if (m.flusher.joinable()) m.flusher.join();
  m.write_pending();
  std::string failure;
  {
    std::lock_guard<std::mutex> io(m.io_mu);
    std::lock_guard<std::mutex> lock(m.mu);
    failure = std::move(m.error);
    m.error.clear();
    for (auto& [dir, f] : m.files) {
      if (f->file && std::fclose(f->file) != 0 && failure.empty())
        failure = "SummaryWriter: cannot close the event file '" + f->path + "' (" +
                  std::strerror(errno) + "): is the disk full?";
      f->file = nullptr;
    }
  }
  if (!failure.empty()) throw Error(failure);
}

const std::string& SummaryWriter::log_dir() const { return impl_->log_dir; }

const std::string& SummaryWriter::file_name() const { return impl_->main->path; }

}  // namespace lockstep
