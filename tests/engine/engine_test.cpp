// The ZeRO engine against stage 0: every stage trains the same trajectory (bitwise with the
// in-process communicator), stage 0 matches single-rank training on the concatenated batch,
// fp16 overflow skips on every rank, tracked bytes equal what the layout implies, communication
// volume equals the theory, and misuse is a clear error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "common/bitwise.hpp"
#include "common/expect_error.hpp"
#include "common/mlp_model.hpp"
#include "common/mlp_training.hpp"
#include "zero/comm/comm.hpp"
#include "zero/config/config.hpp"
#include "zero/core/error.hpp"
#include "zero/engine/engine.hpp"
#include "zero/engine/plan.hpp"
#include "zero/optim/lr_schedule.hpp"

namespace zero {
namespace {

using testing::Batch;
using testing::bitwise_equal;
using testing::describe;
using testing::kDims;
using testing::kRows;
using testing::make_config;
using testing::max_abs_diff;
using testing::Mlp;
using testing::RunResult;
using testing::RunSpec;
using testing::train;

// ---- parity with stage 0

TEST(EngineParity, EveryStageMatchesStageZeroBitwiseWithoutAccumulation) {
  int runs = 0;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int n : {1, 2, 3, 4}) {
      for (bool clip : {false, true}) {
        RunSpec base{.stage = 0, .ranks = n, .dtype = dt, .accumulation = 1, .clip = clip};
        const RunResult ref = train(base);
        ASSERT_EQ(ref.steps.size(), 20u);
        if (dt != DType::kF16) {
          for (const auto& r : ref.steps) ASSERT_TRUE(r.applied);
        }
        if (clip) {
          bool clipped = false;
          for (const auto& r : ref.steps) clipped = clipped || r.clip_coef < 1.0;
          EXPECT_TRUE(clipped) << "clipping never engaged: the test would not test it";
        }
        for (int stage : {1, 2, 3}) {
          for (bool overlap : {false, true}) {
            RunSpec s = base;
            s.stage = stage;
            s.overlap = overlap;
            const RunResult got = train(s);
            ++runs;
            EXPECT_TRUE(bitwise_equal(got.params, ref.params))
                << describe(s) << ": max |diff| " << max_abs_diff(got.params, ref.params);
            EXPECT_TRUE(bitwise_equal(got.masters, ref.masters)) << describe(s) << " (masters)";
            for (std::size_t i = 0; i < ref.steps.size(); ++i) {
              EXPECT_EQ(got.steps[i].grad_norm, ref.steps[i].grad_norm)
                  << describe(s) << " step " << i;
              EXPECT_EQ(got.steps[i].applied, ref.steps[i].applied) << describe(s) << " step " << i;
              EXPECT_EQ(got.steps[i].loss_scale, ref.steps[i].loss_scale) << describe(s);
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(runs, 3 * 4 * 2 * 6);
}

// With accumulation, stages 0-1 accumulate locally and reduce once at the boundary, stages 2-3
// reduce every micro-step: (sum over ranks of sum over micro-steps) against (sum over micro-steps
// of sum over ranks). Floating-point addition is not associative, so 2-3 match 0-1 within
// rounding, and bitwise within each pair.
TEST(EngineParity, AccumulationIsBitwiseWithinStages01And23AndCloseAcross) {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int n : {1, 2, 3, 4}) {
      for (bool clip : {false, true}) {
        RunSpec s0{.stage = 0, .ranks = n, .dtype = dt, .accumulation = 3, .clip = clip};
        const RunResult r0 = train(s0);
        RunSpec s1 = s0, s2 = s0, s3 = s0;
        s1.stage = 1;
        s2.stage = 2;
        s3.stage = 3;
        s3.overlap = true;
        const RunResult r1 = train(s1), r2 = train(s2), r3 = train(s3);
        EXPECT_TRUE(bitwise_equal(r1.params, r0.params)) << describe(s1);
        EXPECT_TRUE(bitwise_equal(r1.masters, r0.masters)) << describe(s1);
        EXPECT_TRUE(bitwise_equal(r3.params, r2.params)) << describe(s3) << " vs stage 2";
        EXPECT_TRUE(bitwise_equal(r3.masters, r2.masters)) << describe(s3) << " vs stage 2";
        // Across the pairs: masters within a few f32 ulps of the trajectory (lr 0.01, 20 steps).
        const double tol = 2e-5;
        EXPECT_LE(max_abs_diff(r2.masters, r0.masters), tol) << describe(s2);
        if (n == 1) {
          EXPECT_TRUE(bitwise_equal(r2.masters, r0.masters)) << "one rank: no reduction order";
        }
      }
    }
  }
}

TEST(EngineParity, StageZeroAtNRanksMatchesOneRankOnTheConcatenatedBatch) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (int n : {2, 3, 4}) {
      RunSpec dp{.stage = 0, .ranks = n, .dtype = dt};
      RunSpec single{.stage = 0, .ranks = 1, .dtype = dt, .data_ranks = n};
      const RunResult a = train(dp), b = train(single);
      // Same gradients up to summation order (mean over N x rows against the mean over ranks of
      // per-rank means). f32: the masters agree to 1e-6 after 20 Adam steps (seen: <= 8e-8).
      // bf16: each rank's gradient is rounded to bf16 before the reduction, the single rank's
      // once after: up to 2^-8 relative per gradient, which Adam turns into up to lr x 2^-8 per
      // step; bound: 20 steps x 0.01 x 2^-8 = 7.8e-4 (seen: <= 3.9e-4).
      const double tol = dt == DType::kF32 ? 1e-6 : 20 * 0.01 / 256;
      const double d = max_abs_diff(a.master_params, b.master_params);
      EXPECT_LE(d, tol) << describe(dp);
      std::printf("%s vs one rank on the concatenated batch: max |master diff| %.3g\n",
                  describe(dp).c_str(), d);
      // The model learns: the mean loss of the last 5 steps is well below that of the first 5.
      double first = 0, last = 0;
      for (int i = 0; i < 5; ++i) {
        first += a.losses[static_cast<std::size_t>(i)];
        last += a.losses[a.losses.size() - 1 - static_cast<std::size_t>(i)];
      }
      EXPECT_LT(last, 0.7 * first) << "the model does not train";
    }
  }
}

TEST(EngineParity, PersistentUnitsInStageThreeStillMatch) {
  RunSpec base{.stage = 0, .ranks = 3, .dtype = DType::kBF16, .clip = true};
  const RunResult ref = train(base);
  RunSpec s = base;
  s.stage = 3;
  s.persistence = 200;  // layers 0 (75 elements with padding inside) and 2 (161) stay whole
  s.overlap = true;
  const RunResult got = train(s);
  EXPECT_TRUE(bitwise_equal(got.params, ref.params));
  EXPECT_TRUE(bitwise_equal(got.masters, ref.masters));
}

// ---- fp16 overflow

TEST(EngineFp16, OverflowOnOneRankSkipsTheStepOnEveryRankAndHalvesTheScale) {
  for (int stage : {0, 1, 2, 3}) {
    const Config cfg = make_config({.stage = stage, .ranks = 3, .dtype = DType::kF16});
    const Mlp mlp(kDims);
    ThreadGroup::run(3, [&](Communicator& comm) {
      Engine e(comm, cfg);
      mlp.declare(e);
      mlp.init(e, 7);
      for (int step = 0; step < 3; ++step) {
        mlp.micro_step(e, testing::make_batch(mlp.in(), mlp.out(), kRows, step, 0, comm.rank()));
        ASSERT_TRUE(e.step().applied);
      }
      const double scale = e.loss_scale();
      std::vector<std::vector<float>> before;
      for (UnitId u = 0; u < e.num_units(); ++u) {
        before.emplace_back(
            e.master_shard(u),
            e.master_shard(u) + (stage == 0 ? e.unit_padded_numel(u) : e.unit_shard_numel(u)));
      }
      // Only rank 1 overflows.
      mlp.micro_step(e, testing::make_batch(mlp.in(), mlp.out(), kRows, 3, 0, comm.rank()),
                     /*inject_overflow=*/comm.rank() == 1);
      const StepResult r = e.step();
      EXPECT_TRUE(r.boundary);
      EXPECT_FALSE(r.applied) << "stage " << stage << " rank " << comm.rank();
      EXPECT_EQ(r.loss_scale, scale / 2) << "stage " << stage;
      EXPECT_EQ(r.skipped, 1);
      EXPECT_EQ(r.steps, 3);
      for (UnitId u = 0; u < e.num_units(); ++u) {
        const float* m = e.master_shard(u);
        for (std::size_t k = 0; k < before[static_cast<std::size_t>(u)].size(); ++k) {
          ASSERT_EQ(m[k], before[static_cast<std::size_t>(u)][k])
              << "master changed by a skipped step";
          ASSERT_TRUE(std::isfinite(m[k]));
        }
      }
      // Training goes on.
      mlp.micro_step(e, testing::make_batch(mlp.in(), mlp.out(), kRows, 4, 0, comm.rank()));
      EXPECT_TRUE(e.step().applied);
    });
  }
}

// bf16 and int8 (block-wise 8-bit) moments: the same parity. int8 blocks (256 elements) never
// straddle two ranks' shards (each unit is padded to N x 256), so sharding changes no block:
// every stage steps the same blocks with the same bits. The moments took effect: the masters
// differ from f32 moments' and the loss still falls.
TEST(EngineParity, Bf16AndInt8MomentsMatchStageZeroBitwiseWithAccumulationAndClipping) {
  int runs = 0;
  for (const std::string moments : {"bf16", "int8"}) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      for (int n : {1, 2, 3, 4}) {
        for (bool clip : {false, true}) {
          for (int acc : {1, 3}) {
            RunSpec s0{.stage = 0, .ranks = n, .dtype = dt, .accumulation = acc, .clip = clip};
            s0.moment_dtype = moments;
            const RunResult r0 = train(s0);
            RunSpec f32 = s0;
            f32.moment_dtype = "f32";
            EXPECT_GT(max_abs_diff(r0.masters, train(f32).masters), 0.0)
                << describe(s0) << ": the moment dtype changed nothing";
            EXPECT_LT(r0.losses.back(), r0.losses.front()) << describe(s0);
            std::vector<RunResult> by_stage = {r0};
            for (int stage : {1, 2, 3}) {
              RunSpec s = s0;
              s.stage = stage;
              s.overlap = stage == 3;
              by_stage.push_back(train(s));
              ++runs;
            }
            // Without accumulation every stage is stage 0's bits; with it, 1 is 0's and 3 is 2's
            // (stages 2-3 reduce every micro-step: the sums associate differently).
            for (int stage : {1, 2, 3}) {
              const int ref = acc == 1 || stage == 1 ? 0 : 2;
              RunSpec s = s0;
              s.stage = stage;
              const RunResult& got = by_stage[static_cast<std::size_t>(stage)];
              const RunResult& want = by_stage[static_cast<std::size_t>(ref)];
              EXPECT_TRUE(bitwise_equal(got.params, want.params))
                  << describe(s) << " vs stage " << ref << ": max |diff| "
                  << max_abs_diff(got.params, want.params);
              EXPECT_TRUE(bitwise_equal(got.masters, want.masters)) << describe(s) << " (masters)";
              for (std::size_t i = 0; i < want.steps.size(); ++i) {
                EXPECT_EQ(got.steps[i].grad_norm, want.steps[i].grad_norm) << describe(s);
              }
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(runs, 2 * 2 * 4 * 2 * 2 * 3);
}

// ---- memory: what the tracker holds is what the layout implies

std::size_t round_up(std::size_t x, std::size_t m) { return (x + m - 1) / m * m; }

TEST(EngineMemory, TrackedBytesByCategoryEqualTheLayoutExactly) {
  // Independent of the engine's layout code: each parameter starts on a multiple of 32
  // elements, each unit is padded to a multiple of 32 N.
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (int n : {2, 3}) {
      for (int stage : {0, 1, 2, 3}) {
        std::size_t padded = 0, shard = 0, max_padded = 0;
        for (std::size_t l = 0; l + 1 < kDims.size(); ++l) {
          const std::size_t w = static_cast<std::size_t>(kDims[l + 1] * kDims[l]);
          const std::size_t numel = round_up(w, 32) + static_cast<std::size_t>(kDims[l + 1]);
          const std::size_t p = round_up(numel, 32 * static_cast<std::size_t>(n));
          padded += p;
          shard += p / static_cast<std::size_t>(n);
          max_padded = std::max(max_padded, p);
        }
        const std::size_t W = dtype_size(dt), R = 4;
        const std::size_t opt = stage == 0 ? padded : shard;
        std::size_t params16 = (stage == 3 ? shard : padded) * W;
        std::size_t grads = (stage >= 2 ? shard : padded) * R;
        std::size_t comm_buffers = 0;
        // In flight, with overlap_comm off: one gradient buffer; with 16-bit gradients in stages
        // 2-3, one fp32 staging buffer for the reduce-scatter; stage 3: gathered units (the
        // trainer holds one at a time and one is prefetched; released buffers are pooled).
        grads += max_padded * W;
        if (stage >= 2 && dt != DType::kF32) comm_buffers += max_padded * R;
        if (stage == 3) params16 += 2 * max_padded * W;  // the unit in use + the one prefetched
        const std::size_t master = dt == DType::kF32 ? 0 : opt * 4;
        const std::size_t state = 2 * opt * 4;

        Config cfg = make_config({.stage = stage, .ranks = n, .dtype = dt});
        cfg.zero_optimization.stage3_prefetch_bucket_size = 1;  // prefetch one unit ahead
        const Mlp mlp(kDims);
        ThreadGroup::run(n, [&](Communicator& comm) {
          Engine e(comm, cfg);
          mlp.declare(e);
          mlp.init(e, 1);
          for (int step = 0; step < 2; ++step) {
            mlp.micro_step(e,
                           testing::make_batch(mlp.in(), mlp.out(), kRows, step, 0, comm.rank()));
            e.step();
          }
          const std::string what = "stage " + std::to_string(stage) + " N=" + std::to_string(n) +
                                   " " + std::string(to_string(dt)) + " rank " +
                                   std::to_string(comm.rank());
          const MemoryTracker& t = e.tracker();
          EXPECT_EQ(t.current(MemCategory::kParams16, MemTier::kHost), params16) << what;
          EXPECT_EQ(t.current(MemCategory::kMasterParams, MemTier::kHost), master) << what;
          EXPECT_EQ(t.current(MemCategory::kOptimizerState, MemTier::kHost), state) << what;
          EXPECT_EQ(t.current(MemCategory::kGradients, MemTier::kHost), grads) << what;
          EXPECT_EQ(t.current(MemCategory::kCommBuffers, MemTier::kHost), comm_buffers) << what;
          EXPECT_EQ(t.current(MemTier::kDevice) + t.current(MemTier::kPinned), 0u) << what;
        });
      }
    }
  }
}

// The optimizer state of each moment dtype, from the tracker, against the formula written here
// from the layout rule (units padded to N x 32, or N x 256 with int8 moments, whose 256-element
// blocks each carry a 4-byte absmax): master 4 B per stepped element (16-bit training), moments
// 2 x 4 (f32), 2 x 2 (bf16) or 2 x (1 + 4 / 256) (int8). The planner predicts the same.
TEST(EngineMemory, OptimizerStateOfEveryMomentDtypeEqualsTheFormula) {
  for (const std::string moments : {"f32", "bf16", "int8"}) {
    const std::size_t multiple = moments == "int8" ? 256 : 32;
    for (int n : {1, 2, 3}) {
      for (int stage : {0, 1, 2, 3}) {
        std::size_t opt = 0;
        for (std::size_t l = 0; l + 1 < kDims.size(); ++l) {
          const std::size_t w = static_cast<std::size_t>(kDims[l + 1] * kDims[l]);
          const std::size_t numel = round_up(w, 32) + static_cast<std::size_t>(kDims[l + 1]);
          const std::size_t p = round_up(numel, multiple * static_cast<std::size_t>(n));
          opt += stage == 0 ? p : p / static_cast<std::size_t>(n);
        }
        const std::size_t per_moment =
            moments == "f32" ? 4 * opt : (moments == "bf16" ? 2 * opt : opt + 4 * (opt / 256));
        RunSpec spec{.stage = stage, .ranks = n, .dtype = DType::kBF16};
        spec.moment_dtype = moments;
        Config cfg = make_config(spec);
        const std::string what =
            moments + " moments, stage " + std::to_string(stage) + ", N=" + std::to_string(n);
        const Mlp mlp(kDims);
        ThreadGroup::run(n, [&](Communicator& comm) {
          Engine e(comm, cfg);
          mlp.declare(e);
          mlp.init(e, 1);
          mlp.micro_step(e, testing::make_batch(mlp.in(), mlp.out(), kRows, 0, 0, comm.rank()));
          e.step();
          const MemoryTracker& t = e.tracker();
          EXPECT_EQ(t.current(MemCategory::kMasterParams), 4 * opt) << what;
          EXPECT_EQ(t.current(MemCategory::kOptimizerState), 2 * per_moment) << what;
        });
        testing::expect_plan_equals_tracker(cfg, n, what);
      }
    }
  }
}

TEST(EngineMemory, StageThreePrefetchRespectsTheBucketAndTheLiveLimit) {
  struct Case {
    long bucket, max_live;
    std::size_t buffers;  // gathered-unit buffers the pool ends up with
  };
  // The trainer holds one unit at a time; prefetch adds units ahead in the recorded order.
  // max_padded here is 320 elements (layer 1: W 242 -> b at 256, 278 -> a multiple of 64).
  const Case cases[] = {{0, 1'000'000'000, 1},
                        {1, 1'000'000'000, 2},
                        {1'000'000'000, 1'000'000'000, 3},
                        {1'000'000'000, 500, 2},
                        {1, 1, 1}};
  for (const Case& c : cases) {
    Config cfg = make_config({.stage = 3, .ranks = 2});
    cfg.zero_optimization.stage3_prefetch_bucket_size = c.bucket;
    cfg.zero_optimization.stage3_max_live_parameters = c.max_live;
    const Mlp mlp(kDims);
    std::vector<double> bytes(2);
    ThreadGroup::run(2, [&](Communicator& comm) {
      Engine e(comm, cfg);
      mlp.declare(e);
      mlp.init(e, 1);
      std::size_t shard = 0, max_padded = 0;
      for (UnitId u = 0; u < e.num_units(); ++u) {
        shard += e.unit_shard_numel(u);
        max_padded = std::max(max_padded, e.unit_padded_numel(u));
      }
      ASSERT_EQ(max_padded, 320u);
      for (int step = 0; step < 3; ++step) {
        comm.reset_stats();
        mlp.micro_step(e, testing::make_batch(mlp.in(), mlp.out(), kRows, step, 0, comm.rank()));
        e.step();
      }
      EXPECT_EQ(e.tracker().current(MemCategory::kParams16, MemTier::kHost),
                (shard + c.buffers * max_padded) * 4)
          << "bucket " << c.bucket << " max_live " << c.max_live;
      bytes[static_cast<std::size_t>(comm.rank())] = static_cast<double>(comm.stats().bytes_sent());
    });
    // Prefetching moves the same bytes, earlier: 6 gathers + 3 reduce-scatters + the norm.
    std::size_t psi = 0;
    for (std::size_t l = 0; l + 1 < kDims.size(); ++l) {
      const std::size_t w = static_cast<std::size_t>(kDims[l + 1] * kDims[l]);
      psi += round_up(round_up(w, 32) + static_cast<std::size_t>(kDims[l + 1]), 64);
    }
    EXPECT_EQ(bytes[0], 0.5 * psi * 4 * 3 + 16) << "bucket " << c.bucket;
  }
}

// ---- communication volume per step against DESIGN.md: 2Ψ for stages 0-2, 3Ψ for stage 3

TEST(EngineComm, BytesPerStepMatchTheTheory) {
  const int n = 4;
  for (int stage : {0, 1, 2, 3}) {
    const Config cfg = make_config({.stage = stage, .ranks = n, .dtype = DType::kBF16});
    const Mlp mlp(kDims);
    ThreadGroup::run(n, [&](Communicator& comm) {
      Engine e(comm, cfg);
      mlp.declare(e);
      mlp.init(e, 3);
      mlp.micro_step(e, testing::make_batch(mlp.in(), mlp.out(), kRows, 0, 0, comm.rank()));
      e.step();
      std::size_t psi = 0;
      for (UnitId u = 0; u < e.num_units(); ++u) psi += e.unit_padded_numel(u);
      comm.reset_stats();
      mlp.micro_step(e, testing::make_batch(mlp.in(), mlp.out(), kRows, 1, 0, comm.rank()));
      e.step();
      const CommStats st = comm.stats();
      // Gradients reduce in fp32 (4 bytes), parameters gather in bf16 (2 bytes); ring volumes
      // per rank: all_reduce 2(N-1)/N B, reduce_scatter and all_gather (N-1)/N B each.
      const double f = static_cast<double>(n - 1) / n;
      double expect_grad = 2 * f * psi * 4;  // all_reduce, or reduce_scatter + all_gather pair
      double expect = 0;
      if (stage == 0) expect = expect_grad;
      if (stage == 1 || stage == 2) expect = f * psi * 4 + f * psi * 2;
      if (stage == 3) expect = f * psi * 4 + 2 * f * psi * 2;  // gather in forward and backward
      // The norm / overflow agreement: one all_gather of 16 bytes per rank (stages 1-3).
      const double norm_bytes = stage == 0 ? 0 : (n - 1) * 16.0;
      EXPECT_EQ(static_cast<double>(st.bytes_sent()), expect + norm_bytes) << "stage " << stage;
    });
  }
}

// ---- misuse

using testing::expect_error;

TEST(EngineMisuse, ClearErrors) {
  const Config cfg3 = make_config({.stage = 3, .ranks = 2});
  ThreadGroup::run(2, [&](Communicator& comm) {
    {
      Engine e(comm, cfg3);
      expect_error([&] { e.step(); }, ErrorCode::kInvalidArgument, "add_unit");
    }
    EngineOptions checked;
    checked.poison_released = true;  // what builds without NDEBUG do by default
    Engine e(comm, cfg3, checked);
    const Mlp mlp(kDims);
    mlp.declare(e);
    mlp.init(e, 5);
    expect_error([&] { e.gather(17); }, ErrorCode::kInvalidArgument, "unknown unit id 17");
    expect_error(
        [&] {
          e.add_unit({"late", {{"w", {3}}}});
        },
        ErrorCode::kInvalidArgument, "already laid out");
    // grads_ready twice in one micro-step.
    (void)e.grad(2, 0);
    e.grads_ready(2);
    expect_error([&] { e.grads_ready(2); }, ErrorCode::kInvalidArgument, "twice");
    expect_error([&] { (void)e.grad(2, 1); }, ErrorCode::kInvalidArgument, "already called");
    // step() before every unit has gradients.
    expect_error([&] { e.step(); }, ErrorCode::kInvalidArgument, "layer0");
    e.grads_ready(0);
    e.grads_ready(1);
    e.step();
    // A view used after its guard is gone: the engine refuses, and the memory is poisoned.
    View v;
    {
      GatherGuard g = e.gather(1);
      v = g.param(0);
      EXPECT_EQ(v.count, 22u * 11u);
    }
    // Checked builds poison released stage-3 parameters (before the pool hands them out again).
    for (std::size_t k = 0; k < v.count; ++k) {
      ASSERT_TRUE(std::isnan(static_cast<const float*>(v.data)[k])) << k;
    }
    expect_error([&] { (void)GatherGuard().param(0); }, ErrorCode::kInvalidArgument, "empty");
    GatherGuard g0 = e.gather(0);
    g0.release();
    expect_error([&] { g0.param(0); }, ErrorCode::kInvalidArgument, "released");
    expect_error([&] { e.set_param(0, 0, nullptr, 3); }, ErrorCode::kInvalidArgument, "55");
    // step() while a stage-3 unit is still gathered: its copy would miss the update.
    {
      GatherGuard held = e.gather(2);
      for (UnitId u = 0; u < e.num_units(); ++u) e.grads_ready(u);
      expect_error([&] { e.step(); }, ErrorCode::kInvalidArgument, "still gathered");
    }
  });
  // Layout errors name the unit and parameter.
  ThreadGroup::run(1, [&](Communicator& comm) {
    Engine e(comm, make_config({.stage = 1}));
    expect_error([&] { e.add_unit({"empty", {}}); }, ErrorCode::kInvalidArgument, "'empty'");
    expect_error(
        [&] {
          e.add_unit({"u", {{"bad", {3, 0}}}});
        },
        ErrorCode::kInvalidArgument, "u.bad");
  });
}

TEST(EngineMisuse, ParameterOffloadToNvmeWithoutOptimizerOffloadIsRefused) {
  for (const char* j : {R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme",
                            "nvme_path": "/tmp"}}})"}) {
    const Config cfg = parse_config(j);
    ThreadGroup::run(1, [&](Communicator& comm) {
      expect_error([&] { Engine e(comm, cfg); }, ErrorCode::kConfig, "offload_");
    });
  }
}

}  // namespace
}  // namespace zero

namespace zero {
namespace {

// ---- attach mode: a trainer with its own flat buffers

// Trains a least-squares fit of y = A x with the trainer's own buffers, each rank on its own
// samples; returns rank 0's final parameters.
std::vector<float> train_attached(int stage, int n, DType dt, std::size_t numel, int steps,
                                  double* initial_error = nullptr) {
  const Config cfg =
      parse_config(R"({"zero_optimization": {"stage": )" + std::to_string(stage) + R"(},
          "gradient_clipping": 1.0,
          "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}})" +
                   (dt == DType::kBF16 ? R"(, "bf16": {"enabled": true}})" : "}"));
  std::vector<float> out;
  std::mutex mu;
  ThreadGroup::run(n, [&](Communicator& comm) {
    const std::size_t cap = attach_capacity(numel, comm.size());
    const std::size_t es = dtype_size(dt);
    std::vector<unsigned char> params(cap * es), grads(cap * es);
    std::mt19937 init(static_cast<unsigned>(comm.rank()));  // different per rank: attach
    std::vector<float> p32(cap, 0.0f);                      // broadcasts rank 0's
    std::normal_distribution<float> nd;
    for (std::size_t i = 0; i < numel; ++i) p32[i] = nd(init);
    convert(p32.data(), DType::kF32, params.data(), dt, cap);
    auto opt = Engine::attach(comm, cfg, params.data(), grads.data(), numel, cap, dt);
    if (comm.rank() == 0 && initial_error != nullptr) {
      convert(params.data(), dt, p32.data(), DType::kF32, cap);
      double e = 0;
      for (std::size_t i = 0; i < numel; ++i)
        e += std::fabs(p32[i] - std::sin(static_cast<double>(i)));
      *initial_error = e / static_cast<double>(numel);
    }
    std::mt19937 data(100 + static_cast<unsigned>(comm.rank()));
    std::vector<float> g32(cap);
    for (int s = 0; s < steps; ++s) {
      convert(params.data(), dt, p32.data(), DType::kF32, cap);
      // gradient of 1/2 |p - target|^2 with a noisy per-rank target
      for (std::size_t i = 0; i < numel; ++i) {
        g32[i] = p32[i] - (std::sin(static_cast<float>(i)) + 0.1f * nd(data));
      }
      convert(g32.data(), DType::kF32, grads.data(), dt, numel);
      const StepResult r = opt->step();
      EXPECT_TRUE(r.boundary && r.applied);
    }
    if (comm.rank() == 0) {
      std::lock_guard<std::mutex> lock(mu);
      out.resize(numel);
      convert(params.data(), dt, out.data(), DType::kF32, numel);
    }
  });
  return out;
}

TEST(EngineAttach, StagesOneAndTwoMatchStageZeroBitwiseOnTheTrainersBuffers) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (int n : {1, 2, 3, 4}) {
      const std::size_t numel = 1009;  // prime
      double initial = 0;
      const auto ref = train_attached(0, n, dt, numel, 20, &initial);
      for (int stage : {1, 2}) {
        const auto got = train_attached(stage, n, dt, numel, 20);
        ASSERT_EQ(got.size(), ref.size());
        EXPECT_TRUE(testing::same_bits(got.data(), ref.data(), ref.size()))
            << "stage " << stage << " N=" << n << " " << to_string(dt);
      }
      // It learned: the mean distance to the target sin(i) fell (20 steps of lr 0.01 move each
      // parameter by up to 0.2).
      double err = 0;
      for (std::size_t i = 0; i < numel; ++i)
        err += std::fabs(ref[i] - std::sin(static_cast<double>(i)));
      err /= static_cast<double>(numel);
      EXPECT_LT(err, initial - 0.1)
          << "attach mode did not train (" << initial << " -> " << err << ")";
    }
  }
}

TEST(EngineAttach, BadBuffersAndConfigsAreClearErrors) {
  ThreadGroup::run(3, [&](Communicator& comm) {
    std::vector<float> p(100), g(100);
    const Config c1 = parse_config(R"({"zero_optimization": {"stage": 1}})");
    expect_error([&] { Engine::attach(comm, c1, p.data(), g.data(), 100, 100, DType::kF32); },
                 ErrorCode::kInvalidArgument, "attach_capacity(100, 3)");
    const Config c3 = parse_config(R"({"zero_optimization": {"stage": 3}})");
    expect_error([&] { Engine::attach(comm, c3, p.data(), g.data(), 10, 100, DType::kF32); },
                 ErrorCode::kConfig, "stage");
    const Config bf = parse_config(R"({"bf16": {"enabled": true}})");
    expect_error([&] { Engine::attach(comm, bf, p.data(), g.data(), 10, 100, DType::kF32); },
                 ErrorCode::kConfig, "bf16");
  });
  EXPECT_EQ(attach_capacity(100, 3), 192u);
  EXPECT_EQ(attach_capacity(96, 3), 96u);
}

}  // namespace
}  // namespace zero

namespace zero {
namespace {

// ---- the planner predicts the tracker, byte for byte

TEST(EnginePlan, PredictionEqualsTheTrackerForEveryStageDtypeAndPrefetchSetting) {
  int checked = 0;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (int n : {1, 2, 3}) {
      for (int stage : {0, 1, 2, 3}) {
        for (bool overlap : {false, true}) {
          for (long bucket : {0L, 1L, 1'000'000'000L}) {
            if (stage < 3 && bucket != 0) continue;
            Config cfg = make_config({.stage = stage, .ranks = n, .dtype = dt, .overlap = overlap});
            cfg.zero_optimization.stage3_prefetch_bucket_size = bucket;
            testing::expect_plan_equals_tracker(
                cfg, n,
                "stage " + std::to_string(stage) + " N=" + std::to_string(n) + " " +
                    std::string(to_string(dt)) + " overlap " + std::to_string(overlap) +
                    " bucket " + std::to_string(bucket));
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 2 * 3 * (3 * 2 + 2 * 3));
}

TEST(EnginePlan, FormulasReproduceTheZeroPapersSevenPointFiveBillionExample) {
  // ZeRO (Rajbhandari et al. 2020), Figure 1: Psi = 7.5B, N = 64, K = 12, fp16 params and grads:
  // baseline 120 GB, P_os 31.4 GB, P_os+g 16.6 GB, P_os+g+p 1.9 GB.
  const double psi = 7.5e9;
  EXPECT_NEAR(zero_formula(psi, 64, 0).total() / 1e9, 120.0, 0.05);
  EXPECT_NEAR(zero_formula(psi, 64, 1).total() / 1e9, 31.4, 0.05);
  EXPECT_NEAR(zero_formula(psi, 64, 2).total() / 1e9, 16.6, 0.05);
  EXPECT_NEAR(zero_formula(psi, 64, 3).total() / 1e9, 1.9, 0.05);
  // ZeRO-Infinity (stage 3, optimizer and parameter offload): every model state leaves the
  // device (the gradient partition goes with the optimizer, as in ZeRO-Offload).
  const FormulaBytes off = zero_formula(psi, 64, 3, 2, 2, 12, true, true);
  EXPECT_NEAR(off.total() / 1e9, 0.0, 1e-9);
  EXPECT_NEAR(off.offloaded / 1e9, 16 * psi / 64 / 1e9, 1e-9);
  // ZeRO-Offload (stage 2, optimizer offload): 2 psi of parameters stay.
  const FormulaBytes zo = zero_formula(psi, 64, 2, 2, 2, 12, true, false);
  EXPECT_NEAR(zo.total() / 1e9, 2 * psi / 1e9, 1e-9);
  EXPECT_NEAR(zo.offloaded / 1e9, 14 * psi / 64 / 1e9, 1e-9);
}

}  // namespace
}  // namespace zero

namespace zero {
namespace {

// ---- the device interface: a discrete device (memory the host cannot address, as a GPU's)

TEST(EngineDevice, DiscreteDeviceMemoryIsNotHostAddressable) {
  // The check below is only a check if a stray host access crashes.
  testing::DiscreteCpuDevice d;
  MemoryTracker t;
  Buffer b = d.alloc(t, MemCategory::kOther, 64, {.zero = true});
  EXPECT_EQ(t.current(MemCategory::kOther, MemTier::kDevice), 64u);
  float host[16] = {1.0f};
  d.copy(host, b.data(), sizeof host);
  EXPECT_EQ(host[0], 0.0f);
  EXPECT_DEATH({ std::printf("%f\n", *static_cast<volatile float*>(b.data())); }, "");
}

TEST(EngineDevice, DiscreteDeviceTrainsBitwiseLikeTheCpuDevice) {
  // Every host <-> device move the engine makes for a GPU (views, set_param / read_param, the
  // norm's all-gather on device memory, master and state copies) goes through the interface.
  int runs = 0;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int n : {1, 3}) {
      for (int accumulation : {1, 3}) {
        for (int stage : {0, 1, 2, 3}) {
          RunSpec cpu{.stage = stage,
                      .ranks = n,
                      .dtype = dt,
                      .accumulation = accumulation,
                      .clip = true,
                      .overlap = stage == 3};
          RunSpec dev = cpu;
          dev.discrete = true;
          const RunResult a = train(cpu), b = train(dev);
          ++runs;
          EXPECT_TRUE(bitwise_equal(b.params, a.params))
              << describe(dev) << ": max |diff| " << max_abs_diff(b.params, a.params);
          EXPECT_TRUE(bitwise_equal(b.masters, a.masters)) << describe(dev) << " (masters)";
          ASSERT_EQ(b.steps.size(), a.steps.size()) << describe(dev);
          for (std::size_t i = 0; i < a.steps.size(); ++i) {
            EXPECT_EQ(b.steps[i].grad_norm, a.steps[i].grad_norm) << describe(dev) << " step " << i;
            EXPECT_EQ(b.steps[i].applied, a.steps[i].applied) << describe(dev) << " step " << i;
          }
        }
      }
    }
  }
  EXPECT_EQ(runs, 3 * 2 * 2 * 4);
}

TEST(EngineDevice, ACudaDeviceNeedsNcclAndNcclNeedsACudaDevice) {
  ThreadGroup::run(1, [](Communicator& comm) {
    EngineOptions o;
    o.device = Device::cuda(0);
    try {
      Engine e(comm, parse_config(R"({"zero_optimization": {"stage": 2}})"), o);
      FAIL() << "a CUDA engine over the thread communicator was accepted";
    } catch (const Error& e) {
      // Without CUDA (or a GPU) the device is refused first; with one, the communicator.
      const std::string what = e.what();
      EXPECT_TRUE(what.find("cuda:0") != std::string::npos) << what;
    }
  });
}

TEST(EngineSchedule, UpdateKRunsWithTheSchedulersLrAfterStepKMinusTwo) {
  const Config cfg = make_config({.stage = 2, .ranks = 2});
  const LrSchedule sched = LrSchedule::from_config(cfg.scheduler, cfg.optimizer.lr);
  const Mlp mlp(kDims);
  ThreadGroup::run(2, [&](Communicator& comm) {
    Engine e(comm, cfg);
    mlp.declare(e);
    mlp.init(e, 1);
    for (int k = 1; k <= 8; ++k) {
      mlp.micro_step(e, testing::make_batch(mlp.in(), mlp.out(), kRows, k, 0, comm.rank()));
      const StepResult r = e.step();
      EXPECT_EQ(r.lr, sched.lr(k - 2)) << "update " << k;
      EXPECT_EQ(r.steps, k);
    }
  });
}

}  // namespace
}  // namespace zero
