// gpt/gpt_flags.hpp — the command-line flags zero-train and zero-bench share: integers and byte
// counts that must parse whole, the model's shape (--layers --dim --heads --seq) and its frozen
// units (--freeze) and the run flags both take (common_flag).
//
// Thread safety: pure functions.
#pragma once

#include <string>

#include "gpt/gpt_model.hpp"
#include "zero/core/error.hpp"

namespace zero::gpt {

// The whole of `value` as an int; zero::Error(kInvalidArgument) naming the flag otherwise.
inline int flag_int(const std::string& flag, const std::string& value) {
  std::size_t pos = 0;
  int x = 0;
  try {
    x = std::stoi(value, &pos);
  } catch (...) {
    pos = 0;
  }
  ZERO_CHECK(pos == value.size() && !value.empty(), kInvalidArgument, flag,
             " expects an integer, got '", value, "'");
  return x;
}

// A byte count: a number with an optional K, M, G suffix (powers of 1024), e.g. 512M, 1.5G.
inline double flag_bytes(const std::string& flag, const std::string& value) {
  std::size_t pos = 0;
  double x = 0;
  try {
    x = std::stod(value, &pos);
  } catch (...) {
    pos = 0;
  }
  double mult = 1;
  if (pos > 0 && pos + 1 == value.size()) {
    const char u = value[pos];
    mult = u == 'K' || u == 'k'   ? 1024.0
           : u == 'M' || u == 'm' ? 1048576.0
           : u == 'G' || u == 'g' ? 1073741824.0
                                  : 0;
    if (mult != 0) ++pos;
  }
  ZERO_CHECK(pos == value.size() && !value.empty() && x >= 0 && mult != 0, kInvalidArgument, flag,
             " expects a byte count such as 512M or 2G, got '", value, "'");
  return x * mult;
}

// Applies --layers / --dim / --heads / --seq / --freeze to `model`; false for any other flag.
// `value` yields the flag's argument (and may throw when it is missing).
template <typename Value>
bool model_flag(const std::string& flag, Value&& value, GptConfig& model) {
  if (flag == "--layers") {
    model.layers = flag_int(flag, value());
  } else if (flag == "--dim") {
    model.dim = flag_int(flag, value());
  } else if (flag == "--heads") {
    model.heads = flag_int(flag, value());
  } else if (flag == "--seq") {
    model.seq = flag_int(flag, value());
  } else if (flag == "--freeze") {
    model.frozen_units = flag_int(flag, value());
  } else {
    return false;
  }
  return true;
}

// The run flags zero-train and zero-bench share, for an options struct with the fields
// model, ranks, steps, batch, data, memory_budget and config_args: the model's shape,
// --ranks / --steps / --batch / --data / --memory-budget, and --config / --set (kept in order in
// config_args for the config builder). False for any other flag.
template <typename Options, typename Value>
bool common_flag(const std::string& flag, Value&& value, Options& o) {
  if (model_flag(flag, value, o.model)) return true;
  if (flag == "--ranks") {
    o.ranks = flag_int(flag, value());
  } else if (flag == "--steps") {
    o.steps = flag_int(flag, value());
  } else if (flag == "--batch") {
    o.batch = flag_int(flag, value());
  } else if (flag == "--data") {
    o.data = value();
  } else if (flag == "--memory-budget") {
    o.memory_budget = flag_bytes(flag, value());
  } else if (flag == "--config" || flag == "--set") {
    o.config_args.push_back(flag);
    o.config_args.push_back(value());
  } else {
    return false;
  }
  return true;
}

}  // namespace zero::gpt
