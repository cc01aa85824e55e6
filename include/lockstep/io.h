// Checkpoint files: tensors by name in the safetensors format (Hugging Face's; PyTorch and the
// `safetensors` tools read what we write and we read theirs). Not here: what to save (module and
// optimizer state dicts build on these two functions).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/tensor.h"

namespace lockstep::io {

// Named tensors, kept in the order given (the order of the file's header and data).
using TensorMap = std::vector<std::pair<std::string, Tensor>>;
// Free-form text stored in the header's "__metadata__".
using Metadata = std::map<std::string, std::string>;

// Writes `tensors` (F32, F64, I32, I64, BOOL, BF16; any shape, 0-d and empty included) atomically:
// to "<path>.tmp-<pid>" in the same directory, fsynced, renamed over `path`, then the directory
// is fsynced. Reading the values is a sync (pending tensors get computed). Any failure throws
// Error naming the path and the OS error, and leaves an existing file at `path` untouched and no
// temporary file behind. Names must be unique, valid UTF-8 and not "__metadata__".
void save_safetensors(const std::string& path, const TensorMap& tensors,
                      const Metadata& metadata = {}, Loc loc = Loc::current());

struct Loaded {
  TensorMap tensors;  // in the order of the file's header
  Metadata metadata;
};

// Reads a safetensors file. Everything is checked before any tensor is created (file size,
// header length, JSON, dtypes, shapes, offsets inside the data, no overlap, spans that match
// the shapes, unique names); any problem throws Error naming the file, the tensor and what is
// wrong. Tensors are created materialized on `device`.
Loaded load_safetensors(const std::string& path, Device device = default_device(),
                        Loc loc = Loc::current());

}  // namespace lockstep::io
