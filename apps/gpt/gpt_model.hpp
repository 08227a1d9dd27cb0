// gpt/gpt_model.hpp — a GPT-2-style decoder on the CPU, trained through the engine's managed
// hooks, and the character-level data it trains on.
//
// The model (Radford et al. 2019, "Language Models are Unsupervised Multitask Learners"; the
// layout follows llm.c's train_gpt2.c): token + position embeddings, `layers` pre-norm blocks
//   x = x + proj(attn(LN1(x)))      causal multi-head self-attention, one QKV projection
//   x = x + fcproj(GELU(fc(LN2(x))))  MLP of width 4 dim, GELU with the tanh approximation
// a final LayerNorm, and an output head tied to the token embedding (logits = x wte^T), with the
// mean cross-entropy of the next token as the loss. Forward and backward are written out in f32
// and parallelised with oneTBB; the matmuls use one cache-blocked kernel (no BLAS).
//
// Units of the engine: "embedding" (wte, wpe), "block<i>" (12 parameters each, in llm.c order),
// "ln_f" (2 parameters). The tied head uses wte, so the embedding unit is gathered twice in
// forward (at the start and at the head) and its gradient gets two contributions (head and
// lookup), accumulated into grad() within the micro-step before its single grads_ready().
//
// Determinism: every output element (activation or gradient) is computed by one task, summing in
// a fixed order; nothing depends on how oneTBB partitions the work or on the number of threads,
// and no floats are added atomically. Ranks therefore compute bitwise the same gradients from
// the same parameters and data, which is what lets the engine's stages agree bitwise.
//
// Memory: the activations kept from forward for backward are Buffers charged to the engine's
// MemoryTracker under MemCategory::kActivations, allocated in forward and freed in backward as
// each unit finishes; the persistent workspace (f32 copies of parameters, transposed weights,
// activation gradients) is charged under MemCategory::kOther.
//
// Thread safety: a GptModel holds per-rank workspace and is used by one rank's thread at a time
// (one instance per rank). CharCorpus is immutable after construction and safe to share between
// ranks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "zero/device/memory.hpp"
#include "zero/engine/activation_checkpointing.hpp"
#include "zero/engine/engine.hpp"

namespace zero::gpt {

// ---- model configuration

struct GptConfig {
  int vocab = 0;   // tokens in the vocabulary; REQUIRES >= 2
  int seq = 64;    // longest sequence (rows of wpe); batches may be shorter
  int layers = 2;  // transformer blocks
  int dim = 64;    // model width C; REQUIRES: a multiple of heads
  int heads = 4;   // attention heads
  // The first `frozen_units` units in forward order frozen (ParamSpec::trainable = false), as
  // fine-tuning the top of a pretrained model: 1 the embedding (with the tied head), 1 + k the
  // embedding and blocks 0..k-1. REQUIRES 0 <= frozen_units <= layers (a block trains). Forward
  // runs the frozen blocks as evaluation does (nothing kept: nothing below them needs a
  // gradient) and backward stops at the first trainable block.
  int frozen_units = 0;
  int frozen_blocks() const noexcept { return frozen_units > 1 ? frozen_units - 1 : 0; }

  // Throws zero::Error(kInvalidArgument) naming the field when a value is out of range.
  void validate() const;
  // Parameters of the model (wte counted once: the head is tied), and of them the trainable.
  std::size_t num_params() const;
  std::size_t trainable_params() const;
};

// `rows` token windows of `seq + 1` tokens each: inputs are tokens [0, seq), targets [1, seq].
struct TokenBatch {
  int rows = 0;
  int seq = 0;
  std::vector<std::int32_t> tokens;  // rows x (seq + 1), row-major

  std::int32_t input(int r, int t) const {
    return tokens[static_cast<std::size_t>(r) * static_cast<std::size_t>(seq + 1) +
                  static_cast<std::size_t>(t)];
  }
  std::int32_t target(int r, int t) const { return input(r, t + 1); }
};

// Throws zero::Error(kInvalidArgument), naming `model`, unless the batch fits the model: rows and
// seq >= 1, seq <= config.seq, rows x (seq + 1) tokens, each in [0, vocab).
void check_batch(const GptConfig& config, const TokenBatch& batch, const char* model);

// Concatenates batches of the same seq (a single rank training on every rank's samples).
TokenBatch concat(const std::vector<TokenBatch>& parts);

// ---- the data: character-level tokens of a text file

// The default corpus: present on every Debian machine.
inline constexpr const char* kDefaultCorpus = "/usr/share/common-licenses/GPL-3";

enum class Split : std::uint8_t { kTrain, kVal };

class CharCorpus {
 public:
  // Reads the file (throws zero::Error(kIO) naming it when it cannot be read, kInvalidArgument
  // when it is too short). The vocabulary is the set of distinct bytes, sorted; the last
  // `val_fraction` of the text is the validation split.
  static CharCorpus from_file(const std::string& path, double val_fraction = 0.1);
  static CharCorpus from_text(std::string text, double val_fraction = 0.1);

  int vocab_size() const noexcept { return static_cast<int>(chars_.size()); }
  std::size_t size(Split s) const noexcept;
  const std::vector<std::int32_t>& tokens() const noexcept { return tokens_; }
  char decode(std::int32_t token) const { return chars_.at(static_cast<std::size_t>(token)); }
  std::int32_t encode(char c) const;  // throws kInvalidArgument for a byte not in the corpus

  // Entropy in nats of the unigram (character frequency) distribution of the training split: the
  // loss of the best model that ignores context. A model that learns anything beats it.
  double unigram_entropy() const;

  // Rank `rank`'s `rows` samples for micro-step `micro` of step `step`: sample j is global sample
  // g = rank * rows + j, a window of seq + 1 tokens starting at a position drawn from a generator
  // seeded with (seed, step, micro, g) only. So N ranks with `rows` each see exactly the samples
  // of one rank with N x rows (rank 0), in the same order. REQUIRES: size(split) > seq + 1.
  TokenBatch batch(Split split, int rows, int seq, int rank, std::uint64_t step,
                   std::uint64_t micro, std::uint64_t seed = 0) const;

 private:
  std::vector<char> chars_;  // token -> byte
  std::vector<std::int32_t> tokens_;
  std::size_t train_size_ = 0;
};

// ---- the model

// Called for every parameter of a unit with its finished gradient (working dtype, scaled by the
// loss scale) just before grads_ready(unit): a tap for tests and diagnostics.
using GradTap = std::function<void(UnitId unit, int param, const View& grad)>;

class GptModel {
 public:
  // Per-rank workspace is charged to `tracker` (use engine.tracker()). REQUIRES: the tracker
  // outlives the model.
  GptModel(const GptConfig& config, MemoryTracker& tracker);
  ~GptModel();
  GptModel(const GptModel&) = delete;
  GptModel& operator=(const GptModel&) = delete;

  const GptConfig& config() const noexcept { return cfg_; }

  // Declares the model's units (embedding, block0..block<L-1>, ln_f) on the engine, in forward
  // order. Call once per engine, before any other model call.
  void declare(Engine& e);
  // GPT-2 initialisation, the same values on every rank (seeded): weights N(0, 0.02), the two
  // residual projections N(0, 0.02 / sqrt(2 layers)), biases 0, LayerNorm gains 1.
  void init(Engine& e, std::uint64_t seed) const;
  // Every parameter drawn from N(0, stddev) (LayerNorm gains 1 + N(0, stddev)): larger signals
  // than init() for gradient checks.
  void init_random(Engine& e, std::uint64_t seed, float stddev) const;

  // One micro-step: forward, loss, backward; each unit's gradient written into e.grad() and
  // announced with grads_ready(). Gathers, each released after use: embedding, block0 ..
  // block<L-1>, ln_f, embedding again (the tied head: logits, loss and the head's backward under
  // one gather), then ln_f, block<L-1> .. block0; the embedding's own backward (the lookup)
  // needs no parameters and gathers nothing. The loss gradient is multiplied by e.loss_scale().
  // Returns the mean cross-entropy (unscaled) over the batch's rows x seq tokens. The caller
  // calls e.step() afterwards.
  // REQUIRES: batch.seq <= config().seq, tokens in [0, vocab).
  double forward_backward(Engine& e, const TokenBatch& batch, const GradTap& tap = {});
  // Forward only (evaluation): the mean cross-entropy; keeps no activations, writes no gradients.
  // Stage 3: a collective like any gather.
  double forward_loss(Engine& e, const TokenBatch& batch);

  // Activation checkpointing of the blocks (zero/engine/activation_checkpointing.hpp); default
  // none. Gradients are bitwise those without.
  void set_checkpointing(const CheckpointSpec& spec);
  const CheckpointSpec& checkpointing() const noexcept { return ckpt_; }

  // The peak of kActivations during forward_backward for `rows` x `seq` tokens under `spec`
  // (default: the model's): the allocations of one micro-step replayed from the shapes.
  std::size_t activation_bytes(int rows, int seq) const {
    return activation_bytes(rows, seq, ckpt_);
  }
  std::size_t activation_bytes(int rows, int seq, const CheckpointSpec& spec) const;
  // The persistent workspace (kOther) for batches of up to `rows` x `seq` tokens.
  std::size_t workspace_bytes(int rows, int seq) const;
  // Gradient buffers open at once: the tied embedding's from the head to the end of backward
  // (unless frozen), plus the unit being written.
  static int grads_held(const GptConfig& config) { return config.frozen_units > 0 ? 1 : 2; }
  // The order in which one training micro-step gathers the units (what stage 3 prefetches by).
  static std::vector<UnitId> gather_order(const GptConfig& config, const CheckpointSpec& spec);
  // The peak of the kActivations bytes this model allocated itself during its last
  // forward_backward (the Checkpointer's buffers are charged to the tracker, not counted here).
  std::size_t last_activation_peak() const noexcept { return act_peak_; }

  // Unit ids (valid after declare()).
  UnitId embedding_unit() const noexcept { return first_unit_; }
  UnitId block_unit(int layer) const noexcept { return first_unit_ + 1 + layer; }
  UnitId final_unit() const noexcept { return first_unit_ + 1 + cfg_.layers; }

 private:
  struct Workspace;
  struct BlockActs;
  struct BlockParams;
  struct BlockGrads;
  struct BlockLayers;

  double run(Engine& e, const TokenBatch& batch, bool backward, const GradTap& tap);

  // One block as a function of its input: the shape activation checkpointing needs (keep x_in,
  // rerun block_forward in backward, then block_backward).
  void block_forward(const BlockParams& p, const float* x_in, float* x_out, BlockActs& acts,
                     int rows, int seq);
  void block_backward(const BlockParams& p, const BlockActs& acts, const float* x_in,
                      const float* dx_out, float* dx_in, const BlockGrads& g, int rows, int seq);

  Buffer alloc_activations(std::size_t bytes);
  void free_activations(Buffer& b);

  GptConfig cfg_;
  CheckpointSpec ckpt_;
  MemoryTracker* tracker_;
  UnitId first_unit_ = 0;
  bool declared_ = false;
  std::unique_ptr<Workspace> ws_;
  std::size_t act_current_ = 0;
  std::size_t act_peak_ = 0;
};

}  // namespace zero::gpt
