// A small, strict JSON reader and writer, enough for checkpoint headers (safetensors): objects,
// arrays, strings with every escape (\uXXXX and surrogate pairs included), integers, true, false,
// null. Not a general JSON library: numbers with a fraction or exponent are kept only as text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lockstep::io::json {

struct Value {
  enum class Kind { Null, Bool, Integer, Number, String, Array, Object };
  Kind kind = Kind::Null;
  bool boolean = false;
  int64_t integer = 0;
  // String: the decoded UTF-8 text. Number (fraction or exponent): its text as written.
  std::string text;
  std::vector<Value> array;
  // Keys in the order written; duplicates are kept so that the caller can name them.
  struct Member;
  std::vector<Member> object;
};

// A key and its value (a struct rather than std::pair, which cannot hold the incomplete Value).
struct Value::Member {
  std::string key;
  Value value;
};

// "an object", "a string", ...: for messages such as "expected an array, found a string".
const char* kind_name(Value::Kind kind);

// Malformed JSON: `offset` is the byte of `text` at which the reader gave up.
class ParseError : public std::runtime_error {
 public:
  ParseError(size_t offset, const std::string& what);
  size_t offset() const { return offset_; }

 private:
  size_t offset_;
};

// Parses exactly one JSON value; whitespace may surround it. Strings must be valid UTF-8 with
// no raw control characters; integers must fit in int64; nesting is limited to 64 levels.
Value parse(std::string_view text);

// Appends `s` as a JSON string literal (quotes, escapes for '"', '\\' and control characters;
// other UTF-8 bytes as they are).
void append_string(std::string& out, std::string_view s);

// Whether `s` is well-formed UTF-8 (no overlong forms, no surrogates, at most U+10FFFF).
bool is_valid_utf8(std::string_view s);

}  // namespace lockstep::io::json
