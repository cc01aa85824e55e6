// The per-thread stack of module calls (frames.h).
#include "util/frames.h"

#include <cstring>
#include <vector>

namespace lockstep::util {
namespace {

struct Frame {
  const void* owner;
  std::shared_ptr<const std::string> path;
  Loc loc;
};

thread_local std::vector<Frame> t_frames;
thread_local const char* t_user_op = nullptr;

// lockstep's src/ directory, from this file's own path (src/util/frames.cpp).
const std::string& library_dir() {
  static const std::string dir = [] {
    const std::string self = Loc::current().file_name();
    const size_t at = self.rfind("util/frames.cpp");
    return at == std::string::npos ? std::string() : self.substr(0, at);
  }();
  return dir;
}

}  // namespace

ModuleFrame::ModuleFrame(const void* owner, std::shared_ptr<const std::string> path,
                         const Loc& loc) {
  t_frames.push_back({owner, std::move(path), loc});
}

ModuleFrame::~ModuleFrame() { t_frames.pop_back(); }

const void* current_module() { return t_frames.empty() ? nullptr : t_frames.back().owner; }

const std::shared_ptr<const std::string>& current_module_path() {
  static const std::shared_ptr<const std::string> none;
  return t_frames.empty() ? none : t_frames.back().path;
}

UserOp::UserOp(const char* name) : outermost_(t_user_op == nullptr) {
  if (outermost_) t_user_op = name;
}

UserOp::~UserOp() {
  if (outermost_) t_user_op = nullptr;
}

const char* current_user_op() { return t_user_op; }

bool in_library(const Loc& loc) {
  // Consecutive ops mostly come from one file, whose name is one string literal: remember the
  // last answer per pointer.
  thread_local const char* last_file = nullptr;
  thread_local bool last_answer = false;
  const char* file = loc.file_name();
  if (file == last_file) return last_answer;
  const std::string& dir = library_dir();
  last_file = file;
  last_answer = !dir.empty() && std::strncmp(file, dir.c_str(), dir.size()) == 0;
  return last_answer;
}

Loc user_loc(const Loc& loc) {
  if (t_frames.empty() || !in_library(loc)) return loc;
  for (size_t i = t_frames.size(); i-- > 0;)
    if (!in_library(t_frames[i].loc)) return t_frames[i].loc;
  return loc;
}

}  // namespace lockstep::util
