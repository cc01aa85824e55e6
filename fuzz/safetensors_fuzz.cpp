// The safetensors reader: the 8-byte header length, the header JSON and the data spans. A file
// that loads must round-trip: saved again and loaded, the same names, dtypes, shapes, bytes and
// metadata come back.
#include <cstdint>
#include <cstring>

#include "fuzz_input.h"
#include "lockstep/io.h"
#include "lockstep/runtime.h"

namespace {

namespace io = lockstep::io;
using lockstep::fuzz::die;

// A tensor's bytes, checked against its shape.
std::vector<uint8_t> bytes_of(const lockstep::Tensor& t) {
  std::vector<uint8_t> out = lockstep::fuzz::bytes_of(t);
  if (out.size() != static_cast<size_t>(t.numel()) * lockstep::dtype_size(t.dtype()))
    die("a tensor's values do not match its shape");
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  lockstep::set_num_threads(1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static lockstep::fuzz::InputFile input("st", ".safetensors");
  static lockstep::fuzz::InputFile copy("st-copy", ".safetensors");
  const std::string& path = input.write(data, size);
  io::Loaded loaded;
  try {
    loaded = io::load_safetensors(path);
  } catch (const lockstep::Error& e) {
    lockstep::fuzz::expect_names(e, path);
    return 0;
  }
  try {
    io::save_safetensors(copy.path(), loaded.tensors, loaded.metadata);
  } catch (const lockstep::Error& e) {
    die(std::string("a loaded file does not save again: ") + e.what());
  }
  const io::Loaded again = io::load_safetensors(copy.path());
  if (again.metadata != loaded.metadata) die("the metadata changed in a round trip");
  if (again.tensors.size() != loaded.tensors.size()) die("tensors lost in a round trip");
  for (size_t i = 0; i < loaded.tensors.size(); ++i) {
    const auto& [name, t] = loaded.tensors[i];
    const auto& [name2, t2] = again.tensors[i];
    if (name != name2 || t.dtype() != t2.dtype() || t.shape() != t2.shape() ||
        bytes_of(t) != bytes_of(t2))
      die("tensor '" + name + "' changed in a round trip");
  }
  return 0;
}
