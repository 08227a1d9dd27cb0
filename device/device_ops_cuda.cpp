// The CUDA device: device memory on one GPU; operations enqueued on the engine's compute stream
// (the trainer's, so they follow its backward) with the kernels of kernels/; offload transfers
// on a second, non-blocking copy stream; record()/wait() over a pool of events.
#include <cuda_runtime.h>

#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "zero/core/error.hpp"
#include "zero/core/log.hpp"
#include "zero/device/detail/cuda_runtime.hpp"
#include "zero/device/detail/kernels.hpp"
#include "zero/device/device_ops.hpp"
#include "zero/device/quantize.hpp"

namespace zero {

namespace {

void check(cudaError_t e, const char* what, int device) {
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();
  ZERO_THROW(kCuda, what, " on cuda:", device, " failed: ", cudaGetErrorName(e), ": ",
             cudaGetErrorString(e));
}

class CudaDeviceOps final : public DeviceOps {
 public:
  CudaDeviceOps(int index, void* stream)
      : index_(index), compute_(static_cast<cudaStream_t>(stream)) {
    check(cudaSetDevice(index_), "cudaSetDevice", index_);
    check(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking), "cudaStreamCreate", index_);
  }
  ~CudaDeviceOps() override {
    cudaSetDevice(index_);
    cudaStreamSynchronize(copy_);
    cudaStreamSynchronize(compute_);
    for (const Point& p : points_) cudaEventDestroy(p.event);
    for (cudaEvent_t e : spare_) cudaEventDestroy(e);
    if (bad_ != nullptr) cudaFree(bad_);
    cudaStreamDestroy(copy_);
  }

  Device device() const noexcept override { return Device::cuda(index_); }
  bool host_accessible() const noexcept override { return false; }

  // Zeroing is enqueued on the compute stream (a plain cudaMemset runs on the legacy default
  // stream, which a non-blocking compute stream does not wait for).
  Buffer alloc(MemoryTracker& tracker, MemCategory c, std::size_t bytes,
               AllocOptions opts) override {
    bind();
    const bool zero = opts.zero;
    opts.zero = false;
    Buffer b = Buffer::device(tracker, c, bytes, device(), opts);
    if (zero) fill(b.data(), 0, b.size());
    return b;
  }
  void fill(void* dst, unsigned char byte, std::size_t bytes) override {
    if (bytes == 0) return;
    bind();
    check(cudaMemsetAsync(dst, byte, bytes, compute_), "cudaMemsetAsync", index_);
  }
  void copy(void* dst, const void* src, std::size_t bytes, Lane lane) override {
    if (bytes == 0 || dst == src) return;
    bind();
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_of(lane)), "cudaMemcpyAsync",
          index_);
  }
  void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype,
               std::size_t count) override {
    if (src_dtype == dst_dtype) {
      copy(dst, src, count * dtype_size(src_dtype), Lane::kCompute);
      return;
    }
    bind();
    detail::kernels::cast(src, src_dtype, dst, dst_dtype, count, compute_);
  }
  void accumulate(void* dst, DType dst_dtype, const void* src, DType src_dtype, std::size_t count,
                  bool first) override {
    bind();
    detail::kernels::accumulate(dst, dst_dtype, src, src_dtype, count, first, compute_);
  }
  void init_state(const OptimizerParams& params, const ShardRef& shard) override {
    const std::size_t bytes = state_bytes(params.state_dtype(), shard.count);
    for (int k = 0; k < params.num_states(); ++k) fill(shard.state[k], 0, bytes);
  }
  void optimizer_step(const OptimizerParams& params, const ShardRef* shards, std::size_t count,
                      std::int64_t step, float grad_scale) override {
    bind();
    detail::kernels::optimizer_step(params, shards, count, step, grad_scale, compute_);
  }
  void optimizer_step_runs(const OptimizerParams* groups, std::size_t num_groups,
                           const ShardRef& shard, const StepRun* runs, std::size_t num_runs,
                           std::int64_t step, float grad_scale) override {
    bind();
    detail::kernels::optimizer_step_runs(groups, num_groups, shard, runs, num_runs, step,
                                         grad_scale, compute_);
  }
  GradStats grad_stats(const void* grad, DType dtype, std::size_t count) override {
    bind();
    const detail::kernels::GradRef ref{grad, count, dtype};
    return detail::kernels::grad_stats(&ref, 1, compute_);
  }
  void quantize_int8(const void* src, DType dtype, std::size_t count, std::size_t block,
                     std::int8_t* q, float* scales) override {
    if (count == 0) return;
    bind();
    if (bad_ == nullptr) {
      check(cudaMalloc(reinterpret_cast<void**>(&bad_), sizeof *bad_), "cudaMalloc", index_);
    }
    check(cudaMemsetAsync(bad_, 0xff, sizeof *bad_, compute_), "cudaMemsetAsync", index_);
    detail::kernels::quantize_int8(src, dtype, count, block, q, scales, bad_, compute_);
    unsigned long long first = 0;
    check(cudaMemcpyAsync(&first, bad_, sizeof first, cudaMemcpyDeviceToHost, compute_),
          "cudaMemcpyAsync", index_);
    check(cudaStreamSynchronize(compute_), "cudaStreamSynchronize(compute)", index_);
    if (first == ~0ull) return;
    float v = 0.0f;
    const std::size_t es = dtype_size(dtype);
    std::uint32_t raw = 0;
    check(cudaMemcpy(&raw, static_cast<const char*>(src) + first * es, es, cudaMemcpyDeviceToHost),
          "cudaMemcpy", index_);
    zero::convert(&raw, dtype, &v, DType::kF32, 1);
    detail::throw_non_finite("quantize_int8 on cuda:" + std::to_string(index_), first, block, dtype,
                             v);
  }
  void dequantize_sum_int8(const char* chunks, std::size_t stride, std::size_t scales_offset, int n,
                           std::size_t count, std::size_t block, float divisor, void* dst,
                           DType dtype) override {
    bind();
    detail::kernels::dequantize_sum_int8(chunks, stride, scales_offset, n, count, block, divisor,
                                         dst, dtype, compute_);
  }

  void join(Lane waiter, Lane on) override {
    if (waiter == on) return;
    bind();
    cudaEvent_t e = take_event();
    check(cudaEventRecord(e, stream_of(on)), "cudaEventRecord", index_);
    const cudaError_t rc = cudaStreamWaitEvent(stream_of(waiter), e, 0);
    spare_.push_back(e);  // safe to re-record: the wait captured this record
    check(rc, "cudaStreamWaitEvent", index_);
  }
  std::uint64_t record(Lane lane) override {
    bind();
    cudaEvent_t e = take_event();
    const cudaError_t rc = cudaEventRecord(e, stream_of(lane));
    if (rc != cudaSuccess) spare_.push_back(e);
    check(rc, "cudaEventRecord", index_);
    points_.push_back({++next_point_, lane, e});
    return next_point_;
  }
  void wait(std::uint64_t point) override {
    // A lane passes its points in order: waiting for one retires the earlier ones of its lane.
    auto it = points_.begin();
    while (it != points_.end() && it->id != point) ++it;
    if (it == points_.end()) return;  // already retired
    const Lane lane = it->lane;
    const cudaError_t rc = cudaEventSynchronize(it->event);
    for (auto p = points_.begin(); p != points_.end();) {
      if (p->lane == lane && p->id <= point) {
        spare_.push_back(p->event);
        p = points_.erase(p);
      } else {
        ++p;
      }
    }
    check(rc, "cudaEventSynchronize", index_);
  }
  void synchronize() override {
    bind();
    check(cudaStreamSynchronize(copy_), "cudaStreamSynchronize(copy)", index_);
    check(cudaStreamSynchronize(compute_), "cudaStreamSynchronize(compute)", index_);
    for (const Point& p : points_) spare_.push_back(p.event);
    points_.clear();
  }

 private:
  // The engine's device for launches and allocations on this thread (another device may have
  // been made current since).
  void bind() const { check(cudaSetDevice(index_), "cudaSetDevice", index_); }
  cudaStream_t stream_of(Lane lane) const { return lane == Lane::kCopy ? copy_ : compute_; }
  cudaEvent_t take_event() {
    if (!spare_.empty()) {
      cudaEvent_t e = spare_.back();
      spare_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate", index_);
    return e;
  }

  int index_;
  cudaStream_t compute_;
  cudaStream_t copy_ = nullptr;
  std::uint64_t next_point_ = 0;
  struct Point {
    std::uint64_t id;
    Lane lane;
    cudaEvent_t event;
  };
  std::deque<Point> points_;
  std::vector<cudaEvent_t> spare_;
  unsigned long long* bad_ = nullptr;  // quantize_int8: the first non-finite element's index
};

}  // namespace

std::shared_ptr<DeviceOps> make_device_ops(Device device, const DeviceOpsOptions& options) {
  if (device.is_cpu()) return std::make_shared<CpuDeviceOps>(options.cpu);
  const int n = detail::cuda::device_count();
  ZERO_CHECK(device.index >= 0 && device.index < n, kCuda, "cannot run the engine on ",
             device.to_string(), ": ",
             n == 0 ? detail::cuda::unavailable_reason()
                    : "this machine has " + std::to_string(n) + " CUDA devices");
  return std::make_shared<CudaDeviceOps>(device.index, options.cuda_stream);
}

}  // namespace zero
