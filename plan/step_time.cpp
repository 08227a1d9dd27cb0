// predict_step(): a candidate's step time by phase from the machine profile (zero/plan/choose.hpp).
// Every volume is read off the placement the planner sums (detail::plan_placement): its reduce
// and post-step all-gather buckets, its units' shards and which are kept whole, its offloaded
// elements and swap slots — no rule of the engine's restated here.
#include <algorithm>
#include <string>
#include <vector>

#include "engine/placement.hpp"
#include "zero/core/dtype.hpp"
#include "zero/plan/choose.hpp"

namespace zero {

namespace {

// What every phase reads besides the placement: how the ranks share the machine and the
// element widths.
struct Scale {
  // In-process ranks on the CPU device share the process's cores, memory bandwidth and disk:
  // their work adds up. On a separate device each rank computes and steps on its own.
  double local = 1;
  double accum = 1;  // micro-steps per step
  double wb = 0;     // bytes of a working (W) element
  double rb = 0;     // bytes of a reduce (R) element
};

Scale scale_of(const detail::Placement& p, const World& w) {
  Scale s;
  s.local = w.device_is_host ? static_cast<double>(w.local()) : 1.0;
  s.accum = static_cast<double>(std::max<std::int64_t>(p.in.accumulation, 1));
  s.wb = static_cast<double>(dtype_size(p.in.working));
  s.rb = static_cast<double>(dtype_size(p.in.reduce));
  return s;
}

std::size_t bytes_of(std::size_t elems, double width) {
  return static_cast<std::size_t>(static_cast<double>(elems) * width);
}

// The stage-3 gathers of a micro-step, unit by unit: the trainer's order, else forward then
// backward.
std::vector<UnitId> gather_order(const PlanInput& pin, const detail::Placement& p) {
  std::vector<UnitId> order = pin.gather_order;
  if (order.empty()) {
    const auto units = static_cast<UnitId>(p.num_units());
    for (UnitId u = 0; u < units; ++u) order.push_back(u);
    for (UnitId u = units; u-- > 0;) order.push_back(u);
  }
  return order;
}

// ---- communication (grad_reducer.cpp: stage 0 one all-reduce and stage 1 a reduce per bucket
// at the boundary; stages 2-3 a reduce per bucket every micro-step; param_gatherer.cpp: a
// gather per sharded unit in the gather order every micro-step), before overlap. The seconds are
// summed in one accumulator in that order.
double comm_seconds(const detail::Placement& p, const std::vector<UnitId>& order, const World& w,
                    const MachineProfile& prof, const Scale& s) {
  const detail::StagePolicy& pol = p.in.policy;
  const int n = p.in.world_size;
  double comm = 0;
  // The shard group (consecutive ranks) spans nodes when it is larger than one; hybrid
  // sharding's replicas all-reduce the reduced shard across the groups, across nodes when the
  // world is. ZeRO++ sends int8 values and a f32 scale per block (quantized_comm.hpp).
  const bool group_net = n > w.local();
  const bool on_device = !w.device_is_host;  // NCCL's points where the profile has them
  const bool world_net = w.ranks > w.local();
  const int replicas = std::max(p.in.replicas, 1);
  const double qb = 1.0 + 4.0 / static_cast<double>(std::max<std::size_t>(p.in.quant_block, 1));
  const double gw = p.in.quantized_weights ? qb : s.wb;    // the parameters' gathers
  const double rw = p.in.quantized_gradients ? qb : s.rb;  // the gradients' reduce
  if (!pol.shard_optimizer) {
    comm += prof.collective_seconds("all_reduce", n, bytes_of(p.trainable_padded, s.rb), group_net,
                                    on_device);
  } else {
    const double reduces = pol.shard_gradients ? s.accum : 1.0;
    for (const detail::Bucket& b : p.reduce_buckets) {
      comm += reduces * prof.collective_seconds("reduce_scatter", n,
                                                bytes_of(b.shard * static_cast<std::size_t>(n), rw),
                                                group_net, on_device);
      comm += reduces * prof.collective_seconds("all_reduce", replicas, bytes_of(b.shard, rw),
                                                world_net, on_device);
    }
  }
  for (const detail::Bucket& b : p.gather_buckets) {
    comm += prof.collective_seconds("all_gather", n,
                                    bytes_of(b.shard * static_cast<std::size_t>(n), s.wb),
                                    group_net, on_device);
  }
  for (UnitId u : order) {
    if (p.unit(u).kept_whole) continue;
    comm += s.accum * prof.collective_seconds("all_gather", n, bytes_of(p.lay(u).padded, gw),
                                              group_net, on_device);
  }
  return comm;
}

// ---- offload I/O: the optimizer swap file read and written once a step, the parameter swap
// file read per gather and written after the step; offloaded gradients in and parameters out
// through the staging buffers at the copy rate. `why` gets the reason when the profile lacks
// the NVMe figures.
template <typename Why>
double offload_seconds(const Candidate& c, const detail::Placement& p,
                       const std::vector<UnitId>& order, const World& w, const MachineProfile& prof,
                       const Scale& s, Why&& why) {
  double nvme_param_read = 0;
  for (UnitId u : order) {
    if (p.shard_on_nvme(u)) nvme_param_read += s.accum * bytes_of(p.lay(u).shard, s.wb);
  }
  double optim_file = 0, param_file = 0;
  for (std::size_t k = 0; k < kNumMemCategories; ++k) {
    const auto cat = static_cast<MemCategory>(k);
    (cat == MemCategory::kParams16 ? param_file : optim_file) +=
        static_cast<double>(c.plan.nvme[k]);
  }
  double io = 0;
  const double nvme_read = optim_file + nvme_param_read;
  const double nvme_write = optim_file + param_file;
  if (nvme_read + nvme_write > 0) {
    if (prof.nvme_read_bytes_per_s <= 0) {
      why("the machine profile has no NVMe figures (zero-env --calibrate --nvme-path DIR)");
    } else {
      io += s.local *
            (nvme_read / prof.nvme_read_bytes_per_s + nvme_write / prof.nvme_write_bytes_per_s);
    }
  }
  // Gradients down, parameters up: across PCIe / NVLink-C2C from a CUDA device (its measured
  // rates), a host memory copy on the CPU device.
  const double crossing = static_cast<double>(p.offload_step);
  if (!w.device_is_host && prof.cuda.measured()) {
    io += crossing * (s.rb / prof.cuda.device_to_host_bytes_per_s +
                      s.wb / prof.cuda.host_to_device_bytes_per_s);
  } else {
    io += s.local * crossing * (s.rb + s.wb) / prof.copy_bytes_per_s;
  }
  return io;
}

}  // namespace

StepTime predict_step(const Candidate& c, const PlanInput& pin, const World& w,
                      const MachineProfile& prof, double flops, std::string* untimed) {
  const detail::Placement p = detail::plan_placement(pin);
  const Scale s = scale_of(p, w);
  auto why = [&](const std::string& reason) {
    if (untimed != nullptr && untimed->empty()) *untimed = reason;
  };
  StepTime t;

  // ---- compute
  if (flops <= 0) {
    why("the trainer declares no FLOPs per micro-step");
  } else if (prof.trainer_flops_per_s > 0) {
    t.compute = s.accum * flops * s.local / prof.trainer_flops_per_s;
  } else {
    why("the machine profile has no trainer FLOP/s (zero-env --calibrate --gpt)");
  }

  // The CPU device's collectives copy with the cores that compute: nothing hides them. A
  // separate device with overlap_comm hides them behind backward (2/3 of the compute).
  const std::vector<UnitId> order = gather_order(pin, p);
  const double comm = comm_seconds(p, order, w, prof, s);
  t.comm =
      (!w.device_is_host && p.in.overlap_comm) ? std::max(0.0, comm - t.compute * 2.0 / 3.0) : comm;

  // ---- optimizer: every in-process rank's stepped elements, at the rate measured for that much
  // state stepped at once (the ranks step together: their state shares the last-level cache)
  const double stepped = s.local * static_cast<double>(p.trainable_step);
  const double per_s = prof.optimizer_per_s(std::string(to_string(p.in.state_dtype)),
                                            static_cast<std::size_t>(stepped));
  t.optimizer = stepped / per_s;

  t.offload_io = offload_seconds(c, p, order, w, prof, s, why);
  return t;
}

}  // namespace zero
