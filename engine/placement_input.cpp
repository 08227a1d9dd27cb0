// The placement's input from a Config: every choice the placement reads, parsed once, and the
// combinations that cannot run refused naming their keys (see engine/placement.hpp).
#include <algorithm>
#include <string>
#include <utility>

#include "engine/placement.hpp"
#include "offload/aio.hpp"
#include "zero/comm/comm.hpp"
#include "zero/core/error.hpp"
#include "zero/optim/optimizer.hpp"

namespace zero::detail {

int hybrid_shard_size(const Config& config, int world_size) {
  const std::int64_t g = config.zero_optimization.hybrid_shard_size;
  if (g != ZeroOptimizationConfig::kHybridShardNode) return static_cast<int>(g);
  const LaunchInfo info = detect_launch();
  if (info.source == "none") return world_size;  // in-process ranks: one node
  ZERO_CHECK(info.local_size > 0, kConfig,
             "config key 'zero_optimization.hybrid_shard_size' = \"node\": the launcher (",
             info.source,
             ") does not say how many ranks share a node (LOCAL_WORLD_SIZE, "
             "OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS or SLURM_NTASKS_PER_NODE); give the "
             "number of ranks per group");
  ZERO_CHECK(info.size == world_size, kConfig,
             "config key 'zero_optimization.hybrid_shard_size' = \"node\" groups the launcher's ",
             info.size, " ranks by node, but the engine runs on a communicator of ", world_size,
             " (a sub-group): give the number of ranks per group");
  return info.local_size;
}

int shard_width(const Config& config, int world_size) {
  const int g = hybrid_shard_size(config, world_size);
  return g > 0 && g < world_size ? g : world_size;
}

namespace {

// The NVMe swap files' options (offload_param / offload_optimizer with device nvme), one file
// each per rank.
void set_swap_files(PlacementInput& in, const Config& config) {
  const ZeroOptimizationConfig& z = config.zero_optimization;
  const std::string r = std::to_string(in.rank);
  in.param_swap.dir = z.offload_param.nvme_path;
  in.param_swap.stem = "param-r" + r;
  in.param_swap.origin = "config key 'zero_optimization.offload_param.nvme_path'";
  in.param_swap.buffer_count = 0;  // the gatherer's window is the only buffer
  in.param_swap.aio = offload::AioOptions::from_config(config.aio);
  in.optim_swap.dir = z.offload_optimizer.nvme_path;
  in.optim_swap.stem = "optim-r" + r;
  in.optim_swap.origin = "config key 'zero_optimization.offload_optimizer.nvme_path'";
  in.optim_swap.buffer_count = in.offload_buffers;
  in.optim_swap.pipeline_read = z.offload_optimizer.pipeline_read;
  in.optim_swap.pipeline_write = z.offload_optimizer.pipeline_write;
  in.optim_swap.aio = in.param_swap.aio;
}

// offload_optimizer.overlap_step: where it can run, and the swap file's slots it needs.
void set_overlap_step(PlacementInput& in) {
  if (!in.overlap_step) return;
  // The speculative step starts when a unit's reduced gradient shard lands in host memory:
  // ZeRO-Offload's gradient partition, stages 2-3 with the optimizer offloaded.
  ZERO_CHECK(in.policy.shard_gradients && in.optimizer_offload != OffloadDevice::kNone, kConfig,
             "config key 'zero_optimization.offload_optimizer.overlap_step' = true needs "
             "zero_optimization.stage 2 or 3 with 'zero_optimization.offload_optimizer.device' "
             "= \"cpu\" or \"nvme\" (stage is ",
             in.policy.stage, ", device \"", to_string(in.optimizer_offload),
             "\"): it overlaps the offloaded step with backward, where the reduced gradient "
             "shards land in host memory");
  // Its updated parameters are written at the commit, not through the parameter file's window.
  ZERO_CHECK(in.param_offload != OffloadDevice::kNvme, kConfig,
             "config key 'zero_optimization.offload_optimizer.overlap_step' = true is not "
             "supported with 'zero_optimization.offload_param.device' = \"nvme\"");
  in.optim_swap.slots = 2;  // NVMe: the speculative chunk goes to the alternate slot
  // The updated 16-bit copy a slot carries (below) is written by the step, read at the commit.
  if (in.working != DType::kF32) {
    in.optim_swap.read_parts = 1 + static_cast<std::size_t>(in.num_states);
  }
}

// The updated shards reach the parameter file through the offloaded optimizer's chunk loop:
// with offload_param = nvme every unit must be stepped there (with device cpu, the ratio keeps
// the leading units on the device).
void check_param_nvme(const PlacementInput& in) {
  ZERO_CHECK(
      in.param_offload != OffloadDevice::kNvme || in.optimizer_offload != OffloadDevice::kNone,
      kConfig,
      "config key 'zero_optimization.offload_param.device' = \"nvme\" needs "
      "'zero_optimization.offload_optimizer.device' = \"cpu\" or \"nvme\" (it is \"",
      to_string(in.optimizer_offload), "\")");
  ZERO_CHECK(
      in.param_offload != OffloadDevice::kNvme || in.optimizer_offload != OffloadDevice::kCpu ||
          in.offload_ratio == 1.0,
      kConfig,
      "config key 'zero_optimization.offload_param.device' = \"nvme\" needs every unit's "
      "optimizer off the device: 'zero_optimization.offload_optimizer.ratio' = ",
      in.offload_ratio,
      " keeps the leading units on the device with 'offload_optimizer.device' = \"cpu\" "
      "(use ratio 1, or device \"nvme\", whose ratio splits between NVMe and pinned memory)");
}

}  // namespace

PlacementInput placement_input(const Config& config, std::vector<UnitSpec> units, int world_size,
                               int rank, std::size_t alignment, Ownership ownership,
                               bool host_accessible, int replicas) {
  const ZeroOptimizationConfig& z = config.zero_optimization;
  const OptimizerParams op = OptimizerParams::from_config(config.optimizer);
  PlacementInput in;
  in.units = std::move(units);
  // The groups the units name (the planner's case; the engine sets its own count).
  for (const UnitSpec& u : in.units)
    for (const ParamSpec& ps : u.params) in.num_groups = std::max(in.num_groups, ps.group + 1);
  in.world_size = world_size;
  in.rank = rank;
  in.alignment = alignment;
  in.policy = StagePolicy::of(z.stage, ownership);
  in.ownership = ownership;
  in.host_accessible = host_accessible;
  in.working = working_dtype(config);
  in.reduce = reduce_dtype_of(config);
  in.state_dtype = op.state_dtype();
  in.num_states = op.num_states();
  in.accumulation = config.gradient_accumulation_steps;
  in.optimizer_offload = z.offload_optimizer.device;
  in.param_offload = in.policy.shard_params ? z.offload_param.device : OffloadDevice::kNone;
  in.offload_chunk = static_cast<std::size_t>(z.offload_optimizer.buffer_size);
  in.offload_buffers = static_cast<std::size_t>(z.offload_optimizer.buffer_count);
  set_swap_files(in, config);
  in.persistence_threshold = static_cast<std::size_t>(z.stage3_param_persistence_threshold);
  in.prefetch_bucket = static_cast<std::size_t>(z.stage3_prefetch_bucket_size);
  in.max_live = static_cast<std::size_t>(z.stage3_max_live_parameters);
  in.reduce_bucket = static_cast<std::size_t>(z.reduce_bucket_size);
  in.allgather_bucket = static_cast<std::size_t>(z.allgather_bucket_size);
  in.overlap_comm = z.overlap_comm;
  in.quantized_weights = in.policy.shard_params && z.zero_quantized_weights;
  in.quantized_gradients = in.policy.shard_params && z.zero_quantized_gradients;
  in.quant_block = static_cast<std::size_t>(z.quantization_block_size);
  in.replicas = replicas;
  in.offload_ratio = z.offload_optimizer.ratio;
  in.overlap_step = z.offload_optimizer.overlap_step;
  set_overlap_step(in);
  check_param_nvme(in);
  return in;
}

}  // namespace zero::detail
