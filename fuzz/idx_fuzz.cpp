// The IDX readers (MNIST, Fashion-MNIST), plain and gzip. The first input byte picks the reader
// (images or labels) and how the rest reaches it: as a plain file, gzip-compressed by the harness
// (the IDX parser behind zlib), or as the raw bytes of a ".gz" file (zlib's handling of a corrupt
// stream). A file that reads must be exactly what its header says.
#include <cstdint>

#include "fuzz_input.h"
#include "lockstep/data.h"
#include "lockstep/runtime.h"

namespace {

using lockstep::fuzz::die;

void check_images(const lockstep::data::IdxImages& images) {
  if (images.rows <= 0 || images.cols <= 0 || images.count < 0)
    die("read_idx_images returned a bad size");
  if (images.pixels.size() != static_cast<size_t>(images.count * images.rows * images.cols))
    die("read_idx_images returned " + std::to_string(images.pixels.size()) +
        " pixels for its header");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  lockstep::set_num_threads(1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using lockstep::fuzz::Packing;
  static lockstep::fuzz::DatasetFiles files("idx", "-ubyte");
  if (size == 0) return 0;
  const bool images = data[0] & 1;
  const auto packing = static_cast<Packing>((data[0] >> 1) % 3);
  const std::string* path = &files.write(packing, data + 1, size - 1);
  ++data, --size;
  try {
    if (images) {
      check_images(lockstep::data::read_idx_images(*path));
    } else {
      const std::vector<uint8_t> labels = lockstep::data::read_idx_labels(*path);
      if (packing != Packing::RawGz && labels.size() + 8 != size)
        die("read_idx_labels kept the wrong bytes");
    }
  } catch (const lockstep::Error& e) {
    lockstep::fuzz::expect_names(e, *path);
  }
  return 0;
}
