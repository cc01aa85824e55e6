// Step timelines (lockstep/profiler.h): a few traced training steps of a small model, the file
// judged by a checker of the Trace Event Format written here (fields, nesting per thread, process
// and thread names), and the spans lockstep promises: one ProfilerStep#N per step, a compile
// with its reason on the first step and cache hits after, the runtime thread's programs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <lockstep/lockstep.h>
#include <lockstep/profiler.h>

#include "io/json.h"

namespace ls = lockstep;
namespace json = lockstep::io::json;
namespace fs = std::filesystem;

namespace {

struct TraceEvent {
  std::string ph, name, cat;
  int64_t pid = 0, tid = 0;
  double ts = 0, dur = 0;
  const json::Value* args = nullptr;
};

double number(const json::Value& v) {
  if (v.kind == json::Value::Kind::Integer) return static_cast<double>(v.integer);
  if (v.kind == json::Value::Kind::Number) return std::stod(v.text);
  ADD_FAILURE() << "not a number: " << json::kind_name(v.kind);
  return 0;
}

const json::Value* member(const json::Value& o, const std::string& key) {
  for (const auto& m : o.object)
    if (m.key == key) return &m.value;
  return nullptr;
}

std::string arg_text(const TraceEvent& e, const std::string& key) {
  const json::Value* v = e.args ? member(*e.args, key) : nullptr;
  return v && v->kind == json::Value::Kind::String ? v->text : std::string();
}

// The Trace Event Format's rules, as Perfetto and chrome://tracing read them.
struct Checked {
  json::Value root;
  std::vector<TraceEvent> events;
  std::map<int64_t, std::string> process_names;
  std::map<std::pair<int64_t, int64_t>, std::string> thread_names;
};

void check_trace(const std::string& path, Checked& out) {
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  std::stringstream text;
  text << in.rdbuf();
  ASSERT_NO_THROW(out.root = json::parse(text.str())) << path;
  ASSERT_EQ(out.root.kind, json::Value::Kind::Object);
  const json::Value* list = member(out.root, "traceEvents");
  ASSERT_TRUE(list && list->kind == json::Value::Kind::Array);
  for (const json::Value& v : list->array) {
    ASSERT_EQ(v.kind, json::Value::Kind::Object);
    TraceEvent e;
    for (const char* field : {"ph", "ts", "pid", "tid", "name"})
      ASSERT_TRUE(member(v, field)) << "an event without " << field;
    e.ph = member(v, "ph")->text;
    e.name = member(v, "name")->text;
    ASSERT_FALSE(e.name.empty());
    e.pid = member(v, "pid")->integer;
    e.tid = member(v, "tid")->integer;
    e.ts = number(*member(v, "ts"));
    if (const json::Value* c = member(v, "cat")) e.cat = c->text;
    e.args = member(v, "args");
    if (e.args) {
      ASSERT_EQ(e.args->kind, json::Value::Kind::Object);
    }
    if (e.ph == "X") {
      ASSERT_TRUE(member(v, "dur")) << e.name;
      e.dur = number(*member(v, "dur"));
      EXPECT_GE(e.dur, 0) << e.name;
    } else if (e.ph == "C") {
      ASSERT_TRUE(e.args && !e.args->object.empty()) << e.name;
      for (const auto& m : e.args->object) number(m.value);  // counters are numeric
    } else if (e.ph == "M") {
      ASSERT_TRUE(e.args) << e.name;
      if (e.name == "process_name" || e.name == "thread_name") {
        ASSERT_TRUE(member(*e.args, "name")) << e.name;
      }
      if (e.name == "process_name") out.process_names[e.pid] = member(*e.args, "name")->text;
      if (e.name == "thread_name") out.thread_names[{e.pid, e.tid}] = member(*e.args, "name")->text;
    } else {
      ASSERT_TRUE(e.ph == "B" || e.ph == "E" || e.ph == "i") << "phase " << e.ph;
    }
    out.events.push_back(e);
  }
  // Spans nest per thread: B/E pairs in order with monotonic times, X events inside each other
  // or apart, never overlapping.
  std::map<std::pair<int64_t, int64_t>, std::vector<std::pair<double, double>>> intervals;
  std::map<std::pair<int64_t, int64_t>, std::vector<const TraceEvent*>> open;
  std::map<std::pair<int64_t, int64_t>, double> last_be;
  for (const TraceEvent& e : out.events) {
    const auto thread = std::make_pair(e.pid, e.tid);
    if (e.ph == "X") intervals[thread].push_back({e.ts, e.ts + e.dur});
    if (e.ph == "B" || e.ph == "E") {
      EXPECT_GE(e.ts, last_be[thread]) << e.name;
      last_be[thread] = e.ts;
      if (e.ph == "B") {
        open[thread].push_back(&e);
      } else {
        ASSERT_FALSE(open[thread].empty()) << "an E without its B";
        intervals[thread].push_back({open[thread].back()->ts, e.ts});
        open[thread].pop_back();
      }
    }
  }
  for (auto& [thread, v] : open) EXPECT_TRUE(v.empty()) << "a B without its E";
  for (auto& [thread, v] : intervals) {
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first < b.first : a.second > b.second;
    });
    std::vector<double> ends;  // the open spans' ends
    for (const auto& [begin, end] : v) {
      while (!ends.empty() && ends.back() <= begin) ends.pop_back();
      if (!ends.empty()) {
        EXPECT_LE(end, ends.back())
            << "a span overlaps its parent on thread " << thread.second << " at " << begin;
      }
      ends.push_back(end);
    }
    EXPECT_TRUE(out.thread_names.count(thread)) << "thread " << thread.second << " not named";
  }
  for (const TraceEvent& e : out.events)
    EXPECT_TRUE(out.process_names.count(e.pid)) << "process " << e.pid << " not named";
}

std::vector<std::string> traces_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& f : fs::directory_iterator(dir)) out.push_back(f.path().string());
  return out;
}

// A few steps of an MLP on fake data, traced.
std::string traced_training(const fs::path& dir, ls::profiler::Level level, int steps) {
  auto model = std::make_shared<ls::models::MLP>(std::vector<int64_t>{48, 32, 4});
  ls::optim::SGD opt(model->parameters(), {.lr = 0.05, .momentum = 0.9});
  ls::data::DeviceLoader loader(
      ls::data::DataLoader(std::make_shared<ls::data::FakeData>(ls::data::FakeDataOptions{
                               .shape = {3, 4, 4}, .num_classes = 4, .size = 64}),
                           {.batch_size = 8, .num_workers = 1}));
  ls::profiler::Trace trace(dir.string(), level);
  for (int i = 0; i < steps; ++i) {
    std::optional<ls::data::Batch> b = loader.next();
    ls::step([&] {
      opt.zero_grad();
      ls::Tensor loss = ls::nn::cross_entropy((*model)(b->images), b->labels);
      loss.backward();
      opt.step();
      ls::add_step_closure([] {});
    });
  }
  return ls::profiler::stop();
}

}  // namespace

TEST(Profiler, TracesStepsCompilesAndProgramsAsValidTraceEvents) {
  const fs::path dir =
      fs::temp_directory_path() / ("lockstep-profiler-" + std::to_string(getpid()));
  fs::remove_all(dir);
  const int steps = 4;
  const std::string path = traced_training(dir, ls::profiler::Level::Coarse, steps);
  EXPECT_FALSE(ls::profiler::enabled());
  ASSERT_EQ(traces_in(dir), std::vector<std::string>{path});
  EXPECT_NE(path.find("lockstep-"), std::string::npos);
  EXPECT_NE(path.find("-" + std::to_string(getpid()) + ".trace.json"), std::string::npos) << path;
  Checked t;
  ASSERT_NO_FATAL_FAILURE(check_trace(path, t));
  ASSERT_EQ(t.process_names.size(), 1u);
  EXPECT_EQ(t.process_names.begin()->first, getpid());

  // One ProfilerStep#N per step, N increasing, each with its site; the compile of the first
  // step names its reason, later steps hit the cache.
  std::vector<const TraceEvent*> step_spans;
  for (const TraceEvent& e : t.events)
    if (e.name.rfind("ProfilerStep#", 0) == 0) step_spans.push_back(&e);
  ASSERT_EQ(step_spans.size(), static_cast<size_t>(steps));
  std::sort(step_spans.begin(), step_spans.end(), [](auto* a, auto* b) { return a->ts < b->ts; });
  for (size_t i = 1; i < step_spans.size(); ++i)
    EXPECT_GT(std::stoll(step_spans[i]->name.substr(13)),
              std::stoll(step_spans[i - 1]->name.substr(13)));
  for (const TraceEvent* s : step_spans)
    EXPECT_NE(arg_text(*s, "site").find("profiler_test.cpp"), std::string::npos);
  auto within = [](const TraceEvent& e, const TraceEvent* s) {
    return e.tid == s->tid && e.ts >= s->ts && e.ts + e.dur <= s->ts + s->dur;
  };
  int compiles_first = 0, hits_later = 0, compiles_later = 0, recordings = 0;
  std::set<std::string> names;
  for (const TraceEvent& e : t.events) {
    names.insert(e.name);
    if (e.name == "compile" && within(e, step_spans[0])) {
      ++compiles_first;
      EXPECT_FALSE(arg_text(e, "reason").empty());
    }
    for (size_t i = 1; i < step_spans.size(); ++i) {
      if (!within(e, step_spans[i])) continue;
      hits_later += e.name == "cache hit";
      compiles_later += e.name == "compile";
      recordings += e.name == "recording";
    }
  }
  EXPECT_GE(compiles_first, 1);
  EXPECT_GE(hits_later, 2);
  EXPECT_LE(compiles_later, 1);  // the optimizer's state may make the second step differ
  EXPECT_EQ(recordings, steps - 1);
  for (const char* name :
       {"build graph", "hash", "execute", "step closures", "load batch", "next batch", "memory"})
    EXPECT_TRUE(names.count(name)) << name;
  // Named threads: the runtime's, the loader's, the upload thread, this one.
  std::set<std::string> threads;
  for (const auto& [key, name] : t.thread_names) threads.insert(name);
  for (const char* name : {"lockstep runtime", "lockstep loader", "lockstep upload", "main"})
    EXPECT_TRUE(threads.count(name)) << name;
  fs::remove_all(dir);
}

TEST(Profiler, FineLevelShowsEachStepOfThePlan) {
  const fs::path dir =
      fs::temp_directory_path() / ("lockstep-profiler-fine-" + std::to_string(getpid()));
  fs::remove_all(dir);
  const std::string path = traced_training(dir, ls::profiler::Level::Fine, 2);
  Checked t;
  ASSERT_NO_FATAL_FAILURE(check_trace(path, t));
  int products = 0, fused = 0;
  for (const TraceEvent& e : t.events) {
    if (e.cat != "kernel") continue;
    if (e.name.rfind("mat_mul", 0) == 0) {
      ++products;
      EXPECT_NE(arg_text(e, "operands").find(" x "), std::string::npos);
      EXPECT_TRUE(member(*e.args, "gflop_per_s"));
    }
    fused += !arg_text(e, "ops").empty();
  }
  EXPECT_GE(products, 2);
  EXPECT_GE(fused, 1);
  fs::remove_all(dir);
}

TEST(Profiler, StartTwiceIsAnErrorAndStopWhenOffIsNothing) {
  const fs::path dir =
      fs::temp_directory_path() / ("lockstep-profiler-twice-" + std::to_string(getpid()));
  EXPECT_EQ(ls::profiler::stop(), "");
  ls::profiler::start(dir.string());
  EXPECT_TRUE(ls::profiler::enabled());
  EXPECT_THROW(ls::profiler::start(dir.string()), ls::Error);
  { ls::profiler::RecordFunction user("mine"); }
  const std::string path = ls::profiler::stop();
  Checked t;
  ASSERT_NO_FATAL_FAILURE(check_trace(path, t));
  EXPECT_TRUE(std::any_of(t.events.begin(), t.events.end(),
                          [](const TraceEvent& e) { return e.name == "mine"; }));
  EXPECT_THROW(ls::profiler::start("/proc/no-such-dir/x"), ls::Error);
  fs::remove_all(dir);
}

TEST(Profiler, ALargeBufferGoesToTheWriterInChunksAndNoEventIsLost) {
  const fs::path dir =
      fs::temp_directory_path() / ("lockstep-profiler-chunks-" + std::to_string(getpid()));
  ls::profiler::start(dir.string());
  const int spans = 40000;  // more than two chunks of one thread's buffer
  for (int i = 0; i < spans; ++i) ls::profiler::RecordFunction span("span " + std::to_string(i));
  const std::string path = ls::profiler::stop();
  Checked t;
  ASSERT_NO_FATAL_FAILURE(check_trace(path, t));
  std::set<std::string> seen;
  for (const TraceEvent& e : t.events)
    if (e.name.rfind("span ", 0) == 0) seen.insert(e.name);
  EXPECT_EQ(seen.size(), static_cast<size_t>(spans));
  fs::remove_all(dir);
}
