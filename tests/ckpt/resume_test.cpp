// Checkpoints in-process: save at step k, load into fresh engines, train to 2k — bitwise the
// uninterrupted run at the same world size (every stage, f32 / bf16 / fp16, optimizer offload
// cpu / nvme, parameter offload, synchronous and asynchronous saves); at another world size
// the loaded state is bitwise the saved one and the continued run within the tolerance of its
// other reduction order; saved at one partial-offload ratio (offload_optimizer.ratio) and
// resumed at another, bitwise. Plus keep-K, the `latest` pointer and the offline tools.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>

#include "ckpt/ckpt_runs.hpp"
#include "common/expect_error.hpp"

namespace zero {
namespace {

namespace fs = std::filesystem;
using testing::FullState;
using testing::RankRun;
using testing::Resumed;
using testing::RunSpec;
using testing::TempDir;

constexpr int kHalf = 6;

using testing::on_ranks;

struct Case {
  int stage;
  DType dtype;
  std::string offload;  // none | cpu | nvme (optimizer)
  std::string param;    // none | cpu | nvme (stage 3)
  bool async;
  int accumulation = 1;
  std::string moments = "f32";
};

std::string name_of(const Case& c) {
  return "stage" + std::to_string(c.stage) + "_" + std::string(to_string(c.dtype)) + "_opt_" +
         c.offload + "_param_" + c.param + (c.async ? "_async" : "_sync") + "_ga" +
         std::to_string(c.accumulation) + (c.moments != "f32" ? "_" + c.moments + "moments" : "");
}

class SameWorldSize : public ::testing::TestWithParam<Case> {};

TEST_P(SameWorldSize, ResumedRunIsBitwiseTheUninterruptedOne) {
  const Case& c = GetParam();
  TempDir dir(name_of(c));
  TempDir swap(name_of(c) + "-swap");
  RunSpec s{
      .stage = c.stage, .ranks = 3, .dtype = c.dtype, .accumulation = c.accumulation, .clip = true};
  if (c.offload != "none") {
    s.offload_buffers = 2;
    s.offload_chunk = 100;
    s.offload_device = c.offload;
    s.nvme_path = swap.path();
  }
  s.offload_param = c.param;
  s.moment_dtype = c.moments;
  if (c.param == "nvme") s.nvme_path = swap.path();
  const RankRun straight = on_ranks<RankRun>(
      3, [&](Communicator& comm) { return testing::run_straight(comm, s, 2 * kHalf); });
  const FullState saved = on_ranks<FullState>(3, [&](Communicator& comm) {
    return testing::run_and_save(comm, s, kHalf, dir.path(), c.async);
  });
  const Resumed resumed = on_ranks<Resumed>(
      3, [&](Communicator& comm) { return testing::run_resumed(comm, s, 2 * kHalf, dir.path()); });
  EXPECT_EQ(resumed.info.steps, kHalf);
  EXPECT_EQ(resumed.info.trainer_state, "data@k");
  EXPECT_TRUE(testing::bitwise_equal(resumed.loaded, saved)) << "the loaded state";
  EXPECT_TRUE(testing::bitwise_equal(resumed.run.params, straight.params)) << "parameters at 2k";
  EXPECT_TRUE(testing::bitwise_equal(resumed.run.state, straight.state)) << "state at 2k";
  // The loss curve goes on: the losses after the resume are those of the uninterrupted run.
  ASSERT_EQ(resumed.run.losses.size(), static_cast<std::size_t>(kHalf * c.accumulation));
  for (std::size_t i = 0; i < resumed.run.losses.size(); ++i) {
    EXPECT_EQ(resumed.run.losses[i], straight.losses[kHalf * c.accumulation + i]) << i;
  }
}

std::vector<Case> same_size_cases() {
  std::vector<Case> out;
  for (int stage : {0, 1, 2, 3}) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      // Optimizer offload needs stage >= 1 (the config refuses it at stage 0).
      for (const char* off : {"none", "cpu", "nvme"}) {
        if (stage > 0 || std::string(off) == "none") out.push_back({stage, dt, off, "none", false});
      }
      out.push_back({stage, dt, "none", "none", /*async=*/true});
      if (stage > 0) out.push_back({stage, dt, "nvme", "none", /*async=*/true});
    }
  }
  for (DType dt : {DType::kF32, DType::kBF16}) {
    out.push_back({3, dt, "cpu", "cpu", false});
    out.push_back({3, dt, "nvme", "nvme", false});
    out.push_back({3, dt, "nvme", "nvme", true});
  }
  // fp16: the loss scaler's state carries over; accumulation: saves at the boundary.
  out.push_back({2, DType::kF16, "none", "none", false});
  out.push_back({3, DType::kF16, "cpu", "none", true});
  out.push_back({1, DType::kBF16, "none", "none", false, 2});
  out.push_back({3, DType::kF32, "nvme", "none", false, 3});
  // int8 moments: the state is saved as is (by unit range); the resumed run is bitwise the
  // uninterrupted one, so every code and absmax came back.
  for (int stage : {0, 1, 2, 3}) {
    out.push_back({stage, DType::kBF16, "none", "none", false, 1, "int8"});
    if (stage > 0) out.push_back({stage, DType::kF32, "nvme", "none", stage == 2, 1, "int8"});
  }
  out.push_back({3, DType::kBF16, "cpu", "cpu", true, 2, "int8"});
  out.push_back({2, DType::kBF16, "none", "none", false, 1, "bf16"});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Ckpt, SameWorldSize, ::testing::ValuesIn(same_size_cases()),
                         [](const auto& info) { return name_of(info.param); });

// ---- another partial-offload ratio (offload_optimizer.ratio): the checkpoint goes through the
// shard optimizer's copies and loads, each unit from and to its tier, so a run saved with some
// units on the device, in pinned memory or NVMe resumes with them elsewhere, bitwise the
// uninterrupted run (which is itself bitwise the same at every ratio).

struct RatioMove {
  int stage;
  DType dtype;
  std::string from, to;  // optimizer offload device: none | cpu | nvme
  double from_ratio, to_ratio;
};

class OtherRatio : public ::testing::TestWithParam<RatioMove> {};

TEST_P(OtherRatio, ResumedRunIsBitwiseTheUninterruptedOne) {
  const RatioMove& c = GetParam();
  TempDir dir("ratio");
  TempDir swap("ratio-swap");
  // Six units of different sizes, so that the ratios cut at different units.
  auto spec = [&](const std::string& device, double ratio) {
    RunSpec s{.stage = c.stage, .ranks = 2, .dtype = c.dtype, .clip = true};
    s.dims = {5, 11, 22, 7, 16, 9, 4};
    if (device != "none") {
      s.offload_buffers = 2;
      s.offload_chunk = 50;
      s.offload_device = device;
      s.offload_ratio = ratio;
      s.nvme_path = swap.path();
    }
    return s;
  };
  const RunSpec a = spec(c.from, c.from_ratio), b = spec(c.to, c.to_ratio);
  const RankRun straight = on_ranks<RankRun>(
      2, [&](Communicator& comm) { return testing::run_straight(comm, b, 2 * kHalf); });
  const FullState saved = on_ranks<FullState>(2, [&](Communicator& comm) {
    return testing::run_and_save(comm, a, kHalf, dir.path(), false);
  });
  const Resumed resumed = on_ranks<Resumed>(
      2, [&](Communicator& comm) { return testing::run_resumed(comm, b, 2 * kHalf, dir.path()); });
  EXPECT_TRUE(testing::bitwise_equal(resumed.loaded, saved)) << "the loaded state";
  EXPECT_TRUE(testing::bitwise_equal(resumed.run.params, straight.params)) << "parameters at 2k";
  EXPECT_TRUE(testing::bitwise_equal(resumed.run.state, straight.state)) << "state at 2k";
  ASSERT_EQ(resumed.run.losses.size(), static_cast<std::size_t>(kHalf));
  for (std::size_t i = 0; i < resumed.run.losses.size(); ++i) {
    EXPECT_EQ(resumed.run.losses[i], straight.losses[kHalf + i]) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Ckpt, OtherRatio,
                         ::testing::Values(RatioMove{2, DType::kF32, "cpu", "cpu", 0.5, 0.25},
                                           RatioMove{2, DType::kBF16, "cpu", "cpu", 1.0, 0.0},
                                           RatioMove{3, DType::kBF16, "cpu", "cpu", 0.25, 1.0},
                                           RatioMove{1, DType::kBF16, "cpu", "nvme", 0.5, 0.5},
                                           RatioMove{3, DType::kF32, "nvme", "nvme", 0.25, 0.75},
                                           RatioMove{2, DType::kBF16, "nvme", "cpu", 0.5, 0.25},
                                           RatioMove{3, DType::kBF16, "none", "nvme", 1.0, 0.5},
                                           RatioMove{2, DType::kF32, "cpu", "none", 0.5, 1.0}),
                         [](const auto& info) {
                           const RatioMove& m = info.param;
                           auto pct = [](double r) {
                             return std::to_string(static_cast<int>(r * 100));
                           };
                           return "stage" + std::to_string(m.stage) + "_" +
                                  std::string(to_string(m.dtype)) + "_" + m.from +
                                  pct(m.from_ratio) + "_to_" + m.to + pct(m.to_ratio);
                         });

// ---- another world size (and stage)

struct Reshape {
  int from, to;
  int stage_from, stage_to;
};

class OtherWorldSize : public ::testing::TestWithParam<Reshape> {};

TEST_P(OtherWorldSize, LoadsTheSavedStateAndContinuesTheRun) {
  const Reshape& r = GetParam();
  for (DType dt : {DType::kF32, DType::kBF16}) {
    TempDir dir("reshape-" + std::to_string(r.from) + "-" + std::to_string(r.to));
    RunSpec a{.stage = r.stage_from, .ranks = r.from, .dtype = dt, .clip = true};
    RunSpec b = a;
    b.stage = r.stage_to;
    b.ranks = r.to;
    const RankRun straight = on_ranks<RankRun>(
        r.from, [&](Communicator& comm) { return testing::run_straight(comm, a, 2 * kHalf); });
    const FullState saved = on_ranks<FullState>(r.from, [&](Communicator& comm) {
      return testing::run_and_save(comm, a, kHalf, dir.path(), false);
    });
    const Resumed resumed = on_ranks<Resumed>(r.to, [&](Communicator& comm) {
      return testing::run_resumed(comm, b, 2 * kHalf, dir.path());
    });
    const std::string what = std::to_string(r.from) + " -> " + std::to_string(r.to) +
                             " ranks, stage " + std::to_string(r.stage_from) + " -> " +
                             std::to_string(r.stage_to) + ", " + std::string(to_string(dt));
    EXPECT_EQ(resumed.info.saved_world_size, r.from);
    EXPECT_TRUE(testing::bitwise_equal(resumed.loaded, saved)) << what;
    // Another world size averages the same global batch in another order: the gradients differ
    // in their last bits, and AdamW moves each master by at most lr (0.01) x that relative
    // change per step: f32, 2e-5 (as the MPI stage tests). bf16: a master that moved by one
    // f32 ulp can round its bf16 working copy the other way, a relative change of up to 2^-8 in
    // a weight the forward uses, so each of the kHalf steps may differ by lr x 2^-7: 4.7e-4.
    // For scale, the same difference between two uninterrupted runs at N and M is printed.
    const double d = testing::max_abs_diff(resumed.run.state.master, straight.state.master);
    const RankRun straight_m = on_ranks<RankRun>(
        r.to, [&](Communicator& comm) { return testing::run_straight(comm, b, 2 * kHalf); });
    const double d_ref = testing::max_abs_diff(straight_m.state.master, straight.state.master);
    std::printf(
        "%s: max |master diff| after %d more steps %.3g (uninterrupted at %d vs %d: %.3g)\n",
        what.c_str(), kHalf, d, r.to, r.from, d_ref);
    EXPECT_LE(d, dt == DType::kF32 ? 2e-5 : kHalf * 0.01 * std::ldexp(1.0, -7)) << what;
  }
}

// int8 moments at another world size: the blocks are the same at every N (each unit is padded to
// N x 256, so a shard starts on a block), so every block's absmax and codes load exactly where
// they were: the loaded moments are the saved ones, byte for byte, over the unit's elements
// (blocks past them are padding, zero in both), and the master too.
TEST_P(OtherWorldSize, Int8MomentsLoadByteForByte) {
  const Reshape& r = GetParam();
  TempDir dir("reshape8-" + std::to_string(r.from) + "-" + std::to_string(r.to));
  RunSpec a{.stage = r.stage_from, .ranks = r.from, .dtype = DType::kBF16, .clip = true};
  a.moment_dtype = "int8";
  RunSpec b = a;
  b.stage = r.stage_to;
  b.ranks = r.to;
  using testing::GlobalMoments;
  struct Saved {
    FullState state;
    GlobalMoments moments;
  };
  const Saved saved = on_ranks<Saved>(r.from, [&](Communicator& comm) {
    Engine e(comm, make_config(a));
    const testing::Mlp mlp(testing::kDims);
    mlp.declare(e);
    mlp.init(e, 42);
    testing::train_steps(e, mlp, 0, kHalf, 1);
    ckpt::Saver saver(e, {.dir = dir.path()});
    saver.save("x");
    return Saved{testing::full_state(e), testing::global_moments(e)};
  });
  const Saved loaded = on_ranks<Saved>(r.to, [&](Communicator& comm) {
    Engine e(comm, make_config(b));
    const testing::Mlp mlp(testing::kDims);
    mlp.declare(e);
    mlp.init(e, 7);
    ckpt::load(e, dir.path());
    Saved s{testing::full_state(e), testing::global_moments(e)};
    testing::train_steps(e, mlp, kHalf, kHalf + 2, 1);  // and it trains on
    return s;
  });
  const std::string what = std::to_string(r.from) + " -> " + std::to_string(r.to) + " ranks";
  EXPECT_TRUE(testing::bitwise_equal(loaded.state, saved.state)) << what << ": master";
  ASSERT_EQ(loaded.moments.size(), saved.moments.size());
  const testing::Mlp mlp(testing::kDims);
  const std::vector<UnitSpec> specs = mlp.unit_specs();
  for (std::size_t u = 0; u < saved.moments.size(); ++u) {
    std::size_t numel = 0;  // the unit's elements up to its last parameter's end (32-aligned)
    for (const ParamSpec& p : specs[u].params) numel = (numel + 31) / 32 * 32 + p.numel();
    const std::size_t used = state_bytes(MomentDType::kInt8, numel);
    for (std::size_t k = 0; k < 2; ++k) {
      const auto& want = saved.moments[u][k];
      const auto& got = loaded.moments[u][k];
      ASSERT_GE(want.size(), used);
      ASSERT_GE(got.size(), used);
      EXPECT_TRUE(std::equal(want.begin(), want.begin() + static_cast<long>(used), got.begin()))
          << what << ": unit " << u << " state " << k;
      EXPECT_TRUE(std::all_of(got.begin() + static_cast<long>(used), got.end(),
                              [](std::uint8_t x) { return x == 0; }))
          << what << ": padding blocks of unit " << u;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ckpt, OtherWorldSize,
                         ::testing::Values(Reshape{4, 2, 2, 2}, Reshape{2, 4, 3, 3},
                                           Reshape{3, 4, 1, 3}, Reshape{4, 3, 3, 2},
                                           Reshape{1, 4, 0, 2}, Reshape{4, 1, 2, 0}),
                         [](const auto& info) {
                           return "N" + std::to_string(info.param.from) + "_to_M" +
                                  std::to_string(info.param.to) + "_stage" +
                                  std::to_string(info.param.stage_from) + "_to_" +
                                  std::to_string(info.param.stage_to);
                         });

}  // namespace
}  // namespace zero
