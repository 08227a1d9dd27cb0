// The placement: the engine's memory rules, computed once (see engine/placement.hpp).
#include "engine/placement.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <utility>

#include <xxhash.h>

#include "offload/aio.hpp"
#include "zero/comm/comm.hpp"
#include "zero/comm/quantized_comm.hpp"
#include "zero/core/error.hpp"
#include "zero/optim/optimizer.hpp"

namespace zero::detail {

namespace {

// With overlap_comm the reducer keeps this many collectives running while the trainer computes
// the next units' backward (DeepSpeed double-buffers its reduction bucket the same way).
constexpr std::size_t kCollectivesInFlight = 2;

// Greedy buckets over the units in id order: a unit joins the open bucket while the bucket's
// padded elements stay within `limit` (0: every unit alone) and its `side` is the bucket's.
// Units that `eligible` rejects are left out and close the open bucket, so members are always
// consecutive. Writes each member's bucket index and offset (in one rank's part) through `place`.
template <typename Eligible, typename Side, typename Place>
std::vector<Bucket> make_buckets(const Layout& layout, std::size_t limit, Eligible eligible,
                                 Side side, Place place) {
  std::vector<Bucket> out;
  std::size_t padded = 0;
  bool open = false;
  for (std::size_t i = 0; i < layout.units.size(); ++i) {
    const auto u = static_cast<UnitId>(i);
    if (!eligible(u)) {
      open = false;
      continue;
    }
    const UnitLayout& ul = layout.units[i];
    if (!open || padded + ul.padded > limit || side(u) != side(out.back().first)) {
      out.push_back({u, u, 0});
      padded = 0;
      open = true;
    }
    Bucket& b = out.back();
    place(u, static_cast<int>(out.size() - 1), b.shard);
    b.last = u;
    b.shard += ul.shard;
    padded += ul.padded;
  }
  return out;
}

Arena on(Tier tier, MemCategory c, std::size_t bytes) { return Arena{c, tier, bytes}; }

// offload_optimizer.ratio's cut: the first unit of the trailing tier. The trailing trainable
// units whose stepped elements come closest to ratio x this rank's stepped elements go there;
// a tie offloads the larger part, as DeepSpeed's int((1 - ratio) x sub-groups) rounds the
// device's part down. Elements, not units: units differ in size. nu: nothing offloaded.
std::size_t offload_cut(const std::vector<UnitPlacement>& units, double ratio, std::size_t total) {
  const double want = ratio * static_cast<double>(total);
  std::size_t cut = units.size(), off = 0;
  double best = want;  // nothing offloaded
  for (std::size_t u = units.size(); u-- > 0;) {
    if (units[u].frozen) continue;
    off += units[u].step_count;
    const double d = std::abs(static_cast<double>(off) - want);
    if (d <= best) {
      best = d;
      cut = u;
    }
  }
  return cut;
}

}  // namespace

Buffer allocate(const Arena& arena, DeviceOps& dev, MemoryTracker& tracker, AllocOptions opts) {
  if (arena.bytes == 0) return {};
  ZERO_CHECK(arena.tier != Tier::kNvme, kInternal, "allocate: an NVMe arena is a file");
  return arena.tier == Tier::kPinned ? Buffer::pinned(tracker, arena.category, arena.bytes, opts)
                                     : dev.alloc(tracker, arena.category, arena.bytes, opts);
}

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
  const std::string r = std::to_string(rank);
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
  if (in.overlap_step) {
    // The speculative step starts when a unit's reduced gradient shard lands in host memory:
    // ZeRO-Offload's gradient partition, stages 2-3 with the optimizer offloaded.
    ZERO_CHECK(in.policy.shard_gradients && in.optimizer_offload != OffloadDevice::kNone, kConfig,
               "config key 'zero_optimization.offload_optimizer.overlap_step' = true needs "
               "zero_optimization.stage 2 or 3 with 'zero_optimization.offload_optimizer.device' "
               "= \"cpu\" or \"nvme\" (stage is ",
               z.stage, ", device \"", to_string(in.optimizer_offload),
               "\"): it overlaps the offloaded step with backward, where the reduced gradient "
               "shards land in host memory");
    // Its updated parameters are written at the commit, not through the parameter file's window.
    ZERO_CHECK(in.param_offload != OffloadDevice::kNvme, kConfig,
               "config key 'zero_optimization.offload_optimizer.overlap_step' = true is not "
               "supported with 'zero_optimization.offload_param.device' = \"nvme\"");
    in.optim_swap.slots = 2;  // NVMe: the speculative chunk goes to the alternate slot
    // The updated 16-bit copy a slot carries (below) is written by the step, read at the commit.
    if (in.working != DType::kF32)
      in.optim_swap.read_parts = 1 + static_cast<std::size_t>(in.num_states);
  }
  // The updated shards reach the parameter file through the offloaded optimizer's chunk loop:
  // every unit must be stepped there (with device cpu, the ratio keeps the leading units on the
  // device).
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
  return in;
}

namespace {

// Unit u's stepped range [begin, begin + count) cut into runs of one parameter group.
std::vector<GroupRun> group_runs(const PlacementInput& in, const Layout& lay, UnitId u,
                                 std::size_t begin, std::size_t count) {
  const UnitSpec& spec = in.units[static_cast<std::size_t>(u)];
  const UnitLayout& ul = lay.units[static_cast<std::size_t>(u)];
  auto check = [&](int g, const auto&... what) {
    ZERO_CHECK(g >= 0 && g < in.num_groups, kInvalidArgument, "unit '", spec.name, "'", what...,
               ": parameter group ", g, " does not exist (", in.num_groups,
               " group(s): 0 is the optimizer's own, 1.. those added)");
  };
  // Start of each group's stretch over the padded unit (a parameter owns its padding).
  std::map<std::size_t, int> starts;
  for (std::size_t k = 0; k < spec.params.size(); ++k) {
    const int g = spec.params[k].group;
    check(g, " parameter '", spec.params[k].name, "'");
    starts[k == 0 ? 0 : ul.params[k].offset] = g;
  }
  for (const GroupSpan& s : in.group_spans) {
    if (s.unit != u) continue;
    check(s.group, " elements [", s.begin, ", ", s.end, ")");
    ZERO_CHECK(s.begin < s.end && s.end <= ul.numel, kInvalidArgument, "unit '", spec.name,
               "': parameter group span [", s.begin, ", ", s.end, ") is empty or outside its ",
               ul.numel, " elements");
    const int after = std::prev(starts.upper_bound(s.end))->second;
    starts.erase(starts.lower_bound(s.begin), starts.upper_bound(s.end));
    starts[s.begin] = s.group;
    if (s.end < ul.padded) starts.emplace(s.end, after);
  }
  std::vector<GroupRun> runs;
  for (auto it = starts.begin(); it != starts.end(); ++it) {
    const std::size_t next = std::next(it) == starts.end() ? ul.padded : std::next(it)->first;
    const std::size_t lo = std::max(it->first, begin), hi = std::min(next, begin + count);
    if (lo >= hi) continue;
    if (!runs.empty() && runs.back().group == it->second) {
      runs.back().count += hi - lo;
    } else {
      runs.push_back({lo - begin, hi - lo, it->second});
    }
  }
  return runs;
}

}  // namespace

bool frozen_unit(const UnitSpec& spec) {
  const ParamSpec* frozen = nullptr;
  const ParamSpec* trained = nullptr;
  for (const ParamSpec& ps : spec.params) (ps.trainable ? trained : frozen) = &ps;
  ZERO_CHECK(frozen == nullptr || trained == nullptr, kInvalidArgument, "unit '", spec.name,
             "' mixes frozen and trainable parameters ('", frozen->name, "' is frozen, '",
             trained->name,
             "' is not): a unit is reduced and stepped as a whole; declare its frozen parameters "
             "in a unit of their own");
  return frozen != nullptr;
}

TagLayout Placement::tag_layout(UnitId first, UnitId last) const {
  TagLayout t;
  for (UnitId u = first; u <= last; ++u) {
    t.elements += lay(u).numel;
    t.digest = u == first ? lay(u).digest : XXH3_64bits_withSeed(&lay(u).digest, 8, t.digest);
  }
  return t;
}

Placement make_placement(PlacementInput in) {
  Placement p;
  // int8 moments: shards start on a quantization block (blocks never straddle two ranks).
  p.layout = make_layout(in.units, in.world_size, in.alignment, state_block(in.state_dtype));
  p.in = std::move(in);
  const PlacementInput& i = p.in;
  const StagePolicy& pol = i.policy;
  const Layout& lay = p.layout;
  const std::size_t nu = lay.units.size();
  const std::size_t ws = dtype_size(i.working), rs = dtype_size(i.reduce);
  const bool managed = i.ownership == Ownership::kManaged;

  p.host_params = i.param_offload == OffloadDevice::kCpu;
  p.nvme_params = i.param_offload == OffloadDevice::kNvme;
  // fp32 training keeps no master copy for the units stepped on the device (the parameters are
  // the master); an offloaded unit's master lives with its optimizer state off the device.
  p.separate_master = i.working != DType::kF32;
  // Attach, W == R, A == 1: reduced in the trainer's buffer, unless frozen units cut it (the
  // trainable units' gradients are then not consecutive there: the engine accumulates them).
  p.grads_in_trainer = !managed && i.working == i.reduce && i.accumulation == 1 &&
                       std::none_of(i.units.begin(), i.units.end(), frozen_unit);

  // ---- units: parameters, stepped ranges
  p.units.resize(nu);
  std::size_t whole = 0, sharded = 0, max_shard = 0, max_trainable = 0;
  for (std::size_t u = 0; u < nu; ++u) {
    const UnitLayout& ul = lay.units[u];
    UnitPlacement& up = p.units[u];
    up.frozen = frozen_unit(i.units[u]);
    up.kept_whole = !pol.shard_params || ul.numel < i.persistence_threshold;
    if (up.kept_whole) {
      up.params_offset = whole;
      whole += ul.padded;
    } else {
      if (p.nvme_params) {
        up.param_slot = p.param_slot_elems.size();
        p.param_slot_elems.push_back(ul.shard);
      } else {
        up.params_offset = sharded;
        sharded += ul.shard;
      }
      max_shard = std::max(max_shard, ul.shard);
    }
    up.step_begin = pol.shard_optimizer ? static_cast<std::size_t>(i.rank) * ul.shard : 0;
    up.step_count = pol.shard_optimizer ? ul.shard : ul.padded;
    if (up.frozen) continue;
    p.trainable_step += up.step_count;
    p.trainable_padded += ul.padded;
    max_trainable = std::max(max_trainable, ul.padded);
    up.runs = group_runs(p.in, lay, static_cast<UnitId>(u), up.step_begin, up.step_count);
  }

  // ---- the optimizer's tier per unit (offload_optimizer.device and ratio)
  // Offload to host memory: the device leads, pinned memory trails. To NVMe: pinned memory
  // leads, the swap file trails (DeepSpeed's ratio on NVMe: the fraction in the file).
  const bool nvme = i.optimizer_offload == OffloadDevice::kNvme;
  const Tier lead = nvme ? Tier::kPinned : Tier::kDevice;
  const Tier trail = nvme ? Tier::kNvme : Tier::kPinned;
  const std::size_t cut = i.optimizer_offload == OffloadDevice::kNone
                              ? nu
                              : offload_cut(p.units, i.offload_ratio, p.trainable_step);
  for (std::size_t u = 0; u < nu; ++u) {
    UnitPlacement& up = p.units[u];
    up.optim_tier = !up.frozen && u >= cut ? trail : lead;
    if (up.frozen) continue;
    if (u >= cut) p.offload_step += up.step_count;
    p.on_device = p.on_device || up.optim_tier == Tier::kDevice;
    p.offloaded = p.offloaded || up.optim_tier != Tier::kDevice;
    p.nvme_optimizer = p.nvme_optimizer || up.optim_tier == Tier::kNvme;
    // ZeRO-Offload keeps the gradient partition with the optimizer on the host: in stages 2-3
    // the reduced shards are accumulated there as they complete. Stage 1 reduces whole
    // gradients on the device at the boundary; its shard is staged chunk by chunk at the step.
    up.grads_on_host = up.optim_tier != Tier::kDevice && pol.shard_gradients;
  }

  // ---- offsets in the tiers' arenas: the trainable units of each, consecutive in unit order
  std::size_t device_step = 0, host_step = 0, device_grads = 0, host_grads = 0;
  for (std::size_t u = 0; u < nu; ++u) {
    UnitPlacement& up = p.units[u];
    const std::size_t acc = pol.shard_gradients ? lay.units[u].shard : lay.units[u].padded;
    const bool pinned = up.optim_tier == Tier::kPinned;
    up.optim_offset = pinned ? host_step : device_step;
    up.grads_offset = up.grads_on_host ? host_grads : device_grads;
    if (up.frozen) continue;
    if (up.optim_tier == Tier::kDevice) device_step += up.step_count;
    if (pinned) host_step += up.step_count;
    (up.grads_on_host ? host_grads : device_grads) += acc;
  }

  // ---- parameters
  if (managed) p.params_whole = on(Tier::kDevice, MemCategory::kParams16, whole * ws);
  p.params_shard =
      on(p.host_params ? Tier::kPinned : Tier::kDevice, MemCategory::kParams16, sharded * ws);
  if (p.nvme_params) {
    p.param_parts = {{MemCategory::kParams16, ws}};
    p.param_file = offload::ChunkSwapper::footprint(p.param_slot_elems, p.param_parts);
    p.param_window =
        on(Tier::kPinned, MemCategory::kOffloadStaging, p.param_file.staging_buffer_bytes);
    // The prefetch reads a shard straight into an aligned tail of its gathered buffer where the
    // host can address it; a discrete device reads into the window and copies.
    if (i.host_accessible) p.gather_extra = p.param_file.staging_buffer_bytes;
  }

  // ---- master and optimizer state, each tier's units in its arenas (the swap file: chunks).
  // Every stepped range is a whole number of int8 blocks: an arena is its ranges' sum.
  const MomentDType sd = i.state_dtype;
  if (p.separate_master) p.master = on(Tier::kDevice, MemCategory::kMasterParams, device_step * 4);
  p.state = on(Tier::kDevice, MemCategory::kOptimizerState, state_bytes(sd, device_step));
  p.host_master = on(Tier::kPinned, MemCategory::kMasterParams, host_step * 4);
  p.host_state = on(Tier::kPinned, MemCategory::kOptimizerState, state_bytes(sd, host_step));
  if (p.offloaded) {
    // A chunk never needs to be larger than the largest offloaded range (DeepSpeed's
    // buffer_size default of 1e8 elements would otherwise pin gigabytes for a small model).
    std::size_t max_range = 0;
    for (const UnitPlacement& up : p.units) {
      if (!up.frozen && up.optim_tier != Tier::kDevice) {
        max_range = std::max(max_range, up.step_count);
      }
    }
    p.chunk_elems = std::max<std::size_t>(1, std::min(i.offload_chunk, max_range));
    // int8 moments: a chunk is a whole number of quantization blocks (each stepped whole).
    const std::size_t qb = state_block(sd);
    p.chunk_elems = (p.chunk_elems + qb - 1) / qb * qb;
  }
  // The offloaded units' chunks, in unit order: the pinned tier's, then the swap file's.
  for (std::size_t u = 0; u < nu; ++u) {
    p.unit_chunk.push_back(p.chunks.size());
    const UnitPlacement& up = p.units[u];
    const std::size_t range = up.frozen || up.optim_tier == Tier::kDevice ? 0 : up.step_count;
    for (std::size_t a = 0; a < range; a += p.chunk_elems) {
      p.chunks.push_back({static_cast<UnitId>(u), a, std::min(p.chunk_elems, range - a)});
      if (up.optim_tier != Tier::kNvme) p.nvme_chunk = p.chunks.size();
    }
  }
  p.unit_chunk.push_back(p.chunks.size());
  if (p.offloaded) {
    // Persistent staging, one chunk per buffer: the gradient chunk where the gradients stay on
    // the device (stage 1), the updated 16-bit parameters (fp32: the master is copied directly).
    if (!pol.shard_gradients) {
      p.staging_grad = on(Tier::kPinned, MemCategory::kOffloadStaging, p.chunk_elems * rs);
    }
    if (i.working != DType::kF32) {
      p.staging_param = on(Tier::kPinned, MemCategory::kOffloadStaging, p.chunk_elems * ws);
    }
  }
  if (p.nvme_optimizer) {
    for (std::size_t c = p.nvme_chunk; c < p.chunks.size(); ++c) {
      p.optim_chunk_elems.push_back(p.chunks[c].count);
    }
    p.optim_parts = {{MemCategory::kMasterParams, 4}};
    for (int k = 0; k < i.num_states; ++k) {
      // The state's bytes per element and per block, from the optimizer's rule.
      const std::size_t block = state_block(i.state_dtype);
      const std::size_t per_block = state_bytes(i.state_dtype, block);
      p.optim_parts.push_back(
          {MemCategory::kOptimizerState, per_block / block, block, per_block % block});
    }
    // The speculative step's updated 16-bit parameters ride in the slot (written at the commit).
    if (i.overlap_step && i.working != DType::kF32) {
      p.optim_parts.push_back({MemCategory::kParams16, ws});
    }
    p.optim_file =
        offload::ChunkSwapper::footprint(p.optim_chunk_elems, p.optim_parts, i.optim_swap.slots);
  }
  if (i.overlap_step && p.nvme_chunk > 0) {
    // The pinned chunks' window: as many chunks as the pipeline's staging buffers.
    p.spec_chunks = std::min(i.offload_buffers, p.nvme_chunk);
    const std::size_t n = p.chunk_elems;
    p.spec_window =
        on(Tier::kPinned, MemCategory::kOffloadStaging,
           p.spec_part_offset(i.num_states + 1) + (i.working != DType::kF32 ? n * ws : 0));
  }

  // ---- gradients: the device's arena (none when reduced in the trainer's buffer) and the
  // partition on the host
  if (!p.grads_in_trainer) p.grads = on(Tier::kDevice, MemCategory::kGradients, device_grads * rs);
  p.host_grads = on(Tier::kPinned, MemCategory::kGradients, host_grads * rs);

  // ---- buckets
  const bool bucketed = pol.shard_optimizer;  // stage 0 all-reduces everything at once
  // A merged bucket's reduced part lands consecutively in one gradient arena: a bucket never
  // spans the device's gradients and the host partition (partial offload, stages 2-3).
  p.reduce_buckets = make_buckets(
      lay, bucketed ? i.reduce_bucket : 0,
      [&](UnitId u) { return !p.units[static_cast<std::size_t>(u)].frozen; },
      [&](UnitId u) { return p.grads_on_host(u); },
      [&](UnitId u, int b, std::size_t off) {
        p.units[static_cast<std::size_t>(u)].reduce_bucket = b;
        p.units[static_cast<std::size_t>(u)].reduce_offset = off;
      });
  p.gather_buckets = make_buckets(
      lay, i.allgather_bucket,
      [&](UnitId u) {
        const UnitPlacement& up = p.units[static_cast<std::size_t>(u)];
        return bucketed && up.kept_whole && !up.frozen;  // a frozen unit is never updated
      },
      [](UnitId) { return 0; },
      [&](UnitId u, int b, std::size_t off) {
        p.units[static_cast<std::size_t>(u)].gather_bucket = b;
        p.units[static_cast<std::size_t>(u)].gather_offset = off;
      });
  std::size_t max_reduce_bucket = 0, max_gather_bucket = 0, max_reduce_shard = 0;
  std::size_t max_host_shard = 0;  // of the buckets reduced into the host partition
  const auto n = static_cast<std::size_t>(i.world_size);
  for (const Bucket& b : p.reduce_buckets) {
    max_reduce_shard = std::max(max_reduce_shard, b.shard);
    if (p.grads_on_host(b.first)) max_host_shard = std::max(max_host_shard, b.shard);
    if (b.merged()) max_reduce_bucket = std::max(max_reduce_bucket, n * b.shard);
  }
  for (const Bucket& b : p.gather_buckets) {
    if (b.merged()) max_gather_bucket = std::max(max_gather_bucket, n * b.shard);
  }
  p.max_in_flight = i.overlap_comm ? kCollectivesInFlight : 0;

  // ---- pools
  // Gradients are written and reduced for trainable units only.
  p.grad_pool = {MemCategory::kGradients, max_trainable * ws};
  p.reduce_pool = {MemCategory::kCommBuffers, max_trainable * rs};
  p.bucket_pool = {MemCategory::kCommBuffers, max_reduce_bucket * rs};
  p.gather_pool = {MemCategory::kParams16, lay.max_padded * ws + p.gather_extra};
  p.gather_bucket_pool = {MemCategory::kCommBuffers, max_gather_bucket * ws};
  if (i.quantized_weights) {
    std::size_t max_shard = 0;
    for (std::size_t u = 0; u < nu; ++u) {
      if (!p.units[u].kept_whole) max_shard = std::max(max_shard, lay.units[u].shard);
    }
    if (max_shard > 0) {
      p.quant_gather_pool = {
          MemCategory::kCommBuffers,
          quantized_all_gather_staging_bytes(i.world_size, max_shard, i.quant_block)};
    }
  }
  if (i.quantized_gradients) {
    std::size_t bytes =
        quantized_reduce_scatter_staging_bytes(i.world_size, max_reduce_shard, i.quant_block);
    if (i.replicas > 1) {
      bytes = std::max(
          bytes, quantized_all_reduce_staging_bytes(i.replicas, max_reduce_shard, i.quant_block));
    }
    p.quant_reduce_pool = {MemCategory::kCommBuffers, bytes};
  }

  // ---- a discrete device: what the host needs from its memory lands in pinned memory first
  if (!i.host_accessible) {
    p.grad_landing = on(Tier::kPinned, MemCategory::kOffloadStaging, max_host_shard * rs);
    p.stats_scratch = on(Tier::kDevice, MemCategory::kCommBuffers, 4 * (n + 1) * sizeof(float));
  }
  return p;
}

}  // namespace zero::detail
