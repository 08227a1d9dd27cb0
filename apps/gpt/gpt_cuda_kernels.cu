// gpt/gpt_cuda_kernels.cu — the GPT decoder's kernels and their launchers (see
// gpt_cuda_kernels.hpp for the contracts). Each mirrors a loop of gpt_model.cpp; the comments
// name it. Compiled as C++17 (CMAKE_CUDA_STANDARD): only C++17 headers here.
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "gpt/gpt_cuda_kernels.hpp"
#include "gpt/gpt_math.hpp"
#include "kernels/cuda_check.hpp"
#include "zero/core/dtype.hpp"
#include "zero/core/error.hpp"

namespace zero::gpt::kernels {
namespace {

using zero::detail::kernels::check_launch;

constexpr int kThreads = 256;                // elementwise kernels (grid-stride)
constexpr int kWarp = 32;                    // rows kernels: one warp per row ...
constexpr int kRowWarps = kThreads / kWarp;  // ... 8 rows per block
constexpr int kColX = 32;                    // column sums: 32 columns per block ...
constexpr int kColY = 16;                    // ... each summed by 16 row slices, then in order
using math::kLnEps;                          // gpt_math.hpp: shared with the CPU model

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// Blocks for a grid-stride loop over n elements.
int grid_for(std::size_t n) {
  return zero::detail::kernels::grid_size((n + kThreads - 1) / kThreads, 8);
}
// Blocks for one warp per row.
unsigned rows_grid(std::size_t rows) {
  return static_cast<unsigned>((rows + kRowWarps - 1) / kRowWarps);
}

// Element size of a 16/32-bit dtype on the device (dtype_size is a host constexpr).
__device__ __forceinline__ std::size_t elem_size(DType t) { return t == DType::kF32 ? 4 : 2; }

// Butterfly reductions: every lane ends with the same bits (IEEE addition and fmaxf are
// commutative, so lanes i and i^o compute the same pair), in an order fixed by the warp shape.
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// A block-wide reduction of kThreads threads: warp trees, then every thread folds the warps'
// results in warp order. `part` holds kRowWarps floats.
template <bool kMax>
__device__ float block_reduce(float v, float* part) {
  v = kMax ? warp_max(v) : warp_sum(v);
  if (threadIdx.x % kWarp == 0) part[threadIdx.x / kWarp] = v;
  __syncthreads();
  float r = part[0];
  for (int w = 1; w < kRowWarps; ++w) r = kMax ? fmaxf(r, part[w]) : r + part[w];
  __syncthreads();  // `part` is reused by the next reduction
  return r;
}

// ---------------------------------------------------------------------------------------------
// Embedding (gpt_model.cpp run(): the forward lookup and the embedding's backward).

__global__ void embedding_forward_kernel(float* x, const std::int32_t* tokens, const float* wte,
                                         const float* wpe, int T, int C, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{kThreads} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * kThreads) {
    const std::size_t m = i / static_cast<std::size_t>(C), c = i % static_cast<std::size_t>(C);
    const std::size_t tok = static_cast<std::size_t>(tokens[m]);
    const std::size_t t = m % static_cast<std::size_t>(T);
    x[i] = wte[tok * C + c] + wpe[t * C + c];
  }
}

// One thread per (position row t, channel c), summing the sequences in order.
__global__ void embedding_backward_wpe_kernel(void* dwpe, DType dtype, const float* dx, int B,
                                              int T, int C, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{kThreads} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * kThreads) {
    const std::size_t t = i / static_cast<std::size_t>(C), c = i % static_cast<std::size_t>(C);
    float s = 0.0f;
    if (t < static_cast<std::size_t>(T)) {
      for (int b = 0; b < B; ++b) s += dx[(static_cast<std::size_t>(b) * T + t) * C + c];
    }
    store_from_f32(static_cast<char*>(dwpe) + i * elem_size(dtype), dtype, s);
  }
}

// One block per distinct token, its threads over the channels; each (token, channel) sums its
// positions in ascending order on top of the value already there.
__global__ void embedding_backward_wte_kernel(void* dwte, DType dtype, const float* dx,
                                              const std::int32_t* tokens, const std::int32_t* start,
                                              const std::int32_t* pos, int C) {
  const std::size_t v = static_cast<std::size_t>(tokens[blockIdx.x]);
  const int i0 = start[blockIdx.x], i1 = start[blockIdx.x + 1];
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    char* p = static_cast<char*>(dwte) + (v * C + c) * elem_size(dtype);
    float row = load_as_f32(p, dtype);
    for (int i = i0; i < i1; ++i) row += dx[static_cast<std::size_t>(pos[i]) * C + c];
    store_from_f32(p, dtype, row);
  }
}

// ---------------------------------------------------------------------------------------------
// LayerNorm (gpt_model.cpp layernorm_forward / layernorm_backward): one warp per row.

__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* x,
                                         const float* w, const float* b, int M, int C) {
  const int row = blockIdx.x * kRowWarps + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= M) return;  // whole warps leave together: the shuffles below see full warps
  const float* xr = x + static_cast<std::size_t>(row) * C;
  float s = 0.0f;
  for (int c = lane; c < C; c += kWarp) s += xr[c];
  const float mu = warp_sum(s) / static_cast<float>(C);
  float v = 0.0f;
  for (int c = lane; c < C; c += kWarp) {
    const float d = xr[c] - mu;
    v += d * d;
  }
  const float rs = 1.0f / sqrtf(warp_sum(v) / static_cast<float>(C) + kLnEps);
  float* o = out + static_cast<std::size_t>(row) * C;
  for (int c = lane; c < C; c += kWarp) o[c] = (xr[c] - mu) * rs * w[c] + b[c];
  if (lane == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
}

__global__ void layernorm_backward_dx_kernel(float* dx, const float* dres, const float* dy,
                                             const float* x, const float* mean, const float* rstd,
                                             const float* w, int M, int C) {
  const int row = blockIdx.x * kRowWarps + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= M) return;
  const std::size_t base = static_cast<std::size_t>(row) * C;
  const float mu = mean[row], rs = rstd[row];
  float sum_d = 0.0f, sum_dx = 0.0f;
  for (int c = lane; c < C; c += kWarp) {
    const float d = dy[base + c] * w[c];
    sum_d += d;
    sum_dx += d * (x[base + c] - mu) * rs;
  }
  const float inv_c = 1.0f / static_cast<float>(C);
  const float mean_d = warp_sum(sum_d) * inv_c, mean_dx = warp_sum(sum_dx) * inv_c;
  for (int c = lane; c < C; c += kWarp) {
    const float xhat = (x[base + c] - mu) * rs;
    const float v = rs * (dy[base + c] * w[c] - mean_d - xhat * mean_dx);
    dx[base + c] = dres != nullptr ? dres[base + c] + v : v;  // read before write: dx may be dres
  }
}

// dw[c] = sum_m dy[m,c] xhat[m,c], db[c] = sum_m dy[m,c]: thread (tx, ty) of a block sums rows
// ty, ty + kColY, ... of column blockIdx.x * kColX + tx in order; row ty == 0 then adds the
// kColY partial sums in order.
__global__ void layernorm_backward_params_kernel(float* dw, float* db, const float* dy,
                                                 const float* x, const float* mean,
                                                 const float* rstd, int M, int C) {
  __shared__ float pw[kColY][kColX + 1];
  __shared__ float pb[kColY][kColX + 1];
  const int c = blockIdx.x * kColX + threadIdx.x;
  float sw = 0.0f, sb = 0.0f;
  if (c < C) {
    for (int m = threadIdx.y; m < M; m += kColY) {
      const std::size_t i = static_cast<std::size_t>(m) * C + c;
      const float g = dy[i];
      sw += g * ((x[i] - mean[m]) * rstd[m]);
      sb += g;
    }
  }
  pw[threadIdx.y][threadIdx.x] = sw;
  pb[threadIdx.y][threadIdx.x] = sb;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float tw = pw[0][threadIdx.x], tb = pb[0][threadIdx.x];
    for (int y = 1; y < kColY; ++y) {
      tw += pw[y][threadIdx.x];
      tb += pb[y][threadIdx.x];
    }
    dw[c] = tw;
    db[c] = tb;
  }
}

// ---------------------------------------------------------------------------------------------
// Attention layout changes (gpt_model.cpp attention_forward indexes qkv as [B*T, 3C] with head h
// at columns h*hd of each of Q, K, V; the GEMMs want (B, H, T, hd) per tensor).

// Index idx of a (B, H, T, hd) tensor -> offset of the same element in a (B*T, width) row-major
// tensor whose head h starts at column h*hd.
__device__ __forceinline__ std::size_t head_to_row(std::size_t idx, int T, int H, int hd,
                                                   std::size_t width) {
  const std::size_t i = idx % hd;
  std::size_t r = idx / hd;
  const std::size_t t = r % T;
  r /= T;
  const std::size_t h = r % H, b = r / H;
  return (b * T + t) * width + h * hd + i;
}

__global__ void qkv_permute_kernel(float* q, float* k, float* v, const float* qkv, int T, int H,
                                   int hd, std::size_t n) {
  const std::size_t C = static_cast<std::size_t>(H) * hd;
  for (std::size_t idx = blockIdx.x * std::size_t{kThreads} + threadIdx.x; idx < n;
       idx += std::size_t{gridDim.x} * kThreads) {
    const std::size_t src = head_to_row(idx, T, H, hd, 3 * C);
    q[idx] = qkv[src];
    k[idx] = qkv[src + C];
    v[idx] = qkv[src + 2 * C];
  }
}

__global__ void qkv_permute_backward_kernel(float* dqkv, const float* dq, const float* dk,
                                            const float* dv, int T, int H, int hd, std::size_t n) {
  const std::size_t C = static_cast<std::size_t>(H) * hd;
  for (std::size_t idx = blockIdx.x * std::size_t{kThreads} + threadIdx.x; idx < n;
       idx += std::size_t{gridDim.x} * kThreads) {
    const std::size_t dst = head_to_row(idx, T, H, hd, 3 * C);
    dqkv[dst] = dq[idx];
    dqkv[dst + C] = dk[idx];
    dqkv[dst + 2 * C] = dv[idx];
  }
}

template <bool kToRows>
__global__ void heads_rows_kernel(float* out, const float* in, int T, int H, int hd,
                                  std::size_t n) {
  const std::size_t C = static_cast<std::size_t>(H) * hd;
  for (std::size_t idx = blockIdx.x * std::size_t{kThreads} + threadIdx.x; idx < n;
       idx += std::size_t{gridDim.x} * kThreads) {
    const std::size_t r = head_to_row(idx, T, H, hd, C);
    if constexpr (kToRows) {
      out[r] = in[idx];
    } else {
      out[idx] = in[r];
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Causal softmax (gpt_model.cpp attention_forward's p[] and attention_backward's ds[]): one
// warp per query row. Scores are scaled with __fmul_rn so that the max and the exponentials see
// the same rounded product (no FMA contraction of s * scale - max).

__global__ void softmax_forward_kernel(float* att, std::size_t rows, int T, float scale) {
  const std::size_t row = blockIdx.x * std::size_t{kRowWarps} + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const int t = static_cast<int>(row % static_cast<std::size_t>(T));
  float* p = att + row * T;
  float mx = -INFINITY;
  for (int t2 = lane; t2 <= t; t2 += kWarp) mx = fmaxf(mx, __fmul_rn(p[t2], scale));
  mx = warp_max(mx);
  float sum = 0.0f;
  for (int t2 = lane; t2 <= t; t2 += kWarp) sum += expf(__fmul_rn(p[t2], scale) - mx);
  const float inv = 1.0f / warp_sum(sum);
  // Each lane rewrites only the elements it read itself: in place is safe.
  for (int t2 = lane; t2 < T; t2 += kWarp) {
    p[t2] = t2 <= t ? expf(__fmul_rn(p[t2], scale) - mx) * inv : 0.0f;
  }
}

__global__ void softmax_backward_kernel(float* dpre, const float* datt, const float* att,
                                        std::size_t rows, int T, float scale) {
  const std::size_t row = blockIdx.x * std::size_t{kRowWarps} + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const int t = static_cast<int>(row % static_cast<std::size_t>(T));
  const float* p = att + row * T;
  const float* g = datt + row * T;
  float* o = dpre + row * T;
  float pdp = 0.0f;  // sum_t3 p * dp: the softmax backward's inner product
  for (int t2 = lane; t2 <= t; t2 += kWarp) pdp += p[t2] * g[t2];
  pdp = warp_sum(pdp);
  for (int t2 = lane; t2 < T; t2 += kWarp) {
    o[t2] = t2 <= t ? scale * (p[t2] * (g[t2] - pdp)) : 0.0f;  // o may be g: same lane, read first
  }
}

// ---------------------------------------------------------------------------------------------
// Elementwise.

__global__ void gelu_forward_kernel(float* out, const float* x, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{kThreads} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * kThreads) {
    out[i] = math::gelu(x[i]);
  }
}

__global__ void gelu_backward_kernel(float* d, const float* x, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{kThreads} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * kThreads) {
    d[i] *= math::gelu_grad(x[i]);
  }
}

__global__ void add_kernel(float* out, const float* a, const float* b, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{kThreads} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * kThreads) {
    out[i] = a[i] + b[i];
  }
}

__global__ void bias_add_kernel(float* out, const float* bias, std::size_t N, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{kThreads} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * kThreads) {
    out[i] += bias[i % N];
  }
}

// gpt_model.cpp column_sum, laid out as layernorm_backward_params_kernel.
__global__ void column_sum_kernel(float* out, const float* in, int M, int N) {
  __shared__ float part[kColY][kColX + 1];
  const int c = blockIdx.x * kColX + threadIdx.x;
  float s = 0.0f;
  if (c < N) {
    for (int m = threadIdx.y; m < M; m += kColY) s += in[static_cast<std::size_t>(m) * N + c];
  }
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < N) {
    float t = part[0][threadIdx.x];
    for (int y = 1; y < kColY; ++y) t += part[y][threadIdx.x];
    out[c] = t;
  }
}

// ---------------------------------------------------------------------------------------------
// Cross-entropy (gpt_model.cpp run(), the head's loss loop): one block of kThreads per row.

__global__ void crossentropy_kernel(float* logits, float* loss, const std::int32_t* targets, int V,
                                    float dscale, bool backward) {
  __shared__ float part[kRowWarps];
  float* l = logits + static_cast<std::size_t>(blockIdx.x) * V;
  const int target = targets[blockIdx.x];
  float mx = -INFINITY;
  for (int v = threadIdx.x; v < V; v += kThreads) mx = fmaxf(mx, l[v]);
  mx = block_reduce<true>(mx, part);
  float sum = 0.0f;
  for (int v = threadIdx.x; v < V; v += kThreads) sum += expf(l[v] - mx);
  sum = block_reduce<false>(sum, part);
  const float inv = 1.0f / sum;
  // Each thread rewrites only its own elements, after the reductions read them.
  for (int v = threadIdx.x; v < V; v += kThreads) {
    const float x = l[v];
    if (v == target) loss[blockIdx.x] = logf(sum) + mx - x;
    if (backward) {  // d loss / d logits = (softmax - onehot) / M, times the loss scale
      float d = expf(x - mx) * inv * dscale;
      if (v == target) d -= dscale;
      l[v] = d;
    }
  }
}

void require(bool ok, const char* launcher, const char* what) {
  ZERO_CHECK(ok, kInvalidArgument, "gpt kernels: ", launcher, ": ", what);
}

}  // namespace

// ---- launchers

void embedding_forward(float* x, const std::int32_t* tokens, const float* wte, const float* wpe,
                       int B, int T, int C, void* stream) {
  require(B >= 0 && T >= 1 && C >= 1, "embedding_forward", "needs B >= 0, T >= 1, C >= 1");
  const std::size_t n = static_cast<std::size_t>(B) * T * C;
  if (n == 0) return;
  embedding_forward_kernel<<<grid_for(n), kThreads, 0, as_stream(stream)>>>(x, tokens, wte, wpe, T,
                                                                            C, n);
  check_launch("embedding_forward_kernel");
}

void embedding_backward_wpe(void* dwpe, DType dtype, const float* dx, int B, int T, int seq_rows,
                            int C, void* stream) {
  require(B >= 0 && T >= 1 && T <= seq_rows && C >= 1, "embedding_backward_wpe",
          "needs B >= 0, 1 <= T <= seq_rows, C >= 1");
  const std::size_t n = static_cast<std::size_t>(seq_rows) * C;
  embedding_backward_wpe_kernel<<<grid_for(n), kThreads, 0, as_stream(stream)>>>(dwpe, dtype, dx, B,
                                                                                 T, C, n);
  check_launch("embedding_backward_wpe_kernel");
}

void embedding_backward_wte(void* dwte, DType dtype, const float* dx, const std::int32_t* tokens,
                            const std::int32_t* start, const std::int32_t* pos, int distinct, int C,
                            void* stream) {
  require(distinct >= 0 && C >= 1, "embedding_backward_wte", "needs distinct >= 0, C >= 1");
  if (distinct == 0) return;
  embedding_backward_wte_kernel<<<static_cast<unsigned>(distinct), 128, 0, as_stream(stream)>>>(
      dwte, dtype, dx, tokens, start, pos, C);
  check_launch("embedding_backward_wte_kernel");
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int M, int C, void* stream) {
  require(M >= 0 && C >= 1, "layernorm_forward", "needs M >= 0, C >= 1");
  if (M == 0) return;
  layernorm_forward_kernel<<<rows_grid(static_cast<std::size_t>(M)), kThreads, 0,
                             as_stream(stream)>>>(out, mean, rstd, x, w, b, M, C);
  check_launch("layernorm_forward_kernel");
}

void layernorm_backward(float* dx, float* dw, float* db, const float* dres, const float* dy,
                        const float* x, const float* mean, const float* rstd, const float* w, int M,
                        int C, void* stream) {
  require(M >= 0 && C >= 1, "layernorm_backward", "needs M >= 0, C >= 1");
  if (M > 0) {
    layernorm_backward_dx_kernel<<<rows_grid(static_cast<std::size_t>(M)), kThreads, 0,
                                   as_stream(stream)>>>(dx, dres, dy, x, mean, rstd, w, M, C);
    check_launch("layernorm_backward_dx_kernel");
  }
  layernorm_backward_params_kernel<<<static_cast<unsigned>((C + kColX - 1) / kColX),
                                     dim3(kColX, kColY), 0, as_stream(stream)>>>(dw, db, dy, x,
                                                                                 mean, rstd, M, C);
  check_launch("layernorm_backward_params_kernel");
}

void qkv_permute(float* q, float* k, float* v, const float* qkv, int B, int T, int H, int hd,
                 void* stream) {
  require(B >= 0 && T >= 1 && H >= 1 && hd >= 1, "qkv_permute", "needs B >= 0, T, H, hd >= 1");
  const std::size_t n = static_cast<std::size_t>(B) * H * T * hd;
  if (n == 0) return;
  qkv_permute_kernel<<<grid_for(n), kThreads, 0, as_stream(stream)>>>(q, k, v, qkv, T, H, hd, n);
  check_launch("qkv_permute_kernel");
}

void qkv_permute_backward(float* dqkv, const float* dq, const float* dk, const float* dv, int B,
                          int T, int H, int hd, void* stream) {
  require(B >= 0 && T >= 1 && H >= 1 && hd >= 1, "qkv_permute_backward",
          "needs B >= 0, T, H, hd >= 1");
  const std::size_t n = static_cast<std::size_t>(B) * H * T * hd;
  if (n == 0) return;
  qkv_permute_backward_kernel<<<grid_for(n), kThreads, 0, as_stream(stream)>>>(dqkv, dq, dk, dv, T,
                                                                               H, hd, n);
  check_launch("qkv_permute_backward_kernel");
}

void heads_to_rows(float* y, const float* heads, int B, int T, int H, int hd, void* stream) {
  require(B >= 0 && T >= 1 && H >= 1 && hd >= 1, "heads_to_rows", "needs B >= 0, T, H, hd >= 1");
  const std::size_t n = static_cast<std::size_t>(B) * H * T * hd;
  if (n == 0) return;
  heads_rows_kernel<true><<<grid_for(n), kThreads, 0, as_stream(stream)>>>(y, heads, T, H, hd, n);
  check_launch("heads_rows_kernel<to rows>");
}

void rows_to_heads(float* heads, const float* y, int B, int T, int H, int hd, void* stream) {
  require(B >= 0 && T >= 1 && H >= 1 && hd >= 1, "rows_to_heads", "needs B >= 0, T, H, hd >= 1");
  const std::size_t n = static_cast<std::size_t>(B) * H * T * hd;
  if (n == 0) return;
  heads_rows_kernel<false><<<grid_for(n), kThreads, 0, as_stream(stream)>>>(heads, y, T, H, hd, n);
  check_launch("heads_rows_kernel<to heads>");
}

void softmax_forward(float* att, std::size_t rows, int T, float scale, void* stream) {
  require(T >= 1, "softmax_forward", "needs T >= 1");
  if (rows == 0) return;
  softmax_forward_kernel<<<rows_grid(rows), kThreads, 0, as_stream(stream)>>>(att, rows, T, scale);
  check_launch("softmax_forward_kernel");
}

void softmax_backward(float* dpre, const float* datt, const float* att, std::size_t rows, int T,
                      float scale, void* stream) {
  require(T >= 1, "softmax_backward", "needs T >= 1");
  if (rows == 0) return;
  softmax_backward_kernel<<<rows_grid(rows), kThreads, 0, as_stream(stream)>>>(dpre, datt, att,
                                                                               rows, T, scale);
  check_launch("softmax_backward_kernel");
}

void gelu_forward(float* out, const float* x, std::size_t n, void* stream) {
  if (n == 0) return;
  gelu_forward_kernel<<<grid_for(n), kThreads, 0, as_stream(stream)>>>(out, x, n);
  check_launch("gelu_forward_kernel");
}

void gelu_backward(float* d, const float* x, std::size_t n, void* stream) {
  if (n == 0) return;
  gelu_backward_kernel<<<grid_for(n), kThreads, 0, as_stream(stream)>>>(d, x, n);
  check_launch("gelu_backward_kernel");
}

void add(float* out, const float* a, const float* b, std::size_t n, void* stream) {
  if (n == 0) return;
  add_kernel<<<grid_for(n), kThreads, 0, as_stream(stream)>>>(out, a, b, n);
  check_launch("add_kernel");
}

void bias_add(float* out, const float* bias, int M, int N, void* stream) {
  require(M >= 0 && N >= 1, "bias_add", "needs M >= 0, N >= 1");
  const std::size_t n = static_cast<std::size_t>(M) * N;
  if (n == 0) return;
  bias_add_kernel<<<grid_for(n), kThreads, 0, as_stream(stream)>>>(out, bias,
                                                                   static_cast<std::size_t>(N), n);
  check_launch("bias_add_kernel");
}

void column_sum(float* out, const float* in, int M, int N, void* stream) {
  require(M >= 0 && N >= 1, "column_sum", "needs M >= 0, N >= 1");
  column_sum_kernel<<<static_cast<unsigned>((N + kColX - 1) / kColX), dim3(kColX, kColY), 0,
                      as_stream(stream)>>>(out, in, M, N);
  check_launch("column_sum_kernel");
}

void crossentropy(float* logits, float* loss, const std::int32_t* targets, int M, int V,
                  float dscale, bool backward, void* stream) {
  require(M >= 0 && V >= 1, "crossentropy", "needs M >= 0, V >= 1");
  if (M == 0) return;
  crossentropy_kernel<<<static_cast<unsigned>(M), kThreads, 0, as_stream(stream)>>>(
      logits, loss, targets, V, dscale, backward);
  check_launch("crossentropy_kernel");
}

}  // namespace zero::gpt::kernels
