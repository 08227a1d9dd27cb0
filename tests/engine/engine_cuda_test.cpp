// The engine on a CUDA device (NCCL at world size 1: one H200 per machine here, and NCCL refuses
// two ranks on one GPU). Its kernels apply the CPU path's per-element math, so without clipping
// (the norm is the one reduction whose order differs between CPU and GPU) a CUDA run gives
// bitwise the parameters of the CPU engine, for every stage, dtype, accumulation and offload
// (also a partial one, offload_optimizer.ratio 0.5: the leading unit stepped by the device's
// kernel, the trailing one by the CPU Adam, in the same step);
// with clipping, stage k on the GPU gives bitwise stage 0 on the GPU. Skips, saying why, without
// a device.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "common/gpu_rank.hpp"
#include "common/mlp_training.hpp"
#include "zero/comm/comm.hpp"
#include "zero/engine/engine.hpp"

namespace zero {
namespace {

using testing::bitwise_equal;
using testing::describe;
using testing::max_abs_diff;
using testing::RunResult;
using testing::RunSpec;

using testing::single_gpu_comm;

EngineOptions on_gpu() {
  EngineOptions eo;
  eo.device = Device::cuda(0);
  return eo;
}

RunResult train_on_gpu(const RunSpec& s) {
  auto comm = single_gpu_comm();
  return testing::train_rank(*comm, s, on_gpu());
}

TEST(EngineCuda, TrainsBitwiseLikeTheCpuEngineWithoutClipping) {
  REQUIRE_DEVICE();
  int runs = 0;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int stage : {0, 1, 2, 3}) {
      for (int accumulation : {1, 3}) {
        for (const char* offload : {"none", "cpu", "cpu:0.5"}) {
          RunSpec s{.stage = stage,
                    .ranks = 1,
                    .dtype = dt,
                    .accumulation = accumulation,
                    .clip = false,
                    .overlap = stage == 3};
          if (std::string(offload) != "none") {
            if (stage == 0) continue;
            if (std::string(offload) == "cpu:0.5" && accumulation > 1) continue;
            s.offload_buffers = 2;
            s.offload_chunk = 100;
            s.offload_ratio = std::string(offload) == "cpu" ? 1.0 : 0.5;
          }
          const RunResult cpu = testing::train(s);
          const RunResult gpu = train_on_gpu(s);
          ++runs;
          EXPECT_TRUE(bitwise_equal(gpu.params, cpu.params))
              << describe(s) << ": max |diff| " << max_abs_diff(gpu.params, cpu.params);
          EXPECT_TRUE(bitwise_equal(gpu.masters, cpu.masters)) << describe(s) << " (masters)";
          ASSERT_EQ(gpu.steps.size(), cpu.steps.size()) << describe(s);
          for (std::size_t i = 0; i < cpu.steps.size(); ++i) {
            EXPECT_EQ(gpu.steps[i].applied, cpu.steps[i].applied) << describe(s) << " step " << i;
            EXPECT_EQ(gpu.steps[i].loss_scale, cpu.steps[i].loss_scale) << describe(s);
            EXPECT_NEAR(gpu.steps[i].grad_norm, cpu.steps[i].grad_norm,
                        1e-9 * (1.0 + cpu.steps[i].grad_norm))
                << describe(s) << " step " << i;
          }
        }
      }
    }
  }
  EXPECT_EQ(runs, 3 * (2 + 3 * (2 * 2 + 1)));
}

TEST(EngineCuda, EveryStageMatchesStageZeroBitwiseWithClipping) {
  REQUIRE_DEVICE();
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    RunSpec base{.stage = 0, .ranks = 1, .dtype = dt, .clip = true};
    const RunResult ref = train_on_gpu(base);
    for (int stage : {1, 2, 3}) {
      RunSpec s = base;
      s.stage = stage;
      s.overlap = stage == 3;
      const RunResult got = train_on_gpu(s);
      EXPECT_TRUE(bitwise_equal(got.params, ref.params)) << describe(s);
      EXPECT_TRUE(bitwise_equal(got.masters, ref.masters)) << describe(s);
    }
  }
}

// qwZ + qgZ on the GPU (one rank: every all-gather and reduction still packs and reads back its
// int8 chunks, through the kernels and NCCL's grouped send / receive): the CPU engine's bits.
TEST(EngineCuda, QuantizedCollectivesTrainBitwiseLikeTheCpuEngine) {
  REQUIRE_DEVICE();
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    RunSpec s{.stage = 3, .ranks = 1, .dtype = dt, .clip = true, .overlap = true};
    s.qwz = s.qgz = true;
    const RunResult cpu = testing::train(s);
    const RunResult gpu = train_on_gpu(s);
    EXPECT_TRUE(bitwise_equal(gpu.params, cpu.params))
        << describe(s) << ": max |diff| " << max_abs_diff(gpu.params, cpu.params);
    EXPECT_TRUE(bitwise_equal(gpu.masters, cpu.masters)) << describe(s) << " (masters)";
  }
}

TEST(EngineCuda, ViewsAreDevicePointersAndMemoryIsChargedToTheDeviceTier) {
  REQUIRE_DEVICE();
  auto comm = single_gpu_comm();
  Engine e(*comm, parse_config(R"({"zero_optimization": {"stage": 2}, "bf16": {"enabled": true}})"),
           on_gpu());
  e.add_unit({"u", {{"w", {1000}}}});
  std::vector<float> v(1000, 0.5f);
  e.set_param(0, 0, v.data(), v.size());
  auto g = e.gather(0);
  EXPECT_TRUE(g.param(0).device.is_cuda());
  EXPECT_TRUE(e.grad(0, 0).device.is_cuda());
  EXPECT_GT(e.tracker().current(MemTier::kDevice), 0u);
  EXPECT_EQ(e.tracker().current(MemCategory::kParams16, MemTier::kHost), 0u);
  std::vector<float> back(1000);
  g.release();
  e.read_param(0, 0, back.data(), back.size());
  EXPECT_EQ(back, v);
}

}  // namespace
}  // namespace zero
