// zero/engine/activation_checkpointing.hpp — activation checkpointing for a forward that is a
// sequence of layers.
//
// Without checkpointing every layer keeps what its backward needs, for the whole forward. With
// it, the forward keeps only the inputs of segment boundaries (and every layer drops its saved
// activations as soon as it has run); the backward recomputes one segment's forward from its
// boundary input, then runs that segment's backward. Gradients are bitwise those of the plain
// run: the same layer code runs on the same inputs in the same order.
//
// Policies: none; every k layers; sqrt(n) segments; an explicit list of boundary layers;
// DeepSpeed's activation_checkpointing.number_checkpoints (segments spread evenly). Boundary
// inputs live in host memory, or in pinned host memory with cpu_checkpointing (on a CUDA build
// they are copied there on a side stream; on the CPU both are host memory, tracked as separate
// tiers). Every byte is charged to the tracker as MemCategory::kActivations: the kept inputs,
// two buffers for the activation between layers (allocated by the first forward) and two for
// its gradient (allocated by the first backward), kept until the Checkpointer is destroyed.
//
// Thread safety: a Checkpointer is used by one rank's thread.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "zero/config/config.hpp"
#include "zero/device/device_ops.hpp"
#include "zero/device/memory.hpp"

namespace zero {

enum class CheckpointPolicy { kNone, kEveryK, kSqrtN, kExplicit };

struct CheckpointSpec {
  CheckpointPolicy policy = CheckpointPolicy::kNone;
  int every_k = 1;              // kEveryK: a boundary every k layers (k >= 1)
  std::vector<int> boundaries;  // kExplicit: layers whose input is kept (0 is always one)
  bool cpu_checkpointing = false;

  // number_checkpoints > 0: that many evenly spread segments; else none. cpu_checkpointing too.
  static CheckpointSpec from_config(const ActivationCheckpointingConfig& c);
  // "none", "every:K", "sqrt", "list:0,4,9"; throws zero::Error(kInvalidArgument) naming it.
  static CheckpointSpec parse(const std::string& text);
  // What a tool's policy flag means with the config's activation_checkpointing block: "config"
  // is from_config(c) (number_checkpoints segments, none when 0); any other text is parse(text).
  // Either way cpu_checkpointing is the config's.
  static CheckpointSpec resolve(const std::string& text, const ActivationCheckpointingConfig& c);
  std::string to_string() const;
};

// The first layer of every segment, ascending, starting with 0. Throws kInvalidArgument for a
// layer count < 1 or a bad explicit list (out of range, not ascending).
std::vector<int> segment_starts(int num_layers, const CheckpointSpec& spec);

// What the trainer's layers provide. forward() computes out from in and keeps what backward()
// needs (the model charges those bytes itself); drop() frees what forward() kept for layer l.
class CheckpointedLayers {
 public:
  virtual ~CheckpointedLayers() = default;
  virtual void forward(int layer, const float* in, float* out) = 0;
  virtual void backward(int layer, const float* grad_out, float* grad_in) = 0;
  virtual void drop(int layer) = 0;
};

class Checkpointer {
 public:
  // `act_elems`: the f32 elements of the activation between two layers (a layer's input).
  // `device`: where the layers compute (their in / out pointers are its memory); null: host
  // memory. On a device the host cannot address (CUDA), kept inputs stay in device memory, or
  // with cpu_checkpointing go to pinned host memory on the device's copy lane (overlapping the
  // next segment's forward) and come back the same way before their segment is recomputed; a
  // device buffer then carries each segment's input (one more activation-sized buffer).
  Checkpointer(int num_layers, std::size_t act_elems, CheckpointSpec spec, MemoryTracker& tracker,
               DeviceOps* device = nullptr);
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Runs every layer forward from `in` to `out`, keeping what the policy keeps.
  void forward(CheckpointedLayers& layers, const float* in, float* out);
  // Runs every layer backward (recomputing segments as needed); grad_in may be null.
  // REQUIRES: forward() ran since the last backward().
  void backward(CheckpointedLayers& layers, const float* grad_out, float* grad_in);

  const std::vector<int>& starts() const noexcept { return starts_; }
  int num_layers() const noexcept { return num_layers_; }

 private:
  Buffer& slot(int layer);
  Buffer alloc(std::size_t bytes);
  void copy(void* dst, const void* src);
  bool staged() const;  // cpu_checkpointing on a device the host cannot address
  void run_forward(CheckpointedLayers& layers, int first, int last, const float* in, float* out,
                   bool drop);

  int num_layers_;
  std::size_t act_elems_;
  CheckpointSpec spec_;
  MemoryTracker& tracker_;
  std::vector<int> starts_;
  std::vector<Buffer> inputs_;    // per layer: its input, when it starts a segment
  Buffer scratch_a_, scratch_b_;  // running activations between layers
  Buffer grad_a_, grad_b_;        // running activation gradients between layers
  Buffer seg_in_;                 // staged(): the input of the segment being run
  DeviceOps* device_ = nullptr;
  bool forward_done_ = false;
};

}  // namespace zero
