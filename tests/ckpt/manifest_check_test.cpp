// A manifest that is consistent but wrong — edited, its checksum recomputed — is refused before
// anything is read by it, naming the field. The fields come from the writer: every key of a saved
// manifest.json (int8 moments, fp16: every key it can write) must have an entry in the table of
// forged values below, so a field added to the writer without a check fails here. Then the
// issue's cases end to end: world_size 0 and 10^9, stage 9, a parameter dtype "f64", alignment 0
// refused by load on every rank; consolidate refuses an empty files list and a negative step.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ckpt/ckpt_runs.hpp"
#include "ckpt/file_io.hpp"
#include "ckpt/manifest.hpp"
#include "common/expect_error.hpp"
#include "common/temp_dir.hpp"

namespace zero {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::RunSpec;
using testing::TempDir;

// fp16 (a dynamic loss scaler that has counted steps) and int8 moments (the units' state pieces):
// the manifest with every key the writer has.
const RunSpec kSpec{
    .stage = 2, .ranks = 2, .dtype = DType::kF16, .clip = true, .moment_dtype = "int8"};

std::string make_checkpoint(const std::string& root) {
  ThreadGroup::run(2, [&](Communicator& c) { testing::run_and_save(c, kSpec, 4, root, false); });
  return ckpt::resolve(root);
}

// Writes `m` as dir's manifest with its checksum recomputed, as the save writes them.
void write_forged(const std::string& dir, const json& m) {
  const std::string text = m.dump(1);
  std::ofstream(dir + "/" + ckpt::detail::kManifest, std::ios::binary | std::ios::trunc) << text;
  std::ofstream(dir + "/" + ckpt::detail::kManifestSum, std::ios::binary | std::ios::trunc)
      << ckpt::detail::to_hex(ckpt::detail::xxh3(text.data(), text.size())) << "\n";
}

// Every leaf of the manifest, by its path with array indices dropped ("units[].params[].shape"),
// with the pointer of its first occurrence. Arrays of numbers, empty arrays and the config (the
// config reader's, fuzzed as config_fuzz) are leaves.
void leaves(const json& j, const std::string& path, const json::json_pointer& at,
            std::map<std::string, json::json_pointer>& out) {
  const bool numbers =
      j.is_array() && std::all_of(j.begin(), j.end(), [](const json& e) { return e.is_number(); });
  if (path == "config" || !(j.is_object() || j.is_array()) || numbers || j.empty()) {
    out.emplace(path, at);
  } else if (j.is_object()) {
    for (const auto& [k, v] : j.items()) leaves(v, path.empty() ? k : path + "." + k, at / k, out);
  } else {
    for (std::size_t i = 0; i < j.size(); ++i) leaves(j[i], path + "[]", at / i, out);
  }
}

// A forged value of a field, from its saved value and the whole manifest.
using Forge = std::function<json(const json& saved, const json& manifest)>;
Forge value(json v) {
  return [v](const json&, const json&) { return v; };
}
Forge plus(std::int64_t d) {
  return [d](const json& s, const json&) { return s.get<std::int64_t>() + d; };
}
struct Forgery {
  Forge forge;
  std::string needle;  // what the error must name; empty: the field's own key
};

// For each field the writer writes: values outside its range or inconsistent with the others.
const std::map<std::string, std::vector<Forgery>>& forgeries() {
  const auto file_size = [](const json& s, const json& m) {
    for (const json& f : m["files"]) {
      if (f["name"] == m["units"][0]["params"][0]["pieces"][0]["file"]) return f["size"];
    }
    return json(0);
  };
  static const std::map<std::string, std::vector<Forgery>> table = {
      {"format", {{value("zero-checkpoint-v0"), ""}}},
      {"version", {{value(2), ""}, {value(1e300), ""}}},
      {"world_size",
       {{value(0), ""}, {value(1000000000), ""}, {value(-1), ""}, {value(1), "rank-00001.bin"}}},
      {"stage", {{value(9), ""}, {value(-1), ""}, {value(1), "zero_optimization.stage"}}},
      {"alignment", {{value(0), ""}, {value(24), ""}, {value(std::int64_t{1} << 40), ""}}},
      {"param_dtype", {{value("f64"), ""}, {value("fp16"), ""}, {value("bf16"), "trains in f16"}}},
      {"optimizer.type", {{value("Nadam"), ""}, {value("adamw"), ""}, {value("Adam"), ""}}},
      {"optimizer.state_dtype", {{value("f16"), ""}, {value("bf16"), ""}}},
      {"optimizer.num_states", {{value(3), ""}, {value(0), ""}}},
      {"optimizer.params.lr", {{value(-1.0), "lr"}}},
      {"optimizer.params.beta1", {{value(1.5), "betas[0]"}}},
      {"optimizer.params.beta2", {{value(-0.1), "betas[1]"}}},
      {"optimizer.params.eps", {{value(-1e-8), "eps"}}},
      {"optimizer.params.weight_decay", {{value(-0.5), "weight_decay"}}},
      {"optimizer.params.bias_correction", {{value("yes"), "bias_correction"}}},
      {"optimizer.params.adam_w_mode", {{value(1), "adam_w_mode"}}},
      {"optimizer.params.momentum", {{value(-1.0), "momentum"}}},
      {"optimizer.params.dampening", {{value(2.0), "dampening"}}},
      {"optimizer.params.nesterov", {{value("no"), "nesterov"}}},
      {"training.steps", {{value(-1), ""}, {value(-4), ""}}},
      {"training.skipped", {{value(-1), ""}, {value(5), ""}}},
      {"training.fp16", {{value(false), ""}, {value(0), ""}}},
      {"training.loss_scaler.scale", {{value(0.0), "scale"}, {value(-2.0), "scale"}}},
      {"training.loss_scaler.iter", {{value(-1), ""}, {value(-100), ""}}},
      {"training.loss_scaler.last_overflow_iter", {{value(-2), ""}, {value(1000), ""}}},
      {"training.loss_scaler.cur_hysteresis", {{value(0), "cur_hysteresis"}}},
      {"config",
       {{value(json::parse(R"({"zero_optimization": {"stage": 7}})")), "'config'"},
        {value("not a config"), "'config'"}}},
      {"units[].name", {{value(5), "'name'"}}},
      {"units[].params[].name", {{value(json::array()), "'name'"}}},
      {"units[].params[].shape",
       {{value(json::array()), ""},
        {value(json::array({0, 4})), ""},
        {value(json::array({1 << 30, 1 << 30, 1 << 30})), ""},
        {value(json::array({1})), "numel"}}},
      {"units[].params[].numel", {{plus(1), ""}, {value(0), ""}}},
      {"units[].params[].dtype", {{value("f64"), ""}, {value("bf16"), ""}}},
      {"units[].params[].pieces[].file",
       {{value("rank-00009.bin"), ""}, {value("trainer.bin"), "world_size"}}},
      {"units[].params[].pieces[].begin", {{plus(1), "begin"}}},
      {"units[].params[].pieces[].end", {{plus(-1), "pieces"}, {plus(1000000), ""}}},
      {"units[].params[].pieces[].master_offset", {{file_size, ""}, {value(-1), ""}}},
      {"units[].params[].pieces[].state_offsets", {{value(json::array({0, 0})), ""}}},
      {"units[].states[].file", {{value("rank-00007.bin"), ""}}},
      {"units[].states[].begin", {{plus(1), ""}}},
      {"units[].states[].end", {{plus(1 << 20), ""}}},
      {"units[].states[].master_offset", {{value(4), ""}}},
      {"units[].states[].state_offsets",
       {{value(json::array({0})), ""},
        {value(json::array({0, std::int64_t{1} << 40})), "state_offsets[1]"}}},
      {"files[].name", {{value("../trainer.bin"), "name"}, {value("extra.bin"), "files"}}},
      {"files[].size", {{value(-1), "size"}}},
      {"files[].xxh3_64", {{value("xyz"), "xxh3_64"}}},
  };
  return table;
}

TEST(CkptManifestCheck, EveryFieldTheWriterWritesIsRefusedOutOfRangeNamingIt) {
  TempDir root("manifest-check");
  const std::string dir = make_checkpoint(root.path());
  const std::string saved_text = testing::read_file(dir + "/" + ckpt::detail::kManifest);
  const json saved = json::parse(saved_text);
  std::map<std::string, json::json_pointer> fields;
  leaves(saved, "", json::json_pointer(), fields);
  ASSERT_GT(fields.size(), 40u);
  ASSERT_TRUE(fields.count("units[].states[].end")) << "the run saved no int8 state pieces";
  int refused = 0;
  for (const auto& [field, at] : fields) {
    const auto row = forgeries().find(field);
    if (row == forgeries().end()) {
      ADD_FAILURE() << "the writer writes '" << field << "' (" << saved[at].dump()
                    << "): give it forged values in the table";
      continue;
    }
    const std::string key = field.substr(field.rfind('.') + 1);
    for (const Forgery& f : row->second) {
      json forged = saved;
      forged[at] = f.forge(saved[at], saved);
      write_forged(dir, forged);
      const std::string needle = f.needle.empty() ? key : f.needle;
      SCOPED_TRACE(field + " = " + forged[at].dump());
      testing::expect_error([&] { ckpt::detail::read_manifest(dir); }, ErrorCode::kCorruption,
                            needle);
      ++refused;
    }
  }
  // The table names no field the writer does not write (a stale row).
  for (const auto& [field, values] : forgeries()) {
    EXPECT_TRUE(fields.count(field)) << "the table forges '" << field << "', never written";
  }
  // Restored, the manifest is read again.
  write_forged(dir, saved);
  EXPECT_EQ(testing::read_file(dir + "/" + ckpt::detail::kManifest), saved_text);
  EXPECT_NO_THROW(ckpt::detail::read_manifest(dir));
  std::printf("%zu manifest fields, %d forged values, each refused naming the field\n",
              fields.size(), refused);
}

// The issue's cases through the user's calls: load on every rank, consolidate.
TEST(CkptManifestCheck, ForgedManifestsAreRefusedByLoadAndConsolidateNamingTheField) {
  TempDir root("manifest-forged");
  const std::string dir = make_checkpoint(root.path());
  const json saved = json::parse(testing::read_file(dir + "/" + ckpt::detail::kManifest));
  struct Case {
    std::string pointer;
    json value;
    std::string needle;
  };
  const std::vector<Case> load_cases = {
      {"/world_size", 0, "key 'world_size' is 0"},
      {"/world_size", 1000000000, "key 'world_size' is 1000000000"},
      {"/stage", 9, "key 'stage' is 9"},
      {"/units/0/params/0/dtype", "f64", "key 'units[0].params[0].dtype' is 'f64'"},
      {"/alignment", 0, "key 'alignment' is 0"},
  };
  for (const Case& c : load_cases) {
    json forged = saved;
    forged[json::json_pointer(c.pointer)] = c.value;
    write_forged(dir, forged);
    ThreadGroup::run(2, [&](Communicator& comm) {
      testing::MlpEngine e(comm, testing::make_config(kSpec), 7);
      testing::expect_error([&] { ckpt::load(e, root.path()); }, ErrorCode::kCorruption, c.needle);
      EXPECT_EQ(e.training_state().steps, 0);
    });
  }
  const std::string out = root.path() + "/out.safetensors";
  json no_files = saved;
  no_files["files"] = json::array();
  write_forged(dir, no_files);
  testing::expect_error([&] { ckpt::consolidate(root.path(), out, DType::kF32); },
                        ErrorCode::kCorruption, "key 'files' is empty");
  json negative = saved;
  negative["training"]["steps"] = -3;
  write_forged(dir, negative);
  testing::expect_error([&] { ckpt::consolidate(root.path(), out, DType::kF32); },
                        ErrorCode::kCorruption, "key 'training.steps' is -3");
  EXPECT_FALSE(fs::exists(out));
  write_forged(dir, saved);
  EXPECT_GT(ckpt::consolidate(root.path(), out, DType::kF32), 0u);
}

}  // namespace
}  // namespace zero
