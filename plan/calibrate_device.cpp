// calibrate()'s CUDA part (zero/plan/profile.hpp, CudaProfile): on a machine with a CUDA device,
// the device copy (HBM), page-locked host to device and back, and NCCL's collectives with one GPU
// per in-process rank. Through the library's thin CUDA runtime
// (zero/device/detail/cuda_runtime.hpp) and communicator (zero/comm/comm.hpp): no CUDA header here,
// so a build without CUDA compiles it too and finds no device.
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "plan/calibrate_parts.hpp"
#include "zero/comm/comm.hpp"
#include "zero/core/error.hpp"
#include "zero/device/detail/cuda_runtime.hpp"
#include "zero/plan/profile.hpp"

namespace zero::detail {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Device or page-locked host memory freed on every path.
struct Mem {
  void* p = nullptr;
  int device = -1;  // -1: page-locked host memory
  Mem(std::size_t bytes, int dev) : device(dev) {
    p = dev < 0 ? cuda::host_alloc(bytes) : cuda::device_alloc(bytes, dev);
    if (dev >= 0) cuda::device_memset(p, 1, bytes, dev);
  }
  Mem(const Mem&) = delete;
  Mem& operator=(const Mem&) = delete;
  ~Mem() { device < 0 ? cuda::host_free(p) : cuda::device_free(p, device); }
};

// Bytes per second of the best of `repeats` synchronous copies after one warm-up.
double copy_rate(void* dst, const void* src, std::size_t bytes, int repeats) {
  cuda::copy_sync(dst, src, bytes, 0);
  double best = 1e300;
  for (int k = 0; k < std::max(repeats, 1); ++k) {
    const auto t0 = Clock::now();
    cuda::copy_sync(dst, src, bytes, 0);
    best = std::min(best, seconds_since(t0));
  }
  return static_cast<double>(bytes) / best;
}

// Every op at every size over `ranks` GPUs (rank r on cuda:r, a thread each, one communicator per
// rank for all of them, bootstrapped through `id_file`): rank 0's time of each repeat between two
// barriers, the best after a warm-up.
std::vector<CollectivePoint> nccl_points(int ranks, const std::vector<std::size_t>& sizes,
                                         int repeats, const std::string& id_file) {
  const std::size_t n = static_cast<std::size_t>(ranks);
  const char* ops[] = {"all_reduce", "reduce_scatter", "all_gather"};
  std::vector<CollectivePoint> out;
  for (const char* op : ops) {
    for (std::size_t b : sizes) out.push_back({op, ranks, b, 1e300});
  }
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        CommOptions co;
        co.backend = "nccl";
        co.rank = r;
        co.size = ranks;
        co.local_rank = r;
        co.device = r;
        co.device_buffers = true;
        co.rendezvous_file = id_file;
        const std::unique_ptr<Communicator> c = make_communicator(co);
        for (CollectivePoint& pt : out) {
          const std::size_t count = std::max<std::size_t>(pt.bytes / 4 / n, 1) * n;
          const Mem send(count * 4, r), recv(count * 4, r);
          for (int k = 0; k <= std::max(repeats, 1); ++k) {  // k == 0: the warm-up
            const double s = timed_collective(*c, pt.op, send.p, recv.p, count);
            if (r == 0 && k > 0) pt.seconds = std::min(pt.seconds, s);
          }
        }
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return out;
}

}  // namespace

// Fills p.cuda on a machine with a CUDA device (cuda:0's copies; NCCL at every rank count of
// o.cuda_ranks the devices allow); leaves it empty (not measured) without one.
void calibrate_cuda(const CalibrateOptions& o, MachineProfile& p) {
  const int devices = cuda::device_count();
  if (!o.cuda || devices == 0) return;
  CudaProfile& c = p.cuda;
  c.device = cuda::device_name(0);
  c.devices = devices;
  {
    const Mem a(o.cuda_copy_bytes, 0), b(o.cuda_copy_bytes, 0), h(o.cuda_copy_bytes, -1);
    c.hbm_copy_bytes_per_s = copy_rate(b.p, a.p, o.cuda_copy_bytes, o.repeats);
    c.host_to_device_bytes_per_s = copy_rate(a.p, h.p, o.cuda_copy_bytes, o.repeats);
    c.device_to_host_bytes_per_s = copy_rate(h.p, a.p, o.cuda_copy_bytes, o.repeats);
  }
  const std::string id_file = "/tmp/zero-calibrate-nccl-" + std::to_string(::getpid());
  for (int n : o.cuda_ranks) {
    if (n < 2 || n > devices) continue;  // NCCL refuses two ranks on one GPU
    (void)std::remove(id_file.c_str());
    for (const CollectivePoint& pt : nccl_points(n, o.sizes, o.repeats, id_file)) {
      c.nccl.push_back(pt);
    }
  }
  (void)std::remove(id_file.c_str());
}

}  // namespace zero::detail
