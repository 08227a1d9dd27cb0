// gpt/gpt_cuda_kernels.hpp — the CUDA kernels of the GPT decoder's GPU path (GptCudaModel,
// gpt_cuda.hpp), as plain C++: device pointers, sizes and the stream as `void*` (a cudaStream_t;
// null is the legacy default stream); no CUDA header here (zero/device/detail/kernels.hpp is the
// model). The matmuls are cuBLAS calls in gpt_cuda.cpp; these are the rest of the model.
//
// Shapes follow the CPU model (gpt_model.cpp): activations are (M = B*T, C) row-major, token
// m = b*T + t; attention works on head-major copies q, k, v of (B, H, T, hd) with hd = C / H.
// Each kernel computes the same function as its CPU counterpart in gpt_model.cpp (same formulas
// and constants); sums may run in another order, so results agree to rounding, not bitwise.
//
// Determinism: every output element is written by exactly one thread, and every sum runs in an
// order fixed by the sizes alone (a sequential loop, or a warp / block tree of fixed shape); no
// atomics. The same inputs therefore give the same bits on every run, which is what lets the
// engine's stages agree bitwise on the GPU.
//
// Errors: each launcher checks its arguments (zero::Error(kInvalidArgument)) and the launch
// (cudaGetLastError: zero::Error(kCuda) naming the kernel). Every launcher returns when the
// kernel is enqueued on `stream`; its arrays must stay valid until the stream has run it.
//
// Thread safety: launchers may be called from any thread; kernels on one stream run in order.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zero/core/dtype.hpp"

namespace zero::gpt::kernels {

// ---- embedding

// x[m, c] = wte[tokens[m], c] + wpe[m % T, c] for the M = B*T tokens. REQUIRES: tokens in
// [0, rows of wte).
void embedding_forward(float* x, const std::int32_t* tokens, const float* wte, const float* wpe,
                       int B, int T, int C, void* stream);

// The position embedding's gradient, written whole: dwpe[t, c] = sum over b ascending of
// dx[b*T + t, c] for t < T, and 0 for T <= t < seq_rows (positions this batch does not reach).
// dwpe is `dtype` (f32 sums, rounded once).
void embedding_backward_wpe(void* dwpe, DType dtype, const float* dx, int B, int T, int seq_rows,
                            int C, void* stream);

// Adds the lookup's gradient to the token embedding's (which holds the tied head's already):
// for each of the `distinct` tokens v = tokens[j], row v of dwte (`dtype`) becomes
// dwte[v] + sum over i in [start[j], start[j+1]) ascending of dx[pos[i]], summed in f32 and
// rounded once. `pos` lists the positions holding each token in ascending order (a counting
// sort on the host); rows of tokens the batch does not hold are not touched.
void embedding_backward_wte(void* dwte, DType dtype, const float* dx, const std::int32_t* tokens,
                            const std::int32_t* start, const std::int32_t* pos, int distinct, int C,
                            void* stream);

// ---- LayerNorm over the last dimension C (eps 1e-5, as the CPU model)

// out = (x - mean) * rstd * w + b per row; mean and rstd (M each) saved for backward.
void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int M, int C, void* stream);

// dx = dres + dLN/dx . dy (dres may be null; dx may be dres), and the parameter gradients dw,
// db (C each, overwritten). REQUIRES: dx does not overlap x, dy, mean, rstd or w.
void layernorm_backward(float* dx, float* dw, float* db, const float* dres, const float* dy,
                        const float* x, const float* mean, const float* rstd, const float* w, int M,
                        int C, void* stream);

// ---- causal self-attention pieces (the matmuls are strided-batched GEMMs)

// qkv (M, 3C) with Q, K, V in column blocks [0, C), [C, 2C), [2C, 3C) and head h at columns
// h*hd of each -> q, k, v (B, H, T, hd) each.
void qkv_permute(float* q, float* k, float* v, const float* qkv, int B, int T, int H, int hd,
                 void* stream);
// The inverse (backward): dqkv (M, 3C) from dq, dk, dv (B, H, T, hd); every element written.
void qkv_permute_backward(float* dqkv, const float* dq, const float* dk, const float* dv, int B,
                          int T, int H, int hd, void* stream);
// y[b*T + t, h*hd + i] = heads[b, h, t, i] (the attention output back to (M, C)).
void heads_to_rows(float* y, const float* heads, int B, int T, int H, int hd, void* stream);
// heads[b, h, t, i] = y[b*T + t, h*hd + i] (its backward).
void rows_to_heads(float* heads, const float* y, int B, int T, int H, int hd, void* stream);

// In place over `rows` = B*H*T rows of T scores (row r is query t = r % T): p = softmax over
// t2 <= t of scale * s[t2], and 0 for t2 > t (the causal mask).
void softmax_forward(float* att, std::size_t rows, int T, float scale, void* stream);

// dpre[t2] = scale * p[t2] * (datt[t2] - sum_{t3 <= t} p[t3] datt[t3]) for t2 <= t, 0 beyond:
// the gradient with respect to the unscaled scores q.k. dpre may be datt (in place).
void softmax_backward(float* dpre, const float* datt, const float* att, std::size_t rows, int T,
                      float scale, void* stream);

// ---- elementwise

// out = GELU(x), the tanh approximation (gpt_model.cpp's gelu_forward).
void gelu_forward(float* out, const float* x, std::size_t n, void* stream);
// d *= GELU'(x) in place (gpt_model.cpp's gelu_backward).
void gelu_backward(float* d, const float* x, std::size_t n, void* stream);
// out = a + b (the residual connection); out may be a or b.
void add(float* out, const float* a, const float* b, std::size_t n, void* stream);
// out[m, n] += bias[n] for an (M, N) row-major out.
void bias_add(float* out, const float* bias, int M, int N, void* stream);
// out[n] = sum over m ascending of in[m, n] (the bias gradient), overwritten.
void column_sum(float* out, const float* in, int M, int N, void* stream);

// ---- the loss

// Per row m of logits (M, V): loss[m] = log sum_v exp(l[v]) - l[targets[m]] (max-shifted).
// With backward, the row is overwritten in place by d loss / d logits times the loss scale:
// (softmax - onehot(target)) * dscale, dscale = loss scale / (B*T). REQUIRES: targets in [0, V).
void crossentropy(float* logits, float* loss, const std::int32_t* targets, int M, int V,
                  float dscale, bool backward, void* stream);

}  // namespace zero::gpt::kernels
