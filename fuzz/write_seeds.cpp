// Writes the seed corpora of the fuzz harnesses (fuzz/corpus/<harness>/): small valid inputs of
// each format, so that fuzzing starts from files that read and mutates them from there.
// Regenerate with: build/fuzz/fuzz/lockstep_write_seeds fuzz/corpus
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fuzz_input.h"
#include "lockstep/checkpoint.h"
#include "lockstep/io.h"
#include "lockstep/ops.h"
#include "trainee.h"

namespace {

namespace ls = lockstep;
namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

Bytes read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

void write(const fs::path& dir, const std::string& name, uint8_t selector, const Bytes& body,
           bool with_selector = true) {
  fs::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  if (with_selector) out.put(static_cast<char>(selector));
  out.write(reinterpret_cast<const char*>(body.data()), static_cast<std::streamsize>(body.size()));
  if (!out) ls::fuzz::die("cannot write " + (dir / name).string());
}

void be32(Bytes& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
}

Bytes idx_images(uint32_t count, uint32_t rows, uint32_t cols) {
  Bytes out;
  be32(out, 0x803);
  be32(out, count);
  be32(out, rows);
  be32(out, cols);
  for (uint32_t i = 0; i < count * rows * cols; ++i) out.push_back(static_cast<uint8_t>(i * 37));
  return out;
}

Bytes idx_labels(uint32_t count) {
  Bytes out;
  be32(out, 0x801);
  be32(out, count);
  for (uint32_t i = 0; i < count; ++i) out.push_back(static_cast<uint8_t>(i % 10));
  return out;
}

Bytes cifar_records(int count) {
  Bytes out;
  for (int r = 0; r < count; ++r) {
    out.push_back(static_cast<uint8_t>((r * 3) % 10));
    for (int p = 0; p < 3072; ++p) out.push_back(static_cast<uint8_t>(p * 7 + r));
  }
  return out;
}

Bytes gz(const Bytes& b) { return ls::fuzz::gzip(b.data(), b.size()); }

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  const fs::path root = argv[1];
  const std::string tmp = (fs::temp_directory_path() / "lockstep-seed.safetensors").string();

  // idx: selector bit 0 = images, (selector >> 1) % 3 = plain / compressed by the harness / raw gz.
  write(root / "idx", "images-plain", 1, idx_images(2, 3, 4));
  write(root / "idx", "images-gzip", 3, idx_images(3, 2, 2));
  write(root / "idx", "images-raw-gz", 5, gz(idx_images(1, 4, 4)));
  write(root / "idx", "labels-plain", 0, idx_labels(5));
  write(root / "idx", "labels-gzip", 2, idx_labels(3));
  write(root / "idx", "labels-raw-gz", 4, gz(idx_labels(4)));

  // cifar: selector % 3 = plain / compressed by the harness / raw gz.
  write(root / "cifar", "plain", 0, cifar_records(2));
  write(root / "cifar", "gzip", 1, cifar_records(1));
  write(root / "cifar", "raw-gz", 2, gz(cifar_records(2)));

  // safetensors: every dtype, a 0-d and an empty tensor, metadata.
  ls::io::save_safetensors(tmp,
                           {{"weight", ls::arange(6).reshape({2, 3}).to(ls::f32)},
                            {"scale", ls::full({}, 2.5, ls::f64)},
                            {"index", ls::arange(4).to(ls::i32)},
                            {"steps", ls::arange(3)},
                            {"mask", ls::arange(4) > 1},
                            {"empty", ls::zeros({0, 2})}},
                           {{"note", "seed"}, {"epoch", "3"}});
  write(root / "safetensors", "all-dtypes", 0, read(tmp), false);
  ls::io::save_safetensors(tmp, {{"x", ls::ones({3})}});
  write(root / "safetensors", "one-tensor", 0, read(tmp), false);

  // json: safetensors headers and the escapes the reader decodes.
  const Bytes header = [&] {
    const Bytes file = read(tmp);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = n << 8 | file[static_cast<size_t>(i)];
    return Bytes(file.begin() + 8, file.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  }();
  write(root / "json", "header", 0, header, false);
  const std::string texts[] = {
      R"({"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[2,0],"data_offsets":[0,0]}})",
      R"(["\u00e9\ud83d\ude00\n\t\"\\\/", -9223372036854775808, 1.5e-3, true, false, null, {}])",
  };
  for (size_t i = 0; i < std::size(texts); ++i)
    write(root / "json", "text-" + std::to_string(i), 0, Bytes(texts[i].begin(), texts[i].end()),
          false);

  // checkpoint: selector bit 0 = load the optimizer too.
  ls::fuzz::Trainee trainee;
  ls::save_checkpoint(tmp, *trainee.model, trainee.optimizer.get(), {{"epoch", "1"}});
  write(root / "checkpoint", "with-optimizer", 1, read(tmp));
  ls::save_checkpoint(tmp, *trainee.model);
  write(root / "checkpoint", "model-only", 0, read(tmp));
  fs::remove(tmp);
  return 0;
}
