// A child process for the crash tests (checkpoint_crash_test.cpp): saves checkpoints of a small
// MLP and its SGD state in which every value is the version number.
//   checkpoint_writer PATH loop           saves versions 1, 2, 3, ... and prints each saved one
//   checkpoint_writer PATH once V         saves version V
//   checkpoint_writer PATH full V BYTES   saves version V with files limited to BYTES (a full
//                                         disk); prints the error and exits 3 when it fails
#include <signal.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include <lockstep/lockstep.h>
#include "crash/checkpoint_model.h"

namespace ls = lockstep;

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  const std::string path = argv[1], mode = argv[2];
  crash::Trainee t;
  auto save = [&](int64_t v) {
    t.fill(static_cast<double>(v));
    ls::save_checkpoint(path, t.model, &t.opt, {{"test_version", std::to_string(v)}});
  };
  if (mode == "loop") {
    for (int64_t v = 1;; ++v) {
      save(v);
      std::printf("%lld\n", static_cast<long long>(v));
      std::fflush(stdout);
    }
  }
  if (mode == "once" && argc == 4) {
    save(std::atoll(argv[3]));
    return 0;
  }
  if (mode == "full" && argc == 5) {
    const rlimit limit{static_cast<rlim_t>(std::atoll(argv[4])),
                       static_cast<rlim_t>(std::atoll(argv[4]))};
    ::signal(SIGXFSZ, SIG_IGN);  // a write past the limit then fails with EFBIG
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) return 2;
    try {
      save(std::atoll(argv[3]));
    } catch (const ls::Error& e) {
      std::printf("%s\n", e.what());
      return 3;
    }
    return 0;
  }
  return 2;
}
