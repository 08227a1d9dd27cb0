// Full weights and checkpoints mid-training with zero::torch: the gathered state_dict, the
// torch::save-compatible export loaded into a fresh LibTorch model, training going on bitwise as
// if nothing was saved, the silent empty-storage torch::save made impossible, and a training
// checkpoint (with the trainer's data position) resumed bitwise.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "common/expect_error.hpp"
#include "common/temp_dir.hpp"
#include "torch_runs.hpp"

namespace zero::testing {
namespace {

namespace fs = std::filesystem;

using testing::TempDir;

// One rank's micro-step on its slice of batch `m`.
float train_step(zero::torch::Optimizer& opt, ct::Model& model, const TokenData& data, int m,
                 int rank, int ranks) {
  const int rows = kBatch / ranks;
  auto tok = data.tokens[static_cast<std::size_t>(m)].slice(0, rank * rows, (rank + 1) * rows);
  auto tgt = data.targets[static_cast<std::size_t>(m)].slice(0, rank * rows, (rank + 1) * rows);
  opt.zero_grad();
  auto loss = ct::loss(model, tok, tgt);
  loss.backward();
  opt.step();
  return loss.item<float>();
}

struct SavedRun {
  std::vector<::torch::Tensor> params;  // rank 0's after detach()
  std::vector<float> losses;
  std::map<std::string, ::torch::Tensor> full;  // full_state_dict() at the save point, rank 0
};

// `steps` steps at `stage`; after `save_at` steps (0: never) the full weights are taken (every
// rank: full_state_dict and for_each_full_parameter) and rank 0's model exported to `path`.
SavedRun run(int stage, int ranks, const std::string& dtype, int steps, int save_at,
             const std::string& path) {
  const ct::Dims d = test_dims();
  const TokenData data = make_data(steps, d);
  std::vector<ct::Model> models;
  for (int q = 0; q < ranks; ++q) models.push_back(make_model(d, 1 + q));
  TorchRun tr;
  tr.stage = stage;
  tr.dtype = dtype;
  const Config config = torch_config(tr);
  SavedRun out;
  std::mutex mu;
  ThreadGroup::run(ranks, [&](Communicator& comm) {
    const int q = comm.rank();
    ct::Model& model = models[static_cast<std::size_t>(q)];
    zero::torch::Optimizer opt(comm, *model, config);
    std::vector<float> losses;
    for (int s = 0; s < steps; ++s) {
      if (save_at > 0 && s == save_at) {
        auto full = opt.full_state_dict();
        std::size_t streamed = 0;
        opt.for_each_full_parameter(
            [&](const std::string& name, const ::torch::Tensor& v) {
              EXPECT_TRUE(::torch::equal(v, full[name])) << name;
              ++streamed;
            },
            /*rank0_only=*/true);
        EXPECT_EQ(streamed, q == 0 ? full.size() : 0u);
        opt.save_model(*model, path);
        if (q == 0) {
          std::lock_guard<std::mutex> lock(mu);
          for (const auto& item : full) out.full[item.key()] = item.value();
        }
      }
      losses.push_back(train_step(opt, model, data, s, q, ranks));
    }
    opt.detach();
    if (q == 0) {
      std::lock_guard<std::mutex> lock(mu);
      out.params = snapshot(*model);
      out.losses = losses;
    }
  });
  return out;
}

class TorchFullWeights
    : public ::testing::TestWithParam<std::tuple<int /*stage*/, int /*ranks*/, std::string>> {};

TEST_P(TorchFullWeights, ExportLoadsBitwiseAndTrainingGoesOnAsIfNotSaved) {
  const auto [stage, ranks, dtype] = GetParam();
  TempDir dir;
  const std::string path = dir.file("model.pt");
  const SavedRun saved = run(stage, ranks, dtype, 6, 3, path);
  const SavedRun plain = run(stage, ranks, dtype, 6, 0, path);
  EXPECT_TRUE(bitwise_equal(saved.params, plain.params));
  EXPECT_EQ(saved.losses, plain.losses);
  ASSERT_TRUE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  // Into a fresh model (other initial values), as a LibTorch user loads a torch::save file.
  ct::Model fresh = make_model(test_dims(), 99);
  ::torch::load(fresh, path);
  std::size_t compared = 0;
  for (const auto& p : fresh->named_parameters()) {
    const auto it = saved.full.find(p.key());
    ASSERT_NE(it, saved.full.end()) << p.key();
    // torch::load copies into the fresh model's f32 parameters: bf16 values widen exactly.
    EXPECT_TRUE(::torch::equal(p.value(), it->second.to(p.value().scalar_type()))) << p.key();
    ++compared;
  }
  EXPECT_EQ(compared, saved.full.size());
  // The export is of the model at step 3, not the initial one nor the final one.
  ct::Model initial = make_model(test_dims());
  EXPECT_FALSE(::torch::equal(initial->named_parameters()["head.weight"].to(::torch::kFloat),
                              saved.full.at("head.weight").to(::torch::kFloat)));
}

INSTANTIATE_TEST_SUITE_P(Stages, TorchFullWeights,
                         ::testing::Values(std::make_tuple(3, 2, "f32"),
                                           std::make_tuple(3, 3, "bf16"),
                                           std::make_tuple(2, 2, "f32"),
                                           std::make_tuple(0, 1, "f32")),
                         [](const auto& info) {
                           return "stage" + std::to_string(std::get<0>(info.param)) + "_N" +
                                  std::to_string(std::get<1>(info.param)) + "_" +
                                  std::get<2>(info.param);
                         });

// torch::save(model) of a stage-3 model would write the released parameters' storages: it throws
// instead, and the adapter's export is the way; at stage 0 both write the same values.
TEST(TorchFullWeights, RawTorchSaveOfAStage3ModelThrowsInsteadOfWritingEmptyStorages) {
  TempDir dir;
  for (int stage : {3, 0}) {
    const ct::Dims d = test_dims();
    ct::Model model = make_model(d);
    TorchRun tr;
    tr.stage = stage;
    ThreadGroup::run(1, [&](Communicator& comm) {
      zero::torch::Optimizer opt(comm, *model, torch_config(tr));
      const TokenData data = make_data(1, d);
      train_step(opt, model, data, 0, 0, 1);
      const std::string raw = dir.file("raw" + std::to_string(stage) + ".pt");
      if (stage == 3) {
        EXPECT_THROW(::torch::save(model, raw), c10::Error);
        EXPECT_THROW(::torch::save(model->parameters(), raw), c10::Error);
        EXPECT_THROW(::torch::save(model->named_parameters()["head.weight"], raw), c10::Error);
        EXPECT_EQ(zero::torch::tensor_bytes(opt.parameters()).params, 0u);
      } else {
        ::torch::save(model, raw);
        const std::string ours = dir.file("ours0.pt");
        opt.save_model(*model, ours);
        ct::Model a = make_model(d, 5), b = make_model(d, 6);
        ::torch::load(a, raw);
        ::torch::load(b, ours);
        EXPECT_TRUE(bitwise_equal(snapshot(*a), snapshot(*b)));
      }
    });
  }
}

TEST(TorchFullWeights, ExportToAnUnwritablePathNamesTheFile) {
  ct::Model model = make_model(test_dims());
  TorchRun tr;
  tr.stage = 3;
  ThreadGroup::run(1, [&](Communicator& comm) {
    zero::torch::Optimizer opt(comm, *model, torch_config(tr));
    expect_error([&] { opt.save_model(*model, "/nonexistent-dir/model.pt"); }, ErrorCode::kIO,
                 "/nonexistent-dir/model.pt");
  });
}

// A training checkpoint through the adapter, with the trainer's data position: saved after 3
// steps, resumed by fresh models and optimizers (after an evaluation forward, which gathers
// stage-3 units) that train the remaining steps from the saved position: bitwise the run that
// never stopped.
TEST(TorchCheckpoint, ResumeWithTheDataPositionIsBitwise) {
  for (int stage : {0, 2, 3}) {
    constexpr int kRanks = 2, kSteps = 6, kSaveAt = 3;
    TempDir dir;
    const ct::Dims d = test_dims();
    const TokenData data = make_data(kSteps, d);
    TorchRun tr;
    tr.stage = stage;
    const Config config = torch_config(tr);
    const SavedRun plain = run(stage, kRanks, "f32", kSteps, 0, "");
    std::vector<ct::Model> models;
    for (int q = 0; q < kRanks; ++q) models.push_back(make_model(d, 1 + q));
    ThreadGroup::run(kRanks, [&](Communicator& comm) {
      const int q = comm.rank();
      zero::torch::Optimizer opt(comm, *models[static_cast<std::size_t>(q)], config);
      ckpt::Saver saver(opt.engine(), {dir.path()});
      for (int s = 0; s < kSaveAt; ++s)
        train_step(opt, models[static_cast<std::size_t>(q)], data, s, q, kRanks);
      opt.save_checkpoint(saver, std::to_string(kSaveAt));  // the next batch to train on
    });
    std::vector<ct::Model> resumed;
    for (int q = 0; q < kRanks; ++q) resumed.push_back(make_model(d, 50 + q));
    std::vector<::torch::Tensor> params;
    std::vector<float> losses;
    ThreadGroup::run(kRanks, [&](Communicator& comm) {
      const int q = comm.rank();
      ct::Model& model = resumed[static_cast<std::size_t>(q)];
      zero::torch::Optimizer opt(comm, *model, config);
      {
        ::torch::NoGradGuard eval;
        ct::loss(model, data.tokens[0], data.targets[0]);
      }
      const ckpt::LoadResult r = opt.load_checkpoint(dir.path());
      int next = std::stoi(r.trainer_state);
      EXPECT_EQ(next, kSaveAt);
      std::vector<float> mine;
      for (int s = next; s < kSteps; ++s)
        mine.push_back(train_step(opt, model, data, s, q, kRanks));
      expect_error([&] { opt.load_checkpoint(dir.path()); }, ErrorCode::kInvalidArgument,
                   "before the first backward");
      opt.detach();
      if (q == 0) {
        params = snapshot(*model);
        losses = mine;
      }
    });
    EXPECT_TRUE(bitwise_equal(params, plain.params)) << "stage " << stage;
    EXPECT_EQ(losses, std::vector<float>(plain.losses.begin() + kSaveAt, plain.losses.end()))
        << "stage " << stage;
  }
}

}  // namespace
}  // namespace zero::testing
