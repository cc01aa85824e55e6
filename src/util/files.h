// Paths that must name regular files: opening one to read without blocking on a FIFO or a device,
// and checking a save's target before anything is written. Not the writing itself
// (io/safetensors.cpp's atomic save) or the formats.
//
// The rules: a read follows symbolic links and refuses what is not a regular file (a FIFO, a
// device, a directory, a socket) without opening it for long enough to block; a save refuses a
// target that exists and is not a regular file, a symbolic link included (the link is not
// followed, so a save never writes through one into /dev or another directory); a path holding
// a NUL character is refused by both, instead of being cut short at it.
#pragma once

#include <string>

#include <sys/types.h>

namespace lockstep::util {

// An open descriptor for reading, or why there is none.
struct RegularFile {
  int fd = -1;               // blocking, close-on-exec; the caller closes it
  int error = 0;             // errno of a failed stat or open (fd -1, problem empty)
  std::string problem = {};  // set when the path is not a regular file: "is a FIFO", ...
};

// Opens `path` to read: stats it first (a FIFO or device is never opened), then opens it with
// O_NONBLOCK and checks the open descriptor again (the path may change in between).
RegularFile open_regular(const std::string& path);

// Why a save may not replace `path`, or "" when it may (nothing is there, or a regular file,
// whose permission bits then go to *mode; *mode is -1 when nothing is there).
std::string unsavable(const std::string& path, int* mode);

// `path` for a message: a NUL character in it written as "\0" (what() would end there).
std::string shown(const std::string& path);

// "is a FIFO", "is a directory", "is a character device", ... for a mode that is not a regular
// file's.
std::string kind_of(mode_t mode);

}  // namespace lockstep::util
