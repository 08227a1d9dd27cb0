// gpt/gpt_cuda.hpp — the GPT decoder of gpt_model.hpp on a CUDA device: the same units, the
// same parameters (in the same order, so the same engine layout), the same function, with
// forward and backward on the GPU (f32 arithmetic; cuBLAS SGEMMs without TF32 for the matmuls,
// the kernels of gpt_cuda_kernels.hpp for the rest).
//
// The engine must run on the same device: Engine(comm, config, {.device = Device::cuda(k),
// .cuda_stream = s}) over the NCCL communicator created with CommOptions::cuda_stream = s, and
// the model constructed with (k, s). Every view the engine hands out is then a device pointer
// of the working dtype; the model casts each gathered unit to f32 in its workspace, computes in
// f32, and casts the f32 gradients to the working dtype into grad(). The protocol is the CPU
// model's exactly (GptModel::forward_backward: the gather order, the tied embedding's two
// gradient contributions accumulated before its one grads_ready, the loss scale).
//
// Determinism: cuBLAS on one stream and kernels that sum in fixed orders without atomics give
// the same bits for the same parameters and batch on every run, so on one GPU stages 1-3 agree
// bitwise with stage 0 (across GPUs NCCL's all-reduce and reduce-scatter may sum in different
// orders: agreement to rounding). Against the CPU model the results agree to f32 rounding (other
// summation orders, FMA), not bitwise.
//
// Memory: all on the device, charged to the tracker: the activations kept for backward
// (kActivations) and the workspace (f32 parameter and gradient copies, activation gradients,
// attention scratch: kOther) are sized for the largest batch seen and kept between micro-steps
// (cudaFree would synchronise the device each time); pinned host staging for the tokens and the
// per-row losses (kOther). Activation checkpointing as on the CPU (the blocks run through the
// library's Checkpointer on the model's stream; with cpu_checkpointing the kept inputs go to
// pinned memory on a copy stream): a block's activations live in a slot of a pool that holds as
// many as were ever live at once.
//
// Streams: everything is enqueued on the model's stream (the engine's compute stream);
// forward_backward and forward_loss wait for it before they return (they return the loss).
//
// Thread safety: one instance per rank, used by that rank's thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "gpt/gpt_model.hpp"
#include "zero/device/memory.hpp"
#include "zero/engine/activation_checkpointing.hpp"
#include "zero/engine/engine.hpp"

namespace zero::gpt {

class GptCudaModel {
 public:
  // Creates the cuBLAS handle on `device` bound to `stream` (a cudaStream_t; null: the legacy
  // default stream), which must be the engine's EngineOptions::cuda_stream. Throws
  // zero::Error(kCuda) when the device or cuBLAS cannot be used, kInvalidArgument for a bad
  // config. REQUIRES: the tracker and the stream outlive the model.
  GptCudaModel(const GptConfig& config, MemoryTracker& tracker, int device, void* stream);
  ~GptCudaModel();
  GptCudaModel(const GptCudaModel&) = delete;
  GptCudaModel& operator=(const GptCudaModel&) = delete;

  const GptConfig& config() const noexcept { return layout_.config(); }
  int device() const noexcept { return device_; }
  void* stream() const noexcept { return stream_; }

  // The units and their initialisation: GptModel's (same names, shapes, order and values).
  void declare(Engine& e) { layout_.declare(e); }
  void init(Engine& e, std::uint64_t seed) const { layout_.init(e, seed); }
  void init_random(Engine& e, std::uint64_t seed, float stddev) const {
    layout_.init_random(e, seed, stddev);
  }

  // One micro-step: GptModel::forward_backward's contract (gathers, gradient order, loss scale)
  // on the GPU. `tap` gets each unit's finished gradient (a device View of the working dtype,
  // scaled by the loss scale) just before grads_ready; the stream has been synchronised before
  // each call, so the tap may copy the memory with a plain cudaMemcpy. Returns the mean
  // cross-entropy (unscaled) after waiting for the stream. REQUIRES: the engine on
  // Device::cuda(device()), batch.seq <= config().seq, tokens in [0, vocab); else
  // kInvalidArgument.
  double forward_backward(Engine& e, const TokenBatch& batch, const GradTap& tap = {});
  // Forward only (evaluation): the mean cross-entropy; writes no gradients. Stage 3: a
  // collective like any gather.
  double forward_loss(Engine& e, const TokenBatch& batch);

  // Activation checkpointing of the blocks, as GptModel::set_checkpointing (gradients bitwise
  // those without). A policy that does not fit the layer count is zero::Error(kInvalidArgument).
  void set_checkpointing(const CheckpointSpec& spec);
  const CheckpointSpec& checkpointing() const noexcept { return ckpt_; }

  // Device bytes of the activations (kActivations) and of the workspace (kOther, pinned staging
  // excluded) for batches of `rows` x `seq` tokens.
  std::size_t activation_bytes(int rows, int seq) const;
  std::size_t workspace_bytes(int rows, int seq) const;
  static constexpr int kGradsHeld = 2;  // GptModel::grads_held of a model with nothing frozen
  // The gather order of a training micro-step (GptModel's without checkpointing).
  static std::vector<UnitId> gather_order(const GptConfig& config) {
    return GptModel::gather_order(config, CheckpointSpec{});
  }

  // Unit ids (valid after declare()).
  UnitId embedding_unit() const noexcept { return layout_.embedding_unit(); }
  UnitId block_unit(int layer) const noexcept { return layout_.block_unit(layer); }
  UnitId final_unit() const noexcept { return layout_.final_unit(); }

 private:
  struct Impl;

  double run(Engine& e, const TokenBatch& batch, bool backward, const GradTap& tap);

  // The CPU model declares and initialises the units (its workspace stays empty): one
  // definition of the layout for both models.
  GptModel layout_;
  CheckpointSpec ckpt_;
  MemoryTracker* tracker_;
  int device_;
  void* stream_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zero::gpt
