// A model's units read off a safetensors header (zero/plan/choose.hpp units_from_safetensors): one
// file and a Hugging Face sharded set written with the checkpoint layer's writer
// (ckpt/safetensors.hpp safetensors_header), tensors grouped by layer prefix or a pattern, the
// data never needed; a malformed header and a bad pattern named in the error.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "ckpt/safetensors.hpp"
#include "common/expect_error.hpp"
#include "common/temp_dir.hpp"
#include "zero/plan/choose.hpp"

namespace zero {
namespace {

namespace fs = std::filesystem;
using ckpt::detail::SafetensorsEntry;
using testing::expect_error;

// A LLaMA-shaped list: embedding, layers 0, 1, 2 and 10 (natural order puts 10 last), the final
// norm, the head, an integer buffer (not a parameter) and a scalar.
std::vector<SafetensorsEntry> llama_like() {
  std::vector<SafetensorsEntry> t = {
      {"model.embed_tokens.weight", DType::kBF16, {32, 8}},
      {"model.norm.weight", DType::kF32, {8}},
      {"lm_head.weight", DType::kBF16, {32, 8}},
      {"model.rope.scale", DType::kF32, {}},
  };
  for (int l : {10, 2, 0, 1}) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    t.push_back({p + "self_attn.q_proj.weight", DType::kBF16, {8, 8}});
    t.push_back({p + "mlp.up_proj.weight", DType::kBF16, {16, 8}});
    t.push_back({p + "input_layernorm.weight", DType::kF16, {8}});
  }
  return t;
}

// Writes `tensors` as one safetensors file (the header, then zero data) with an I64 buffer added
// by hand after the writer's header is parsed back (the writer writes the dtypes zero reads).
void write_file(const std::string& path, const std::vector<SafetensorsEntry>& tensors) {
  const std::string header = ckpt::detail::safetensors_header(tensors, {{"format", "pt"}});
  std::size_t data = 0;
  for (const SafetensorsEntry& t : tensors) {
    std::size_t n = dtype_size(t.dtype);
    for (std::int64_t d : t.shape) n *= static_cast<std::size_t>(d);
    data += n;
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << header << std::string(data, '\0');
}

std::map<std::string, std::size_t> numel_by_unit(const std::vector<UnitSpec>& units) {
  std::map<std::string, std::size_t> m;
  for (const UnitSpec& u : units) {
    for (const ParamSpec& p : u.params) m[u.name] += p.numel();
  }
  return m;
}

std::vector<std::string> names(const std::vector<UnitSpec>& units) {
  std::vector<std::string> n;
  for (const UnitSpec& u : units) n.push_back(u.name);
  return n;
}

TEST(SafetensorsUnits, UnitOfTensorByLayerPrefixOrItsOwner) {
  EXPECT_EQ(unit_of_tensor("model.layers.12.mlp.up_proj.weight", kLayerUnitPattern),
            "model.layers.12");
  EXPECT_EQ(unit_of_tensor("transformer.h.3.attn.c_attn.bias", kLayerUnitPattern),
            "transformer.h.3");
  EXPECT_EQ(unit_of_tensor("blocks.7", kLayerUnitPattern), "blocks.7");
  EXPECT_EQ(unit_of_tensor("model.norm.weight", kLayerUnitPattern), "model.norm");
  EXPECT_EQ(unit_of_tensor("lm_head.weight", kLayerUnitPattern), "lm_head");
  EXPECT_EQ(unit_of_tensor("scale", kLayerUnitPattern), "scale");
  // A pattern of one's own: two layers a unit.
  EXPECT_EQ(unit_of_tensor("model.layers.12.mlp.w", R"(^model\.layers\.\d*[02468])"),
            "model.layers.12");
  expect_error([] { (void)unit_of_tensor("x", "(unclosed"); }, ErrorCode::kConfig, "(unclosed");
}

TEST(SafetensorsUnits, OneFileIsGroupedByLayerInNaturalOrder) {
  const testing::TempDir tmp;
  const std::string dir = tmp.path();
  const std::string file = dir + "/model.safetensors";
  write_file(file, llama_like());
  const std::vector<UnitSpec> units = units_from_safetensors(file);
  EXPECT_EQ(names(units), (std::vector<std::string>{
                              "lm_head", "model.embed_tokens", "model.layers.0", "model.layers.1",
                              "model.layers.2", "model.layers.10", "model.norm", "model.rope"}));
  const auto n = numel_by_unit(units);
  EXPECT_EQ(n.at("model.layers.10"), 8u * 8 + 16 * 8 + 8);
  EXPECT_EQ(n.at("model.embed_tokens"), 32u * 8);
  EXPECT_EQ(n.at("model.rope"), 1u);  // a scalar: shape [1]
  for (const UnitSpec& u : units) {
    for (const ParamSpec& p : u.params) EXPECT_TRUE(p.trainable) << p.name;
  }
  // The directory finds the file; the parameters in a unit in natural order.
  const std::vector<UnitSpec> again = units_from_safetensors(dir);
  EXPECT_EQ(names(again), names(units));
  EXPECT_EQ(units[2].params[0].name, "model.layers.0.input_layernorm.weight");
  // Planned as any units: the planner's element count is the file's.
  PlanInput pin;
  pin.units = units;
  pin.ranks = 2;
  pin.config = ConfigBuilder().set("zero_optimization.stage=2", "test").build();
  std::size_t total = 0;
  for (const auto& [u, k] : n) total += k;
  EXPECT_EQ(plan_engine_memory(pin).psi, total);
}

// Integer tensors are buffers (not parameters); the header is all that is read: a file whose data
// is cut short is refused by the reader, naming it (its ranges are checked, not its bytes read).
TEST(SafetensorsUnits, BuffersAreLeftOutAndAMalformedHeaderIsNamed) {
  const testing::TempDir tmp;
  const std::string dir = tmp.path();
  const std::string file = dir + "/ids.safetensors";
  {
    // By hand: an I64 buffer beside one F32 weight.
    std::string h = R"({"position_ids":{"dtype":"I64","shape":[4],"data_offsets":[0,32]},)"
                    R"("h.0.w":{"dtype":"F32","shape":[2,2],"data_offsets":[32,48]}})";
    while ((8 + h.size()) % 8 != 0) h.push_back(' ');
    std::string len(8, '\0');
    for (int i = 0; i < 8; ++i)
      len[static_cast<std::size_t>(i)] = static_cast<char>(h.size() >> (8 * i));
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out << len << h << std::string(48, '\0');
  }
  const std::vector<UnitSpec> units = units_from_safetensors(file);
  ASSERT_EQ(units.size(), 1u);
  EXPECT_EQ(units[0].name, "h.0");
  EXPECT_EQ(units[0].params.size(), 1u);

  const std::string broken = dir + "/broken.safetensors";
  {
    std::string len(8, '\0');
    len[0] = static_cast<char>(200);  // a 200-byte header in a 20-byte file
    std::ofstream out(broken, std::ios::binary | std::ios::trunc);
    out << len << R"({"a":{"dtyp)";
  }
  expect_error([&] { (void)units_from_safetensors(broken); }, ErrorCode::kCorruption, broken);
  const std::string not_json = dir + "/not_json.safetensors";
  {
    std::string h = "{\"a\": [1, 2";
    while ((8 + h.size()) % 8 != 0) h.push_back(' ');
    std::string len(8, '\0');
    len[0] = static_cast<char>(h.size());
    std::ofstream out(not_json, std::ios::binary | std::ios::trunc);
    out << len << h;
  }
  expect_error([&] { (void)units_from_safetensors(not_json); }, ErrorCode::kCorruption, not_json);
  expect_error([&] { (void)units_from_safetensors(file, "[z-a]"); }, ErrorCode::kConfig, "[z-a]");
}

// A Hugging Face sharded set: the index's weight_map over two files; the units cross the files.
TEST(SafetensorsUnits, AShardedSetIsReadThroughItsIndex) {
  const testing::TempDir tmp;
  const std::string dir = tmp.file("set");
  fs::create_directories(dir);
  const std::vector<SafetensorsEntry> all = llama_like();
  std::vector<SafetensorsEntry> a(all.begin(), all.begin() + 7), b(all.begin() + 7, all.end());
  write_file(dir + "/model-00001-of-00002.safetensors", a);
  write_file(dir + "/model-00002-of-00002.safetensors", b);
  {
    std::ofstream out(dir + "/model.safetensors.index.json");
    out << R"({"metadata": {"total_size": 0}, "weight_map": {)";
    for (std::size_t k = 0; k < all.size(); ++k) {
      out << (k ? "," : "") << '"' << all[k].name << "\": \"model-0000" << (k < 7 ? 1 : 2)
          << "-of-00002.safetensors\"";
    }
    out << "}}";
  }
  const std::string one = tmp.file("one_for_set.safetensors");
  write_file(one, all);
  const std::vector<UnitSpec> set = units_from_safetensors(dir);
  EXPECT_EQ(numel_by_unit(set), numel_by_unit(units_from_safetensors(one)));
  EXPECT_EQ(names(units_from_safetensors(dir + "/model.safetensors.index.json")), names(set));
  // A shard the index names but the directory lacks: named.
  fs::remove(dir + "/model-00002-of-00002.safetensors");
  expect_error([&] { (void)units_from_safetensors(dir); }, ErrorCode::kIO,
               "model-00002-of-00002.safetensors");
}

}  // namespace
}  // namespace zero
