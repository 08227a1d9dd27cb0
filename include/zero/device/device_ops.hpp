// zero/device/device_ops.hpp — the engine's device interface: where the working parameters, the
// gradients and (without offload) the fp32 master and optimizer state live, and the few
// operations the engine runs on them (allocate, fill, copy, convert, accumulate, the fused
// optimizer step on a shard, the gradient norm). The engine is written once against it; the
// CPU device (device/device_ops_cpu.cpp: oneTBB + SIMD) and the CUDA device
// (device/device_ops_cuda.cpp: the kernels in kernels/, the engine's stream and a copy stream)
// implement it. Both run the per-element math of zero/optim/detail/optim_math.hpp and the
// conversions of zero/core/dtype.hpp, so a step gives the same bits on either.
//
// Ordering: operations are enqueued on the device's compute stream in call order (the CPU
// device runs them before returning). Copies may go on the copy lane instead (CUDA: a second
// stream, so offload transfers overlap compute); join() orders one lane after the other, and
// record() / wait() let the host wait for a point of a lane. Collectives on device buffers are
// ordered by the communicator (NCCL waits for the compute stream; its handles block the host).
//
// Thread safety: a DeviceOps belongs to one rank's engine and is used from one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "zero/core/dtype.hpp"
#include "zero/device/device.hpp"
#include "zero/device/memory.hpp"
#include "zero/optim/optimizer.hpp"

namespace zero {

class DeviceOps {
 public:
  enum class Lane : std::uint8_t { kCompute, kCopy };

  virtual ~DeviceOps() = default;

  virtual Device device() const noexcept = 0;
  // True when the host may read and write this device's memory directly (the CPU device). The
  // engine then skips the staging a discrete device needs between its memory and the host.
  virtual bool host_accessible() const noexcept = 0;

  // Device memory of `bytes`, charged to category c. Zeroed when opts.zero.
  virtual Buffer alloc(MemoryTracker& tracker, MemCategory c, std::size_t bytes,
                       AllocOptions opts = {}) = 0;

  // dst[0, bytes) = byte.
  virtual void fill(void* dst, unsigned char byte, std::size_t bytes) = 0;
  // Any direction between device memory and pinned host memory (and pageable host memory, for
  // which a CUDA copy is synchronous with the host).
  virtual void copy(void* dst, const void* src, std::size_t bytes, Lane lane = Lane::kCompute) = 0;
  // dst[i] = src[i] converted (round to nearest even). src and dst must not overlap.
  virtual void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype,
                       std::size_t count) = 0;
  // first: dst = src converted; else dst = dst + src in f32, rounded once to dst's dtype.
  virtual void accumulate(void* dst, DType dst_dtype, const void* src, DType src_dtype,
                          std::size_t count, bool first) = 0;
  // The optimizer on shards in device memory (ShardRef's rules, CpuOptimizer::step's contract).
  virtual void init_state(const OptimizerParams& params, const ShardRef& shard) = 0;
  virtual void optimizer_step(const OptimizerParams& params, const ShardRef* shards,
                              std::size_t count, std::int64_t step, float grad_scale) = 0;
  // One shard whose runs belong to several parameter groups (CpuOptimizer::step over runs: an
  // int8 quantization block that spans runs is stepped once).
  virtual void optimizer_step_runs(const OptimizerParams* groups, std::size_t num_groups,
                                   const ShardRef& shard, const StepRun* runs, std::size_t num_runs,
                                   std::int64_t step, float grad_scale) = 0;
  // Sum of squares and non-finite check of `count` gradients in device memory. Deterministic
  // for a given device. Waits for the compute stream.
  virtual GradStats grad_stats(const void* grad, DType dtype, std::size_t count) = 0;
  // Block-wise int8 quantization (zero/device/quantize.hpp: quantize_int8 of any dtype, the same
  // bits on every device) of `count` elements of src into q / scales in device memory. A non-finite
  // element is zero::Error(kInvalidArgument) naming it (CUDA: found when the stream reaches the
  // kernel; this then waits for the compute stream).
  virtual void quantize_int8(const void* src, DType dtype, std::size_t count, std::size_t block,
                             std::int8_t* q, float* scales) = 0;
  // zero/device/quantize.hpp's dequantize_sum_int8 on device memory: dst (dtype) = the f32 sum of n
  // quantized chunks read back, divided by divisor, rounded once.
  virtual void dequantize_sum_int8(const char* chunks, std::size_t stride,
                                   std::size_t scales_offset, int n, std::size_t count,
                                   std::size_t block, float divisor, void* dst, DType dtype) = 0;

  // Makes `waiter` run what is enqueued on it from now on after what is enqueued on `on` so far.
  virtual void join(Lane waiter, Lane on) = 0;
  // A point of `lane`; wait() blocks the host until the lane has passed it.
  virtual std::uint64_t record(Lane lane) = 0;
  virtual void wait(std::uint64_t point) = 0;
  // Blocks the host until both lanes are idle.
  virtual void synchronize() = 0;
};

struct DeviceOpsOptions {
  CpuExecOptions cpu;           // the CPU device's optimizer execution
  void* cuda_stream = nullptr;  // CUDA: the compute stream (the trainer's); null: legacy default
};

// The device ops of `device`: Device::cpu() always; Device::cuda(k) in a CUDA build with device k
// present, else zero::Error(kCuda) saying why.
std::shared_ptr<DeviceOps> make_device_ops(Device device, const DeviceOpsOptions& options = {});

// The CPU device. Subclassable (tests make a "discrete" CPU device whose memory the engine must
// treat as not host-accessible, so the staging a GPU needs runs and is checked on the CPU).
class CpuDeviceOps : public DeviceOps {
 public:
  explicit CpuDeviceOps(CpuExecOptions options = {});
  Device device() const noexcept override { return Device::cpu(); }
  bool host_accessible() const noexcept override { return true; }
  Buffer alloc(MemoryTracker& tracker, MemCategory c, std::size_t bytes,
               AllocOptions opts = {}) override;
  void fill(void* dst, unsigned char byte, std::size_t bytes) override;
  void copy(void* dst, const void* src, std::size_t bytes, Lane lane = Lane::kCompute) override;
  void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype,
               std::size_t count) override;
  void accumulate(void* dst, DType dst_dtype, const void* src, DType src_dtype, std::size_t count,
                  bool first) override;
  void init_state(const OptimizerParams& params, const ShardRef& shard) override;
  void optimizer_step(const OptimizerParams& params, const ShardRef* shards, std::size_t count,
                      std::int64_t step, float grad_scale) override;
  void optimizer_step_runs(const OptimizerParams* groups, std::size_t num_groups,
                           const ShardRef& shard, const StepRun* runs, std::size_t num_runs,
                           std::int64_t step, float grad_scale) override;
  GradStats grad_stats(const void* grad, DType dtype, std::size_t count) override;
  void quantize_int8(const void* src, DType dtype, std::size_t count, std::size_t block,
                     std::int8_t* q, float* scales) override;
  void dequantize_sum_int8(const char* chunks, std::size_t stride, std::size_t scales_offset, int n,
                           std::size_t count, std::size_t block, float divisor, void* dst,
                           DType dtype) override;
  void join(Lane, Lane) override {}
  std::uint64_t record(Lane) override { return 0; }
  void wait(std::uint64_t) override {}
  void synchronize() override {}

 private:
  CpuOptimizer optimizer_;
};

}  // namespace zero
