#include "ckpt/safetensors.hpp"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "ckpt/file_io.hpp"
#include "zero/core/error.hpp"

namespace zero::ckpt::detail {

namespace fs = std::filesystem;
using nlohmann::json;

const char* safetensors_dtype(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
  }
  return "?";
}

std::string safetensors_header(const std::vector<SafetensorsEntry>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::size_t at = 0;
  for (const SafetensorsEntry& t : tensors) {
    ZERO_CHECK(!header.contains(t.name), kInvalidArgument, "safetensors: two tensors named '",
               t.name, "'");
    std::size_t numel = 1;
    for (std::int64_t d : t.shape) numel *= static_cast<std::size_t>(d);
    const std::size_t bytes = numel * dtype_size(t.dtype);
    header[t.name] = {{"dtype", safetensors_dtype(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {at, at + bytes}}};
    at += bytes;
  }
  std::string h = header.dump();
  while ((8 + h.size()) % 8 != 0) h.push_back(' ');
  std::string out(8, '\0');
  const std::uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>(n >> (8 * i));
  return out + h;
}

const SafetensorsTensor* SafetensorsSet::find(const std::string& name) const {
  const auto it = by_name.find(name);
  return it == by_name.end() ? nullptr : &tensors[it->second];
}

namespace {

std::optional<DType> parse_dtype_name(const std::string& s) {
  if (s == "F32") return DType::kF32;
  if (s == "BF16") return DType::kBF16;
  if (s == "F16") return DType::kF16;
  return std::nullopt;
}

// A non-negative integer of the header; kCorruption naming the file, tensor and key otherwise.
std::size_t header_size(const json& v, const std::string& file, const std::string& tensor,
                        const char* key) {
  ZERO_CHECK(v.is_number_unsigned() || (v.is_number_integer() && v.get<std::int64_t>() >= 0),
             kCorruption, "safetensors '", file, "': tensor '", tensor, "': ", key, " holds ",
             v.dump(), ", not a non-negative integer");
  return static_cast<std::size_t>(v.get<std::uint64_t>());
}

// Appends the tensors of one file's header to `set`.
void read_header(const std::string& path, int file_index, SafetensorsSet& set) {
  const FileReader r(path);
  const std::size_t size = r.size();
  ZERO_CHECK(size >= 8, kCorruption, "safetensors '", path, "': truncated: ", size,
             " bytes, shorter than the 8-byte header length");
  unsigned char len[8];
  r.read(0, len, 8);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  ZERO_CHECK(n <= size - 8, kCorruption, "safetensors '", path, "': header length ", n,
             " is out of range (the file has ", size, " bytes: truncated or not safetensors)");
  ZERO_CHECK(n <= kMaxSafetensorsHeader, kCorruption, "safetensors '", path, "': header length ", n,
             " is over the ", kMaxSafetensorsHeader, "-byte limit");
  std::string text(n, '\0');
  r.read(8, text.data(), n);
  json h;
  try {
    h = json::parse(text);
  } catch (const json::exception& e) {
    ZERO_THROW(kCorruption, "safetensors '", path, "': the header is not JSON: ", e.what());
  }
  ZERO_CHECK(h.is_object(), kCorruption, "safetensors '", path, "': the header is a ",
             h.type_name(), ", not an object");
  const std::size_t data = 8 + n, data_bytes = size - data;
  for (const auto& [name, t] : h.items()) {
    if (name == "__metadata__") continue;
    ZERO_CHECK(t.is_object() && t.contains("dtype") && t["dtype"].is_string() &&
                   t.contains("shape") && t["shape"].is_array() && t.contains("data_offsets") &&
                   t["data_offsets"].is_array() && t["data_offsets"].size() == 2,
               kCorruption, "safetensors '", path, "': tensor '", name,
               "' lacks a string \"dtype\", an array \"shape\" or a pair \"data_offsets\"");
    SafetensorsTensor x;
    x.name = name;
    x.file = file_index;
    x.dtype_name = t["dtype"].get<std::string>();
    x.dtype = parse_dtype_name(x.dtype_name);
    x.numel = 1;
    for (const json& d : t["shape"]) {
      const std::size_t v = header_size(d, path, name, "shape");
      ZERO_CHECK(v == 0 || x.numel <= std::numeric_limits<std::size_t>::max() / 8 / v, kCorruption,
                 "safetensors '", path, "': tensor '", name, "': shape ", t["shape"].dump(),
                 " overflows");
      x.numel *= v;
      x.shape.push_back(static_cast<std::int64_t>(v));
    }
    const std::size_t b = header_size(t["data_offsets"][0], path, name, "data_offsets");
    const std::size_t e = header_size(t["data_offsets"][1], path, name, "data_offsets");
    ZERO_CHECK(b <= e, kCorruption, "safetensors '", path, "': tensor '", name, "': data_offsets [",
               b, ", ", e, ") run backwards");
    ZERO_CHECK(e <= data_bytes, kCorruption, "safetensors '", path, "': tensor '", name,
               "': data_offsets [", b, ", ", e, ") lie beyond the file's ", data_bytes,
               " bytes of data (truncated)");
    if (x.dtype) {
      ZERO_CHECK(e - b == x.numel * dtype_size(*x.dtype), kCorruption, "safetensors '", path,
                 "': tensor '", name, "': ", e - b, " bytes of data for ", x.numel, " elements of ",
                 x.dtype_name);
    }
    x.offset = data + b;
    x.bytes = e - b;
    const std::size_t at = set.tensors.size();
    const auto [it, fresh] = set.by_name.emplace(name, at);
    ZERO_CHECK(fresh, kCorruption, "safetensors set '", set.source, "': tensor '", name,
               "' is in both '", set.files[static_cast<std::size_t>(set.tensors[it->second].file)],
               "' and '", path, "'");
    set.tensors.push_back(std::move(x));
  }
}

// A sharded set: the index's weight_map names every tensor's file (relative to the index).
void read_index(const std::string& index, SafetensorsSet& set) {
  const std::string text = read_file(index, std::size_t{64} << 20);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    ZERO_THROW(kCorruption, "safetensors index '", index, "' is not JSON: ", e.what());
  }
  ZERO_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), kCorruption,
             "safetensors index '", index, "' has no \"weight_map\" object");
  const fs::path dir = fs::path(index).parent_path();
  std::vector<std::string> names;
  for (const auto& [tensor, file] : j["weight_map"].items()) {
    ZERO_CHECK(file.is_string(), kCorruption, "safetensors index '", index, "': tensor '", tensor,
               "' maps to ", file.dump(), ", not a file name");
    const std::string f = file.get<std::string>();
    const fs::path p(f);
    ZERO_CHECK(!f.empty() && p.is_relative() &&
                   std::none_of(p.begin(), p.end(), [](const fs::path& c) { return c == ".."; }),
               kCorruption, "safetensors index '", index, "': tensor '", tensor, "' maps to '", f,
               "', not a file beside the index");
    if (std::find(names.begin(), names.end(), f) == names.end()) names.push_back(f);
  }
  std::sort(names.begin(), names.end());
  for (const std::string& f : names) {
    set.files.push_back((dir / f).string());
    read_header(set.files.back(), static_cast<int>(set.files.size() - 1), set);
  }
  for (const auto& [tensor, file] : j["weight_map"].items()) {
    const SafetensorsTensor* t = set.find(tensor);
    const std::string want = (dir / file.get<std::string>()).string();
    ZERO_CHECK(t != nullptr && set.files[static_cast<std::size_t>(t->file)] == want, kCorruption,
               "safetensors index '", index, "': tensor '", tensor, "' maps to '",
               file.get<std::string>(), "', which has no such tensor");
  }
}

}  // namespace

SafetensorsSet open_safetensors(const std::string& path) {
  SafetensorsSet set;
  set.source = path;
  std::string index;
  if (fs::is_directory(path)) {
    if (fs::exists(fs::path(path) / kSafetensorsIndex)) {
      index = (fs::path(path) / kSafetensorsIndex).string();
    } else {
      std::vector<std::string> found;
      for (const auto& e : fs::directory_iterator(path)) {
        if (e.path().extension() == ".safetensors") found.push_back(e.path().string());
      }
      ZERO_CHECK(found.size() == 1, kIO, "safetensors '", path, "': a directory with no ",
                 kSafetensorsIndex, " must hold exactly one .safetensors file, not ", found.size());
      set.files.push_back(found[0]);
    }
  } else if (path.size() >= 11 && path.compare(path.size() - 11, 11, ".index.json") == 0) {
    index = path;
  } else {
    set.files.push_back(path);
  }
  if (!index.empty()) {
    read_index(index, set);
  } else {
    read_header(set.files[0], 0, set);
  }
  return set;
}

}  // namespace zero::ckpt::detail
