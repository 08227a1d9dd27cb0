// The offloaded step during backward (zero_optimization.offload_optimizer.overlap_step): each
// offloaded unit's step starts on a worker when its reduced gradient shard lands in host memory
// during the boundary micro-step's backward, with clip coefficient 1; the end of backward commits
// it or redoes it. Checked here against the same run without the key, bitwise (parameters, fp32
// masters and both optimizer states of every unit): stages 2 and 3, offload cpu and nvme, f32
// and int8 moments, a partial ratio, bf16 and fp16 working parameters, accumulation 2; clipping
// enabled but never engaging (every step committed), clipping engaging at one chosen step (that
// step's speculative units all redone, the others committed), an fp16 overflow at one chosen
// step (skipped, nothing committed, the state as before). The metrics count the units; the
// timeline shows the speculative chunks. Planner == tracker with the key on (the pinned window,
// the NVMe file's second slots), and the configurations refused.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/mlp_model.hpp"
#include "common/mlp_training.hpp"
#include "offload/io_fixtures.hpp"
#include "zero/comm/comm.hpp"
#include "zero/config/config.hpp"
#include "zero/core/error.hpp"
#include "zero/core/trace.hpp"
#include "zero/engine/engine.hpp"
#include "zero/engine/plan.hpp"
#include "zero/optim/optimizer.hpp"

namespace zero {
namespace {

using testing::bitwise_equal;
using testing::describe;
using testing::gather_masters;
using testing::kRows;
using testing::make_batch;
using testing::make_config;
using testing::Mlp;
using testing::read_params;
using testing::RunSpec;
using testing::TempDir;

constexpr int kSteps = 6;

// What a run leaves: rank 0's view of every parameter, the masters, the states, and per step
// the result and the speculative chunks the timeline recorded.
struct Out {
  testing::Tensors params, masters;
  std::vector<std::vector<char>> states;  // rank 0's, per (unit, state)
  std::vector<StepResult> steps;
  std::size_t speculative_regions = 0;
};

// Trains kSteps steps. At the boundary micro-step of step `clip_step` gradient clipping is set
// so low that it engages; at the others to `clip_other` (0: off; large: enabled, never
// engaging). At step `overflow_step` an overflow is written into unit 0's gradient (fp16).
Out run(const RunSpec& s, int clip_step = -1, int overflow_step = -1, double clip_other = 0.0) {
  Out out;
  std::mutex mu;
  const Config cfg = make_config(s);
  ThreadGroup::run(s.ranks, [&](Communicator& comm) {
    Tracer tracer(comm.rank(), 1 << 16);
    EngineOptions eo;
    eo.tracer = &tracer;
    Mlp mlp(s.dims);
    // The discrete test device: its memory the host cannot address (the commit's parameters
    // then go out through the device's copies).
    std::unique_ptr<testing::DiscreteComm> discrete;
    if (s.discrete) {
      discrete = std::make_unique<testing::DiscreteComm>(comm);
      eo.device_ops = std::make_shared<testing::DiscreteCpuDevice>();
      mlp.device = eo.device_ops.get();
    }
    Engine e(s.discrete ? *discrete : comm, cfg, eo);
    mlp.declare(e);
    mlp.init(e, 42);
    std::vector<StepResult> steps;
    for (int step = 0; step < kSteps; ++step) {
      for (int m = 0; m < s.accumulation; ++m) {
        const bool boundary = m + 1 == s.accumulation;
        if (boundary) e.set_gradient_clipping(step == clip_step ? 1e-4 : clip_other);
        mlp.micro_step(e, make_batch(mlp.in(), mlp.out(), kRows, step, m, comm.rank()),
                       /*inject_overflow=*/boundary && step == overflow_step);
        const StepResult r = e.step();
        if (!r.boundary) {
          // Only the boundary micro-step speculates.
          EXPECT_EQ(r.metrics.speculated_units, 0) << describe(s);
          continue;
        }
        steps.push_back(r);
      }
    }
    Out mine;
    mine.steps = std::move(steps);
    mine.params = read_params(e);
    mine.masters = gather_masters(e);
    const OptimizerParams& op = e.optimizer_params();
    for (UnitId u = 0; u < e.num_units(); ++u) {
      for (int k = 0; k < op.num_states(); ++k) {
        std::vector<char> st(state_bytes(op.state_dtype(), e.unit_step_numel(u)));
        e.copy_state_shard(u, k, st.data());
        mine.states.push_back(std::move(st));
      }
    }
    for (const TraceEvent& ev : tracer.events()) {
      if (ev.lane == TraceLane::kOptimizer &&
          std::string(ev.name) == "optimizer chunk (speculative)") {
        ++mine.speculative_regions;
      }
    }
    if (comm.rank() == 0) {
      std::lock_guard<std::mutex> lock(mu);
      out = std::move(mine);
    }
  });
  return out;
}

void expect_same(const Out& on, const Out& off, const std::string& what) {
  EXPECT_TRUE(bitwise_equal(on.params, off.params)) << "parameters: " << what;
  EXPECT_TRUE(bitwise_equal(on.masters, off.masters)) << "masters: " << what;
  ASSERT_EQ(on.states.size(), off.states.size()) << what;
  for (std::size_t i = 0; i < on.states.size(); ++i) {
    EXPECT_TRUE(on.states[i] == off.states[i]) << "state " << i << ": " << what;
  }
  ASSERT_EQ(on.steps.size(), off.steps.size()) << what;
  for (std::size_t t = 0; t < on.steps.size(); ++t) {
    EXPECT_EQ(on.steps[t].applied, off.steps[t].applied) << "step " << t << ": " << what;
    EXPECT_EQ(on.steps[t].clip_coef, off.steps[t].clip_coef) << "step " << t << ": " << what;
    EXPECT_EQ(on.steps[t].grad_norm, off.steps[t].grad_norm) << "step " << t << ": " << what;
    EXPECT_EQ(off.steps[t].metrics.speculated_units, 0) << "step " << t << ": " << what;
  }
}

// The MLP's three units at N = 2 step 64, 160 and 96 elements; with int8 moments 256 each (padded
// to whole quantization blocks). Ratio 0.5 offloads the trailing units closest to half: 96 of 320
// (one unit); with int8 256 or 512 of 768, equally close, so the larger part (two units). With cpu
// those are off the device; with nvme in the file, the others pinned (all offloaded).
int offloaded_units(const RunSpec& s) {
  if (s.offload_device == "nvme" || s.offload_ratio == 1.0) return 3;
  return s.moment_dtype == "int8" ? 2 : 1;
}
struct Case {
  int stage;
  std::string device;
  std::string moments;
  DType dtype;
  int accumulation;
  double ratio;
  bool discrete = false;
  // overlap_comm: reductions left in flight by grads_ready, landing later (the last ones in
  // step()'s end of the micro-step); hybrid: 4 ranks in groups of 2, the replicas' all-reduce
  // landing the shards.
  bool overlap_comm = false;
  bool hybrid = false;
};

RunSpec spec_of(const Case& c, const std::string& nvme_path, bool overlap_step) {
  RunSpec s;
  s.stage = c.stage;
  s.ranks = c.hybrid ? 4 : 2;
  s.hybrid = c.hybrid ? 2 : 0;
  s.overlap = c.overlap_comm;
  s.dtype = c.dtype;
  s.accumulation = c.accumulation;
  s.steps = kSteps;
  s.offload_buffers = 2;
  // int8 moments: a chunk is a whole number of 2048-element blocks (one chunk per unit here);
  // f32: chunks of 64, so the window of 2 holds only some of them.
  s.offload_chunk = 64;
  s.offload_device = c.device;
  s.nvme_path = nvme_path;
  s.offload_ratio = c.ratio;
  s.moment_dtype = c.moments;
  s.overlap_step = overlap_step;
  s.discrete = c.discrete;
  return s;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int stage : {2, 3}) {
    for (const char* device : {"cpu", "nvme"}) {
      for (const char* moments : {"f32", "int8"}) {
        out.push_back({stage, device, moments, DType::kF32, 1, 1.0});
      }
    }
  }
  out.push_back({3, "nvme", "f32", DType::kF32, 1, 0.5});  // NVMe + pinned, both speculated
  out.push_back({2, "cpu", "f32", DType::kF32, 1, 0.5});   // cpu: the device keeps the rest
  out.push_back({3, "cpu", "int8", DType::kF32, 1, 0.5});
  out.push_back({3, "nvme", "f32", DType::kBF16, 2, 1.0});
  out.push_back({2, "cpu", "int8", DType::kBF16, 2, 1.0});
  out.push_back({2, "cpu", "f32", DType::kBF16, 1, 1.0, /*discrete=*/true});
  out.push_back({3, "nvme", "int8", DType::kBF16, 2, 0.5, /*discrete=*/true});
  out.push_back({3, "nvme", "f32", DType::kBF16, 1, 1.0, false, /*overlap_comm=*/true});
  out.push_back({2, "cpu", "f32", DType::kF32, 2, 1.0, false, /*overlap_comm=*/true});
  out.push_back({3, "nvme", "f32", DType::kF32, 1, 1.0, false, true, /*hybrid=*/true});
  return out;
}

std::string name(const Case& c) {
  return "stage " + std::to_string(c.stage) + ", " + c.device + ", " + c.moments + " moments, " +
         std::string(to_string(c.dtype)) + ", A=" + std::to_string(c.accumulation) + ", ratio " +
         std::to_string(c.ratio) + (c.discrete ? ", discrete device" : "") +
         (c.overlap_comm ? ", overlap_comm" : "") + (c.hybrid ? ", hybrid 2 x 2" : "");
}

// Clipping enabled at every step, never engaging: every step's speculative units committed.
TEST(OverlapStep, BitwiseWhenClippingNeverEngages) {
  for (const Case& c : cases()) {
    TempDir dir_on, dir_off;
    const RunSpec on = spec_of(c, dir_on.path(), true), off = spec_of(c, dir_off.path(), false);
    const std::string what = name(c);
    const Out a = run(on, -1, -1, 1e6), b = run(off, -1, -1, 1e6);
    expect_same(a, b, what);
    const int units = offloaded_units(on);
    int speculated = 0;
    for (std::size_t t = 0; t < a.steps.size(); ++t) {
      const StepMetrics& m = a.steps[t].metrics;
      EXPECT_TRUE(a.steps[t].applied) << what;
      EXPECT_EQ(a.steps[t].clip_coef, 1.0) << what;
      EXPECT_EQ(m.redone_units, 0) << "step " << t << ": " << what;
      EXPECT_LE(m.speculated_units, units) << "step " << t << ": " << what;
      // The first step's NVMe file does not exist before it: nothing of it is speculated.
      const bool nvme_only = c.device == "nvme" && c.ratio == 1.0;
      if (t > 0 || !nvme_only) {
        EXPECT_GT(m.speculated_units, 0) << "step " << t << ": " << what;
      }
      if (t == 0 && nvme_only) {
        EXPECT_EQ(m.speculated_units, 0) << what;
      }
      // NVMe units have no window: every one is speculated once the file exists.
      if (t > 0 && c.device == "nvme" && c.ratio == 1.0) {
        EXPECT_EQ(m.speculated_units, units) << "step " << t << ": " << what;
      }
      speculated += m.speculated_units;
    }
    EXPECT_GT(a.speculative_regions, 0u) << what;
    EXPECT_GE(a.speculative_regions, static_cast<std::size_t>(speculated)) << what;
    EXPECT_EQ(b.speculative_regions, 0u) << what;
  }
}

// Clipping engages at step 3 only: that step redoes every speculative unit; the others commit.
TEST(OverlapStep, BitwiseWhenClippingEngagesAtAChosenStep) {
  constexpr int kClipStep = 3;
  for (const Case& c : cases()) {
    TempDir dir_on, dir_off;
    const RunSpec on = spec_of(c, dir_on.path(), true), off = spec_of(c, dir_off.path(), false);
    const std::string what = name(c);
    const Out a = run(on, kClipStep), b = run(off, kClipStep);
    expect_same(a, b, what);
    for (std::size_t t = 0; t < a.steps.size(); ++t) {
      const StepMetrics& m = a.steps[t].metrics;
      EXPECT_TRUE(a.steps[t].applied) << what;
      if (static_cast<int>(t) == kClipStep) {
        EXPECT_LT(a.steps[t].clip_coef, 1.0) << what;
        EXPECT_GT(m.speculated_units, 0) << what;
        EXPECT_EQ(m.redone_units, m.speculated_units) << what;
      } else {
        EXPECT_EQ(a.steps[t].clip_coef, 1.0) << what;
        EXPECT_EQ(m.redone_units, 0) << "step " << t << ": " << what;
      }
    }
  }
}

// An fp16 overflow at step 2: the step is skipped with the key as without it; its speculative
// units are neither committed nor redone, and the next steps go on bitwise alike.
TEST(OverlapStep, Fp16OverflowAtAChosenStepCommitsNothing) {
  constexpr int kOverflowStep = 2;
  for (const Case& base :
       {Case{2, "cpu", "f32", DType::kF16, 1, 1.0}, Case{3, "nvme", "f32", DType::kF16, 1, 1.0},
        Case{3, "nvme", "int8", DType::kF16, 2, 1.0},
        Case{2, "cpu", "int8", DType::kF16, 1, 1.0}}) {
    TempDir dir_on, dir_off;
    const RunSpec on = spec_of(base, dir_on.path(), true),
                  off = spec_of(base, dir_off.path(), false);
    const std::string what = name(base);
    const Out a = run(on, -1, kOverflowStep), b = run(off, -1, kOverflowStep);
    expect_same(a, b, what);
    for (std::size_t t = 0; t < a.steps.size(); ++t) {
      const StepMetrics& m = a.steps[t].metrics;
      EXPECT_EQ(m.redone_units, 0) << "step " << t << ": " << what;
      if (static_cast<int>(t) == kOverflowStep) {
        EXPECT_FALSE(a.steps[t].applied) << what;
        EXPECT_GT(m.speculated_units, 0) << what;  // ran, and was dropped
      } else {
        EXPECT_TRUE(a.steps[t].applied) << "step " << t << ": " << what;
      }
    }
  }
}

// The tracker's bytes by category and tier (the NVMe tier too) equal the planner's with the key
// on; the key adds exactly the pinned window (chunks of master + states + 16-bit copy, as many
// as the staging buffers, at most the pinned chunks) and doubles the NVMe file's slots.
TEST(OverlapStep, PlannerEqualsTrackerWithTheWindow) {
  for (const Case& c :
       {Case{2, "cpu", "f32", DType::kF32, 1, 1.0}, Case{3, "cpu", "int8", DType::kBF16, 1, 1.0},
        Case{3, "nvme", "f32", DType::kBF16, 1, 0.5},
        Case{2, "nvme", "int8", DType::kF32, 1, 1.0}}) {
    TempDir dir;
    const std::string what = name(c);
    const RunSpec on = spec_of(c, dir.path(), true), off = spec_of(c, dir.path(), false);
    const Config cfg = make_config(on);
    const Mlp mlp(on.dims);
    auto plan_of = [&](const RunSpec& s) {
      PlanInput pin;
      pin.ranks = s.ranks;
      pin.config = make_config(s);
      pin.units = mlp.unit_specs();
      return plan_engine_memory(pin);
    };
    const PlanResult plan = plan_of(on), plan_off = plan_of(off);
    const auto staging = static_cast<std::size_t>(MemCategory::kOffloadStaging);
    // The window, computed here: per chunk its master, states and 16-bit copy (int8 moments: the
    // chunk of 64 rounded up to a whole quantization block).
    const OptimizerParams op = OptimizerParams::from_config(cfg.optimizer);
    const std::size_t block = state_block(op.state_dtype());
    const std::size_t chunk = (64 + block - 1) / block * block;
    const std::size_t per_chunk = chunk * 4 + 2 * state_bytes(op.state_dtype(), chunk) +
                                  (c.dtype != DType::kF32 ? chunk * 2 : 0);
    // Two staging buffers: a window of two chunks wherever the pinned tier has two (f32: chunks
    // 1 + 3 + 2 of the units; int8: one per unit); nvme at ratio 1 has none pinned.
    const std::size_t window = c.device == "nvme" && c.ratio == 1.0 ? 0 : 2 * per_chunk;
    // NVMe with 16-bit parameters: each slot carries the updated copy too, one more 4 KiB-aligned
    // part in each of the 2 staging buffers.
    const std::size_t copy_part =
        c.device == "nvme" && c.dtype != DType::kF32 ? 2 * ((chunk * 2 + 4095) / 4096 * 4096) : 0;
    EXPECT_EQ(plan.pinned[staging] - plan_off.pinned[staging], window + copy_part) << what;
    for (std::size_t k = 0; k < kNumMemCategories; ++k) {
      if (c.device == "nvme" && k != static_cast<std::size_t>(MemCategory::kParams16)) {
        EXPECT_EQ(plan.nvme[k], 2 * plan_off.nvme[k]) << to_string(static_cast<MemCategory>(k));
      }
    }
    ThreadGroup::run(on.ranks, [&](Communicator& comm) {
      Engine e(comm, cfg);
      mlp.declare(e);
      mlp.init(e, 1);
      testing::run_steps(e, mlp, comm.rank(), 3);
      const MemoryTracker& t = e.tracker();
      for (std::size_t k = 0; k < kNumMemCategories; ++k) {
        const auto cat = static_cast<MemCategory>(k);
        EXPECT_EQ(t.current(cat) - t.current(cat, MemTier::kNvme), plan.bytes[k])
            << to_string(cat) << ": " << what;
        EXPECT_EQ(t.current(cat, MemTier::kPinned), plan.pinned[k])
            << to_string(cat) << " (pinned): " << what;
        EXPECT_EQ(t.current(cat, MemTier::kNvme), plan.nvme[k])
            << to_string(cat) << " (nvme): " << what;
      }
    });
  }
}

// Where the step cannot run during backward the key is refused, naming it.
TEST(OverlapStep, RefusedWhereItCannotApply) {
  TempDir dir;
  auto refused = [&](RunSpec s, const std::string& why) {
    s.overlap_step = true;
    const Config cfg = make_config(s);
    ThreadGroup::run(1, [&](Communicator& comm) {
      try {
        Engine e(comm, cfg);
        ADD_FAILURE() << "accepted: " << why;
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kConfig) << why;
        EXPECT_NE(std::string(e.what()).find("offload_optimizer.overlap_step"), std::string::npos)
            << e.what();
      }
    });
  };
  RunSpec s;
  s.stage = 1;
  s.offload_buffers = 2;
  s.offload_chunk = 64;
  refused(s, "stage 1 (the reduced gradients stay on the device until the boundary)");
  // No optimizer offload: the key given without a device.
  s.stage = 2;
  s.offload_buffers = 0;
  const Config cfg = parse_config(R"({"zero_optimization": {"stage": 2,
      "offload_optimizer": {"overlap_step": true}}})");
  ThreadGroup::run(1, [&](Communicator& comm) {
    try {
      Engine e(comm, cfg);
      ADD_FAILURE() << "accepted without optimizer offload";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kConfig);
      EXPECT_NE(std::string(e.what()).find("offload_optimizer.overlap_step"), std::string::npos)
          << e.what();
    }
  });
  s.stage = 3;
  s.offload_buffers = 2;
  s.offload_device = "nvme";
  s.nvme_path = dir.path();
  s.offload_param = "nvme";
  refused(s, "parameter offload to NVMe");
}

}  // namespace
}  // namespace zero
