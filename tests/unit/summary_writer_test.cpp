// ls::SummaryWriter (lockstep/summary.h): the CRC, the TFRecord framing and the protobuf bytes of
// its events against values TensorBoard's own Python code gives (its RecordWriter, masked_crc32c
// and protobuf classes), and the files it writes. python/tests/test_tensorboard.py reads them
// with TensorBoard's reader.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "io/tfevents.h"
#include "lockstep/lockstep.h"

namespace ls = lockstep;
namespace tfe = lockstep::io::tfevents;
namespace fs = std::filesystem;

namespace {

std::string hex(const std::string& bytes) {
  static const char* const kDigits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

uint64_t le(const std::string& s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(s[at + i])) << (8 * i);
  return v;
}

// The records of a TFRecord file, each checked against its two masked CRCs.
std::vector<std::string> records(const std::string& file) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < file.size()) {
    EXPECT_LE(at + 12, file.size());
    const uint64_t n = le(file, at, 8);
    EXPECT_EQ(le(file, at + 8, 4), tfe::masked_crc32c(file.substr(at, 8)));
    EXPECT_LE(at + 16 + n, file.size());
    out.push_back(file.substr(at + 12, n));
    EXPECT_EQ(le(file, at + 12 + n, 4), tfe::masked_crc32c(out.back()));
    at += 16 + n;
  }
  return out;
}

class TempDir {
 public:
  TempDir() {
    path_ = (fs::temp_directory_path() /
             ("lockstep-summary-" + std::to_string(getpid()) + "-" + std::to_string(counter_++)))
                .string();
    fs::remove_all(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::string path_;
};

std::vector<std::string> event_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) out.push_back(e.path().string());
  return out;
}

}  // namespace

TEST(SummaryWriter, Crc32cOfTheCheckString) {
  EXPECT_EQ(tfe::crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(tfe::crc32c(""), 0u);
  // TensorBoard's masked_crc32c(b"123456789").
  EXPECT_EQ(tfe::masked_crc32c("123456789"), 0xc78ab0e5u);
}

TEST(SummaryWriter, FramingMatchesTensorBoardsRecordWriter) {
  // RecordWriter(buf).write(b""): the length, its masked CRC, no data, the data's masked CRC.
  EXPECT_EQ(hex(tfe::frame_record("")), "000000000000000029039807d8ea82a2");
  const std::string event = tfe::scalar_event(1.5, 3, "loss", 0.25f);
  EXPECT_EQ(hex(tfe::frame_record(event)),
            "1a00000000000000129bd82d09000000000000f83f10032a0d0a0b0a046c6f7373150000803ed054b255");
}

TEST(SummaryWriter, EventBytesMatchProtobufs) {
  // Event(wall_time=1.5, step=3, summary=Summary(value=[Value(tag="loss", simple_value=0.25)]))
  EXPECT_EQ(hex(tfe::scalar_event(1.5, 3, "loss", 0.25f)),
            "09000000000000f83f10032a0d0a0b0a046c6f7373150000803e");
  // Event(wall_time=2.0, file_version="brain.Event:2")
  EXPECT_EQ(hex(tfe::file_version_event(2.0)), "0900000000000000401a0d627261696e2e4576656e743a32");
  // Event(step=-1, summary=...(tag="z", simple_value=0.0)): no wall_time; a zero value is kept.
  EXPECT_EQ(hex(tfe::scalar_event(0, -1, "z", 0.0f)),
            "10ffffffffffffffffff012a0a0a080a017a1500000000");
  // PyTorch's text("note", "hi") at wall_time=1.0, step=7.
  EXPECT_EQ(hex(tfe::text_event(1.0, 7, "note/text_summary", "hi")),
            "09000000000000f03f10072a2d0a2b0a116e6f74652f746578745f73756d6d617279420c08071204120208"
            "01420268694a080a060a0474657874");
  // Event(wall_time=1.0, step=5, session_log=SessionLog(status=START))
  EXPECT_EQ(hex(tfe::session_start_event(1.0, 5)), "09000000000000f03f10053a020801");
}

TEST(SummaryWriter, WritesFramedEventsOnClose) {
  TempDir dir;
  std::string name;
  {
    ls::SummaryWriter w(ls::SummaryWriterOptions{.log_dir = dir.path(), .filename_suffix = ".x"});
    name = w.file_name();
    EXPECT_EQ(w.log_dir(), dir.path());
    // events.out.tfevents.<10-digit time>.<host>.<pid>.<n><suffix>
    const std::string base = fs::path(name).filename().string();
    EXPECT_EQ(base.rfind("events.out.tfevents.", 0), 0u) << base;
    EXPECT_NE(base.find("." + std::to_string(getpid()) + "."), std::string::npos) << base;
    EXPECT_EQ(base.substr(base.size() - 2), ".x");
    for (int i = 0; i < 3; ++i) w.add_scalar("loss", 1.0 / (i + 1), i, 100.0 + i);
    w.add_text("note", "hello", 2, 200.0);
    // The file_version event is written when the file is made; the rest is still queued.
    EXPECT_EQ(records(read_file(name)).size(), 1u);
    w.close();
    w.close();
    EXPECT_THROW(w.add_scalar("loss", 1.0), ls::Error);
  }
  const std::vector<std::string> r = records(read_file(name));
  ASSERT_EQ(r.size(), 5u);
  EXPECT_NE(r[0].find("brain.Event:2"), std::string::npos);
  EXPECT_EQ(r[1], tfe::scalar_event(100.0, 0, "loss", 1.0f));
  EXPECT_EQ(r[2], tfe::scalar_event(101.0, 1, "loss", 0.5f));
  EXPECT_EQ(r[3], tfe::scalar_event(102.0, 2, "loss", static_cast<float>(1.0 / 3)));
  EXPECT_EQ(r[4], tfe::text_event(200.0, 2, "note/text_summary", "hello"));
}

TEST(SummaryWriter, MaxQueueAndFlushSecsWriteInTheBackground) {
  TempDir dir;
  ls::SummaryWriter w(ls::SummaryWriterOptions{.log_dir = dir.path(), .max_queue = 2});
  w.add_scalar("a", 1, 1);
  w.add_scalar("a", 2, 2);  // the queue is full: the background thread writes both
  for (int i = 0; i < 500 && records(read_file(w.file_name())).size() < 3; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(records(read_file(w.file_name())).size(), 3u);

  TempDir dir2;
  ls::SummaryWriter timed(ls::SummaryWriterOptions{.log_dir = dir2.path(), .flush_secs = 0.05});
  timed.add_scalar("b", 1, 1);
  for (int i = 0; i < 500 && records(read_file(timed.file_name())).size() < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(records(read_file(timed.file_name())).size(), 2u);
  timed.flush();
}

TEST(SummaryWriter, AddScalarsWritesOneRunPerTag) {
  TempDir dir;
  {
    ls::SummaryWriter w(dir.path());
    w.add_scalars("loss/run", {{"train", 1.5}, {"test", 2.5}}, 4, 50.0);
  }
  for (const auto& [sub, value] : std::vector<std::pair<std::string, float>>{
           {"loss_run_train", 1.5f}, {"loss_run_test", 2.5f}}) {
    const std::vector<std::string> files = event_files(dir.path() + "/" + sub);
    ASSERT_EQ(files.size(), 1u) << sub;
    const std::vector<std::string> r = records(read_file(files[0]));
    ASSERT_EQ(r.size(), 2u);
    EXPECT_EQ(r[1], tfe::scalar_event(50.0, 4, "loss/run", value));
  }
  // The main run has only its file_version event.
  EXPECT_EQ(records(read_file(event_files(dir.path())[0])).size(), 1u);
}

TEST(SummaryWriter, PurgeStepWritesASessionStart) {
  TempDir dir;
  std::string name;
  {
    ls::SummaryWriter w(ls::SummaryWriterOptions{.log_dir = dir.path(), .purge_step = 5});
    name = w.file_name();
  }
  const std::vector<std::string> r = records(read_file(name));
  ASSERT_EQ(r.size(), 3u);
  // Event(step=5, file_version=...) then Event(step=5, session_log=START), each with a wall_time.
  EXPECT_EQ(hex(r[1].substr(9)), "10051a0d627261696e2e4576656e743a32");
  EXPECT_EQ(hex(r[2].substr(9)), "10053a020801");
}

TEST(SummaryWriter, ConcurrentWritersLoseNothing) {
  TempDir dir;
  std::string name;
  {
    ls::SummaryWriter w(ls::SummaryWriterOptions{.log_dir = dir.path(), .max_queue = 3});
    name = w.file_name();
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&w, t] {
        for (int i = 0; i < 200; ++i) w.add_scalar("t" + std::to_string(t), i, i);
      });
    for (auto& th : threads) th.join();
  }
  EXPECT_EQ(records(read_file(name)).size(), 801u);
}

TEST(SummaryWriter, UnwritableDirectoryNamesThePath) {
  TempDir dir;
  fs::create_directories(dir.path());
  const std::string file = dir.path() + "/a-file";
  std::ofstream(file) << "x";
  try {
    ls::SummaryWriter w(file + "/run");
    FAIL() << "no error";
  } catch (const ls::Error& e) {
    EXPECT_NE(std::string(e.what()).find(file + "/run"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("log_dir"), std::string::npos) << e.what();
  }
  if (geteuid() != 0) {  // root writes anywhere
    const std::string ro = dir.path() + "/read-only";
    fs::create_directories(ro);
    chmod(ro.c_str(), 0555);
    EXPECT_THROW(ls::SummaryWriter w(ro), ls::Error);
  }
  EXPECT_THROW(ls::SummaryWriter(ls::SummaryWriterOptions{.log_dir = dir.path(), .max_queue = 0}),
               ls::Error);
}

TEST(SummaryWriter, DefaultLogDirIsPyTorchs) {
  TempDir dir;
  fs::create_directories(dir.path());
  const fs::path cwd = fs::current_path();
  fs::current_path(dir.path());
  std::string log_dir;
  {
    ls::SummaryWriter w(ls::SummaryWriterOptions{.comment = "_lr0.1"});
    log_dir = w.log_dir();
  }
  fs::current_path(cwd);
  // runs/<Mon><DD>_<HH>-<MM>-<SS>_<host>_lr0.1
  EXPECT_EQ(log_dir.rfind("runs/", 0), 0u) << log_dir;
  EXPECT_EQ(log_dir.substr(log_dir.size() - 6), "_lr0.1");
  EXPECT_EQ(log_dir[10], '_') << log_dir;
  EXPECT_EQ(log_dir[13], '-') << log_dir;
  EXPECT_TRUE(fs::is_directory(dir.path() + "/" + log_dir));
}
