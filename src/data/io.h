// File reading shared by the dataset readers: whole files, gunzipped transparently, with errors
// that name the file and the byte offset. Not for parsing any format (idx.cpp, cifar.cpp do that).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::data::io {

// The whole content of `path`; gunzipped (zlib) when the name ends in ".gz". Throws Error naming
// the file for a missing or unreadable file, and the byte offset for corrupt gzip data. Content
// longer than `max_bytes` (what the format's header allows; the machine's memory at most) is
// an Error as soon as it is seen: a gzip bomb is never inflated past it.
std::vector<uint8_t> read_file(const std::string& path, uint64_t max_bytes = UINT64_MAX);
// The first `bytes` bytes of the content (fewer when it is shorter), gunzipped the same way.
std::vector<uint8_t> read_prefix(const std::string& path, size_t bytes);

bool is_file(const std::string& path);
bool is_directory(const std::string& path);
// "dir/name" (no doubled slash).
std::string join(const std::string& dir, const std::string& name);
// `dir`/`base` if it exists, else `dir`/`base`.gz; Error naming both when neither does.
std::string find_plain_or_gz(const std::string& dir, const std::string& base);

// The big-endian 32-bit number at `offset` (which the caller has checked is in range).
uint32_t be32(const std::vector<uint8_t>& bytes, size_t offset);

// Throws Error("<path>: <what>").
[[noreturn]] void fail(const std::string& path, const std::string& what);

}  // namespace lockstep::data::io
