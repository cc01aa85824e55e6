// Checkpoint files: tensors by name in the safetensors format (Hugging Face's; PyTorch and the
// `safetensors` tools read what we write and we read theirs). Not here: what to save (module and
// optimizer state dicts build on these two functions).
#pragma once

#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/tensor.h"

namespace lockstep::io {

// Named tensors, kept in the order given (the order of the file's header and data).
using TensorMap = std::vector<std::pair<std::string, Tensor>>;
// Free-form text stored in the header's "__metadata__".
using Metadata = std::map<std::string, std::string>;

// The metadata key holding each tensor's CRC-32 (zlib's) as a JSON object of 8 hex digits by
// name, written by save_safetensors and checked by load_safetensors when present (files of other
// writers, and lockstep's before it, have none).
inline constexpr const char* kChecksumKey = "lockstep.crc32";

// Writes `tensors` (F32, F64, I32, I64, BOOL, BF16; any shape, 0-d and empty included) atomically:
// to "<path>.tmp-<pid>" in the same directory, fsynced, renamed over `path`, then the directory
// is fsynced. Temporary files of this path left by processes that no longer run (killed while
// saving) are removed first. Reading the values is a sync (pending tensors get computed). Any
// failure throws Error naming the path and the OS error, and leaves an existing file at `path`
// untouched and no temporary file behind. Names must be unique, valid UTF-8 and not
// "__metadata__"; kChecksumKey is the writer's own metadata key.
// What `path` may be: nothing yet, or a regular file, which keeps its permission bits. Anything
// else there is refused before anything is written: a FIFO, a device (so `/dev/null` is never
// replaced), a directory, and a symbolic link (not followed: save to its target's path). The
// rename makes a new file: other hard links to the old one keep the old contents. A path holding
// a NUL character is refused, not cut short. Loading follows symbolic links and refuses a FIFO,
// device or directory without blocking on it.
void save_safetensors(const std::string& path, const TensorMap& tensors,
                      const Metadata& metadata = {}, Loc loc = Loc::current());
// The same, streamed: each tensor's bytes come from its `read` when the file needs them (twice:
// once for the checksums in the header, once for the data), so that no more than one tensor is
// in memory at a time (an export of a sharded checkpoint reads each from its shard's file).
// `read` returns numel(shape) * dtype_size(dtype) bytes (bools as 0/1).
struct TensorSource {
  std::string name;
  DType dtype;
  Shape shape;
  std::function<std::vector<unsigned char>()> read;
};
void save_safetensors_streamed(const std::string& path, const std::vector<TensorSource>& tensors,
                               const Metadata& metadata = {}, Loc loc = Loc::current());
// Each tensor as a source that reads its bytes as save_safetensors writes them (reading is a sync;
// bools as 0/1). An empty handle is an Error naming it and `path`, the file it is for.
std::vector<TensorSource> sources_of(const TensorMap& tensors, const std::string& path,
                                     Loc loc = Loc::current());
// Throws the Error save_safetensors would for a `path` it may not replace (the rules above), so
// that a program that saves late (a checkpoint after an epoch) can refuse such a path at its start.
void check_save_path(const std::string& path, Loc loc = Loc::current());

struct Loaded {
  TensorMap tensors;         // in the order of the file's header
  Metadata metadata;         // the writer's checksums (kChecksumKey) left out
  bool checksummed = false;  // the file recorded checksums, and every tensor read matched its own
};

// Reads a safetensors file. Everything is checked before any tensor is created (file size,
// header length, JSON, dtypes, shapes, offsets, spans that match the shapes, unique names, and
// tensors that cover the data area exactly, as the reference reader requires: no gap, overlap
// or trailing byte), and each tensor's data against its checksum when the file records one;
// any problem throws Error naming the file, the tensor and what is wrong. Tensors are created
// materialized on `device`.
Loaded load_safetensors(const std::string& path, Device device = default_device(),
                        Loc loc = Loc::current());

// What a file's header says of one tensor.
struct TensorInfo {
  std::string name;
  DType dtype;
  Shape shape;
};
// Called with the metadata and every tensor's header entry once the header is checked and
// before any data is read: throws to refuse the file, returns the names to read (the others
// are skipped, not read into memory).
using Vet = std::function<std::set<std::string>(const Metadata&, const std::vector<TensorInfo>&)>;
Loaded load_safetensors(const std::string& path, Device device, const Vet& vet,
                        Loc loc = Loc::current());

}  // namespace lockstep::io
