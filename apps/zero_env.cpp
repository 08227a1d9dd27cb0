// zero-env: prints what zero detects on this machine and the configuration a run would use,
// resolved from --config FILE, the environment (ZERO_STAGE, ZERO_SET, ...) and --zero-stage /
// --set flags, then measures what prefaulting does to the first touch of optimizer-sized state,
// and, for an NVMe offload directory (the config's nvme_path, or --nvme-probe DIR), whether the
// swap files get O_DIRECT and io_uring there and the swapper's write / read throughput.
//
// --calibrate: measures the machine profile the configuration chooser times steps with
// (zero/plan/profile.hpp: memory copy, the CPU optimizer per moment dtype, NVMe under --nvme-path,
// the in-process communicator's collectives; on a machine with a CUDA device its copy, host <->
// device and, with two or more devices, NCCL's collectives; with --gpt or a shape flag, the GPT
// trainer's FLOP/s at that shape and --batch with --ranks in-process ranks computing together,
// default 2) and writes it as JSON to --out FILE (default: stdout).
//
//   zero-env [--config ds.json] [--zero-stage N] [--set key.path=value]... [--mib N]
//            [--nvme-probe DIR]
//   zero-env --calibrate [--out machine.json] [--nvme-path DIR] [--gpt] [--layers L] [--dim D]
//            [--heads H] [--seq T] [--batch B] [--ranks N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "gpt/gpt_cost.hpp"
#include "gpt/gpt_flags.hpp"
#include "offload/nvme_swapper.hpp"
#include "zero/config/config.hpp"
#include "zero/core/cpu_features.hpp"
#include "zero/core/error.hpp"
#include "zero/device/detail/cuda_runtime.hpp"
#include "zero/device/memory.hpp"
#include "zero/device/memory_report.hpp"
#include "zero/plan/profile.hpp"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Writes and reads `mib` MiB through the NVMe swapper in 8 MiB chunks (the config's aio keys,
// pipelined, 4 staging buffers); the file is removed afterwards.
void probe_nvme(const std::string& dir, std::size_t mib, const zero::Config& cfg) {
  zero::MemoryTracker t;
  constexpr std::size_t kChunk = std::size_t{8} << 20;
  std::vector<std::size_t> chunks(std::max<std::size_t>(1, (mib << 20) / kChunk), kChunk);
  zero::offload::ChunkSwapper::Options o;
  o.dir = dir;
  o.stem = "probe";
  o.origin = "--nvme-probe";
  o.aio = zero::offload::AioOptions::from_config(cfg.aio);
  zero::offload::ChunkSwapper sw(t, chunks, {{zero::MemCategory::kOther, 1}}, o);
  const double bytes = static_cast<double>(sw.file_bytes());
  auto t0 = std::chrono::steady_clock::now();
  sw.run(0, chunks.size(), false, true,
         [](const zero::offload::ChunkSwapper::Staged& s) { std::memset(s.part[0], 1, s.count); });
  const double w = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  sw.run(0, chunks.size(), true, false, [](const zero::offload::ChunkSwapper::Staged&) {});
  const double r = seconds_since(t0);
  std::printf(
      "nvme %s: aio engine %s, O_DIRECT %s; swap write %.2f GB/s, read %.2f GB/s (%.0f MiB)\n",
      dir.c_str(), sw.engine(), sw.file().direct() ? "yes" : "no (page cache)", bytes / w / 1e9,
      bytes / r / 1e9, bytes / 1048576.0);
}

// --calibrate: the profile, a summary on stderr, the JSON to `out` (empty: stdout).
int run_calibrate(const std::string& nvme_path, const std::string& out, bool gpt,
                  const zero::gpt::GptConfig& model, int batch, int ranks) {
  zero::CalibrateOptions co;
  co.nvme_path = nvme_path;
  const auto t0 = std::chrono::steady_clock::now();
  zero::MachineProfile p = zero::calibrate(co);
  if (gpt) {
    p.trainer_flops_per_s = zero::gpt::measure_flops(model, batch, 3, ranks);
    p.trainer = "gpt --layers " + std::to_string(model.layers) + " --dim " +
                std::to_string(model.dim) + " --heads " + std::to_string(model.heads) + " --seq " +
                std::to_string(model.seq) + " --batch " + std::to_string(batch) + " --ranks " +
                std::to_string(ranks);
  }
  std::fprintf(stderr,
               "calibrated in %.1f s: copy %.2f GB/s; optimizer %.0f / %.0f / %.0f M elements/s "
               "(f32 / bf16 / int8 moments, the largest size)",
               seconds_since(t0), p.copy_bytes_per_s / 1e9, p.optimizer_f32_per_s / 1e6,
               p.optimizer_bf16_per_s / 1e6, p.optimizer_int8_per_s / 1e6);
  std::fprintf(stderr, " [by size:");
  for (const zero::OptimizerPoint& o : p.optimizer_points) {
    std::fprintf(stderr, " %s %zu Ki %.0f", o.moment_dtype.c_str(), o.elements >> 10,
                 o.per_s / 1e6);
  }
  std::fprintf(stderr, "]");
  if (p.nvme_read_bytes_per_s > 0) {
    std::fprintf(stderr, "; nvme read %.2f GB/s, write %.2f GB/s", p.nvme_read_bytes_per_s / 1e9,
                 p.nvme_write_bytes_per_s / 1e9);
  }
  if (p.cuda.measured()) {
    std::fprintf(stderr,
                 "; cuda:0 %s (%d devices): copy %.0f GB/s, host->device %.1f GB/s, "
                 "device->host %.1f GB/s, %zu NCCL points",
                 p.cuda.device.c_str(), p.cuda.devices, p.cuda.hbm_copy_bytes_per_s / 1e9,
                 p.cuda.host_to_device_bytes_per_s / 1e9, p.cuda.device_to_host_bytes_per_s / 1e9,
                 p.cuda.nccl.size());
  }
  if (p.trainer_flops_per_s > 0) {
    std::fprintf(stderr, "; trainer %.2f GFLOP/s (%s)", p.trainer_flops_per_s / 1e9,
                 p.trainer.c_str());
  }
  std::fprintf(stderr, "\n");
  if (out.empty()) {
    std::printf("%s", zero::to_json(p).c_str());
  } else {
    zero::write_profile(p, out);
    std::fprintf(stderr, "wrote %s\n", out.c_str());
  }
  return 0;
}

int run(int argc, char** argv) {
  std::vector<std::string> rest;
  const zero::Config cfg = zero::config_from_command_line(argc, argv, &rest);
  std::size_t mib = 256;
  std::vector<std::string> nvme_dirs;
  for (const auto* o :
       {&cfg.zero_optimization.offload_optimizer, &cfg.zero_optimization.offload_param}) {
    if (o->device == zero::OffloadDevice::kNvme) nvme_dirs.push_back(o->nvme_path);
  }
  bool calibrate = false, gpt = false;
  std::string out, nvme_path;
  zero::gpt::GptConfig model;  // zero-train's default shape
  model.layers = 4;
  model.dim = 128;
  int batch = 8, ranks = 2;
  for (std::size_t i = 0; i < rest.size(); ++i) {
    auto value = [&]() -> std::string {
      ZERO_CHECK(i + 1 < rest.size(), kInvalidArgument, rest[i], " needs a value");
      return rest[++i];
    };
    const std::string a = rest[i];
    if (a == "--calibrate") {
      calibrate = true;
    } else if (a == "--out") {
      out = value();
    } else if (a == "--nvme-path") {
      nvme_path = value();
    } else if (a == "--gpt") {
      gpt = true;
    } else if (a == "--batch") {
      batch = zero::gpt::flag_int(a, value());
    } else if (a == "--ranks") {
      ranks = zero::gpt::flag_int(a, value());
    } else if (zero::gpt::model_flag(a, value, model)) {
      gpt = true;
    } else if (rest[i] == "--mib" && i + 1 < rest.size()) {
      mib = std::stoull(rest[++i]);
    } else if (rest[i] == "--nvme-probe" && i + 1 < rest.size()) {
      nvme_dirs.push_back(rest[++i]);
    } else {
      ZERO_THROW(kInvalidArgument, "unknown argument '", rest[i],
                 "' (zero-env takes --config, --zero-stage, --set, --mib, --nvme-probe DIR, "
                 "--calibrate, --out, --nvme-path, --gpt, --layers, --dim, --heads, --seq, "
                 "--batch, --ranks)");
    }
  }
  if (calibrate) return run_calibrate(nvme_path, out, gpt, model, batch, ranks);
  const auto& f = zero::cpu_features();
  std::printf("cpu: avx2=%d f16c=%d avx512=%d avx512_bf16=%d -> SIMD path %s\n", f.avx2, f.f16c,
              f.avx512, f.avx512_bf16, std::string(zero::to_string(zero::best_isa())).c_str());
  const int gpus = zero::detail::cuda::device_count();
  std::printf("cuda: built=%d devices=%d%s%s\n", zero::detail::cuda::built(), gpus,
              gpus == 0 ? " — " : "",
              gpus == 0 ? zero::detail::cuda::unavailable_reason().c_str() : "");
  std::printf("mpi: built=%d\n", ZERO_WITH_MPI);
  std::printf("config: %s\n", cfg.to_json().c_str());
  for (const std::string& d : nvme_dirs) probe_nvme(d, mib, cfg);

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

int main(int argc, char** argv) try { return run(argc, argv); } catch (...) {
  return zero::report_exception("zero-env");
}
