// safetensors checkpoint files (lockstep/io.h): exact round trips of every dtype, atomic saves
// that never damage an existing file, a file written by PyTorch, and every kind of corrupt file
// rejected with an Error that names the problem.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <lockstep/lockstep.h>

#include "io/json.h"

namespace ls = lockstep;
namespace fs = std::filesystem;
using ::testing::HasSubstr;

namespace {

// A fresh directory per test, removed afterwards.
class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "ls_safetensors_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (fs::path(dir_) / name).string(); }

  // Names in the directory that look like a temporary file of a save.
  std::vector<std::string> temp_files() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_))
      if (e.path().filename().string().find(".tmp-") != std::string::npos)
        out.push_back(e.path().filename().string());
    return out;
  }

  // The message of the Error that loading `file` throws ("" if it loads).
  std::string load_error(const std::string& file) {
    try {
      ls::io::load_safetensors(file);
    } catch (const ls::Error& e) {
      return e.what();
    }
    ADD_FAILURE() << "loading " << file << " did not throw";
    return "";
  }

  // A file with the given header text and data; `length` overrides the header length field.
  std::string write_st(const std::string& name, const std::string& header, const std::string& data,
                       std::optional<uint64_t> length = std::nullopt) {
    const uint64_t n = length ? *length : header.size();
    std::string bytes;
    for (int i = 0; i < 8; ++i) bytes += static_cast<char>((n >> (8 * i)) & 0xFF);
    write_file(path(name), bytes + header + data);
    return path(name);
  }

  static void write_file(const std::string& file, const std::string& bytes) {
    std::ofstream out(file, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    ASSERT_TRUE(out.good());
  }
  static std::string read_file(const std::string& file) {
    std::ifstream in(file, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  std::string dir_;
};

template <typename T>
std::vector<unsigned char> raw(const std::vector<T>& v) {
  std::vector<unsigned char> out(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// Bitwise equality of two tensors' values, dtype and shape.
void expect_identical(const ls::Tensor& a, const ls::Tensor& b, const std::string& name) {
  SCOPED_TRACE(name);
  ASSERT_EQ(a.dtype(), b.dtype());
  ASSERT_EQ(a.shape(), b.shape());
  switch (a.dtype()) {
    case ls::DType::F32:
    case ls::DType::BF16:
      EXPECT_EQ(raw(a.to_vector<float>()), raw(b.to_vector<float>()));
      break;
    case ls::DType::F64:
      EXPECT_EQ(raw(a.to_vector<double>()), raw(b.to_vector<double>()));
      break;
    case ls::DType::I32:
      EXPECT_EQ(a.to_vector<int32_t>(), b.to_vector<int32_t>());
      break;
    case ls::DType::I64:
      EXPECT_EQ(a.to_vector<int64_t>(), b.to_vector<int64_t>());
      break;
    case ls::DType::Bool:
      EXPECT_EQ(a.to_vector<bool>(), b.to_vector<bool>());
      break;
    case ls::DType::U8:
      EXPECT_EQ(a.to_vector<uint8_t>(), b.to_vector<uint8_t>());
      break;
  }
}

constexpr float kInf = std::numeric_limits<float>::infinity();

ls::io::TensorMap all_kinds() {
  return {
      {"conv.weight",
       ls::from_vector<float>({0.5f, -0.0f, kInf, std::nanf(""), 1e-45f, -3.25f}, {2, 3})},
      {"bias", ls::from_vector<double>({0.1, -2.5, 1e300})},
      {"labels", ls::from_vector<int32_t>({-7, 0, std::numeric_limits<int32_t>::max(),
                                           std::numeric_limits<int32_t>::min()},
                                          {2, 2})},
      {"step", ls::from_vector<int64_t>({std::numeric_limits<int64_t>::min()}, {})},
      {"mask", ls::from_vector<bool>({true, false, false, true, true})},
      {"scalar", ls::scalar_tensor(2.75, {ls::DType::F64})},
      {"empty", ls::zeros({0, 4})},
      {"empty_i64", ls::zeros({3, 0}, {ls::DType::I64})},
      {"name with \"quotes\", \\ and \n and \xc3\xa9\xf0\x9f\x98\x80", ls::ones({1}, ls::i32)},
  };
}

}  // namespace

TEST_F(Safetensors, RoundTripIsExactForEveryDtypeAndShape) {
  const ls::io::TensorMap tensors = all_kinds();
  const ls::io::Metadata metadata = {{"format", "pt"},
                                     {"epoch", "3"},
                                     {"note \"q\"", "tab\there\x01 \xc3\xa9 \xf0\x9f\x98\x80"},
                                     {"", ""}};
  ls::io::save_safetensors(path("a.safetensors"), tensors, metadata);
  const ls::io::Loaded loaded = ls::io::load_safetensors(path("a.safetensors"));
  ASSERT_EQ(loaded.tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(loaded.tensors[i].first, tensors[i].first);
    EXPECT_FALSE(loaded.tensors[i].second.is_pending());
    EXPECT_EQ(loaded.tensors[i].second.device(), ls::default_device());
    expect_identical(loaded.tensors[i].second, tensors[i].second, tensors[i].first);
  }
  EXPECT_EQ(loaded.metadata, metadata);
  EXPECT_TRUE(temp_files().empty());
}

TEST_F(Safetensors, ZeroDimAndEmptyTensorsKeepTheirShapes) {
  ls::io::save_safetensors(path("s.safetensors"),
                           {{"zero_d", ls::scalar_tensor(int64_t{-5}, ls::i64)},
                            {"empty", ls::zeros({0}, ls::boolean)},
                            {"empty3", ls::zeros({2, 0, 3}, ls::f64)}});
  const auto loaded = ls::io::load_safetensors(path("s.safetensors"));
  ASSERT_EQ(loaded.tensors.size(), 3u);
  EXPECT_EQ(loaded.tensors[0].second.shape(), ls::Shape{});
  EXPECT_EQ(loaded.tensors[0].second.item<int64_t>(), -5);
  EXPECT_EQ(loaded.tensors[1].second.shape(), ls::Shape{0});
  EXPECT_EQ(loaded.tensors[1].second.dtype(), ls::boolean);
  EXPECT_EQ(loaded.tensors[2].second.shape(), (ls::Shape{2, 0, 3}));
  EXPECT_TRUE(loaded.metadata.empty());
}

TEST_F(Safetensors, NoTensorsAtAll) {
  ls::io::save_safetensors(path("none.safetensors"), {}, {{"k", "v"}});
  const auto loaded = ls::io::load_safetensors(path("none.safetensors"));
  EXPECT_TRUE(loaded.tensors.empty());
  EXPECT_EQ(loaded.metadata, (ls::io::Metadata{{"k", "v"}}));
}

TEST_F(Safetensors, SavingComputesPendingTensors) {
  ls::Tensor a = ls::from_vector<float>({1, 2, 3});
  ls::Tensor b = a * 2.0f + 1.0f;
  ASSERT_TRUE(b.is_pending());
  ls::io::save_safetensors(path("p.safetensors"), {{"b", b}});
  EXPECT_FALSE(b.is_pending());
  const auto loaded = ls::io::load_safetensors(path("p.safetensors"));
  EXPECT_EQ(loaded.tensors[0].second.to_vector<float>(), (std::vector<float>{3, 5, 7}));
}

TEST_F(Safetensors, FileLayoutMatchesTheReferenceWriter) {
  ls::io::save_safetensors(
      path("l.safetensors"),
      {{"z", ls::ones({3}, ls::i64)}, {"a", ls::ones({2}, ls::boolean)}, {"m", ls::ones({1, 2})}},
      {{"format", "pt"}});
  const std::string bytes = read_file(path("l.safetensors"));
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  EXPECT_EQ(n % 8, 0u) << "header padded to a multiple of 8";
  EXPECT_EQ(bytes.size(), 8 + n + 24 + 2 + 8);
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.find_last_not_of(' '), header.rfind('}'));
  // Header order and data order are the order given.
  const ls::io::json::Value root = ls::io::json::parse(header);
  ASSERT_EQ(root.object.size(), 4u);
  EXPECT_EQ(root.object[0].key, "__metadata__");
  const char* names[3] = {"z", "a", "m"};
  const int64_t offsets[3][2] = {{0, 24}, {24, 26}, {26, 34}};
  const char* dtypes[3] = {"I64", "BOOL", "F32"};
  for (int i = 0; i < 3; ++i) {
    const auto& [name, entry] = root.object[i + 1];
    EXPECT_EQ(name, names[i]);
    ASSERT_EQ(entry.object.size(), 3u);
    EXPECT_EQ(entry.object[0].value.text, dtypes[i]);
    EXPECT_EQ(entry.object[2].value.array[0].integer, offsets[i][0]);
    EXPECT_EQ(entry.object[2].value.array[1].integer, offsets[i][1]);
  }
}

// tests/golden/pytorch.safetensors is written by tests/golden/make_safetensors_fixture.py with
// PyTorch's bytes, the reference writer's data order and Python's \u-escaped JSON.
TEST_F(Safetensors, ReadsAFileWrittenByPyTorch) {
  const auto loaded = ls::io::load_safetensors(LOCKSTEP_GOLDEN_DIR "/pytorch.safetensors");
  const std::string odd_name =
      "gr\xc3\xb6\xc3\x9f"
      "e/\xcf\x80\xf0\x9f\x98\x80";
  std::vector<std::string> names;
  for (const auto& [name, t] : loaded.tensors) names.push_back(name);
  // Header order (Python sorted the keys), not data order.
  EXPECT_EQ(names, (std::vector<std::string>{"bias", "empty", odd_name, "labels", "mask", "step",
                                             "weight"}));
  const auto get = [&](const std::string& name) {
    for (const auto& [n, t] : loaded.tensors)
      if (n == name) return t;
    throw std::runtime_error("no tensor " + name);
  };
  const ls::Tensor weight = get("weight");
  EXPECT_EQ(weight.shape(), (ls::Shape{2, 3}));
  EXPECT_EQ(raw(weight.to_vector<float>()),
            raw(std::vector<float>{0.5f, -1.25f, 3.0f, -0.0f, 1e-3f, 65504.0f}));
  EXPECT_EQ(get("bias").to_vector<double>(), (std::vector<double>{0.1, -2.5, 1e300}));
  EXPECT_EQ(get("step").shape(), ls::Shape{});
  EXPECT_EQ(get("step").item<int64_t>(), 42);
  EXPECT_EQ(get("labels").to_vector<int32_t>(),
            (std::vector<int32_t>{-7, 0, std::numeric_limits<int32_t>::max(),
                                  std::numeric_limits<int32_t>::min()}));
  EXPECT_EQ(get("mask").shape(), (ls::Shape{2, 2}));
  EXPECT_EQ(get("mask").to_vector<bool>(), (std::vector<bool>{true, false, false, true}));
  EXPECT_EQ(get("empty").shape(), (ls::Shape{0, 3}));
  EXPECT_EQ(get("empty").dtype(), ls::f32);
  EXPECT_EQ(get(odd_name).to_vector<int64_t>(), std::vector<int64_t>{-1});
  EXPECT_EQ(loaded.metadata,
            (ls::io::Metadata{{"format", "pt"}, {"note", "tab\there \"quoted\" caf\xc3\xa9"}}));

  // And what we write from it loads back the same.
  ls::io::save_safetensors(path("again.safetensors"), loaded.tensors, loaded.metadata);
  const auto again = ls::io::load_safetensors(path("again.safetensors"));
  ASSERT_EQ(again.tensors.size(), loaded.tensors.size());
  for (size_t i = 0; i < again.tensors.size(); ++i)
    expect_identical(again.tensors[i].second, loaded.tensors[i].second, again.tensors[i].first);
  EXPECT_EQ(again.metadata, loaded.metadata);
}

// ---- atomic save -----------------------------------------------------------------------------

TEST_F(Safetensors, SaveReplacesAnExistingFile) {
  ls::io::save_safetensors(path("c.safetensors"), {{"x", ls::ones({2})}});
  ls::io::save_safetensors(path("c.safetensors"), {{"y", ls::zeros({3}, ls::i32)}});
  const auto loaded = ls::io::load_safetensors(path("c.safetensors"));
  ASSERT_EQ(loaded.tensors.size(), 1u);
  EXPECT_EQ(loaded.tensors[0].first, "y");
  EXPECT_TRUE(temp_files().empty());
}

TEST_F(Safetensors, SaveIntoAMissingDirectoryFails) {
  const std::string target = path("no/such/dir/c.safetensors");
  try {
    ls::io::save_safetensors(target, {{"x", ls::ones({2})}});
    FAIL() << "expected an Error";
  } catch (const ls::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(target));
    EXPECT_THAT(e.what(), HasSubstr("No such file or directory"));
  }
  EXPECT_FALSE(fs::exists(path("no")));
}

// The temporary file cannot be created: its name ("<name>.tmp-<pid>") is longer than the
// directory's file system allows, which no permission bypasses (root's included, unlike a
// read-only directory). The save fails naming the file and the system's reason, and the old file
// stays as it was.
TEST_F(Safetensors, SaveThatCannotCreateItsTemporaryFileKeepsTheOldFile) {
  const long name_max = ::pathconf(dir_.c_str(), _PC_NAME_MAX);
  ASSERT_GT(name_max, 16) << "pathconf(_PC_NAME_MAX) of " << dir_;
  // The longest name the directory takes: the file itself fits, its temporary name does not.
  const std::string target = path(std::string(static_cast<size_t>(name_max), 'c'));
  ls::io::save_safetensors(path("c.safetensors"), {{"x", ls::ones({2})}});
  fs::rename(path("c.safetensors"), target);
  const std::string before = read_file(target);
  try {
    ls::io::save_safetensors(target, {{"y", ls::zeros({3})}});
    FAIL() << "expected an Error";
  } catch (const ls::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(target));
    EXPECT_THAT(e.what(), HasSubstr("cannot create the temporary file"));
    EXPECT_THAT(e.what(), HasSubstr("File name too long"));
  }
  EXPECT_EQ(read_file(target), before);
  EXPECT_TRUE(temp_files().empty());
}

// A directory of the path is a regular file: nothing can be created under it, root or not.
TEST_F(Safetensors, SaveUnderARegularFileFailsAndLeavesTheFile) {
  write_file(path("d"), "not a directory");
  const std::string target = path("d/c.safetensors");
  try {
    ls::io::save_safetensors(target, {{"x", ls::ones({2})}});
    FAIL() << "expected an Error";
  } catch (const ls::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(target));
    EXPECT_THAT(e.what(), HasSubstr("Not a directory"));
  }
  EXPECT_EQ(read_file(path("d")), "not a directory");
  EXPECT_TRUE(temp_files().empty());
}

// The temporary name is taken by a directory: the save cannot even start.
TEST_F(Safetensors, BlockedTemporaryFileKeepsTheOldFile) {
  ls::io::save_safetensors(path("c.safetensors"), {{"x", ls::ones({2})}});
  const std::string before = read_file(path("c.safetensors"));
  const std::string temp = path("c.safetensors.tmp-" + std::to_string(::getpid()));
  fs::create_directory(temp);
  try {
    ls::io::save_safetensors(path("c.safetensors"), {{"y", ls::zeros({3})}});
    FAIL() << "expected an Error";
  } catch (const ls::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(path("c.safetensors")));
    EXPECT_THAT(e.what(), HasSubstr("Is a directory"));
  }
  EXPECT_EQ(read_file(path("c.safetensors")), before);
  EXPECT_TRUE(fs::is_directory(temp)) << "not ours to remove";
}

// A directory where the file should go is refused before anything is written (not_files_test.cpp
// has the other things a path can be).
TEST_F(Safetensors, DirectoryTargetIsRefusedAndLeavesNoTemporaryFile) {
  fs::create_directories(path("c.safetensors/inside"));
  try {
    ls::io::save_safetensors(path("c.safetensors"), {{"y", ls::zeros({3})}});
    FAIL() << "expected an Error";
  } catch (const ls::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(path("c.safetensors")));
    EXPECT_THAT(e.what(), HasSubstr("is a directory"));
  }
  EXPECT_TRUE(fs::is_directory(path("c.safetensors/inside")));
  EXPECT_TRUE(temp_files().empty());
}

// Reading a value fails half-way through the data (a poisoned tensor).
TEST_F(Safetensors, FailureWhileWritingKeepsTheOldFile) {
  ls::io::save_safetensors(path("c.safetensors"), {{"x", ls::ones({2})}});
  const std::string before = read_file(path("c.safetensors"));
  ls::Tensor lost;
  EXPECT_THROW(ls::step([&] {
                 lost = ls::ones({4}) + 1.0f;
                 throw std::runtime_error("abandon the step");
               }),
               std::runtime_error);
  ASSERT_TRUE(lost.is_poisoned());
  EXPECT_THROW(
      ls::io::save_safetensors(path("c.safetensors"), {{"fine", ls::ones({1000})}, {"lost", lost}}),
      ls::Error);
  EXPECT_EQ(read_file(path("c.safetensors")), before);
  EXPECT_TRUE(temp_files().empty());
}

// The disk "fills up" (a file size limit makes write() fail with EFBIG).
TEST_F(Safetensors, WriteErrorKeepsTheOldFileAndNamesTheOsError) {
  ls::io::save_safetensors(path("c.safetensors"), {{"x", ls::ones({2})}});
  const std::string before = read_file(path("c.safetensors"));
  const ls::Tensor big = ls::ones({1 << 16});
  big.to_vector<float>();  // computed before the limit
  struct rlimit old_limit {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  const auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old_limit;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string message;
  try {
    ls::io::save_safetensors(path("c.safetensors"), {{"big", big}});
  } catch (const ls::Error& e) {
    message = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_THAT(message, HasSubstr(path("c.safetensors")));
  EXPECT_THAT(message, HasSubstr("File too large"));
  EXPECT_EQ(read_file(path("c.safetensors")), before);
  EXPECT_TRUE(temp_files().empty());
}

TEST_F(Safetensors, SaveRefusesBadNamesBeforeWritingAnything) {
  const std::string target = path("c.safetensors");
  const auto message = [&](const ls::io::TensorMap& m) {
    try {
      ls::io::save_safetensors(target, m);
    } catch (const ls::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_THAT(message({{"a", ls::ones({1})}, {"a", ls::ones({2})}}),
              HasSubstr("duplicate tensor name 'a'"));
  EXPECT_THAT(message({{"__metadata__", ls::ones({1})}}), HasSubstr("__metadata__"));
  EXPECT_THAT(message({{"x", ls::Tensor()}}), HasSubstr("empty handle"));
  EXPECT_THAT(message({{"bad\xff", ls::ones({1})}}), HasSubstr("not valid UTF-8"));
  EXPECT_FALSE(fs::exists(target));
  EXPECT_TRUE(temp_files().empty());
}

// ---- corrupt files ----------------------------------------------------------------------------

TEST_F(Safetensors, MissingFile) {
  const std::string msg = load_error(path("missing.safetensors"));
  EXPECT_THAT(msg, HasSubstr(path("missing.safetensors")));
  EXPECT_THAT(msg, HasSubstr("No such file or directory"));
}

TEST_F(Safetensors, DirectoryIsNotAFile) {
  EXPECT_THAT(load_error(dir_), HasSubstr("is a directory"));
}

TEST_F(Safetensors, EmptyFile) {
  write_file(path("e.safetensors"), "");
  const std::string msg = load_error(path("e.safetensors"));
  EXPECT_THAT(msg, HasSubstr(path("e.safetensors")));
  EXPECT_THAT(msg, HasSubstr("empty"));
}

TEST_F(Safetensors, TruncatedHeaderLength) {
  write_file(path("t.safetensors"), std::string("\x10\x00\x00", 3));
  EXPECT_THAT(load_error(path("t.safetensors")), HasSubstr("too short for the 8-byte header"));
}

TEST_F(Safetensors, HeaderLengthLargerThanTheFile) {
  const std::string file = write_st("h.safetensors", "{}", "", 4000);
  const std::string msg = load_error(file);
  EXPECT_THAT(msg, HasSubstr("header length 4000 is larger than the file"));
  EXPECT_THAT(msg, HasSubstr(file));
  EXPECT_THAT(load_error(write_st("h2.safetensors", "{}", "", ~uint64_t{0})),
              HasSubstr("larger than the file"));
}

TEST_F(Safetensors, HeaderLengthOverTheLimit) {
  // A sparse file big enough that only the 100 MB limit refuses the header.
  const std::string file = write_st("big.safetensors", "{}", "", 100'000'000);
  fs::resize_file(file, 100'000'100);
  EXPECT_THAT(load_error(file), HasSubstr("over the limit"));
}

TEST_F(Safetensors, InvalidJson) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "expected a value"},
      {"{\"a\":", "expected a value"},
      {"{'a':1}", "expected a string key"},
      {"{\"a\" 1}", "expected ':'"},
      {"{\"a\":1,}", "expected a string key"},
      {"{\"a\":[1 2]}", "expected ']'"},
      {"{} x", "after the value"},
      {"{\"a\":\"\\x\"}", "invalid escape"},
      {"{\"a\":\"\\u12G4\"}", "hex digits"},
      {"{\"a\":\"\\ud83d\"}", "high surrogate"},
      {"{\"a\":\"\\ude00\"}", "low surrogate"},
      {"{\"a\":\"\xc3(\"}", "invalid UTF-8"},
      {"{\"a\":\"\xed\xa0\x80\"}", "invalid UTF-8"},  // an encoded surrogate
      {"{\"a\":\"\xc0\xaf\"}", "invalid UTF-8"},      // overlong '/'
      {"{\"a\":\"tab\there\"}", "control character"},
      {"{\"a\":\"open", "unterminated string"},
      {"{\"a\":01}", "leading zero"},
      {"{\"a\":-}", "expected digits"},
      {"{\"a\":1.}", "after '.'"},
      {"{\"a\":99999999999999999999}", "does not fit in 64 bits"},
      {"{\"a\":tru}", "expected a value"},
      {std::string(200, '[') + std::string(200, ']'), "nesting deeper"},
  };
  for (const auto& [header, problem] : cases) {
    SCOPED_TRACE(header);
    const std::string msg = load_error(write_st("j.safetensors", header, ""));
    EXPECT_THAT(msg, HasSubstr("invalid JSON"));
    EXPECT_THAT(msg, HasSubstr(problem));
  }
}

TEST_F(Safetensors, HeaderOfTheWrongShape) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[1,2]", "must be a JSON object, found an array"},
      {"{\"x\":3}", "tensor 'x' must be an object"},
      {"{\"x\":{\"shape\":[1],\"data_offsets\":[0,4]}}", "tensor 'x' has no \"dtype\""},
      {"{\"x\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", "has no \"shape\""},
      {"{\"x\":{\"dtype\":\"F32\",\"shape\":[1]}}", "has no \"data_offsets\""},
      {"{\"x\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
       "has \"dtype\" twice"},
      {"{\"x\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", "not a string"},
      {"{\"x\":{\"dtype\":\"F32\",\"shape\":1,\"data_offsets\":[0,4]}}", "not an array"},
      {"{\"x\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", "not an integer"},
      {"{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", "not a pair"},
      {"{\"__metadata__\":[],\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
       "\"__metadata__\" must be an object"},
      {"{\"__metadata__\":{\"k\":1}}", "value of 'k' must be a string"},
      {"{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", "key 'k' twice"},
      {"{\"__metadata__\":{},\"__metadata__\":{}}", "\"__metadata__\" twice"},
  };
  for (const auto& [header, problem] : cases) {
    SCOPED_TRACE(header);
    EXPECT_THAT(load_error(write_st("w.safetensors", header, std::string(8, '\0'))),
                HasSubstr(problem));
  }
}

TEST_F(Safetensors, UnknownDtype) {
  const std::string msg = load_error(
      write_st("d.safetensors", R"({"fc.weight":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})",
               std::string(4, '\0')));
  EXPECT_THAT(msg, HasSubstr("tensor 'fc.weight' has unsupported dtype 'F16'"));
}

TEST_F(Safetensors, NegativeShape) {
  EXPECT_THAT(load_error(write_st("n.safetensors",
                                  R"({"x":{"dtype":"F32","shape":[2,-1],"data_offsets":[0,8]}})",
                                  std::string(8, '\0'))),
              HasSubstr("tensor 'x' has a negative dimension in shape [2, -1]"));
}

TEST_F(Safetensors, ShapeDoesNotMatchTheSpan) {
  const std::string msg = load_error(
      write_st("m.safetensors", R"({"x":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})",
               std::string(24, '\0')));
  EXPECT_THAT(msg, HasSubstr("tensor 'x' has shape [2, 3] of F32, which needs 24 bytes"));
  EXPECT_THAT(msg, HasSubstr("size mismatch"));
  EXPECT_THAT(load_error(write_st(
                  "o.safetensors",
                  R"({"x":{"dtype":"I64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
                  std::string(8, '\0'))),
              HasSubstr("too large"));
}

TEST_F(Safetensors, OffsetsOutOfRange) {
  const std::string msg = load_error(
      write_st("r.safetensors", R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[100,108]}})",
               std::string(8, '\0')));
  EXPECT_THAT(msg, HasSubstr("out of range"));
  EXPECT_THAT(msg, HasSubstr("tensor 'x'"));
  EXPECT_THAT(load_error(write_st("r2.safetensors",
                                  R"({"x":{"dtype":"F32","shape":[0],"data_offsets":[9,9]}})",
                                  std::string(8, '\0'))),
              HasSubstr("out of range"));
  EXPECT_THAT(load_error(write_st("r3.safetensors",
                                  R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})",
                                  std::string(8, '\0'))),
              HasSubstr("negative data_offsets [-4, 0]"));
  EXPECT_THAT(load_error(write_st("r4.safetensors",
                                  R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})",
                                  std::string(8, '\0'))),
              HasSubstr("out of order"));
}

TEST_F(Safetensors, OverlappingOffsets) {
  const std::string msg =
      load_error(write_st("o.safetensors",
                          R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},)"
                          R"("b":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})",
                          std::string(12, '\0')));
  EXPECT_THAT(msg, HasSubstr("tensors 'b' (data_offsets [0, 8]) and 'a' (data_offsets [4, 12])"));
  EXPECT_THAT(msg, HasSubstr("overlap"));
}

TEST_F(Safetensors, TruncatedData) {
  ls::io::save_safetensors(path("t.safetensors"),
                           {{"a", ls::ones({4})}, {"fc.weight", ls::ones({16, 16})}});
  const uint64_t size = fs::file_size(path("t.safetensors"));
  fs::resize_file(path("t.safetensors"), size - 100);
  const std::string msg = load_error(path("t.safetensors"));
  EXPECT_THAT(msg, HasSubstr(path("t.safetensors")));
  EXPECT_THAT(msg, HasSubstr("truncated"));
  EXPECT_THAT(msg, HasSubstr("data ends at byte " + std::to_string(size - 100) +
                             " but tensor 'fc.weight' needs bytes up to " + std::to_string(size)));
}

TEST_F(Safetensors, DuplicateNames) {
  EXPECT_THAT(load_error(write_st("dup.safetensors",
                                  R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                  R"("x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                  std::string(8, '\0'))),
              HasSubstr("tensor 'x' appears twice: duplicate tensor name"));
}

// Nothing reaches a device until the whole file has been checked.
TEST_F(Safetensors, NoTensorIsCreatedFromABadFile) {
  const std::string file = write_st("late.safetensors",
                                    R"({"good":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                    R"("bad":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                                    std::string(12, '\0'));
  const int64_t uploaded = ls::metrics::counter("bytes_to_device");
  EXPECT_THAT(load_error(file), HasSubstr("tensor 'bad' needs bytes up to"));
  EXPECT_EQ(ls::metrics::counter("bytes_to_device"), uploaded);
}

// Every truncation is refused, and no corrupted byte crashes the reader (the suite also runs
// under ASan and UBSan): each load either succeeds or throws Error.
TEST_F(Safetensors, CorruptedBytesNeverCrash) {
  ls::io::save_safetensors(path("f.safetensors"),
                           {{"a", ls::ones({3}, ls::i64)}, {"b\\u", ls::zeros({2, 2})}},
                           {{"k", "v"}});
  const std::string good = read_file(path("f.safetensors"));
  for (size_t len = 0; len < good.size(); ++len) {
    write_file(path("g.safetensors"), good.substr(0, len));
    EXPECT_THROW(ls::io::load_safetensors(path("g.safetensors")), ls::Error) << len;
  }
  uint32_t state = 12345;
  const auto next = [&] { return state = state * 1664525u + 1013904223u; };
  for (int i = 0; i < 500; ++i) {
    std::string bad = good;
    for (int k = 0; k < 1 + i % 3; ++k) bad[next() % 120] = static_cast<char>(next() >> 24);
    write_file(path("g.safetensors"), bad);
    try {
      ls::io::load_safetensors(path("g.safetensors"));
    } catch (const ls::Error&) {
    }
  }
}

// Keys in any order, unknown fields ignored, no checksums, bools normalized.
TEST_F(Safetensors, AcceptsWhatOtherWritersMayProduce) {
  std::string data(5, '\0');
  data[4] = 7;  // a bool byte other than 0/1 reads as true
  const int32_t v = -3;
  std::memcpy(data.data(), &v, 4);
  const std::string file = write_st(
      "other.safetensors",
      " {\n \"flag\" : {\"data_offsets\":[4,5], \"shape\":[1], \"dtype\":\"BOOL\", \"x\":[{}]},"
      "\"\\u0076\" : {\"shape\":[], \"dtype\":\"I32\", \"data_offsets\":[0,4]},\n"
      "\"__metadata__\": null }   ",
      data);
  const auto loaded = ls::io::load_safetensors(file);
  ASSERT_EQ(loaded.tensors.size(), 2u);
  EXPECT_EQ(loaded.tensors[0].first, "flag");
  EXPECT_EQ(loaded.tensors[0].second.to_vector<bool>(), std::vector<bool>{true});
  EXPECT_EQ(loaded.tensors[1].first, "v");
  EXPECT_EQ(loaded.tensors[1].second.item<int32_t>(), -3);
  EXPECT_TRUE(loaded.metadata.empty());
}

// The data area must be covered exactly, as the reference reader requires: a gap, bytes after
// the last tensor, or a header length lowered into its padding (every tensor read shifted) are
// refused, naming what is wrong (issue 30, item 9).
TEST_F(Safetensors, TheDataMustBeCoveredExactly) {
  EXPECT_THAT(load_error(write_st("gap.safetensors",
                                  R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                  R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                                  std::string(12, '\0'))),
              HasSubstr("bytes [4, 8) of the data belong to no tensor (between 'a' and 'b')"));
  EXPECT_THAT(load_error(write_st("tail.safetensors",
                                  R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                                  std::string(9, '\0'))),
              HasSubstr("the data area has 9 bytes but its tensors cover 4"));
  // Every header length lowered by 1 to 7 bytes: refused (some still parse as JSON).
  ls::io::save_safetensors(path("s.safetensors"), {{"w", ls::arange(0, 64, 1, ls::f32)}},
                           {{"run", "a"}});
  const std::string good = read_file(path("s.safetensors"));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(good[i]);
  int parsed = 0;
  for (uint64_t k = 1; k <= 7; ++k) {
    std::string bad = good;
    for (int i = 0; i < 8; ++i) bad[i] = static_cast<char>(((n - k) >> (8 * i)) & 0xFF);
    write_file(path("l.safetensors"), bad);
    const std::string msg = load_error(path("l.safetensors"));
    if (msg.find("header length is wrong") != std::string::npos) ++parsed;
    EXPECT_THAT(msg, HasSubstr(path("l.safetensors")));
  }
  EXPECT_GE(parsed, 1) << "no lowered length parsed: the padding case is not exercised";
}

// The writer records each tensor's CRC-32; a flipped bit anywhere in the data is refused naming
// the tensor, files without checksums (other writers, older lockstep) still load, and the
// metadata seen by the caller is what the caller wrote.
TEST_F(Safetensors, ChecksumsCatchEveryFlippedDataBit) {
  ls::io::save_safetensors(
      path("c.safetensors"),
      {{"first", ls::arange(0, 10, 1, ls::i64)}, {"second", ls::linspace(-1, 1, 50)}},
      {{"run", "b"}});
  const std::string good = read_file(path("c.safetensors"));
  const ls::io::Loaded loaded = ls::io::load_safetensors(path("c.safetensors"));
  EXPECT_EQ(loaded.metadata, (ls::io::Metadata{{"run", "b"}}));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(good[i]);
  const size_t data = 8 + n;
  ASSERT_EQ(good.size(), data + 80 + 200);
  uint32_t state = 7;
  for (int trial = 0; trial < 300; ++trial) {
    state = state * 1664525u + 1013904223u;
    const size_t byte = data + (state >> 8) % (good.size() - data);
    std::string bad = good;
    bad[byte] = static_cast<char>(bad[byte] ^ (1 << (state & 7)));
    write_file(path("flip.safetensors"), bad);
    const std::string msg = load_error(path("flip.safetensors"));
    EXPECT_THAT(msg, HasSubstr(byte < data + 80 ? "tensor 'first'" : "tensor 'second'"));
    EXPECT_THAT(msg, HasSubstr("CRC-32"));
  }
  // The writer's key is its own.
  EXPECT_THROW(ls::io::save_safetensors(path("k.safetensors"), {{"x", ls::ones({1})}},
                                        {{ls::io::kChecksumKey, "{}"}}),
               ls::Error);
}

// A header that claims more than the machine's memory is refused before any data is read, and a
// vetting caller can refuse a file or skip tensors from the header alone (issue 30, item 10).
TEST_F(Safetensors, ClaimedSizesAreCheckedBeforeAnyDataIsRead) {
  // A sparse file that really is 64 GiB long, holding one tensor of all of it.
  const uint64_t huge = uint64_t{64} << 30;
  const std::string header = R"({"big":{"dtype":"F32","shape":[)" + std::to_string(huge / 4) +
                             R"(],"data_offsets":[0,)" + std::to_string(huge) + "]}}";
  const std::string file = write_st("big.safetensors", header, "");
  fs::resize_file(file, 8 + header.size() + huge);
  EXPECT_THAT(load_error(file), HasSubstr("more than this machine's memory"));

  ls::io::save_safetensors(path("v.safetensors"),
                           {{"keep", ls::ones({2})}, {"skip", ls::ones({1000})}});
  std::vector<std::string> seen;
  const ls::io::Loaded some = ls::io::load_safetensors(
      path("v.safetensors"), ls::default_device(),
      [&](const ls::io::Metadata&, const std::vector<ls::io::TensorInfo>& infos) {
        for (const auto& info : infos) seen.push_back(info.name + ls::shape_str(info.shape));
        return std::set<std::string>{"keep"};
      });
  EXPECT_EQ(seen, (std::vector<std::string>{"keep[2]", "skip[1000]"}));
  ASSERT_EQ(some.tensors.size(), 1u);
  EXPECT_EQ(some.tensors[0].first, "keep");
}

// A save killed midway leaves its temporary file; the next save removes it before writing (on a
// nearly full disk it may be the room the save needs), not only after succeeding (issue 30,
// item 8). A temporary of a process still running stays.
TEST_F(Safetensors, LeftoverTemporariesAreRemovedBeforeASave) {
  pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);
  const std::string stale = path("d.safetensors.tmp-" + std::to_string(dead));
  write_file(stale, std::string(1000, 'x'));
  const std::string live = path("d.safetensors.tmp-" + std::to_string(::getppid()));
  write_file(live, "y");
  // A directory where the new file should go makes the save fail: the stale one must be gone by
  // then all the same.
  fs::create_directories(path("d.safetensors/inside"));
  EXPECT_THROW(ls::io::save_safetensors(path("d.safetensors"), {{"x", ls::ones({2})}}), ls::Error);
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(live));
  fs::remove(live);
}
