// What a checkpoint refuses: one flipped byte, a truncated or a deleted file in any file of the
// checkpoint is an error naming that file, and the engine it was to load into is untouched; a
// manifest of another model names the first parameter that differs; another optimizer names
// both. And what it keeps: the newest K, `latest` last.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>

#include "ckpt/ckpt_runs.hpp"
#include "common/expect_error.hpp"

namespace zero {
namespace {

namespace fs = std::filesystem;
using testing::FullState;
using testing::RunSpec;
using testing::TempDir;

const RunSpec kSpec{.stage = 2, .ranks = 2, .dtype = DType::kBF16, .clip = true};

// A committed checkpoint of the 2-rank stage-2 run at step 4 under `root`; returns its dir.
std::string make_checkpoint(const std::string& root) {
  ThreadGroup::run(2, [&](Communicator& c) { testing::run_and_save(c, kSpec, 4, root, false); });
  return ckpt::resolve(root);
}

// Loads `root` into fresh 2-rank engines; every rank must fail with `code` naming `needle`, and
// its engine's parameters and state must be what they were before the attempt.
void expect_load_fails(const std::string& root, ErrorCode code, const std::string& needle,
                       const std::string& what) {
  ThreadGroup::run(2, [&](Communicator& c) {
    Engine e(c, testing::make_config(kSpec));
    const testing::Mlp mlp(testing::kDims);
    mlp.declare(e);
    mlp.init(e, 7);
    const testing::Tensors params = testing::read_params(e);
    const FullState state = testing::full_state(e);
    testing::expect_error([&] { ckpt::load(e, root); }, code, needle);
    EXPECT_TRUE(testing::bitwise_equal(testing::read_params(e), params)) << what;
    EXPECT_TRUE(testing::bitwise_equal(testing::full_state(e), state)) << what;
    EXPECT_EQ(e.training_state().steps, 0) << what;
  });
}

std::vector<std::string> files_of(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(CkptIntegrity, EveryFlippedByteTruncationAndDeletionIsAnErrorNamingTheFile) {
  TempDir root("damage");
  const std::string dir = make_checkpoint(root.path());
  const std::vector<std::string> files = files_of(dir);
  // manifest.json, manifest.json.xxh3, rank-00000.bin, rank-00001.bin, trainer.bin
  ASSERT_EQ(files.size(), 5u);
  std::mt19937_64 rng(5);
  int cases = 0;
  for (const std::string& f : files) {
    const std::string path = dir + "/" + f;
    const std::string backup = root.path() + "/backup";
    fs::copy_file(path, backup, fs::copy_options::overwrite_existing);
    const auto size = static_cast<std::size_t>(fs::file_size(path));
    // Three flipped bytes at random offsets (one at a time), a truncation, a deletion.
    for (int flip = 0; flip < 3; ++flip) {
      const std::size_t at = std::uniform_int_distribution<std::size_t>(0, size - 1)(rng);
      {
        std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
        io.seekg(static_cast<std::streamoff>(at));
        char c = 0;
        io.read(&c, 1);
        c = static_cast<char>(c ^ (1 << (at % 8)));
        io.seekp(static_cast<std::streamoff>(at));
        io.write(&c, 1);
      }
      expect_load_fails(root.path(), ErrorCode::kCorruption, f,
                        f + ": byte " + std::to_string(at) + " flipped");
      fs::copy_file(backup, path, fs::copy_options::overwrite_existing);
      ++cases;
    }
    fs::resize_file(path, size - 1);
    expect_load_fails(root.path(), ErrorCode::kCorruption, f, f + " truncated");
    fs::copy_file(backup, path, fs::copy_options::overwrite_existing);
    fs::remove(path);
    expect_load_fails(root.path(), ErrorCode::kIO, f, f + " deleted");
    fs::copy_file(backup, path, fs::copy_options::overwrite_existing);
    cases += 2;
  }
  std::printf("%d damaged checkpoints, each refused naming the file\n", cases);
  // Restored: it loads.
  ThreadGroup::run(2, [&](Communicator& c) { testing::run_resumed(c, kSpec, 6, root.path()); });
}

TEST(CkptIntegrity, ADamagedLatestPointerNamesIt) {
  TempDir root("latest");
  make_checkpoint(root.path());
  std::ofstream(root.path() + "/latest") << "step-999\n";
  expect_load_fails(root.path(), ErrorCode::kIO, "latest", "latest names a missing checkpoint");
  fs::remove(root.path() + "/latest");
  expect_load_fails(root.path(), ErrorCode::kIO, root.path(), "no latest");
}

TEST(CkptIntegrity, AnotherModelNamesTheFirstDifferingParameter) {
  TempDir root("model");
  make_checkpoint(root.path());
  ThreadGroup::run(2, [&](Communicator& c) {
    Engine e(c, testing::make_config(kSpec));
    const testing::Mlp other({5, 11, 23, 7});  // layer1.W is 23 x 11, layer1.b 23
    other.declare(e);
    testing::expect_error([&] { ckpt::load(e, root.path()); }, ErrorCode::kConfig,
                          "'layer1.W' [22, 11], the engine 'layer1.W' [23, 11]");
  });
  ThreadGroup::run(2, [&](Communicator& c) {
    Engine e(c, testing::make_config(kSpec));
    const testing::Mlp fewer({5, 11, 22});
    fewer.declare(e);
    testing::expect_error([&] { ckpt::load(e, root.path()); }, ErrorCode::kConfig,
                          "the checkpoint has 3 units, the engine 2 (first unmatched: 'layer2')");
  });
}

TEST(CkptIntegrity, AnotherOptimizerIsAnErrorNamingBoth) {
  TempDir root("optimizer");
  make_checkpoint(root.path());
  ThreadGroup::run(2, [&](Communicator& c) {
    Config cfg = testing::make_config(kSpec);
    cfg.optimizer.type = "Lion";
    Engine e(c, cfg);
    const testing::Mlp mlp(testing::kDims);
    mlp.declare(e);
    testing::expect_error([&] { ckpt::load(e, root.path()); }, ErrorCode::kConfig,
                          "the checkpoint's optimizer is AdamW, the engine's Lion");
  });
}

TEST(CkptIntegrity, LoadIntoAnEngineThatHasTrainedIsRefused) {
  TempDir root("trained");
  make_checkpoint(root.path());
  ThreadGroup::run(2, [&](Communicator& c) {
    Engine e(c, testing::make_config(kSpec));
    const testing::Mlp mlp(testing::kDims);
    mlp.declare(e);
    mlp.init(e, 1);
    testing::train_steps(e, mlp, 0, 1, 1);
    testing::expect_error([&] { ckpt::load(e, root.path()); }, ErrorCode::kInvalidArgument,
                          "load a checkpoint into a fresh engine");
  });
}

TEST(CkptIntegrity, SaveInsideAnAccumulationWindowIsRefused) {
  TempDir root("window");
  RunSpec s = kSpec;
  s.accumulation = 2;
  ThreadGroup::run(2, [&](Communicator& c) {
    Engine e(c, testing::make_config(s));
    const testing::Mlp mlp(testing::kDims);
    mlp.declare(e);
    mlp.init(e, 1);
    mlp.micro_step(e, testing::global_slice(mlp, 0, 0, c.rank(), c.size()));
    e.step();
    ckpt::Saver saver(e, {.dir = root.path()});
    testing::expect_error([&] { saver.save(); }, ErrorCode::kInvalidArgument,
                          "1 micro-step(s) into an accumulation window");
  });
}

TEST(CkptIntegrity, KeepsTheNewestKAndLatestNamesTheNewest) {
  TempDir root("keep");
  ThreadGroup::run(2, [&](Communicator& c) {
    Engine e(c, testing::make_config(kSpec));
    const testing::Mlp mlp(testing::kDims);
    mlp.declare(e);
    mlp.init(e, 1);
    ckpt::Saver saver(e, {.dir = root.path(), .keep = 2, .async = true});
    for (int s = 0; s < 5; ++s) {
      testing::train_steps(e, mlp, s, s + 1, 1);
      saver.save("at " + std::to_string(s + 1));
    }
    saver.wait();
  });
  EXPECT_EQ(files_of(root.path()), (std::vector<std::string>{"latest", "step-4", "step-5"}));
  EXPECT_EQ(ckpt::resolve(root.path()), root.path() + "/step-5");
  const std::vector<std::string> lines = ckpt::inspect(root.path());
  EXPECT_NE(lines.back().find("every checksum verified"), std::string::npos);
}

}  // namespace
}  // namespace zero
