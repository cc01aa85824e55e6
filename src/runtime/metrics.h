// Counting into ls::metrics from anywhere in the library (backends included) without seeing the
// runtime's internals: the metrics of metrics.def as enums, and the calls that add to them. The
// public reading side is lockstep/runtime.h's ls::metrics.
#pragma once

#include <cstdint>
#include <string_view>

namespace lockstep::runtime {

enum class Counter : uint8_t {
#define LS_COUNTER(id, name, shown, meaning) id,
#define LS_GAUGE(id, name, meaning)
#define LS_TIMER(id, name, shown, meaning)
#include "runtime/metrics.def"
#undef LS_COUNTER
#undef LS_GAUGE
#undef LS_TIMER
};

enum class Gauge : uint8_t {
#define LS_COUNTER(id, name, shown, meaning)
#define LS_GAUGE(id, name, meaning) id,
#define LS_TIMER(id, name, shown, meaning)
#include "runtime/metrics.def"
#undef LS_COUNTER
#undef LS_GAUGE
#undef LS_TIMER
};

enum class Timer : uint8_t {
#define LS_COUNTER(id, name, shown, meaning)
#define LS_GAUGE(id, name, meaning)
#define LS_TIMER(id, name, shown, meaning) id,
#include "runtime/metrics.def"
#undef LS_COUNTER
#undef LS_GAUGE
#undef LS_TIMER
};

void count(Counter counter, int64_t delta = 1);
// The gauge takes the value `v`, and max_<name> the largest value since the last reset.
void gauge(Gauge gauge, int64_t v);
void time_ns(Timer timer, int64_t ns);
// A kernel's time under LOCKSTEP_PROFILE, by the kernel's label (its kind, or the plan step).
void time_kernel_ns(std::string_view label, int64_t ns);
int64_t now_ns();

}  // namespace lockstep::runtime
