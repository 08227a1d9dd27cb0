// Pretrained weights in: safetensors into a running sharded engine (import_safetensors), each
// rank reading only its own byte ranges, one unit at a time.
#include <algorithm>
#include <exception>
#include <memory>
#include <vector>

#include "ckpt/agree.hpp"
#include "ckpt/file_io.hpp"
#include "ckpt/fresh_state.hpp"
#include "ckpt/safetensors.hpp"
#include "zero/ckpt/ckpt.hpp"
#include "zero/core/error.hpp"

namespace zero::ckpt {

using namespace detail;

namespace {

// Non-f32 tensors are read through a buffer of this many bytes and converted into the master.
constexpr std::size_t kReadChunk = std::size_t{256} << 10;

std::string shape_str(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::string tensor_name(const std::string& name, const ImportOptions& o) {
  if (o.rename) return o.rename(name);
  for (const auto& [from, to] : o.rename_prefixes) {
    if (name.compare(0, from.size(), from) == 0) return to + name.substr(from.size());
  }
  return name;
}

// Every parameter's tensor (null: not imported), [unit][param], checked against the file(s).
std::vector<std::vector<const SafetensorsTensor*>> match(Engine& e, const SafetensorsSet& set,
                                                         const ImportOptions& o,
                                                         ImportResult& res) {
  std::vector<std::vector<const SafetensorsTensor*>> out(static_cast<std::size_t>(e.num_units()));
  std::vector<bool> used(set.tensors.size(), false);
  const std::string& src = set.source;
  for (UnitId u = 0; u < e.num_units(); ++u) {
    for (const ParamSpec& p : e.unit(u).params) {
      const std::string name = e.unit(u).name + "." + p.name;
      const std::string mapped = tensor_name(name, o);
      if (mapped.empty()) {
        out[static_cast<std::size_t>(u)].push_back(nullptr);
        continue;
      }
      const std::string as = mapped == name ? "" : " (as '" + mapped + "')";
      const SafetensorsTensor* t = set.find(mapped);
      ZERO_CHECK(t != nullptr, kConfig, "import '", src, "': parameter '", name, "'", as,
                 ": no such tensor in the file(s)");
      const std::string& file = set.files[static_cast<std::size_t>(t->file)];
      ZERO_CHECK(t->dtype.has_value(), kConfig, "import '", src, "': tensor '", mapped, "' in '",
                 file, "' is ", t->dtype_name, ": only F32, BF16 and F16 are read");
      ZERO_CHECK(t->shape == p.shape, kConfig, "import '", src, "': tensor '", mapped, "' in '",
                 file, "' has shape ", shape_str(t->shape), ", parameter '", name, "' ",
                 shape_str(p.shape));
      ZERO_CHECK(!used[static_cast<std::size_t>(t - set.tensors.data())], kConfig, "import '", src,
                 "': tensor '", mapped, "' is mapped to by two parameters (the second: '", name,
                 "')");
      used[static_cast<std::size_t>(t - set.tensors.data())] = true;
      out[static_cast<std::size_t>(u)].push_back(t);
      ++res.imported;
    }
  }
  for (std::size_t i = 0; i < set.tensors.size(); ++i) {
    if (used[i]) continue;
    ++res.unused;
    const SafetensorsTensor& t = set.tensors[i];
    ZERO_CHECK(o.allow_unused, kConfig, "import '", src, "': tensor '", t.name, "' in '",
               set.files[static_cast<std::size_t>(t.file)],
               "' is used by no parameter (allow it: ImportOptions::allow_unused, zero-ckpt "
               "import --allow-unused)");
  }
  return out;
}

}  // namespace

ImportResult import_safetensors(Engine& e, const std::string& path, const ImportOptions& o) {
  ImportResult res;
  SafetensorsSet set;
  std::vector<std::vector<const SafetensorsTensor*>> plan;
  std::vector<ParamShard> shards;
  std::exception_ptr local;
  try {
    set = open_safetensors(path);
    plan = match(e, set, o, res);
    shards = e.param_shards();
  } catch (...) {
    local = std::current_exception();
  }
  agree(e.world(), local);

  // One unit at a time: its stepped range (the engine's values, so that parameters not imported
  // and the padding keep theirs), this rank's elements of each parameter read over it.
  std::unique_ptr<FreshStateLoader> loader;
  try {
    loader = std::make_unique<FreshStateLoader>(e);
    std::vector<std::unique_ptr<FileReader>> readers(set.files.size());
    std::vector<char> chunk;
    std::size_t next = 0;
    for (UnitId u = 0; u < e.num_units(); ++u) {
      std::vector<float> master(e.unit_step_numel(u));
      e.copy_master_shard(u, master.data());
      for (; next < shards.size() && shards[next].unit == u; ++next) {
        const ParamShard& s = shards[next];
        const SafetensorsTensor* t =
            plan[static_cast<std::size_t>(u)][static_cast<std::size_t>(s.param)];
        if (t == nullptr || s.begin == s.end) continue;
        auto& r = readers[static_cast<std::size_t>(t->file)];
        if (!r) r = std::make_unique<FileReader>(set.files[static_cast<std::size_t>(t->file)]);
        const std::size_t es = dtype_size(*t->dtype);
        float* dst = master.data() + s.shard_offset;
        const std::size_t at = t->offset + s.begin * es, n = s.end - s.begin;
        res.bytes_read += n * es;
        if (*t->dtype == DType::kF32) {
          r->read(at, dst, n * 4);
          continue;
        }
        chunk.resize(std::min(n * es, kReadChunk));
        const std::size_t per = chunk.size() / es;
        for (std::size_t i = 0; i < n; i += per) {
          const std::size_t c = std::min(per, n - i);
          r->read(at + i * es, chunk.data(), c * es);
          convert(chunk.data(), *t->dtype, dst + i, DType::kF32, c);
        }
      }
      loader->load(u, master.data());
    }
    local = nullptr;
  } catch (...) {
    local = std::current_exception();
  }
  agree(e.world(), local);
  loader->finish();
  return res;
}

}  // namespace zero::ckpt
