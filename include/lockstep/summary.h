// TensorBoard logging: ls::SummaryWriter writes scalars and text as TensorBoard's event files
// (tfevents), with the names and arguments of torch.utils.tensorboard.SummaryWriter. Not here:
// images, histograms, graphs, embeddings (only what a training run's curves and notes need).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace lockstep {

struct SummaryWriterOptions {
  // Where the event files go. Empty: "runs/<Mon><DD>_<HH>-<MM>-<SS>_<host><comment>", as
  // PyTorch's default.
  std::string log_dir{};
  // Appended to the default log_dir (ignored when log_dir is given).
  std::string comment{};
  // When set, TensorBoard discards the events of earlier runs in log_dir at this step and after
  // (a session-start event at this step): a resumed run replaces what it redoes.
  std::optional<int64_t> purge_step{};
  // Events are buffered in memory and written by a background thread once this many are queued,
  // every flush_secs seconds, and on flush() and close().
  int64_t max_queue = 10;
  double flush_secs = 120;
  // Appended to every event file's name.
  std::string filename_suffix{};
};

// One run's event files: log_dir/events.out.tfevents.<time>.<host>.<pid>.<n><suffix>, and one more
// run directory for each tag of add_scalars. Thread-safe: the add_* functions only encode and
// queue (no file I/O), so they may be called from step closures on the runtime's thread.
// Errors (a log_dir that cannot be created, a file that cannot be written) are ls::Error naming
// the path; a write that fails in the background is raised by the next call.
class SummaryWriter {
 public:
  explicit SummaryWriter(SummaryWriterOptions options = {});
  explicit SummaryWriter(const std::string& log_dir);
  // Closes; an error it meets is printed to stderr (call close() to have it thrown).
  ~SummaryWriter();
  SummaryWriter(const SummaryWriter&) = delete;
  SummaryWriter& operator=(const SummaryWriter&) = delete;

  // global_step: the event's step (none: 0, as PyTorch); walltime: seconds since the epoch (none:
  // now). The value is stored as float32 (TensorBoard's simple_value).
  void add_scalar(const std::string& tag, double scalar_value,
                  std::optional<int64_t> global_step = std::nullopt,
                  std::optional<double> walltime = std::nullopt);
  // Each value goes to the run log_dir/<main_tag with '/' as '_'>_<tag>, under the tag main_tag,
  // so that TensorBoard draws them in one chart (PyTorch's layout). One walltime for all.
  void add_scalars(const std::string& main_tag,
                   const std::vector<std::pair<std::string, double>>& tag_scalar_dict,
                   std::optional<int64_t> global_step = std::nullopt,
                   std::optional<double> walltime = std::nullopt);
  // Markdown text for TensorBoard's text dashboard, under the tag "<tag>/text_summary" (PyTorch's).
  void add_text(const std::string& tag, const std::string& text_string,
                std::optional<int64_t> global_step = std::nullopt,
                std::optional<double> walltime = std::nullopt);
  // Writes every queued event and flushes the files (blocks for the I/O).
  void flush();
  // Flushes, stops the background thread and closes the files; later add_* calls are an error.
  // A second close does nothing.
  void close();

  const std::string& log_dir() const;
  // The main run's event file.
  const std::string& file_name() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lockstep
