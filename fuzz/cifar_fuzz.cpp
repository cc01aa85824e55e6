// The CIFAR-10 binary reader. The first input byte picks how the rest reaches it: a plain batch
// file, gzip-compressed by the harness, or the raw bytes of a ".gz" file. A file that reads gives
// every record back: labels in [0, 10), pixels as floats in [0, 1].
#include <cstdint>

#include "fuzz_input.h"
#include "lockstep/data.h"
#include "lockstep/runtime.h"

namespace {

using lockstep::fuzz::die;
constexpr size_t kRecord = 1 + 3 * 32 * 32;

void check(const lockstep::data::Cifar10Dataset& set, const uint8_t* data, size_t size,
           bool exact) {
  if (exact && static_cast<size_t>(set.size()) * kRecord != size)
    die("Cifar10Dataset read " + std::to_string(set.size()) + " records from " +
        std::to_string(size) + " bytes");
  for (int64_t i : {int64_t{0}, set.size() - 1}) {
    const lockstep::data::Example ex = set.get(i);
    if (ex.label < 0 || ex.label >= 10) die("label out of range");
    if (ex.image.size() != kRecord - 1) die("wrong image size");
    if (exact) {
      const uint8_t* rec = data + static_cast<size_t>(i) * kRecord;
      if (ex.label != rec[0]) die("wrong label");
      for (size_t p = 0; p < ex.image.size(); ++p)
        if (ex.image[p] != rec[1 + p] / 255.0f) die("wrong pixel");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  lockstep::set_num_threads(1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using lockstep::fuzz::Packing;
  static lockstep::fuzz::DatasetFiles files("cifar", ".bin");
  if (size == 0) return 0;
  const auto packing = static_cast<Packing>(data[0] % 3);
  const std::string* path = &files.write(packing, data + 1, size - 1);
  ++data, --size;
  try {
    const lockstep::data::Cifar10Dataset set(std::vector<std::string>{*path});
    check(set, data, size, packing != Packing::RawGz);
  } catch (const lockstep::Error& e) {
    lockstep::fuzz::expect_names(e, *path);
  }
  return 0;
}
