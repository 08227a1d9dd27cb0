// Frozen ranges in attach mode (EngineOptions::attach_frozen): the LoRA-like model of
// tests/common/lora_training.hpp laid out in one flat buffer by a trainer, as an llm.c-style
// trainer lays out its tensors — each unit's parameters consecutive, each unit starting on the
// attach grid (attach_granularity(N)), the frozen base units declared as element ranges.
//
// What it shows, in-process ranks (ThreadGroup), stages 0-2 (attach mode's), N = 1..4, f32 and
// bf16:
//  - the frozen ranges are bitwise unchanged after training, and the whole buffer is bitwise the
//    managed engine's run of the same model with ParamSpec::trainable = false on the base
//    (engine_frozen_test's run, itself checked against an all-trainable run with lr 0 on the
//    base); the adapters train;
//  - the reduction moves the trainable elements only (the communicator's bytes), and the
//    tracker's gradient / master / state bytes are the trainable elements' (what the managed
//    run holds), where the same buffer without frozen ranges holds every element's;
//  - bad ranges are errors naming the range: outside the buffer, a boundary off the grid (with the
//    grid and the nearest boundaries), and attach_groups outside the buffer;
//  - the units the frozen ranges cut are what a partial optimizer offload (offload_optimizer.ratio)
//    splits: the trailing adapters' state pinned, the leading ones' on the device, the buffer
//    bitwise the run without offload (stages 1-2, the gradients whole on the device).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "common/bitwise.hpp"
#include "common/expect_error.hpp"
#include "common/lora_training.hpp"
#include "common/temp_dir.hpp"
#include "zero/comm/comm.hpp"
#include "zero/config/config.hpp"
#include "zero/engine/engine.hpp"

namespace zero {
namespace {

using namespace zero::testing;  // NOLINT: the model's helpers

// Where the trainer puts each unit of the LoRA-like model in its flat buffer: unit u's
// parameters consecutive from offset[u], each unit starting on the grid (the managed engine's
// padded units, as a trainer would lay them out).
struct FlatLayout {
  std::vector<std::size_t> offset;  // per unit; offset.back() after the last: numel
  std::size_t numel = 0;
};

FlatLayout flat_layout(const std::vector<UnitSpec>& units, int ranks) {
  const std::size_t grid = attach_granularity(ranks);
  FlatLayout l;
  std::size_t at = 0;
  for (const UnitSpec& u : units) {
    at = (at + grid - 1) / grid * grid;
    l.offset.push_back(at);
    for (const ParamSpec& p : u.params) at += p.numel();
  }
  l.numel = at;
  return l;
}

// The concatenation of the model's parameters (lora_training.hpp's order) out of the buffer.
template <typename T>
std::vector<float> concat(const std::vector<UnitSpec>& units, const FlatLayout& l,
                          const std::vector<T>& buf, DType w) {
  std::vector<float> out(total_params(units));
  std::size_t at = 0;
  for (std::size_t u = 0; u < units.size(); ++u) {
    std::size_t n = 0;
    for (const ParamSpec& p : units[u].params) n += p.numel();
    convert(buf.data() + l.offset[u], w, out.data() + at, DType::kF32, n);
    at += n;
  }
  return out;
}

// Trains through attach mode; `frozen`: the base units' tiles declared frozen (up to the next
// unit's start), else the buffer is one trainable unit whose base gradients are dropped to zero
// by the trainer. Returns the parameters; inspect(engine) runs after every step.
template <typename T, typename Inspect>
std::vector<float> train_attached(Communicator& comm, const Config& cfg, bool frozen, int steps,
                                  Inspect&& inspect) {
  const std::vector<UnitSpec> units = lora_units(true);
  const FlatLayout l = flat_layout(units, comm.size());
  const DType w = cfg.bf16.enabled ? DType::kBF16 : DType::kF32;
  const std::size_t cap = attach_capacity(l.numel, comm.size());
  std::vector<T> params(cap, T{}), grads(cap, T{});
  const std::vector<float> init = initial_params(total_params(units));
  EngineOptions opts;
  std::size_t at = 0;
  for (std::size_t u = 0; u < units.size(); ++u) {
    std::size_t n = 0;
    for (const ParamSpec& p : units[u].params) n += p.numel();
    convert(init.data() + at, DType::kF32, params.data() + l.offset[u], w, n);
    at += n;
    const std::size_t end = u + 1 < units.size() ? l.offset[u + 1] : l.numel;
    if (frozen && is_base(u)) opts.attach_frozen.push_back({l.offset[u], end});
  }
  auto e = Engine::attach(comm, cfg, params.data(), grads.data(), l.numel, cap, w, opts);
  // Every step() call a micro-step (gradient_accumulation_steps of them per update).
  for (int step = 0; step < steps * static_cast<int>(cfg.gradient_accumulation_steps); ++step) {
    const std::vector<float> theta = concat(units, l, params, w);
    const std::vector<float> g = trainer_grad(step, comm.rank(), theta);
    std::fill(grads.begin(), grads.end(), T{});
    at = 0;
    for (std::size_t u = 0; u < units.size(); ++u) {
      std::size_t n = 0;
      for (const ParamSpec& p : units[u].params) n += p.numel();
      // The trainer computes no gradient for the frozen base (zero in the buffer).
      if (!is_base(u)) convert(g.data() + at, DType::kF32, grads.data() + l.offset[u], w, n);
      at += n;
    }
    e->step();
    inspect(*e);
  }
  return concat(units, l, params, w);
}

// The managed engine's run of the same model, the base frozen (engine_frozen_test's).
std::vector<float> train_managed(Communicator& comm, const Config& cfg, int steps) {
  const std::vector<UnitSpec> units = lora_units(true);
  Engine e(comm, cfg);
  declare(e, units, initial_params(total_params(units)));
  for (int step = 0; step < steps * static_cast<int>(cfg.gradient_accumulation_steps); ++step) {
    train_step(e, units, step, /*reference=*/false);
  }
  return read_all(e, units);
}

using testing::same_bits;

TEST(AttachFrozen, FrozenRangesUnchangedBufferBitwiseTheManagedFrozenRun) {
  const std::vector<UnitSpec> units = lora_units(true);
  std::vector<bool> frozen(total_params(units), false);
  for_each_param(units, [&](UnitId u, int, std::size_t at, std::size_t n) {
    if (is_base(static_cast<std::size_t>(u)))
      std::fill_n(frozen.begin() + static_cast<long>(at), n, true);
  });
  int runs = 0;
  for (bool bf16 : {false, true}) {
    for (int ranks : {1, 2, 3, 4}) {
      for (int stage : {0, 1, 2}) {
        const Config cfg = config_for(stage, bf16);
        const std::string what = std::string(bf16 ? "bf16" : "f32") + " stage " +
                                 std::to_string(stage) + " N=" + std::to_string(ranks);
        std::vector<float> got, managed, start;
        std::mutex mu;
        ThreadGroup::run(ranks, [&](Communicator& comm) {
          std::vector<float> a =
              bf16 ? train_attached<std::uint16_t>(comm, cfg, true, kSteps, [](Engine&) {})
                   : train_attached<float>(comm, cfg, true, kSteps, [](Engine&) {});
          std::vector<float> m = train_managed(comm, cfg, kSteps);
          std::vector<float> s =
              bf16 ? train_attached<std::uint16_t>(comm, cfg, true, 0, [](Engine&) {})
                   : train_attached<float>(comm, cfg, true, 0, [](Engine&) {});
          if (comm.rank() == 0) {
            std::lock_guard<std::mutex> lock(mu);
            got = std::move(a);
            managed = std::move(m);
            start = std::move(s);
          }
        });
        ASSERT_EQ(got.size(), frozen.size()) << what;
        std::size_t moved = 0, frozen_bad = 0, managed_bad = 0;
        for (std::size_t j = 0; j < got.size(); ++j) {
          if (frozen[j]) {
            frozen_bad += same_bits(got[j], start[j]) ? 0 : 1;
          } else {
            moved += got[j] != start[j] ? 1 : 0;
          }
          managed_bad += same_bits(got[j], managed[j]) ? 0 : 1;
        }
        EXPECT_EQ(frozen_bad, 0u) << what << ": frozen ranges changed";
        EXPECT_GT(moved, 0u) << what << ": the adapters did not train";
        EXPECT_EQ(managed_bad, 0u) << what << ": not bitwise the managed frozen run";
        ++runs;
      }
    }
  }
  std::printf("attach frozen: %d runs, frozen ranges bitwise unchanged, bitwise the managed run\n",
              runs);
}

// Accumulation (the engine's own R-typed accumulation of the trainable units) and the
// optimizer offloaded to host memory and to NVMe: still bitwise the managed frozen run.
TEST(AttachFrozen, WithAccumulationAndOffloadBitwiseTheManagedRun) {
  const testing::TempDir swap;
  struct Case {
    int stage, accumulation;
    OffloadDevice offload;
  };
  for (const Case& c : {Case{1, 3, OffloadDevice::kNone}, Case{2, 2, OffloadDevice::kCpu},
                        Case{1, 1, OffloadDevice::kNvme}, Case{2, 3, OffloadDevice::kNvme}}) {
    for (int ranks : {2, 3}) {
      Config cfg = config_for(c.stage, /*bf16=*/true);
      cfg.gradient_accumulation_steps = c.accumulation;
      cfg.zero_optimization.offload_optimizer.device = c.offload;
      cfg.zero_optimization.offload_optimizer.nvme_path = swap.path();
      const std::string what =
          "stage " + std::to_string(c.stage) + " A=" + std::to_string(c.accumulation) +
          " offload " + std::to_string(static_cast<int>(c.offload)) + " N=" + std::to_string(ranks);
      std::vector<float> got, managed;
      std::mutex mu;
      ThreadGroup::run(ranks, [&](Communicator& comm) {
        std::vector<float> a =
            train_attached<std::uint16_t>(comm, cfg, true, kSteps, [](Engine&) {});
        std::vector<float> m = train_managed(comm, cfg, kSteps);
        if (comm.rank() == 0) {
          std::lock_guard<std::mutex> lock(mu);
          got = std::move(a);
          managed = std::move(m);
        }
      });
      ASSERT_EQ(got.size(), managed.size()) << what;
      std::size_t bad = 0;
      for (std::size_t j = 0; j < got.size(); ++j) bad += same_bits(got[j], managed[j]) ? 0 : 1;
      EXPECT_EQ(bad, 0u) << what << ": not bitwise the managed frozen run";
    }
  }
}

std::size_t bytes(const MemoryTracker& t, MemCategory c) {
  return t.current(c) - t.current(c, MemTier::kNvme);
}

// N = 4, bf16 (so a separate f32 master): bytes the reduction sends over one step, and what the
// tracker holds, with the frozen ranges against the same buffer all trainable.
TEST(AttachFrozen, ReductionAndStateHoldTheTrainableElementsOnly) {
  constexpr int kN = 4;
  const std::vector<UnitSpec> units = lora_units(true);
  const FlatLayout l = flat_layout(units, kN);
  const std::size_t cap = attach_capacity(l.numel, kN);
  std::size_t trainable_padded = 0;  // the adapter units' tiles
  for (std::size_t u = 1; u < units.size(); u += 2) {
    const std::size_t end = u + 1 < units.size() ? l.offset[u + 1] : cap;
    trainable_padded += end - l.offset[u];
  }
  std::printf("attach, LoRA-like buffer of %zu elements (%zu in the adapters' tiles), bf16, N=%d\n",
              cap, trainable_padded, kN);
  std::printf("%-6s %-13s %12s %10s %10s %10s\n", "stage", "buffer", "reduce sent", "gradients",
              "master", "state");
  for (int stage : {0, 1, 2}) {
    const Config cfg = config_for(stage, /*bf16=*/true);
    for (bool frozen : {false, true}) {
      std::mutex mu;
      ThreadGroup::run(kN, [&](Communicator& comm) {
        CommStats before = comm.stats();
        int seen = 0;
        train_attached<std::uint16_t>(comm, cfg, frozen, 2, [&](Engine& e) {
          if (++seen == 1) {  // the second step is measured (the first includes set-up)
            before = comm.stats();
            return;
          }
          const CommStats after = comm.stats();
          auto sent = [&](Collective c) { return after[c].bytes_sent - before[c].bytes_sent; };
          const std::uint64_t n = kN, elems = frozen ? trainable_padded : cap;
          const std::string what =
              std::string(frozen ? "frozen" : "all-trainable") + " stage " + std::to_string(stage);
          const std::uint64_t reduce =
              sent(Collective::kAllReduce) + sent(Collective::kReduceScatter);
          // f32 reduction: stage 0's all-reduce 2 (N-1)/N, stages 1-2's reduce-scatter (N-1)/N.
          EXPECT_EQ(reduce, stage == 0 ? 2 * (n - 1) * elems * 4 / n : (n - 1) * elems * 4 / n)
              << what;
          const MemoryTracker& t = e.tracker();
          const std::uint64_t step = stage == 0 ? elems : elems / n;
          EXPECT_EQ(bytes(t, MemCategory::kMasterParams), step * 4) << what;
          EXPECT_EQ(bytes(t, MemCategory::kOptimizerState), 2 * step * 4) << what;
          // The engine's accumulation (W != R here: none only where the trainer's buffer is
          // reduced in place) holds the trainable elements whole, in R = f32: attach mode's
          // stage 2 keeps whole gradients (the trainer owns them).
          EXPECT_EQ(bytes(t, MemCategory::kGradients) - e.buffer_bytes().in_flight_grads, elems * 4)
              << what;
          if (comm.rank() == 0) {
            std::lock_guard<std::mutex> lock(mu);
            std::printf("%-6d %-13s %12llu %10zu %10zu %10zu\n", stage,
                        frozen ? "base frozen" : "all-trainable",
                        static_cast<unsigned long long>(reduce), bytes(t, MemCategory::kGradients),
                        bytes(t, MemCategory::kMasterParams),
                        bytes(t, MemCategory::kOptimizerState));
          }
        });
      });
    }
  }
}

TEST(AttachFrozen, PartialOptimizerOffloadSplitsTheAttachedUnitsBitwise) {
  for (bool bf16 : {false, true}) {
    for (int stage : {1, 2}) {
      const Config cfg = config_for(stage, bf16);
      std::vector<float> ref;
      ThreadGroup::run(2, [&](Communicator& comm) {
        std::vector<float> a =
            bf16 ? train_attached<std::uint16_t>(comm, cfg, true, kSteps, [](Engine&) {})
                 : train_attached<float>(comm, cfg, true, kSteps, [](Engine&) {});
        if (comm.rank() == 0) ref = std::move(a);
      });
      std::size_t last_pinned = 0;
      for (double ratio : {0.0, 0.25, 0.5, 1.0}) {
        Config off = cfg;
        off.zero_optimization.offload_optimizer.device = OffloadDevice::kCpu;
        off.zero_optimization.offload_optimizer.ratio = ratio;
        off.zero_optimization.offload_optimizer.buffer_count = 2;
        off.zero_optimization.offload_optimizer.buffer_size = 7;
        const std::string what = std::string(bf16 ? "bf16" : "f32") + " stage " +
                                 std::to_string(stage) + " ratio " + std::to_string(ratio);
        std::vector<float> got;
        std::size_t pinned = 0, on_device = 0;
        ThreadGroup::run(2, [&](Communicator& comm) {
          std::vector<float> a;
          auto seen = [&](Engine& e) {  // rank 0's tiers (both ranks writing them would race)
            if (comm.rank() != 0) return;
            pinned = e.tracker().current(MemCategory::kOptimizerState, MemTier::kPinned);
            on_device = e.tracker().current(MemCategory::kOptimizerState) - pinned;
          };
          a = bf16 ? train_attached<std::uint16_t>(comm, off, true, kSteps, seen)
                   : train_attached<float>(comm, off, true, kSteps, seen);
          if (comm.rank() == 0) got = std::move(a);
        });
        ASSERT_EQ(got.size(), ref.size()) << what;
        for (std::size_t i = 0; i < ref.size(); ++i) {
          ASSERT_TRUE(same_bits(got[i], ref[i])) << what << ": element " << i;
        }
        // The state moves to the pinned tier unit by unit as the ratio grows: none at 0, all at 1.
        if (ratio == 0.0) {
          EXPECT_EQ(pinned, 0u) << what;
        }
        if (ratio == 1.0) {
          EXPECT_EQ(on_device, 0u) << what;
        }
        if (ratio == 0.5) {
          EXPECT_GT(on_device, 0u) << what;
        }
        EXPECT_GE(pinned, last_pinned) << what;
        if (ratio > 0.0) {
          EXPECT_GT(pinned, 0u) << what;
        }
        last_pinned = pinned;
      }
    }
  }
}

TEST(AttachFrozen, BadRangesAreErrorsNamingThem) {
  ThreadGroup::run(2, [](Communicator& comm) {
    const Config cfg = config_for(1, false);
    constexpr std::size_t kNumel = 1000;
    std::vector<float> p(attach_capacity(kNumel, 2)), g(p.size());
    auto attach_with = [&](std::vector<EngineOptions::ElementRange> frozen) {
      EngineOptions o;
      o.attach_frozen = std::move(frozen);
      return Engine::attach(comm, cfg, p.data(), g.data(), kNumel, p.size(), DType::kF32, o);
    };
    testing::expect_error(
        [&] {
          attach_with({{0, 64}, {960, 1001}});
        },
        ErrorCode::kInvalidArgument,
        "EngineOptions::attach_frozen[1] = [960, 1001) is empty or outside the "
        "buffer's 1000 elements");
    testing::expect_error(
        [&] {
          attach_with({{64, 64}});
        },
        ErrorCode::kInvalidArgument, "attach_frozen[0] = [64, 64) is empty");
    testing::expect_error(
        [&] {
          attach_with({{64, 100}});
        },
        ErrorCode::kInvalidArgument,
        "attach_frozen[0] = [64, 100): boundary 100 is not a multiple of 64 "
        "(2 ranks x alignment 32)");
    testing::expect_error(
        [&] {
          attach_with({{64, 100}});
        },
        ErrorCode::kInvalidArgument, "(nearest boundaries 64 and 128)");
    EngineOptions o;
    o.attach_frozen = {{0, 64}};
    o.attach_groups = {{900, 1200, 0}};
    testing::expect_error(
        [&] { Engine::attach(comm, cfg, p.data(), g.data(), kNumel, p.size(), DType::kF32, o); },
        ErrorCode::kInvalidArgument,
        "attach_groups[0]: the flat buffer's element range [900, 1200) is empty or outside its "
        "1000 elements");
    // On the grid, or up to the buffer's end, overlapping: accepted and merged.
    auto e = attach_with({{64, 256}, {128, 384}, {960, 1000}});
    EXPECT_EQ(e->num_units(), 4);
    EXPECT_EQ(e->unit(1).name, "attached[64:384]");
    EXPECT_FALSE(e->unit(1).params[0].trainable);
    EXPECT_TRUE(e->unit(2).params[0].trainable);
  });
}

}  // namespace
}  // namespace zero
