#include "ckpt/manifest.hpp"

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <type_traits>
#include <utility>

#include "zero/core/error.hpp"

namespace zero::ckpt::detail {

using nlohmann::json;

namespace {

// A JSON value as the integer type T: only an integer within T's range. nlohmann's get<T>()
// would cast a float out of T's range (undefined behaviour: "version": 1e300) and wrap a
// negative size ("begin": -1) into a huge one.
template <typename T>
T integer_value(const json& v, const char* key, const std::string& where) {
  if (v.is_number_unsigned()) {
    const std::uint64_t u = v.get<std::uint64_t>();
    if (std::in_range<T>(u)) return static_cast<T>(u);
  } else if (v.is_number_integer()) {
    const std::int64_t i = v.get<std::int64_t>();
    if (std::in_range<T>(i)) return static_cast<T>(i);
  }
  ZERO_THROW(kCorruption, "checkpoint manifest '", where, "': key '", key, "' is ",
             v.is_number() ? v.dump() : std::string("a ") + v.type_name(), ", not an integer in [",
             std::numeric_limits<T>::min(), ", ", std::numeric_limits<T>::max(), "]");
}

template <typename T>
struct IsIntegerVector : std::false_type {};
template <typename T>
struct IsIntegerVector<std::vector<T>> : std::bool_constant<std::is_integral_v<T>> {};

// A field of a parsed manifest; kCorruption naming the file and the key when it is missing or
// of another type (integers: also out of range).
template <typename T>
T field(const json& j, const char* key, const std::string& where) {
  ZERO_CHECK(j.is_object() && j.contains(key), kCorruption, "checkpoint manifest '", where,
             "': key '", key, "' is missing");
  const json& v = j.at(key);
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    return integer_value<T>(v, key, where);
  } else if constexpr (IsIntegerVector<T>::value) {
    ZERO_CHECK(v.is_array(), kCorruption, "checkpoint manifest '", where, "': key '", key,
               "' is a ", v.type_name(), ", not an array of integers");
    T out;
    out.reserve(v.size());
    for (const json& e : v) out.push_back(integer_value<typename T::value_type>(e, key, where));
    return out;
  } else {
    try {
      return v.get<T>();
    } catch (const json::exception& e) {
      ZERO_THROW(kCorruption, "checkpoint manifest '", where, "': key '", key,
                 "' has the wrong type: ", e.what());
    }
  }
}

json piece_json(const Piece& p) {
  return {{"file", p.file},
          {"begin", p.begin},
          {"end", p.end},
          {"master_offset", p.master_offset},
          {"state_offsets", p.state_offsets}};
}

Piece parse_piece(const json& j, const std::string& where) {
  Piece p;
  p.file = field<std::string>(j, "file", where);
  p.begin = field<std::size_t>(j, "begin", where);
  p.end = field<std::size_t>(j, "end", where);
  p.master_offset = field<std::size_t>(j, "master_offset", where);
  p.state_offsets = field<std::vector<std::size_t>>(j, "state_offsets", where);
  ZERO_CHECK(p.begin < p.end, kCorruption, "checkpoint manifest '", where, "': a piece in '",
             p.file, "' has the empty range [", p.begin, ", ", p.end, ") (keys 'begin', 'end')");
  return p;
}

json file_json(const FileEntry& f) {
  return {{"name", f.name}, {"size", f.digest.size}, {"xxh3_64", to_hex(f.digest.xxh3)}};
}

FileEntry parse_file(const json& j, const std::string& where) {
  FileEntry f;
  f.name = field<std::string>(j, "name", where);
  ZERO_CHECK(
      !f.name.empty() && f.name.find('/') == std::string::npos && f.name != "." && f.name != "..",
      kCorruption, "checkpoint manifest '", where, "': file name '", f.name,
      "' is not a plain name in the checkpoint directory");
  f.digest.size = field<std::size_t>(j, "size", where);
  f.digest.xxh3 =
      from_hex(field<std::string>(j, "xxh3_64", where), where + ": key 'xxh3_64' of " + f.name);
  return f;
}

}  // namespace

std::string Manifest::to_json() const {
  json units_j = json::array();
  for (const UnitEntry& u : units) {
    json params_j = json::array();
    for (const ParamEntry& p : u.params) {
      json pieces_j = json::array();
      for (const Piece& pc : p.pieces) pieces_j.push_back(piece_json(pc));
      params_j.push_back({{"name", p.name},
                          {"shape", p.shape},
                          {"numel", p.numel},
                          {"dtype", p.dtype},
                          {"pieces", pieces_j}});
    }
    json unit_j = {{"name", u.name}, {"params", params_j}};
    if (!u.states.empty()) {
      json states_j = json::array();
      for (const Piece& pc : u.states) states_j.push_back(piece_json(pc));
      unit_j["states"] = states_j;
    }
    units_j.push_back(unit_j);
  }
  json files_j = json::array();
  for (const FileEntry& f : files) files_j.push_back(file_json(f));
  json config;
  try {
    config = json::parse(config_json);
  } catch (const json::exception&) {
    config = config_json;
  }
  const json j = {{"format", "zero-checkpoint"},
                  {"version", version},
                  {"world_size", world_size},
                  {"stage", stage},
                  {"alignment", alignment},
                  {"param_dtype", param_dtype},
                  {"optimizer",
                   {{"type", optimizer},
                    {"state_dtype", state_dtype},
                    {"num_states", num_states},
                    {"params",
                     {{"lr", hyper.lr},
                      {"beta1", hyper.beta1},
                      {"beta2", hyper.beta2},
                      {"eps", hyper.eps},
                      {"weight_decay", hyper.weight_decay},
                      {"bias_correction", hyper.bias_correction},
                      {"adam_w_mode", hyper.adam_w_mode},
                      {"momentum", hyper.momentum},
                      {"dampening", hyper.dampening},
                      {"nesterov", hyper.nesterov}}}}},
                  {"training",
                   {{"steps", steps},
                    {"skipped", skipped},
                    {"fp16", fp16},
                    {"loss_scaler",
                     {{"scale", loss_scaler.scale},
                      {"iter", loss_scaler.iter},
                      {"last_overflow_iter", loss_scaler.last_overflow_iter},
                      {"cur_hysteresis", loss_scaler.cur_hysteresis}}}}},
                  {"config", config},
                  {"units", units_j},
                  {"files", files_j}};
  return j.dump(1);
}

Manifest Manifest::parse(const std::string& text, const std::string& where) {
  Manifest m = parse_fields(text, where);
  m.check(where);
  return m;
}

Manifest Manifest::parse_fields(const std::string& text, const std::string& where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    ZERO_THROW(kCorruption, "checkpoint manifest '", where, "' is not valid JSON: ", e.what());
  }
  // find, not value(): value() throws json::type_error when "format" is not a string.
  const auto format = j.find("format");  // end() for a non-object too
  ZERO_CHECK(format != j.end() && *format == "zero-checkpoint", kCorruption, "'", where,
             "' is not a zero checkpoint manifest (no \"format\": "
             "\"zero-checkpoint\")");
  Manifest m;
  m.version = field<int>(j, "version", where);
  ZERO_CHECK(m.version == kFormatVersion, kCorruption, "checkpoint manifest '", where,
             "': format version ", m.version, "; this build reads version ", kFormatVersion);
  m.world_size = field<int>(j, "world_size", where);
  m.stage = field<int>(j, "stage", where);
  m.alignment = field<std::size_t>(j, "alignment", where);
  m.param_dtype = field<std::string>(j, "param_dtype", where);
  const json o = field<json>(j, "optimizer", where);
  m.optimizer = field<std::string>(o, "type", where);
  m.state_dtype = field<std::string>(o, "state_dtype", where);
  m.num_states = field<int>(o, "num_states", where);
  const json h = field<json>(o, "params", where);
  m.hyper.lr = field<double>(h, "lr", where);
  m.hyper.beta1 = field<double>(h, "beta1", where);
  m.hyper.beta2 = field<double>(h, "beta2", where);
  m.hyper.eps = field<double>(h, "eps", where);
  m.hyper.weight_decay = field<double>(h, "weight_decay", where);
  m.hyper.bias_correction = field<bool>(h, "bias_correction", where);
  m.hyper.adam_w_mode = field<bool>(h, "adam_w_mode", where);
  m.hyper.momentum = field<double>(h, "momentum", where);
  m.hyper.dampening = field<double>(h, "dampening", where);
  m.hyper.nesterov = field<bool>(h, "nesterov", where);
  const json t = field<json>(j, "training", where);
  m.steps = field<std::int64_t>(t, "steps", where);
  m.skipped = field<std::int64_t>(t, "skipped", where);
  m.fp16 = field<bool>(t, "fp16", where);
  const json ls = field<json>(t, "loss_scaler", where);
  m.loss_scaler.scale = field<double>(ls, "scale", where);
  m.loss_scaler.iter = field<std::int64_t>(ls, "iter", where);
  m.loss_scaler.last_overflow_iter = field<std::int64_t>(ls, "last_overflow_iter", where);
  m.loss_scaler.cur_hysteresis = field<int>(ls, "cur_hysteresis", where);
  m.config_json = field<json>(j, "config", where).dump();
  for (const json& uj : field<json>(j, "units", where)) {
    UnitEntry u;
    u.name = field<std::string>(uj, "name", where);
    for (const json& pj : field<json>(uj, "params", where)) {
      ParamEntry p;
      p.name = field<std::string>(pj, "name", where);
      p.shape = field<std::vector<std::int64_t>>(pj, "shape", where);
      p.numel = field<std::size_t>(pj, "numel", where);
      p.dtype = field<std::string>(pj, "dtype", where);
      for (const json& cj : field<json>(pj, "pieces", where)) {
        p.pieces.push_back(parse_piece(cj, where));
      }
      u.params.push_back(std::move(p));
    }
    if (uj.contains("states")) {
      for (const json& cj : field<json>(uj, "states", where)) {
        u.states.push_back(parse_piece(cj, where));
      }
    }
    m.units.push_back(std::move(u));
  }
  for (const json& fj : field<json>(j, "files", where)) m.files.push_back(parse_file(fj, where));
  return m;
}

const FileEntry* Manifest::file(const std::string& name) const {
  for (const FileEntry& f : files) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

std::string Fragment::to_json() const {
  json units_j = json::array();
  for (const auto& unit : pieces) {
    json params_j = json::array();
    for (const auto& param : unit) {
      json pj = json::array();
      for (const Piece& p : param) pj.push_back(piece_json(p));
      params_j.push_back(pj);
    }
    units_j.push_back(params_j);
  }
  json j = {{"rank", rank}, {"pieces", units_j}};
  if (!unit_states.empty()) {
    json states_j = json::array();
    for (const auto& unit : unit_states) {
      json uj = json::array();
      for (const Piece& p : unit) uj.push_back(piece_json(p));
      states_j.push_back(uj);
    }
    j["unit_states"] = states_j;
  }
  if (file.has_value()) j["file"] = file_json(*file);
  return j.dump();
}

Fragment Fragment::parse(const std::string& text, const std::string& where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    ZERO_THROW(kCorruption, "checkpoint fragment '", where, "' is not valid JSON: ", e.what());
  }
  Fragment f;
  f.rank = field<int>(j, "rank", where);
  for (const json& uj : field<json>(j, "pieces", where)) {
    std::vector<std::vector<Piece>> unit;
    for (const json& pj : uj) {
      std::vector<Piece> param;
      for (const json& cj : pj) param.push_back(parse_piece(cj, where));
      unit.push_back(std::move(param));
    }
    f.pieces.push_back(std::move(unit));
  }
  if (j.contains("unit_states")) {
    for (const json& uj : field<json>(j, "unit_states", where)) {
      std::vector<Piece> unit;
      for (const json& cj : uj) unit.push_back(parse_piece(cj, where));
      f.unit_states.push_back(std::move(unit));
    }
  }
  if (j.contains("file")) f.file = parse_file(j.at("file"), where);
  return f;
}

Manifest read_manifest(const std::string& dir) {
  const std::string path = dir + "/" + kManifest;
  const std::string text = read_file(path);
  const std::string sum_path = dir + "/" + kManifestSum;
  // Exactly 16 hex digits and a newline: any change to it is detected.
  const std::string sum = read_file(sum_path, 64);
  ZERO_CHECK(sum.size() == 17 && sum.back() == '\n', kCorruption, "checkpoint file '", sum_path,
             "' is damaged: ", sum.size(), " bytes, 17 expected (16 hex digits and a newline)");
  const std::uint64_t want = from_hex(sum.substr(0, 16), sum_path);
  ZERO_CHECK(xxh3(text.data(), text.size()) == want, kCorruption, "checkpoint file '", path,
             "' does not match its checksum in '", sum_path, "' (one of them is corrupted)");
  return Manifest::parse(text, path);
}

Manifest manifest_of(Engine& e) {
  Manifest m;
  m.world_size = e.comm().size();
  m.stage = e.stage();
  m.alignment = e.alignment();
  m.param_dtype = std::string(to_string(e.param_dtype()));
  const OptimizerParams& op = e.optimizer_params();
  m.optimizer = std::string(to_string(op.type));
  m.state_dtype = std::string(to_string(op.state_dtype()));
  m.num_states = op.num_states();
  m.hyper = op;
  const Engine::TrainingState t = e.training_state();
  m.steps = t.steps;
  m.skipped = t.skipped;
  m.fp16 = e.config().fp16.enabled;
  m.loss_scaler = t.loss_scaler;
  m.config_json = e.config().to_json();
  for (UnitId u = 0; u < e.num_units(); ++u) {
    UnitEntry ue;
    ue.name = e.unit(u).name;
    for (const ParamSpec& ps : e.unit(u).params) {
      ParamEntry pe;
      pe.name = ps.name;
      pe.shape = ps.shape;
      pe.numel = ps.numel();
      ue.params.push_back(std::move(pe));
    }
    m.units.push_back(std::move(ue));
  }
  return m;
}

std::string model_mismatch(const Manifest& saved, Engine& e, bool optimizer) {
  auto shape_str = [](const std::vector<std::int64_t>& s) {
    std::string out = "[";
    for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
  };
  const std::size_t nu = std::min(saved.units.size(), static_cast<std::size_t>(e.num_units()));
  for (std::size_t u = 0; u < nu; ++u) {
    const UnitEntry& su = saved.units[u];
    const UnitSpec& eu = e.unit(static_cast<UnitId>(u));
    const std::size_t np = std::min(su.params.size(), eu.params.size());
    for (std::size_t i = 0; i < np; ++i) {
      const ParamEntry& sp = su.params[i];
      const ParamSpec& ep = eu.params[i];
      if (su.name != eu.name || sp.name != ep.name || sp.shape != ep.shape) {
        return "parameter " + std::to_string(i) + " of unit " + std::to_string(u) +
               " differs: the checkpoint has '" + su.name + "." + sp.name + "' " +
               shape_str(sp.shape) + ", the engine '" + eu.name + "." + ep.name + "' " +
               shape_str(ep.shape);
      }
    }
    if (su.params.size() != eu.params.size()) {
      return "unit '" + su.name + "' has " + std::to_string(su.params.size()) +
             " parameters in the checkpoint and " + std::to_string(eu.params.size()) +
             " in the engine (first unmatched: '" + su.name + "." +
             (su.params.size() > np ? su.params[np].name : eu.params[np].name) + "')";
    }
  }
  if (saved.units.size() != static_cast<std::size_t>(e.num_units())) {
    return "the checkpoint has " + std::to_string(saved.units.size()) + " units, the engine " +
           std::to_string(e.num_units()) + " (first unmatched: '" +
           (saved.units.size() > nu ? saved.units[nu].name : e.unit(static_cast<UnitId>(nu)).name) +
           "')";
  }
  if (!optimizer) return {};
  const OptimizerParams& op = e.optimizer_params();
  if (saved.optimizer != to_string(op.type)) {
    return "the checkpoint's optimizer is " + saved.optimizer + ", the engine's " +
           std::string(to_string(op.type)) +
           " (config key 'optimizer.type'): optimizer state does not carry over between them";
  }
  if (saved.state_dtype != to_string(op.state_dtype()) || saved.num_states != op.num_states()) {
    return "the checkpoint's " + saved.optimizer + " keeps " + std::to_string(saved.num_states) +
           " states of " + saved.state_dtype + ", the engine's " + std::to_string(op.num_states()) +
           " of " + std::string(to_string(op.state_dtype())) +
           " (config key 'optimizer.params.moment_dtype')";
  }
  return {};
}

}  // namespace zero::ckpt::detail
