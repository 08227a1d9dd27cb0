// zero/optim/optimizer.hpp — fused optimizer steps on one shard, on the CPU.
//
// The engine keeps each rank's share of the fp32 master parameters and optimizer state as flat
// shards; this header steps one shard: pointers + element count + the hyper-parameters of its
// parameter group + the step number. Every rule (Adam / AdamW, SGD, Lion, Adagrad) is one pass
// per element: read the gradient (f32, bf16 or f16), multiply it by one grad_scale
// (1/loss_scale x clip coefficient, so unscaling and clipping cost no extra pass), update the
// fp32 master parameter and the state, and optionally write a 16-bit copy of the parameter
// (bf16 or f16, round to nearest even) in the same pass. grad_stats() is the one read of the
// gradients that clipping and the fp16 overflow check need.
//
// Work is split over oneTBB in blocks of CpuExecOptions::block_elems; the inner loops use
// AVX-512, AVX2 or scalar code chosen at run time (zero/core/cpu_features.hpp). All paths produce
// the same bits: they perform the same IEEE operations in the same order as the shared per-element
// functions in zero/optim/detail/optim_math.hpp (the CUDA kernels use those functions too).
//
// Adam's moments are stored as f32, bf16 or int8 (MomentDType). int8 is bitsandbytes' block-wise
// 8-bit Adam (zero/optim/detail/moment_quant.hpp): each moment array is a sequence of blocks of
// kInt8MomentBlock elements, each an f32 absmax and one code per element; the step dequantizes,
// applies the same update as f32 moments and re-quantizes in the same pass. A block's new absmax
// depends on all its elements, so a block is stepped whole, in one call: a sub-range of a shard
// (ShardRef::part) starts on a block boundary, and a shard whose parameter groups change inside
// a block is stepped with the groups' runs in one call (the step overload taking runs).
//
// Thread safety: CpuOptimizer is immutable after construction; step(), init_state() and
// grad_stats() may be called concurrently from several threads on disjoint shards.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "zero/core/cpu_features.hpp"
#include "zero/core/dtype.hpp"
#include "zero/optim/detail/moment_quant.hpp"
#include "zero/optim/detail/optim_math.hpp"

namespace zero {

struct OptimizerConfig;

enum class OptimizerType : std::uint8_t { kAdam, kAdamW, kSgd, kLion, kAdagrad };

// How the optimizer-state arrays store their elements: f32, bf16 (round to nearest even), or
// int8 codes in blocks of kInt8MomentBlock with one f32 absmax each (Adam / AdamW moments).
enum class MomentDType : std::uint8_t { kF32, kBF16, kInt8 };

// Elements per int8 quantization block (zero/optim/detail/moment_quant.hpp argues the size).
inline constexpr std::size_t kInt8MomentBlock = detail::optim::kMomentBlock;

// "f32", "bf16", "int8".
std::string_view to_string(MomentDType t) noexcept;
// Accepts "f32"/"fp32"/"float32", "bf16"/"bfloat16", "int8"; throws zero::Error
// (kInvalidArgument) naming the string otherwise.
MomentDType parse_moment_dtype(std::string_view name);
// Bytes of n elements of one state array of type t (int8: the codes and the absmax of each
// block, the last block possibly short; n counted from a block boundary).
std::size_t state_bytes(MomentDType t, std::size_t n) noexcept;
// What a sub-range of a state array must start at a multiple of: kInt8MomentBlock for int8,
// else 1.
std::size_t state_block(MomentDType t) noexcept;

// "Adam", "AdamW", "SGD", "Lion", "Adagrad".
std::string_view to_string(OptimizerType t) noexcept;
// Accepts the names above in any letter case; throws zero::Error(kInvalidArgument) otherwise.
OptimizerType parse_optimizer_type(std::string_view name);

// The hyper-parameters of one parameter group. Defaults are DeepSpeed's / PyTorch's.
struct OptimizerParams {
  OptimizerType type = OptimizerType::kAdamW;
  double lr = 1e-3;             // all; >= 0
  double beta1 = 0.9;           // Adam/AdamW: first moment; Lion: interpolation; in [0, 1)
  double beta2 = 0.999;         // Adam/AdamW: second moment; Lion: moment decay; in [0, 1)
  double eps = 1e-8;            // Adam/AdamW, Adagrad; >= 0 (> 0 advised)
  double weight_decay = 0.0;    // all; >= 0. AdamW, Lion: decoupled; SGD, Adagrad: L2
  bool bias_correction = true;  // Adam/AdamW
  bool adam_w_mode = true;      // Adam only: true = decoupled decay (DeepSpeed), false = L2
  double momentum = 0.0;        // SGD; >= 0 (0: plain SGD, no state)
  double dampening = 0.0;       // SGD with momentum
  bool nesterov = false;        // SGD: requires momentum > 0 and dampening == 0 (PyTorch)
  MomentDType moment_dtype = MomentDType::kF32;  // Adam/AdamW only: f32, bf16 or int8 moments

  // From the config's optimizer block (type, lr, betas, eps, weight_decay, bias_correction,
  // adam_w_mode, momentum, dampening, nesterov, moment_dtype); validated.
  // Throws zero::Error(kConfig) naming the key ("optimizer.params.betas") when invalid.
  static OptimizerParams from_config(const OptimizerConfig& config);

  // Throws zero::Error(kInvalidArgument) naming the field when a value is out of range.
  void validate() const;

  // Number of state arrays the rule keeps per element: Adam 2 (m, v), SGD with momentum 1,
  // SGD 0, Lion 1 (m), Adagrad 1 (sum of squares).
  int num_states() const noexcept;
  // Storage of the state arrays (moment_dtype for Adam/AdamW, f32 otherwise).
  MomentDType state_dtype() const noexcept {
    return (type == OptimizerType::kAdam || type == OptimizerType::kAdamW) ? moment_dtype
                                                                           : MomentDType::kF32;
  }
};

// A parameter group (torch.optim's param_groups, DeepSpeed's optimizer groups): the options it
// sets replace those of the optimizer's own (group 0, the config's optimizer block); what it
// leaves unset follows them. Every group steps with the same rule (type) and the same state
// layout (moment_dtype; for SGD the optimizer's own momentum decides whether there is a buffer,
// and a group may set momentum 0 over it, stepping as plain SGD, but not momentum > 0 without).
struct ParamGroup {
  std::string name;  // for messages, metrics and checkpoints; unique, not empty
  std::optional<double> lr, beta1, beta2, eps, weight_decay, momentum, dampening;
  std::optional<bool> bias_correction, nesterov;

  // `base` with this group's options applied, validated: zero::Error(kInvalidArgument) naming
  // the group and the option out of range, or an option that changes the rule's state layout.
  OptimizerParams apply(const OptimizerParams& base) const;
};

// One shard to step. Non-owning; every array holds `count` elements and must not overlap
// another (in-place is not supported: grad, master, state and copy are distinct memory).
// Each pointer must be aligned to its element size (int8 state arrays: to 4 bytes, the absmax;
// they hold state_bytes(kInt8, count) bytes and element 0 starts a block).
struct ShardRef {
  std::size_t count = 0;
  float* master = nullptr;                // fp32 master parameters; read and written
  const void* grad = nullptr;             // gradients (not yet unscaled); read only
  DType grad_dtype = DType::kF32;         // f32, bf16 or f16
  void* state[2] = {nullptr, nullptr};    // state arrays, OptimizerParams::state_dtype();
                                          // the first num_states() are used
  void* param_copy = nullptr;             // optional: written with the new parameters
  DType param_copy_dtype = DType::kBF16;  // bf16 or f16 (ignored when param_copy is null)

  // Elements [at, at + n) of this shard (state arrays of `state_dtype`); kInvalidArgument when
  // the range is not inside it, or (int8) does not start on a block boundary or ends inside a
  // block short of the shard's end.
  ShardRef part(std::size_t at, std::size_t n, MomentDType state_dtype) const;
};

// Elements [at, at + count) of a shard stepped with parameter group `group`'s options.
struct StepRun {
  std::size_t at = 0;
  std::size_t count = 0;
  int group = 0;
};

// What one read of the gradients tells: the sum of squares (of grad values as stored, before
// any scaling) and whether any value is Inf or NaN. sum_squares is accumulated in double and
// is Inf or NaN exactly when non_finite is true (a finite f32 squared cannot overflow a double
// sum). The result does not depend on the ISA or the thread count: lanes and blocks are summed
// in a fixed order.
struct GradStats {
  double sum_squares = 0.0;
  bool non_finite = false;
};

struct CpuExecOptions {
  // SIMD path; default best_isa() (which honours ZERO_ISA). Asking for a path this CPU lacks is
  // a zero::Error(kInvalidArgument).
  std::optional<Isa> isa;
  // 0: run in the caller's oneTBB arena (all cores by default); n > 0: in an arena of n threads.
  int threads = 0;
  // Elements per parallel task; a multiple of 64. Also the unit of init_state()'s first touch,
  // so that pages are touched by the same split the step uses. 0: default (65536).
  std::size_t block_elems = 0;
};

namespace detail::optim {
// Per-step f32 constants for `params` at step `step` (1-based) with `grad_scale`, computed in
// double and rounded once. REQUIRES: params valid, step >= 1; throws zero::Error otherwise.
StepScalars make_step_scalars(const OptimizerParams& params, std::int64_t step, float grad_scale);
Rule rule_of(const OptimizerParams& params) noexcept;
}  // namespace detail::optim

// The CPU optimizer: stateless apart from its execution choices (the shard owns the state).
// Move-only: owns its oneTBB arena when threads > 0.
class CpuOptimizer {
 public:
  // Throws zero::Error(kInvalidArgument) for an unsupported ISA, threads < 0 or a bad block size.
  explicit CpuOptimizer(CpuExecOptions options = {});
  ~CpuOptimizer();
  CpuOptimizer(CpuOptimizer&&) noexcept;
  CpuOptimizer& operator=(CpuOptimizer&&) noexcept;
  CpuOptimizer(const CpuOptimizer&) = delete;
  CpuOptimizer& operator=(const CpuOptimizer&) = delete;

  Isa isa() const noexcept;
  int threads() const noexcept;  // 0: the caller's arena
  std::size_t block_elems() const noexcept;

  // Applies one update to every element of `shard`. `step` is the 1-based count of updates
  // applied to this state, including this one (bias correction, SGD's first step). The caller
  // decides to skip a step (fp16 overflow) by not calling this: nothing here looks at
  // non-finite values. REQUIRES: params valid; shard as documented; step >= 1; grad_scale
  // finite and > 0; state zeroed (init_state) before step 1. Throws zero::Error
  // (kInvalidArgument) naming the problem; then nothing has been written.
  void step(const OptimizerParams& params, const ShardRef& shard, std::int64_t step,
            float grad_scale = 1.0f) const;

  // One update of a shard whose elements belong to several parameter groups: runs[0, num_runs)
  // tile [0, shard.count) in order, run r stepped with groups[r.group] (groups[0, num_groups),
  // which share type and state layout: ParamGroup::apply). The same bits as step(groups[r.group],
  // shard.part(r)) per run; with int8 moments a block that spans runs is updated element by element
  // with each run's options and quantized once, which per-run calls cannot do. Same requirements
  // and errors as step(); kInvalidArgument also for runs that do not tile the shard or name no
  // group.
  void step(const OptimizerParams* groups, std::size_t num_groups, const ShardRef& shard,
            const StepRun* runs, std::size_t num_runs, std::int64_t step,
            float grad_scale = 1.0f) const;

  // Zeroes the num_states() state arrays of `shard` in parallel, block by block as step() splits
  // the work: the first touch of fresh memory (~1-2 GB/s) happens here, not in the first step.
  void init_state(const OptimizerParams& params, const ShardRef& shard) const;

  // Sum of squares and non-finite check of `count` gradients of `dtype` in one read.
  GradStats grad_stats(const void* grad, DType dtype, std::size_t count) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zero
