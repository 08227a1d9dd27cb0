// The choice of shard optimizer (see engine/shard_optimizer.hpp): on the device, offloaded, or
// both, split by unit (a partial offload, offload_optimizer.ratio).
#include "engine/shard_optimizer.hpp"

#include "engine/device_optimizer.hpp"
#include "engine/offloaded_optimizer.hpp"

namespace zero::detail {

namespace {

// A partial offload: the units the placement keeps on the device are the device optimizer's,
// the others the offloaded one's. A step steps both (the device's launch first, so that on a
// GPU its kernels run while the host steps its chunks); everything else goes to the unit's tier.
class SplitOptimizer final : public ShardOptimizer {
 public:
  SplitOptimizer(const Placement& placement, std::unique_ptr<ShardOptimizer> device,
                 std::unique_ptr<ShardOptimizer> offloaded)
      : placement_(placement), device_(std::move(device)), offloaded_(std::move(offloaded)) {}

  void step(const std::vector<OptimizerParams>& groups, std::int64_t step,
            float grad_scale) override {
    device_->step(groups, step, grad_scale);
    offloaded_->step(groups, step, grad_scale);
  }
  void speculate(UnitId u, const StepOptions& options) override {
    offloaded_->speculate(u, options);  // only units with their gradients on the host come here
  }
  Settled settle(bool commit) override { return offloaded_->settle(commit); }
  float* master(UnitId u) override { return of(u).master(u); }
  char* state(UnitId u, int k) override { return of(u).state(u, k); }
  void copy_master(UnitId u, float* out) override { of(u).copy_master(u, out); }
  void copy_state(UnitId u, int k, void* out) override { of(u).copy_state(u, k, out); }
  void refresh_master(UnitId u, std::size_t lo, std::size_t hi) override {
    of(u).refresh_master(u, lo, hi);
  }
  void load_unit(UnitId u, const float* master, const void* const* states) override {
    of(u).load_unit(u, master, states);
  }

 private:
  ShardOptimizer& of(UnitId u) {
    return placement_.optim_tier(u) == Tier::kDevice ? *device_ : *offloaded_;
  }

  const Placement& placement_;
  std::unique_ptr<ShardOptimizer> device_, offloaded_;
};

}  // namespace

std::unique_ptr<ShardOptimizer> make_shard_optimizer(const Placement& placement, DeviceOps& dev,
                                                     const CpuOptimizer& host,
                                                     const OptimizerParams& params,
                                                     MemoryTracker& tracker, ShardAccess& access,
                                                     Observer observer) {
  if (!placement.offloaded) {
    return std::make_unique<DeviceOptimizer>(placement, dev, params, tracker, access, observer);
  }
  auto offloaded =
      std::make_unique<OffloadedOptimizer>(placement, dev, host, params, tracker, access, observer);
  if (!placement.on_device) return offloaded;
  return std::make_unique<SplitOptimizer>(
      placement,
      std::make_unique<DeviceOptimizer>(placement, dev, params, tracker, access, observer),
      std::move(offloaded));
}

}  // namespace zero::detail
