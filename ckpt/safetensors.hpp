// ckpt/safetensors.hpp — the safetensors format, both ways: the header `consolidate` writes and
// the reader `import_safetensors` uses (one file, or a Hugging Face sharded set: the files named
// by model.safetensors.index.json's "weight_map").
//
// The format (huggingface/safetensors): an 8-byte little-endian unsigned header length N, N
// bytes of UTF-8 JSON — {name: {"dtype": "F32" | "BF16" | "F16" | ..., "shape": [d0, ...],
// "data_offsets": [begin, end]}, "__metadata__": {str: str}} with offsets relative to the byte
// after the header — then the tensors' bytes, row-major, little-endian.
//
// Reading checks every number before it is used: the header length against the file and a
// 100 MiB limit (the reference implementation's), each range against the data and against its
// dtype and shape. Errors are zero::Error(kIO, kCorruption) naming the file and the tensor.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "zero/core/dtype.hpp"

namespace zero::ckpt::detail {

inline constexpr std::size_t kMaxSafetensorsHeader = std::size_t{100} << 20;
inline constexpr const char* kSafetensorsIndex = "model.safetensors.index.json";

// "F32", "BF16", "F16" (the dtypes zero reads and writes).
const char* safetensors_dtype(DType t);

// ---- writing

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<std::int64_t> shape;
};

// The bytes a file starts with for `tensors` laid out back to back in this order: the length,
// the JSON header padded with spaces so that the data starts 8-byte aligned.
std::string safetensors_header(const std::vector<SafetensorsEntry>& tensors,
                               const std::map<std::string, std::string>& metadata);

// ---- reading

struct SafetensorsTensor {
  std::string name;
  std::string dtype_name;      // as the file says
  std::optional<DType> dtype;  // empty: a dtype zero does not read (F64, I64, F8_*, ...)
  std::vector<std::int64_t> shape;
  std::size_t numel = 0;
  std::size_t offset = 0;  // absolute byte offset of the first element in its file
  std::size_t bytes = 0;
  int file = 0;  // index into SafetensorsSet::files
};

struct SafetensorsSet {
  std::string source;                      // the path given (for messages)
  std::vector<std::string> files;          // the .safetensors files
  std::vector<SafetensorsTensor> tensors;  // every tensor of every file, file by file
  std::map<std::string, std::size_t> by_name;

  const SafetensorsTensor* find(const std::string& name) const;
};

// Opens `path`: a .safetensors file, a sharded set's index (*.index.json), or a directory
// holding model.safetensors.index.json or exactly one .safetensors file. Reads the headers only.
SafetensorsSet open_safetensors(const std::string& path);

}  // namespace zero::ckpt::detail
