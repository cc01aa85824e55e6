// Step timelines: ls::profiler writes what a run did, step by step, as a Chrome Trace Event file
// (open it in https://ui.perfetto.dev or chrome://tracing): one ProfilerStep#N span per step,
// with its recording, graph building, compiles (and why) or cache hits, each program's run on the
// runtime thread, collectives, data loading, closures and checkpoints. LOCKSTEP_TRACE=dir traces
// a whole process. Not here: the text metrics (lockstep/runtime.h, ls::metrics).
#pragma once

#include <string>

namespace lockstep::profiler {

// Coarse: programs as a whole; Fine: also each step of a program's plan (fused trees by their
// ops, matrix products and convolutions with their shapes and GFLOP/s, copies).
enum class Level { Coarse, Fine };

// Starts tracing into `dir` (created if missing): the file is
// <dir>/lockstep-<host>-<pid>[-rank<r>].trace.json, written at stop() (and at exit if still
// on). Error if tracing is on already, or `dir` cannot be made.
void start(const std::string& dir, Level level = Level::Coarse);
// Waits for the calling thread's queued programs, stops and writes the file; returns its path
// ("" when tracing was off).
std::string stop();
bool enabled();

// Traces from construction to destruction.
class Trace {
 public:
  explicit Trace(const std::string& dir, Level level = Level::Coarse) { start(dir, level); }
  ~Trace() {
    try {
      stop();
    } catch (...) {  // a destructor never throws: the file is lost, the run goes on
    }
  }
  Trace(const Trace&) = delete;
  Trace& operator=(const Trace&) = delete;
};

// A span of the user's own on the calling thread ("data", "eval"), as torch.profiler's
// record_function; free while tracing is off.
class RecordFunction {
 public:
  explicit RecordFunction(std::string name);
  ~RecordFunction();
  RecordFunction(const RecordFunction&) = delete;
  RecordFunction& operator=(const RecordFunction&) = delete;

 private:
  std::string name_;
  long long start_ns_ = 0;
};

}  // namespace lockstep::profiler
