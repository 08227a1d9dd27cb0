// zero/engine/engine.hpp — the ZeRO engine: stages 0-3 as one code path, the stage a policy.
//
// A trainer declares *units* (a layer, a block: the granularity of gather and reduce) with
// their parameters. Each unit is laid out in one flat buffer, every parameter starting on an
// `alignment`-element boundary, padded to a multiple of N x alignment and split into N equal
// contiguous shards; rank r owns shard r (DESIGN.md). What each stage keeps per rank
// (Ψ = padded parameter count, S = Ψ/N, W = working dtype, R = reduce dtype):
//
//   stage 0  params W·Ψ, master 4Ψ (16-bit only), state K·Ψ,  gradients R·Ψ;  all_reduce(avg)
//   stage 1  params W·Ψ, master 4S,                state K·S,  gradients R·Ψ;  reduce_scatter +
//            all_gather of the updated params
//   stage 2  params W·Ψ, master 4S,                state K·S,  gradients R·S + the units in flight
//   stage 3  params W·S (+ gathered units, + units below the persistence threshold kept whole),
//            master 4S, state K·S, gradients R·S + the units in flight
//
// With f32 training the master parameters are the parameters (no copy). Gradient accumulation
// has DeepSpeed's meaning: every micro-step the trainer writes the gradient of its micro-batch's
// mean loss; the step's gradient, its reported grad_norm and the clipping are those of the mean
// over N x A micro-batches (N ranks, A = gradient_accumulation_steps). The reductions average
// over ranks; the micro-steps are summed (stages 0-1 locally, reducing once at the boundary;
// stages 2-3 reduce every micro-step into the R-typed shard) and the sum is divided by A at the
// step, folded into the one factor that also unscales and clips (LossScaler::grad_scale). R is
// fp32 for 16-bit training unless communication_data_type says otherwise.
//
// Two ways in:
//  - managed: the engine owns parameters and gradients and hands out views.
//    Per micro-step: for each unit, `auto g = gather(u)` (stage 3 all-gathers and prefetches the
//    next unit in the recorded order), compute with g.param(i); in backward, again gather(u),
//    write the unit's gradients into grad(u, i) (zeroed when first asked for in a micro-step;
//    accumulate into it within the micro-step), then grads_ready(u) (stages 2-3 launch the
//    reduce-scatter of the unit's bucket when it is complete and go on). step() after every
//    micro-step: it applies the update at the accumulation boundary and returns what it did.
//  - attach (Engine::attach): the trainer keeps its own flat buffers and calls step() after
//    every micro-step too.
//
// How the engine is built (zero/): the placement (what lives where, computed once and summed by
// the planner), the gradient reducer, the parameter gatherer, and offload/'s offloaded
// optimizer; docs/architecture.md walks through them.
//
// Every allocation is charged to the rank's MemoryTracker (memory_report()).
//
// Thread safety: an Engine belongs to one rank and is used from that rank's thread only. All
// ranks must make the same sequence of collective calls (gather in stage 3, grads_ready in
// stages 2-3, step, set_param in stage 3, read_param).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "zero/comm/comm.hpp"
#include "zero/config/config.hpp"
#include "zero/core/cpu_features.hpp"
#include "zero/core/trace.hpp"
#include "zero/device/device.hpp"
#include "zero/device/device_ops.hpp"
#include "zero/device/memory.hpp"
#include "zero/device/memory_report.hpp"
#include "zero/engine/unit.hpp"
#include "zero/optim/loss_scaler.hpp"
#include "zero/optim/optimizer.hpp"

namespace zero {

struct EngineOptions {
  // Each parameter starts on a multiple of this many elements; units are padded to a multiple
  // of N x alignment. REQUIRES: a power of two >= 1.
  std::size_t alignment = 32;
  // Optimizer execution (threads 0: the caller's oneTBB arena; isa: best_isa()).
  int optimizer_threads = 0;
  std::optional<Isa> isa;
  // The tracker to charge; null: the engine owns one (rank = comm.rank()).
  MemoryTracker* tracker = nullptr;
  // Poison released stage-3 parameter buffers with NaN so that a view used after its guard is
  // gone shows up at once. Default: on in builds without NDEBUG.
  std::optional<bool> poison_released;
  // Where parameters, gradients and (without offload) the optimizer state live. Device::cuda(k)
  // needs a CUDA build and the NCCL communicator; views are then device pointers, and the
  // engine's work is enqueued on `cuda_stream` (the trainer's compute stream; null: the legacy
  // default stream), which must be the stream the communicator was created with
  // (CommOptions::cuda_stream). Offload transfers run on a copy stream of the engine's own.
  Device device = Device::cpu();
  void* cuda_stream = nullptr;
  // A device backend of the caller's (overrides `device`): any DeviceOps implementation.
  std::shared_ptr<DeviceOps> device_ops;
  // Where the engine, its communicator and its offload tiers record their timeline
  // (zero/core/trace.hpp); it must outlive the engine. Null: the config's trace.enabled decides
  // (the engine then owns one of trace.capacity events), else nothing is recorded.
  Tracer* tracer = nullptr;
  // Parameter groups 1, 2, ... (zero/optim/optimizer.hpp ParamGroup; group 0 is the config's
  // optimizer block). Managed: each parameter names its group (ParamSpec::group). Attach: the
  // element ranges [begin, end) of the flat buffer in a group (the rest in group 0; a later
  // range over an earlier one). The scheduler sets each group's lr (LrSchedule::lr(i, group_lr)).
  std::vector<ParamGroup> param_groups;
  struct GroupRange {
    std::size_t begin = 0;
    std::size_t end = 0;
    int group = 0;
  };
  std::vector<GroupRange> attach_groups;
  // Attach mode: element ranges [begin, end) of the flat buffer that are frozen (a pretrained
  // base, a frozen embedding): the engine reads no gradient there, reduces and steps nothing
  // there, and keeps no master copy or optimizer state for them. The buffer is cut into units at
  // the ranges' boundaries (the unit is the granularity of reduce and step: docs/param_groups.md,
  // "Frozen parameters"), so every boundary but the buffer's end must be a multiple of
  // attach_granularity(N, alignment): lay the tensors out on that grid, or lower `alignment`.
  // Overlapping or adjacent ranges merge. A group range over a frozen range is not used there.
  struct ElementRange {
    std::size_t begin = 0;
    std::size_t end = 0;
  };
  std::vector<ElementRange> attach_frozen;
  // Budgets at start (zero/engine/fit.hpp): at lay-out, before the engine allocates, its planned
  // bytes (zero/engine/plan.hpp, the rank's placement and pools) plus `trainer_bytes` of the
  // trainer's own (activations, workspace) are checked against the tracker's budget when set, else
  // against the machine's (host memory under the memory cgroup, a CUDA device's free memory) shared
  // by the ranks of this process (in-process ranks: the communicator's size; launched processes:
  // the launcher's ranks per node); a rank that cannot fit is kOutOfMemory naming the tier and
  // the shortfall, before any allocation.
  bool check_fit = false;
  std::size_t trainer_bytes = 0;
};

// Where one rank's time and bytes went, from the engine's view (StepResult::metrics). A window
// runs from the return of the previous boundary step() (for the first: the engine's first hook)
// to the return of this step(). Times in seconds on this rank's thread unless said otherwise.
struct StepMetrics {
  double window_s = 0;        // wall time of the window
  double gather_s = 0;        // in gather(): stage-3 all-gathers run or waited for, prefetches
  double grads_ready_s = 0;   // in grads_ready(): accumulation, reduce-scatters launched
  double step_s = 0;          // in step(), micro-steps and boundary; of it:
  double reduce_s = 0;        //   the boundary's reductions, waits for those in flight, the norm
  double optimizer_s = 0;     //   the optimizer on this rank's shards (with offload: the chunk
                              //   pipeline, its copies and NVMe I/O)
  double param_gather_s = 0;  //  the all-gather of the updated parameters (stages 1-2)
  // The communicator (CommStats): collectives executing, overlapped or not (total communication
  // time), and this thread blocked on them (exposed communication time); bytes as counted there.
  double comm_busy_s = 0;
  double comm_wait_s = 0;
  std::uint64_t comm_bytes_sent = 0;
  std::uint64_t comm_bytes_received = 0;
  // Hybrid sharding: of comm_bytes_sent, what went to the other groups (the replicas'
  // all-reduce of the gradient shards; 0 without hybrid sharding).
  std::uint64_t comm_cross_group_bytes_sent = 0;
  // Offload traffic: copies between the device and pinned host memory, NVMe file I/O.
  std::uint64_t host_to_device_bytes = 0;
  std::uint64_t device_to_host_bytes = 0;
  std::uint64_t nvme_read_bytes = 0;
  std::uint64_t nvme_write_bytes = 0;
  int micro_steps = 0;
  // offload_optimizer.overlap_step (boundary): the units whose offloaded step ran during
  // backward, and of them those stepped again in step() because clipping engaged (an fp16
  // overflow skips the step: speculated, not redone).
  int speculated_units = 0;
  int redone_units = 0;
  // The window less the time inside the engine's hooks: the trainer's own forward / backward.
  double trainer_s() const noexcept {
    const double t = window_s - gather_s - grads_ready_s - step_s;
    return t > 0 ? t : 0;
  }
};
// The metrics as one JSON object on one line (seconds as "*_s", bytes as "*_bytes", and
// "trainer_s"): what zero-train / zero-bench --metrics write per step.
std::string to_json(const StepMetrics& m);

struct StepResult {
  bool boundary = false;  // false: a micro-step inside an accumulation window (no update)
  bool applied = false;   // the optimizer stepped (false at a boundary: fp16 overflow)
  // Global L2 norm of the step's gradient (boundary): the mean over N ranks x A micro-steps,
  // unscaled — what gradient_clipping compares with (DeepSpeed's meaning).
  double grad_norm = 0.0;
  double clip_coef = 1.0;    // factor applied to the gradients by clipping (1: none)
  double loss_scale = 1.0;   // the scale for the next backward
  double lr = 0.0;           // the learning rate used by this step
  std::int64_t steps = 0;    // optimizer steps applied so far
  std::int64_t skipped = 0;  // steps skipped for overflow so far
  // The window so far (boundary: the whole accumulation window, then a new one starts).
  StepMetrics metrics;
};

// This rank's share of one parameter: elements [begin, end) of the parameter (flattened) are
// stored at offset `shard_offset` of the unit's shard. For the checkpoint code.
struct ParamShard {
  UnitId unit = 0;
  int param = 0;
  std::size_t begin = 0;
  std::size_t end = 0;
  std::size_t shard_offset = 0;
};

class Engine;

// Elements a trainer's flat buffers need for attach mode: numel padded to a multiple of
// world_size x alignment (with int8 moments pass kInt8MomentBlock, 256: shards start on a
// quantization block).
std::size_t attach_capacity(std::size_t numel, int world_size, std::size_t alignment = 32);
// The grid of attach mode's unit boundaries (EngineOptions::attach_frozen): world_size x
// alignment elements, the multiple every unit is padded to (int8 moments: pass kInt8MomentBlock).
std::size_t attach_granularity(int world_size, std::size_t alignment = 32);

// A gathered unit: its parameters are whole and valid while the guard lives (stage 3 releases
// them when it is destroyed; other stages keep them). Move-only.
class GatherGuard {
 public:
  GatherGuard() = default;
  GatherGuard(GatherGuard&& other) noexcept;
  GatherGuard& operator=(GatherGuard&& other) noexcept;
  GatherGuard(const GatherGuard&) = delete;
  GatherGuard& operator=(const GatherGuard&) = delete;
  ~GatherGuard();

  // View of parameter i (working dtype, on the engine's device). Throws if the guard is empty or
  // i out of range.
  View param(int i) const;
  UnitId unit() const noexcept { return unit_; }
  // Releases now (as the destructor does).
  void release();

 private:
  friend class Engine;
  GatherGuard(Engine* e, UnitId u) : engine_(e), unit_(u) {}
  Engine* engine_ = nullptr;
  UnitId unit_ = -1;
};

class Engine {
 public:
  // REQUIRES: comm outlives the engine. Reads the stage, precision, optimizer, scheduler,
  // clipping, accumulation and bucket keys of `config` (validated there); throws kConfig for a
  // combination this engine cannot run (e.g. offload_param = nvme without optimizer offload, a
  // CUDA device without NCCL), naming the keys.
  Engine(Communicator& comm, const Config& config, EngineOptions options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Attach mode: the smallest change to a trainer that owns one flat parameter buffer and one
  // flat gradient buffer (llm.c style). Stages 0-2. Each micro-step the trainer computes the
  // gradient of its micro-batch's mean loss into `grads` and calls step() where it called its
  // optimizer (with gradient_accumulation_steps A > 1: after every micro-step, as in managed
  // mode; StepResult::boundary says when the update ran). The buffers hold `numel` parameters of
  // `dtype` (the config's working dtype) and have room for `capacity` >= attach_capacity(numel,
  // N) elements (int8 moments: attach_capacity(numel, N, 256)); the padding is zeroed and stepped.
  // Rank 0's parameters are broadcast at attach. After each step() the gradient buffer's content
  // is unspecified (reduced in place when it can be: W == R, A == 1 and nothing frozen; otherwise
  // the engine keeps its own R-typed accumulation of the trainable elements); the trainer zeroes
  // it before the next backward, as before. Stage 2 keeps whole gradients here (the trainer owns
  // them): its gradient savings need the managed engine. Frozen ranges:
  // EngineOptions::attach_frozen (the trainer's gradient buffer there is never read; the units are
  // named "attached[begin:end]", else one "attached").
  static std::unique_ptr<Engine> attach(Communicator& comm, const Config& config, void* params,
                                        void* grads, std::size_t numel, std::size_t capacity,
                                        DType dtype, EngineOptions options = {});

  // Declares a unit. Units are laid out when the first one is used (any call below); adding
  // one after that is kInvalidArgument. Returns the unit's id (0, 1, ...).
  UnitId add_unit(UnitSpec spec);

  int stage() const noexcept;
  DType param_dtype() const noexcept;   // W: f32, bf16 (bf16.enabled) or f16 (fp16.enabled)
  DType reduce_dtype() const noexcept;  // R
  int num_units() const noexcept;
  const UnitSpec& unit(UnitId u) const;
  std::size_t unit_padded_numel(UnitId u) const;
  std::size_t unit_shard_numel(UnitId u) const;

  // Sets parameter `param` of unit `u` from f32 values (the full parameter; every rank must
  // pass the same values). Writes the working copy and the fp32 master (rounded to W for the
  // working copy). REQUIRES: count == numel of the parameter.
  void set_param(UnitId u, int param, const float* values, std::size_t count);
  // Reads the working-precision values of a parameter as f32. Stage 3: a collective (gathers
  // the unit if it is not gathered); it does not change the recorded gather order.
  void read_param(UnitId u, int param, float* out, std::size_t count);

  // Collective in stage 3: makes unit u's parameters whole for the guard's lifetime, outside
  // training — like read_param, it neither enters the recorded gather order nor starts a
  // prefetch (a full-weights export reads every unit once through it).
  GatherGuard read_unit(UnitId u);
  // Makes unit u's parameters whole for the guard's lifetime; stage 3 all-gathers (waiting for a
  // prefetch in flight) and starts the prefetch of the next unit in the recorded order.
  GatherGuard gather(UnitId u);
  // The gradient buffer of parameter i of unit u for this micro-step (working dtype). Zeroed
  // when first asked for in a micro-step. Throws after grads_ready(u) in the same micro-step.
  View grad(UnitId u, int param);
  // Unit u's gradients for this micro-step are complete. Stages 2-3 launch its reduce-scatter
  // asynchronously; stages 0-1 accumulate it locally. Twice in one micro-step: kInvalidArgument.
  void grads_ready(UnitId u);

  // Ends the micro-step. At the accumulation boundary: reduces, computes the global gradient
  // norm, agrees on fp16 overflow across ranks, clips, steps the optimizer on this rank's shards
  // and all-gathers what the stage keeps whole. REQUIRES: grads_ready for every unit this
  // micro-step, else kInvalidArgument naming the first missing unit.
  StepResult step();

  // The max norm the following steps clip the global gradient norm against (gradient_clipping's
  // meaning; 0: no clipping). REQUIRES: max_norm >= 0 and finite (kInvalidArgument).
  void set_gradient_clipping(double max_norm);
  // The loss scale to multiply the loss by (1 unless fp16).
  double loss_scale() const noexcept;
  std::int64_t micro_step() const noexcept;  // micro-steps since the last boundary

  // Bytes of the engine's pools (included in the tracker's categories): gradient buffers of
  // units in flight (kGradients), reduction and merged-bucket staging (kCommBuffers), gathered
  // stage-3 units (kParams16). Pools grow to what the run needs and are kept for reuse.
  struct Buffers {
    std::size_t in_flight_grads = 0;
    std::size_t reduce_staging = 0;
    std::size_t gathered_params = 0;
  };
  Buffers buffer_bytes() const;

  MemoryTracker& tracker() noexcept;
  MemoryReport memory_report() const;
  // The communicator the engine shards over: the one it was made with, or with hybrid sharding
  // (zero_optimization.hybrid_shard_size) its group (shard numbers, ranks and collectives of the
  // shards are the group's).
  Communicator& comm() noexcept;
  // The communicator the engine was made with (comm() unless hybrid sharding splits it).
  Communicator& world() noexcept;
  // Hybrid sharding: the ranks holding this rank's shards in the other groups; null otherwise.
  Communicator* replicas() noexcept;

  // The tracer this engine records into (EngineOptions::tracer or its own); null when off. A
  // trainer marks its own regions on it: TraceScope(e.tracer(), TraceLane::kTrainer, "forward",
  // unit).
  Tracer* tracer() noexcept;
  // Collective: writes every rank's timeline as one Chrome trace JSON document to `path` (rank 0
  // writes; the others send it theirs through the communicator). NCCL (device memory only):
  // every rank writes its own document to `path` with ".rank<r>" before the extension.
  // REQUIRES: tracing on (kInvalidArgument otherwise). Throws kIO naming the file.
  void write_trace(const std::string& path);

  // This rank's shards with their parameter ranges (see ParamShard), and raw access to the
  // shard arrays of unit u (f32 master; optimizer state k; null when the stage keeps none).
  // Where unit u's are in NVMe files (offload to NVMe; with a partial offload, the units the
  // file holds) these throw kInvalidArgument; use the copies.
  // Without offload they are in the engine's device memory (device pointers on CUDA).
  std::vector<ParamShard> param_shards() const;
  const float* master_shard(UnitId u) const;
  const void* state_shard(UnitId u, int k) const;
  // Copies unit u's stepped range of the f32 master (step-range elements: the whole padded unit
  // in stage 0, the shard otherwise) / of optimizer state k (its state dtype) to `out`, from
  // whichever tier holds it (NVMe: read through the swapper; the device: copied and waited
  // for). `out` is host memory. REQUIRES: out has room.
  void copy_master_shard(UnitId u, float* out);
  void copy_state_shard(UnitId u, int k, void* out);

  // ---- training state (zero/ckpt/ckpt.hpp saves and loads through these)
  // What a checkpoint saves besides the shards. The LR schedule is a function of `steps`.
  struct TrainingState {
    std::int64_t steps = 0;    // optimizer steps applied
    std::int64_t skipped = 0;  // steps skipped for fp16 overflow
    LossScaler::State loss_scaler;
  };
  TrainingState training_state() const;
  const Config& config() const noexcept;
  const OptimizerParams& optimizer_params() const noexcept;
  // Group g's options as configured (lr before the schedule): group 0 is optimizer_params().
  const std::vector<OptimizerParams>& group_params() const noexcept;
  std::size_t alignment() const noexcept;
  // Elements of unit u this rank steps: the whole padded unit in stage 0, its shard otherwise
  // (the length of copy_master_shard's output).
  std::size_t unit_step_numel(UnitId u) const;
  // Where that range starts in unit u's padded range (0 in stage 0).
  std::size_t unit_step_begin(UnitId u) const;
  // Loads unit u's stepped range: `master` (unit_step_numel(u) f32) and `states` (one array per
  // optimizer state, state dtype), host memory, into whichever tier holds them; the working copy
  // over the range becomes the master rounded to the working dtype (what every step and
  // set_param leave it: the 16-bit copy is a function of the master). Local to this rank.
  // REQUIRES: a fresh engine (no step, no micro-step, no unit gathered), else kInvalidArgument.
  void load_shard(UnitId u, const float* master, const void* const* states);
  // Collective, after load_shard for every unit: restores the counters (and the loss scaler's
  // state when `loss_scaler` is set) and all-gathers the units the stage keeps whole.
  void finish_load(std::int64_t steps, std::int64_t skipped,
                   const std::optional<LossScaler::State>& loss_scaler);

 private:
  friend class GatherGuard;
  void release(UnitId u);
  View param_view(UnitId u, int i) const;
  StepResult step_impl();

  struct Impl;
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zero
