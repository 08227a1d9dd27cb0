// The CPU device: device memory is host memory; every operation runs before it returns
// (oneTBB-parallel, the SIMD optimizer of optim/).
#include <cstring>

#include "device/grad_accumulate.hpp"
#include "zero/core/error.hpp"
#include "zero/device/detail/cuda_runtime.hpp"
#include "zero/device/device_ops.hpp"
#include "zero/device/quantize.hpp"

namespace zero {

CpuDeviceOps::CpuDeviceOps(CpuExecOptions options) : optimizer_(options) {}

Buffer CpuDeviceOps::alloc(MemoryTracker& tracker, MemCategory c, std::size_t bytes,
                           AllocOptions opts) {
  return Buffer::host(tracker, c, bytes, opts);
}

void CpuDeviceOps::fill(void* dst, unsigned char byte, std::size_t bytes) {
  if (bytes != 0) std::memset(dst, byte, bytes);
}

void CpuDeviceOps::copy(void* dst, const void* src, std::size_t bytes, Lane) {
  if (bytes != 0 && dst != src) std::memcpy(dst, src, bytes);
}

void CpuDeviceOps::convert(const void* src, DType src_dtype, void* dst, DType dst_dtype,
                           std::size_t count) {
  zero::convert(src, src_dtype, dst, dst_dtype, count);
}

void CpuDeviceOps::accumulate(void* dst, DType dst_dtype, const void* src, DType src_dtype,
                              std::size_t count, bool first) {
  detail::accumulate(dst, dst_dtype, src, src_dtype, count, first);
}

void CpuDeviceOps::init_state(const OptimizerParams& params, const ShardRef& shard) {
  optimizer_.init_state(params, shard);
}

void CpuDeviceOps::optimizer_step(const OptimizerParams& params, const ShardRef* shards,
                                  std::size_t count, std::int64_t step, float grad_scale) {
  for (std::size_t k = 0; k < count; ++k) optimizer_.step(params, shards[k], step, grad_scale);
}

void CpuDeviceOps::optimizer_step_runs(const OptimizerParams* groups, std::size_t num_groups,
                                       const ShardRef& shard, const StepRun* runs,
                                       std::size_t num_runs, std::int64_t step, float grad_scale) {
  optimizer_.step(groups, num_groups, shard, runs, num_runs, step, grad_scale);
}

GradStats CpuDeviceOps::grad_stats(const void* grad, DType dtype, std::size_t count) {
  return optimizer_.grad_stats(grad, dtype, count);
}

void CpuDeviceOps::quantize_int8(const void* src, DType dtype, std::size_t count, std::size_t block,
                                 std::int8_t* q, float* scales) {
  zero::quantize_int8(src, dtype, count, block, q, scales);
}

void CpuDeviceOps::dequantize_sum_int8(const char* chunks, std::size_t stride,
                                       std::size_t scales_offset, int n, std::size_t count,
                                       std::size_t block, float divisor, void* dst, DType dtype) {
  zero::dequantize_sum_int8(chunks, stride, scales_offset, n, count, block, divisor, dst, dtype);
}

#if !ZERO_WITH_CUDA
std::shared_ptr<DeviceOps> make_device_ops(Device device, const DeviceOpsOptions& options) {
  ZERO_CHECK(device.is_cpu(), kCuda, "cannot run the engine on ", device.to_string(), ": ",
             detail::cuda::unavailable_reason());
  return std::make_shared<CpuDeviceOps>(options.cpu);
}
#endif

}  // namespace zero
