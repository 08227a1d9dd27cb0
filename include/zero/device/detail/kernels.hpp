// zero/device/detail/kernels.hpp — host launchers of the CUDA kernels in kernels/, as plain C++.
//
// Nothing outside kernels/ includes a CUDA header: streams travel as `void*` (a cudaStream_t;
// nullptr is the legacy default stream) and pointers are device pointers. Every launcher
// checks its arguments (zero::Error(kInvalidArgument)) and the launch (cudaGetLastError:
// zero::Error(kCuda) with CUDA's message). Defined only when the library is built with CUDA
// (ZERO_WITH_CUDA); callers check zero::detail::cuda::built() / device_count() first.
//
// The optimizer kernels apply the same per-element functions as the CPU path
// (zero/optim/detail/optim_math.hpp) with the same f32 operations (an FMA exactly where it writes
// fma(), no other contraction), so a GPU step gives the same bits as CpuOptimizer::step on the same
// data.
//
// Thread safety: launchers may be called from any thread; kernels on one stream run in order.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zero/core/dtype.hpp"
#include "zero/optim/optimizer.hpp"

namespace zero::detail::kernels {

// One fused multi-tensor launch (or a few: at most 24 shards per launch) applying `params` at
// step `step` to every shard of `shards` (device pointers, ShardRef's rules: f32 master,
// f32/bf16/f16 grads, state per OptimizerParams::state_dtype(), optional 16-bit copy; shards
// may differ in dtype and copy; each array aligned to its element size; 16-byte alignment of
// every f32 array and 8-byte alignment of every 16-bit array enables the vectorized path).
// Returns when enqueued on `stream`; the arrays must stay valid until the stream reaches it.
void optimizer_step(const OptimizerParams& params, const ShardRef* shards, std::size_t count,
                    std::int64_t step, float grad_scale, void* stream);

// One shard whose runs belong to several parameter groups (CpuOptimizer::step over runs, the
// same bits): int8 moments in one launch per shard (a few for shards of more than 32 runs), one
// thread block per quantization block; f32 / bf16 moments as optimizer_step per run. Returns
// when enqueued.
void optimizer_step_runs(const OptimizerParams* groups, std::size_t num_groups,
                         const ShardRef& shard, const StepRun* runs, std::size_t num_runs,
                         std::int64_t step, float grad_scale, void* stream);

// One gradient tensor on the device.
struct GradRef {
  const void* data = nullptr;
  std::size_t count = 0;
  DType dtype = DType::kF32;
};

// Sum of squares (in double) and the non-finite check over a list of gradient tensors, in one
// read. Deterministic for a given device (fixed grid, fixed reduction order). Waits for
// `stream` and returns the result (the one synchronising launcher here).
GradStats grad_stats(const GradRef* tensors, std::size_t count, void* stream);

// data[i] = data[i] * factor in place, rounded back to `dtype` (unscaling 16-bit or f32
// gradients). Returns when enqueued.
void scale(void* data, DType dtype, std::size_t count, float factor, void* stream);

// dst[i] = src[i] converted (round to nearest even; the scalar rules of zero/core/dtype.hpp).
// src and dst must not overlap. Returns when enqueued.
void cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t count,
          void* stream);

// Gradient accumulation (device/grad_accumulate.hpp's rule): first: dst[i] = src[i] converted;
// else dst[i] = dst[i] + src[i] in f32, rounded once to dst's dtype. The same bits as
// zero::detail::accumulate on the CPU. Returns when enqueued.
void accumulate(void* dst, DType dst_dtype, const void* src, DType src_dtype, std::size_t count,
                bool first, void* stream);

// Block-wise int8 quantization (zero/device/quantize.hpp's layout and per-element math, the same
// bits as the CPU path): q and scales from x. A non-finite element is not an error here (the launch
// is asynchronous): when `first_non_finite` (a device word the caller set to ~0ull) is given,
// the smallest such index is stored there, and that block's q and scale are unspecified; the
// caller checks it after the stream reaches the launch. Returns when enqueued.
void quantize_int8(const float* x, std::size_t count, std::size_t block, std::int8_t* q,
                   float* scales, unsigned long long* first_non_finite, void* stream);
// The same from x of any dtype (16-bit values read as f32 exactly).
void quantize_int8(const void* x, DType dtype, std::size_t count, std::size_t block, std::int8_t* q,
                   float* scales, unsigned long long* first_non_finite, void* stream);
// zero::dequantize_sum_int8 (zero/device/quantize.hpp), the same bits: dst = the f32 sum of n
// chunks read back, divided by divisor, rounded once to dtype. Returns when enqueued.
void dequantize_sum_int8(const char* chunks, std::size_t stride, std::size_t scales_offset, int n,
                         std::size_t count, std::size_t block, float divisor, void* dst,
                         DType dtype, void* stream);
// out[i] = q[i] * scales[i / block] (add: out[i] += it, in f32). Returns when enqueued.
void dequantize_int8(const std::int8_t* q, const float* scales, std::size_t count,
                     std::size_t block, float* out, bool add, void* stream);

}  // namespace zero::detail::kernels
