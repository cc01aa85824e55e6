// Error types of lockstep. `Error` is the user's mistake (bad shape, bad dtype, misuse of a step)
// and names what to do; `InternalError` is a bug in lockstep; `BackendError` wraps a failure
// reported by a library a backend calls (oneDNN, MPI, CUDA) or by a kernel at run time.
#pragma once

#include <stdexcept>
#include <string>

namespace lockstep {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

class BackendError : public Error {
 public:
  using Error::Error;
};

}  // namespace lockstep
