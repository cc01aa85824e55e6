// Paths that are not regular files (util/files.h): loading a FIFO, device or directory is refused
// without blocking; saving never replaces a FIFO, device, directory or symbolic link, keeps an
// existing file's permission bits, and refuses a path with a NUL character. Not the formats
// themselves (safetensors_test.cpp, data_test.cpp).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <string>

#include <lockstep/lockstep.h>

#include "data/io.h"

namespace ls = lockstep;
namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

namespace {

class NotRegularFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "ls_not_files_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (fs::path(dir_) / name).string(); }
  std::string fifo(const std::string& name) const {
    const std::string p = path(name);
    EXPECT_EQ(::mkfifo(p.c_str(), 0644), 0);
    return p;
  }
  static ls::io::TensorMap tensors() { return {{"w", ls::full({2, 2}, 1.5f)}}; }
  static mode_t mode_of(const std::string& p) {
    struct stat st {};
    EXPECT_EQ(::lstat(p.c_str(), &st), 0);
    return st.st_mode;
  }

  std::string dir_;
};

// The message of the Error `fn` throws on another thread; a call still blocked after 10 s is a
// failure, and a writer opened on `fifo` then lets it return.
std::string error_within(const std::function<void()>& fn, const std::string& fifo = "") {
  auto done = std::async(std::launch::async, [&]() -> std::string {
    try {
      fn();
    } catch (const ls::Error& e) {
      return e.what();
    }
    return "(no error)";
  });
  if (done.wait_for(10s) != std::future_status::ready) {
    ADD_FAILURE() << "blocked for 10 s (a hang)";
    if (!fifo.empty()) ::close(::open(fifo.c_str(), O_WRONLY | O_NONBLOCK));
  }
  return done.get();
}

}  // namespace

TEST_F(NotRegularFiles, LoadingAFifoADeviceOrADirectoryIsRefusedWithoutBlocking) {
  const std::string f = fifo("pipe.safetensors");
  EXPECT_THAT(error_within([&] { ls::io::load_safetensors(f); }, f),
              AllOf(HasSubstr(f), HasSubstr("is a FIFO")));
  EXPECT_THAT(error_within([&] { ls::data::io::read_file(f); }, f),
              AllOf(HasSubstr(f), HasSubstr("is a FIFO")));
  const std::string gz = fifo("pipe.gz");
  EXPECT_THAT(error_within([&] { ls::data::io::read_file(gz); }, gz), HasSubstr("is a FIFO"));
  EXPECT_THAT(error_within([&] { ls::io::load_safetensors("/dev/null"); }),
              AllOf(HasSubstr("/dev/null"), HasSubstr("is a character device")));
  EXPECT_THAT(error_within([&] { ls::io::load_safetensors(dir_); }), HasSubstr("is a directory"));
  // Through a symbolic link, loading reads the link's target (a FIFO is still refused).
  ls::io::save_safetensors(path("real"), tensors());
  fs::create_symlink(path("real"), path("link"));
  EXPECT_EQ(ls::io::load_safetensors(path("link")).tensors.size(), 1u);
  fs::create_symlink(f, path("to-pipe"));
  EXPECT_THAT(error_within([&] { ls::io::load_safetensors(path("to-pipe")); }, f),
              HasSubstr("is a FIFO"));
}

TEST_F(NotRegularFiles, SavingNeverReplacesAFifoADeviceADirectoryOrASymbolicLink) {
  const std::string f = fifo("pipe.safetensors");
  EXPECT_THAT(error_within([&] { ls::io::save_safetensors(f, tensors()); }, f),
              AllOf(HasSubstr(f), HasSubstr("is a FIFO")));
  EXPECT_TRUE(S_ISFIFO(mode_of(f)));
  fs::create_directory(path("dir"));
  EXPECT_THAT(error_within([&] { ls::io::save_safetensors(path("dir"), tensors()); }),
              HasSubstr("is a directory"));
  EXPECT_TRUE(S_ISDIR(mode_of(path("dir"))));
  // A symbolic link is not followed: neither the link nor its target changes.
  { std::ofstream(path("target")) << "old"; }
  fs::create_symlink(path("target"), path("link"));
  EXPECT_THAT(error_within([&] { ls::io::save_safetensors(path("link"), tensors()); }),
              AllOf(HasSubstr("is a symbolic link"), HasSubstr(path("target"))));
  EXPECT_TRUE(S_ISLNK(mode_of(path("link"))));
  EXPECT_EQ(fs::file_size(path("target")), 3u);
  // The check a program makes before it saves late; /dev/null is only checked, never saved to.
  EXPECT_THAT(error_within([] { ls::io::check_save_path("/dev/null"); }),
              HasSubstr("is a character device"));
  EXPECT_THAT(error_within([&] { ls::io::check_save_path(f); }), HasSubstr("is a FIFO"));
  EXPECT_NO_THROW(ls::io::check_save_path(path("new")));
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().string().find(".tmp-"), std::string::npos) << e.path();
}

TEST_F(NotRegularFiles, SavingKeepsTheFilesPermissionsAndMakesANewFile) {
  ls::io::save_safetensors(path("a"), tensors());
  ASSERT_EQ(::chmod(path("a").c_str(), 0640), 0);
  ls::io::save_safetensors(path("a"), tensors());
  EXPECT_EQ(mode_of(path("a")) & 07777, 0640u);
  ASSERT_EQ(::chmod(path("a").c_str(), 0600), 0);
  ls::io::save_safetensors(path("a"), tensors());
  EXPECT_EQ(mode_of(path("a")) & 07777, 0600u);
  // A hard link keeps the file as it was: the save is a new file renamed over the path.
  fs::create_hard_link(path("a"), path("b"));
  const auto before = fs::file_size(path("b"));
  ls::io::save_safetensors(path("a"), {{"w", ls::full({8, 8}, 2.0f)}});
  EXPECT_EQ(fs::file_size(path("b")), before);
  EXPECT_GT(fs::file_size(path("a")), before);
  EXPECT_EQ(mode_of(path("a")) & 07777, 0600u);
}

TEST_F(NotRegularFiles, APathWithANulCharacterIsRefusedNotCutShort) {
  const std::string cut = path("a");
  const std::string with_nul = cut + std::string(1, '\0') + "b";
  EXPECT_THAT(error_within([&] { ls::io::save_safetensors(with_nul, tensors()); }),
              HasSubstr("NUL character"));
  EXPECT_FALSE(fs::exists(cut));
  ls::io::save_safetensors(cut, tensors());
  EXPECT_THAT(error_within([&] { ls::io::load_safetensors(with_nul); }),
              HasSubstr("NUL character"));
  EXPECT_THAT(error_within([&] { ls::data::io::read_file(with_nul); }), HasSubstr("NUL character"));
}
