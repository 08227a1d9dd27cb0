// zero/engine/fit.hpp — whether a run fits the machine, decided before its first allocation.
//
// A run's bytes per tier come from the planner (zero/engine/plan.hpp: the engine's placement
// summed, equal to the tracker's measurement) plus what the trainer declares per rank (activations,
// its workspace); the budget is the user's (a per-rank --memory-budget) or the machine's: host
// memory the process may still take (the tighter of /proc/meminfo's MemAvailable and the memory
// cgroup's limit less its usage, v1 or v2, the tightest ancestor), a CUDA device's free memory,
// and the free space under the NVMe swap directory. A run that cannot fit is refused naming the
// tier, what it needs, what there is and the shortfall — instead of an allocation failing
// mid-run, or the kernel's OOM killer ending the process with nothing said.
//
// Thread safety: pure functions (machine_budget reads /proc and /sys).
#pragma once

#include <cstddef>
#include <string>

#include "zero/device/device.hpp"
#include "zero/engine/plan.hpp"

namespace zero {

struct MemoryBudget {
  // Bytes this process may still take per tier; 0: not limited (or not known).
  std::size_t host = 0;
  std::size_t device = 0;  // a CUDA device's; 0 on the CPU device (its memory is the host's)
  std::size_t nvme = 0;    // free space under the swap directory
  // Where each figure comes from, for the message ("MemAvailable", "memory cgroup /a/b: limit
  // 1.00 GiB, 212 MiB in use", "--memory-budget 512 MiB x 4 ranks", ...).
  std::string host_from, device_from, nvme_from;
};

// The machine's budget for this process: host memory always; the device's when `device` is
// CUDA; the NVMe directory's free space when `nvme_dir` is non-empty and exists.
MemoryBudget machine_budget(const Device& device = Device::cpu(), const std::string& nvme_dir = {});

// What `ranks` ranks of this process need per tier, each holding `plan` plus `trainer_bytes` of
// its own on the device (activations, workspace). On the CPU device (device_is_host) the device
// tier is host memory.
struct FitNeed {
  std::size_t host = 0, device = 0, nvme = 0;
};
FitNeed fit_need(const PlanResult& plan, int ranks, std::size_t trainer_bytes, bool device_is_host);

// Empty when `need` fits `budget`; else one line per tier that does not fit: "host memory: needs
// 4.50 GiB, has 1.00 GiB (memory cgroup ...): short by 3.50 GiB".
std::string fit_shortfall(const FitNeed& need, const MemoryBudget& budget);

}  // namespace zero
