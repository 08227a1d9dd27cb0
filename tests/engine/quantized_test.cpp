// ZeRO++'s quantized collectives in the engine (zero_optimization.zero_quantized_weights: qwZ,
// the stage-3 parameter all-gather in block-wise int8; zero_quantized_gradients: qgZ, the
// gradient reduce-scatter as an all-to-all of int8 chunks reduced in f32): training follows the
// unquantized run within what int8 blocks imply, but not bit for bit (the quantization runs);
// the bytes each collective moves are the packed chunks' (the formula per unit); the staging
// pools are what the planner predicts, alone and with hybrid sharding (whose replica all-reduce
// qgZ quantizes too); every rank ends with the same parameters; the keys mean nothing below
// stage 3 (as in DeepSpeed); bad values are refused naming the key; ZeRO-Offload (cpu and NVMe
// parameter shards) keeps the quantized trajectory bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "common/compare.hpp"
#include "common/expect_error.hpp"
#include "common/mlp_training.hpp"
#include "common/temp_dir.hpp"
#include "zero/comm/comm.hpp"
#include "zero/comm/quantized_comm.hpp"
#include "zero/engine/engine.hpp"

namespace zero::testing {
namespace {

TEST(Quantized, TrainsCloseToUnquantizedButNotBitForBit) {
  struct Case {
    bool qwz, qgz;
    long hybrid;
    int ranks;
    DType dtype;
    int accumulation;
  };
  for (const Case c :
       {Case{true, false, 0, 4, DType::kF32, 1}, Case{false, true, 0, 4, DType::kF32, 1},
        Case{true, true, 0, 4, DType::kF32, 2}, Case{true, true, 0, 3, DType::kBF16, 1},
        Case{true, true, 2, 4, DType::kF32, 1}, Case{true, true, 2, 6, DType::kBF16, 2}}) {
    RunSpec plain;
    plain.stage = 3;
    plain.ranks = c.ranks;
    plain.dtype = c.dtype;
    plain.accumulation = c.accumulation;
    plain.hybrid = c.hybrid;
    plain.clip = true;
    plain.steps = 12;
    RunSpec quant = plain;
    quant.qwz = c.qwz;
    quant.qgz = c.qgz;
    const std::vector<RunResult> a = train_all(plain), b = train_all(quant);
    const std::string what = std::string(c.qwz ? "qwZ " : "") + (c.qgz ? "qgZ " : "") +
                             (c.hybrid > 0 ? "hybrid " + std::to_string(c.hybrid) + " " : "") +
                             "N " + std::to_string(c.ranks) + " " +
                             std::string(to_string(c.dtype)) + " accumulation " +
                             std::to_string(c.accumulation);
    for (std::size_t r = 0; r < b.size(); ++r) {
      EXPECT_TRUE(bitwise_equal(b[r].params, b[0].params)) << what << ": rank " << r;
    }
    // The quantization ran: the parameters differ from the unquantized run's ...
    EXPECT_FALSE(bitwise_equal(b[0].params, a[0].params)) << what;
    // ... by little next to how far training moved them: Adam's normalised step moves an element
    // whose gradient is near zero by up to lr either way, whatever perturbs that gradient, so
    // single elements may differ by several steps' worth; the bulk must not.
    RunSpec start = plain;
    start.steps = 0;
    const double moved = rms_diff(a[0].params, train(start).params);
    const double d = rms_diff(b[0].params, a[0].params);
    EXPECT_LE(d, 0.05 * moved) << what << ": rms difference " << d << ", rms movement " << moved;
    const double la = a[0].losses.back(), lb = b[0].losses.back();
    EXPECT_LE(std::fabs(lb - la), 0.02 * std::fabs(la))
        << what << ": final loss " << lb << " vs " << la;
    std::printf(
        "%s: rms param diff %.3g (%.1f%% of the rms movement %.3g), max %.3g, final loss "
        "%.6f vs %.6f\n",
        what.c_str(), d, 100 * d / moved, moved, max_abs_diff(b[0].params, a[0].params), lb, la);
  }
}

// On a device the host cannot address (the discrete CPU device, as a GPU is to the engine) the
// staging and read-back run through DeviceOps alone: the same bits as on the host.
TEST(Quantized, ADiscreteDeviceGivesTheHostsBits) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    RunSpec s;
    s.stage = 3;
    s.ranks = 2;
    s.dtype = dt;
    s.qwz = s.qgz = true;
    s.steps = 4;
    RunSpec d = s;
    d.discrete = true;
    const RunResult host = train(s), discrete = train(d);
    EXPECT_TRUE(bitwise_equal(discrete.params, host.params)) << to_string(dt);
    EXPECT_TRUE(bitwise_equal(discrete.masters, host.masters)) << to_string(dt);
  }
}

TEST(Quantized, CollectivesMoveThePackedChunks) {
  const int n = 4;
  ThreadGroup::run(n, [&](Communicator& comm) {
    RunSpec s;
    s.stage = 3;
    s.ranks = n;
    s.qwz = true;
    s.qgz = true;
    s.quant_block = 64;
    Engine e(comm, make_config(s));
    Mlp mlp(kDims);
    mlp.declare(e);
    mlp.init(e, 1);
    mlp.micro_step(e, make_batch(mlp.in(), mlp.out(), kRows, 0, 0, comm.rank()));
    e.step();  // the first step records the gather order; the second prefetches
    comm.reset_stats();
    mlp.micro_step(e, make_batch(mlp.in(), mlp.out(), kRows, 1, 0, comm.rank()));
    e.step();
    const CommStats st = comm.stats();
    std::uint64_t gathers = 0, reduces = 0;
    for (UnitId u = 0; u < e.num_units(); ++u) {
      const std::uint64_t chunk = QuantizedChunk{e.unit_shard_numel(u), 64}.bytes();
      gathers += 2 * (n - 1) * chunk;  // forward and backward
      reduces += (n - 1) * chunk;
    }
    EXPECT_EQ(st[Collective::kAllToAll].bytes_sent, reduces);
    EXPECT_EQ(st[Collective::kReduceScatter].calls, 0u);
    // The gradient-norm all-gather (4 floats per rank) rides along.
    EXPECT_EQ(st[Collective::kAllGather].bytes_sent, gathers + (n - 1) * 16u);
  });
}

// With ZeRO-Offload (the optimizer, and the parameter shards in pinned host memory or NVMe files)
// the reduced shards go to the host partition and the gathers start from the offloaded shards
// (NVMe: a prefetch reads the shard, its quantized all-gather launches at the next gather): the
// same quantized trajectory as without offload, bit for bit, and the planner still equals the
// tracker (also prefetching one unit ahead).
TEST(Quantized, OffloadKeepsTheQuantizedTrajectory) {
  const testing::TempDir tmp;
  const std::string swap = tmp.path();
  for (const char* param : {"cpu", "nvme"}) {
    for (bool discrete : {false, true}) {
      RunSpec s;
      s.stage = 3;
      s.ranks = 2;
      s.qwz = s.qgz = true;
      s.steps = 4;
      s.discrete = discrete;
      RunSpec off = s;
      off.offload_buffers = 2;
      off.offload_chunk = 100;
      off.offload_param = param;
      off.offload_device = param;
      off.nvme_path = swap;
      const std::string what = std::string(param) + (discrete ? " discrete" : " host");
      const RunResult a = train(s), b = train(off);
      EXPECT_TRUE(bitwise_equal(b.params, a.params)) << what;
      EXPECT_TRUE(bitwise_equal(b.masters, a.masters)) << what;
      if (!discrete) {
        Config cfg = make_config(off);
        expect_plan_equals_tracker(cfg, off.ranks, "qwZ qgZ offload " + what);
        cfg.zero_optimization.stage3_prefetch_bucket_size = 1;  // one unit ahead
        expect_plan_equals_tracker(cfg, off.ranks, "qwZ qgZ offload " + what + ", prefetch 1");
      }
    }
  }
}

TEST(Quantized, StagingPoolsAreWhatThePlannerPredicts) {
  for (bool qwz : {false, true}) {
    for (bool qgz : {false, true}) {
      for (long hybrid : {0L, 2L}) {
        for (bool overlap : {false, true}) {
          for (long bucket : {0L, 400L}) {
            for (DType dt : {DType::kF32, DType::kBF16}) {
              RunSpec s;
              s.stage = 3;
              s.ranks = 4;
              s.dtype = dt;
              s.qwz = qwz;
              s.qgz = qgz;
              s.hybrid = hybrid;
              s.overlap = overlap;
              s.reduce_bucket = bucket;
              expect_plan_equals_tracker(
                  make_config(s), s.ranks,
                  std::string(qwz ? "qwZ " : "") + (qgz ? "qgZ " : "") + "hybrid " +
                      std::to_string(hybrid) + (overlap ? " overlap" : "") + " bucket " +
                      std::to_string(bucket) + " " + std::string(to_string(dt)));
            }
          }
        }
      }
    }
  }
}

TEST(Quantized, KeysBelowStage3HaveNoEffectAndBadValuesAreRefused) {
  RunSpec s;
  s.stage = 2;
  s.ranks = 2;
  s.steps = 3;
  RunSpec q = s;
  q.qwz = q.qgz = true;
  EXPECT_TRUE(bitwise_equal(train(q).params, train(s).params));  // DeepSpeed: stage 3 only
  expect_error(
      [] {
        parse_config(
            R"({"zero_optimization": {"stage": 3, "zero_quantized_weights": true,
                "quantization_block_size": 0}})");
      },
      ErrorCode::kConfig, "quantization_block_size");
  expect_error([] { parse_config(R"({"zero_optimization": {"zero_quantized_weights": 1}})"); },
               ErrorCode::kConfig, "zero_quantized_weights");
}

}  // namespace
}  // namespace zero::testing
