// Paths that must name regular files (files.h).
#include "util/files.h"

#include <cerrno>
#include <climits>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/check.h"

namespace lockstep::util {

namespace {
std::string nul_problem(const std::string& path) {
  const size_t at = path.find('\0');
  if (at == std::string::npos) return "";
  return cat("holds a NUL character (at byte ", at,
             "), which no file name can: it would name the file cut short there");
}
}  // namespace

std::string shown(const std::string& path) {
  std::string out;
  for (char c : path) {
    if (c == '\0')
      out += "\\0";
    else
      out += c;
  }
  return out;
}

std::string kind_of(mode_t mode) {
  if (S_ISFIFO(mode)) return "is a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "is a character device";
  if (S_ISBLK(mode)) return "is a block device";
  if (S_ISDIR(mode)) return "is a directory";
  if (S_ISSOCK(mode)) return "is a socket";
  if (S_ISLNK(mode)) return "is a symbolic link";
  return "is not a regular file";
}

RegularFile open_regular(const std::string& path) {
  RegularFile out;
  out.problem = nul_problem(path);
  if (!out.problem.empty()) return out;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    out.error = errno;
    return out;
  }
  if (!S_ISREG(st.st_mode)) {
    out.problem = kind_of(st.st_mode);
    return out;
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    out.error = errno;
    return out;
  }
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    out.error = errno;
    out.problem = kind_of(st.st_mode);
    ::close(fd);
    return out;
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  out.fd = fd;
  return out;
}

std::string unsavable(const std::string& path, int* mode) {
  *mode = -1;
  if (std::string p = nul_problem(path); !p.empty()) return p;
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return "";  // nothing there (or the save will say why)
  if (S_ISLNK(st.st_mode)) {
    char target[PATH_MAX];
    const ssize_t n = ::readlink(path.c_str(), target, sizeof target - 1);
    return n > 0 ? cat("is a symbolic link (to '", std::string(target, static_cast<size_t>(n)),
                       "'), which a save does not follow")
                 : std::string("is a symbolic link, which a save does not follow");
  }
  if (!S_ISREG(st.st_mode)) return kind_of(st.st_mode);
  *mode = static_cast<int>(st.st_mode & 07777);
  return "";
}

}  // namespace lockstep::util
