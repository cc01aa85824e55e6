// The span sites' side of ls::profiler (lockstep/profiler.h): a span, an event with explicit
// times, counters and thread names, each behind one relaxed load of a global level, so that a
// site costs nothing else (no clock read, no allocation) while tracing is off.
// Not here: buffering and writing the trace (profiler.cpp).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace lockstep::runtime::prof {

// 0: off; 1: coarse (programs, steps, compiles, waits); 2: fine (each step of a program's plan).
extern std::atomic<int> g_level;
inline bool on() { return g_level.load(std::memory_order_relaxed) != 0; }
inline bool fine() { return g_level.load(std::memory_order_relaxed) >= 2; }

int64_t clock_ns();  // the steady clock every event is timed by
inline int64_t now_if_on() { return on() ? clock_ns() : 0; }

// "key": value pairs of an event's args, as JSON text without the braces.
void add_arg(std::string& args, std::string_view key, std::string_view value);
void add_arg(std::string& args, std::string_view key, int64_t value);
void add_arg(std::string& args, std::string_view key, double value);

// A complete event ("X") on the calling thread, from `start_ns` to `end_ns`.
void complete(const char* category, std::string name, int64_t start_ns, int64_t end_ns,
              std::string args = {});

// A span from construction to destruction on the calling thread; inactive (and free) when
// tracing was off at construction. Test it (`if (span)`) before computing a name or args.
class Span {
 public:
  // A null `name`: no span.
  Span(const char* category, const char* name) {
    if (name && on()) start_ns_ = clock_ns(), category_ = category, name_ = name;
  }
  ~Span() {
    if (start_ns_ != 0) end();
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;
  explicit operator bool() const { return start_ns_ != 0; }
  void rename(std::string name) { dynamic_name_ = std::move(name); }
  template <typename T>
  void arg(std::string_view key, const T& value) {
    if (start_ns_ == 0) return;
    if constexpr (std::is_integral_v<T>)
      add_arg(args_, key, static_cast<int64_t>(value));
    else if constexpr (std::is_floating_point_v<T>)
      add_arg(args_, key, static_cast<double>(value));
    else
      add_arg(args_, key, std::string_view(value));
  }

 private:
  void end();
  int64_t start_ns_ = 0;
  const char* category_ = nullptr;
  const char* name_ = nullptr;
  std::string dynamic_name_, args_;
};

// Names the calling thread in traces ("lockstep runtime"); a string that lives forever. Threads
// not named are named by their system name (the main thread: "main").
void name_thread(const char* name);

// A step's events, at its commit (or its rollback): ProfilerStep#<id> from `begin_ns` (its
// entry) to now, "recording" from `trace_start_ns` to `commit_ns` (0: now), and the memory
// counters. `begin_ns` is 0 when tracing was off at entry (then nothing), and 0 afterwards.
void step_done(int64_t id, const std::string& site, int64_t& begin_ns, int64_t trace_start_ns,
               int64_t commit_ns, const std::string& rolled_back = {});

// At the top of a step's commit: step_done when the commit ends, however it ends.
class StepEnd {
 public:
  StepEnd(int64_t id, const std::string& site, int64_t& begin_ns, int64_t trace_start_ns)
      : id_(id), site_(site), begin_ns_(begin_ns), trace_start_ns_(trace_start_ns) {
    if (begin_ns != 0 && on()) commit_ns_ = clock_ns();
  }
  ~StepEnd() {
    if (begin_ns_ != 0) step_done(id_, site_, begin_ns_, trace_start_ns_, commit_ns_);
  }
  StepEnd(const StepEnd&) = delete;
  StepEnd& operator=(const StepEnd&) = delete;

 private:
  int64_t id_;
  const std::string& site_;
  int64_t& begin_ns_;
  int64_t trace_start_ns_, commit_ns_ = 0;
};

}  // namespace lockstep::runtime::prof
