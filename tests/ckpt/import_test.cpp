// Pretrained weights in: safetensors written by Hugging Face's `safetensors` package (Python,
// tests/ckpt/write_safetensors.py) and by zero-ckpt consolidate, imported into real in-process
// ranks at N = 1..4, stages 0-3, every working dtype: the parameters bitwise the file's values
// after the stated conversion, the masters the file's values, the optimizer state fresh, step 0.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <optional>

#include "ckpt/ckpt_runs.hpp"
#include "ckpt/import_files.hpp"
#include "common/expect_error.hpp"
#include "common/run_command.hpp"

namespace zero {
namespace {

namespace fs = std::filesystem;
using testing::Tensors;

// The interpreter with safetensors + numpy: $ZERO_PYTHON, else the venv tools/setup.sh makes.
std::string python() {
  if (const char* p = std::getenv("ZERO_PYTHON")) return p;
  const std::string venv = std::string(ZERO_SOURCE_DIR) + "/.cache/pyvenv/bin/python3";
  return fs::exists(venv) ? venv : "python3";
}

bool all_zero(const Tensors& t) {
  for (const auto& v : t) {
    for (float x : v) {
      if (f32_bits(x) != 0) return false;
    }
  }
  return true;
}

// Imports `src` into fresh engines (N ranks, stage, working dtype w) initialised to other
// values, and checks every rank's parameters, masters, state and counters.
void check_import(const std::string& src, const Tensors& file, int n, int stage, DType w,
                  const std::string& what) {
  const std::vector<UnitSpec> units = testing::import_model();
  const Config cfg = testing::import_config(stage, w);
  ThreadGroup::run(n, [&](Communicator& c) {
    Engine e(c, cfg);
    testing::add_units(e, units, 7.0f);
    const ckpt::ImportResult r = ckpt::import_safetensors(e, src);
    EXPECT_EQ(r.imported, 7u) << what;
    EXPECT_EQ(r.unused, 0u) << what;
    const Tensors params = testing::read_params(e);
    EXPECT_TRUE(testing::bitwise_equal(params, testing::rounded(file, w)))
        << what << " rank " << c.rank();
    const testing::FullState st = testing::full_state(e);
    EXPECT_TRUE(testing::bitwise_equal(st.master, file)) << what << ": masters, rank " << c.rank();
    for (const Tensors& s : st.states) EXPECT_TRUE(all_zero(s)) << what << ": state not fresh";
    EXPECT_EQ(e.training_state().steps, 0) << what;
  });
}

class ImportPython : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir("import-py");
    const std::string cmd = python() + " " + ZERO_SOURCE_DIR + "/tests/ckpt/write_safetensors.py " +
                            dir_->path() + " '" +
                            testing::model_spec_json(testing::import_model()) + "'";
    const testing::CmdResult r = testing::run_command(cmd);
    ok_ = r.status == 0;
    out_ = cmd + "\n" + r.out;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(ok_) << "writing the files with Python's safetensors failed (tools/setup.sh "
                        "installs it into .cache/pyvenv; or set ZERO_PYTHON):\n"
                     << out_;
  }
  static inline testing::TempDir* dir_ = nullptr;
  static inline bool ok_ = false;
  static inline std::string out_;
};

TEST_F(ImportPython, EveryFileDtypeWorkingDtypeStageAndWorldSizeBitwise) {
  const std::vector<UnitSpec> units = testing::import_model();
  const std::string d = dir_->path();
  // The sharded set mixes F32 / BF16 / F16 (tensor k: k % 3); it is opened by its directory
  // and by its index.
  const std::vector<std::pair<std::string, std::string>> sources = {
      {d + "/single-F32.safetensors", d + "/single-F32.safetensors"},
      {d + "/single-BF16.safetensors", d + "/single-BF16.safetensors"},
      {d + "/single-F16.safetensors", d + "/single-F16.safetensors"},
      {d + "/sharded", ""},
      {d + "/sharded/model.safetensors.index.json", ""}};
  std::map<std::string, std::vector<float>> both =
      testing::read_st_f32(d + "/sharded/model-00001-of-00002.safetensors");
  for (auto& [k, v] : testing::read_st_f32(d + "/sharded/model-00002-of-00002.safetensors")) {
    both[k] = v;
  }
  const Tensors sharded = testing::file_values(both, units);
  // The file's values reach every conversion: 1e5 overflows f16, 1e-40 is subnormal.
  for (const auto& [src, single] : sources) {
    const Tensors file =
        single.empty() ? sharded : testing::file_values(testing::read_st_f32(single), units);
    for (DType w : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (int n = 1; n <= 4; ++n) {
        for (int stage = 0; stage <= 3; ++stage) {
          check_import(src, file, n, stage, w,
                       src + " into " + std::string(to_string(w)) + ", N = " + std::to_string(n) +
                           ", stage " + std::to_string(stage));
        }
      }
    }
  }
}

TEST_F(ImportPython, RenamePrefixesAndFunctionAndUnusedTensors) {
  const std::vector<UnitSpec> units = testing::import_model();
  const std::string f32 = dir_->path() + "/single-F32.safetensors";
  const Tensors file = testing::file_values(testing::read_st_f32(f32), units);
  // The engine's model under other names: "enc.*" for "embed.*", "blk0.*" for "block0.*".
  std::vector<UnitSpec> renamed = units;
  renamed[0].name = "enc";
  renamed[1].name = "blk0";
  const Config cfg = testing::import_config(3, DType::kBF16);
  ThreadGroup::run(2, [&](Communicator& c) {
    Engine e(c, cfg);
    testing::add_units(e, renamed);
    ckpt::ImportOptions o;
    o.rename_prefixes = {{"enc.", "embed."}, {"blk0.", "block0."}};
    EXPECT_EQ(ckpt::import_safetensors(e, f32, o).imported, 7u);
    EXPECT_TRUE(
        testing::bitwise_equal(testing::read_params(e), testing::rounded(file, DType::kBF16)));
  });
  // A function: "head.weight" not imported (an empty name: it keeps its value), so the file's
  // head.weight is unused: an error naming it, unless allowed.
  ThreadGroup::run(3, [&](Communicator& c) {
    Engine e(c, cfg);
    testing::add_units(e, units);
    std::vector<float> keep(30, 0.5f);
    e.set_param(3, 0, keep.data(), keep.size());
    ckpt::ImportOptions o;
    o.rename = [](const std::string& name) { return name == "head.weight" ? "" : name; };
    testing::expect_error([&] { ckpt::import_safetensors(e, f32, o); }, ErrorCode::kConfig,
                          "tensor 'head.weight'");
    o.allow_unused = true;
    const ckpt::ImportResult r = ckpt::import_safetensors(e, f32, o);
    EXPECT_EQ(r.imported, 6u);
    EXPECT_EQ(r.unused, 1u);
    Tensors want = testing::rounded(file, DType::kBF16);
    want.back() = keep;
    EXPECT_TRUE(testing::bitwise_equal(testing::read_params(e), want));
  });
}

// consolidate -> import at another world size and stage: bitwise the trained run's masters
// (F32) or its working copy (BF16, the masters rounded), in every rank's engine.
TEST(ImportConsolidated, AtAnotherWorldSizeBitwise) {
  testing::TempDir root("import-consolidated");
  const testing::RunSpec s{.stage = 2, .ranks = 2, .dtype = DType::kBF16};
  const testing::RankRun saved = testing::train_and_save(s, 4, root.path());
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const std::string file = root.path() + "/model-" + std::string(to_string(dt)) + ".safetensors";
    ckpt::consolidate(root.path(), file, dt);
    const Tensors& want_master = dt == DType::kF32 ? saved.state.master : saved.params;
    for (const auto& [n, stage] : {std::pair{1, 0}, {3, 3}, {4, 1}}) {
      testing::RunSpec t = s;
      t.ranks = n;
      t.stage = stage;
      ThreadGroup::run(n, [&](Communicator& c) {
        testing::MlpEngine e(c, testing::make_config(t), std::nullopt);
        ckpt::import_safetensors(e, file);
        EXPECT_TRUE(testing::bitwise_equal(testing::full_state(e).master, want_master))
            << to_string(dt) << " N = " << n;
        EXPECT_TRUE(testing::bitwise_equal(testing::read_params(e), saved.params))
            << to_string(dt) << " N = " << n;
      });
    }
  }
  // zero-ckpt import's path: the F32 file as a step-0 checkpoint for 3 ranks of the saved
  // run's model and config, then loaded as a run would.
  const std::string f32 = root.path() + "/model-f32.safetensors";
  const std::string out = root.path() + "/imported";
#ifdef ZERO_CKPT_BIN
  const testing::CmdResult r =
      testing::run_command(std::string(ZERO_CKPT_BIN) + " import " + f32 + " --like " +
                           root.path() + " --out " + out + " --world-size 3");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("step-0"), std::string::npos) << r.out;
#else
  ckpt::import_checkpoint(f32, root.path(), 3, out);
#endif
  testing::RunSpec t = s;
  t.ranks = 3;
  ThreadGroup::run(3, [&](Communicator& c) {
    testing::MlpEngine e(c, testing::make_config(t), std::nullopt);
    const ckpt::LoadResult lr = ckpt::load(e, out);
    EXPECT_EQ(lr.steps, 0);
    EXPECT_EQ(lr.saved_world_size, 3);
    const testing::FullState st = testing::full_state(e);
    EXPECT_TRUE(testing::bitwise_equal(st.master, saved.state.master));
    for (const Tensors& k : st.states) EXPECT_TRUE(all_zero(k));
  });
}

}  // namespace
}  // namespace zero
