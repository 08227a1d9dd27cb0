// The ZeRO engine. One code path; the stage (StagePolicy) decides what is kept whole, what is
// sharded and which collective runs where.
#include "zero/engine.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <string>
#include <utility>

#include "offload/nvme_swapper.hpp"
#include "zero/error.hpp"
#include "zero/grad_accumulate.hpp"
#include "zero/layout.hpp"
#include "zero/log.hpp"
#include "zero/loss_scaler.hpp"
#include "zero/lr_schedule.hpp"
#include "zero/optimizer.hpp"

namespace zero {

namespace {

// ---- the stage as a policy

struct StagePolicy {
  int stage = 0;
  bool shard_optimizer = false;  // master + state for this rank's shard only (1, 2, 3)
  bool shard_gradients = false;  // reduce every micro-step into a gradient shard (2, 3)
  bool shard_params = false;     // parameters kept as shards, gathered on use (3)

  static StagePolicy of(int stage) {
    StagePolicy p;
    p.stage = stage;
    p.shard_optimizer = stage >= 1;
    p.shard_gradients = stage >= 2;
    p.shard_params = stage >= 3;
    return p;
  }
};

char* at(void* base, std::size_t elems, DType t) {
  return static_cast<char*>(base) + elems * dtype_size(t);
}

// Signalling-NaN-free poison: a quiet NaN pattern in every 16-bit or 32-bit element.
constexpr unsigned char kPoisonByte = 0xff;

// A pool of equal-sized device buffers of one category (in-flight gradients, reduce staging,
// gathered parameters): allocated on demand, reused, never freed before the engine.
class BufferPool {
 public:
  BufferPool(DeviceOps& d, MemoryTracker& t, MemCategory c, std::size_t bytes)
      : d_(d), t_(t), c_(c), bytes_(bytes) {}
  Buffer take() {
    if (!free_.empty()) {
      Buffer b = std::move(free_.back());
      free_.pop_back();
      return b;
    }
    ++allocated_;
    return d_.alloc(t_, c_, bytes_);
  }
  void give(Buffer b) {
    if (!b.empty()) free_.push_back(std::move(b));
  }
  std::size_t allocated() const { return allocated_; }

 private:
  DeviceOps& d_;
  MemoryTracker& t_;
  MemCategory c_;
  std::size_t bytes_;
  std::vector<Buffer> free_;
  std::size_t allocated_ = 0;
};

}  // namespace

// ---- GatherGuard

GatherGuard::GatherGuard(GatherGuard&& o) noexcept : engine_(o.engine_), unit_(o.unit_) {
  o.engine_ = nullptr;
}
GatherGuard& GatherGuard::operator=(GatherGuard&& o) noexcept {
  if (this != &o) {
    release();
    engine_ = o.engine_;
    unit_ = o.unit_;
    o.engine_ = nullptr;
  }
  return *this;
}
GatherGuard::~GatherGuard() {
  try {
    release();
  } catch (const std::exception& e) {
    ZERO_LOG(kError, "releasing unit ", unit_, " failed: ", e.what());
  }
}
void GatherGuard::release() {
  if (engine_ != nullptr) {
    Engine* e = engine_;
    engine_ = nullptr;
    e->release(unit_);
  }
}
View GatherGuard::param(int i) const {
  ZERO_CHECK(engine_ != nullptr, kInvalidArgument, "GatherGuard::param(", i,
             ") on an empty or released guard");
  return engine_->param_view(unit_, i);
}

// ---- Engine::Impl

struct Engine::Impl {
  struct Pending {  // a reduce-scatter in flight (stages 2-3)
    UnitId unit;
    CommHandle handle;
    Buffer buffer;        // R-typed, the unit's full gradients reduced in place
    bool from_grad_pool;  // W == R: the gradient buffer itself
  };
  struct UnitState {
    Buffer grad;                         // W, in-flight gradients of this micro-step
    bool ready = false;                  // grads_ready called this micro-step
    Buffer gathered;                     // stage 3: the whole unit's parameters
    CommHandle prefetch;                 // stage 3: all-gather in flight into `gathered`
    int holders = 0;                     // live guards
    bool persistent = false;             // stage 3: kept whole (below the persistence threshold)
    std::size_t whole_offset = 0;        // in params_whole (units kept whole)
    std::size_t shard_param_offset = 0;  // in params_shard (stage 3 sharded units)
    offload::AioQueue::Ticket shard_read = 0;  // offload_param = nvme: prefetch read in flight
  };

  Communicator& comm;
  Config cfg;
  EngineOptions opts;
  StagePolicy policy;
  int n = 1;
  int rank = 0;
  DType w = DType::kF32;  // working (param and gradient) dtype
  DType r = DType::kF32;  // reduce / gradient accumulation dtype
  std::unique_ptr<MemoryTracker> own_tracker;
  MemoryTracker* tracker = nullptr;
  // The device (parameters, gradients, the optimizer without offload) and the host optimizer
  // (the offloaded state, the gradient partition on the host).
  std::shared_ptr<DeviceOps> dev;
  CpuOptimizer optimizer;
  OptimizerParams oparams;
  LossScaler scaler;
  LrSchedule schedule;

  std::vector<UnitSpec> specs;
  detail::Layout layout;
  bool laid_out = false;
  std::vector<UnitState> units;

  Buffer params_whole;  // W: units kept whole (managed mode)
  // Attach mode: the trainer's buffers (one unit over the whole flat range).
  bool attached = false;
  char* ext_params = nullptr;
  char* ext_grads = nullptr;
  std::size_t ext_capacity = 0;
  char* whole_base() const {
    return attached ? ext_params : static_cast<char*>(params_whole.data());
  }
  // In attach mode with W == R the trainer's gradient buffer is reduced in place.
  char* acc_base() const { return attached && w == r ? ext_grads : static_cast<char*>(acc.data()); }
  Buffer params_shard;  // W: stage 3 sharded units (pinned host memory with offload_param = cpu)
  bool offload_params = false;
  // offload_param = nvme (stage 3): the sharded units' shards live in one swap file, a slot per
  // unit (param_slot[u]); `param_window` (aligned, one shard) carries a shard between the file
  // and its users: a gather copies it into its own place in the gathered buffer and all-gathers
  // in place; the optimizer writes a unit's updated shard into it, and it is written back.
  bool nvme_params = false;
  std::unique_ptr<offload::ChunkSwapper> param_swapper;
  std::vector<std::size_t> param_slot;
  Buffer param_window_mem;
  char* param_window = nullptr;
  // A prefetch reads the shard into an aligned tail of the unit's gathered buffer (`gather_extra`
  // bytes past the unit) while the trainer computes; the all-gather is launched at the next
  // gather() (a point every rank reaches in the same order), from `deferred`, in read order.
  std::size_t gather_extra = 0;
  std::deque<UnitId> deferred;
  Buffer master;  // f32 (16-bit training, or optimizer offload)
  // Optimizer offload (offload_optimizer.device = cpu | nvme). The step streams every shard in
  // chunks of `offload_chunk` elements through `offload_buffers` pinned staging buffers
  // (gradient chunk in, updated parameter chunk out). cpu: master and state live in pinned host
  // memory. nvme: they live in one swap file per rank under nvme_path, each chunk read, stepped
  // and written back through the swapper's pipeline; the file is written from the working
  // parameters when the state is first needed (what set_param would have put in the master).
  enum class OffloadTier { kNone, kHost, kNvme };
  OffloadTier offload_tier = OffloadTier::kNone;
  std::size_t offload_chunk = 0, offload_buffers = 0;
  std::vector<Buffer> staging_grad, staging_param;
  std::vector<std::uint64_t> param_fence;  // per staging buffer: its last copy out (0: none)
  std::vector<std::uint64_t> grad_fence;   // per staging buffer: its chunk's copy in
  std::size_t grads_issued = 0;            // chunks whose gradient copy in has been issued
  struct Chunk {
    UnitId unit;
    std::size_t at, count;  // elements, relative to the unit's stepped range
  };
  std::vector<Chunk> chunks;            // unit by unit, in order
  std::vector<std::size_t> unit_chunk;  // first chunk of unit u; [num_units] = chunks.size()
  std::unique_ptr<offload::ChunkSwapper> swapper;
  bool nvme_written = false;
  bool offloaded() const { return offload_tier != OffloadTier::kNone; }
  // ZeRO-Offload keeps the gradient partition with the optimizer on the host: with optimizer
  // offload in stages 2-3 the fp32 (reduce-dtype) gradient shards live in pinned host memory,
  // and each unit's reduce-scatter output is accumulated into them as it completes, during
  // backward (on CUDA: the device->host copy). Stage 1 reduces whole gradients on the device
  // at the boundary; its shard is staged chunk by chunk at the step.
  bool grads_on_host() const { return offloaded() && policy.shard_gradients; }
  Buffer state[2];       // optimizer state
  Buffer acc;            // R: gradient accumulation (whole in stages 0-1, shards in 2-3)
  Buffer grad_landing;   // discrete device, gradients on the host: a reduced shard lands here
  Buffer stats_scratch;  // discrete device: the all-gather of (norm², overflow) per rank
  std::unique_ptr<BufferPool> grad_pool, stage_pool, gather_pool;

  std::deque<Pending> pending;
  // Reduce-scatters left running when grads_ready returns: with overlap_comm one (it runs
  // while the trainer computes the next unit's backward), else none.
  std::size_t max_pending = 0;
  std::int64_t micro = 0;  // micro-steps completed in the current window
  std::int64_t steps = 0;
  std::int64_t skipped = 0;
  std::size_t live_gathered = 0;  // elements in stage-3 gathered buffers

  // Stage 3 prefetch: the order of gather() calls of one micro-step, recorded once.
  std::vector<UnitId> trace, recording;
  bool trace_valid = false;
  std::size_t trace_pos = 0;

  Impl(Communicator& c, const Config& config, EngineOptions o)
      : comm(c),
        cfg(config),
        opts(o),
        policy(StagePolicy::of(config.zero_optimization.stage)),
        n(c.size()),
        rank(c.rank()),
        optimizer(CpuExecOptions{o.isa, o.optimizer_threads, 0}),
        oparams(OptimizerParams::from_config(config.optimizer)),
        scaler(LossScaler::from_config(config.fp16)),
        schedule(LrSchedule::from_config(config.scheduler, config.optimizer.lr)) {
    w = working_dtype(cfg);
    r = reduce_dtype_of(cfg);
    if (opts.tracker == nullptr) {
      own_tracker = std::make_unique<MemoryTracker>(rank);
      tracker = own_tracker.get();
    } else {
      tracker = opts.tracker;
    }
    const OffloadConfig& oo = cfg.zero_optimization.offload_optimizer;
    offload_params = cfg.zero_optimization.offload_param.device == "cpu";
    nvme_params = cfg.zero_optimization.offload_param.device == "nvme";
    // The updated shards reach the file through the offloaded optimizer's chunk loop.
    ZERO_CHECK(!nvme_params || oo.enabled(), kConfig,
               "config key 'zero_optimization.offload_param.device' = \"nvme\" needs "
               "'zero_optimization.offload_optimizer.device' = \"cpu\" or \"nvme\" (it is \"",
               oo.device, "\")");
    offload_tier = oo.device == "cpu"    ? OffloadTier::kHost
                   : oo.device == "nvme" ? OffloadTier::kNvme
                                         : OffloadTier::kNone;
    offload_chunk = static_cast<std::size_t>(oo.buffer_size);
    offload_buffers = static_cast<std::size_t>(oo.buffer_count);
    if (!opts.poison_released.has_value()) {
#ifdef NDEBUG
      opts.poison_released = false;
#else
      opts.poison_released = true;
#endif
    }
    max_pending = cfg.zero_optimization.overlap_comm ? 1 : 0;
    dev = opts.device_ops != nullptr
              ? opts.device_ops
              : make_device_ops(opts.device,
                                {CpuExecOptions{o.isa, o.optimizer_threads, 0}, opts.cuda_stream});
    const ZeroOptimizationConfig defaults;
    if (cfg.zero_optimization.reduce_bucket_size != defaults.reduce_bucket_size ||
        cfg.zero_optimization.allgather_bucket_size != defaults.allgather_bucket_size) {
      ZERO_LOG(kInfo,
               "reduce_bucket_size / allgather_bucket_size merge nothing here: each "
               "declared unit is one bucket (declare larger units for larger collectives)");
    }
    const bool nccl = comm.backend() == "nccl";
    ZERO_CHECK(nccl == dev->device().is_cuda(), kConfig, "the engine runs on ",
               dev->device().to_string(), " but the communicator is '", comm.backend(), "' (",
               dev->device().is_cuda() ? "a CUDA device needs comm_backend 'nccl'"
                                       : "NCCL needs EngineOptions::device = Device::cuda(k)",
               ")");
  }

  bool kept_whole(UnitId u) const { return !policy.shard_params || units[u].persistent; }
  const detail::UnitLayout& lay(UnitId u) const {
    return layout.units[static_cast<std::size_t>(u)];
  }
  std::size_t own_begin(UnitId u) const { return static_cast<std::size_t>(rank) * lay(u).shard; }

  void check_unit(UnitId u, const char* what) const {
    ZERO_CHECK(u >= 0 && u < static_cast<int>(specs.size()), kInvalidArgument, what,
               ": unknown unit id ", u, " (", specs.size(), " units registered)");
  }
  const std::string& name(UnitId u) const { return specs[static_cast<std::size_t>(u)].name; }

  // ---- layout and allocation, on first use
  void lay_out() {
    if (laid_out) return;
    ZERO_CHECK(!specs.empty(), kInvalidArgument,
               "the engine has no units: declare them with add_unit() first");
    layout = detail::make_layout(specs, n, opts.alignment);
    units.resize(specs.size());
    const auto threshold =
        static_cast<std::size_t>(cfg.zero_optimization.stage3_param_persistence_threshold);
    std::size_t whole = 0, sharded = 0;
    for (std::size_t u = 0; u < specs.size(); ++u) {
      UnitState& us = units[u];
      us.persistent = policy.shard_params && layout.units[u].numel < threshold;
      if (!policy.shard_params || us.persistent) {
        us.whole_offset = whole;
        whole += layout.units[u].padded;
      } else {
        us.shard_param_offset = sharded;
        sharded += layout.units[u].shard;
      }
    }
    const std::size_t ws = dtype_size(w), rs = dtype_size(r);
    if (attached) {
      const std::size_t need = layout.total_padded;
      ZERO_CHECK(ext_capacity >= need, kInvalidArgument, "attach: the buffers hold ", ext_capacity,
                 " elements; ", specs[0].params[0].numel(), " parameters at ", n, " ranks need ",
                 need, " (padded to a multiple of ", n, " x ", opts.alignment,
                 "): allocate zero::attach_capacity(", specs[0].params[0].numel(), ", ", n,
                 ") elements");
      // The padding must be zero (it is stepped and gathered like the rest).
      dev->fill(ext_params + specs[0].params[0].numel() * ws, 0,
                (need - specs[0].params[0].numel()) * ws);
    } else {
      params_whole = dev->alloc(*tracker, MemCategory::kParams16, whole * ws, {.zero = true});
    }
    // offload_param = cpu (stage 3): the shards live in pinned host memory and every gather
    // all-gathers from there into a device buffer (on a CPU-only build: the host tier).
    if (nvme_params) {
      std::vector<std::size_t> sizes;
      param_slot.assign(specs.size(), SIZE_MAX);
      std::size_t max_shard = 0;
      for (std::size_t u = 0; u < specs.size(); ++u) {
        if (kept_whole(static_cast<UnitId>(u))) continue;
        param_slot[u] = sizes.size();
        sizes.push_back(layout.units[u].shard);
        max_shard = std::max(max_shard, layout.units[u].shard);
      }
      const OffloadConfig& po = cfg.zero_optimization.offload_param;
      offload::ChunkSwapper::Options so;
      so.dir = po.nvme_path;
      so.stem = "param-r" + std::to_string(rank);
      so.origin = "config key 'zero_optimization.offload_param.nvme_path'";
      so.buffer_count = 0;  // the engine's window is the only buffer
      so.aio = offload::AioOptions::from_config(cfg.aio);
      param_swapper = std::make_unique<offload::ChunkSwapper>(
          *tracker, sizes, std::vector<offload::ChunkSwapper::Part>{{MemCategory::kParams16, ws}},
          std::move(so));
      param_window_mem = Buffer::pinned(
          *tracker, MemCategory::kOffloadStaging,
          offload::align_up(max_shard * ws) + offload::kDirectAlignment, {.zero = true});
      param_window = reinterpret_cast<char*>(
          offload::align_up(reinterpret_cast<std::uintptr_t>(param_window_mem.data())));
      // The file starts as the shards do: zeros.
      for (std::size_t c = 0; c < sizes.size(); ++c) param_swapper->write_slot(c, param_window);
      sharded = 0;  // nothing of them in memory
      // The prefetch reads straight into the gathered buffer where the host can address it; a
      // discrete device reads into the window and copies (synchronously, no read ahead).
      if (dev->host_accessible()) {
        gather_extra = offload::align_up(max_shard * ws) + offload::kDirectAlignment;
      }
    }
    params_shard =
        offload_params
            ? Buffer::pinned(*tracker, MemCategory::kParams16, sharded * ws, {.zero = true})
            : dev->alloc(*tracker, MemCategory::kParams16, sharded * ws, {.zero = true});
    const std::size_t opt_elems = policy.shard_optimizer ? layout.total_shard : layout.total_padded;
    auto opt_alloc = [&](MemCategory c, std::size_t bytes, AllocOptions o) {
      return offloaded() ? Buffer::pinned(*tracker, c, bytes, o)
                         : dev->alloc(*tracker, c, bytes, o);
    };
    const DType sd = oparams.state_dtype();
    if (offload_tier != OffloadTier::kNvme) {
      if (separate_master()) {
        master = opt_alloc(MemCategory::kMasterParams, opt_elems * 4, {.zero = true});
      }
      for (int k = 0; k < oparams.num_states(); ++k) {
        state[k] = opt_alloc(MemCategory::kOptimizerState, opt_elems * dtype_size(sd), {});
      }
    }
    if (offloaded()) {
      // A chunk never needs to be larger than the largest stepped range (DeepSpeed's
      // buffer_size default of 1e8 elements would otherwise pin gigabytes for a small model).
      std::size_t max_range = 0;
      for (UnitId u = 0; u < static_cast<int>(specs.size()); ++u) {
        max_range = std::max(max_range, step_count(u));
      }
      offload_chunk = std::max<std::size_t>(1, std::min(offload_chunk, max_range));
      for (UnitId u = 0; u < static_cast<int>(specs.size()); ++u) {
        unit_chunk.push_back(chunks.size());
        for (std::size_t a = 0; a < step_count(u); a += offload_chunk) {
          chunks.push_back({u, a, std::min(offload_chunk, step_count(u) - a)});
        }
      }
      unit_chunk.push_back(chunks.size());
      // Persistent staging: allocated once, reused every step (no allocation per step). The
      // gradient chunk is staged only where the gradients stay on the device (stage 1).
      for (std::size_t b = 0; b < offload_buffers; ++b) {
        if (!grads_on_host()) {
          staging_grad.push_back(
              Buffer::pinned(*tracker, MemCategory::kOffloadStaging, offload_chunk * rs));
        }
        if (w != DType::kF32) {  // fp32: the pinned master is copied to the parameters directly
          staging_param.push_back(
              Buffer::pinned(*tracker, MemCategory::kOffloadStaging, offload_chunk * ws));
        }
      }
    }
    if (offload_tier == OffloadTier::kNvme) {
      const OffloadConfig& oo = cfg.zero_optimization.offload_optimizer;
      std::vector<std::size_t> sizes;
      for (const Chunk& c : chunks) sizes.push_back(c.count);
      std::vector<offload::ChunkSwapper::Part> parts{{MemCategory::kMasterParams, 4}};
      for (int k = 0; k < oparams.num_states(); ++k) {
        parts.push_back({MemCategory::kOptimizerState, dtype_size(sd)});
      }
      offload::ChunkSwapper::Options so;
      so.dir = oo.nvme_path;
      so.stem = "optim-r" + std::to_string(rank);
      so.origin = "config key 'zero_optimization.offload_optimizer.nvme_path'";
      so.buffer_count = offload_buffers;
      so.pipeline_read = oo.pipeline_read;
      so.pipeline_write = oo.pipeline_write;
      so.aio = offload::AioOptions::from_config(cfg.aio);
      swapper = std::make_unique<offload::ChunkSwapper>(*tracker, std::move(sizes),
                                                        std::move(parts), std::move(so));
    } else {
      // Zero the state in the partitioning the step uses (first touch lands here).
      for (UnitId u = 0; u < static_cast<int>(specs.size()); ++u) {
        ShardRef ref = shard_ref(u);
        if (offloaded()) {
          optimizer.init_state(oparams, ref);
        } else {
          dev->init_state(oparams, ref);
        }
      }
    }
    const std::size_t acc_elems = policy.shard_gradients ? layout.total_shard : layout.total_padded;
    if (grads_on_host()) {
      acc = Buffer::pinned(*tracker, MemCategory::kGradients, acc_elems * rs, {.zero = true});
    } else if (!attached || w != r) {
      acc = dev->alloc(*tracker, MemCategory::kGradients, acc_elems * rs, {.zero = true});
    }
    grad_pool = std::make_unique<BufferPool>(*dev, *tracker, MemCategory::kGradients,
                                             layout.max_padded * ws);
    stage_pool = std::make_unique<BufferPool>(*dev, *tracker, MemCategory::kCommBuffers,
                                              layout.max_padded * rs);
    gather_pool = std::make_unique<BufferPool>(*dev, *tracker, MemCategory::kParams16,
                                               layout.max_padded * ws + gather_extra);
    if (!dev->host_accessible()) {
      // A discrete device: the host cannot read its memory, so what the host needs from it
      // lands in pinned memory first (the reduced gradient shards when the partition is on the
      // host), and the all-gather of the norm and overflow flags runs on a device buffer.
      if (grads_on_host()) {
        grad_landing = Buffer::pinned(*tracker, MemCategory::kOffloadStaging,
                                      layout.max_padded / static_cast<std::size_t>(n) * rs);
      }
      stats_scratch = dev->alloc(*tracker, MemCategory::kCommBuffers,
                                 static_cast<std::size_t>(4 * (n + 1)) * sizeof(float));
    }
    laid_out = true;
  }

  // ---- where things are

  // The range of unit u this rank steps: the whole unit in stage 0, its shard otherwise.
  std::size_t step_begin(UnitId u) const { return policy.shard_optimizer ? own_begin(u) : 0; }
  std::size_t step_count(UnitId u) const {
    return policy.shard_optimizer ? lay(u).shard : lay(u).padded;
  }
  std::size_t opt_offset(UnitId u) const {
    return policy.shard_optimizer ? lay(u).shard_offset : lay(u).full_offset;
  }
  // The working-dtype storage of the stepped range.
  // offload_param = nvme: the window; it holds unit u's shard only between load_shard(u) (or the
  // optimizer writing all of it) and store_shard(u).
  char* param_step_ptr(UnitId u) {
    const UnitState& us = units[static_cast<std::size_t>(u)];
    if (kept_whole(u)) return at(whole_base(), us.whole_offset + step_begin(u), w);
    if (nvme_params) return param_window;
    return at(params_shard.data(), us.shard_param_offset, w);
  }
  // fp32 training keeps no master copy (the parameters are the master) unless the optimizer is
  // offloaded: then the master lives with the optimizer state in host memory.
  bool separate_master() const { return w != DType::kF32 || offloaded(); }
  // REQUIRES: the master is in memory (not NVMe-offloaded).
  float* master_ptr(UnitId u) {
    if (!separate_master()) return reinterpret_cast<float*>(param_step_ptr(u));
    ZERO_CHECK(offload_tier != OffloadTier::kNvme, kInternal, "master_ptr with NVMe offload");
    return master.as<float>() + opt_offset(u);
  }
  char* acc_ptr(UnitId u) {
    if (policy.shard_gradients) return at(acc_base(), lay(u).shard_offset, r);
    return at(acc_base(), lay(u).full_offset + step_begin(u), r);
  }
  ShardRef shard_ref(UnitId u) {
    ShardRef s;
    s.count = step_count(u);
    s.master = master_ptr(u);
    s.grad = acc_ptr(u);
    s.grad_dtype = r;
    const DType sd = oparams.state_dtype();
    for (int k = 0; k < oparams.num_states(); ++k) {
      s.state[k] = at(state[k].data(), opt_offset(u), sd);
    }
    if (w != DType::kF32) {
      s.param_copy = param_step_ptr(u);
      s.param_copy_dtype = w;
    }
    return s;
  }

  // One chunk of the offloaded optimizer step: the gradient chunk copied in ("device" ->
  // pinned), the fused step on the host master and state (resident in pinned memory, or the
  // swapper's staging buffer) writing the updated parameters into staging, staging copied back
  // to the parameters. On a CUDA build the two copies are the device<->host transfers; on a CPU
  // build both sides are host memory, so the pipeline's logic runs and is tested, and the host
  // tier saves nothing.
  //
  // On a discrete device the transfers run on the copy lane: chunk c's gradients are copied in
  // before it is stepped, and its parameters copied out while later chunks are stepped; a staging
  // buffer is reused only after its last copy out has landed (param_fence).
  void offloaded_chunk_step(const OptimizerParams& p, std::size_t c, float* master_part,
                            char* const* state_part, std::int64_t step, float grad_scale) {
    const Chunk& ch = chunks[c];
    const std::size_t rs = dtype_size(r), ws = dtype_size(w);
    const std::size_t b = c % offload_buffers;
    const char* grad = acc_ptr(ch.unit) + ch.at * rs;
    if (!grads_on_host()) {
      // Double-buffered: chunk c + 1's gradients are copied in while chunk c steps (with two or
      // more buffers; the buffer it takes was last used by a chunk already stepped).
      const std::size_t ahead = std::min(chunks.size(), c + (offload_buffers > 1 ? 2 : 1));
      while (grads_issued < ahead) issue_grad_copy(grads_issued++);
      dev->wait(grad_fence[b]);
      grad = static_cast<const char*>(staging_grad[b].data());
    }
    ShardRef part;
    part.count = ch.count;
    part.master = master_part;
    part.grad = grad;
    part.grad_dtype = r;
    for (int k = 0; k < oparams.num_states(); ++k) part.state[k] = state_part[k];
    char* params = param_step_ptr(ch.unit) + ch.at * ws;
    if (w != DType::kF32) {
      if (param_fence[b] != 0) dev->wait(std::exchange(param_fence[b], 0));
      part.param_copy = staging_param[b].data();
      part.param_copy_dtype = w;
    }
    optimizer.step(p, part, step, grad_scale);
    // fp32: the parameters are the master's copy.
    const void* updated = w != DType::kF32 ? part.param_copy : part.master;
    if (shard_on_nvme(ch.unit)) {
      std::memcpy(params, updated, ch.count * ws);  // the window is host memory
    } else {
      dev->copy(params, updated, ch.count * ws, DeviceOps::Lane::kCopy);
      if (w != DType::kF32) {
        param_fence[b] = dev->record(DeviceOps::Lane::kCopy);
      } else if (offload_tier == OffloadTier::kNvme) {
        dev->wait(dev->record(DeviceOps::Lane::kCopy));  // the swapper reuses the master's buffer
      }
    }
    // The window now holds the unit's whole updated shard: back to its file slot.
    if (shard_on_nvme(ch.unit) && ch.at + ch.count == step_count(ch.unit)) store_shard(ch.unit);
  }

  // Chunk c's gradients (stage 1: on the device) into its staging buffer, on the copy lane.
  void issue_grad_copy(std::size_t c) {
    const Chunk& ch = chunks[c];
    const std::size_t rs = dtype_size(r), b = c % offload_buffers;
    dev->copy(staging_grad[b].data(), acc_ptr(ch.unit) + ch.at * rs, ch.count * rs,
              DeviceOps::Lane::kCopy);
    grad_fence[b] = dev->record(DeviceOps::Lane::kCopy);
  }

  void offloaded_step(const OptimizerParams& p, std::int64_t step, float grad_scale) {
    // The copy lane starts after the gradients are complete; the host's next writes to the
    // master and the trainer's next forward come after the last parameter copy.
    dev->join(DeviceOps::Lane::kCopy, DeviceOps::Lane::kCompute);
    param_fence.assign(offload_buffers, 0);
    grad_fence.assign(offload_buffers, 0);
    grads_issued = 0;
    offloaded_chunks(p, step, grad_scale);
    dev->wait(dev->record(DeviceOps::Lane::kCopy));
    dev->join(DeviceOps::Lane::kCompute, DeviceOps::Lane::kCopy);
  }
  void offloaded_chunks(const OptimizerParams& p, std::int64_t step, float grad_scale) {
    if (offload_tier == OffloadTier::kNvme) {
      write_nvme_state();
      swapper->run(0, chunks.size(), /*read=*/true, /*write=*/true,
                   [&](const offload::ChunkSwapper::Staged& s) {
                     offloaded_chunk_step(p, s.chunk, reinterpret_cast<float*>(s.part[0]),
                                          s.part + 1, step, grad_scale);
                   });
      return;
    }
    for (std::size_t c = 0; c < chunks.size(); ++c) {
      const Chunk& ch = chunks[c];
      char* st[2] = {};
      for (int k = 0; k < oparams.num_states(); ++k) {
        st[k] = at(state[k].data(), opt_offset(ch.unit) + ch.at, oparams.state_dtype());
      }
      offloaded_chunk_step(p, c, master_ptr(ch.unit) + ch.at, st, step, grad_scale);
    }
  }

  // NVMe: the first time the state is needed, the file is written chunk by chunk: the master
  // from the working parameters (as set_param makes it), the optimizer state zeroed.
  void write_nvme_state() {
    if (nvme_written) return;
    swapper->run(0, chunks.size(), /*read=*/false, /*write=*/true,
                 [&](const offload::ChunkSwapper::Staged& s) {
                   const Chunk& ch = chunks[s.chunk];
                   if (ch.at == 0 && shard_on_nvme(ch.unit)) load_shard(ch.unit);
                   to_host_f32(param_step_ptr(ch.unit) + ch.at * dtype_size(w),
                               !shard_on_nvme(ch.unit), reinterpret_cast<float*>(s.part[0]),
                               ch.count);
                   ShardRef z;
                   z.count = ch.count;
                   for (int k = 0; k < oparams.num_states(); ++k) z.state[k] = s.part[1 + k];
                   optimizer.init_state(oparams, z);
                 });
    nvme_written = true;
  }

  // NVMe: runs fn(chunk, staged) over unit u's chunks, read first and (write) written back.
  void nvme_unit_pass(
      UnitId u, bool write,
      const std::function<void(const Chunk&, const offload::ChunkSwapper::Staged&)>& fn) {
    write_nvme_state();
    swapper->run(unit_chunk[u], unit_chunk[u + 1], /*read=*/true, write,
                 [&](const offload::ChunkSwapper::Staged& s) { fn(chunks[s.chunk], s); });
  }

  // out[0, n) = f32 of n working-dtype values at src, which is device memory (on_device) or host
  // memory. A discrete device copies them to the host first.
  void to_host_f32(const void* src, bool on_device, float* out, std::size_t n) {
    if (!on_device || dev->host_accessible()) {
      convert(src, w, out, DType::kF32, n);
      return;
    }
    Buffer tmp = Buffer::pinned(*tracker, MemCategory::kOffloadStaging, n * dtype_size(w));
    dev->copy(tmp.data(), src, n * dtype_size(w));
    dev->synchronize();
    convert(tmp.data(), w, out, DType::kF32, n);
  }

  // dst[0, n) (device memory) = n f32 host values converted to the working dtype.
  void from_host_f32(const float* src, void* dst, std::size_t n) {
    if (dev->host_accessible()) {
      convert(src, DType::kF32, dst, w, n);
      return;
    }
    Buffer tmp = Buffer::pinned(*tracker, MemCategory::kOffloadStaging, n * dtype_size(w));
    convert(src, DType::kF32, tmp.data(), w, n);
    dev->copy(dst, tmp.data(), n * dtype_size(w));
    dev->synchronize();
  }

  // offload_param = nvme: unit u's shard between its file slot and the window.
  bool shard_on_nvme(UnitId u) const { return nvme_params && !kept_whole(u); }
  void load_shard(UnitId u) {
    param_swapper->read_slot(param_slot[static_cast<std::size_t>(u)], param_window);
  }
  void store_shard(UnitId u) {
    param_swapper->write_slot(param_slot[static_cast<std::size_t>(u)], param_window);
  }

  // ---- gradients

  void finish_pending_front() {
    Pending p = std::move(pending.front());
    pending.pop_front();
    p.handle.wait();
    const std::size_t s = lay(p.unit).shard;
    const char* reduced = at(p.buffer.data(), own_begin(p.unit), r);
    if (!grads_on_host()) {
      dev->accumulate(acc_ptr(p.unit), r, reduced, r, s, micro == 0);
    } else if (dev->host_accessible()) {
      detail::accumulate(acc_ptr(p.unit), r, reduced, r, s, micro == 0);
    } else {  // device -> host on the copy lane (the collective is complete), then on the host
      dev->copy(grad_landing.data(), reduced, s * dtype_size(r), DeviceOps::Lane::kCopy);
      dev->wait(dev->record(DeviceOps::Lane::kCopy));
      detail::accumulate(acc_ptr(p.unit), r, grad_landing.data(), r, s, micro == 0);
    }
    (p.from_grad_pool ? grad_pool : stage_pool)->give(std::move(p.buffer));
  }
  void finish_all_pending() {
    while (!pending.empty()) finish_pending_front();
  }

  // ---- stage 3 gathering

  void start_gather(UnitId u, bool async) {
    UnitState& us = units[static_cast<std::size_t>(u)];
    us.gathered = gather_pool->take();
    live_gathered += lay(u).padded;
    const void* send;
    if (shard_on_nvme(u) && async && dev->host_accessible()) {  // read now, gather later
      us.shard_read =
          param_swapper->submit_read_slot(param_slot[static_cast<std::size_t>(u)], read_target(u));
      deferred.push_back(u);
      return;
    }
    if (shard_on_nvme(u)) {  // this rank's shard into its place; the all-gather runs in place
      load_shard(u);
      char* own = at(us.gathered.data(), own_begin(u), w);
      dev->copy(own, param_window, lay(u).shard * dtype_size(w));
      dev->synchronize();  // the window is reused by the next load
      send = own;
    } else if (offload_params && !dev->host_accessible()) {
      // A pinned host shard: copied into its place, all-gathered in place on the device.
      char* own = at(us.gathered.data(), own_begin(u), w);
      dev->copy(own, at(params_shard.data(), us.shard_param_offset, w),
                lay(u).shard * dtype_size(w));
      send = own;
    } else {
      send = at(params_shard.data(), us.shard_param_offset, w);
    }
    if (async) {
      us.prefetch = comm.all_gather_async(send, us.gathered.data(), lay(u).shard, w);
    } else {
      comm.all_gather(send, us.gathered.data(), lay(u).shard, w);
    }
  }

  // Prefetch: after gather(u) at its place in the recorded order, start the all-gathers of the
  // units that come next, while their elements stay within stage3_prefetch_bucket_size (the
  // next unit always, when the bucket is > 0) and the live gathered elements within
  // stage3_max_live_parameters. Every rank follows the same order and counts, so every rank
  // issues the same collectives.
  void prefetch_after(UnitId u) {
    if (!trace_valid) return;
    if (trace_pos >= trace.size() || trace[trace_pos] != u) {
      // The trainer left the recorded order: stop predicting until the next micro-step.
      ZERO_LOG(kDebug, "gather order changed at unit '", name(u), "'; prefetch paused");
      trace_valid = false;
      return;
    }
    ++trace_pos;
    const auto bucket = static_cast<std::size_t>(cfg.zero_optimization.stage3_prefetch_bucket_size);
    const auto max_live =
        static_cast<std::size_t>(cfg.zero_optimization.stage3_max_live_parameters);
    std::size_t ahead = 0;
    for (std::size_t j = trace_pos; j < trace.size() && ahead < bucket; ++j) {
      const UnitId next = trace[j];
      if (kept_whole(next)) continue;
      ahead += lay(next).padded;
      UnitState& ns = units[static_cast<std::size_t>(next)];
      if (!ns.gathered.empty()) continue;
      if (live_gathered + lay(next).padded > max_live) break;
      start_gather(next, /*async=*/true);
    }
  }

  // offload_param = nvme: where a prefetch reads unit u's shard (inside its gathered buffer).
  char* read_target(UnitId u) {
    const auto p =
        reinterpret_cast<std::uintptr_t>(units[static_cast<std::size_t>(u)].gathered.data());
    return reinterpret_cast<char*>(offload::align_up(p + layout.max_padded * dtype_size(w)));
  }
  // Launches the all-gathers of the prefetched units whose shard reads were started, in order.
  void launch_deferred() {
    while (!deferred.empty()) {
      const UnitId u = deferred.front();
      deferred.pop_front();
      UnitState& us = units[static_cast<std::size_t>(u)];
      param_swapper->wait(std::exchange(us.shard_read, 0));
      char* own = at(us.gathered.data(), own_begin(u), w);
      dev->copy(own, read_target(u), lay(u).shard * dtype_size(w));
      us.prefetch = comm.all_gather_async(own, us.gathered.data(), lay(u).shard, w);
    }
  }

  void drop_gathered(UnitId u) {
    UnitState& us = units[static_cast<std::size_t>(u)];
    if (us.shard_read != 0) {  // prefetched, never launched: every rank drops it here alike
      param_swapper->wait(std::exchange(us.shard_read, 0));
      deferred.erase(std::find(deferred.begin(), deferred.end(), u));
    }
    if (us.prefetch.valid()) us.prefetch.wait();
    if (us.gathered.empty()) return;
    if (*opts.poison_released) {
      dev->fill(us.gathered.data(), kPoisonByte, lay(u).padded * dtype_size(w));
    }
    live_gathered -= lay(u).padded;
    gather_pool->give(std::move(us.gathered));
  }

  // Makes unit u whole for one more holder: stage 3 all-gathers it (or waits for its prefetch).
  void acquire(UnitId u) {
    UnitState& us = units[static_cast<std::size_t>(u)];
    if (us.shard_read != 0) launch_deferred();
    if (!kept_whole(u)) {
      if (us.gathered.empty()) {
        start_gather(u, /*async=*/false);
      } else if (us.prefetch.valid()) {
        us.prefetch.wait();
      }
    }
    ++us.holders;
  }

  // ---- the boundary

  struct Stats {
    double sum_squares = 0.0;
    bool non_finite = false;
  };

  // Global sum of squares of the reduced gradients, summed shard by shard in rank order so
  // every stage gets the same bits.
  Stats global_stats() {
    const std::size_t nu = specs.size();
    if (!policy.shard_optimizer) {
      Stats total;
      for (int q = 0; q < n; ++q) {
        double s = 0.0;
        for (std::size_t u = 0; u < nu; ++u) {
          const auto& ul = layout.units[u];
          const GradStats g = grad_stats(
              at(acc_base(), ul.full_offset + static_cast<std::size_t>(q) * ul.shard, r), ul.shard);
          s += g.sum_squares;
          total.non_finite = total.non_finite || g.non_finite;
        }
        total.sum_squares += s;
      }
      return total;
    }
    double local = 0.0;
    bool bad = false;
    for (std::size_t u = 0; u < nu; ++u) {
      const GradStats g = grad_stats(acc_ptr(static_cast<UnitId>(u)), layout.units[u].shard);
      local += g.sum_squares;
      bad = bad || g.non_finite;
    }
    // One all-gather of (sum, flag) from every rank: bits are copied, not reduced, so the sum
    // below runs in rank order on every rank, and every rank sees every overflow flag.
    float mine[4] = {0, 0, bad ? 1.0f : 0.0f, 0};
    std::memcpy(mine, &local, sizeof local);
    std::vector<float> all(static_cast<std::size_t>(4 * n));
    if (dev->host_accessible()) {
      comm.all_gather(mine, all.data(), 4, DType::kF32);
    } else {  // the communicator runs on device memory
      float* scratch = stats_scratch.as<float>();
      dev->copy(scratch, mine, sizeof mine);
      comm.all_gather(scratch, scratch + 4, 4, DType::kF32);
      dev->copy(all.data(), scratch + 4, all.size() * sizeof(float));
      dev->synchronize();
    }
    Stats total;
    for (int q = 0; q < n; ++q) {
      double s = 0.0;
      std::memcpy(&s, &all[static_cast<std::size_t>(4 * q)], sizeof s);
      total.sum_squares += s;
      total.non_finite = total.non_finite || all[static_cast<std::size_t>(4 * q + 2)] != 0.0f;
    }
    return total;
  }

  // Where the reduced gradients live decides who reads them: the host optimizer (the partition
  // on the host with offload) or the device.
  GradStats grad_stats(const void* grad, std::size_t count) {
    return grads_on_host() ? optimizer.grad_stats(grad, r, count) : dev->grad_stats(grad, r, count);
  }

  void reduce_at_boundary() {
    if (attached) {
      dev->fill(ext_grads + specs[0].params[0].numel() * dtype_size(w), 0,
                (layout.total_padded - specs[0].params[0].numel()) * dtype_size(w));
      if (w != r) dev->convert(ext_grads, w, acc_base(), r, layout.total_padded);
    }
    if (policy.shard_gradients) return;  // reduced every micro-step
    if (!policy.shard_optimizer) {
      comm.all_reduce(acc_base(), acc_base(), layout.total_padded, r, ReduceOp::kAvg);
      return;
    }
    std::vector<CommHandle> hs;
    for (UnitId u = 0; u < static_cast<int>(specs.size()); ++u) {
      char* base = at(acc_base(), lay(u).full_offset, r);
      hs.push_back(comm.reduce_scatter_async(base, at(base, own_begin(u), r), lay(u).shard, r,
                                             ReduceOp::kAvg));
    }
    for (auto& h : hs) h.wait();
  }

  void gather_updated_params() {
    if (!policy.shard_optimizer) return;
    std::vector<CommHandle> hs;
    for (UnitId u = 0; u < static_cast<int>(specs.size()); ++u) {
      if (!kept_whole(u)) continue;
      char* base = at(whole_base(), units[static_cast<std::size_t>(u)].whole_offset, w);
      hs.push_back(comm.all_gather_async(at(base, own_begin(u), w), base, lay(u).shard, w));
    }
    for (auto& h : hs) h.wait();
  }
};

// ---- Engine

Engine::Engine(Communicator& comm, const Config& config, EngineOptions options)
    : impl_(std::make_unique<Impl>(comm, config, options)) {}
Engine::~Engine() {
  if (impl_ == nullptr) return;
  // Collectives still in flight reference engine buffers: let them finish first.
  for (auto& p : impl_->pending) {
    try {
      p.handle.wait();
    } catch (const std::exception& e) {
      ZERO_LOG(kWarn, "a reduce-scatter in flight at shutdown failed: ", e.what());
    }
  }
  for (auto& us : impl_->units) {
    try {
      if (us.prefetch.valid()) us.prefetch.wait();
    } catch (const std::exception& e) {
      ZERO_LOG(kWarn, "a prefetch in flight at shutdown failed: ", e.what());
    }
  }
}

UnitId Engine::add_unit(UnitSpec spec) {
  ZERO_CHECK(!impl_->laid_out, kInvalidArgument, "add_unit('", spec.name,
             "'): units are already laid out (add every unit before the first use)");
  // Validate now so the error names the call that caused it.
  detail::make_layout({spec}, impl_->n, impl_->opts.alignment);
  impl_->specs.push_back(std::move(spec));
  return static_cast<UnitId>(impl_->specs.size() - 1);
}

int Engine::stage() const noexcept { return impl_->policy.stage; }
DType Engine::param_dtype() const noexcept { return impl_->w; }
DType Engine::reduce_dtype() const noexcept { return impl_->r; }
int Engine::num_units() const noexcept { return static_cast<int>(impl_->specs.size()); }
const UnitSpec& Engine::unit(UnitId u) const {
  impl_->check_unit(u, "unit");
  return impl_->specs[static_cast<std::size_t>(u)];
}
std::size_t Engine::unit_padded_numel(UnitId u) const {
  impl_->check_unit(u, "unit_padded_numel");
  impl_->lay_out();
  return impl_->lay(u).padded;
}
std::size_t Engine::unit_shard_numel(UnitId u) const {
  impl_->check_unit(u, "unit_shard_numel");
  impl_->lay_out();
  return impl_->lay(u).shard;
}
double Engine::loss_scale() const noexcept { return impl_->scaler.scale(); }
std::int64_t Engine::micro_step() const noexcept { return impl_->micro; }
MemoryTracker& Engine::tracker() noexcept { return *impl_->tracker; }
Engine::Buffers Engine::buffer_bytes() const {
  const Impl& m = *impl_;
  Buffers b;
  if (!m.laid_out) return b;
  const std::size_t unit = m.layout.max_padded;
  b.in_flight_grads = m.grad_pool->allocated() * unit * dtype_size(m.w);
  b.reduce_staging = m.stage_pool->allocated() * unit * dtype_size(m.r);
  b.gathered_params = m.gather_pool->allocated() * (unit * dtype_size(m.w) + m.gather_extra);
  return b;
}
MemoryReport Engine::memory_report() const { return impl_->tracker->report(); }
Communicator& Engine::comm() noexcept { return impl_->comm; }

void Engine::set_param(UnitId u, int param, const float* values, std::size_t count) {
  Impl& m = *impl_;
  m.check_unit(u, "set_param");
  m.lay_out();
  const auto& ul = m.lay(u);
  ZERO_CHECK(param >= 0 && param < static_cast<int>(ul.params.size()), kInvalidArgument,
             "set_param: unit '", m.name(u), "' has no parameter ", param);
  const auto& pl = ul.params[static_cast<std::size_t>(param)];
  ZERO_CHECK(count == pl.numel, kInvalidArgument, "set_param('", m.name(u), ".",
             m.specs[static_cast<std::size_t>(u)].params[static_cast<std::size_t>(param)].name,
             "'): ", count, " values for a parameter of ", pl.numel, " elements");
  ZERO_CHECK(values != nullptr || count == 0, kInvalidArgument, "set_param: null values");
  // Working copy.
  if (m.kept_whole(u)) {
    m.from_host_f32(
        values,
        at(m.whole_base(), m.units[static_cast<std::size_t>(u)].whole_offset + pl.offset, m.w),
        pl.numel);
  }
  // The stepped range (whole unit in stage 0, the shard otherwise): working shard (stage 3) and
  // the master, which starts as the working copy's value (as DeepSpeed makes it from the
  // 16-bit parameters).
  const std::size_t lo = std::max(pl.offset, m.step_begin(u));
  const std::size_t hi = std::min(pl.offset + pl.numel, m.step_begin(u) + m.step_count(u));
  if (lo >= hi) return;
  const float* src = values + (lo - pl.offset);
  char* wdst = m.param_step_ptr(u) + (lo - m.step_begin(u)) * dtype_size(m.w);
  const bool on_device = !m.shard_on_nvme(u);  // else in the window (host memory)
  if (!on_device) m.load_shard(u);             // patched in the window, written back
  if (!m.kept_whole(u)) {
    if (on_device) {
      m.from_host_f32(src, wdst, hi - lo);
    } else {
      convert(src, DType::kF32, wdst, m.w, hi - lo);
    }
  }
  if (!on_device) m.store_shard(u);
  if (m.offload_tier == Impl::OffloadTier::kNvme) {
    // Before the file is first written it is made from the working copy; after, the chunks
    // that hold [lo, hi) are read, patched and written back.
    if (!m.nvme_written) return;
    const std::size_t b = m.step_begin(u);
    m.nvme_unit_pass(u, /*write=*/true, [&](const Impl::Chunk& ch, const auto& s) {
      const std::size_t clo = std::max(lo - b, ch.at), chi = std::min(hi - b, ch.at + ch.count);
      if (clo >= chi) return;
      m.to_host_f32(m.param_step_ptr(u) + clo * dtype_size(m.w), on_device,
                    reinterpret_cast<float*>(s.part[0]) + (clo - ch.at), chi - clo);
    });
  } else if (m.offloaded()) {  // the master in pinned host memory
    m.to_host_f32(wdst, on_device, m.master_ptr(u) + (lo - m.step_begin(u)), hi - lo);
  } else if (m.separate_master()) {
    m.dev->convert(wdst, m.w, m.master_ptr(u) + (lo - m.step_begin(u)), DType::kF32, hi - lo);
  }
}

void Engine::read_param(UnitId u, int param, float* out, std::size_t count) {
  Impl& m = *impl_;
  m.check_unit(u, "read_param");
  m.lay_out();
  const auto& pl = m.lay(u).params.at(static_cast<std::size_t>(param));
  ZERO_CHECK(count == pl.numel, kInvalidArgument, "read_param('", m.name(u), "'): ", count,
             " values for a parameter of ", pl.numel, " elements");
  ZERO_CHECK(param >= 0, kInvalidArgument, "read_param: negative parameter index");
  // Not a training gather: it neither enters the recorded order nor starts prefetches.
  m.acquire(u);
  GatherGuard g(this, u);
  const View v = g.param(param);
  m.to_host_f32(v.data, /*on_device=*/true, out, count);
}

GatherGuard Engine::gather(UnitId u) {
  Impl& m = *impl_;
  m.check_unit(u, "gather");
  m.lay_out();
  m.recording.push_back(u);
  m.launch_deferred();
  m.acquire(u);
  if (m.policy.shard_params) m.prefetch_after(u);
  return GatherGuard(this, u);
}

void Engine::release(UnitId u) {
  Impl& m = *impl_;
  Impl::UnitState& us = m.units[static_cast<std::size_t>(u)];
  ZERO_CHECK(us.holders > 0, kInternal, "release of unit '", m.name(u), "' with no holder");
  if (--us.holders == 0 && !m.kept_whole(u)) m.drop_gathered(u);
}

View Engine::param_view(UnitId u, int i) const {
  const Impl& m = *impl_;
  m.check_unit(u, "param");
  const auto& ul = m.lay(u);
  ZERO_CHECK(i >= 0 && i < static_cast<int>(ul.params.size()), kInvalidArgument, "unit '",
             m.name(u), "' has no parameter ", i, " (it has ", ul.params.size(), ")");
  const auto& pl = ul.params[static_cast<std::size_t>(i)];
  const Impl::UnitState& us = m.units[static_cast<std::size_t>(u)];
  void* base;
  if (m.kept_whole(u)) {
    base = at(m.whole_base(), us.whole_offset, m.w);
  } else {
    ZERO_CHECK(us.holders > 0 && !us.gathered.empty(), kInvalidArgument, "unit '", m.name(u),
               "' is not gathered: its parameters are sharded in stage 3; hold the GatherGuard "
               "from gather() while using them");
    base = us.gathered.data();
  }
  return View{at(base, pl.offset, m.w), pl.numel, m.w, m.dev->device()};
}

View Engine::grad(UnitId u, int param) {
  Impl& m = *impl_;
  m.check_unit(u, "grad");
  m.lay_out();
  Impl::UnitState& us = m.units[static_cast<std::size_t>(u)];
  const auto& ul = m.lay(u);
  ZERO_CHECK(param >= 0 && param < static_cast<int>(ul.params.size()), kInvalidArgument,
             "grad: unit '", m.name(u), "' has no parameter ", param);
  ZERO_CHECK(!us.ready, kInvalidArgument, "grad('", m.name(u),
             "'): grads_ready was already called for this unit in this micro-step");
  if (us.grad.empty()) {
    // Bound the memory of gradients in flight: finish the oldest reduction first.
    us.grad = m.grad_pool->take();
    m.dev->fill(us.grad.data(), 0, ul.padded * dtype_size(m.w));
  }
  const auto& pl = ul.params[static_cast<std::size_t>(param)];
  return View{at(us.grad.data(), pl.offset, m.w), pl.numel, m.w, m.dev->device()};
}

void Engine::grads_ready(UnitId u) {
  Impl& m = *impl_;
  m.check_unit(u, "grads_ready");
  m.lay_out();
  Impl::UnitState& us = m.units[static_cast<std::size_t>(u)];
  ZERO_CHECK(!us.ready, kInvalidArgument, "grads_ready('", m.name(u),
             "') called twice in one micro-step");
  if (us.grad.empty()) {  // no gradient written: a zero gradient (grad() never asked for)
    (void)grad(u, 0);
  }
  us.ready = true;
  const auto& ul = m.lay(u);
  if (!m.policy.shard_gradients) {
    m.dev->accumulate(at(m.acc_base(), ul.full_offset, m.r), m.r, us.grad.data(), m.w, ul.padded,
                      m.micro == 0);
    m.grad_pool->give(std::move(us.grad));
    return;
  }
  Impl::Pending p;
  p.unit = u;
  if (m.w == m.r) {
    p.buffer = std::move(us.grad);
    p.from_grad_pool = true;
  } else {
    p.buffer = m.stage_pool->take();
    m.dev->convert(us.grad.data(), m.w, p.buffer.data(), m.r, ul.padded);
    m.grad_pool->give(std::move(us.grad));
    p.from_grad_pool = false;
  }
  char* base = static_cast<char*>(p.buffer.data());
  p.handle = m.comm.reduce_scatter_async(base, at(base, m.own_begin(u), m.r), ul.shard, m.r,
                                         ReduceOp::kAvg);
  m.pending.push_back(std::move(p));
  while (m.pending.size() > m.max_pending) m.finish_pending_front();
}

StepResult Engine::step() {
  Impl& m = *impl_;
  m.lay_out();
  StepResult res;
  if (!m.attached) {
    for (UnitId u = 0; u < static_cast<int>(m.specs.size()); ++u) {
      ZERO_CHECK(m.units[static_cast<std::size_t>(u)].ready, kInvalidArgument, "step(): unit '",
                 m.name(u), "' has no gradients this micro-step (call grads_ready for every unit)");
      // A gathered stage-3 copy still held by the trainer would miss the update.
      ZERO_CHECK(m.units[static_cast<std::size_t>(u)].holders == 0 || m.kept_whole(u),
                 kInvalidArgument, "step(): unit '", m.name(u),
                 "' is still gathered (release its GatherGuard before step())");
    }
    m.finish_all_pending();
    for (auto& us : m.units) us.ready = false;
    // The gather order of this micro-step becomes the prefetch plan of the next ones.
    if (!m.trace_valid || m.recording != m.trace) {
      m.trace = m.recording;
      m.trace_valid = !m.trace.empty();
    }
    m.recording.clear();
    m.trace_pos = 0;
    // Prefetches must not cross the update: parameters change below.
    for (UnitId u = 0; u < static_cast<int>(m.specs.size()); ++u) m.drop_gathered(u);
    ++m.micro;
    res.loss_scale = m.scaler.scale();
    res.steps = m.steps;
    res.skipped = m.skipped;
    if (m.micro < m.cfg.gradient_accumulation_steps) return res;
  }
  res.boundary = true;

  m.reduce_at_boundary();
  const Impl::Stats st = m.global_stats();
  const double scale = m.scaler.scale();
  res.grad_norm = std::sqrt(st.sum_squares) / scale;
  // DeepSpeed steps its scheduler after each optimizer step: update k (1-based) runs with the
  // lr after the scheduler's (k-2)-th step, lr(-1) being what its constructor set.
  res.lr = m.schedule.lr(m.steps - 1);
  m.micro = 0;
  if (st.non_finite) {
    // Every rank saw every rank's flag: all skip together. No state is touched.
    m.scaler.update(/*overflow=*/true);
    ++m.skipped;
    res.applied = false;
    res.grad_norm = std::numeric_limits<double>::infinity();
    res.loss_scale = m.scaler.scale();
    res.skipped = m.skipped;
    if (!m.cfg.fp16.enabled) {
      ZERO_LOG(kWarn, "non-finite gradients at step ", m.steps + 1, ": step skipped");
    }
    return res;
  }
  double coef = 1.0;
  if (m.cfg.gradient_clipping > 0.0) {
    // DeepSpeed / PyTorch: clip_coef = max_norm / (norm + 1e-6), applied when < 1.
    coef = std::min(1.0, m.cfg.gradient_clipping / (res.grad_norm + 1e-6));
  }
  res.clip_coef = coef;
  const float grad_scale = m.scaler.grad_scale(coef);
  OptimizerParams p = m.oparams;
  p.lr = res.lr;
  if (m.offloaded()) {
    m.offloaded_step(p, m.steps + 1, grad_scale);
  } else {
    std::vector<ShardRef> refs;
    for (UnitId u = 0; u < static_cast<int>(m.specs.size()); ++u) refs.push_back(m.shard_ref(u));
    m.dev->optimizer_step(p, refs.data(), refs.size(), m.steps + 1, grad_scale);
  }
  m.gather_updated_params();
  ++m.steps;
  m.scaler.update(/*overflow=*/false);
  res.applied = true;
  res.steps = m.steps;
  res.loss_scale = m.scaler.scale();
  return res;
}

DType working_dtype(const Config& c) {
  return c.fp16.enabled ? DType::kF16 : (c.bf16.enabled ? DType::kBF16 : DType::kF32);
}

DType reduce_dtype_of(const Config& c) {
  return c.communication_data_type.empty() ? DType::kF32 : parse_dtype(c.communication_data_type);
}

std::size_t attach_capacity(std::size_t numel, int world_size, std::size_t alignment) {
  ZERO_CHECK(world_size >= 1 && alignment >= 1, kInvalidArgument,
             "attach_capacity: world size and alignment must be >= 1");
  const std::size_t m = static_cast<std::size_t>(world_size) * alignment;
  return (numel + m - 1) / m * m;
}

std::unique_ptr<Engine> Engine::attach(Communicator& comm, const Config& config, void* params,
                                       void* grads, std::size_t numel, std::size_t capacity,
                                       DType dtype, EngineOptions options) {
  ZERO_CHECK(config.zero_optimization.stage <= 2, kConfig,
             "config key 'zero_optimization.stage' = ", config.zero_optimization.stage,
             ": attach mode runs stages 0-2; stage 3 needs the managed engine (the engine must "
             "own the parameters to shard them)");
  ZERO_CHECK(config.gradient_accumulation_steps == 1, kConfig,
             "config key 'gradient_accumulation_steps' = ", config.gradient_accumulation_steps,
             ": in attach mode the trainer accumulates into its gradient buffer and calls step() "
             "once per update; set it to 1");
  ZERO_CHECK(params != nullptr && grads != nullptr && numel > 0, kInvalidArgument,
             "attach: null buffer or zero parameters");
  auto e = std::unique_ptr<Engine>(new Engine(comm, config, options));
  Impl& m = *e->impl_;
  ZERO_CHECK(dtype == m.w, kConfig, "attach: the trainer's buffers are ", to_string(dtype),
             " but the config trains in ", to_string(m.w),
             " (keys 'bf16.enabled' / 'fp16.enabled')");
  m.attached = true;
  m.policy.shard_gradients = false;  // the trainer owns whole gradients
  m.ext_params = static_cast<char*>(params);
  m.ext_grads = static_cast<char*>(grads);
  m.ext_capacity = capacity;
  m.specs.push_back({"attached", {{"flat", {static_cast<std::int64_t>(numel)}}}});
  m.lay_out();
  // Data-parallel start: every rank takes rank 0's parameters (as DDP and DeepSpeed do).
  comm.broadcast(m.ext_params, m.ext_params, m.layout.total_padded, m.w, 0);
  if (m.offload_tier == Impl::OffloadTier::kHost) {
    m.to_host_f32(m.param_step_ptr(0), /*on_device=*/true, m.master_ptr(0), m.step_count(0));
  } else if (m.separate_master() && m.offload_tier != Impl::OffloadTier::kNvme) {
    m.dev->convert(m.param_step_ptr(0), m.w, m.master_ptr(0), DType::kF32, m.step_count(0));
  }
  return e;
}

std::vector<ParamShard> Engine::param_shards() const {
  const Impl& m = *impl_;
  ZERO_CHECK(m.laid_out, kInvalidArgument, "param_shards(): the engine is not laid out yet");
  std::vector<ParamShard> out;
  for (UnitId u = 0; u < static_cast<int>(m.specs.size()); ++u) {
    const auto& ul = m.lay(u);
    const std::size_t b = m.step_begin(u), e = b + m.step_count(u);
    for (std::size_t i = 0; i < ul.params.size(); ++i) {
      const auto& pl = ul.params[i];
      const std::size_t lo = std::max(b, pl.offset), hi = std::min(e, pl.offset + pl.numel);
      if (lo >= hi) continue;
      out.push_back({u, static_cast<int>(i), lo - pl.offset, hi - pl.offset, lo - b});
    }
  }
  return out;
}

const float* Engine::master_shard(UnitId u) const {
  impl_->check_unit(u, "master_shard");
  ZERO_CHECK(impl_->offload_tier != Impl::OffloadTier::kNvme, kInvalidArgument,
             "master_shard(): the master lives in NVMe files (offload_optimizer.device = nvme); "
             "use copy_master_shard()");
  return const_cast<Impl&>(*impl_).master_ptr(u);
}

const void* Engine::state_shard(UnitId u, int k) const {
  const Impl& m = *impl_;
  m.check_unit(u, "state_shard");
  ZERO_CHECK(m.offload_tier != Impl::OffloadTier::kNvme, kInvalidArgument,
             "state_shard(): the optimizer state lives in NVMe files (offload_optimizer.device = "
             "nvme); use copy_state_shard()");
  if (k < 0 || k >= m.oparams.num_states()) return nullptr;
  return at(m.state[k].data(), m.opt_offset(u), m.oparams.state_dtype());
}

void Engine::copy_master_shard(UnitId u, float* out) {
  Impl& m = *impl_;
  m.check_unit(u, "copy_master_shard");
  m.lay_out();
  if (m.offload_tier != Impl::OffloadTier::kNvme) {
    m.dev->copy(out, m.master_ptr(u), m.step_count(u) * 4);
    m.dev->synchronize();
    return;
  }
  m.nvme_unit_pass(u, /*write=*/false, [&](const Impl::Chunk& ch, const auto& s) {
    std::memcpy(out + ch.at, s.part[0], ch.count * 4);
  });
}

void Engine::copy_state_shard(UnitId u, int k, void* out) {
  Impl& m = *impl_;
  m.check_unit(u, "copy_state_shard");
  ZERO_CHECK(k >= 0 && k < m.oparams.num_states(), kInvalidArgument, "copy_state_shard: the ",
             m.cfg.optimizer.type, " optimizer has ", m.oparams.num_states(), " states, not ",
             k + 1);
  m.lay_out();
  const std::size_t sd = dtype_size(m.oparams.state_dtype());
  if (m.offload_tier != Impl::OffloadTier::kNvme) {
    m.dev->copy(out, at(m.state[k].data(), m.opt_offset(u), m.oparams.state_dtype()),
                m.step_count(u) * sd);
    m.dev->synchronize();
    return;
  }
  m.nvme_unit_pass(u, /*write=*/false, [&](const Impl::Chunk& ch, const auto& s) {
    std::memcpy(static_cast<char*>(out) + ch.at * sd, s.part[1 + k], ch.count * sd);
  });
}

}  // namespace zero
