// zero-env: prints what zero detects on this machine and the configuration a run would use,
// resolved from --config FILE, the environment (ZERO_STAGE, ZERO_SET, ...) and --zero-stage /
// --set flags, then measures what prefaulting does to the first touch of optimizer-sized state.
//
//   zero-env [--config ds.json] [--zero-stage N] [--set key.path=value]... [--mib N]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "zero/config.hpp"
#include "zero/cpu_features.hpp"
#include "zero/detail/cuda_runtime.hpp"
#include "zero/error.hpp"
#include "zero/memory.hpp"
#include "zero/memory_report.hpp"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int run(int argc, char** argv) {
  std::vector<std::string> rest;
  const zero::Config cfg = zero::config_from_command_line(argc, argv, &rest);
  std::size_t mib = 256;
  for (std::size_t i = 0; i < rest.size(); ++i) {
    if (rest[i] == "--mib" && i + 1 < rest.size()) {
      mib = std::stoull(rest[++i]);
    } else {
      ZERO_THROW(kInvalidArgument, "unknown argument '", rest[i],
                 "' (zero-env takes --config, --zero-stage, --set, --mib)");
    }
  }
  const auto& f = zero::cpu_features();
  std::printf("cpu: avx2=%d f16c=%d avx512=%d avx512_bf16=%d -> SIMD path %s\n", f.avx2, f.f16c,
              f.avx512, f.avx512_bf16, std::string(zero::to_string(zero::best_isa())).c_str());
  const int gpus = zero::detail::cuda::device_count();
  std::printf("cuda: built=%d devices=%d%s%s\n", zero::detail::cuda::built(), gpus,
              gpus == 0 ? " — " : "",
              gpus == 0 ? zero::detail::cuda::unavailable_reason().c_str() : "");
  std::printf("mpi: built=%d\n", ZERO_WITH_MPI);
  std::printf("config: %s\n", cfg.to_json().c_str());

  // First touch vs prefaulted: why optimizer state is prefaulted in parallel at allocation.
  zero::MemoryTracker tracker;
  const std::size_t bytes = mib << 20;
  {
    zero::Buffer cold = zero::Buffer::host(tracker, zero::MemCategory::kOptimizerState, bytes);
    auto t0 = std::chrono::steady_clock::now();
    std::memset(cold.data(), 1, bytes);
    const double first = seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    std::memset(cold.data(), 2, bytes);
    const double second = seconds_since(t0);
    std::printf("first touch of %zu MiB: %.2f GB/s; the same memory touched again: %.2f GB/s\n",
                mib, bytes / first / 1e9, bytes / second / 1e9);
  }
  {
    auto t0 = std::chrono::steady_clock::now();
    zero::Buffer warm =
        zero::Buffer::host(tracker, zero::MemCategory::kOptimizerState, bytes, {.prefault = true});
    const double alloc = seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    std::memset(warm.data(), 1, bytes);
    const double use = seconds_since(t0);
    std::printf("prefaulted (parallel) allocation: %.2f GB/s; first use afterwards: %.2f GB/s\n",
                bytes / alloc / 1e9, bytes / use / 1e9);
    std::printf("%s", tracker.report().table().c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const zero::Error& e) {
    std::fprintf(stderr, "zero-env: %s\n", e.what());
    return 2;
  }
}
