// The import tests' files and model: a small model of odd shapes (parameters split across
// ranks, padding in every unit), a safetensors writer and reader written here from the format's
// specification (not zero's code: 8-byte little-endian header length, the JSON header with each
// tensor's dtype, shape and data_offsets relative to the data's start, "__metadata__"), and the
// stated conversion (file dtype -> f32 exactly -> working dtype, round to nearest even).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/compare.hpp"
#include "common/mlp_training.hpp"
#include "zero/core/dtype.hpp"
#include "zero/engine/engine.hpp"

namespace zero::testing {

// Units and their parameters, in declaration order; "<unit>.<param>" is the tensor's name.
inline std::vector<UnitSpec> import_model() {
  return {{"embed", {{"weight", {37, 6}}}},
          {"block0", {{"w", {6, 11}}, {"b", {11}}, {"norm", {6}}}},
          {"block1", {{"w", {11, 6}}, {"b", {6}}}},
          {"head", {{"weight", {6, 5}}}}};
}

// Adds `units` (the import model unless given) to a fresh engine and, with `fill`, sets every
// parameter to it: values an import must replace, or a failed one keep.
inline void add_units(Engine& e, const std::vector<UnitSpec>& units = import_model(),
                      std::optional<float> fill = std::nullopt) {
  for (const UnitSpec& u : units) e.add_unit(u);
  if (!fill) return;
  for (UnitId u = 0; u < e.num_units(); ++u) {
    for (int i = 0; i < static_cast<int>(e.unit(u).params.size()); ++i) {
      std::vector<float> v(e.unit(u).params[static_cast<std::size_t>(i)].numel(), *fill);
      e.set_param(u, i, v.data(), v.size());
    }
  }
}

// [[name, shape], ...] for tests/ckpt/write_safetensors.py.
inline std::string model_spec_json(const std::vector<UnitSpec>& units) {
  nlohmann::json j = nlohmann::json::array();
  for (const UnitSpec& u : units) {
    for (const ParamSpec& p : u.params) j.push_back({u.name + "." + p.name, p.shape});
  }
  return j.dump();
}

inline const char* st_dtype(DType t) {
  return t == DType::kF32 ? "F32" : t == DType::kBF16 ? "BF16" : "F16";
}

// A tensor as stored: its dtype name, shape and raw bytes.
struct RawTensor {
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::string bytes;
};

// Writes tensors in the given order; `header_patch` may rewrite the header's JSON text.
inline void write_st(const std::string& path,
                     const std::vector<std::pair<std::string, RawTensor>>& ts,
                     const std::function<void(nlohmann::json&)>& patch = {}) {
  nlohmann::json h = nlohmann::json::object();
  h["__metadata__"] = {{"format", "pt"}};
  std::size_t at = 0;
  std::string data;
  for (const auto& [name, t] : ts) {
    h[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {at, at + t.bytes.size()}}};
    at += t.bytes.size();
    data += t.bytes;
  }
  if (patch) patch(h);
  std::string text = h.dump();
  while (text.size() % 8 != 0) text.push_back(' ');
  std::ofstream out(path, std::ios::binary);
  const std::uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>(n >> (8 * i)));
  out << text << data;
}

// f32 values stored as `dt` (round to nearest even), as raw little-endian bytes.
inline RawTensor encode(const std::vector<float>& v, std::vector<std::int64_t> shape, DType dt) {
  RawTensor t{st_dtype(dt), std::move(shape), std::string(v.size() * dtype_size(dt), '\0')};
  for (std::size_t i = 0; i < v.size(); ++i)
    store_from_f32(t.bytes.data() + i * dtype_size(dt), dt, v[i]);
  return t;
}

// Every tensor of a file, decoded exactly to f32 (F32: the bits; BF16: the upper half of an
// f32; F16: widened), keyed by name.
inline std::map<std::string, std::vector<float>> read_st_f32(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
  const nlohmann::json h = nlohmann::json::parse(bytes.substr(8, n));
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, t] : h.items()) {
    if (name == "__metadata__") continue;
    const std::string dt = t.at("dtype");
    const auto off = t.at("data_offsets").get<std::vector<std::size_t>>();
    const std::size_t es = dt == "F32" ? 4 : 2;
    std::vector<float> v((off[1] - off[0]) / es);
    for (std::size_t i = 0; i < v.size(); ++i) {
      const char* p = bytes.data() + 8 + n + off[0] + i * es;
      std::uint32_t bits = 0;
      std::memcpy(&bits, p, es);
      v[i] = dt == "F32"    ? f32_from_bits(bits)
             : dt == "BF16" ? bf16_to_f32(static_cast<std::uint16_t>(bits))
                            : f16_to_f32(static_cast<std::uint16_t>(bits));
    }
    out[name] = std::move(v);
  }
  return out;
}

// f32 -> the working dtype -> f32 (round to nearest even; overflow to +-Inf).
inline float round_to(float x, DType w) {
  char buf[4];
  store_from_f32(buf, w, x);
  return load_as_f32(buf, w);
}

// The model's tensors as a file holds them (decoded to f32), in declaration order.
inline Tensors file_values(const std::map<std::string, std::vector<float>>& file,
                           const std::vector<UnitSpec>& units) {
  Tensors out;
  for (const UnitSpec& u : units) {
    for (const ParamSpec& p : u.params) out.push_back(file.at(u.name + "." + p.name));
  }
  return out;
}

inline Tensors rounded(Tensors t, DType w) {
  for (auto& v : t) {
    for (float& x : v) x = round_to(x, w);
  }
  return t;
}

// A config of the given stage and working dtype (AdamW unless `optimizer` says otherwise).
inline Config import_config(int stage, DType w, const std::string& optimizer = "AdamW") {
  RunSpec s;
  s.stage = stage;
  s.dtype = w;
  Config c = make_config(s);
  if (optimizer != "AdamW") {
    std::string j = c.to_json();
    nlohmann::json cj = nlohmann::json::parse(j);
    cj["optimizer"] = {{"type", optimizer}, {"params", {{"lr", 1e-4}, {"weight_decay", 0.1}}}};
    cj.erase("scheduler");
    c = parse_config(cj.dump());
  }
  return c;
}

}  // namespace zero::testing
