// zero/plan/choose.hpp — proof of fit: the fastest configuration that fits a machine, chosen before
// a single allocation, and why every other one lost.
//
// The chooser enumerates configurations over a space (stage, optimizer offload tier and ratio,
// parameter offload (its tier: the engine has no parameter offload ratio), moment dtype, reduce /
// all-gather buckets, stage-3 prefetch with its max-live bound and persistence, activation
// checkpointing; across nodes, hybrid sharding and ZeRO++'s quantized collectives), each built
// through the config reader (ConfigBuilder: a combination the reader refuses is not a candidate,
// and what is written back loads). For each it takes the bytes per tier from the planner — the
// engine's placement summed (zero/engine/plan.hpp), plus what the trainer declares per rank
// (activations, workspace) — and checks them against the world's budgets less a margin
// (zero/engine/fit.hpp). It predicts the step time from a machine profile (zero/plan/profile.hpp)
// by phase:
//   compute     the trainer's FLOPs of the step over its measured FLOP/s (in-process ranks share
//               the process's cores: their FLOPs add up);
//   comm        the collectives the placement's buckets and shards imply (reduce per bucket,
//               post-step all-gather per bucket, stage-3 gathers per unit of the gather order),
//               each timed by the profile's measured points (a group spanning nodes by its
//               network points where it has them; hybrid sharding: the shard's collectives in
//               the node, the replicas' all-reduce of the reduced shard across nodes; quantized
//               collectives at their int8 bytes plus a f32 scale per block, the quantizing
//               itself not counted); all exposed on the CPU device (its
//               collectives copy with the cores that compute), hidden behind the backward's
//               compute up to 2/3 of the compute on a separate device with overlap_comm;
//   optimizer   the stepped elements of every in-process rank over the CPU optimizer's
//               elements/s for the moment dtype;
//   offload I/O the swap files' bytes read and written once a step at the NVMe rates, and the
//               offloaded gradients and parameters copied between tiers at the copy rate (on
//               a separate device with the profile's CUDA figures: at its device-to-host and
//               host-to-device rates; its collectives then by NCCL's points).
//
// Thread safety: pure functions (the trainer's callbacks are called on the calling thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "zero/config/config.hpp"
#include "zero/engine/fit.hpp"
#include "zero/engine/plan.hpp"
#include "zero/engine/unit.hpp"
#include "zero/plan/profile.hpp"

namespace zero {

// Where the run goes: its ranks and budgets (0: not limited).
struct World {
  int ranks = 1;
  int ranks_per_node = 0;        // 0: all on one node (in-process ranks)
  bool device_is_host = true;    // the CPU device: the device tier is host memory
  std::size_t device_bytes = 0;  // per rank (a separate device only)
  std::size_t host_bytes = 0;    // per node
  std::size_t nvme_bytes = 0;    // per node, under nvme_path
  std::string nvme_path;         // empty: no NVMe candidates
  int local() const { return ranks_per_node > 0 ? ranks_per_node : ranks; }
};

// What is enumerated (each list's entries are tried in every combination that applies).
struct ChooseSpace {
  std::vector<int> stages = {0, 1, 2, 3};
  // Optimizer offload: "none", "cpu" (at each ratio), "nvme".
  std::vector<std::string> optimizer_offload = {"none", "cpu", "nvme"};
  std::vector<double> cpu_ratios = {0.5, 1.0};
  std::vector<std::string> param_offload = {"none", "cpu", "nvme"};  // stage 3
  std::vector<std::string> moment_dtypes = {"f32", "bf16", "int8"};
  // reduce_bucket_size and allgather_bucket_size, together (elements; 0: a bucket per unit).
  std::vector<std::int64_t> buckets = {0, 500'000'000};
  std::vector<std::int64_t> prefetch = {0, 50'000'000};  // stage3_prefetch_bucket_size
  // stage3_max_live_parameters with a prefetch (it bounds nothing else): the reader's default
  // (DeepSpeed's 1e9, not shown in the label) and 0, which stands for twice the model's largest
  // unit (the unit in use and one prefetched).
  std::vector<std::int64_t> max_live = {1'000'000'000, 0};
  std::vector<std::int64_t> persistence = {0, 100'000};  // stage-3 persistence threshold
  // activation_checkpointing.number_checkpoints tried besides 0 (off); 0 here: only off.
  int checkpoint_segments = 0;
  // Across nodes only (World::ranks_per_node dividing ranks, fewer than them): "none" and
  // "node" (hybrid_shard_size = the ranks of a node: shard inside it, replicate across), stages
  // 1-3; and at stage 3 ZeRO++'s "none", "weights" (qwZ), "gradients" (qgZ), "both".
  std::vector<std::string> hybrid = {"none", "node"};
  std::vector<std::string> quantized = {"none", "weights", "gradients", "both"};
};

// What the trainer tells about its model, for a candidate's config.
struct TrainerModel {
  // The planner's input (units, gather order, held gradients) under `config` (its
  // activation_checkpointing decides the gather order).
  std::function<PlanInput(const Config& config)> plan_input;
  // Bytes per rank on the device besides the engine's (activations, workspace).
  std::function<std::size_t(const Config& config)> trainer_bytes;
  // FLOPs one rank computes in one micro-step (recomputation included).
  std::function<double(const Config& config)> flops;
};

// A step's predicted seconds by phase.
struct StepTime {
  double compute = 0, comm = 0, optimizer = 0, offload_io = 0;
  double total() const { return compute + comm + optimizer + offload_io; }
};

struct Candidate {
  Config config;
  std::string label;              // "stage 3, optimizer nvme, params cpu, int8 moments, ..."
  std::vector<std::string> sets;  // the --set assignments over the base config that make it
  std::string json;               // the base JSON with `sets` applied: what --write-config writes
  PlanResult plan;                // per rank
  std::size_t trainer_bytes = 0;  // per rank
  FitNeed need;                   // this node's
  std::string shortfall;          // against the budget less the margin; empty: it fits
  std::size_t worst_short = 0;    // the largest tier's shortfall in bytes (0: fits)
  std::size_t worst_budget = 0;   // ... of that tier's budget (less the margin)
  // The largest fraction of a limited tier's budget (less the margin) it needs: of candidates
  // predicted equally fast, the one that leaves the most room is chosen.
  double fullest = 0;
  StepTime time;
  std::string untimed;  // why no time (a figure the profile lacks); empty: timed
  bool fits() const { return shortfall.empty(); }
};

struct Choice {
  std::vector<Candidate>
      candidates;            // fitting ones fastest first, then the rest, least short first
  int chosen = -1;           // index of the fastest that fits; -1: none fits
  std::size_t rejected = 0;  // combinations the config reader refused
  MemoryBudget budget;       // after the margin
  double margin = 0;
  // Why candidate i lost to the chosen one: "does not fit: host memory short by X of Y" or
  // "fits, slower by Z s (+P%)".
  std::string why_lost(std::size_t i) const;
};

// Enumerates `space` over `base_json` (a DeepSpeed JSON object: the user's keys, kept but the ones
// varied) for `world`; `margin` in [0, 1): the fraction of each budget kept free. Throws the
// reader's kConfig when base_json itself is not a valid config. REQUIRES: the trainer's callbacks
// set.
Choice choose_config(const TrainerModel& trainer, const std::string& base_json, const World& world,
                     const MachineProfile& profile, const ChooseSpace& space = {},
                     double margin = 0.05);

// A DeepSpeed JSON object with "key.path=value" assignments applied as the config reader applies
// them (a value that parses as JSON is that value, else a string): the config a person reads and
// zero-train --config loads. Throws kConfig when `json` is not a JSON object.
std::string config_document(const std::string& json, const std::vector<std::string>& sets);

// ---- a model's units from a safetensors header

// The default unit pattern: a layer prefix, "model.layers.12" of "model.layers.12.mlp.up.weight"
// (the name up to its first all-digit component).
inline constexpr const char* kLayerUnitPattern = R"(^(.*?\.[0-9]+)(\.|$))";

// The unit a tensor belongs to: `unit_pattern`'s (ECMAScript) first capture group, or its whole
// match without one, where it matches the name; otherwise the name less its last component
// ("model.norm.weight" -> "model.norm", "lm_head.weight" -> "lm_head"). zero::Error(kConfig)
// naming the pattern when it is not a regular expression.
std::string unit_of_tensor(const std::string& tensor, const std::string& unit_pattern);

// The units of a safetensors file or a Hugging Face sharded set (`path`: a .safetensors file,
// model.safetensors.index.json, or a directory holding one of them), read from the headers only
// (never the data; every header checked by the checkpoint layer's reader, an error naming the
// file and the tensor). Each floating-point tensor (F64, F32, F16, BF16, F8_*) becomes a
// trainable parameter of the unit unit_of_tensor() names (a scalar one of shape [1]); integer and
// bool tensors (buffers: position ids, masks) and empty ones are not parameters and are left out.
// Units and the parameters in each are in natural order (digit runs compared as numbers:
// "layers.2" before "layers.10"). The tensors' dtype does not matter: the config's working dtype
// decides the bytes.
std::vector<UnitSpec> units_from_safetensors(const std::string& path,
                                             const std::string& unit_pattern = kLayerUnitPattern);

// The predicted time of one candidate's config (what choose_config fills in), or why not.
StepTime predict_step(const Candidate& c, const PlanInput& pin, const World& world,
                      const MachineProfile& profile, double flops, std::string* untimed);

}  // namespace zero
