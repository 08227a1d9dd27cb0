// Offline: the full parameters as safetensors (consolidate) and a checkpoint rewritten for
// another world size (reshard).
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
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

std::string reshard(const std::string& path, int world_size, const std::string& out) {
  ZERO_CHECK(world_size >= 1, kInvalidArgument, "reshard: --world-size ", world_size,
             " (must be >= 1)");
  const std::string dir = resolve(path);
  const Manifest m = read_manifest(dir);
  Config cfg = parse_config(m.config_json);
  // The rewrite runs in host memory: the offload tiers of the run that saved do not matter.
  cfg.zero_optimization.offload_optimizer.device = OffloadDevice::kNone;
  cfg.zero_optimization.offload_param.device = OffloadDevice::kNone;
  // The saving run's train_batch_size held for its world size; the rewrite keeps the per-rank
  // micro batch and accumulation and leaves the global batch for the resuming run to state.
  cfg.train_batch_size = 0;
  std::vector<UnitSpec> units;
  for (const UnitEntry& u : m.units) {
    UnitSpec s;
    s.name = u.name;
    for (const ParamEntry& p : u.params) s.params.push_back({p.name, p.shape});
    units.push_back(std::move(s));
  }
  std::string written;
  std::mutex mu;
  ThreadGroup::run(world_size, [&](Communicator& comm) {
    EngineOptions eo;
    eo.alignment = m.alignment;
    Engine e(comm, cfg, eo);
    for (const UnitSpec& s : units) e.add_unit(s);
    const LoadResult r = load(e, dir);
    Saver saver(e, {.dir = out});
    const SaveInfo info = saver.save(r.trainer_state);
    std::lock_guard<std::mutex> lock(mu);
    written = info.path;
  });
  return written;
}

}  // namespace zero::ckpt
