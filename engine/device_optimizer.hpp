// engine/device_optimizer.hpp — the shard optimizer on the compute device: the fp32 master (16-bit
// training; in fp32 training the working shard is the master) and the optimizer states over the
// stepped range of each unit the placement keeps on the device (optim_tier kDevice: every unit
// without optimizer offload, the leading ones with a partial offload), stepped by the device's
// fused optimizer.
//
// Observed: the step is one TraceLane::kOptimizer region "optimizer step".
//
// Thread safety: belongs to one rank's engine; used from the rank's thread.
#pragma once

#include <vector>

#include "engine/shard_optimizer.hpp"

namespace zero::detail {

class DeviceOptimizer final : public ShardOptimizer {
 public:
  // Allocates the device tier's master (zeroed) and states and zeroes the states in the
  // partitioning the step uses (first touch lands here). Only units on the device are its own:
  // the others are never asked for here.
  DeviceOptimizer(const Placement& placement, DeviceOps& dev, const OptimizerParams& params,
                  MemoryTracker& tracker, ShardAccess& access, Observer observer);

  void step(const std::vector<OptimizerParams>& groups, std::int64_t step,
            float grad_scale) override;
  float* master(UnitId u) override;
  char* state(UnitId u, int k) override;
  void copy_master(UnitId u, float* out) override;
  void copy_state(UnitId u, int k, void* out) override;
  void refresh_master(UnitId u, std::size_t lo, std::size_t hi) override;
  void load_unit(UnitId u, const float* master, const void* const* states) override;

 private:
  ShardRef shard_ref(UnitId u);
  bool mine(UnitId u) const;  // trainable and on the device

  const Placement& placement_;
  DeviceOps& dev_;
  const OptimizerParams& params_;
  ShardAccess& access_;
  Observer observer_;
  Buffer master_;
  std::vector<Buffer> state_;
};

}  // namespace zero::detail
