// gpt/gpt_math.hpp — the GPT model's per-element math, written once for the CPU model
// (gpt_model.cpp) and the CUDA kernels (gpt_cuda_kernels.cu). Plain C++17 (the .cu files include
// it), ZERO_HD so that nvcc compiles it for the device too.
//
// Thread safety: pure functions.
#pragma once

#include <math.h>  // tanhf: the same function on the host and (as a CUDA builtin) on the device

#include "zero/core/detail/hd.hpp"

namespace zero::gpt::math {

constexpr float kLnEps = 1e-5f;                // GPT-2's LayerNorm epsilon
constexpr float kGeluS = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

// GELU, tanh approximation (Hendrycks & Gimpel 2016, section 2; GPT-2's "gelu_new").
ZERO_HD inline float gelu(float v) {
  return 0.5f * v * (1.0f + tanhf(kGeluS * (v + kGeluA * v * v * v)));
}

// d/dv gelu(v).
ZERO_HD inline float gelu_grad(float v) {
  const float t = tanhf(kGeluS * (v + kGeluA * v * v * v));
  const float dt = (1.0f - t * t) * kGeluS * (1.0f + 3.0f * kGeluA * v * v);
  return 0.5f * (1.0f + t) + 0.5f * v * dt;
}

}  // namespace zero::gpt::math
