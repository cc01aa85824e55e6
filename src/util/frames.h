// The user's place in a program that calls into lockstep's modules: a stack, per thread, of the
// module calls under way (nn::Module::operator()), each with the line that made it and the
// module's path ("layer3.1.conv2"). Ops that lockstep's own code records while a module runs are
// attributed to the innermost call made from the user's code, so errors and explanations name
// the user's line and the module, not a line inside lockstep. A binding for another language
// (Python's) registers one hook that names the user's place in that language's program.
#pragma once

#include <memory>
#include <string>

#include "lockstep/loc.h"

namespace lockstep::util {

// Pushed for the duration of a module call. `path` is the module's full path (empty for the
// outermost module); `owner` identifies the module, for its children to find their names.
class ModuleFrame {
 public:
  ModuleFrame(const void* owner, std::shared_ptr<const std::string> path, const Loc& loc);
  ~ModuleFrame();
  ModuleFrame(const ModuleFrame&) = delete;
  ModuleFrame& operator=(const ModuleFrame&) = delete;
};

// The innermost module call under way on this thread: its owner and path (null and empty when
// there is none).
const void* current_module();
const std::shared_ptr<const std::string>& current_module_path();

// Pushed by a user-facing function built from primitives (cross_entropy, Embedding, index_select,
// ...) for its duration: the nodes it records carry its name (ir::Origin::user_op), so a run-time
// error in one of its primitives names what the user called first. The outermost one wins (a
// loss built on another names the loss the user called). `name` must be a string literal.
class UserOp {
 public:
  explicit UserOp(const char* name);
  ~UserOp();
  UserOp(const UserOp&) = delete;
  UserOp& operator=(const UserOp&) = delete;

 private:
  bool outermost_;
};
// The outermost user-facing function under way on this thread (null when none).
const char* current_user_op();

// Whether `loc` lies in lockstep's own sources (src/ and its public headers, include/lockstep/).
bool in_library(const Loc& loc);
// `loc`, or, when it lies in lockstep's sources inside a module call, the line of the innermost
// module call made from the user's code; and when that place lies in lockstep's sources or in a
// binding's (see set_frames_hook), the user's place the binding's hook names. Every place the
// library records (an op's origin, an error's line) goes through here.
Loc user_loc(const Loc& loc);

// The place an op records its nodes at: a binding's place resolved now, once for all of them
// (each resolution asks the binding's hook), any other as it is (each node resolves it: a
// node recorded by backward takes its forward op's place, see ir::make_node).
Loc op_loc(const Loc& loc);

// The user's place in another language's program on the calling thread (the innermost Python
// frame outside the lockstep package), or an empty Loc when the hook cannot tell: no interpreter
// on this thread, or its lock not held (a loader thread, a call that released it). `in_binding`
// says the place asked about is the binding's own: the thread is inside one of the binding's
// functions, which hold the lock unless they released it themselves, so the hook may skip the
// costlier check a place of lockstep's needs. Must be cheap (it runs for each recorded node)
// and must not throw.
using FramesHook = Loc (*)(bool in_binding);
// Registered once by a binding when it loads (PyTorch's lazy tensor core does the same): the
// binding's functions pass no place of their own; theirs, which lie in `binding_dir` (a prefix
// of their file names, e.g. ".../python/src/"), and lockstep's are resolved through `hook`.
// nullptr removes it. Thread-safe.
void set_frames_hook(FramesHook hook, const char* binding_dir);

}  // namespace lockstep::util
