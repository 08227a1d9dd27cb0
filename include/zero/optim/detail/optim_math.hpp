// zero/optim/detail/optim_math.hpp — the per-element optimizer updates, shared by every path.
//
// One ZERO_HD inline function per optimizer holds the update of one element. The CPU scalar path
// calls it directly, the CUDA kernels (kernels/*.cu) call it per element, and the AVX2 / AVX-512
// paths in optim/ mirror it operation by operation (same operations, same order, a fused
// multiply-add exactly where this file calls fma()), so every path gives the same bits: the tests
// check the SIMD paths against this function for bitwise equality, and the GPU tests check the
// kernels the same way.
//
// Rounding: every operation is one IEEE f32 operation rounded to nearest; fma(a, b, c) is a*b+c
// rounded once (IEEE fusedMultiplyAdd). On the host: mul/add are plain C++ built without FP
// contraction (-ffp-contract=off, set for optim/ in optim/CMakeLists.txt), so no a*b+c is fused
// behind our back, and fma() is __builtin_fmaf (the vfmadd instruction where the function's
// target has FMA, else libm's correctly rounded fmaf: the same bits). On the device: the
// __f*_rn intrinsics stop nvcc from contracting, and fma() is __fmaf_rn. The fused places are
// DeepSpeed cpu_adam's (Step_AVX: SIMD_FMA for each moment's "+ (1-beta) x", the bias-corrected
// denominator and the two parameter updates): 9 f32 operations per Adam element instead of 14.
//
// grad_scale == 1 (no loss scaling, no clipping) skips the multiply: x * 1 == x for every x, so
// the result is the same bits either way; the SIMD paths version their loops on it.
//
// The per-step scalars (bias corrections, -lr, ...) are computed once per step on the host in
// double by make_step_scalars() (optim/optimizer_params.cpp) and rounded to f32 once.
//
// Thread safety: pure functions of their arguments.
#pragma once

#include <cstdint>

#include "zero/core/detail/hd.hpp"

namespace zero::detail::optim {

// ---- correctly rounded f32 operations: none fused unless written fma()
ZERO_HD inline float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
ZERO_HD inline float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
ZERO_HD inline float div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
ZERO_HD inline float fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return __builtin_fmaf(a, b, c);
#endif
}
ZERO_HD inline float sqrt(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return __builtin_sqrtf(a);  // sqrtss under -fno-math-errno; same IEEE result either way
#endif
}

// Which update rule. Adam covers AdamW (decoupled decay) and Adam with L2 decay: the difference
// lives in StepScalars (l2_wd vs neg_lr_wd).
enum class Rule : std::uint8_t { kAdam, kSgd, kSgdMomentum, kLion, kAdagrad };

// Per-step constants in f32, computed by make_step_scalars(). Field use per rule:
//   all:      grad_scale  g = grad * grad_scale (1/loss_scale x clip coefficient)
//             l2_wd       L2 decay folded into the gradient: g += l2_wd * p (0: off)
//             neg_lr_wd   decoupled decay: p += neg_lr_wd * p, i.e. p *= 1 - lr*wd (0: off)
//             neg_step    the step: p += neg_step * update
//   Adam:     beta1, one_minus_beta1, beta2, one_minus_beta2, inv_sqrt_bc2 (1/sqrt(1-beta2^t),
//             1 without bias correction), eps; neg_step = -lr / (1 - beta1^t) (or -lr)
//   SGD+mom:  beta1 = momentum (0 on step 1), one_minus_beta1 = 1 - dampening (1 on step 1:
//             PyTorch starts the buffer at g), beta2 = momentum for Nesterov, 0 otherwise;
//             neg_step = -lr
//   Lion:     beta1, one_minus_beta1 (interpolation c), beta2, one_minus_beta2 (moment);
//             neg_step = -lr
//   Adagrad:  eps; neg_step = -lr
struct StepScalars {
  float grad_scale = 1.0f;
  float beta1 = 0.0f;
  float one_minus_beta1 = 0.0f;
  float beta2 = 0.0f;
  float one_minus_beta2 = 0.0f;
  float inv_sqrt_bc2 = 1.0f;
  float eps = 0.0f;
  float neg_step = 0.0f;
  float l2_wd = 0.0f;
  float neg_lr_wd = 0.0f;
  bool nesterov = false;
};

// The gradient as the update sees it: grad * grad_scale, unscaled when grad_scale is 1 (exact:
// the same bits), plus the L2 term when L2 decay is on (all rules but Lion).
ZERO_HD inline float scaled_grad(const StepScalars& s, float grad) {
  return s.grad_scale == 1.0f ? grad : mul(grad, s.grad_scale);
}
ZERO_HD inline float grad_in(const StepScalars& s, float grad, float p) {
  const float g = scaled_grad(s, grad);
  return s.l2_wd != 0.0f ? fma(s.l2_wd, p, g) : g;
}

// ---- Adam / AdamW: Kingma & Ba 2015 (arXiv:1412.6980) Algorithm 1 with PyTorch's placement of
// eps (eps added to sqrt(v_hat), torch.optim.Adam / AdamW); decoupled decay from Loshchilov &
// Hutter 2019 (arXiv:1711.05101). Operations and fused places as DeepSpeed's cpu_adam Step_AVX:
//   m = fma(1-b1, g, b1 m);  v = fma(1-b2, g^2, b2 v)
//   p = fma(-lr wd, p, p) (AdamW);  p = fma(-lr/(1-b1^t), m / fma(sqrt(v), 1/sqrt(1-b2^t), eps), p)
ZERO_HD inline void adam_update(const StepScalars& s, float grad, float& p, float& m, float& v) {
  const float g = grad_in(s, grad, p);
  m = fma(s.one_minus_beta1, g, mul(s.beta1, m));
  v = fma(s.one_minus_beta2, mul(g, g), mul(s.beta2, v));
  const float denom = fma(sqrt(v), s.inv_sqrt_bc2, s.eps);
  const float u = div(m, denom);
  if (s.neg_lr_wd != 0.0f) p = fma(s.neg_lr_wd, p, p);
  p = fma(s.neg_step, u, p);
}

// ---- SGD as torch.optim.SGD: g += wd p; buf = momentum buf + (1 - dampening) g (buf = g on the
// first step); g = nesterov ? g + momentum buf : buf; p -= lr g.
ZERO_HD inline void sgd_update(const StepScalars& s, float grad, float& p) {
  p = fma(s.neg_step, grad_in(s, grad, p), p);
}
ZERO_HD inline void sgd_momentum_update(const StepScalars& s, float grad, float& p, float& buf) {
  const float g = grad_in(s, grad, p);
  buf = fma(s.one_minus_beta1, g, mul(s.beta1, buf));
  const float d = s.nesterov ? fma(s.beta2, buf, g) : buf;
  p = fma(s.neg_step, d, p);
}

// sign(c) as torch.sign: +1, -1, 0 for +-0; NaN stays NaN (c * 0).
ZERO_HD inline float sign_of(float c) {
  return c > 0.0f ? 1.0f : (c < 0.0f ? -1.0f : mul(c, 0.0f));
}

// ---- Lion: Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"
// (arXiv:2302.06675) Program 1:
//   c = b1 m + (1-b1) g;  p = p - lr wd p;  p = p - lr sign(c);  m = b2 m + (1-b2) g
ZERO_HD inline void lion_update(const StepScalars& s, float grad, float& p, float& m) {
  const float g = scaled_grad(s, grad);
  const float c = fma(s.one_minus_beta1, g, mul(s.beta1, m));
  if (s.neg_lr_wd != 0.0f) p = fma(s.neg_lr_wd, p, p);
  p = fma(s.neg_step, sign_of(c), p);
  m = fma(s.one_minus_beta2, g, mul(s.beta2, m));
}

// ---- Adagrad: Duchi et al. 2011, as torch.optim.Adagrad (lr_decay 0, initial accumulator 0):
//   g += wd p;  sum += g^2;  p -= lr g / (sqrt(sum) + eps)
ZERO_HD inline void adagrad_update(const StepScalars& s, float grad, float& p, float& sum) {
  const float g = grad_in(s, grad, p);
  sum = fma(g, g, sum);
  const float u = div(g, add(sqrt(sum), s.eps));
  p = fma(s.neg_step, u, p);
}

}  // namespace zero::detail::optim
