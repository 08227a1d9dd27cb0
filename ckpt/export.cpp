// Offline: the full parameters of a checkpoint as safetensors (consolidate).
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>

#include "ckpt/manifest.hpp"
#include "ckpt/safetensors.hpp"
#include "zero/ckpt/ckpt.hpp"
#include "zero/core/error.hpp"

namespace zero::ckpt {

namespace fs = std::filesystem;
using namespace detail;

// The full parameters in the checkpoint's order, back to back (ckpt/safetensors.hpp: the format).
std::size_t consolidate(const std::string& path, const std::string& out, DType dtype) {
  ZERO_CHECK(dtype == DType::kF32 || dtype == DType::kBF16, kInvalidArgument,
             "consolidate: --dtype must be f32 or bf16, not ", to_string(dtype));
  const std::string dir = resolve(path);
  const Manifest m = read_manifest(dir);
  for (const FileEntry& f : m.files) verify_file(dir + "/" + f.name, f.digest);
  const std::size_t es = dtype_size(dtype);
  std::vector<SafetensorsEntry> entries;
  std::size_t largest = 0;
  for (const UnitEntry& u : m.units) {
    for (const ParamEntry& p : u.params) {
      entries.push_back({u.name + "." + p.name, dtype, p.shape});
      largest = std::max(largest, p.numel);
    }
  }
  const std::string h = safetensors_header(
      entries, {{"format", "pt"},
                {"zero.steps", std::to_string(m.steps)},
                {"zero.source",
                 "master (fp32)" + std::string(dtype == DType::kBF16 ? " rounded to bf16" : "")}});
  const std::string tmp = out + ".tmp";
  FileWriter w(tmp);
  w.write(h.data(), h.size());
  std::map<std::string, std::unique_ptr<FileReader>> readers;
  std::vector<float> values(largest);
  std::vector<char> converted(largest * es);
  for (const UnitEntry& u : m.units) {
    for (const ParamEntry& p : u.params) {
      for (const Piece& pc : p.pieces) {
        auto& r = readers[pc.file];
        if (!r) r = std::make_unique<FileReader>(dir + "/" + pc.file);
        r->read(pc.master_offset, values.data() + pc.begin, (pc.end - pc.begin) * 4);
      }
      if (dtype == DType::kF32) {
        w.write(values.data(), p.numel * 4);
      } else {
        convert(values.data(), DType::kF32, converted.data(), dtype, p.numel);
        w.write(converted.data(), p.numel * es);
      }
    }
  }
  const Digest d = w.finish();
  std::error_code ec;
  fs::rename(tmp, out, ec);
  ZERO_CHECK(!ec, kIO, "consolidate: renaming '", tmp, "' to '", out, "' failed: ", ec.message());
  return d.size;
}

}  // namespace zero::ckpt
