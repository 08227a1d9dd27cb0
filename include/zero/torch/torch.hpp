// zero/torch/torch.hpp — ZeRO for LibTorch trainers: an optimizer that takes the place of
// torch::optim::AdamW, stages 0-3 (optional component: target zero::torch, ZERO_WITH_TORCH).
//
// The swap (stages 0-2): where the trainer constructed
//     torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(lr));
// it constructs
//     zero::torch::Optimizer optimizer(comm, *model, config);
// and keeps `optimizer.zero_grad(); loss.backward(); optimizer.step();` as they were. The
// module's parameters come to live in the engine's storage (each parameter tensor becomes a view
// of the engine's working copy, of the config's working dtype: f32, bf16 or f16); during backward
// each parameter's .grad is a view of the engine's gradient buffer of its unit, set by a hook on
// the parameter's gradient accumulator before autograd accumulates into it; when the last
// parameter of a unit has its gradient, a post hook hands the unit to the engine (grads_ready:
// stages 2-3 start its reduce-scatter while backward goes on, as DDP's reducer does) and .grad
// becomes a tensor of no memory that no operator may read (see clip_grad_norm_); step()
// makes it undefined. step() hands over the units no gradient reached (a zero gradient) and
// steps the engine (clipping, accumulation, the LR schedule, offload, fp16 loss scaling: the
// config's keys, as for every other trainer).
//
// Stage 3 (zero_optimization.stage = 3, the same two lines): the units should be the
// submodules FSDP would wrap (units_of(model, {blocks...}), else units_by_child); any unit
// constructor works. Each parameter's storage holds no memory and is refilled from the gathered
// unit on use: a thread-local ATen RecordFunction callback sees every operator's inputs; when
// one of them is a parameter (or a view of one) of a unit that is not gathered, the unit is
// gathered there, before the kernel runs (the engine prefetches the next unit in the recorded
// order). Units are released only when a top-level operator starts (none of this thread's
// operators running), and only those it does not read: an operator and every operator nested in
// it keep what they read (aten::addmm reading a weight and a bias of two units, then
// aten::expand on the bias), so no kernel ever reads a released unit. The same happens in
// backward, where autograd's kernels read the saved parameters. What it requires of the model:
// parameters are read through ATen operators (not through raw data_ptr() in the forward), every
// rank runs the same operators on the same units in the same order (as FSDP requires), CPU
// tensors. torch::save(model) of a stage-3 model throws (its parameters hold no memory; it would
// otherwise write empty storages): save_model() writes the full weights mid-training.
//
// Gradient accumulation has the engine's meaning: call step() after every micro-batch's
// backward with gradient_accumulation_steps = A in the config (not A backward() calls before one
// step()); a second backward() in one micro-step is an error naming the parameter. fp16: scale
// the loss (`optimizer.scale_loss(loss).backward()`); bf16 and f32 need nothing. The model's
// buffers (not parameters) are left alone. Parameters with requires_grad = false go into the
// engine frozen (ParamSpec::trainable = false): never stepped, as with torch::optim, but placed
// like the rest (sharded at stage 3 and gathered on use) with no gradient, master or state; a
// unit's frozen parameters become a unit of their own, "<unit> (frozen)", declared before it
// (the engine's units are all frozen or all trainable). Set requires_grad before making the
// optimizer: it is read once. Unlike torch::optim::AdamW, a parameter that got
// no gradient in a step is still stepped (zero gradient: weight decay and momentum apply), as
// every rank must step the same shards.
//
// Thread safety: an Optimizer belongs to one rank and is created, used and destroyed on that
// rank's thread (in-process ranks: one Optimizer, one model per thread). All ranks must make the
// same sequence of calls (step, backward through the same units).
#pragma once

#include <torch/torch.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "zero/ckpt/ckpt.hpp"
#include "zero/comm/comm.hpp"
#include "zero/config/config.hpp"
#include "zero/device/memory.hpp"
#include "zero/engine/engine.hpp"

namespace zero::torch {

// A unit: the parameters the engine gathers and reduces together, with their names.
struct TensorUnit {
  std::string name;
  std::vector<std::string> param_names;
  std::vector<at::Tensor> params;
};

// ---- how the trainer groups its parameters into units
// The default: one unit per direct child of `model` that has parameters, in registration order,
// named as the child; the model's own direct parameters, if any, a unit "<root>" first.
std::vector<TensorUnit> units_by_child(const ::torch::nn::Module& model);
// fully_shard style: each marked submodule is a unit (its parameters not under a marked
// descendant); every parameter under no marked submodule goes into one unit "<root>", first
// (FSDP's root unit). REQUIRES: each marked module is a submodule of `model` (kInvalidArgument).
std::vector<TensorUnit> units_of(const ::torch::nn::Module& model,
                                 const std::vector<std::shared_ptr<::torch::nn::Module>>& marked);
// model->named_parameters(): grouped by the first component of the name ("fc1.weight": "fc1").
std::vector<TensorUnit> units_by_prefix(const ::torch::OrderedDict<std::string, at::Tensor>& named);
// model->parameters(): one unit per tensor ("param.<i>"); the reduce buckets merge them.
std::vector<TensorUnit> units_of(const std::vector<at::Tensor>& params);
// Parameter groups: one unit per group ("group.<g>").
std::vector<TensorUnit> units_of(const std::vector<::torch::optim::OptimizerParamGroup>& groups);

// LibTorch's own view of memory: bytes of the storages behind `params` and behind their defined
// .grad tensors (each storage counted once).
struct TensorBytes {
  std::size_t params = 0;
  std::size_t grads = 0;
};
TensorBytes tensor_bytes(const std::vector<at::Tensor>& params);

class Optimizer {
 public:
  // REQUIRES: comm outlives the optimizer; every parameter a dense CPU tensor of a floating
  // dtype, each in one unit only (a tensor listed twice: kept in its first unit). Rank 0's
  // values are broadcast to every rank (as DDP does) and become the engine's parameters (master
  // f32, working copy W); from then on the tensors are views of the engine's storage (their dtype
  // becomes W). Throws what Engine's constructor throws for the config (kConfig naming the key),
  // kInvalidArgument for a parameter it cannot take (naming it).
  Optimizer(Communicator& comm, std::vector<TensorUnit> units, const Config& config,
            EngineOptions options = {});
  Optimizer(Communicator& comm, const ::torch::nn::Module& model, const Config& config,
            EngineOptions options = {});
  Optimizer(Communicator& comm, const std::vector<at::Tensor>& params, const Config& config,
            EngineOptions options = {});
  Optimizer(Communicator& comm, const ::torch::OrderedDict<std::string, at::Tensor>& named,
            const Config& config, EngineOptions options = {});
  // Parameter groups with torch::optim's meaning: each group steps with its own options (a group
  // without options with the defaults), and the config's scheduler sets each group's lr
  // (LrSchedule::lr(i, group_lr): WarmupCosineLR scales each group's own). Units: one per
  // group here; the overloads below take the units apart from the groups.
  Optimizer(Communicator& comm, const std::vector<::torch::optim::OptimizerParamGroup>& groups,
            const Config& config, EngineOptions options = {});
  // The swap of `torch::optim::AdamW opt(groups, defaults)` (or Adam, SGD, Adagrad): the
  // trainer's own options are the optimizer's (the config keeps the ZeRO keys; an optimizer key
  // the config also gives must agree, else kConfig naming both). torch's meanings are kept:
  // AdamOptions' and SGDOptions' weight_decay is L2, AdamWOptions' decoupled; AdamWOptions'
  // default weight_decay is torch's 0.01. Every parameter of `units` must be in a group
  // (kInvalidArgument naming it). An option the engine cannot step is kConfig naming the option
  // and the group: amsgrad, AdagradOptions' lr_decay or initial_accumulator_value other than 0,
  // SGD momentum in a group when the defaults have none, a value out of the engine's range.
  Optimizer(Communicator& comm, std::vector<TensorUnit> units,
            const std::vector<::torch::optim::OptimizerParamGroup>& groups,
            const ::torch::optim::OptimizerOptions& defaults, const Config& config,
            EngineOptions options = {});
  // Units by child (units_by_child(model)).
  Optimizer(Communicator& comm, const ::torch::nn::Module& model,
            const std::vector<::torch::optim::OptimizerParamGroup>& groups,
            const ::torch::optim::OptimizerOptions& defaults, const Config& config,
            EngineOptions options = {});
  // One group of every parameter with `defaults`: `torch::optim::AdamW opt(model->parameters(),
  // AdamWOptions(1e-3))` swapped.
  Optimizer(Communicator& comm, const ::torch::nn::Module& model,
            const ::torch::optim::OptimizerOptions& defaults, const Config& config,
            EngineOptions options = {});
  // Stages 0-2: each parameter gets a storage of its own with its current values (the model
  // stays usable). Stage 3: parameters become empty tensors (shape [0]) unless detach() ran.
  ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Sets every parameter's .grad to undefined (the engine zeroes its gradient buffers itself at
  // the start of each micro-step; step() does the same). REQUIRES: not between backward() and
  // step(). Between them .grad is defined and holds no memory: an operator reading it is an
  // error naming the parameter, raised at step() (the gradient is the engine's by then).
  void zero_grad();
  // Ends the micro-step: hands over the units whose gradients backward did not reach (zero
  // gradient), releases the gathered stage-3 units and steps the engine (Engine::step). Raises
  // an error a stage-3 gather hit during forward or backward (kept until here when it happened
  // inside an operator, where LibTorch swallows exceptions).
  StepResult step();
  // torch::nn::utils::clip_grad_norm_ for the swap (FSDP's clip_grad_norm_ method): the next
  // step() clips the step's gradient — after reduction and accumulation, the global L2 norm over
  // every rank's shards — to max_norm, with the coefficient max_norm / (norm + 1e-6) when below
  // 1, as the config's gradient_clipping does every step (which it overrides for that step).
  // The norm before clipping is the step's StepResult::grad_norm. Call it between backward()
  // and step(), as torch's. torch::nn::utils::clip_grad_norm_ itself cannot work here: after
  // backward .grad is not the step's gradient (the engine holds it), and reading .grad is an
  // error raised at step() naming the parameter. Throws kInvalidArgument for max_norm <= 0 or a
  // norm_type other than 2.
  void clip_grad_norm_(double max_norm, double norm_type = 2.0);
  // loss * the engine's loss scale (fp16; 1 otherwise). A new tensor: call backward() on it.
  at::Tensor scale_loss(const at::Tensor& loss) const;
  // Collective: every parameter gets a storage of its own with its full current values (stage 3:
  // gathered), for evaluation or saving after training. The optimizer cannot step afterwards.
  void detach();

  // ---- full weights and checkpoints mid-training (training goes on bitwise as if not called)
  // Collective (every rank, at the same point, between step() and the next backward): calls
  // fn(name, values) for every trained parameter, unit by unit in unit order: `values` is its
  // full current value (the parameter's shape, the working dtype), valid during the call only.
  // Stage 3 gathers each unit once, outside the recorded order (no prefetch is disturbed), and
  // releases it before the next: the peak is one unit more than training's. rank0_only: the
  // other ranks take part in the gathers and get no calls.
  void for_each_full_parameter(
      const std::function<void(const std::string& name, const at::Tensor& values)>& fn,
      bool rank0_only = false);
  // Collective: state_dict-like, name -> an owned copy of every trained parameter's full value
  // (rank0_only: an empty map on the other ranks).
  ::torch::OrderedDict<std::string, at::Tensor> full_state_dict(bool rank0_only = false);
  // Collective: writes `model` to `path` as torch::save(model, path) does (Module::save's
  // archive: each module's parameters, buffers and children), with every trained parameter's
  // full current value as `dtype`; torch::load(model, path) reads it into a fresh model. The
  // default f32 is what a freshly constructed module holds: LibTorch 1.13's torch::load
  // reinterprets the bytes when the archive's dtype and the module's differ, so write the
  // dtype of the model that will load it (bf16 working values widen to f32 exactly). Rank 0
  // writes, to `path`.tmp renamed over `path` (a failed write leaves an earlier file as it
  // was). Throws kIO naming the file. At stage 3 torch::save(model) itself throws (the released
  // parameters hold no memory: "PytorchStreamWriter failed writing file data/<k>: invalid
  // parameter"); at stages 0-2 it works and writes the working dtype.
  void save_model(const ::torch::nn::Module& model, const std::string& path,
                  at::ScalarType dtype = at::kFloat);
  // Collective: ckpt::Saver::save of this optimizer's engine (construct the saver with
  // engine()), with the trainer's opaque bytes (its data position: the next batch, the RNG).
  // REQUIRES: after step(), not between backward() and step().
  ckpt::SaveInfo save_checkpoint(ckpt::Saver& saver, std::string_view trainer_state = {});
  // Collective: ckpt::load into this optimizer (any saved world size and stage; same units).
  // REQUIRES: before the first step() (a forward before it is fine: its gathered units are
  // released first). The trainer's bytes are in the result; the parameters the module sees
  // are the loaded ones.
  ckpt::LoadResult load_checkpoint(const std::string& path);

  Engine& engine() noexcept;
  const std::vector<TensorUnit>& units() const noexcept;
  // All parameters in unit order (what tensor_bytes() is asked about).
  std::vector<at::Tensor> parameters() const;

  struct Impl;

 private:
  Optimizer(Communicator& comm, std::vector<TensorUnit> units,
            const std::vector<::torch::optim::OptimizerParamGroup>& groups,
            const ::torch::optim::OptimizerOptions* defaults, const Config& config,
            EngineOptions options);
  std::unique_ptr<Impl> impl_;
};

// ---- activation checkpointing (LibTorch's C++ API has no torch::utils::checkpoint)
// checkpoint(fn, inputs): runs fn on the inputs without keeping its activations (grad mode off:
// no graph inside fn), keeps only the inputs, and in backward runs fn again on them with grad
// mode on and backpropagates through the recomputed graph — PyTorch's reentrant checkpoint. The
// CPU generator's state at the forward is restored for the recompute (dropout draws the same
// mask), so on the CPU the gradients are bitwise those of fn run plainly. Parameters fn reads
// get their gradients during the recompute (the optimizer's hooks hand their units over then);
// at stage 3 the recompute's operators gather the units again. Inputs that are not floating
// point (token ids) are kept and get no gradient.
//
// The config's activation_checkpointing keys: number_checkpoints is the segment count of
// sequential() (evenly spread, as the engine's Checkpointer); cpu_checkpointing keeps the inputs
// in host memory (a CUDA input is copied there and back for the recompute; the adapter's CPU
// tensors are host memory already: no copy, the same bytes). The other keys of the block are
// DeepSpeed's partitioning of the kept inputs across model-parallel ranks, which has no meaning
// with data parallelism alone (the config reader says so). The inputs kept are charged to the
// tracker as kActivations (tier device, or pinned with cpu_checkpointing) from the forward until
// the checkpoint's graph is freed (after its backward).
//
// Thread safety: one per rank, used from that rank's thread.
class ActivationCheckpointing {
 public:
  using Layer = std::function<at::Tensor(const at::Tensor&)>;
  using Fn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

  // The optimizer's config and its engine's tracker.
  explicit ActivationCheckpointing(Optimizer& optimizer);
  // Any config (its activation_checkpointing block); `tracker` may be null (nothing charged)
  // and must outlive every graph this builds.
  ActivationCheckpointing(const Config& config, MemoryTracker* tracker);

  // REQUIRES: fn deterministic given its inputs and the CPU generator's state; fn returns
  // tensors. Grad mode off (inference): fn runs plainly.
  std::vector<at::Tensor> checkpoint(const Fn& fn, const std::vector<at::Tensor>& inputs);
  at::Tensor checkpoint(const Layer& fn, const at::Tensor& input);
  // checkpoint_sequential: `layers` in `segments` segments (0: the config's number_checkpoints;
  // neither: one segment per layer), each run through checkpoint(); the last segment's output
  // is returned. Throws kInvalidArgument for no layers or segments > layers.
  at::Tensor sequential(const std::vector<Layer>& layers, const at::Tensor& input,
                        int segments = 0);

  bool cpu_checkpointing() const noexcept { return cpu_; }
  int number_checkpoints() const noexcept { return segments_; }

 private:
  MemoryTracker* tracker_ = nullptr;
  bool cpu_ = false;
  int segments_ = 0;
};

}  // namespace zero::torch
