// The shard optimizer on the compute device (see engine/device_optimizer.hpp).
#include "engine/device_optimizer.hpp"

#include "zero/core/error.hpp"

namespace zero::detail {

DeviceOptimizer::DeviceOptimizer(const Placement& placement, DeviceOps& dev,
                                 const OptimizerParams& params, MemoryTracker& tracker,
                                 ShardAccess& access, Observer observer)
    : placement_(placement), dev_(dev), params_(params), access_(access), observer_(observer) {
  master_ = allocate(placement.master, dev, tracker, {.zero = true});
  for (int k = 0; k < params.num_states(); ++k) {
    state_.push_back(allocate(placement.state, dev, tracker));
  }
  for (UnitId u = 0; u < static_cast<UnitId>(placement.num_units()); ++u) {
    if (mine(u)) dev_.init_state(params_, shard_ref(u));
  }
}

bool DeviceOptimizer::mine(UnitId u) const {
  const UnitPlacement& up = placement_.unit(u);
  return !up.frozen && up.optim_tier == Tier::kDevice;
}

float* DeviceOptimizer::master(UnitId u) {
  // fp32 training: the working shard is the master.
  if (!placement_.separate_master) return reinterpret_cast<float*>(access_.params(u));
  return master_.as<float>() + placement_.unit(u).optim_offset;
}

char* DeviceOptimizer::state(UnitId u, int k) {
  return state_[static_cast<std::size_t>(k)].as<char>() +
         state_bytes(params_.state_dtype(), placement_.unit(u).optim_offset);
}

ShardRef DeviceOptimizer::shard_ref(UnitId u) {
  ShardRef s;
  s.count = placement_.unit(u).step_count;
  s.master = master(u);
  s.grad = access_.grads(u);
  s.grad_dtype = placement_.in.reduce;
  for (int k = 0; k < params_.num_states(); ++k) s.state[k] = state(u, k);
  if (placement_.in.working != DType::kF32) {
    s.param_copy = access_.params(u);
    s.param_copy_dtype = placement_.in.working;
  }
  return s;
}

void DeviceOptimizer::step(const std::vector<OptimizerParams>& groups, std::int64_t step,
                           float grad_scale) {
  TraceScope region(observer_.tracer, TraceLane::kOptimizer, "optimizer step");
  if (state_block(params_.state_dtype()) > 1) {
    // int8 moments: a quantization block is stepped whole, so each unit in one call with its
    // runs (a block may span two groups' runs).
    std::vector<StepRun> runs;
    for (UnitId u = 0; u < static_cast<UnitId>(placement_.num_units()); ++u) {
      if (!mine(u)) continue;  // frozen, or offloaded (a partial offload's other units)
      runs.clear();
      for (const GroupRun& r : placement_.unit(u).runs) runs.push_back({r.at, r.count, r.group});
      dev_.optimizer_step_runs(groups.data(), groups.size(), shard_ref(u), runs.data(), runs.size(),
                               step, grad_scale);
    }
    return;
  }
  // One launch per group over every run of it (one launch in all without groups).
  std::vector<std::vector<ShardRef>> refs(groups.size());
  for (UnitId u = 0; u < static_cast<UnitId>(placement_.num_units()); ++u) {
    if (!mine(u)) continue;  // frozen (no runs, no state), or offloaded
    const ShardRef whole = shard_ref(u);
    placement_.for_each_run(u, 0, whole.count, [&](std::size_t at, std::size_t n, int g) {
      refs[static_cast<std::size_t>(g)].push_back(whole.part(at, n, params_.state_dtype()));
    });
  }
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (!refs[g].empty())
      dev_.optimizer_step(groups[g], refs[g].data(), refs[g].size(), step, grad_scale);
  }
}

void DeviceOptimizer::copy_master(UnitId u, float* out) {
  dev_.copy(out, master(u), placement_.unit(u).step_count * 4);
  dev_.synchronize();
}

void DeviceOptimizer::copy_state(UnitId u, int k, void* out) {
  dev_.copy(out, state(u, k), state_bytes(params_.state_dtype(), placement_.unit(u).step_count));
  dev_.synchronize();
}

void DeviceOptimizer::refresh_master(UnitId u, std::size_t lo, std::size_t hi) {
  if (!placement_.separate_master) return;  // the working shard is the master
  const DType w = placement_.in.working;
  dev_.convert(at(access_.params(u), lo, w), w, master(u) + lo, DType::kF32, hi - lo);
}

void DeviceOptimizer::load_unit(UnitId u, const float* master_in, const void* const* states) {
  const std::size_t n = placement_.unit(u).step_count;
  // fp32: the working copy the caller wrote is the master.
  if (placement_.separate_master) dev_.copy(master(u), master_in, n * 4);
  const std::size_t sb = state_bytes(params_.state_dtype(), n);
  for (int k = 0; k < params_.num_states(); ++k) dev_.copy(state(u, k), states[k], sb);
  dev_.synchronize();
}

}  // namespace zero::detail
