// The exports: the consolidated safetensors file read back by a reader written here from the
// format's specification (not zero's code) equals the gathered full parameters bitwise — the
// fp32 masters, and in bf16 the working copy the run trained with; a resharded checkpoint
// loads the same state at its new world size.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>

#include "ckpt/ckpt_runs.hpp"
#include "common/bitwise.hpp"

namespace zero {
namespace {

namespace fs = std::filesystem;
using testing::FullState;
using testing::RunSpec;
using testing::Tensors;

// safetensors, from its specification: 8 bytes little-endian N, N bytes of JSON header
// {name: {"dtype", "shape", "data_offsets": [begin, end)}, "__metadata__": {str: str}}, then
// the byte buffer; offsets are relative to the buffer, tensors row-major little-endian.
struct Tensor {
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::vector<float> values;  // decoded to f32 (BF16: the upper half of an f32)
};

std::map<std::string, Tensor> read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), {});
  EXPECT_GE(bytes.size(), 8u);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[static_cast<std::size_t>(i)];
  EXPECT_LE(8 + n, bytes.size());
  EXPECT_EQ((8 + n) % 8, 0u) << "the buffer starts 8-byte aligned";
  const nlohmann::json h =
      nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<long>(n));
  const std::size_t base = 8 + n;
  std::map<std::string, Tensor> out;
  std::vector<std::pair<std::size_t, std::size_t>> ranges;
  for (const auto& [name, t] : h.items()) {
    if (name == "__metadata__") {
      for (const auto& [k, v] : t.items()) EXPECT_TRUE(v.is_string()) << k;
      continue;
    }
    Tensor x;
    x.dtype = t.at("dtype").get<std::string>();
    x.shape = t.at("shape").get<std::vector<std::int64_t>>();
    const auto off = t.at("data_offsets").get<std::vector<std::size_t>>();
    std::size_t numel = 1;
    for (auto d : x.shape) numel *= static_cast<std::size_t>(d);
    const std::size_t es = x.dtype == "F32" ? 4 : 2;
    EXPECT_EQ(off[1] - off[0], numel * es) << name;
    EXPECT_LE(base + off[1], bytes.size()) << name;
    ranges.emplace_back(off[0], off[1]);
    x.values.resize(numel);
    for (std::size_t i = 0; i < numel; ++i) {
      const unsigned char* p = bytes.data() + base + off[0] + i * es;
      std::uint32_t bits = 0;
      if (es == 4) {
        bits = p[0] | (p[1] << 8) | (p[2] << 16) | (static_cast<std::uint32_t>(p[3]) << 24);
      } else {
        bits = (static_cast<std::uint32_t>(p[0]) << 16) | (static_cast<std::uint32_t>(p[1]) << 24);
      }
      std::memcpy(&x.values[i], &bits, 4);
    }
    out[name] = std::move(x);
  }
  // The buffer is covered exactly, without holes or overlaps (the reference reader's rule).
  std::sort(ranges.begin(), ranges.end());
  std::size_t at = 0;
  for (const auto& r : ranges) {
    EXPECT_EQ(r.first, at);
    at = r.second;
  }
  EXPECT_EQ(base + at, bytes.size());
  return out;
}

struct Saved {
  FullState state;
  Tensors params;  // working values (bf16) as f32
};

TEST(CkptExport, ConsolidatedSafetensorsEqualTheGatheredParametersBitwise) {
  const testing::TempDir dir;
  const fs::path root = dir.path();
  const RunSpec s{.stage = 3, .ranks = 3, .dtype = DType::kBF16, .clip = true};
  Saved saved;
  std::mutex mu;
  // The saving run states its global batch for 3 ranks (DeepSpeed's train_batch_size): the
  // reshard to 2 ranks must not carry it over (its engine would refuse 3 != micro x accum x 2).
  Config saving = testing::make_config(s);
  saving.train_batch_size =
      3 * saving.train_micro_batch_size_per_gpu * saving.gradient_accumulation_steps;
  ThreadGroup::run(3, [&](Communicator& c) {
    Engine e(c, saving);
    const testing::Mlp mlp(testing::kDims);
    mlp.declare(e);
    mlp.init(e, 42);
    testing::train_steps(e, mlp, 0, 5, 1);
    ckpt::Saver(e, {.dir = root.string()}).save();
    Saved mine{testing::full_state(e), testing::read_params(e)};
    if (c.rank() == 0) {
      std::lock_guard<std::mutex> lock(mu);
      saved = std::move(mine);
    }
  });
  const testing::Mlp mlp(testing::kDims);
  const std::vector<UnitSpec> units = mlp.unit_specs();
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const std::string out =
        (root / ("model-" + std::string(to_string(dt)) + ".safetensors")).string();
    const std::size_t bytes = ckpt::consolidate(root.string(), out, dt);
    EXPECT_EQ(bytes, fs::file_size(out));
    const auto tensors = read_safetensors(out);
    ASSERT_EQ(tensors.size(), 6u);
    std::size_t i = 0;
    for (const UnitSpec& u : units) {
      for (const ParamSpec& p : u.params) {
        const std::string name = u.name + "." + p.name;
        ASSERT_TRUE(tensors.count(name)) << name;
        const Tensor& t = tensors.at(name);
        EXPECT_EQ(t.dtype, dt == DType::kF32 ? "F32" : "BF16") << name;
        EXPECT_EQ(t.shape, p.shape) << name;
        // f32: the masters; bf16: the working copy the run computes with (the master rounded).
        const std::vector<float>& want =
            dt == DType::kF32 ? saved.state.master[i] : saved.params[i];
        ASSERT_EQ(t.values.size(), want.size());
        EXPECT_TRUE(testing::same_bits(t.values.data(), want.data(), want.size())) << name;
        ++i;
      }
    }
  }
  // Resharded for 2 ranks: the same state loads there, and its files are those 2 ranks write.
  const std::string two = (root / "two").string();
  ckpt::reshard(root.string(), 2, two);
  const std::vector<std::string> lines = ckpt::inspect(two);
  EXPECT_NE(lines[1].find("saved by 2 ranks at stage 3"), std::string::npos) << lines[1];
  ThreadGroup::run(2, [&](Communicator& c) {
    RunSpec s2 = s;
    s2.ranks = 2;
    s2.stage = 1;
    Engine e(c, testing::make_config(s2));
    mlp.declare(e);
    const ckpt::LoadResult r = ckpt::load(e, two);
    EXPECT_EQ(r.saved_world_size, 2);
    EXPECT_TRUE(testing::bitwise_equal(testing::full_state(e), saved.state));
    EXPECT_TRUE(testing::bitwise_equal(testing::read_params(e), saved.params));
  });
}

}  // namespace
}  // namespace zero
