// The per-thread stack of module calls, and a binding's hook for the user's place (frames.h).
#include "util/frames.h"

#include <atomic>
#include <cstdint>
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

// A registered hook, the directory of its binding's sources, and its number (the first is 1).
// Never freed: a thread may be reading the one replaced (a binding registers once, so at most a
// few are ever made).
struct Hook {
  FramesHook frames;
  std::string binding_dir;
  uint32_t generation;
};
std::atomic<const Hook*> g_hook{nullptr};
std::atomic<uint32_t> g_hooks_made{0};

// Where a place lies.
enum class Source : uint8_t { User, Library, Binding };

// lockstep's src/ directory, from this file's own path (src/util/frames.cpp).
const std::string& library_dir() {
  static const std::string dir = [] {
    const std::string self = Loc::current().file_name();
    const size_t at = self.rfind("util/frames.cpp");
    return at == std::string::npos ? std::string() : self.substr(0, at);
  }();
  return dir;
}

// Its public headers' directory, beside src/: their inline functions record too (a tensor's
// `+= 1.0` names the header's line).
const std::string& headers_dir() {
  static const std::string dir = [] {
    const std::string& src = library_dir();
    const size_t at = src.rfind("src/");
    return at == std::string::npos ? std::string() : src.substr(0, at) + "include/lockstep/";
  }();
  return dir;
}

bool starts_with(const char* file, const std::string& dir) {
  return !dir.empty() && std::strncmp(file, dir.c_str(), dir.size()) == 0;
}

// Each file name's source, remembered process-wide: it depends only on the name and the hook,
// the nodes recorded mostly come from a few files (each name one string literal), and a lookup
// must cost no thread_local (it runs for each recorded node). An entry is one word: the name's
// address (user addresses fit in 48 bits; a name above is not remembered), the hook's number and
// the source.
constexpr size_t kSourceSlots = 16;
std::atomic<uint64_t> g_sources[kSourceSlots];

uint64_t generation_of(const Hook* hook) { return hook ? hook->generation & 0x3fffu : 0; }

std::atomic<uint64_t>& slot_of(uintptr_t address) {
  return g_sources[(address ^ (address >> 9)) % kSourceSlots];
}

// Out of line: the lookup below is inlined where it runs for each node.
[[gnu::noinline]] Source classify(const char* file, const Hook* hook) {
  const bool in_lockstep = starts_with(file, library_dir()) || starts_with(file, headers_dir());
  const Source source = in_lockstep                                    ? Source::Library
                        : hook && starts_with(file, hook->binding_dir) ? Source::Binding
                                                                       : Source::User;
  const auto address = reinterpret_cast<uintptr_t>(file);
  if (address >> 48 == 0)
    slot_of(address).store(address << 16 | generation_of(hook) << 2 | static_cast<uint64_t>(source),
                           std::memory_order_relaxed);
  return source;
}

inline Source source_of(const char* file, const Hook* hook) {
  const auto address = reinterpret_cast<uintptr_t>(file);
  const uint64_t entry = slot_of(address).load(std::memory_order_relaxed);
  if ((entry & ~uint64_t{3}) == (address << 16 | generation_of(hook) << 2))
    return static_cast<Source>(entry & 3u);
  return classify(file, hook);
}

// user_loc of a place in a binding's sources: what its hook says.
inline Loc binding_place(const Loc& loc, const Hook& hook) {
  Loc out = hook.frames(true);
  if (out.file_name()[0] == '\0') out = loc;
  return out;
}

// user_loc of a place in lockstep's sources: the innermost module call made from the user's
// code, else what the hook says. (Out of line: user_loc's way for a binding's place stays short.)
[[gnu::noinline]] Loc library_place(const Loc& loc, const Hook* hook) {
  const std::vector<Frame>& frames = t_frames;
  for (size_t i = frames.size(); i-- > 0;) {
    const Source source = source_of(frames[i].loc.file_name(), hook);
    if (source == Source::User) return frames[i].loc;
    if (source == Source::Binding) break;
  }
  // lockstep called from a binding's function, or from a thread of its own (a loader): the
  // binding's language knows the user's line, when this thread may ask it.
  if (hook) {
    const Loc user = hook->frames(false);
    if (user.file_name()[0] != '\0') return user;
  }
  return loc;
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
  return source_of(loc.file_name(), g_hook.load(std::memory_order_acquire)) == Source::Library;
}

Loc user_loc(const Loc& loc) {
  const Hook* hook = g_hook.load(std::memory_order_acquire);
  const Source source = source_of(loc.file_name(), hook);
  if (source == Source::User) return loc;
  if (source == Source::Library) return library_place(loc, hook);
  // A binding's function called lockstep: its language knows the user's line.
  return binding_place(loc, *hook);
}

Loc op_loc(const Loc& loc) {
  const Hook* hook = g_hook.load(std::memory_order_acquire);
  return source_of(loc.file_name(), hook) == Source::Binding ? binding_place(loc, *hook) : loc;
}

void set_frames_hook(FramesHook hook, const char* binding_dir) {
  g_hook.store(hook ? new Hook{hook, binding_dir ? binding_dir : "", ++g_hooks_made} : nullptr,
               std::memory_order_release);
}

}  // namespace lockstep::util
