// Step timelines (lockstep/profiler.h; the span sites' API is runtime/profiler.h): events kept
// in a buffer per thread, handed in chunks to a writer thread when a buffer grows large, and
// written at stop() (or at exit) as one Chrome Trace Event JSON file per process.
// Not here: where the spans are (each site names its own, one or two lines).
#include "runtime/profiler.h"

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "io/json.h"
#include "lockstep/dist.h"
#include "lockstep/error.h"
#include "lockstep/profiler.h"
#include "lockstep/runtime.h"
#include "runtime/context.h"
#include "runtime/executor.h"
#include "util/check.h"
#include "util/options.h"

namespace lockstep::runtime::prof {

std::atomic<int> g_level{0};

namespace {

using io::json::append_string;
using util::cat;

struct Event {
  char ph;  // 'X' complete, 'C' counter
  const char* category;
  std::string name;
  int64_t ts_ns, dur_ns;
  std::string args;
};

struct ThreadBuffer {
  int tid = 0;
  std::string name;
  std::mutex mu;  // the owning thread appends, stop() takes
  std::vector<Event> events;
  bool used = false;  // recorded since start(): named in the trace
};

struct Chunk {
  int tid;
  std::vector<Event> events;
};

// A buffer this large goes to the writer thread, so a long trace does not hold every event.
constexpr size_t kChunkEvents = size_t{1} << 14;

struct State {
  std::mutex session_mu;  // start() and stop()
  std::mutex mu;          // everything below
  std::condition_variable cv;
  std::vector<std::shared_ptr<ThreadBuffer>> buffers;  // every thread that ever recorded
  std::deque<Chunk> full;
  bool stopping = false;
  std::thread writer;
  std::string dir, path, error;
  std::FILE* file = nullptr;  // opened at the first write: the rank is known by then
  bool first_event = true;
  bool exit_hook = false;
};

State& state() {
  static State* s = new State;  // never destroyed: threads may record during exit
  return *s;
}

thread_local ThreadBuffer* t_buffer = nullptr;
thread_local const char* t_name = nullptr;

int this_tid() { return static_cast<int>(::syscall(SYS_gettid)); }

std::string system_thread_name(int tid) {
  if (t_name) return t_name;
  if (tid == ::getpid()) return "main";
  char name[64] = {};
  if (pthread_getname_np(pthread_self(), name, sizeof name) == 0 && name[0]) return name;
  return cat("thread ", tid);
}

ThreadBuffer& buffer() {
  if (t_buffer) return *t_buffer;
  auto b = std::make_shared<ThreadBuffer>();
  b->tid = this_tid();
  b->name = system_thread_name(b->tid);
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.buffers.push_back(b);
  t_buffer = b.get();
  return *b;
}

void record(Event e) {
  if (!on()) return;  // stopped meanwhile
  ThreadBuffer& b = buffer();
  std::vector<Event> chunk;
  {
    std::lock_guard<std::mutex> lock(b.mu);
    b.events.push_back(std::move(e));
    b.used = true;
    if (b.events.size() < kChunkEvents) return;
    chunk.swap(b.events);
  }
  State& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.full.push_back({b.tid, std::move(chunk)});
  }
  s.cv.notify_one();
}

// ---- JSON ---------------------------------------------------------------------------------

// Microseconds, to the nanosecond.
void append_us(std::string& out, int64_t ns) {
  char text[32];
  std::snprintf(text, sizeof text, "%lld.%03lld", static_cast<long long>(ns / 1000),
                static_cast<long long>(ns % 1000));
  out += text;
}

std::string host_name() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0 || !host[0]) return "localhost";
  return host;
}

int rank_or_none() { return dist::world_size() > 1 ? dist::rank() : -1; }

std::string event_json(const Event& e, int pid, int tid) {
  std::string o = "{\"ph\":\"";
  o += e.ph;
  o += "\",\"cat\":";
  append_string(o, e.category);
  o += ",\"name\":";
  append_string(o, e.name);
  o += cat(",\"pid\":", pid, ",\"tid\":", tid, ",\"ts\":");
  append_us(o, e.ts_ns);
  if (e.ph == 'X') {
    o += ",\"dur\":";
    append_us(o, e.dur_ns);
  }
  if (!e.args.empty()) o += cat(",\"args\":{", e.args, "}");
  o += '}';
  return o;
}

std::string metadata_json(const char* name, int pid, int tid, const std::string& args) {
  return cat("{\"ph\":\"M\",\"name\":\"", name, "\",\"pid\":", pid, ",\"tid\":", tid,
             ",\"ts\":0,\"args\":{", args, "}}");
}

// Caller is the writer thread, or stop() once the writer has ended.
void write_text(State& s, const std::string& text) {
  if (!s.error.empty()) return;
  if (!s.file) {
    const int rank = rank_or_none();
    s.path = cat(s.dir, "/lockstep-", host_name(), "-", ::getpid(),
                 rank >= 0 ? cat("-rank", rank) : std::string(), ".trace.json");
    s.file = std::fopen(s.path.c_str(), "w");
    if (!s.file) {
      s.error = cat("cannot write the trace ", s.path, ": ", std::strerror(errno));
      return;
    }
    std::fputs("{\"traceEvents\":[\n", s.file);
    s.first_event = true;
  }
  if (!s.first_event) std::fputs(",\n", s.file);
  s.first_event = false;
  std::fputs(text.c_str(), s.file);
}

void write_chunk(State& s, const Chunk& c) {
  const int pid = ::getpid();
  std::string text;
  for (const Event& e : c.events) {
    if (!text.empty()) text += ",\n";
    text += event_json(e, pid, c.tid);
  }
  if (!text.empty()) write_text(s, text);
}

void writer_loop() {
  name_thread("lockstep trace writer");
  State& s = state();
  std::unique_lock<std::mutex> lock(s.mu);
  for (;;) {
    s.cv.wait(lock, [&] { return s.stopping || !s.full.empty(); });
    while (!s.full.empty()) {
      Chunk c = std::move(s.full.front());
      s.full.pop_front();
      lock.unlock();
      write_chunk(s, c);
      lock.lock();
    }
    if (s.stopping) return;
  }
}

std::string stop_tracing(bool wait_for_programs);

void stop_at_exit() {
  try {
    const std::string path = stop_tracing(false);
    if (!path.empty() && util::option_on(util::Option::Debug))
      std::fprintf(stderr, "lockstep: trace written to %s\n", path.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lockstep: %s\n", e.what());
  }
}

void start_tracing(const std::string& dir, profiler::Level level) {
  State& s = state();
  std::lock_guard<std::mutex> session(s.session_mu);
  if (on())
    throw Error(cat("ls::profiler::start(\"", dir, "\"): tracing is on already (into ", s.dir,
                    "); stop it first"));
  if (dir.empty()) throw Error("ls::profiler::start: the directory is empty");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  std::error_code is_ec;
  if (!std::filesystem::is_directory(dir, is_ec))
    throw Error(cat("ls::profiler::start: cannot make the directory ", dir,
                    ec ? cat(": ", ec.message()) : std::string()));
  {
    std::lock_guard<std::mutex> lock(s.mu);
    for (const auto& b : s.buffers) {  // events of spans that ended after the last stop
      std::lock_guard<std::mutex> block(b->mu);
      b->events.clear();
      b->used = false;
    }
    s.full.clear();
    s.stopping = false;
    s.dir = dir;
    s.path.clear();
    s.error.clear();
    s.file = nullptr;
  }
  s.writer = std::thread(writer_loop);
  if (!s.exit_hook) {
    std::atexit(stop_at_exit);  // after the runtime's drains registered later: they run first
    s.exit_hook = true;
  }
  g_level.store(level == profiler::Level::Fine ? 2 : 1, std::memory_order_relaxed);
}

std::string stop_tracing(bool wait_for_programs) {
  State& s = state();
  std::lock_guard<std::mutex> session(s.session_mu);
  if (!on()) return "";
  // The programs this thread queued are part of what it traced.
  if (wait_for_programs && !on_runtime_thread()) wait_idle(current_context());
  g_level.store(0, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.stopping = true;
  }
  s.cv.notify_all();
  if (s.writer.joinable()) s.writer.join();
  std::vector<std::shared_ptr<ThreadBuffer>> buffers;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    buffers = s.buffers;
  }
  const int pid = ::getpid();
  const int rank = rank_or_none();
  std::string meta =
      metadata_json("process_name", pid, 0,
                    cat("\"name\":\"lockstep", rank >= 0 ? cat(" rank ", rank) : std::string(),
                        " (", host_name(), " pid ", pid, ")\""));
  meta += ",\n" +
          metadata_json("process_sort_index", pid, 0, cat("\"sort_index\":", rank >= 0 ? rank : 0));
  for (const auto& b : buffers) {
    Chunk c{b->tid, {}};
    std::string name;
    {
      std::lock_guard<std::mutex> lock(b->mu);
      c.events.swap(b->events);
      name = b->name;
      if (!std::exchange(b->used, false)) continue;
    }
    write_chunk(s, c);
    std::string args = "\"name\":";
    append_string(args, name);
    meta += ",\n" + metadata_json("thread_name", pid, b->tid, args);
  }
  write_text(s, meta);
  if (s.file) {
    std::fputs("\n],\"displayTimeUnit\":\"ms\"}\n", s.file);
    if (std::fclose(s.file) != 0 && s.error.empty())
      s.error = cat("cannot write the trace ", s.path, ": ", std::strerror(errno));
    s.file = nullptr;
  }
  if (!s.error.empty()) throw Error(cat("ls::profiler::stop: ", s.error));
  return s.path;
}

int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  long long pages = 0, resident = 0;
  if (!(statm >> pages >> resident)) return 0;
  return resident * static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
}

// LOCKSTEP_TRACE=dir: the whole process, from the time the library is loaded.
[[maybe_unused]] const bool g_from_environment = [] {
  const std::string& dir = util::option(util::Option::Trace);
  if (dir.empty()) return false;
  try {
    start_tracing(dir, profiler::Level::Coarse);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lockstep: LOCKSTEP_TRACE: %s\n", e.what());
  }
  return true;
}();

}  // namespace

int64_t clock_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void add_arg(std::string& args, std::string_view key, std::string_view value) {
  if (!args.empty()) args += ',';
  append_string(args, key);
  args += ':';
  append_string(args, value);
}

void add_arg(std::string& args, std::string_view key, int64_t value) {
  if (!args.empty()) args += ',';
  append_string(args, key);
  args += cat(':', value);
}

void add_arg(std::string& args, std::string_view key, double value) {
  if (!args.empty()) args += ',';
  append_string(args, key);
  char text[32] = "null";
  if (std::isfinite(value)) std::snprintf(text, sizeof text, "%.6g", value);
  args += ':';
  args += text;
}

void complete(const char* category, std::string name, int64_t start_ns, int64_t end_ns,
              std::string args) {
  if (!on()) return;
  record({'X', category, std::move(name), start_ns, std::max<int64_t>(end_ns - start_ns, 0),
          std::move(args)});
}

void Span::end() {
  complete(category_, dynamic_name_.empty() ? std::string(name_) : std::move(dynamic_name_),
           start_ns_, clock_ns(), std::move(args_));
}

void name_thread(const char* name) {
  t_name = name;
  if (t_buffer) {
    std::lock_guard<std::mutex> lock(t_buffer->mu);
    t_buffer->name = name;
  }
}

void step_done(int64_t id, const std::string& site, int64_t& begin_ns, int64_t trace_start_ns,
               int64_t commit_ns, const std::string& rolled_back) {
  const int64_t begin = std::exchange(begin_ns, 0);
  if (begin == 0 || !on()) return;
  const int64_t end = clock_ns();
  complete("step", "recording", trace_start_ns, commit_ns != 0 ? commit_ns : end);
  std::string args;
  add_arg(args, "site", site);
  add_arg(args, "step", id);
  if (!rolled_back.empty()) add_arg(args, "rolled_back", rolled_back);
  complete("step", cat("ProfilerStep#", id), begin, end, std::move(args));
  std::string memory;
  add_arg(memory, "planned_bytes", metrics::counter("planned_bytes"));
  add_arg(memory, "resident_bytes", resident_bytes());
  record({'C', "memory", "memory", end, 0, std::move(memory)});
}

}  // namespace lockstep::runtime::prof

namespace lockstep::profiler {

void start(const std::string& dir, Level level) { runtime::prof::start_tracing(dir, level); }

std::string stop() { return runtime::prof::stop_tracing(true); }

bool enabled() { return runtime::prof::on(); }

RecordFunction::RecordFunction(std::string name) {
  if (runtime::prof::on()) name_ = std::move(name), start_ns_ = runtime::prof::clock_ns();
}

RecordFunction::~RecordFunction() {
  if (start_ns_ != 0)
    runtime::prof::complete("user", std::move(name_), start_ns_, runtime::prof::clock_ns());
}

}  // namespace lockstep::profiler
