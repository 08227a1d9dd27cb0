// EngineOptions::check_fit: the engine's planned bytes against the budget, before it allocates.
#include <string>

#include "engine/engine_impl.hpp"
#include "zero/device/memory_report.hpp"
#include "zero/engine/fit.hpp"
#include "zero/engine/plan.hpp"

namespace zero {

void Engine::Impl::check_fit(const detail::Placement& planned) const {
  // This rank's own placement (attach mode's too), its pools replayed in declaration order.
  const PlanResult plan = detail::plan_of(planned, {}, 1);
  const bool device_is_host = !dev->device().is_cuda();
  const std::size_t budget = tracker->memory_budget();
  if (budget > 0) {  // the tracker's cap: this rank's memory, all tiers but NVMe
    const FitNeed need = fit_need(plan, 1, opts.trainer_bytes, device_is_host);
    const std::size_t total = need.host + need.device;
    ZERO_CHECK(total <= budget, kOutOfMemory, "rank ", comm.rank(), " cannot fit: it needs ",
               format_bytes(total), " (the planned placement and pools ",
               format_bytes(total - opts.trainer_bytes), ", the trainer's ",
               format_bytes(opts.trainer_bytes), ") of its memory budget ", format_bytes(budget),
               ": short by ", format_bytes(total - budget),
               " (raise the stage, offload the optimizer, or raise the budget)");
    return;
  }
  // The machine's, shared by this process's ranks.
  int local = 1;
  if (world.backend() == "thread") {
    local = world.size();
  } else if (const LaunchInfo l = detect_launch(); l.local_size > 0) {
    local = l.local_size;
  }
  const MemoryBudget machine = machine_budget(dev->device());
  const std::string shortfall =
      fit_shortfall(fit_need(plan, local, opts.trainer_bytes, device_is_host), machine);
  ZERO_CHECK(shortfall.empty(), kOutOfMemory, "rank ", comm.rank(), " (one of ", local,
             " ranks in this process) cannot fit: ", shortfall,
             " (raise the stage, offload the optimizer, or add memory)");
}

}  // namespace zero
