// `Loc`: a place in the user's program that recorded an op, entered a step or read a value. C++
// callers get theirs from a defaulted `Loc loc = Loc::current()` parameter, as
// std::source_location; another language's binding (Python) makes one from its own frame with
// Loc::intern. Errors, cache-miss explanations, graph dumps and per-site metrics name it.
#pragma once

#include <cstdint>
#include <source_location>
#include <string_view>

namespace lockstep {

class Loc {
 public:
  constexpr Loc() noexcept = default;
  constexpr Loc(const std::source_location& s) noexcept  // NOLINT(google-explicit-constructor)
      : file_(s.file_name()), function_(s.function_name()), line_(s.line()), column_(s.column()) {}
  // The caller's place, as std::source_location::current() (used as a default argument, the
  // place of the call that left it out).
  static constexpr Loc current(std::source_location s = std::source_location::current()) noexcept {
    return Loc(s);
  }
  // A place given by its parts, e.g. a Python frame's file, line and function. The strings are
  // interned for the life of the process (each distinct one is stored once, so a Loc stays a
  // small value that is cheap to copy and to record); thread-safe.
  static Loc intern(std::string_view file, uint32_t line, std::string_view function,
                    uint32_t column = 0);

  constexpr const char* file_name() const noexcept { return file_; }
  constexpr const char* function_name() const noexcept { return function_; }
  constexpr uint_least32_t line() const noexcept { return line_; }
  constexpr uint_least32_t column() const noexcept { return column_; }

 private:
  const char* file_ = "";
  const char* function_ = "";
  uint_least32_t line_ = 0;
  uint_least32_t column_ = 0;
};

}  // namespace lockstep
