// The GPT decoder on a GPU (apps/gpt/gpt_cuda.hpp) against independent references: its loss
// and every parameter gradient against the CPU model's (gpt_model.hpp, itself checked against
// finite differences in gpt_model_test) on the same parameters and batch; it learns in bf16 at
// stages 2 and 3; and stages 1-3 train bitwise the same parameters as stage 0 on the GPU (f32
// and bf16). The engine runs on cuda:0 over the single-rank NCCL communicator, both on the
// model's stream (one H200 per machine here; NCCL refuses two ranks on one GPU). Skips, saying
// why, without a device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/compare.hpp"
#include "common/gpu_rank.hpp"
#include "gpt/gpt_cuda.hpp"
#include "gpt/gpt_model.hpp"
#include "zero/comm/comm.hpp"
#include "zero/config/config.hpp"
#include "zero/core/dtype.hpp"
#include "zero/core/error.hpp"
#include "zero/device/detail/cuda_runtime.hpp"
#include "zero/engine/activation_checkpointing.hpp"
#include "zero/engine/engine.hpp"

namespace zero::gpt {
namespace {

using zero::testing::bitwise_equal;
using zero::testing::max_abs_diff;
using zero::testing::read_params;

// A short, repetitive text: learnable in a few dozen steps, and no file needed.
const CharCorpus& corpus() {
  static const CharCorpus c = [] {
    const std::string text =
        "the quick brown fox jumps over the lazy dog. the lazy dog sleeps in the warm sun. "
        "a small bird sings in the tall tree by the river, and the river runs down to the sea. "
        "the sea is wide and blue, and the fox looks at the sea from the hill. ";
    return CharCorpus::from_text(text + text + text + text);
  }();
  return c;
}

GptConfig small_config() {
  return {.vocab = corpus().vocab_size(), .seq = 16, .layers = 2, .dim = 32, .heads = 4};
}

// A CUDA stream, the single-rank NCCL communicator and an engine on cuda:0 both on that stream,
// and the GPU model: what one rank of a GPU trainer holds. Members are destroyed in reverse
// order, the stream last.
struct Stream {
  cudaStream_t s = nullptr;
  Stream() { EXPECT_EQ(cudaSuccess, cudaStreamCreate(&s)); }
  ~Stream() {
    if (s != nullptr) cudaStreamDestroy(s);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
};

struct GpuRank {
  Stream stream;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<GptCudaModel> model;

  GpuRank(const Config& config, const GptConfig& gcfg) {
    comm = testing::single_gpu_comm(stream.s);
    EngineOptions eo;
    eo.device = Device::cuda(0);
    eo.cuda_stream = stream.s;
    eo.poison_released = true;  // a view used after its guard would show up as a mismatch
    engine = std::make_unique<Engine>(*comm, config, eo);
    model = std::make_unique<GptCudaModel>(gcfg, engine->tracker(), 0, stream.s);
    model->declare(*engine);
  }
};

// Every (unit, param) gradient of one micro-step, as f32, captured through the tap.
using Grads = std::vector<std::vector<std::vector<float>>>;

void store(Grads& g, UnitId u, int p, std::vector<float> values) {
  if (g.size() <= static_cast<std::size_t>(u)) g.resize(static_cast<std::size_t>(u) + 1);
  auto& unit = g[static_cast<std::size_t>(u)];
  if (unit.size() <= static_cast<std::size_t>(p)) unit.resize(static_cast<std::size_t>(p) + 1);
  unit[static_cast<std::size_t>(p)] = std::move(values);
}

GradTap capture_host(Grads& g) {
  return [&g](UnitId u, int p, const View& v) {
    std::vector<float> out(v.count);
    convert(v.data, v.dtype, out.data(), DType::kF32, v.count);
    store(g, u, p, std::move(out));
  };
}

// The GPU model synchronises its stream before calling the tap: a plain cudaMemcpy reads it.
GradTap capture_device(Grads& g) {
  return [&g](UnitId u, int p, const View& v) {
    EXPECT_TRUE(v.device.is_cuda());
    std::vector<unsigned char> raw(v.bytes());
    EXPECT_EQ(cudaSuccess, cudaMemcpy(raw.data(), v.data, v.bytes(), cudaMemcpyDeviceToHost));
    std::vector<float> out(v.count);
    convert(raw.data(), v.dtype, out.data(), DType::kF32, v.count);
    store(g, u, p, std::move(out));
  };
}

// ---- (1) the same function as the CPU model

// f32, stage 0, the same parameters (init_random, stddev 0.5: every path carries signal) and
// batch. Both compute in f32 and differ only in the order of their sums (cuBLAS, warp trees,
// FMA): the loss within 1e-5 relative, each gradient tensor within 1e-4 of its largest element.
TEST(GptCuda, F32LossAndEveryGradientMatchTheCpuModel) {
  REQUIRE_DEVICE();
  const GptConfig gcfg = small_config();
  const TokenBatch batch = corpus().batch(Split::kTrain, 3, 16, 0, 0, 0);
  const Config config = parse_config(R"({"zero_optimization": {"stage": 0}})");
  Grads cpu, gpu;
  double cpu_loss = 0, gpu_loss = 0, cpu_eval = 0, gpu_eval = 0;
  int units = 0;
  ThreadGroup::run(1, [&](Communicator& comm) {
    Engine e(comm, config);
    GptModel m(gcfg, e.tracker());
    m.declare(e);
    m.init_random(e, 7, 0.5f);
    units = e.num_units();
    cpu_eval = m.forward_loss(e, batch);
    cpu_loss = m.forward_backward(e, batch, capture_host(cpu));
  });
  {
    GpuRank r(config, gcfg);
    r.model->init_random(*r.engine, 7, 0.5f);
    ASSERT_EQ(r.engine->num_units(), units);
    gpu_eval = r.model->forward_loss(*r.engine, batch);
    gpu_loss = r.model->forward_backward(*r.engine, batch, capture_device(gpu));
    r.engine->step();
    EXPECT_GT(r.engine->tracker().current(MemCategory::kActivations, MemTier::kDevice), 0u);
  }
  std::printf("loss: CPU %.9g, GPU %.9g\n", cpu_loss, gpu_loss);
  EXPECT_NEAR(gpu_loss, cpu_loss, 1e-5 * std::fabs(cpu_loss));
  EXPECT_NEAR(gpu_eval, cpu_eval, 1e-5 * std::fabs(cpu_eval));
  EXPECT_EQ(gpu_eval, gpu_loss);  // the same forward, with or without backward
  ASSERT_EQ(gpu.size(), cpu.size());
  ASSERT_EQ(cpu.size(), static_cast<std::size_t>(units));
  for (std::size_t u = 0; u < cpu.size(); ++u) {
    ASSERT_EQ(gpu[u].size(), cpu[u].size()) << "unit " << u;
    for (std::size_t p = 0; p < cpu[u].size(); ++p) {
      const std::vector<float>& c = cpu[u][p];
      const std::vector<float>& g = gpu[u][p];
      ASSERT_EQ(g.size(), c.size()) << "unit " << u << " param " << p;
      double cmax = 0, diff = 0;
      for (std::size_t i = 0; i < c.size(); ++i) {
        cmax = std::max(cmax, std::fabs(static_cast<double>(c[i])));
        diff = std::max(diff, std::fabs(static_cast<double>(g[i]) - c[i]));
      }
      EXPECT_GT(cmax, 0.0) << "unit " << u << " param " << p << ": no gradient";
      EXPECT_LE(diff, 1e-4 * cmax) << "unit " << u << " param " << p << ": max |GPU - CPU| " << diff
                                   << ", max |CPU| " << cmax;
    }
  }
}

// ---- (2) it learns

Config training_config(int stage, DType dtype, bool clip = false) {
  std::string j =
      R"({"zero_optimization": {"stage": )" + std::to_string(stage) +
      (stage == 3 ? R"(, "overlap_comm": true, "stage3_param_persistence_threshold": 0)" : "") +
      R"(}, "gradient_clipping": )" + (clip ? "0.5" : "0") +
      R"(, "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.0}})";
  if (dtype == DType::kBF16) j += R"(, "bf16": {"enabled": true})";
  return parse_config(j + "}");
}

struct Trained {
  std::vector<std::vector<float>> params;
  std::vector<double> losses;
};

Trained train_on_gpu(const Config& config, int steps, int rows,
                     const CheckpointSpec& ckpt = CheckpointSpec{}) {
  const GptConfig gcfg = small_config();
  GpuRank r(config, gcfg);
  r.model->set_checkpointing(ckpt);
  r.model->init(*r.engine, 1);
  Trained t;
  for (int step = 0; step < steps; ++step) {
    t.losses.push_back(r.model->forward_backward(
        *r.engine,
        corpus().batch(Split::kTrain, rows, gcfg.seq, 0, static_cast<std::uint64_t>(step), 0)));
    r.engine->step();
  }
  t.params = read_params(*r.engine);
  return t;
}

// 30 AdamW steps at lr 1e-2 on 8 x 16 tokens: the mean loss of the last 3 steps at least 20%
// below that of the first 3 (the CPU model goes from ~3.3 to ~2.2 on this text).
TEST(GptCuda, Bf16TrainingAtStagesTwoAndThreeLowersTheLoss) {
  REQUIRE_DEVICE();
  for (int stage : {2, 3}) {
    const Trained t = train_on_gpu(training_config(stage, DType::kBF16), 30, 8);
    ASSERT_EQ(t.losses.size(), 30u);
    const double first = (t.losses[0] + t.losses[1] + t.losses[2]) / 3;
    const double last = (t.losses[27] + t.losses[28] + t.losses[29]) / 3;
    std::printf("bf16 stage %d: mean loss of steps 0-2 %.3f, 27-29 %.3f\n", stage, first, last);
    EXPECT_LT(last, 0.8 * first) << "stage " << stage << ": did not train";
  }
}

// ---- (3) stages 1-3 against stage 0, bitwise

TEST(GptCuda, EveryStageTrainsBitwiseTheSameParametersAsStageZero) {
  REQUIRE_DEVICE();
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (bool clip : {false, true}) {
      const Trained ref = train_on_gpu(training_config(0, dt, clip), 10, 4);
      for (int stage : {1, 2, 3}) {
        const Trained got = train_on_gpu(training_config(stage, dt, clip), 10, 4);
        const std::string what = "stage " + std::to_string(stage) + ", " +
                                 std::string(to_string(dt)) + (clip ? ", clipping" : "");
        EXPECT_TRUE(bitwise_equal(got.params, ref.params))
            << what << ": max |diff| " << max_abs_diff(got.params, ref.params);
        EXPECT_EQ(got.losses, ref.losses) << what;
      }
    }
  }
}

// ---- the contract's edges

// The blocks run through the library's Checkpointer on the GPU: recomputed segments give bitwise
// the plain run's training, with the kept inputs on the device or (cpu_checkpointing) in pinned
// memory, copied on the copy stream.
TEST(GptCuda, CheckpointedTrainingIsBitwiseThePlainRun) {
  REQUIRE_DEVICE();
  for (int stage : {0, 3}) {
    const Trained plain = train_on_gpu(training_config(stage, DType::kBF16), 5, 4);
    for (const char* policy : {"every:1", "sqrt", "list:1"}) {
      for (bool cpu : {false, true}) {
        CheckpointSpec spec = CheckpointSpec::parse(policy);
        spec.cpu_checkpointing = cpu;
        const Trained got = train_on_gpu(training_config(stage, DType::kBF16), 5, 4, spec);
        const std::string what =
            "stage " + std::to_string(stage) + ", " + policy + (cpu ? ", cpu_checkpointing" : "");
        EXPECT_TRUE(bitwise_equal(got.params, plain.params))
            << what << ": max |diff| " << max_abs_diff(got.params, plain.params);
        EXPECT_EQ(got.losses, plain.losses) << what;
      }
    }
  }
  MemoryTracker tracker;
  GptCudaModel m(small_config(), tracker, 0, nullptr);
  EXPECT_THROW(m.set_checkpointing(CheckpointSpec::parse("list:7")), Error);  // 2 layers
}

TEST(GptCuda, AnEngineOnTheCpuIsRefusedNamingTheDevice) {
  REQUIRE_DEVICE();
  const GptConfig gcfg = small_config();
  ThreadGroup::run(1, [&](Communicator& comm) {
    Engine e(comm, parse_config("{}"));
    GptCudaModel m(gcfg, e.tracker(), 0, nullptr);
    m.declare(e);
    m.init(e, 1);
    try {
      m.forward_backward(e, corpus().batch(Split::kTrain, 2, 16, 0, 0, 0));
      ADD_FAILURE() << "no error";
    } catch (const Error& err) {
      EXPECT_EQ(err.code(), ErrorCode::kInvalidArgument) << err.what();
      EXPECT_NE(err.message().find("Device::cuda"), std::string::npos) << err.what();
    }
  });
}

}  // namespace
}  // namespace zero::gpt
