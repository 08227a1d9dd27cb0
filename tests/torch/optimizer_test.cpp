// zero::torch::Optimizer against ::torch::optim::AdamW: the char transformer trained 20 steps on
// one rank with the whole batch by LibTorch's AdamW, and by zero at N = 1..4 ranks, stages 0-3,
// f32 and bf16; stage k against stage 0 bitwise (the engine's promise with in-process ranks).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <map>
#include <tuple>

#include "common/expect_error.hpp"
#include "torch_runs.hpp"

namespace zero::testing {
namespace {

// Runs are reused across tests (stage 0 is every stage's reference).
const ZeroResult& zero_run(const TorchRun& r, const TokenData& data) {
  static std::map<std::tuple<int, int, std::string, int, double, std::string, bool>, ZeroResult>
      cache;
  const auto key =
      std::make_tuple(r.stage, r.ranks, r.dtype, r.accumulation, r.clip, r.offload, r.marked);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, train_zero(r, data)).first;
  return it->second;
}

const TokenData& data_for(int accumulation) {
  static std::map<int, TokenData> cache;
  auto it = cache.find(accumulation);
  if (it == cache.end())
    it = cache.emplace(accumulation, make_data(20 * accumulation, test_dims())).first;
  return it->second;
}

const std::vector<::torch::Tensor>& reference(double clip, int accumulation) {
  static std::map<std::pair<double, int>, std::vector<::torch::Tensor>> cache;
  auto it = cache.find({clip, accumulation});
  if (it == cache.end()) {
    TorchRun r;
    r.clip = clip;
    r.accumulation = accumulation;
    it =
        cache
            .emplace(std::make_pair(clip, accumulation), train_reference(r, data_for(accumulation)))
            .first;
  }
  return it->second;
}

class TorchStages : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(TorchStages, F32MatchesAdamWAndStageZero) {
  const auto [ranks, stage] = GetParam();
  TorchRun r;
  r.ranks = ranks;
  r.stage = stage;
  const ZeroResult& z = zero_run(r, data_for(1));
  const double rel = max_rel_diff(z.params, reference(0, 1));
  std::printf("f32 N=%d stage %d: max rel diff to ::torch::optim::AdamW %.3g\n", ranks, stage, rel);
  EXPECT_LE(rel, 1e-5);
  TorchRun r0 = r;
  r0.stage = 0;
  EXPECT_TRUE(bitwise_equal(z.params, zero_run(r0, data_for(1)).params)) << "stage " << stage;
  EXPECT_EQ(z.losses, zero_run(r0, data_for(1)).losses);
}

// bf16: the model computes in bf16 (the engine's working copy), the master stays f32. The
// reference is the same algorithm written by hand in LibTorch (train_reference_bf16). Two correct
// bf16 runs differ where the bf16 copy of a weight rounds the other way after a last-bit
// difference of the master: one bf16 ulp, 2^-7 = 2.6 lr for the LayerNorm gains near 1, and
// from there the gradients differ at bf16 resolution. Measured (N = 1..4): max |d| 5.2 lr,
// mean |d| 0.11-0.12 lr; the by-hand run is itself that far from
// f32 AdamW (max 2.6 lr, mean 0.13 lr, printed). Bounds:
// max 8 lr, mean 0.25 lr. Every stage is bitwise stage 0.
TEST_P(TorchStages, Bf16NearAdamWAndBitwiseStageZero) {
  const auto [ranks, stage] = GetParam();
  TorchRun r;
  r.ranks = ranks;
  r.stage = stage;
  r.dtype = "bf16";
  const ZeroResult& z = zero_run(r, data_for(1));
  static const std::vector<::torch::Tensor> by_hand = train_reference_bf16(r, data_for(1));
  const double rel = max_rel_diff(z.params, by_hand);
  const double rel32 = max_rel_diff(z.params, reference(0, 1));
  const auto [worst, mean] = abs_diff(z.params, by_hand);
  const auto [worst32, mean32] = abs_diff(z.params, reference(0, 1));
  std::printf(
      "bf16 N=%d stage %d: to bf16-by-hand AdamW max rel %.3g, max |d| %.2f lr, mean |d| %.3f lr;"
      " to f32 AdamW max rel %.3g, max |d| %.2f lr, mean |d| %.3f lr\n",
      ranks, stage, rel, worst / kLr, mean / kLr, rel32, worst32 / kLr, mean32 / kLr);
  const auto [hand_worst, hand_mean] = abs_diff(by_hand, reference(0, 1));
  std::printf("  (bf16-by-hand against f32 AdamW: max |d| %.2f lr, mean |d| %.3f lr)\n",
              hand_worst / kLr, hand_mean / kLr);
  EXPECT_LE(worst, 8 * kLr);
  EXPECT_LE(mean, 0.25 * kLr);
  TorchRun r0 = r;
  r0.stage = 0;
  EXPECT_TRUE(bitwise_equal(z.params, zero_run(r0, data_for(1)).params)) << "stage " << stage;
}

INSTANTIATE_TEST_SUITE_P(Ranks, TorchStages,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(0, 1, 2, 3)),
                         [](const auto& info) {
                           return "N" + std::to_string(std::get<0>(info.param)) + "_stage" +
                                  std::to_string(std::get<1>(info.param));
                         });

// fully_shard style units (each block and the head a unit, the embeddings and ln_f the root).
TEST(TorchUnits, MarkedSubmodulesStage3BitwiseStage0) {
  TorchRun r;
  r.ranks = 3;
  r.stage = 3;
  r.marked = true;
  const ZeroResult& z = zero_run(r, data_for(1));
  TorchRun r0 = r;
  r0.stage = 0;
  r0.marked = false;
  EXPECT_TRUE(bitwise_equal(z.params, zero_run(r0, data_for(1)).params));
  EXPECT_LE(max_rel_diff(z.params, reference(0, 1)), 1e-5);
}

TEST(TorchEngineFeatures, AccumulationMatchesAdamWOnTheWholeWindow) {
  for (int stage : {0, 1, 2, 3}) {
    TorchRun r;
    r.ranks = 2;
    r.stage = stage;
    r.accumulation = 2;
    const ZeroResult& z = zero_run(r, data_for(2));
    const double rel = max_rel_diff(z.params, reference(0, 2));
    std::printf("accumulation 2, N=2 stage %d: max rel diff %.3g\n", stage, rel);
    EXPECT_LE(rel, 1e-5) << "stage " << stage;
  }
}

TEST(TorchEngineFeatures, ClippingMatchesClipGradNorm) {
  for (int stage : {0, 2, 3}) {
    TorchRun r;
    r.ranks = 2;
    r.stage = stage;
    r.clip = 0.05;  // below the gradient norm of every step here: clipping acts each step
    const ZeroResult& z = zero_run(r, data_for(1));
    const double rel = max_rel_diff(z.params, reference(0.05, 1));
    std::printf("clip 0.05, N=2 stage %d: max rel diff %.3g\n", stage, rel);
    EXPECT_LE(rel, 1e-5) << "stage " << stage;
    EXPECT_GT(max_rel_diff(z.params, reference(0, 1)), 1e-3) << "clipping changed nothing";
  }
}

// The swap's clip_grad_norm_ (called between backward and step, as torch's) against
// torch::nn::utils::clip_grad_norm_ with AdamW, and bitwise the config's gradient_clipping.
TEST(TorchEngineFeatures, ClipGradNormCallMatchesClipGradNorm) {
  for (int stage : {0, 3}) {
    TorchRun r;
    r.ranks = 2;
    r.stage = stage;
    r.clip = 0.05;
    r.clip_by_call = true;
    const ZeroResult z = train_zero(r, data_for(1));
    const double rel = max_rel_diff(z.params, reference(0.05, 1));
    std::printf("clip_grad_norm_(0.05), N=2 stage %d: max rel diff %.3g\n", stage, rel);
    EXPECT_LE(rel, 1e-5) << "stage " << stage;
    TorchRun by_config = r;
    by_config.clip_by_call = false;
    EXPECT_TRUE(bitwise_equal(z.params, zero_run(by_config, data_for(1)).params));
  }
}

TEST(TorchEngineFeatures, OptimizerOffloadBitwiseStage0) {
  for (int stage : {1, 2, 3}) {
    TorchRun r;
    r.ranks = 2;
    r.stage = stage;
    r.offload = "cpu";
    const ZeroResult& z = zero_run(r, data_for(1));
    TorchRun r0 = r;
    r0.stage = 0;
    r0.offload = "none";
    EXPECT_TRUE(bitwise_equal(z.params, zero_run(r0, data_for(1)).params)) << "stage " << stage;
  }
}

}  // namespace
}  // namespace zero::testing
