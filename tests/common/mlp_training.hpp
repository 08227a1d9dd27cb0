// tests/common/mlp_training.hpp — the MLP training runs the tests compare: a config per run, one
// rank's training loop, and what it returns. Shared by the in-process and MPI tests of the engine,
// checkpoints, offload, the communicator's divergence checks and the fault tests.
// Thread safety: train_rank runs on its rank's thread (or process) with its own engine.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "common/compare.hpp"
#include "common/discrete_device.hpp"
#include "common/mlp_model.hpp"
#include "zero/comm/comm.hpp"
#include "zero/config/config.hpp"
#include "zero/engine/engine.hpp"
#include "zero/engine/plan.hpp"

namespace zero::testing {

// Total parameter count 491: prime, so never divisible by N.
inline const std::vector<int> kDims = {5, 11, 22, 7};
constexpr int kRows = 4;  // samples per rank per micro-step

struct RunSpec {
  int stage = 0;
  int ranks = 1;
  DType dtype = DType::kF32;
  int accumulation = 1;
  bool clip = false;
  int steps = 20;
  bool overlap = false;
  long persistence = 0;  // stage3_param_persistence_threshold
  // Train on one rank with the concatenation of `data_ranks` ranks' batches.
  int data_ranks = 0;
  // > 0: offload_optimizer.device = offload_device with this many staging buffers of
  // offload_chunk elements (nvme: files under nvme_path, through the aio engine `aio_engine`).
  int offload_buffers = 0;
  long offload_chunk = 0;
  std::string offload_device = "cpu";
  std::string nvme_path;
  bool pipeline = true;
  std::string aio_engine = "io_uring";
  std::string offload_param = "none";  // stage 3: offload_param.device
  double offload_ratio = 1.0;          // offload_optimizer.ratio (with offload_buffers > 0)
  bool overlap_step = false;           // offload_optimizer.overlap_step (with offload_buffers > 0)
  // The MLP's layer widths (a unit per layer).
  std::vector<int> dims = kDims;
  // zero_optimization.reduce_bucket_size / allgather_bucket_size (0: a collective per unit).
  long reduce_bucket = 0;
  long allgather_bucket = 0;
  // Run on the discrete CPU device (tests/common/discrete_device.hpp) behind DiscreteComm.
  bool discrete = false;
  // zero_optimization.hybrid_shard_size (0: shard over all ranks).
  long hybrid = 0;
  // ZeRO++: zero_quantized_weights / zero_quantized_gradients, quantization_block_size.
  bool qwz = false;
  bool qgz = false;
  long quant_block = 256;
  // zero_optimization.reduce_scatter (false: stages 1-2 reduce by all-reduce).
  bool reduce_scatter = true;
  // optimizer.params.moment_dtype: f32, bf16 or int8.
  std::string moment_dtype = "f32";
};

// `steps` steps of one micro-step each on this rank's batches (make_batch(..., step, 0, rank)),
// the engine already declared and initialised; returns the last step's result.
inline StepResult run_steps(Engine& e, const Mlp& mlp, int rank, int steps) {
  StepResult last;
  for (int step = 0; step < steps; ++step) {
    mlp.micro_step(
        e, make_batch(mlp.in(), mlp.out(), kRows, static_cast<std::uint64_t>(step), 0, rank));
    last = e.step();
  }
  return last;
}

inline Config make_config(const RunSpec& s) {
  std::string j =
      R"({"zero_optimization": {"stage": )" + std::to_string(s.stage) + R"(, "overlap_comm": )" +
      (s.overlap ? "true" : "false") + R"(, "reduce_bucket_size": )" +
      std::to_string(s.reduce_bucket) + R"(, "allgather_bucket_size": )" +
      std::to_string(s.allgather_bucket) +
      (s.stage == 3 ? R"(, "stage3_param_persistence_threshold": )" + std::to_string(s.persistence)
                    : std::string()) +
      (s.hybrid > 0 ? R"(, "hybrid_shard_size": )" + std::to_string(s.hybrid) : std::string()) +
      (s.reduce_scatter ? std::string() : std::string(R"(, "reduce_scatter": false)")) +
      (s.qwz || s.qgz ? R"(, "zero_quantized_weights": )" + std::string(s.qwz ? "true" : "false") +
                            R"(, "zero_quantized_gradients": )" + (s.qgz ? "true" : "false") +
                            R"(, "quantization_block_size": )" + std::to_string(s.quant_block)
                      : std::string()) +
      (s.offload_buffers > 0
           ? R"(, "offload_optimizer": {"device": ")" + s.offload_device + R"(", "nvme_path": ")" +
                 s.nvme_path + R"(", "pipeline_read": )" + (s.pipeline ? "true" : "false") +
                 R"(, "pipeline_write": )" + (s.pipeline ? "true" : "false") +
                 R"(, "buffer_count": )" + std::to_string(s.offload_buffers) +
                 R"(, "buffer_size": )" + std::to_string(s.offload_chunk) + R"(, "ratio": )" +
                 std::to_string(s.offload_ratio) +
                 (s.overlap_step ? R"(, "overlap_step": true)" : "") + "}"
           : std::string()) +
      R"(, "offload_param": {"device": ")" + s.offload_param + R"(", "nvme_path": ")" +
      s.nvme_path + R"("})" + R"(}, "aio": {"engine": ")" + s.aio_engine +
      R"("}, "gradient_accumulation_steps": )" + std::to_string(s.accumulation) +
      R"(, "gradient_clipping": )" + (s.clip ? "0.05" : "0") +
      R"(, "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01, )" +
      R"("moment_dtype": ")" + s.moment_dtype + R"("}},
        "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0.001,
          "warmup_max_lr": 0.01, "warmup_num_steps": 5, "total_num_steps": 40}})";
  if (s.dtype == DType::kBF16) j += R"(, "bf16": {"enabled": true})";
  if (s.dtype == DType::kF16) {
    j += R"(, "fp16": {"enabled": true, "initial_scale_power": 12, "loss_scale_window": 4,
             "hysteresis": 1})";
  }
  j += "}";
  return parse_config(j);
}

struct RunResult {
  std::vector<std::vector<float>> params;         // working-dtype values as f32, per (unit, param)
  std::vector<std::vector<float>> masters;        // fp32 master, whole padded unit
  std::vector<std::vector<float>> master_params;  // fp32 master per (unit, param), unpadded
  std::vector<StepResult> steps;                  // rank 0's step results
  std::vector<float> losses;
};

// Every rank's master shards all-gathered into whole units (from whichever tier holds them).
inline std::vector<std::vector<float>> gather_masters(Engine& e) {
  std::vector<std::vector<float>> out;
  for (UnitId u = 0; u < e.num_units(); ++u) {
    std::vector<float> whole(e.unit_padded_numel(u));
    if (e.stage() == 0) {
      e.copy_master_shard(u, whole.data());
    } else {
      std::vector<float> shard(e.unit_shard_numel(u));
      e.copy_master_shard(u, shard.data());
      e.comm().all_gather(shard.data(), whole.data(), shard.size(), DType::kF32);
    }
    out.push_back(std::move(whole));
  }
  return out;
}

// One rank's run: trains, reads back every parameter (a collective in stage 3) and gathers
// the masters. Every rank returns the same values. `eo` places the engine (a CUDA device: the
// trainer then moves its views' values through a device interface of its own on the same
// stream).
inline RunResult train_rank(Communicator& world, const RunSpec& s, EngineOptions eo = {}) {
  RunResult result;
  const Config cfg = make_config(s);
  Mlp mlp(s.dims);
  std::unique_ptr<DiscreteComm> discrete;
  std::shared_ptr<DeviceOps> trainer_device;
  Communicator* comm_ptr = &world;
  if (s.discrete) {
    discrete = std::make_unique<DiscreteComm>(world);
    comm_ptr = discrete.get();
    eo.device_ops = std::make_shared<DiscreteCpuDevice>();
    mlp.device = eo.device_ops.get();
  } else if (eo.device.is_cuda()) {
    DeviceOpsOptions o;
    o.cuda_stream = eo.cuda_stream;
    trainer_device = make_device_ops(eo.device, o);
    mlp.device = trainer_device.get();
  }
  Communicator& comm = *comm_ptr;
  Engine e(comm, cfg, eo);
  mlp.declare(e);
  mlp.init(e, 42);
  for (int step = 0; step < s.steps; ++step) {
    for (int m = 0; m < s.accumulation; ++m) {
      Batch b;
      if (s.data_ranks > 0) {
        std::vector<Batch> parts;
        for (int q = 0; q < s.data_ranks; ++q) {
          parts.push_back(make_batch(mlp.in(), mlp.out(), kRows, step, m, q));
        }
        b = concat(parts);
      } else {
        b = make_batch(mlp.in(), mlp.out(), kRows, step, m, comm.rank());
      }
      result.losses.push_back(mlp.micro_step(e, b));
      const StepResult r = e.step();
      EXPECT_EQ(r.boundary, m + 1 == s.accumulation);
      if (r.boundary) result.steps.push_back(r);
    }
  }
  result.params = read_params(e);
  result.masters = gather_masters(e);
  // Per parameter, by the layout rule (W at 0, b at the next multiple of 32).
  for (std::size_t l = 0; l < result.masters.size(); ++l) {
    const auto& mm = result.masters[l];
    const std::size_t w = static_cast<std::size_t>(s.dims[l + 1] * s.dims[l]);
    const std::size_t b_at = (w + 31) / 32 * 32;
    result.master_params.emplace_back(mm.begin(), mm.begin() + static_cast<long>(w));
    result.master_params.emplace_back(mm.begin() + static_cast<long>(b_at),
                                      mm.begin() + static_cast<long>(b_at) + s.dims[l + 1]);
  }
  return result;
}

// Every rank trains with the in-process communicator; rank 0's result.
inline RunResult train(const RunSpec& s) {
  RunResult result;
  std::mutex mu;
  ThreadGroup::run(s.ranks, [&](Communicator& comm) {
    RunResult mine = train_rank(comm, s);
    if (comm.rank() == 0) {
      std::lock_guard<std::mutex> lock(mu);
      result = std::move(mine);
    }
  });
  return result;
}

// Every rank trains with the in-process communicator; every rank's result, by rank.
inline std::vector<RunResult> train_all(const RunSpec& s) {
  std::vector<RunResult> all(static_cast<std::size_t>(s.ranks));
  std::mutex mu;
  ThreadGroup::run(s.ranks, [&](Communicator& comm) {
    RunResult mine = train_rank(comm, s);
    std::lock_guard<std::mutex> lock(mu);
    all[static_cast<std::size_t>(comm.rank())] = std::move(mine);
  });
  return all;
}

inline std::string describe(const RunSpec& s) {
  return "stage " + std::to_string(s.stage) + ", N=" + std::to_string(s.ranks) + ", " +
         std::string(to_string(s.dtype)) + ", accumulation " + std::to_string(s.accumulation) +
         (s.moment_dtype != "f32" ? ", " + s.moment_dtype + " moments" : std::string()) +
         (s.clip ? ", clipping" : "") + (s.overlap ? ", overlap" : "") +
         (s.reduce_bucket > 0 || s.allgather_bucket > 0
              ? ", buckets " + std::to_string(s.reduce_bucket) + "/" +
                    std::to_string(s.allgather_bucket)
              : std::string()) +
         (s.discrete ? ", discrete device" : "") +
         (s.offload_buffers > 0
              ? ", offload " + s.offload_device + " " + std::to_string(s.offload_buffers) + " x " +
                    std::to_string(s.offload_chunk) + (s.pipeline ? " pipelined" : "") + " aio " +
                    s.aio_engine +
                    (s.offload_ratio != 1.0 ? " ratio " + std::to_string(s.offload_ratio) : "")
              : std::string());
}

// Trains the MLP for 3 steps with `cfg` at n in-process ranks and expects every rank's tracked
// bytes by category (every tier but NVMe, and of it the pinned tier) to equal the planner's
// prediction; `what` names the case.
inline void expect_plan_equals_tracker(const Config& cfg, int n, const std::string& what) {
  const Mlp mlp(kDims);
  PlanInput pin;
  pin.ranks = n;
  pin.config = cfg;
  pin.units = mlp.unit_specs();
  const PlanResult plan = plan_engine_memory(pin);
  EXPECT_EQ(plan.psi, 491u);
  ThreadGroup::run(n, [&](Communicator& comm) {
    Engine e(comm, cfg);
    mlp.declare(e);
    mlp.init(e, 1);
    run_steps(e, mlp, comm.rank(), 3);
    for (std::size_t c = 0; c < kNumMemCategories; ++c) {
      const auto cat = static_cast<MemCategory>(c);
      const MemoryTracker& t = e.tracker();
      EXPECT_EQ(t.current(cat) - t.current(cat, MemTier::kNvme), plan.bytes[c])
          << to_string(cat) << ": " << what;
      EXPECT_EQ(t.current(cat, MemTier::kPinned), plan.pinned[c])
          << to_string(cat) << " (pinned): " << what;
    }
  });
}

}  // namespace zero::testing
