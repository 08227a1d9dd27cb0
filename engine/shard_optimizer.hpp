// engine/shard_optimizer.hpp — the optimizer state of this rank's shard, a room of its own: the
// fp32 master and the optimizer states over every unit's stepped range, and the step that
// updates them. Two implementations, chosen once from the placement by make_shard_optimizer():
// on the compute device (DeviceOptimizer, engine/device_optimizer.hpp) and off it, in pinned host
// memory or NVMe files (OffloadedOptimizer, engine/offloaded_optimizer.hpp); with a partial
// offload (offload_optimizer.ratio) both, behind one that steps both and sends everything else
// to the unit's tier (engine/shard_optimizer.cpp). The engine steps, checkpoints and observes the
// optimizer through this interface only; nothing above it branches on the tier.
//
// Thread safety: belongs to one rank's engine; used from the rank's thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/observe.hpp"
#include "engine/placement.hpp"
#include "zero/device/device_ops.hpp"
#include "zero/device/memory.hpp"
#include "zero/engine/unit.hpp"
#include "zero/optim/optimizer.hpp"

namespace zero::detail {

// What the optimizer reads and writes of the engine's other rooms (the reducer's gradients, the
// gatherer's working parameters).
class ShardAccess {
 public:
  virtual ~ShardAccess() = default;
  // Unit u's reduced gradients over its stepped range (R; device memory or, with the partition
  // on the host, pinned).
  virtual const char* grads(UnitId u) = 0;
  // Unit u's working parameters over its stepped range (device memory, or host memory when
  // params_on_nvme(u): the window between load_params(u) and store_params(u)).
  virtual char* params(UnitId u) = 0;
  virtual bool params_on_nvme(UnitId u) = 0;
  virtual void load_params(UnitId u) = 0;
  virtual void store_params(UnitId u) = 0;
};

// The options of one step, known before the step's global norm: what a speculative step
// (offload_optimizer.overlap_step) runs with. grad_scale is the loss scaler's with clip
// coefficient 1; a step whose coefficient is not 1 redoes the speculative units.
struct StepOptions {
  std::vector<OptimizerParams> groups;
  std::int64_t step = 0;
  float grad_scale = 1.0f;
};

// What settle() found: the units stepped speculatively since the last settle, and of their
// chunks those committed.
struct Settled {
  int units = 0;
  std::size_t chunks_committed = 0;
};

// A frozen unit (UnitPlacement::frozen) has no master and no state: the engine never asks for
// its master, state, copies, refresh or load here, and step() passes it by.
class ShardOptimizer {
 public:
  virtual ~ShardOptimizer() = default;

  // One update of every stepped range, each run with its parameter group's options
  // (groups[g], lr set by the caller), the working parameters rewritten from the master. `step`
  // is 1-based; grad_scale divides the gradients.
  virtual void step(const std::vector<OptimizerParams>& groups, std::int64_t step,
                    float grad_scale) = 0;

  // ---- the step during backward (offload_optimizer.overlap_step; the default does nothing)
  // Unit u's reduced gradients are final for this step (the boundary micro-step's reduction
  // landed in host memory): its offloaded step may start with `options`, on a worker, holding
  // its results apart from the state (returns when enqueued). Only units whose gradient
  // partition is on the host are passed. The first call after a settle() fixes the options.
  virtual void speculate(UnitId u, const StepOptions& options) {
    (void)u;
    (void)options;
  }
  // Waits for the speculative steps; commit: their held results become the state and the
  // working parameters (the next step() steps only the other units), else they are dropped and
  // the state is as before them. REQUIRES: commit only when the step's options are the ones
  // speculate() got. Rethrows a speculative step's failure (the state untouched).
  virtual Settled settle(bool commit) {
    (void)commit;
    return {};
  }

  // The master / state k of unit u's stepped range where its tier gives a pointer (device or
  // pinned memory); kInvalidArgument naming the tier when unit u's are in NVMe (use the copies).
  virtual float* master(UnitId u) = 0;
  virtual char* state(UnitId u, int k) = 0;
  // Copies of unit u's stepped master / state k to host memory `out`, from whichever tier.
  virtual void copy_master(UnitId u, float* out) = 0;
  virtual void copy_state(UnitId u, int k, void* out) = 0;
  // The working parameters [lo, hi) of unit u's stepped range changed (set_param, attach): the
  // master follows.
  virtual void refresh_master(UnitId u, std::size_t lo, std::size_t hi) = 0;
  // Overwrites unit u's stepped master and states with `master` / `states` (host memory, the
  // stepped range; a checkpoint's load). The working parameters are the caller's.
  virtual void load_unit(UnitId u, const float* master, const void* const* states) = 0;
};

// The optimizer the placement asks for: on the device, off it (placement.offloaded), or both
// (placement.on_device too: a partial offload, each unit stepped and kept where its optim_tier
// says). `placement`, `dev`, `host`, `params`, `tracker`, `access` and the observer's tracer and
// counters outlive it.
std::unique_ptr<ShardOptimizer> make_shard_optimizer(const Placement& placement, DeviceOps& dev,
                                                     const CpuOptimizer& host,
                                                     const OptimizerParams& params,
                                                     MemoryTracker& tracker, ShardAccess& access,
                                                     Observer observer);

}  // namespace zero::detail
