// engine/offloaded_optimizer.hpp — the shard optimizer off the device (offload_optimizer.device =
// cpu | nvme): the fp32 master and the optimizer state in pinned host memory or NVMe files, and
// the chunk pipeline that steps them (engine/shard_optimizer.hpp is the interface).
//
// What it owns: the master and state of the units the placement puts off the device
// (optim_tier kPinned: in pinned host memory; kNvme: in one swap file per rank under nvme_path,
// written from the working parameters when first needed, as set_param would have made the
// master), the chunks of the placement, `buffer_count` persistent pinned staging buffers per
// direction (gradient chunk in, updated 16-bit chunk out) and their fences. With a partial
// offload (offload_optimizer.ratio) the units on the device are not its own (cpu: the leading
// units stay on the device; nvme: the leading units are in pinned memory, the trailing ones in
// the file, one chunk sequence over both, the pinned chunks stepped in place).
//
// One step streams every stepped range chunk by chunk: the gradient chunk copied in (device ->
// pinned; stage 1 only: stages 2-3 keep the gradient partition on the host already), the fused
// step on the host master and state (resident in pinned memory, or the swapper's staging slot:
// read chunk c+1 while chunk c steps while chunk c-1 is written back), the updated parameters
// copied back to the device. On a CUDA build the copies are device<->host transfers on the copy
// lane (chunk c+1's gradients copied in while chunk c steps; a staging buffer reused only after
// its last copy out has landed); on the CPU device both sides are host memory, so the pipeline
// runs and is tested and the host tier saves nothing.
//
// Observed (the engine's Observer): each chunk's host step is a TraceLane::kOptimizer region
// "optimizer chunk" (unit: the chunk index; bytes: its master and state); each gradient copy in
// "grads to host" and parameter copy out "params to device" a kOffload region (unit: the chunk;
// bytes: the copy's), counted in IoCounters::device_to_host / host_to_device. On the CPU device
// those copies are memcpy between host buffers and are counted all the same: they are the
// traffic a discrete device would carry. So is the master made from the working parameters on
// the device (NVMe: the first write of the file; refresh_master), "params to host". The NVMe
// reads and writes are the swapper's queue's (aio.hpp).
//
// The step during backward (offload_optimizer.overlap_step, engine/offloaded_optimizer_spec.cpp):
// speculate(u) queues unit u's chunks to a worker thread, which takes the units queued so far as
// one batch and steps their chunks apart from the state: a pinned chunk copied into the next free
// buffer of the placement's window and stepped there (chunks past the window wait for the
// boundary), an NVMe chunk read from its current slot and written to its alternate one, units
// with consecutive chunks in one pass of the swapper's pipeline (the first step, before the file
// exists, speculates none).
// settle(commit) joins the worker: a commit copies the window's chunks into the state, flips the
// NVMe chunks' slots and writes every committed chunk's updated parameters (NVMe: read back from
// the slot); step() then passes the committed chunks by. Without a commit nothing was touched.
// Each speculative chunk is a kOptimizer region "optimizer chunk (speculative)" recorded from
// the worker, beside the trainer's backward; the commit is one kOptimizer region "commit".
//
// Thread safety: belongs to one rank's engine; used from the rank's thread. Between speculate()
// and settle() the worker owns the window, the swapper and the speculative chunks' bookkeeping;
// the rank's thread touches none of them (nor step()s) until settle() returns.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/shard_optimizer.hpp"
#include "offload/nvme_swapper.hpp"

namespace zero::detail {

class OffloadedOptimizer final : public ShardOptimizer {
 public:
  // REQUIRES: placement.offloaded; placement, dev, host, access and the observer's tracer and
  // counters (either may be null) outlive this. Only units off the device are asked for here.
  OffloadedOptimizer(const Placement& placement, DeviceOps& dev, const CpuOptimizer& host,
                     const OptimizerParams& params, MemoryTracker& tracker, ShardAccess& access,
                     Observer observer);
  ~OffloadedOptimizer() override;  // joins the worker (a speculation in flight is dropped)
  OffloadedOptimizer(const OffloadedOptimizer&) = delete;
  OffloadedOptimizer& operator=(const OffloadedOptimizer&) = delete;

  // One update of every stepped range (params.lr set by the caller). `step` is 1-based.
  void step(const std::vector<OptimizerParams>& groups, std::int64_t step,
            float grad_scale) override;

  // The master / state k of unit u's stepped range in pinned memory; kInvalidArgument naming the
  // tier when unit u's are in NVMe (use the copies).
  float* master(UnitId u) override;
  char* state(UnitId u, int k) override;
  // Copies of unit u's stepped master / state k to host memory `out`, from whichever tier.
  void copy_master(UnitId u, float* out) override;
  void copy_state(UnitId u, int k, void* out) override;
  // The working parameters [lo, hi) of unit u's stepped range changed (set_param, attach):
  // the master follows (NVMe: once the file exists; before, it is made from them).
  void refresh_master(UnitId u, std::size_t lo, std::size_t hi) override;
  // Overwrites unit u's stepped master and states with `master` / `states` (host memory, the
  // stepped range; a checkpoint's load), in whichever tier holds them.
  void load_unit(UnitId u, const float* master, const void* const* states) override;

  void speculate(UnitId u, const StepOptions& options) override;
  Settled settle(bool commit) override;

 private:
  // ---- the step during backward (engine/offloaded_optimizer_spec.cpp)
  struct SpecJob {
    UnitId unit = 0;
    const char* grads = nullptr;  // the unit's reduced gradients (host memory)
  };
  void worker_loop();
  int spec_units(const std::vector<SpecJob>& batch);  // on the worker
  // spec_units' steps: a chunk's operands, the job's pinned chunks in the window (whether any
  // was held), the swap file's chunks of the units in `nvme`.
  ShardRef spec_ref(std::size_t c, const char* grads, float* master, char* const* states,
                    void* copy) const;
  bool spec_pinned(const SpecJob& job);
  void spec_nvme(std::vector<SpecJob> nvme);
  // The fused host step of chunk c on `part` (its grads, master, states and copy set), runs
  // gathered into `runs`; a kOptimizer region named `what`.
  void host_step(const std::vector<OptimizerParams>& groups, std::size_t c, ShardRef& part,
                 std::vector<StepRun>& runs, std::int64_t step, float grad_scale, const char* what);
  // Chunk c's updated parameters at `updated` (host memory) to the working parameters.
  void params_out(std::size_t c, const void* updated);
  void commit_speculated();
  char* window_part(std::size_t slot, int k) const;

  void chunk_step(const std::vector<OptimizerParams>& groups, std::size_t c, float* master_part,
                  char* const* state_part, std::int64_t step, float grad_scale);
  void issue_grad_copy(std::size_t c);
  bool pinned(UnitId u) const;  // trainable and in pinned memory
  // ---- observation (each a branch when neither tracer nor counters are attached)
  TraceClock::time_point trace_now() const;
  // A parameter copy out enqueued at `begin`: its region ends when the host waits for `fence`
  // (0: complete already).
  void trace_copy_out(TraceClock::time_point begin, std::size_t c, std::size_t bytes,
                      std::uint64_t fence);
  void copies_out_waited(std::uint64_t fence);  // the host waited for `fence`
  void all_copies_out_waited();
  // n working parameters at src (device memory when on_device) converted into the master at
  // out; `chunk` names the region (-1: none).
  void master_from_params(const char* src, bool on_device, float* out, std::size_t n,
                          std::int64_t chunk);
  void write_nvme_state();
  void nvme_unit_pass(
      UnitId u, bool write,
      const std::function<void(const Chunk&, const offload::ChunkSwapper::Staged&)>& fn);

  const Placement& placement_;
  DeviceOps& dev_;
  const CpuOptimizer& host_;
  const OptimizerParams& params_;
  MemoryTracker& tracker_;
  ShardAccess& access_;
  DType w_, r_;
  Buffer master_;
  std::vector<Buffer> state_;
  std::vector<Buffer> staging_grad_, staging_param_;
  std::vector<StepRun> runs_;               // chunk_step's runs of the chunk (reused)
  std::vector<std::uint64_t> param_fence_;  // per staging buffer: its last copy out (0: none)
  std::vector<std::uint64_t> grad_fence_;   // per staging buffer: its chunk's copy in
  std::size_t grads_issued_ = 0;            // chunks whose gradient copy in has been issued
  std::unique_ptr<offload::ChunkSwapper> swapper_;
  bool nvme_written_ = false;
  Observer observer_;
  // Tracing on: the copies in flight, from enqueue to the host's wait on their fence (on a CUDA
  // copy stream a region is thus an upper bound of the transfer; on the CPU device the copy is
  // done when enqueued).
  struct CopyInFlight {
    TraceClock::time_point begin{};
    std::uint64_t fence = 0;
    std::size_t chunk = 0;
    std::size_t bytes = 0;
  };
  void record_copy_out(const CopyInFlight& copy, TraceClock::time_point end);
  std::vector<CopyInFlight> grad_copy_;   // per staging buffer: its chunk's gradient copy in
  std::vector<CopyInFlight> copies_out_;  // parameter copies out not yet waited for

  // ---- the step during backward
  std::vector<Buffer> window_;          // placement.spec_chunks held chunks (pinned)
  std::vector<std::size_t> spec_slot_;  // per chunk: its window buffer + 1, NVMe 1 (0: none)
  std::vector<bool> committed_;         // per chunk: committed, step() passes it by
  std::size_t window_used_ = 0;
  int spec_units_ = 0;      // units with a chunk held since the last settle()
  bool spec_open_ = false;  // speculate() was called since the last settle()
  StepOptions spec_options_;
  std::vector<StepRun> spec_runs_;  // the worker's
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<SpecJob> jobs_;
  bool busy_ = false, stop_ = false;
  std::exception_ptr spec_error_;
  std::thread worker_;  // started by the first speculate()
};

}  // namespace zero::detail
