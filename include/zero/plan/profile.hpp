// zero/plan/profile.hpp — a machine profile: what a training step's time depends on, measured on
// this machine (calibrate()) or written by hand for another (a cluster's figures are valid input).
//
// The figures: host memory copy bandwidth; the CPU optimizer's elements/s per moment dtype
// (optimizer.params.moment_dtype f32 / bf16 / int8); NVMe read and write at the swapper's request
// size (when a directory was given); the communicator's collectives as measured points (operation,
// ranks, bytes per rank, seconds); the trainer's FLOP/s (when a trainer was measured or stated).
// The configuration chooser (zero/plan/choose.hpp) turns them into a predicted step time.
//
// The file is plain JSON a person can edit (write_profile / read_profile, format
// "zero-machine-profile/1"). Reading validates every field: an unknown key, a missing one, a
// wrong type or a value out of range is a zero::Error(kConfig) naming the key, the value and the
// file.
//
// Thread safety: MachineProfile is a plain value; the functions are pure apart from the files
// they read or write and calibrate(), which runs its measurements on the calling thread's
// oneTBB arena and on threads of its own (the communicator's ranks).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace zero {

// One measured collective: `op` ("all_reduce", "reduce_scatter", "all_gather") over `ranks`
// in-process ranks, `bytes` per rank (all_reduce: the buffer; reduce_scatter: the input;
// all_gather: the output), taking `seconds` (the slowest rank, best of the repeats).
// One measured optimizer step: AdamW with `moment_dtype` moments over `elements` elements (all
// the process's threads), at `per_s` elements per second. The rate depends on the size: state
// that fits the last-level cache steps up to 3x faster than state streamed from memory (measured
// here, 48 MiB L3: f32 moments 1.8 G/s at 256 Ki elements, 0.5 G/s at 16 Mi), so the chooser
// reads the rate at the step's own size.
struct OptimizerPoint {
  std::string moment_dtype;  // "f32", "bf16", "int8"
  std::size_t elements = 0;  // > 0
  double per_s = 0;          // > 0
};

struct CollectivePoint {
  std::string op;
  int ranks = 2;          // >= 2
  std::size_t bytes = 0;  // > 0
  double seconds = 0;     // > 0
};

// A CUDA device's figures (JSON "cuda", optional: absent when the machine had none; a GPU
// cluster's written by hand): zero-env --calibrate measures them on cuda:0 and, with more than
// one device, NCCL with one GPU per in-process rank. The chooser times a plan on a separate
// device (--device cuda) with them: its collectives by `nccl` where it has the op, its offloaded
// gradients and parameters crossing at the host<->device rates.
struct CudaProfile {
  std::string device;  // cuda:0's name ("NVIDIA H100 80GB HBM3")
  int devices = 0;     // devices seen (0: not measured)
  // Bytes copied per second: device to device (HBM read and written), page-locked host to
  // device and device to page-locked host (cudaMemcpy of calibrate's cuda_copy_bytes).
  double hbm_copy_bytes_per_s = 0;
  double host_to_device_bytes_per_s = 0;
  double device_to_host_bytes_per_s = 0;
  // NCCL's collectives, as `collectives` (ranks: GPUs, one per rank; none with one GPU).
  std::vector<CollectivePoint> nccl;
  bool measured() const { return devices > 0; }
};

struct MachineProfile {
  std::string source;  // free text: where the figures come from (host, date, or "by hand")
  int threads = 1;     // hardware threads the figures were measured with (>= 1)

  // Host memory: bytes copied per second (memcpy of a buffer far larger than the caches).
  double copy_bytes_per_s = 0;  // > 0

  // The CPU optimizer (AdamW, the whole process's threads): elements stepped per second by
  // moment dtype, for state far larger than the caches (calibrate(): its largest size). All three
  // > 0. `optimizer_points` refine them by size (may be empty: a hand-written profile can give
  // the three rates alone).
  double optimizer_f32_per_s = 0, optimizer_bf16_per_s = 0, optimizer_int8_per_s = 0;
  std::vector<OptimizerPoint> optimizer_points;

  // NVMe through the swapper at `nvme_request_bytes` per request; all 0: not measured (a plan
  // with an NVMe tier then cannot be timed and says so).
  std::string nvme_path;
  std::size_t nvme_request_bytes = 0;
  double nvme_read_bytes_per_s = 0, nvme_write_bytes_per_s = 0;

  // The communicator's collectives (at least one point per op the plans use): within a node
  // (calibrate(): in-process ranks).
  std::vector<CollectivePoint> collectives;
  // Collectives whose ranks sit on different nodes (JSON "network_collectives", optional: a
  // cluster's figures written by hand, or measured by a multi-node run); `ranks` counts the
  // ranks taking part. Empty: a collective across nodes is timed by `collectives`.
  std::vector<CollectivePoint> network_collectives;

  // The trainer's model FLOP/s for the whole process: every in-process rank's FLOPs over the time
  // they take computing together on its cores (the chooser divides a step's FLOPs of all local
  // ranks by it); 0: not measured. `trainer` says what measured it ("gpt --layers 4 ... --ranks
  // 2"); a GPU's figure is written by hand.
  double trainer_flops_per_s = 0;
  std::string trainer;

  CudaProfile cuda;  // not measured: devices == 0

  // Elements/s of the optimizer for a moment dtype name ("f32", "bf16", "int8") stepping
  // `elements` at once (0: the large-state rate). With points for that dtype: their seconds per
  // element interpolated linearly in log(elements) between the two around it, the nearest one's
  // outside them; without: the large-state rate.
  double optimizer_per_s(const std::string& moment_dtype, std::size_t elements = 0) const;
  // Seconds of one `op` of `bytes` per rank over `ranks`: the points of the nearest measured
  // rank count, interpolated linearly in bytes between the two around it; above the largest,
  // at the largest's bandwidth; below the smallest, the smallest's time (latency-bound).
  // 0 for ranks <= 1 or bytes == 0. zero::Error(kConfig) when `op` has no point. The points:
  // network_collectives' when across_nodes and it has `op`; else cuda.nccl's when on_device and
  // it has `op`; else collectives'.
  double collective_seconds(const std::string& op, int ranks, std::size_t bytes,
                            bool across_nodes = false, bool on_device = false) const;

  // Throws zero::Error(kConfig) naming the first field out of range ("copy_bytes_per_s = -1").
  void validate() const;
};

// The profile as JSON (every field; 2-space indented).
std::string to_json(const MachineProfile& p);
// Parses and validates; `file` names the source in messages. zero::Error(kConfig) naming the key
// path, the value and the file for an unknown, missing or mistyped key or a value out of range.
MachineProfile profile_from_json(const std::string& text, const std::string& file = "<string>");
// Reads / writes a file (zero::Error(kIO) when it cannot be read or written).
MachineProfile read_profile(const std::string& path);
void write_profile(const MachineProfile& p, const std::string& path);

// What calibrate() measures and how much.
struct CalibrateOptions {
  std::size_t copy_bytes = std::size_t{64} << 20;  // memcpy buffer
  // Optimizer step sizes timed per moment dtype (elements; the largest gives the large-state
  // rate): from inside the L2 to 4x past the L3 of a server core.
  std::vector<std::size_t> optimizer_sizes = {std::size_t{256} << 10, std::size_t{1} << 20,
                                              std::size_t{4} << 20, std::size_t{16} << 20};
  // NVMe: a directory to write and read a file of `nvme_bytes` in; empty: not measured.
  std::string nvme_path;
  std::size_t nvme_bytes = std::size_t{256} << 20;
  std::size_t nvme_request_bytes = std::size_t{8} << 20;  // the swapper's chunk (see zero-env)
  // Collectives: every op at every rank count and size (bytes per rank).
  std::vector<int> ranks = {2, 4};
  std::vector<std::size_t> sizes = {std::size_t{64} << 10, std::size_t{1} << 20,
                                    std::size_t{16} << 20};
  int repeats = 3;  // best of
  // The CUDA device's figures (CudaProfile) where one exists: copies of cuda_copy_bytes, NCCL at
  // each of cuda_ranks the devices allow (>= 2) and every size above.
  bool cuda = true;
  std::size_t cuda_copy_bytes = std::size_t{256} << 20;
  std::vector<int> cuda_ranks = {2, 4, 8};
};

// Measures this machine (a few seconds with the defaults). trainer_flops_per_s stays 0: the
// trainer measures itself (zero-env --calibrate with a GPT shape does).
MachineProfile calibrate(const CalibrateOptions& options = {});

}  // namespace zero
