// Offline: the full parameters of a checkpoint as safetensors (consolidate).
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "ckpt/manifest.hpp"
#include "zero/ckpt.hpp"
#include "zero/error.hpp"

namespace zero::ckpt {

namespace fs = std::filesystem;
using namespace detail;

// The safetensors format: an 8-byte little-endian header length, the JSON header (each tensor's
// dtype, shape and [begin, end) byte offsets into the data that follows; "__metadata__": string
// pairs), padded with spaces to a multiple of 8, then the tensors' bytes back to back.
std::size_t consolidate(const std::string& path, const std::string& out, DType dtype) {
  ZERO_CHECK(dtype == DType::kF32 || dtype == DType::kBF16, kInvalidArgument,
             "consolidate: --dtype must be f32 or bf16, not ", to_string(dtype));
  const std::string dir = resolve(path);
  const Manifest m = read_manifest(dir);
  for (const FileEntry& f : m.files) verify_file(dir + "/" + f.name, f.digest);
  const std::size_t es = dtype_size(dtype);
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = {
      {"format", "pt"},
      {"zero.steps", std::to_string(m.steps)},
      {"zero.source",
       "master (fp32)" + std::string(dtype == DType::kBF16 ? " rounded to bf16" : "")}};
  std::size_t at = 0, largest = 0;
  for (const UnitEntry& u : m.units) {
    for (const ParamEntry& p : u.params) {
      const std::string name = u.name + "." + p.name;
      ZERO_CHECK(!header.contains(name), kCorruption, "consolidate: two parameters named '", name,
                 "'");
      header[name] = {{"dtype", dtype == DType::kF32 ? "F32" : "BF16"},
                      {"shape", p.shape},
                      {"data_offsets", {at, at + p.numel * es}}};
      at += p.numel * es;
      largest = std::max(largest, p.numel);
    }
  }
  std::string h = header.dump();
  while ((8 + h.size()) % 8 != 0) h.push_back(' ');
  const std::string tmp = out + ".tmp";
  FileWriter w(tmp);
  std::uint64_t n = h.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  w.write(len, 8);
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
