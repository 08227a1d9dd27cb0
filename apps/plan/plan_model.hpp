// plan/plan_model.hpp — the models zero-plan plans for, as the chooser's TrainerModel
// (zero/plan/choose.hpp): the GPT trainer's (its units, gather order, activations and workspace
// from its own accounting, its FLOPs) or a JSON list of units with their parameter shapes and a
// declared activation size, or the header of a safetensors file (or a Hugging Face sharded set)
// with a declared activation size.
//
// Units JSON (every key checked; an error names the key and the file):
//   {"units": [{"name": "block0", "params": [{"name": "w", "shape": [768, 768]},
//                                            {"name": "b", "shape": [768], "trainable": true}]}],
//    "activation_bytes": 123456,     per rank per micro-step, on the device (default 0)
//    "flops_per_micro_step": 1e12}   per rank (default 6 x parameters x tokens of the micro-step,
//                                    with "tokens_per_micro_step"; neither: untimed compute)
//
// Thread safety: the returned callbacks are called on one thread at a time.
#pragma once

#include <string>

#include "gpt/gpt_model.hpp"
#include "zero/plan/choose.hpp"

namespace zero::plan {

// The GPT trainer's model at `g` (vocab set), `rows` sequences of g.seq per rank per micro-step.
TrainerModel gpt_trainer(const gpt::GptConfig& g, int rows, const Config& base);

// A model read from a units JSON file (see above).
TrainerModel units_trainer(const std::string& path);

// A model read from a safetensors header (a file or a sharded set: zero::units_from_safetensors,
// each tensor's unit by `unit_pattern`), `activation_bytes` per rank per micro-step declared,
// FLOPs 6 x parameters x `tokens` per rank per micro-step (0 tokens: untimed compute).
TrainerModel safetensors_trainer(const std::string& path, const std::string& unit_pattern,
                                 std::size_t activation_bytes, double tokens);

// Units with a declared activation size and FLOPs per rank per micro-step (0: untimed compute).
TrainerModel units_model(std::vector<UnitSpec> units, std::size_t activation_bytes, double flops);

}  // namespace zero::plan
