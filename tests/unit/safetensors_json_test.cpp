// The JSON reader and writer behind safetensors headers (src/io/json.h): escapes, integers and
// the values a header may hold. Malformed headers are tested through the loader in
// safetensors_test.cpp.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "io/json.h"

namespace json = lockstep::io::json;

TEST(SafetensorsJson, StringsRoundTripThroughEscapes) {
  std::string all;
  for (int c = 1; c < 128; ++c) all += static_cast<char>(c);
  all += "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80";
  std::string text;
  json::append_string(text, all);
  const json::Value v = json::parse(text);
  ASSERT_EQ(v.kind, json::Value::Kind::String);
  EXPECT_EQ(v.text, all);
  EXPECT_EQ(json::parse(R"("\u00e9\u20AC\ud83d\ude00\/\b\f")").text,
            "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80/\b\f");
}

TEST(SafetensorsJson, ValuesAndIntegers) {
  const json::Value v =
      json::parse(R"( {"a": [true, false, null, -9223372036854775808, 9223372036854775807,)"
                  R"( 0, -0, 1.5e3, {}]} )");
  ASSERT_EQ(v.object.size(), 1u);
  const auto& a = v.object[0].value.array;
  ASSERT_EQ(a.size(), 9u);
  EXPECT_TRUE(a[0].boolean);
  EXPECT_EQ(a[1].kind, json::Value::Kind::Bool);
  EXPECT_EQ(a[2].kind, json::Value::Kind::Null);
  EXPECT_EQ(a[3].integer, std::numeric_limits<int64_t>::min());
  EXPECT_EQ(a[4].integer, std::numeric_limits<int64_t>::max());
  EXPECT_EQ(a[6].integer, 0);
  EXPECT_EQ(a[7].kind, json::Value::Kind::Number);
  EXPECT_EQ(a[7].text, "1.5e3");
  EXPECT_EQ(a[8].kind, json::Value::Kind::Object);
  EXPECT_THROW(json::parse("9223372036854775808"), json::ParseError);
  EXPECT_THROW(json::parse("-9223372036854775809"), json::ParseError);
}
