// The engine's memory, predicted: the engine's placement (engine/placement.hpp) summed, plus the
// pools as the rooms that own them predict them (the gradient reducer's in-flight rule, the
// parameter gatherer's prefetch replay). No size or rule is restated here.
#include "zero/engine/plan.hpp"

#include <algorithm>

#include "config/stage_policy.hpp"
#include "engine/grad_reducer.hpp"
#include "engine/param_gatherer.hpp"
#include "engine/placement.hpp"
#include "zero/core/error.hpp"

namespace zero {

FormulaBytes zero_formula(double psi, int ranks, int stage, double w, double g, double k,
                          bool offload_optimizer, bool offload_params,
                          std::optional<double> psi_trainable, double offload_fraction) {
  const double n = ranks, trained = psi_trainable.value_or(psi);
  const detail::StagePolicy policy = detail::StagePolicy::of(stage);
  FormulaBytes f;
  f.params = w * psi / (policy.shard_params ? n : 1.0);
  f.grads = g * trained / (policy.shard_gradients ? n : 1.0);
  f.optimizer = k * trained / (policy.shard_optimizer ? n : 1.0);
  if (offload_optimizer) {
    const double moved = offload_fraction * f.optimizer;
    f.offloaded += moved;
    f.optimizer -= moved;
    if (policy.shard_gradients) {  // ZeRO-Offload keeps the gradient partition on the host
      const double moved_grads = offload_fraction * f.grads;
      f.offloaded += moved_grads;
      f.grads -= moved_grads;
    }
  }
  if (offload_params && policy.shard_params) {
    f.offloaded += f.params;
    f.params = 0;
  }
  return f;
}

std::size_t PlanResult::model_state() const {
  std::size_t s = 0;
  for (MemCategory c : {MemCategory::kParams16, MemCategory::kMasterParams,
                        MemCategory::kOptimizerState, MemCategory::kGradients}) {
    s += at(c) - pinned[static_cast<std::size_t>(c)];
  }
  return s - in_flight_grad_bytes - gathered_param_bytes;
}

std::size_t PlanResult::total() const {
  std::size_t t = 0;
  for (std::size_t b : bytes) t += b;
  return t;
}

PlanResult plan_engine_memory(const PlanInput& in) {
  ZERO_CHECK(!in.units.empty(), kInvalidArgument, "plan: no units");
  return detail::plan_of(detail::plan_placement(in), in.gather_order, in.grads_held);
}

namespace detail {

Placement plan_placement(const PlanInput& in) {
  ZERO_CHECK(!in.units.empty(), kInvalidArgument, "plan: no units");
  // Rank 0's placement (every rank's is the same size); the device the host can address, as
  // on the machines the harness runs on.
  return make_placement(placement_input(in.config, in.units, shard_width(in.config, in.ranks),
                                        /*rank=*/0, in.alignment, Ownership::kManaged,
                                        /*host_accessible=*/true,
                                        in.ranks / shard_width(in.config, in.ranks)));
}

PlanResult plan_of(const Placement& p, const std::vector<UnitId>& gather_order, int grads_held) {
  PlanResult out;
  for (std::size_t u = 0; u < p.num_units(); ++u) {
    const detail::UnitLayout& ul = p.layout.units[u];
    out.unit_padded.push_back(ul.padded);
    for (const ParamSpec& ps : p.in.units[u].params) out.psi += ps.numel();
    if (ul.padded > out.largest_unit) {
      out.largest_unit = ul.padded;
      out.largest_unit_name = p.in.units[u].name;
    }
  }
  out.psi_padded = p.layout.total_padded;
  out.psi_trainable_padded = p.trainable_padded;
  out.stepped = p.trainable_step;
  out.stepped_offloaded = p.offload_step;
  auto add = [&](MemCategory c, detail::Tier tier, std::size_t bytes) {
    const auto i = static_cast<std::size_t>(c);
    if (tier == detail::Tier::kNvme) {
      out.nvme[i] += bytes;
      return;
    }
    out.bytes[i] += bytes;
    if (tier == detail::Tier::kPinned) out.pinned[i] += bytes;
  };
  // The arenas.
  p.for_each_arena(
      [&](const detail::Arena& a, std::size_t count) { add(a.category, a.tier, a.bytes * count); });
  // The swap files and their staging slots (the parameter file's window is an arena).
  auto add_file = [&](const std::vector<offload::ChunkSwapper::Part>& parts,
                      const offload::ChunkSwapper::Footprint& f, std::size_t buffers) {
    for (std::size_t k = 0; k < parts.size(); ++k) {
      add(parts[k].category, detail::Tier::kNvme, f.part_bytes[k]);
    }
    add(MemCategory::kOffloadStaging, detail::Tier::kPinned, buffers * f.staging_buffer_bytes);
  };
  if (p.nvme_optimizer) add_file(p.optim_parts, p.optim_file, p.in.offload_buffers);
  if (p.nvme_params) add_file(p.param_parts, p.param_file, 0);
  // The pools, as many buffers as the rooms that own them end up taking.
  const detail::GradReducer::Pools pools = detail::GradReducer::predicted_pools(p, grads_held);
  out.in_flight_grad_bytes = pools.grads * p.grad_pool.buffer_bytes;
  std::vector<UnitId> order = gather_order;
  if (order.empty()) {  // forward, then backward
    for (std::size_t u = 0; u < p.num_units(); ++u) order.push_back(static_cast<UnitId>(u));
    for (std::size_t u = p.num_units(); u-- > 0;) order.push_back(static_cast<UnitId>(u));
  }
  const detail::ParamGatherer::GatherPools gathers =
      detail::ParamGatherer::predicted_gather_pools(p, order);
  out.staging_bytes =
      pools.reduce * p.reduce_pool.buffer_bytes + pools.buckets * p.bucket_pool.buffer_bytes +
      pools.quant * p.quant_reduce_pool.buffer_bytes +
      detail::ParamGatherer::predicted_bucket_buffers(p) * p.gather_bucket_pool.buffer_bytes +
      gathers.quant * p.quant_gather_pool.buffer_bytes;
  add(p.grad_pool.category, detail::Tier::kDevice, out.in_flight_grad_bytes);
  add(MemCategory::kCommBuffers, detail::Tier::kDevice, out.staging_bytes);
  out.gathered_param_bytes = gathers.gathered * p.gather_pool.buffer_bytes;
  add(p.gather_pool.category, detail::Tier::kDevice, out.gathered_param_bytes);
  return out;
}

}  // namespace detail
}  // namespace zero
