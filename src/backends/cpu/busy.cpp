// The thread count a busy machine leaves (busy.h).
#include "backends/cpu/busy.h"

#include <dirent.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

#include "lockstep/dist.h"
#include "util/options.h"

namespace lockstep::backends::cpu {
namespace {

int cpus_available() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

// Whether the thread whose /proc stat file is `path` is running or runnable (state R).
bool running(const char* path) {
  FILE* f = std::fopen(path, "r");
  if (!f) return false;
  char buf[512];
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* close = std::strrchr(buf, ')');  // the name may hold spaces and parentheses
  return close && close[1] == ' ' && close[2] == 'R';
}

// This process's runnable threads (/proc/self/task/*/stat in state R).
int mine_running() {
  int mine = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (const dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      const std::string path = std::string("/proc/self/task/") + e->d_name + "/stat";
      mine += running(path.c_str());
    }
    closedir(d);
  }
  return mine;
}

// Other processes' runnable threads now: /proc/loadavg's count of runnable threads (this
// reader's included) less this process's, counted just before and just after it and the larger
// taken: this process's threads start and stop running in microseconds (an OpenMP thread going
// to sleep after its spin), and one counted running by /proc/loadavg but asleep by the time its
// stat file was read made a quiet machine look busy (2 of 10 runs of examples/pytorch/run.py
// nanogpt, 2 cores, compiled for one thread for a while). -1 when /proc cannot be read.
int others_from_proc() {
  const int before = mine_running();
  FILE* f = std::fopen("/proc/loadavg", "r");
  if (!f) return -1;
  double a = 0, b = 0, c = 0;
  int runnable = 0, total = 0;
  const int got = std::fscanf(f, "%lf %lf %lf %d/%d", &a, &b, &c, &runnable, &total);
  std::fclose(f);
  if (got != 5) return -1;
  const int mine = std::max({before, mine_running(), 1});
  return std::max(0, runnable - mine);
}

// Each sample's weight in the smoothed count. A machine that looks quiet still shows a runnable
// thread elsewhere now and then (a kernel thread, a shell: 2-6 samples of 1 or 2 in a few
// seconds' run of examples/pytorch/run.py nanogpt on 2 idle cores), and at 0.3 a few such
// samples in a row moved the count (2 of 10 runs compiled for one thread for a while; Intel Xeon
// model 207; 0 of 12 at 0.1). At 0.1 two busy loops move it in 5 samples (100 ms) and a moment's
// work elsewhere does not.
constexpr double kWeight = 0.1;

struct Load {
  std::mutex mu;
  std::function<int()> probe;  // empty: others_from_proc
  int64_t interval_ns = 20'000'000;
  bool on = util::option(util::Option::AdaptThreads) != "0";
  int64_t last_ns = -1;
  double smoothed = 0;
  int others = 0;
  int cpus = 1;  // this process's CPUs at the last sample
};

Load& load() {
  static Load* l = new Load;  // never destroyed: programs may compile after main() returns
  return *l;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

int threads_for_load(int set) {
  Load& l = load();
  std::lock_guard<std::mutex> lock(l.mu);
  if (!l.on || set <= 1 || dist::world_size() > 1) return set;
  const int64_t now = now_ns();
  if (l.last_ns < 0 || now - l.last_ns >= l.interval_ns) {
    // At most every CPU: a burst of many threads elsewhere moves the figure no more than a
    // machine-full.
    l.cpus = cpus_available();
    const int sample = std::min(l.probe ? l.probe() : others_from_proc(), l.cpus);
    if (sample >= 0) {
      l.smoothed = (1 - kWeight) * l.smoothed + kWeight * sample;
      if (std::abs(l.smoothed - l.others) >= 0.75)
        l.others = static_cast<int>(std::lround(l.smoothed));
    }
    l.last_ns = now;
  }
  // Nothing else running: the threads set, even beyond the CPUs (the user's choice).
  return l.others == 0 ? set : std::clamp(l.cpus - l.others, 1, set);
}

void detail::set_load_probe(std::function<int()> others, int64_t interval_ns, bool on) {
  Load& l = load();
  std::lock_guard<std::mutex> lock(l.mu);
  l.probe = std::move(others);
  l.interval_ns = interval_ns;
  l.on = on;
  l.last_ns = -1;
  l.smoothed = 0;
  l.others = 0;
}

}  // namespace lockstep::backends::cpu
