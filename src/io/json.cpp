// The JSON reader and writer of json.h: a recursive-descent parser that rejects anything outside
// RFC 8259 (plus the integer-only restriction on what it keeps as numbers), and string escaping.
#include "io/json.h"

#include <cstdint>
#include <limits>
#include <string>

#include "util/check.h"

namespace lockstep::io::json {

const char* kind_name(Value::Kind kind) {
  switch (kind) {
    case Value::Kind::Null:
      return "null";
    case Value::Kind::Bool:
      return "a boolean";
    case Value::Kind::Integer:
      return "an integer";
    case Value::Kind::Number:
      return "a non-integer number";
    case Value::Kind::String:
      return "a string";
    case Value::Kind::Array:
      return "an array";
    case Value::Kind::Object:
      return "an object";
  }
  return "?";
}

ParseError::ParseError(size_t offset, const std::string& what)
    : std::runtime_error(what), offset_(offset) {}

namespace {

constexpr int kMaxDepth = 64;

// Length of the UTF-8 sequence starting at s[i], or 0 if it is not well-formed.
size_t utf8_sequence_length(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char b0 = byte(i);
  if (b0 < 0x80) return 1;
  size_t len = 0;
  uint32_t cp = 0;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2;
    cp = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3;
    cp = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4;
    cp = b0 & 0x07;
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (byte(i + k) & 0x3F);
  }
  static constexpr uint32_t kMinForLength[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMinForLength[len]) return 0;       // overlong
  if (cp >= 0xD800 && cp <= 0xDFFF) return 0;  // surrogate
  if (cp > 0x10FFFF) return 0;                 // beyond Unicode
  return len;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// How a character looks in a message: printable ASCII quoted, anything else as a byte value.
std::string describe(std::string_view text, size_t pos) {
  if (pos >= text.size()) return "the end of the text";
  const unsigned char c = static_cast<unsigned char>(text[pos]);
  if (c >= 0x20 && c < 0x7F) return util::cat("'", static_cast<char>(c), "'");
  return util::cat("byte 0x", "0123456789abcdef"[c >> 4], "0123456789abcdef"[c & 0xF]);
}

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  Value parse_document() {
    skip_space();
    Value v = parse_value(0);
    skip_space();
    if (pos_ != text_.size())
      fail(util::cat("unexpected ", describe(text_, pos_), " after the value"));
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { throw ParseError(pos_, what); }

  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return at_end() ? '\0' : text_[pos_]; }

  void skip_space() {
    while (!at_end() && (peek() == ' ' || peek() == '\t' || peek() == '\n' || peek() == '\r'))
      ++pos_;
  }

  void expect(char c, const char* context) {
    if (at_end() || peek() != c)
      fail(util::cat("expected '", c, "' ", context, ", found ", describe(text_, pos_)));
    ++pos_;
  }

  Value parse_value(int depth) {
    if (at_end()) fail("expected a value, found the end of the text");
    const char c = peek();
    if (c == '{') return parse_object(depth + 1);
    if (c == '[') return parse_array(depth + 1);
    Value v;
    if (c == '"') {
      v.kind = Value::Kind::String;
      v.text = parse_string();
      return v;
    }
    if (c == '-' || (c >= '0' && c <= '9')) return parse_number();
    if (literal("true")) {
      v.kind = Value::Kind::Bool;
      v.boolean = true;
      return v;
    }
    if (literal("false")) {
      v.kind = Value::Kind::Bool;
      return v;
    }
    if (literal("null")) return v;
    fail(util::cat("expected a value, found ", describe(text_, pos_)));
  }

  bool literal(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  void check_depth(int depth) const {
    if (depth > kMaxDepth) fail(util::cat("nesting deeper than ", kMaxDepth, " levels"));
  }

  Value parse_object(int depth) {
    check_depth(depth);
    Value v;
    v.kind = Value::Kind::Object;
    ++pos_;  // '{'
    skip_space();
    if (peek() == '}') {
      ++pos_;
      return v;
    }
    while (true) {
      skip_space();
      if (peek() != '"')
        fail(util::cat("expected a string key in an object, found ", describe(text_, pos_)));
      std::string key = parse_string();
      skip_space();
      expect(':', "after an object key");
      skip_space();
      Value item = parse_value(depth);
      v.object.push_back({std::move(key), std::move(item)});
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect('}', "or ',' in an object");
      return v;
    }
  }

  Value parse_array(int depth) {
    check_depth(depth);
    Value v;
    v.kind = Value::Kind::Array;
    ++pos_;  // '['
    skip_space();
    if (peek() == ']') {
      ++pos_;
      return v;
    }
    while (true) {
      skip_space();
      v.array.push_back(parse_value(depth));
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect(']', "or ',' in an array");
      return v;
    }
  }

  uint32_t parse_hex4() {
    uint32_t cp = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = peek();
      uint32_t digit = 0;
      if (c >= '0' && c <= '9') {
        digit = static_cast<uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        digit = static_cast<uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        digit = static_cast<uint32_t>(c - 'A' + 10);
      } else {
        fail(util::cat("expected 4 hex digits after \\u, found ", describe(text_, pos_)));
      }
      cp = cp * 16 + digit;
      ++pos_;
    }
    return cp;
  }

  std::string parse_string() {
    const size_t start = pos_;
    ++pos_;  // opening quote
    std::string out;
    while (true) {
      if (at_end()) {
        pos_ = start;
        fail("unterminated string");
      }
      const unsigned char c = static_cast<unsigned char>(text_[pos_]);
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (c < 0x20)
        fail(util::cat("raw control character ", describe(text_, pos_), " in a string"));
      if (c >= 0x80) {
        const size_t len = utf8_sequence_length(text_, pos_);
        if (len == 0) fail("invalid UTF-8 in a string");
        out.append(text_.substr(pos_, len));
        pos_ += len;
        continue;
      }
      if (c != '\\') {
        out += static_cast<char>(c);
        ++pos_;
        continue;
      }
      ++pos_;  // backslash
      const char e = peek();
      ++pos_;
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          uint32_t cp = parse_hex4();
          if (cp >= 0xDC00 && cp <= 0xDFFF) fail("\\u escape is a lone low surrogate");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (!literal("\\u")) fail("\\u escape is a high surrogate not followed by a low one");
            const uint32_t low = parse_hex4();
            if (low < 0xDC00 || low > 0xDFFF)
              fail("\\u escape is a high surrogate not followed by a low one");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          append_utf8(out, cp);
          break;
        }
        default:
          --pos_;
          fail(util::cat("invalid escape \\", describe(text_, pos_), " in a string"));
      }
    }
  }

  Value parse_number() {
    const size_t start = pos_;
    bool integral = true;
    if (peek() == '-') ++pos_;
    const auto digits = [&] {
      const size_t from = pos_;
      while (!at_end() && peek() >= '0' && peek() <= '9') ++pos_;
      return pos_ - from;
    };
    const size_t int_start = pos_;
    const size_t int_digits = digits();
    if (int_digits == 0) fail("expected digits in a number");
    if (int_digits > 1 && text_[int_start] == '0') {
      pos_ = int_start;
      fail("number with a leading zero");
    }
    if (peek() == '.') {
      integral = false;
      ++pos_;
      if (digits() == 0) fail("expected digits after '.' in a number");
    }
    if (peek() == 'e' || peek() == 'E') {
      integral = false;
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      if (digits() == 0) fail("expected digits in a number's exponent");
    }
    Value v;
    const std::string_view literal_text = text_.substr(start, pos_ - start);
    if (!integral) {
      v.kind = Value::Kind::Number;
      v.text = std::string(literal_text);
      return v;
    }
    // Accumulate negatively so that INT64_MIN parses too.
    const bool negative = text_[start] == '-';
    int64_t value = 0;
    for (size_t k = int_start; k < pos_; ++k) {
      const int64_t digit = text_[k] - '0';
      if (value < (std::numeric_limits<int64_t>::min() + digit) / 10) {
        pos_ = start;
        fail(util::cat("integer ", literal_text, " does not fit in 64 bits"));
      }
      value = value * 10 - digit;
    }
    if (!negative) {
      if (value == std::numeric_limits<int64_t>::min()) {
        pos_ = start;
        fail(util::cat("integer ", literal_text, " does not fit in 64 bits"));
      }
      value = -value;
    }
    v.kind = Value::Kind::Integer;
    v.integer = value;
    return v;
  }

  std::string_view text_;
  size_t pos_ = 0;
};

}  // namespace

Value parse(std::string_view text) { return Parser(text).parse_document(); }

void append_string(std::string& out, std::string_view s) {
  out += '"';
  for (const char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += "0123456789abcdef"[c >> 4];
          out += "0123456789abcdef"[c & 0xF];
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_sequence_length(s, i);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

}  // namespace lockstep::io::json
