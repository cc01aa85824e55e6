// The JSON reader behind safetensors headers. A text that parses must be made of valid UTF-8
// strings and must survive a round trip: written back out (strings through append_string) and
// parsed again, it is the same value.
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_input.h"
#include "io/json.h"

namespace {

namespace json = lockstep::io::json;
using lockstep::fuzz::die;

void write(const json::Value& v, std::string& out) {
  switch (v.kind) {
    case json::Value::Kind::Null:
      out += "null";
      break;
    case json::Value::Kind::Bool:
      out += v.boolean ? "true" : "false";
      break;
    case json::Value::Kind::Integer:
      out += std::to_string(v.integer);
      break;
    case json::Value::Kind::Number:
      out += v.text;
      break;
    case json::Value::Kind::String:
      if (!json::is_valid_utf8(v.text)) die("a parsed string is not valid UTF-8");
      json::append_string(out, v.text);
      break;
    case json::Value::Kind::Array:
      out += '[';
      for (size_t i = 0; i < v.array.size(); ++i) {
        if (i) out += ',';
        write(v.array[i], out);
      }
      out += ']';
      break;
    case json::Value::Kind::Object:
      out += '{';
      for (size_t i = 0; i < v.object.size(); ++i) {
        if (i) out += ',';
        if (!json::is_valid_utf8(v.object[i].key)) die("a parsed key is not valid UTF-8");
        json::append_string(out, v.object[i].key);
        out += ':';
        write(v.object[i].value, out);
      }
      out += '}';
      break;
  }
}

bool same(const json::Value& a, const json::Value& b) {
  if (a.kind != b.kind || a.boolean != b.boolean || a.integer != b.integer || a.text != b.text ||
      a.array.size() != b.array.size() || a.object.size() != b.object.size())
    return false;
  for (size_t i = 0; i < a.array.size(); ++i)
    if (!same(a.array[i], b.array[i])) return false;
  for (size_t i = 0; i < a.object.size(); ++i)
    if (a.object[i].key != b.object[i].key || !same(a.object[i].value, b.object[i].value))
      return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  json::Value value;
  try {
    value = json::parse(text);
  } catch (const json::ParseError& e) {
    if (e.offset() > size) die("a parse error past the end of the text");
    return 0;
  }
  std::string again;
  write(value, again);
  json::Value reparsed;
  try {
    reparsed = json::parse(again);
  } catch (const json::ParseError& e) {
    die("the value written back does not parse (" + std::string(e.what()) + "): " + again);
  }
  if (!same(value, reparsed)) die("the value written back parses differently: " + again);
  return 0;
}
