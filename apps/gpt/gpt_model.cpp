// gpt/gpt_model.cpp — the GPT decoder's forward and backward on the CPU, and the character
// corpus. See gpt_model.hpp for the model and the determinism contract every kernel here keeps:
// each output element is produced by exactly one task, summing in a fixed (ascending) order.
#include "gpt/gpt_model.hpp"

#include <tbb/blocked_range.h>
#include <tbb/blocked_range2d.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <random>

#include "gpt/gpt_block.hpp"
#include "gpt/gpt_math.hpp"
#include "zero/core/cpu_features.hpp"
#include "zero/core/dtype.hpp"
#include "zero/core/error.hpp"
#include "zero/engine/activation_checkpointing.hpp"

namespace zero::gpt {
namespace {

using math::kLnEps;
constexpr int kBlockParams = 12;
constexpr std::size_t kAlignFloats = 16;  // activation tensors start on 64-byte boundaries

std::size_t round_up(std::size_t x, std::size_t m) { return (x + m - 1) / m * m; }

// Rows per task so that a task does at least ~`work` multiply-adds: tiny models would otherwise
// drown in scheduling overhead. Any grain gives the same bits (one task per output element).
std::size_t grain_for(std::size_t per_row, std::size_t work = 1 << 14) {
  return std::max<std::size_t>(1, work / std::max<std::size_t>(1, per_row));
}

// ---------------------------------------------------------------------------------------------
// The matmul: C[M,N] = bias[n] (or 0) + sum_{k = 0..K-1} A[m,k] * B[k,n], all row-major. Every
// C element is one task's, accumulated k = 0, 1, ..., K-1, so the result does not depend on the
// tiling or the partition. Blocking: a micro-tile of 4 rows x 16 columns lives in registers for
// the whole k loop (4 broadcasts of A and one 16-wide row segment of B per k); a task walks its
// column blocks outermost so that the K x 16 panel of B stays in cache while the task's row
// blocks reuse it. The avx2 variant (no FMA: fma would change the rounding) gives the same bits
// as the baseline one, only faster.
constexpr std::size_t kTileM = 4;
constexpr std::size_t kTileN = 16;

// One micro-tile: rows [ib, ib + nr), columns [jb, jb + nc), nr <= 4, nc <= 16. Missing rows
// repeat row ib (computed, never stored); missing columns read zeros from a padded copy. The
// accumulators are GCC vector-extension values so that they stay in registers (8 ymm in the
// avx2 variant); vector arithmetic is elementwise IEEE, so each lane gets the scalar loop's bits.
using V8 = float __attribute__((vector_size(32)));

template <bool kFullWidth>
__attribute__((always_inline)) inline void micro_tile(float* __restrict C,
                                                      const float* __restrict A,
                                                      const float* __restrict B,
                                                      const float* __restrict bias, std::size_t N,
                                                      std::size_t K, std::size_t ib, std::size_t nr,
                                                      std::size_t jb, std::size_t nc) {
  V8 init0{}, init1{};
  if (bias != nullptr) {
    float bb[kTileN] = {};
    for (std::size_t j = 0; j < nc; ++j) bb[j] = bias[jb + j];
    std::memcpy(&init0, bb, sizeof(V8));
    std::memcpy(&init1, bb + 8, sizeof(V8));
  }
  V8 c00 = init0, c01 = init1, c10 = init0, c11 = init1;
  V8 c20 = init0, c21 = init1, c30 = init0, c31 = init1;
  const float* a0 = A + ib * K;
  const float* a1 = nr > 1 ? a0 + K : a0;
  const float* a2 = nr > 2 ? a0 + 2 * K : a0;
  const float* a3 = nr > 3 ? a0 + 3 * K : a0;
  for (std::size_t k = 0; k < K; ++k) {
    V8 b0, b1;
    if constexpr (kFullWidth) {
      std::memcpy(&b0, B + k * N + jb, sizeof(V8));
      std::memcpy(&b1, B + k * N + jb + 8, sizeof(V8));
    } else {
      float b[kTileN] = {};
      for (std::size_t j = 0; j < nc; ++j) b[j] = B[k * N + jb + j];
      std::memcpy(&b0, b, sizeof(V8));
      std::memcpy(&b1, b + 8, sizeof(V8));
    }
    const float x0 = a0[k], x1 = a1[k], x2 = a2[k], x3 = a3[k];
    c00 += x0 * b0;
    c01 += x0 * b1;
    c10 += x1 * b0;
    c11 += x1 * b1;
    c20 += x2 * b0;
    c21 += x2 * b1;
    c30 += x3 * b0;
    c31 += x3 * b1;
  }
  const V8* rows[kTileM][2] = {{&c00, &c01}, {&c10, &c11}, {&c20, &c21}, {&c30, &c31}};
  for (std::size_t r = 0; r < nr; ++r) {
    float out[kTileN];
    std::memcpy(out, rows[r][0], sizeof(V8));
    std::memcpy(out + 8, rows[r][1], sizeof(V8));
    std::memcpy(C + (ib + r) * N + jb, out, nc * sizeof(float));
  }
}

// The tile walk, compiled twice below: for baseline x86-64 and with AVX2 enabled.
__attribute__((always_inline)) inline void matmul_tile_body(
    float* __restrict C, const float* __restrict A, const float* __restrict B,
    const float* __restrict bias, std::size_t N, std::size_t K, std::size_t i0, std::size_t i1,
    std::size_t j0, std::size_t j1) {
  for (std::size_t jb = j0; jb < j1; jb += kTileN) {
    const std::size_t nc = std::min(kTileN, j1 - jb);
    for (std::size_t ib = i0; ib < i1; ib += kTileM) {
      const std::size_t nr = std::min(kTileM, i1 - ib);
      if (nc == kTileN) {
        micro_tile<true>(C, A, B, bias, N, K, ib, nr, jb, nc);
      } else {
        micro_tile<false>(C, A, B, bias, N, K, ib, nr, jb, nc);
      }
    }
  }
}

using MatmulTileFn = void (*)(float* __restrict, const float* __restrict, const float* __restrict,
                              const float* __restrict, std::size_t, std::size_t, std::size_t,
                              std::size_t, std::size_t, std::size_t);

void matmul_tile_baseline(float* __restrict C, const float* __restrict A, const float* __restrict B,
                          const float* __restrict bias, std::size_t N, std::size_t K,
                          std::size_t i0, std::size_t i1, std::size_t j0, std::size_t j1) {
  matmul_tile_body(C, A, B, bias, N, K, i0, i1, j0, j1);
}

__attribute__((target("avx2"))) void matmul_tile_avx2(float* __restrict C,
                                                      const float* __restrict A,
                                                      const float* __restrict B,
                                                      const float* __restrict bias, std::size_t N,
                                                      std::size_t K, std::size_t i0, std::size_t i1,
                                                      std::size_t j0, std::size_t j1) {
  matmul_tile_body(C, A, B, bias, N, K, i0, i1, j0, j1);
}

// The variant is chosen by the library's rule (zero::best_isa(): what the CPU runs, capped by
// ZERO_ISA), once, through a plain function pointer. Not target_clones: its ifunc resolver runs
// while the dynamic loader relocates the program, before a sanitizer runtime is initialised, and
// under TSan every program linked with this model crashed at load.
MatmulTileFn matmul_tile_for_cpu() {
  static const MatmulTileFn fn =
      best_isa() >= Isa::kAvx2 ? &matmul_tile_avx2 : &matmul_tile_baseline;
  return fn;
}

void matmul(float* C, const float* A, const float* B, const float* bias, std::size_t M,
            std::size_t N, std::size_t K) {
  const MatmulTileFn matmul_tile = matmul_tile_for_cpu();
  // Tasks of at least 8 column blocks (128 columns) x enough 4-row tiles for ~64k multiply-adds.
  constexpr std::size_t kColGrain = 8;
  const std::size_t row_grain = std::max<std::size_t>(
      1, (std::size_t{1} << 16) / (kTileM * kTileN * kColGrain * std::max<std::size_t>(K, 1)));
  tbb::parallel_for(tbb::blocked_range2d<std::size_t>(0, (M + kTileM - 1) / kTileM, row_grain, 0,
                                                      (N + kTileN - 1) / kTileN, kColGrain),
                    [&](const tbb::blocked_range2d<std::size_t>& r) {
                      matmul_tile(C, A, B, bias, N, K, r.rows().begin() * kTileM,
                                  std::min(M, r.rows().end() * kTileM), r.cols().begin() * kTileN,
                                  std::min(N, r.cols().end() * kTileN));
                    });
}

// out[c, r] = in[r, c]: in is rows x cols.
void transpose(float* out, const float* in, std::size_t rows, std::size_t cols) {
  constexpr std::size_t kB = 32;
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, (rows + kB - 1) / kB),
                    [&](const tbb::blocked_range<std::size_t>& rb) {
                      for (std::size_t bi = rb.begin(); bi < rb.end(); ++bi) {
                        const std::size_t r0 = bi * kB, r1 = std::min(rows, r0 + kB);
                        for (std::size_t c0 = 0; c0 < cols; c0 += kB) {
                          const std::size_t c1 = std::min(cols, c0 + kB);
                          for (std::size_t r = r0; r < r1; ++r) {
                            for (std::size_t c = c0; c < c1; ++c)
                              out[c * rows + r] = in[r * cols + c];
                          }
                        }
                      }
                    });
}

// out[n] = sum_{m ascending} in[m, n]: the bias gradient. Column blocks in parallel.
void column_sum(float* out, const float* in, std::size_t rows, std::size_t cols) {
  constexpr std::size_t kB = 64;
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, (cols + kB - 1) / kB),
                    [&](const tbb::blocked_range<std::size_t>& cb) {
                      const std::size_t c0 = cb.begin() * kB, c1 = std::min(cols, cb.end() * kB);
                      for (std::size_t c = c0; c < c1; ++c) out[c] = 0.0f;
                      for (std::size_t m = 0; m < rows; ++m) {
                        const float* row = in + m * cols;
                        for (std::size_t c = c0; c < c1; ++c) out[c] += row[c];
                      }
                    });
}

template <typename F>
void for_rows(std::size_t rows, std::size_t per_row, F&& f) {
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, rows, grain_for(per_row)),
                    [&](const tbb::blocked_range<std::size_t>& r) {
                      for (std::size_t m = r.begin(); m < r.end(); ++m) f(m);
                    });
}

// ---------------------------------------------------------------------------------------------
// LayerNorm (Ba et al. 2016) over the last dimension C.

void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, std::size_t M, std::size_t C) {
  for_rows(M, C, [&](std::size_t m) {
    const float* xr = x + m * C;
    float s = 0.0f;
    for (std::size_t c = 0; c < C; ++c) s += xr[c];
    const float mu = s / static_cast<float>(C);
    float v = 0.0f;
    for (std::size_t c = 0; c < C; ++c) v += (xr[c] - mu) * (xr[c] - mu);
    const float rs = 1.0f / std::sqrt(v / static_cast<float>(C) + kLnEps);
    float* o = out + m * C;
    for (std::size_t c = 0; c < C; ++c) o[c] = (xr[c] - mu) * rs * w[c] + b[c];
    if (mean != nullptr) mean[m] = mu;
    if (rstd != nullptr) rstd[m] = rs;
  });
}

// dx = dres + dLN/dx . dy (dres may be null), dw, db: the parameter gradients (overwritten).
void layernorm_backward(float* dx, float* dw, float* db, const float* dres, const float* dy,
                        const float* x, const float* mean, const float* rstd, const float* w,
                        std::size_t M, std::size_t C) {
  const float inv_c = 1.0f / static_cast<float>(C);
  for_rows(M, 4 * C, [&](std::size_t m) {
    const float* xr = x + m * C;
    const float* g = dy + m * C;
    const float mu = mean[m], rs = rstd[m];
    float sum_d = 0.0f, sum_dx = 0.0f;
    for (std::size_t c = 0; c < C; ++c) {
      const float d = g[c] * w[c];
      sum_d += d;
      sum_dx += d * (xr[c] - mu) * rs;
    }
    const float mean_d = sum_d * inv_c, mean_dx = sum_dx * inv_c;
    float* o = dx + m * C;
    for (std::size_t c = 0; c < C; ++c) {
      const float xhat = (xr[c] - mu) * rs;
      const float v = rs * (g[c] * w[c] - mean_d - xhat * mean_dx);
      o[c] = dres != nullptr ? dres[m * C + c] + v : v;
    }
  });
  constexpr std::size_t kB = 64;
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, (C + kB - 1) / kB),
                    [&](const tbb::blocked_range<std::size_t>& cb) {
                      const std::size_t c0 = cb.begin() * kB, c1 = std::min(C, cb.end() * kB);
                      for (std::size_t c = c0; c < c1; ++c) dw[c] = db[c] = 0.0f;
                      for (std::size_t m = 0; m < M; ++m) {
                        const float mu = mean[m], rs = rstd[m];
                        for (std::size_t c = c0; c < c1; ++c) {
                          const float g = dy[m * C + c];
                          dw[c] += g * (x[m * C + c] - mu) * rs;
                          db[c] += g;
                        }
                      }
                    });
}

// ---------------------------------------------------------------------------------------------
// GELU (gpt_math.hpp, shared with the CUDA kernels).

void gelu_forward(float* out, const float* x, std::size_t n) {
  for_rows(n, 16, [&](std::size_t i) { out[i] = math::gelu(x[i]); });
}

// d *= gelu'(x), in place.
void gelu_backward(float* d, const float* x, std::size_t n) {
  for_rows(n, 16, [&](std::size_t i) { d[i] *= math::gelu_grad(x[i]); });
}

// ---------------------------------------------------------------------------------------------
// Causal multi-head self-attention (Vaswani et al. 2017). qkv is [B*T, 3C] with Q, K, V in
// column blocks [0, C), [C, 2C), [2C, 3C), head h at columns h*hd within each. One task per
// (sequence, head): it owns that head's slice of every output.

struct AttnShape {
  std::size_t B, T, C, H, hd;
  float scale;
};

void attention_forward(float* y, float* att, const float* qkv, const AttnShape& s) {
  const std::size_t C3 = 3 * s.C;
  tbb::parallel_for(std::size_t{0}, s.B * s.H, [&](std::size_t bh) {
    const std::size_t b = bh / s.H, h = bh % s.H;
    for (std::size_t t = 0; t < s.T; ++t) {
      const float* q = qkv + (b * s.T + t) * C3 + h * s.hd;
      float* p = att + (bh * s.T + t) * s.T;
      float mx = -std::numeric_limits<float>::infinity();
      for (std::size_t t2 = 0; t2 <= t; ++t2) {
        const float* k = qkv + (b * s.T + t2) * C3 + s.C + h * s.hd;
        float dot = 0.0f;
        for (std::size_t i = 0; i < s.hd; ++i) dot += q[i] * k[i];
        p[t2] = dot * s.scale;
        mx = std::max(mx, p[t2]);
      }
      float sum = 0.0f;
      for (std::size_t t2 = 0; t2 <= t; ++t2) {
        p[t2] = std::exp(p[t2] - mx);
        sum += p[t2];
      }
      const float inv = 1.0f / sum;
      for (std::size_t t2 = 0; t2 <= t; ++t2) p[t2] *= inv;
      for (std::size_t t2 = t + 1; t2 < s.T; ++t2) p[t2] = 0.0f;
      float* o = y + (b * s.T + t) * s.C + h * s.hd;
      for (std::size_t i = 0; i < s.hd; ++i) o[i] = 0.0f;
      for (std::size_t t2 = 0; t2 <= t; ++t2) {
        const float* v = qkv + (b * s.T + t2) * C3 + 2 * s.C + h * s.hd;
        for (std::size_t i = 0; i < s.hd; ++i) o[i] += p[t2] * v[i];
      }
    }
  });
}

// dqkv (overwritten) from dy and the saved probabilities.
void attention_backward(float* dqkv, const float* dy, const float* qkv, const float* att,
                        const AttnShape& s) {
  const std::size_t C3 = 3 * s.C;
  tbb::parallel_for(std::size_t{0}, s.B * s.H, [&](std::size_t bh) {
    const std::size_t b = bh / s.H, h = bh % s.H;
    std::vector<float> ds(s.T * s.T, 0.0f);  // dL/d(pre-softmax score), lower triangle
    auto Q = [&](std::size_t t) { return qkv + (b * s.T + t) * C3 + h * s.hd; };
    auto K = [&](std::size_t t) { return Q(t) + s.C; };
    auto Vv = [&](std::size_t t) { return Q(t) + 2 * s.C; };
    auto DY = [&](std::size_t t) { return dy + (b * s.T + t) * s.C + h * s.hd; };
    auto D = [&](std::size_t t) { return dqkv + (b * s.T + t) * C3 + h * s.hd; };
    for (std::size_t t = 0; t < s.T; ++t) {
      const float* p = att + (bh * s.T + t) * s.T;
      float* dsr = ds.data() + t * s.T;
      float pdp = 0.0f;  // sum_t2 p * dp: softmax backward
      for (std::size_t t2 = 0; t2 <= t; ++t2) {
        const float* v = Vv(t2);
        const float* g = DY(t);
        float dp = 0.0f;
        for (std::size_t i = 0; i < s.hd; ++i) dp += g[i] * v[i];
        dsr[t2] = dp;
        pdp += p[t2] * dp;
      }
      for (std::size_t t2 = 0; t2 <= t; ++t2) dsr[t2] = p[t2] * (dsr[t2] - pdp);
    }
    for (std::size_t t = 0; t < s.T; ++t) {
      // dq_t = scale sum_{t2 <= t} ds[t,t2] k_t2
      float* dq = D(t);
      for (std::size_t i = 0; i < s.hd; ++i) dq[i] = 0.0f;
      for (std::size_t t2 = 0; t2 <= t; ++t2) {
        const float w = ds[t * s.T + t2];
        const float* k = K(t2);
        for (std::size_t i = 0; i < s.hd; ++i) dq[i] += w * k[i];
      }
      for (std::size_t i = 0; i < s.hd; ++i) dq[i] *= s.scale;
      // dk_t = scale sum_{t3 >= t} ds[t3,t] q_t3;  dv_t = sum_{t3 >= t} p[t3,t] dy_t3
      float* dk = dq + s.C;
      float* dv = dq + 2 * s.C;
      for (std::size_t i = 0; i < s.hd; ++i) dk[i] = dv[i] = 0.0f;
      for (std::size_t t3 = t; t3 < s.T; ++t3) {
        const float w = ds[t3 * s.T + t];
        const float pw = att[(bh * s.T + t3) * s.T + t];
        const float* q = Q(t3);
        const float* g = DY(t3);
        for (std::size_t i = 0; i < s.hd; ++i) {
          dk[i] += w * q[i];
          dv[i] += pw * g[i];
        }
      }
      for (std::size_t i = 0; i < s.hd; ++i) dk[i] *= s.scale;
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Parameter and gradient access in f32 whatever the working dtype.

// f32 pointers to a gathered unit's parameters: the engine's own memory when W is f32, else a
// converted copy in `scratch`.
std::vector<const float*> load_params(const GatherGuard& g, int count, float* scratch) {
  std::vector<const float*> p(static_cast<std::size_t>(count));
  std::size_t off = 0;
  for (int i = 0; i < count; ++i) {
    const View v = g.param(i);
    if (v.dtype == DType::kF32) {
      p[static_cast<std::size_t>(i)] = static_cast<const float*>(v.data);
    } else {
      convert(v.data, v.dtype, scratch + off, DType::kF32, v.count);
      p[static_cast<std::size_t>(i)] = scratch + off;
      off += v.count;
    }
  }
  return p;
}

// Where a unit's gradients are computed: straight into the engine's views when W is f32, else
// into f32 `scratch` and converted at commit(). Every gradient is written whole (not
// accumulated), so the engine's zeroing is not relied on, except for wte (see the head).
class GradSink {
 public:
  GradSink(Engine& e, UnitId u, int count, float* scratch) {
    std::size_t off = 0;
    for (int i = 0; i < count; ++i) {
      const View v = e.grad(u, i);
      views_.push_back(v);
      if (v.dtype == DType::kF32) {
        ptrs_.push_back(static_cast<float*>(v.data));
      } else {
        ptrs_.push_back(scratch + off);
        off += v.count;
      }
    }
  }
  float* operator[](int i) const { return ptrs_[static_cast<std::size_t>(i)]; }
  void commit(UnitId u, const GradTap& tap) const {
    for (std::size_t i = 0; i < views_.size(); ++i) {
      const View& v = views_[i];
      if (v.dtype != DType::kF32) convert(ptrs_[i], DType::kF32, v.data, v.dtype, v.count);
      if (tap) tap(u, static_cast<int>(i), v);
    }
  }

 private:
  std::vector<View> views_;
  std::vector<float*> ptrs_;
};

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

// ---- configuration

void GptConfig::validate() const {
  ZERO_CHECK(vocab >= 2, kInvalidArgument, "GptConfig.vocab = ", vocab, ": need >= 2");
  ZERO_CHECK(seq >= 1, kInvalidArgument, "GptConfig.seq = ", seq, ": need >= 1");
  ZERO_CHECK(layers >= 1, kInvalidArgument, "GptConfig.layers = ", layers, ": need >= 1");
  ZERO_CHECK(heads >= 1, kInvalidArgument, "GptConfig.heads = ", heads, ": need >= 1");
  ZERO_CHECK(dim >= 1 && dim % heads == 0, kInvalidArgument, "GptConfig.dim = ", dim,
             ": need a positive multiple of heads (", heads, ")");
  ZERO_CHECK(frozen_units >= 0 && frozen_units <= layers, kInvalidArgument,
             "GptConfig.frozen_units = ", frozen_units, ": need 0..", layers,
             " (the embedding and up to layers - 1 blocks; a block must train)");
}

std::size_t GptConfig::num_params() const {
  const std::size_t C = static_cast<std::size_t>(dim);
  const std::size_t block =
      2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + 4 * C * C + 4 * C + 4 * C * C + C;
  return static_cast<std::size_t>(vocab) * C + static_cast<std::size_t>(seq) * C +
         static_cast<std::size_t>(layers) * block + 2 * C;
}

std::size_t GptConfig::trainable_params() const {
  if (frozen_units == 0) return num_params();
  GptConfig top = *this;
  top.layers = layers - frozen_blocks();
  return top.num_params() - static_cast<std::size_t>(vocab + seq) * static_cast<std::size_t>(dim);
}

void check_batch(const GptConfig& config, const TokenBatch& batch, const char* model) {
  ZERO_CHECK(batch.rows >= 1 && batch.seq >= 1 && batch.seq <= config.seq, kInvalidArgument, model,
             ": batch of ", batch.rows, " rows x seq ", batch.seq, "; the model's seq is ",
             config.seq);
  ZERO_CHECK(batch.tokens.size() ==
                 static_cast<std::size_t>(batch.rows) * static_cast<std::size_t>(batch.seq + 1),
             kInvalidArgument, model, ": batch holds ", batch.tokens.size(),
             " tokens; rows x (seq + 1) = ", batch.rows * (batch.seq + 1));
  for (std::int32_t t : batch.tokens) {
    ZERO_CHECK(t >= 0 && t < config.vocab, kInvalidArgument, model, ": token ", t,
               " outside the vocabulary [0, ", config.vocab, ")");
  }
}

TokenBatch concat(const std::vector<TokenBatch>& parts) {
  TokenBatch out;
  for (const TokenBatch& p : parts) {
    ZERO_CHECK(out.rows == 0 || p.seq == out.seq, kInvalidArgument, "concat: batches of seq ",
               out.seq, " and ", p.seq);
    out.seq = p.seq;
    out.rows += p.rows;
    out.tokens.insert(out.tokens.end(), p.tokens.begin(), p.tokens.end());
  }
  return out;
}

// ---- the corpus

CharCorpus CharCorpus::from_file(const std::string& path, double val_fraction) {
  std::ifstream in(path, std::ios::binary);
  ZERO_CHECK(in.good(), kIO, "cannot open corpus file '", path, "'");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ZERO_CHECK(!in.bad(), kIO, "cannot read corpus file '", path, "'");
  return from_text(std::move(text), val_fraction);
}

CharCorpus CharCorpus::from_text(std::string text, double val_fraction) {
  ZERO_CHECK(val_fraction >= 0.0 && val_fraction < 1.0, kInvalidArgument,
             "CharCorpus: val_fraction ", val_fraction, " is not in [0, 1)");
  ZERO_CHECK(text.size() >= 16, kInvalidArgument, "CharCorpus: the text has only ", text.size(),
             " characters");
  CharCorpus c;
  bool seen[256] = {};
  for (char ch : text) seen[static_cast<unsigned char>(ch)] = true;
  std::int32_t id[256];
  for (int b = 0; b < 256; ++b) {
    if (seen[b]) {
      id[b] = static_cast<std::int32_t>(c.chars_.size());
      c.chars_.push_back(static_cast<char>(b));
    }
  }
  c.tokens_.reserve(text.size());
  for (char ch : text) c.tokens_.push_back(id[static_cast<unsigned char>(ch)]);
  c.train_size_ =
      text.size() - static_cast<std::size_t>(val_fraction * static_cast<double>(text.size()));
  return c;
}

std::size_t CharCorpus::size(Split s) const noexcept {
  return s == Split::kTrain ? train_size_ : tokens_.size() - train_size_;
}

std::int32_t CharCorpus::encode(char c) const {
  const auto it = std::lower_bound(chars_.begin(), chars_.end(), c, [](char a, char b) {
    return static_cast<unsigned char>(a) < static_cast<unsigned char>(b);
  });
  ZERO_CHECK(it != chars_.end() && *it == c, kInvalidArgument, "CharCorpus::encode: byte ",
             static_cast<int>(static_cast<unsigned char>(c)), " is not in the corpus");
  return static_cast<std::int32_t>(it - chars_.begin());
}

double CharCorpus::unigram_entropy() const {
  std::vector<double> count(chars_.size(), 0.0);
  for (std::size_t i = 0; i < train_size_; ++i) count[static_cast<std::size_t>(tokens_[i])] += 1;
  double h = 0.0;
  for (double n : count) {
    if (n > 0) {
      const double p = n / static_cast<double>(train_size_);
      h -= p * std::log(p);
    }
  }
  return h;
}

TokenBatch CharCorpus::batch(Split split, int rows, int seq, int rank, std::uint64_t step,
                             std::uint64_t micro, std::uint64_t seed) const {
  const std::size_t base = split == Split::kTrain ? 0 : train_size_;
  const std::size_t len = size(split);
  ZERO_CHECK(rows >= 1 && seq >= 1 && rank >= 0, kInvalidArgument, "CharCorpus::batch: rows ", rows,
             ", seq ", seq, ", rank ", rank);
  ZERO_CHECK(len > static_cast<std::size_t>(seq) + 1, kInvalidArgument, "CharCorpus::batch: the ",
             split == Split::kTrain ? "training" : "validation", " split has ", len,
             " tokens; windows of ", seq + 1, " need more");
  TokenBatch b;
  b.rows = rows;
  b.seq = seq;
  const std::size_t w = static_cast<std::size_t>(seq) + 1;
  b.tokens.resize(static_cast<std::size_t>(rows) * w);
  const std::uint64_t starts = len - w + 1;
  for (int j = 0; j < rows; ++j) {
    const std::uint64_t g = static_cast<std::uint64_t>(rank) * static_cast<std::uint64_t>(rows) +
                            static_cast<std::uint64_t>(j);
    std::uint64_t h = splitmix64(seed ^ (split == Split::kTrain ? 0x7472u : 0x76616cu));
    h = splitmix64(h ^ step);
    h = splitmix64(h ^ micro);
    h = splitmix64(h ^ g);
    const std::size_t at = base + static_cast<std::size_t>(h % starts);
    std::copy_n(tokens_.begin() + static_cast<std::ptrdiff_t>(at), w,
                b.tokens.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(j) * w));
  }
  return b;
}

// ---- the model: buffers

// Persistent per-rank scratch, sized for the largest batch seen (kOther).
struct GptModel::Workspace {
  std::size_t rows = 0;  // M it is sized for
  Buffer params, grads, wt, dyt, dx_a, dx_b, dmid, d1, d2, d3, tmp;
  float* f(Buffer& b) { return b.as<float>(); }
};

// One block's saved activations, in one Buffer (kActivations). M = B*T rows.
struct GptModel::BlockActs {
  Buffer buf;
  float *ln1_mean, *ln1_rstd, *h1, *qkv, *att, *y, *x_mid, *ln2_mean, *ln2_rstd, *h2, *u, *g;

  // Sizes in floats, in the order they are laid out.
  static std::vector<std::size_t> sizes(std::size_t B, std::size_t T, std::size_t C,
                                        std::size_t H) {
    const std::size_t M = B * T;
    return {M, M, M * C, 3 * M * C, B * H * T * T, M * C, M * C, M, M, M * C, 4 * M * C, 4 * M * C};
  }
  static std::size_t bytes(std::size_t B, std::size_t T, std::size_t C, std::size_t H) {
    std::size_t n = 0;
    for (std::size_t s : sizes(B, T, C, H)) n += round_up(s, kAlignFloats);
    return n * sizeof(float);
  }
  void bind(std::size_t B, std::size_t T, std::size_t C, std::size_t H) {
    float** slots[] = {&ln1_mean, &ln1_rstd, &h1,       &qkv, &att, &y,
                       &x_mid,    &ln2_mean, &ln2_rstd, &h2,  &u,   &g};
    float* p = buf.as<float>();
    const auto sz = sizes(B, T, C, H);
    for (std::size_t i = 0; i < sz.size(); ++i) {
      *slots[i] = p;
      p += round_up(sz[i], kAlignFloats);
    }
  }
};

struct GptModel::BlockParams : BlockTensors {
  using BlockTensors::BlockTensors;
};

struct GptModel::BlockGrads {
  float *ln1_w, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b, *ln2_w, *ln2_b, *fc_w, *fc_b, *fcproj_w,
      *fcproj_b;
  explicit BlockGrads(const GradSink& s)
      : ln1_w(s[0]),
        ln1_b(s[1]),
        qkv_w(s[2]),
        qkv_b(s[3]),
        proj_w(s[4]),
        proj_b(s[5]),
        ln2_w(s[6]),
        ln2_b(s[7]),
        fc_w(s[8]),
        fc_b(s[9]),
        fcproj_w(s[10]),
        fcproj_b(s[11]) {}
};

GptModel::GptModel(const GptConfig& config, MemoryTracker& tracker)
    : cfg_(config), tracker_(&tracker), ws_(std::make_unique<Workspace>()) {
  cfg_.validate();
}

GptModel::~GptModel() = default;

Buffer GptModel::alloc_activations(std::size_t bytes) {
  Buffer b = Buffer::host(*tracker_, MemCategory::kActivations, bytes);
  act_current_ += bytes;
  act_peak_ = std::max(act_peak_, act_current_);
  return b;
}

void GptModel::free_activations(Buffer& b) {
  act_current_ -= b.size();
  b.reset();
}

void GptModel::set_checkpointing(const CheckpointSpec& spec) {
  // Validates the policy against the layers it checkpoints (those below the trainable ones run as
  // evaluation does).
  (void)segment_starts(cfg_.layers - cfg_.frozen_blocks(), spec);
  ckpt_ = spec;
}

std::size_t GptModel::activation_bytes(int rows, int seq, const CheckpointSpec& spec) const {
  // Replays the kActivations allocations of run() and the Checkpointer, from the shapes.
  const std::size_t B = static_cast<std::size_t>(rows), T = static_cast<std::size_t>(seq);
  const std::size_t C = static_cast<std::size_t>(cfg_.dim),
                    V = static_cast<std::size_t>(cfg_.vocab);
  const std::size_t M = B * T, f = sizeof(float);
  const std::size_t mc = M * C * f;
  const std::size_t layer = mc + BlockActs::bytes(B, T, C, static_cast<std::size_t>(cfg_.heads));
  const std::size_t stats = round_up(M, kAlignFloats) * f;
  const int K = cfg_.frozen_blocks();
  const int L = cfg_.layers - K;  // the Checkpointer's layers: the trainable blocks
  std::size_t cur = 0, peak = 0;
  auto add = [&](std::size_t b) { peak = std::max(peak, cur += b); };
  auto sub = [&](std::size_t b) { cur -= b; };
  const std::vector<int> starts = segment_starts(L, spec);
  const bool plain = spec.policy == CheckpointPolicy::kNone;
  auto seg_end = [&](std::size_t s) { return s + 1 < starts.size() ? starts[s + 1] : L; };
  // forward: embedding output, the blocks' output, the frozen blocks (their ping-pong buffer;
  // each block's input copy and saved tensors freed at once), the Checkpointer's forward
  add(mc);
  add(mc);
  if (K > 0) add(mc);
  for (int l = 0; l < K; ++l) {
    add(layer);
    sub(layer);
  }
  if (plain) {
    add(2 * mc);
    for (int l = 0; l < L; ++l) add(layer);
  } else {
    for (std::size_t s = 0; s < starts.size(); ++s) {
      add(mc);  // the segment's kept input
      if (s == 0) add(2 * mc);
      for (int l = starts[s]; l < seg_end(s); ++l) {
        add(layer);
        sub(layer);
      }
    }
  }
  if (K > 0) sub(mc);
  sub(mc);  // the embedding output (each layer kept its own input)
  // final LayerNorm, head
  add(2 * stats + mc);
  add(M * V * f);
  sub(M * V * f);
  sub(mc);
  // backward: final LayerNorm, then the Checkpointer's backward
  sub(2 * stats + mc);
  add(2 * mc);
  if (plain) {
    for (int l = L - 1; l >= 0; --l) sub(layer);
  } else {
    for (std::size_t s = starts.size(); s-- > 0;) {
      for (int l = starts[s]; l < seg_end(s); ++l) add(layer);
      sub(mc);
      for (int l = seg_end(s) - 1; l >= starts[s]; --l) sub(layer);
    }
  }
  return peak;
}

std::size_t GptModel::workspace_bytes(int rows, int seq) const {
  const std::size_t M = static_cast<std::size_t>(rows) * static_cast<std::size_t>(seq);
  const std::size_t C = static_cast<std::size_t>(cfg_.dim),
                    V = static_cast<std::size_t>(cfg_.vocab);
  const std::size_t T = static_cast<std::size_t>(cfg_.seq);
  // The largest unit's parameters (as run() sizes them): a block, or the embedding.
  const std::size_t block = 12 * C * C + 13 * C;
  const std::size_t max_unit = std::max({block, V * C + T * C, 2 * C});
  const std::size_t wide = std::max(4 * C, V);
  const std::size_t floats = 2 * max_unit + std::max(4 * C * C, V * C) + wide * M + 2 * M * C +
                             M * C + 4 * M * C + 3 * M * C + M * C + M * C;
  return floats * sizeof(float);
}

std::vector<UnitId> GptModel::gather_order(const GptConfig& c, const CheckpointSpec& spec) {
  // Unit ids as declare() assigns them on a fresh engine: embedding 0, blocks 1..L, ln_f L+1.
  // Backward runs the trainable blocks K..L-1 only (the Checkpointer's layers 0..L-K-1).
  const int L = c.layers, K = c.frozen_blocks();
  std::vector<UnitId> order{0};
  for (int l = 0; l < L; ++l) order.push_back(1 + l);
  order.push_back(L + 1);  // final LayerNorm
  order.push_back(0);      // the tied head
  order.push_back(L + 1);  // final LayerNorm backward
  const std::vector<int> starts = segment_starts(L - K, spec);
  if (spec.policy == CheckpointPolicy::kNone) {
    for (int l = L - 1; l >= K; --l) order.push_back(1 + l);
  } else {
    for (std::size_t s = starts.size(); s-- > 0;) {
      const int end = s + 1 < starts.size() ? starts[s + 1] : L - K;
      for (int l = starts[s]; l < end; ++l) order.push_back(1 + K + l);       // recompute
      for (int l = end - 1; l >= starts[s]; --l) order.push_back(1 + K + l);  // backward
    }
  }
  return order;
}

// ---- the model: engine units and initialisation

void GptModel::declare(Engine& e) {
  ZERO_CHECK(!declared_, kInvalidArgument, "GptModel::declare called twice");
  const std::int64_t V = cfg_.vocab, T = cfg_.seq, C = cfg_.dim;
  // The first frozen_units units frozen (GptConfig): their parameters trainable = false.
  auto trains = [&](int unit) { return unit >= cfg_.frozen_units; };
  first_unit_ =
      e.add_unit({"embedding", {{"wte", {V, C}, 0, trains(0)}, {"wpe", {T, C}, 0, trains(0)}}});
  for (int l = 0; l < cfg_.layers; ++l) {
    UnitSpec block{"block" + std::to_string(l),
                   {{"ln1_w", {C}},
                    {"ln1_b", {C}},
                    {"qkv_w", {3 * C, C}},
                    {"qkv_b", {3 * C}},
                    {"proj_w", {C, C}},
                    {"proj_b", {C}},
                    {"ln2_w", {C}},
                    {"ln2_b", {C}},
                    {"fc_w", {4 * C, C}},
                    {"fc_b", {4 * C}},
                    {"fcproj_w", {C, 4 * C}},
                    {"fcproj_b", {C}}}};
    for (ParamSpec& p : block.params) p.trainable = trains(1 + l);
    e.add_unit(std::move(block));
  }
  e.add_unit({"ln_f", {{"lnf_w", {C}}, {"lnf_b", {C}}}});
  declared_ = true;
}

namespace {
// Fills every parameter of the model's units with `fill(param name, values)`, then set_param.
template <typename F>
void set_all(Engine& e, UnitId first, int units, F&& fill) {
  for (UnitId u = first; u < first + units; ++u) {
    const UnitSpec& spec = e.unit(u);
    for (std::size_t i = 0; i < spec.params.size(); ++i) {
      std::vector<float> v(spec.params[i].numel());
      fill(spec.params[i].name, v);
      e.set_param(u, static_cast<int>(i), v.data(), v.size());
    }
  }
}
bool is_gain(const std::string& name) {
  return name == "ln1_w" || name == "ln2_w" || name == "lnf_w";
}
bool is_bias(const std::string& name) { return name.size() > 2 && name.ends_with("_b"); }
}  // namespace

void GptModel::init(Engine& e, std::uint64_t seed) const {
  ZERO_CHECK(declared_, kInvalidArgument, "GptModel::init before declare");
  std::mt19937_64 rng(seed);
  const float resid_std = 0.02f / std::sqrt(2.0f * static_cast<float>(cfg_.layers));
  set_all(e, first_unit_, cfg_.layers + 2, [&](const std::string& name, std::vector<float>& v) {
    if (is_gain(name)) {
      std::fill(v.begin(), v.end(), 1.0f);
    } else if (is_bias(name)) {
      std::fill(v.begin(), v.end(), 0.0f);
    } else {
      std::normal_distribution<float> d(0.0f,
                                        name == "proj_w" || name == "fcproj_w" ? resid_std : 0.02f);
      for (float& x : v) x = d(rng);
    }
  });
}

void GptModel::init_random(Engine& e, std::uint64_t seed, float stddev) const {
  ZERO_CHECK(declared_, kInvalidArgument, "GptModel::init_random before declare");
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, stddev);
  set_all(e, first_unit_, cfg_.layers + 2, [&](const std::string& name, std::vector<float>& v) {
    for (float& x : v) x = (is_gain(name) ? 1.0f : 0.0f) + d(rng);
  });
}

// ---- the model: one block

void GptModel::block_forward(const BlockParams& p, const float* x_in, float* x_out, BlockActs& a,
                             int rows, int seq) {
  const std::size_t B = static_cast<std::size_t>(rows), T = static_cast<std::size_t>(seq);
  const std::size_t C = static_cast<std::size_t>(cfg_.dim),
                    H = static_cast<std::size_t>(cfg_.heads);
  const std::size_t M = B * T;
  Workspace& w = *ws_;
  float* wt = w.f(w.wt);
  float* tmp = w.f(w.tmp);
  // x_mid = x_in + proj(attn(LN1(x_in)))
  layernorm_forward(a.h1, a.ln1_mean, a.ln1_rstd, x_in, p.ln1_w, p.ln1_b, M, C);
  transpose(wt, p.qkv_w, 3 * C, C);
  matmul(a.qkv, a.h1, wt, p.qkv_b, M, 3 * C, C);
  const AttnShape s{B, T, C, H, C / H, 1.0f / std::sqrt(static_cast<float>(C / H))};
  attention_forward(a.y, a.att, a.qkv, s);
  transpose(wt, p.proj_w, C, C);
  matmul(tmp, a.y, wt, p.proj_b, M, C, C);
  for_rows(M * C, 1, [&](std::size_t i) { a.x_mid[i] = x_in[i] + tmp[i]; });
  // x_out = x_mid + fcproj(GELU(fc(LN2(x_mid))))
  layernorm_forward(a.h2, a.ln2_mean, a.ln2_rstd, a.x_mid, p.ln2_w, p.ln2_b, M, C);
  transpose(wt, p.fc_w, 4 * C, C);
  matmul(a.u, a.h2, wt, p.fc_b, M, 4 * C, C);
  gelu_forward(a.g, a.u, M * 4 * C);
  transpose(wt, p.fcproj_w, C, 4 * C);
  matmul(tmp, a.g, wt, p.fcproj_b, M, C, 4 * C);
  for_rows(M * C, 1, [&](std::size_t i) { x_out[i] = a.x_mid[i] + tmp[i]; });
}

void GptModel::block_backward(const BlockParams& p, const BlockActs& a, const float* x_in,
                              const float* dx_out, float* dx_in, const BlockGrads& g, int rows,
                              int seq) {
  const std::size_t B = static_cast<std::size_t>(rows), T = static_cast<std::size_t>(seq);
  const std::size_t C = static_cast<std::size_t>(cfg_.dim),
                    H = static_cast<std::size_t>(cfg_.heads);
  const std::size_t M = B * T;
  Workspace& w = *ws_;
  float* dyt = w.f(w.dyt);
  float* dmid = w.f(w.dmid);
  float* d4 = w.f(w.d1);  // [M, 4C]
  float* dq = w.f(w.d2);  // [M, 3C]
  float* dc = w.f(w.d3);  // [M, C]
  // MLP branch: dW = dY^T X (sum over rows, ascending), dX = dY W.
  transpose(dyt, dx_out, M, C);
  matmul(g.fcproj_w, dyt, a.g, nullptr, C, 4 * C, M);
  column_sum(g.fcproj_b, dx_out, M, C);
  matmul(d4, dx_out, p.fcproj_w, nullptr, M, 4 * C, C);
  gelu_backward(d4, a.u, M * 4 * C);
  transpose(dyt, d4, M, 4 * C);
  matmul(g.fc_w, dyt, a.h2, nullptr, 4 * C, C, M);
  column_sum(g.fc_b, d4, M, 4 * C);
  matmul(dc, d4, p.fc_w, nullptr, M, C, 4 * C);
  layernorm_backward(dmid, g.ln2_w, g.ln2_b, dx_out, dc, a.x_mid, a.ln2_mean, a.ln2_rstd, p.ln2_w,
                     M, C);
  // Attention branch.
  transpose(dyt, dmid, M, C);
  matmul(g.proj_w, dyt, a.y, nullptr, C, C, M);
  column_sum(g.proj_b, dmid, M, C);
  matmul(dc, dmid, p.proj_w, nullptr, M, C, C);
  const AttnShape s{B, T, C, H, C / H, 1.0f / std::sqrt(static_cast<float>(C / H))};
  attention_backward(dq, dc, a.qkv, a.att, s);
  transpose(dyt, dq, M, 3 * C);
  matmul(g.qkv_w, dyt, a.h1, nullptr, 3 * C, C, M);
  column_sum(g.qkv_b, dq, M, 3 * C);
  matmul(dc, dq, p.qkv_w, nullptr, M, C, 3 * C);
  layernorm_backward(dx_in, g.ln1_w, g.ln1_b, dmid, dc, x_in, a.ln1_mean, a.ln1_rstd, p.ln1_w, M,
                     C);
}

// ---- the model: a micro-step

double GptModel::forward_backward(Engine& e, const TokenBatch& batch, const GradTap& tap) {
  act_current_ = 0;
  act_peak_ = 0;
  return run(e, batch, /*backward=*/true, tap);
}

double GptModel::forward_loss(Engine& e, const TokenBatch& batch) {
  const std::size_t keep = act_peak_;
  const double loss = run(e, batch, /*backward=*/false, {});
  act_peak_ = keep;
  return loss;
}

// The blocks as the Checkpointer's layers: forward keeps a copy of the block input and the
// block's saved tensors (kActivations), backward gathers the block again and writes its
// gradients, drop frees what forward kept.
struct GptModel::BlockLayers : CheckpointedLayers {
  BlockLayers(GptModel& m, Engine& e, const TokenBatch& batch, float* pscratch, float* gscratch,
              const GradTap& tap)
      : m(m),
        e(e),
        rows(batch.rows),
        seq(batch.seq),
        pscratch(pscratch),
        gscratch(gscratch),
        tap(tap),
        acts(static_cast<std::size_t>(m.cfg_.layers)),
        inputs(static_cast<std::size_t>(m.cfg_.layers)) {
    B = static_cast<std::size_t>(rows);
    T = static_cast<std::size_t>(seq);
    C = static_cast<std::size_t>(m.cfg_.dim);
    H = static_cast<std::size_t>(m.cfg_.heads);
  }
  void forward(int l, const float* in, float* out) override {
    const auto i = static_cast<std::size_t>(l);
    inputs[i] = m.alloc_activations(B * T * C * sizeof(float));
    std::memcpy(inputs[i].data(), in, B * T * C * sizeof(float));
    acts[i].buf = m.alloc_activations(BlockActs::bytes(B, T, C, H));
    acts[i].bind(B, T, C, H);
    GatherGuard g = e.gather(m.block_unit(l));
    TraceScope region(e.tracer(), TraceLane::kTrainer, "forward", m.block_unit(l));
    const BlockParams p(load_params(g, kBlockParams, pscratch));
    m.block_forward(p, inputs[i].as<float>(), out, acts[i], rows, seq);
  }
  void backward(int l, const float* grad_out, float* grad_in) override {
    const auto i = static_cast<std::size_t>(l);
    GatherGuard g = e.gather(m.block_unit(l));
    std::optional<TraceScope> region;
    region.emplace(e.tracer(), TraceLane::kTrainer, "backward", m.block_unit(l));
    const BlockParams p(load_params(g, kBlockParams, pscratch));
    GradSink gs(e, m.block_unit(l), kBlockParams, gscratch);
    m.block_backward(p, acts[i], inputs[i].as<float>(), grad_out, grad_in, BlockGrads(gs), rows,
                     seq);
    gs.commit(m.block_unit(l), tap);
    region.reset();
    e.grads_ready(m.block_unit(l));
  }
  void drop(int l) override {
    const auto i = static_cast<std::size_t>(l);
    if (!acts[i].buf.empty()) m.free_activations(acts[i].buf);
    if (!inputs[i].empty()) m.free_activations(inputs[i]);
  }

  GptModel& m;
  Engine& e;
  int rows, seq;
  std::size_t B = 0, T = 0, C = 0, H = 0;
  float* pscratch;
  float* gscratch;
  const GradTap& tap;
  std::vector<BlockActs> acts;
  std::vector<Buffer> inputs;
};

namespace {
// Layers first..L-1 of `inner` as layers 0..L-1-first (the trainable blocks, for the
// Checkpointer).
struct ShiftedLayers : CheckpointedLayers {
  ShiftedLayers(CheckpointedLayers& inner, int first) : inner(inner), first(first) {}
  void forward(int l, const float* in, float* out) override { inner.forward(first + l, in, out); }
  void backward(int l, const float* grad_out, float* grad_in) override {
    inner.backward(first + l, grad_out, grad_in);
  }
  void drop(int l) override { inner.drop(first + l); }
  CheckpointedLayers& inner;
  int first;
};
}  // namespace

double GptModel::run(Engine& e, const TokenBatch& batch, bool backward, const GradTap& tap) {
  ZERO_CHECK(declared_, kInvalidArgument, "GptModel: declare() the units first");
  check_batch(cfg_, batch, "GptModel");
  const std::size_t B = static_cast<std::size_t>(batch.rows),
                    T = static_cast<std::size_t>(batch.seq);
  const std::size_t C = static_cast<std::size_t>(cfg_.dim),
                    V = static_cast<std::size_t>(cfg_.vocab);
  const int L = cfg_.layers;
  const std::size_t M = B * T;
  const std::size_t f = sizeof(float);

  // Workspace for the largest batch so far (kOther; persistent).
  Workspace& w = *ws_;
  if (w.rows < M) {
    std::size_t max_unit = 0;
    for (UnitId u = first_unit_; u <= final_unit(); ++u) {
      std::size_t n = 0;
      for (const ParamSpec& ps : e.unit(u).params) n += ps.numel();
      max_unit = std::max(max_unit, n);
    }
    const std::size_t wide = std::max({4 * C, V});
    auto host = [&](std::size_t floats) {
      return Buffer::host(*tracker_, MemCategory::kOther, floats * f);
    };
    w = Workspace{};
    w.rows = M;
    w.params = host(max_unit);
    w.grads = host(max_unit);
    w.wt = host(std::max(4 * C * C, V * C));
    w.dyt = host(wide * M);
    w.dx_a = host(M * C);
    w.dx_b = host(M * C);
    w.dmid = host(M * C);
    w.d1 = host(4 * M * C);
    w.d2 = host(3 * M * C);
    w.d3 = host(M * C);
    w.tmp = host(M * C);
  }
  float* pscratch = w.f(w.params);
  float* gscratch = w.f(w.grads);

  // ---- forward: embedding
  std::vector<Buffer> resid(static_cast<std::size_t>(L) + 1);  // resid[l]: block l's input
  auto R = [&](int l) { return resid[static_cast<std::size_t>(l)].as<float>(); };
  resid[0] = alloc_activations(M * C * f);
  {
    GatherGuard g = e.gather(embedding_unit());
    TraceScope region(e.tracer(), TraceLane::kTrainer, "forward", embedding_unit());
    const auto p = load_params(g, 2, pscratch);
    float* x = R(0);
    for_rows(M, C, [&](std::size_t m) {
      const std::size_t tok =
          static_cast<std::size_t>(batch.input(static_cast<int>(m / T), static_cast<int>(m % T)));
      const float* te = p[0] + tok * C;
      const float* pe = p[1] + (m % T) * C;
      for (std::size_t c = 0; c < C; ++c) x[m * C + c] = te[c] + pe[c];
    });
  }
  // ---- forward: blocks. Training runs them through the Checkpointer (which keeps what the
  // checkpointing policy keeps); evaluation keeps nothing.
  BlockLayers layers(*this, e, batch, pscratch, gscratch, tap);
  const int K = cfg_.frozen_blocks();
  ShiftedLayers trainable(layers, K);  // blocks K..L-1 as the Checkpointer's 0..L-K-1
  std::unique_ptr<Checkpointer> ck;
  resid[static_cast<std::size_t>(L)] = alloc_activations(M * C * f);
  if (backward) {
    // The frozen blocks below the trainable ones keep nothing: no gradient is taken below them.
    const float* cur = R(0);
    Buffer tmp;
    if (K > 0) tmp = alloc_activations(M * C * f);
    for (int l = 0; l < K; ++l) {
      float* out = (l % 2 == 0) ? tmp.as<float>() : R(0);
      layers.forward(l, cur, out);
      layers.drop(l);
      cur = out;
    }
    ck = std::make_unique<Checkpointer>(L - K, M * C, ckpt_, *tracker_);
    ck->forward(trainable, cur, R(L));
    if (K > 0) free_activations(tmp);
  } else {
    Buffer tmp = alloc_activations(M * C * f);
    const float* cur = R(0);
    for (int l = 0; l < L; ++l) {
      float* out = l + 1 == L ? R(L) : ((l % 2 == 0) ? tmp.as<float>() : R(0));
      layers.forward(l, cur, out);
      layers.drop(l);
      cur = out;
    }
    free_activations(tmp);
  }
  free_activations(resid[0]);  // each layer keeps its own copy of its input
  // ---- forward: final LayerNorm
  Buffer lnf_mean = alloc_activations(round_up(M, kAlignFloats) * f);
  Buffer lnf_rstd = alloc_activations(round_up(M, kAlignFloats) * f);
  Buffer xf = alloc_activations(M * C * f);
  {
    GatherGuard g = e.gather(final_unit());
    TraceScope region(e.tracer(), TraceLane::kTrainer, "forward", final_unit());
    const auto p = load_params(g, 2, pscratch);
    layernorm_forward(xf.as<float>(), lnf_mean.as<float>(), lnf_rstd.as<float>(), R(L), p[0], p[1],
                      M, C);
  }
  // ---- the tied head, the loss and (in training) the head's backward, under one gather of the
  // embedding: logits = xf wte^T; loss = mean over tokens of -log softmax(logits)[target].
  const float scale = static_cast<float>(e.loss_scale());
  float* dxf = w.f(w.dx_a);
  double loss = 0.0;
  {
    GatherGuard g = e.gather(embedding_unit());
    TraceScope region(e.tracer(), TraceLane::kTrainer, backward ? "head and loss" : "head",
                      embedding_unit());
    const auto p = load_params(g, 2, pscratch);
    const float* wte = p[0];
    Buffer logits_buf = alloc_activations(M * V * f);
    float* logits = logits_buf.as<float>();
    float* wt = w.f(w.wt);
    transpose(wt, wte, V, C);
    matmul(logits, xf.as<float>(), wt, nullptr, M, V, C);
    std::vector<float> row_loss(M);
    const float dscale = scale / static_cast<float>(M);
    for_rows(M, 4 * V, [&](std::size_t m) {
      float* lr = logits + m * V;
      const std::size_t target =
          static_cast<std::size_t>(batch.target(static_cast<int>(m / T), static_cast<int>(m % T)));
      float mx = lr[0];
      for (std::size_t v = 1; v < V; ++v) mx = std::max(mx, lr[v]);
      float sum = 0.0f;
      for (std::size_t v = 0; v < V; ++v) sum += std::exp(lr[v] - mx);
      row_loss[m] = std::log(sum) + mx - lr[target];
      if (backward) {  // d loss / d logits = (softmax - onehot) / M, times the loss scale
        const float inv = 1.0f / sum;
        for (std::size_t v = 0; v < V; ++v) lr[v] = std::exp(lr[v] - mx) * inv * dscale;
        lr[target] -= dscale;
      }
    });
    for (float x : row_loss) loss += x;  // in row order: deterministic
    loss /= static_cast<double>(M);
    if (backward && cfg_.frozen_units > 0) {  // the embedding (and the tied head) frozen
      matmul(dxf, logits, wte, nullptr, M, C, V);
    } else if (backward) {
      // wte's first gradient contribution (the head); the lookup's is added in the embedding's
      // backward, into the same grad() buffer, before the unit's one grads_ready().
      const View gv = e.grad(embedding_unit(), 0);
      float* dwte = gv.dtype == DType::kF32 ? static_cast<float*>(gv.data) : gscratch;
      float* dlt = w.f(w.dyt);
      transpose(dlt, logits, M, V);
      matmul(dwte, dlt, xf.as<float>(), nullptr, V, C, M);
      if (gv.dtype != DType::kF32) convert(dwte, DType::kF32, gv.data, gv.dtype, gv.count);
      matmul(dxf, logits, wte, nullptr, M, C, V);
    }
    free_activations(logits_buf);
  }
  free_activations(xf);
  if (!backward) {
    free_activations(lnf_mean);
    free_activations(lnf_rstd);
    free_activations(resid[static_cast<std::size_t>(L)]);
    return loss;
  }

  // ---- backward: final LayerNorm
  float* dcur = w.f(w.dx_b);
  float* dnext = w.f(w.dx_a);
  {
    GatherGuard g = e.gather(final_unit());
    std::optional<TraceScope> region;
    region.emplace(e.tracer(), TraceLane::kTrainer, "backward", final_unit());
    const auto p = load_params(g, 2, pscratch);
    GradSink gs(e, final_unit(), 2, gscratch);
    layernorm_backward(dcur, gs[0], gs[1], nullptr, dxf, R(L), lnf_mean.as<float>(),
                       lnf_rstd.as<float>(), p[0], M, C);
    gs.commit(final_unit(), tap);
    region.reset();
    e.grads_ready(final_unit());
  }
  free_activations(lnf_mean);
  free_activations(lnf_rstd);
  free_activations(resid[static_cast<std::size_t>(L)]);
  // ---- backward: blocks, in reverse (recomputing checkpointed segments)
  ck->backward(trainable, dcur, dnext);
  std::swap(dcur, dnext);
  ck.reset();
  // ---- backward: embedding. A lookup's gradient does not depend on the parameters: no gather.
  if (cfg_.frozen_units == 0) {
    const UnitId u = embedding_unit();
    std::optional<TraceScope> region;
    region.emplace(e.tracer(), TraceLane::kTrainer, "backward", u);
    // wpe: dwpe[t] = sum over sequences b (ascending) of dx[b, t]; rows >= T get 0.
    {
      const View gv = e.grad(u, 1);
      float* dwpe = gv.dtype == DType::kF32 ? static_cast<float*>(gv.data) : gscratch;
      for_rows(static_cast<std::size_t>(cfg_.seq), B * C, [&](std::size_t t) {
        float* o = dwpe + t * C;
        for (std::size_t c = 0; c < C; ++c) o[c] = 0.0f;
        if (t >= T) return;
        for (std::size_t b = 0; b < B; ++b) {
          const float* d = dcur + (b * T + t) * C;
          for (std::size_t c = 0; c < C; ++c) o[c] += d[c];
        }
      });
      if (gv.dtype != DType::kF32) convert(dwpe, DType::kF32, gv.data, gv.dtype, gv.count);
    }
    // wte += the lookup's gradient: row v gets the dx of every position holding token v, in
    // position order (a counting sort makes the per-token lists; one task per token).
    {
      const View gv = e.grad(u, 0);  // the head's contribution is already in it
      std::vector<std::size_t> start(V + 1, 0), pos(M);
      for (std::size_t m = 0; m < M; ++m) {
        ++start[static_cast<std::size_t>(
                    batch.input(static_cast<int>(m / T), static_cast<int>(m % T))) +
                1];
      }
      for (std::size_t v = 0; v < V; ++v) start[v + 1] += start[v];
      std::vector<std::size_t> fill(start.begin(), start.end() - 1);
      for (std::size_t m = 0; m < M; ++m) {
        pos[fill[static_cast<std::size_t>(
            batch.input(static_cast<int>(m / T), static_cast<int>(m % T)))]++] = m;
      }
      tbb::parallel_for(std::size_t{0}, V, [&](std::size_t v) {
        if (start[v] == start[v + 1]) return;
        std::vector<float> row(C);
        void* dst = static_cast<char*>(gv.data) + v * C * dtype_size(gv.dtype);
        convert(dst, gv.dtype, row.data(), DType::kF32, C);
        for (std::size_t i = start[v]; i < start[v + 1]; ++i) {
          const float* d = dcur + pos[i] * C;
          for (std::size_t c = 0; c < C; ++c) row[c] += d[c];
        }
        convert(row.data(), DType::kF32, dst, gv.dtype, C);
      });
    }
    if (tap) {
      tap(u, 0, e.grad(u, 0));
      tap(u, 1, e.grad(u, 1));
    }
    region.reset();
    e.grads_ready(u);
  }
  return loss;
}

}  // namespace zero::gpt
