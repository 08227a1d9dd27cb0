// gpt/gpt_cost.hpp — what a step of the GPT trainer costs in arithmetic: the model FLOPs per token
// behind MFU, the FLOPs a step really runs (activation checkpointing recomputes the blocks'
// forward), and the trainer's FLOP/s measured on this machine (zero-env --calibrate --gpt).
//
// Thread safety: pure functions; measure_flops() runs one rank on the calling thread (its oneTBB
// arena does the work).
#pragma once

#include "gpt/gpt_model.hpp"
#include "zero/engine/activation_checkpointing.hpp"

namespace zero::gpt {

// Model FLOPs per trained token, the convention of MFU (PaLM, Chowdhery et al. 2022, appendix B):
// 6 per weight used in a matmul (forward 2, backward 4) — every parameter but the position
// table, the tied embedding counted once as the head — plus 12 x layers x dim x seq for the
// attention scores and their weighted sum. Recomputation (checkpointing) is not counted.
double model_flops_per_token(const GptConfig& g);

// The FLOPs per token one micro-step runs under `spec`: the model's, plus with any checkpointing
// policy the blocks' forward again in backward (2 per block weight, 4 x layers x dim x seq for
// attention; GptModel reruns every block of a segment, the first included).
double step_flops_per_token(const GptConfig& g, const CheckpointSpec& spec);

// The trainer's FLOP/s on this machine for the whole process: `ranks` in-process ranks (threads
// sharing the cores, as zero-train's) each running forward and backward of `rows` x g.seq tokens
// together (no optimizer step, no communication timed); the best of `repeats` after a warm-up,
// counted in model FLOPs over every rank's tokens. g.vocab 0: the default corpus's vocabulary.
double measure_flops(GptConfig g, int rows, int repeats = 3, int ranks = 1);

}  // namespace zero::gpt
