// Fused multi-tensor optimizer step: one launch updates up to kMaxShards shards. Each block
// takes chunks of kChunk elements (grid-stride over the chunks of all shards); each thread
// handles 4 consecutive elements per iteration with 16-byte loads of the f32 arrays (8 bytes for
// 16-bit arrays) when the shard's arrays are aligned for it, element by element otherwise.
// The update itself is the shared per-element function of zero/optim/detail/optim_math.hpp.
//
// int8 moments (zero/optim/detail/moment_quant.hpp) have a kernel of their own: one thread block
// per quantization block (kMomentBlock threads, one element each), the element's run found among
// the launch's runs; dequantize, adam_update, the block's absmax by a shared-memory reduction, the
// codes by the shared nearest-code search on tables in shared memory.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda_check.hpp"
#include "zero/core/error.hpp"
#include "zero/device/detail/kernels.hpp"
#include "zero/optim/detail/moment_quant.hpp"
#include "zero/optim/detail/optim_math.hpp"

namespace zero::detail::kernels {
namespace {

using optim::Rule;
using optim::StepScalars;

enum class Copy : std::uint8_t { kNone, kBF16, kF16 };

constexpr int kMaxShards = 24;  // ShardList must stay within the 4 KB of kernel parameters
constexpr int kThreads = 256;
constexpr std::size_t kChunk = 4096;  // elements per block per chunk; a multiple of 4 x kThreads

struct ShardList {
  float* p[kMaxShards];
  void* copy[kMaxShards];
  const void* g[kMaxShards];
  void* s0[kMaxShards];
  void* s1[kMaxShards];
  std::size_t count[kMaxShards];
  std::size_t first_chunk[kMaxShards + 1];  // prefix sums of the shards' chunk counts
  bool vec[kMaxShards];                     // arrays aligned for 4-element loads
  int n;
};

// ---- element access
template <DType T>
__device__ __forceinline__ float ld(const void* b, std::size_t i) {
  if constexpr (T == DType::kF32) {
    return static_cast<const float*>(b)[i];
  } else if constexpr (T == DType::kBF16) {
    return bf16_to_f32(static_cast<const std::uint16_t*>(b)[i]);
  } else {
    return f16_to_f32(static_cast<const std::uint16_t*>(b)[i]);
  }
}

template <DType T>
__device__ __forceinline__ void st(void* b, std::size_t i, float x) {
  if constexpr (T == DType::kF32) {
    static_cast<float*>(b)[i] = x;
  } else if constexpr (T == DType::kBF16) {
    static_cast<std::uint16_t*>(b)[i] = f32_to_bf16(x);
  } else {
    static_cast<std::uint16_t*>(b)[i] = f32_to_f16(x);
  }
}

template <DType T>
__device__ __forceinline__ void ld4(const void* b, std::size_t i, float (&x)[4]) {
  if constexpr (T == DType::kF32) {
    const float4 v = *reinterpret_cast<const float4*>(static_cast<const float*>(b) + i);
    x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
  } else {
    const ushort4 v = *reinterpret_cast<const ushort4*>(static_cast<const std::uint16_t*>(b) + i);
    const std::uint16_t h[4] = {v.x, v.y, v.z, v.w};
    for (int k = 0; k < 4; ++k) x[k] = T == DType::kBF16 ? bf16_to_f32(h[k]) : f16_to_f32(h[k]);
  }
}

template <DType T>
__device__ __forceinline__ void st4(void* b, std::size_t i, const float (&x)[4]) {
  if constexpr (T == DType::kF32) {
    *reinterpret_cast<float4*>(static_cast<float*>(b) + i) = make_float4(x[0], x[1], x[2], x[3]);
  } else {
    std::uint16_t h[4];
    for (int k = 0; k < 4; ++k) h[k] = T == DType::kBF16 ? f32_to_bf16(x[k]) : f32_to_f16(x[k]);
    *reinterpret_cast<ushort4*>(static_cast<std::uint16_t*>(b) + i) =
        make_ushort4(h[0], h[1], h[2], h[3]);
  }
}

template <Rule R>
constexpr int kStates = R == Rule::kAdam ? 2 : (R == Rule::kSgd ? 0 : 1);

template <Rule R>
__device__ __forceinline__ void update(const StepScalars& s, float g, float& p, float& a,
                                       float& b) {
  if constexpr (R == Rule::kAdam) optim::adam_update(s, g, p, a, b);
  if constexpr (R == Rule::kSgd) optim::sgd_update(s, g, p);
  if constexpr (R == Rule::kSgdMomentum) optim::sgd_momentum_update(s, g, p, a);
  if constexpr (R == Rule::kLion) optim::lion_update(s, g, p, a);
  if constexpr (R == Rule::kAdagrad) optim::adagrad_update(s, g, p, a);
}

template <Rule R, DType G, DType S, Copy C>
__device__ __forceinline__ void one(const ShardList& L, int k, const StepScalars& s,
                                    std::size_t i) {
  constexpr int ns = kStates<R>;
  float p = L.p[k][i];
  float a = 0.0f, b = 0.0f;
  if constexpr (ns > 0) a = ld<S>(L.s0[k], i);
  if constexpr (ns > 1) b = ld<S>(L.s1[k], i);
  update<R>(s, ld<G>(L.g[k], i), p, a, b);
  L.p[k][i] = p;
  if constexpr (ns > 0) st<S>(L.s0[k], i, a);
  if constexpr (ns > 1) st<S>(L.s1[k], i, b);
  if constexpr (C == Copy::kBF16) st<DType::kBF16>(L.copy[k], i, p);
  if constexpr (C == Copy::kF16) st<DType::kF16>(L.copy[k], i, p);
}

template <Rule R, DType G, DType S, Copy C>
__global__ void __launch_bounds__(kThreads) optimizer_step_kernel(ShardList L, StepScalars s) {
  constexpr int ns = kStates<R>;
  const std::size_t total = L.first_chunk[L.n];
  for (std::size_t c = blockIdx.x; c < total; c += gridDim.x) {
    int k = 0;
    while (c >= L.first_chunk[k + 1]) ++k;
    const std::size_t begin = (c - L.first_chunk[k]) * kChunk;
    const std::size_t end = begin + kChunk < L.count[k] ? begin + kChunk : L.count[k];
    if (!L.vec[k]) {
      for (std::size_t i = begin + threadIdx.x; i < end; i += kThreads) one<R, G, S, C>(L, k, s, i);
      continue;
    }
    const std::size_t quads_end = begin + (end - begin) / 4 * 4;
    for (std::size_t i = begin + 4 * threadIdx.x; i < quads_end; i += 4 * kThreads) {
      float g[4], p[4], a[4] = {}, b[4] = {};
      ld4<G>(L.g[k], i, g);
      ld4<DType::kF32>(L.p[k], i, p);
      if constexpr (ns > 0) ld4<S>(L.s0[k], i, a);
      if constexpr (ns > 1) ld4<S>(L.s1[k], i, b);
#pragma unroll
      for (int e = 0; e < 4; ++e) update<R>(s, g[e], p[e], a[e], b[e]);
      st4<DType::kF32>(L.p[k], i, p);
      if constexpr (ns > 0) st4<S>(L.s0[k], i, a);
      if constexpr (ns > 1) st4<S>(L.s1[k], i, b);
      if constexpr (C == Copy::kBF16) st4<DType::kBF16>(L.copy[k], i, p);
      if constexpr (C == Copy::kF16) st4<DType::kF16>(L.copy[k], i, p);
    }
    const std::size_t i = quads_end + threadIdx.x;
    if (i < end) one<R, G, S, C>(L, k, s, i);
  }
}

// ---- int8 moments

constexpr int kQ8Threads = 256;
static_assert(optim::kMomentBlock == kQ8Threads, "one thread per element of a block");
constexpr int kMaxRuns = 24;  // Q8Launch must stay within the 4 KB of kernel parameters

// The code tables, the same constant expression the host's kMomentCodes is.
__device__ const optim::MomentCodes kDeviceCodes = optim::make_moment_codes();

// One launch: blocks [begin, end) of a shard (begin on a block; end on one or the shard's end)
// and the runs that cover them (run r ends at run_end[r], absolute).
struct Q8Launch {
  float* p;
  void* copy;
  const void* g;
  std::uint8_t* s0;
  std::uint8_t* s1;
  std::size_t begin, end;
  std::size_t run_end[kMaxRuns];
  StepScalars sc[kMaxRuns];
  int nruns;
};

__device__ __forceinline__ std::uint32_t block_max(std::uint32_t x, std::uint32_t* warp_max) {
  for (int off = 16; off > 0; off >>= 1) {
    const std::uint32_t o = __shfl_xor_sync(0xffffffffu, x, off);
    x = o > x ? o : x;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // warp_max may still be read from the previous block
  if (lane == 0) warp_max[warp] = x;
  __syncthreads();
  std::uint32_t r = 0;
  for (int w = 0; w < kQ8Threads / 32; ++w) r = warp_max[w] > r ? warp_max[w] : r;
  return r;
}

template <DType G, Copy C>
__global__ void __launch_bounds__(kQ8Threads) q8_step_kernel(Q8Launch L) {
  __shared__ optim::MomentCodes codes;
  __shared__ std::uint32_t warp_max[kQ8Threads / 32];
  {
    const std::uint32_t* src = reinterpret_cast<const std::uint32_t*>(&kDeviceCodes);
    std::uint32_t* dst = reinterpret_cast<std::uint32_t*>(&codes);
    for (std::size_t w = threadIdx.x; w < sizeof(codes) / 4; w += kQ8Threads) dst[w] = src[w];
  }
  __syncthreads();
  const std::size_t nblocks = (L.end - L.begin + optim::kMomentBlock - 1) / optim::kMomentBlock;
  for (std::size_t b = blockIdx.x; b < nblocks; b += gridDim.x) {
    const std::size_t c0 = L.begin + b * optim::kMomentBlock;
    const std::size_t i = c0 + threadIdx.x;
    const bool live = i < L.end;
    std::uint8_t* rec_m = L.s0 + (c0 / optim::kMomentBlock) * optim::kMomentRecord;
    std::uint8_t* rec_v = L.s1 + (c0 / optim::kMomentBlock) * optim::kMomentRecord;
    float m = 0.0f, v = 0.0f;
    if (live) {
      int r = 0;
      while (L.run_end[r] <= i) ++r;  // the runs cover [begin, end)
      m = optim::m_value(codes, rec_m[4 + threadIdx.x], optim::load_absmax(rec_m));
      v = optim::v_value(codes, rec_v[4 + threadIdx.x], optim::load_absmax(rec_v));
      float p = L.p[i];
      optim::adam_update(L.sc[r], ld<G>(L.g, i), p, m, v);
      L.p[i] = p;
      if constexpr (C == Copy::kBF16) st<DType::kBF16>(L.copy, i, p);
      if constexpr (C == Copy::kF16) st<DType::kF16>(L.copy, i, p);
    }
    // Every thread has read its codes and both absmax words before they are overwritten.
    const std::uint32_t am = block_max(live ? optim::abs_bits(m) : 0u, warp_max);
    const std::uint32_t av = block_max(live ? optim::abs_bits(v) : 0u, warp_max);
    if (threadIdx.x == 0) {
      optim::store_absmax(rec_m, am);
      optim::store_absmax(rec_v, av);
    }
    if (live) {
      rec_m[4 + threadIdx.x] = optim::m_code(codes, optim::normalise(optim::block_norm(am), m));
      rec_v[4 + threadIdx.x] = optim::v_code(codes, optim::normalise(optim::block_norm(av), v));
    }
  }
}

using Q8Fn = void (*)(const Q8Launch&, cudaStream_t);

template <DType G, Copy C>
void q8_launch(const Q8Launch& L, cudaStream_t stream) {
  const std::size_t nblocks = (L.end - L.begin + optim::kMomentBlock - 1) / optim::kMomentBlock;
  q8_step_kernel<G, C><<<grid_size(nblocks, 8), kQ8Threads, 0, stream>>>(L);
  check_launch("q8_step_kernel");
}

template <DType G>
Q8Fn q8_pick_copy(Copy c) {
  switch (c) {
    case Copy::kNone: return &q8_launch<G, Copy::kNone>;
    case Copy::kBF16: return &q8_launch<G, Copy::kBF16>;
    case Copy::kF16: return &q8_launch<G, Copy::kF16>;
  }
  return nullptr;
}

Q8Fn q8_pick(DType g, Copy c) {
  switch (g) {
    case DType::kF32: return q8_pick_copy<DType::kF32>(c);
    case DType::kBF16: return q8_pick_copy<DType::kBF16>(c);
    case DType::kF16: return q8_pick_copy<DType::kF16>(c);
  }
  return nullptr;
}

// ---- host: pick the instantiation
using Launch = void (*)(const ShardList&, const StepScalars&, cudaStream_t);

template <Rule R, DType G, DType S, Copy C>
void launch(const ShardList& L, const StepScalars& s, cudaStream_t stream) {
  const int grid = grid_size(L.first_chunk[L.n], 4);
  optimizer_step_kernel<R, G, S, C><<<grid, kThreads, 0, stream>>>(L, s);
  check_launch("optimizer_step_kernel");
}

template <Rule R, DType G, DType S>
Launch pick_copy(Copy c) {
  switch (c) {
    case Copy::kNone: return &launch<R, G, S, Copy::kNone>;
    case Copy::kBF16: return &launch<R, G, S, Copy::kBF16>;
    case Copy::kF16: return &launch<R, G, S, Copy::kF16>;
  }
  return nullptr;
}

template <Rule R, DType G>
Launch pick_state(DType s, Copy c) {
  if (s == DType::kF32) return pick_copy<R, G, DType::kF32>(c);
  if constexpr (R == Rule::kAdam) {
    if (s == DType::kBF16) return pick_copy<R, G, DType::kBF16>(c);
  }
  return nullptr;
}

template <Rule R>
Launch pick_grad(DType g, DType s, Copy c) {
  switch (g) {
    case DType::kF32: return pick_state<R, DType::kF32>(s, c);
    case DType::kBF16: return pick_state<R, DType::kBF16>(s, c);
    case DType::kF16: return pick_state<R, DType::kF16>(s, c);
  }
  return nullptr;
}

Launch pick(Rule r, DType g, DType s, Copy c) {
  switch (r) {
    case Rule::kAdam: return pick_grad<Rule::kAdam>(g, s, c);
    case Rule::kSgd: return pick_grad<Rule::kSgd>(g, s, c);
    case Rule::kSgdMomentum: return pick_grad<Rule::kSgdMomentum>(g, s, c);
    case Rule::kLion: return pick_grad<Rule::kLion>(g, s, c);
    case Rule::kAdagrad: return pick_grad<Rule::kAdagrad>(g, s, c);
  }
  return nullptr;
}

bool aligned(const void* p, std::size_t a) { return reinterpret_cast<std::uintptr_t>(p) % a == 0; }

void check_array(const void* p, DType t, std::size_t shard, const char* what) {
  ZERO_CHECK(p != nullptr, kInvalidArgument, "GPU optimizer step: shard ", shard, " ", what,
             " is null");
  ZERO_CHECK(aligned(p, dtype_size(t)), kInvalidArgument, "GPU optimizer step: shard ", shard, " ",
             what, " is not aligned to its element size ", dtype_size(t));
}

}  // namespace

void optimizer_step(const OptimizerParams& params, const ShardRef* shards, std::size_t count,
                    std::int64_t step, float grad_scale, void* stream) {
  const StepScalars sc = optim::make_step_scalars(params, step, grad_scale);
  if (count == 0) return;
  ZERO_CHECK(shards != nullptr, kInvalidArgument, "GPU optimizer step: shards is null for ", count,
             " shards");
  ZERO_CHECK(params.state_dtype() != MomentDType::kInt8, kInvalidArgument,
             "GPU optimizer step: int8 moments step through optimizer_step_runs (a quantization "
             "block is stepped whole)");
  const Rule rule = optim::rule_of(params);
  const DType st = params.state_dtype() == MomentDType::kBF16 ? DType::kBF16 : DType::kF32;
  const int ns = params.num_states();
  // Check everything before the first launch: an error leaves every shard untouched.
  for (std::size_t k = 0; k < count; ++k) {
    const ShardRef& s = shards[k];
    if (s.count == 0) continue;
    check_array(s.master, DType::kF32, k, "master");
    check_array(s.grad, s.grad_dtype, k, "grad");
    for (int j = 0; j < ns; ++j) check_array(s.state[j], st, k, j == 0 ? "state[0]" : "state[1]");
    if (s.param_copy != nullptr) {
      ZERO_CHECK(s.param_copy_dtype != DType::kF32, kInvalidArgument, "GPU optimizer step: shard ",
                 k, " param_copy_dtype must be bf16 or f16");
      check_array(s.param_copy, s.param_copy_dtype, k, "param_copy");
    }
  }
  auto copy_of = [](const ShardRef& s) {
    if (s.param_copy == nullptr) return Copy::kNone;
    return s.param_copy_dtype == DType::kBF16 ? Copy::kBF16 : Copy::kF16;
  };
  // Batch consecutive shards that share gradient dtype and copy kind.
  std::size_t k = 0;
  while (k < count) {
    if (shards[k].count == 0) {
      ++k;
      continue;
    }
    const DType g = shards[k].grad_dtype;
    const Copy c = copy_of(shards[k]);
    ShardList L{};
    L.n = 0;
    L.first_chunk[0] = 0;
    for (; k < count && L.n < kMaxShards; ++k) {
      const ShardRef& s = shards[k];
      if (s.count == 0) continue;
      if (s.grad_dtype != g || copy_of(s) != c) break;
      const int j = L.n++;
      L.p[j] = s.master;
      L.g[j] = s.grad;
      L.copy[j] = s.param_copy;
      L.s0[j] = ns > 0 ? s.state[0] : nullptr;
      L.s1[j] = ns > 1 ? s.state[1] : nullptr;
      L.count[j] = s.count;
      L.first_chunk[j + 1] = L.first_chunk[j] + (s.count + kChunk - 1) / kChunk;
      const std::size_t a16 = 8, a32 = 16;  // 4 elements of 16 / 32 bits
      L.vec[j] = aligned(s.master, a32) && aligned(s.grad, g == DType::kF32 ? a32 : a16) &&
                 (ns < 1 || aligned(s.state[0], st == DType::kF32 ? a32 : a16)) &&
                 (ns < 2 || aligned(s.state[1], st == DType::kF32 ? a32 : a16)) &&
                 (c == Copy::kNone || aligned(s.param_copy, a16));
    }
    const Launch fn = pick(rule, g, st, c);
    ZERO_CHECK(fn != nullptr, kInternal, "GPU optimizer step: no kernel for ",
               to_string(params.type), " grad ", to_string(g), " state ", to_string(st));
    fn(L, sc, static_cast<cudaStream_t>(stream));
  }
}

namespace {

// Each group's step scalars. REQUIRES: num_groups >= 1. The groups must share one rule and state
// layout (one kernel).
std::vector<StepScalars> group_scalars(const OptimizerParams* groups, std::size_t num_groups,
                                       std::int64_t step, float grad_scale) {
  std::vector<StepScalars> sc;
  for (std::size_t g = 0; g < num_groups; ++g) {
    sc.push_back(optim::make_step_scalars(groups[g], step, grad_scale));
    ZERO_CHECK(groups[g].type == groups[0].type &&
                   groups[g].state_dtype() == groups[0].state_dtype() &&
                   groups[g].num_states() == groups[0].num_states(),
               kInvalidArgument, "GPU optimizer step: parameter groups differ in rule or state");
  }
  return sc;
}

// The runs tile the shard in order, each of an existing group. REQUIRES: runs, unless num_runs 0.
void check_runs(const ShardRef& shard, const StepRun* runs, std::size_t num_runs,
                std::size_t num_groups) {
  std::size_t at = 0;
  for (std::size_t r = 0; r < num_runs; ++r) {
    ZERO_CHECK(runs[r].at == at && runs[r].count <= shard.count - at && runs[r].group >= 0 &&
                   static_cast<std::size_t>(runs[r].group) < num_groups,
               kInvalidArgument, "GPU optimizer step: run ", r, " [", runs[r].at, ", ",
               runs[r].at + runs[r].count, ") of group ", runs[r].group,
               " does not continue the runs at ", at, " of a shard of ", shard.count, " elements");
    at += runs[r].count;
  }
  ZERO_CHECK(at == shard.count, kInvalidArgument, "GPU optimizer step: the runs cover ", at,
             " of the shard's ", shard.count, " elements");
}

// An int8-moment shard's arrays checked; the kind of its updated parameter copy.
Copy check_int8_shard(const ShardRef& shard) {
  check_array(shard.master, DType::kF32, 0, "master");
  check_array(shard.grad, shard.grad_dtype, 0, "grad");
  for (int j = 0; j < 2; ++j) {
    ZERO_CHECK(shard.state[j] != nullptr && aligned(shard.state[j], 4), kInvalidArgument,
               "GPU optimizer step: int8 state[", j, "] is null or not aligned to 4 bytes");
  }
  if (shard.param_copy == nullptr) return Copy::kNone;
  ZERO_CHECK(shard.param_copy_dtype != DType::kF32, kInvalidArgument,
             "GPU optimizer step: param_copy_dtype must be bf16 or f16");
  check_array(shard.param_copy, shard.param_copy_dtype, 0, "param_copy");
  return shard.param_copy_dtype == DType::kBF16 ? Copy::kBF16 : Copy::kF16;
}

// The int8 step's launches: at most kMaxRuns runs each, cut on block boundaries.
std::vector<Q8Launch> q8_launches(const ShardRef& shard, const StepRun* runs, std::size_t num_runs,
                                  const std::vector<StepScalars>& sc) {
  std::vector<Q8Launch> launches;
  std::size_t r = 0, begin = 0;
  constexpr std::size_t kB = optim::kMomentBlock;
  while (begin < shard.count) {
    while (runs[r].at + runs[r].count <= begin) ++r;  // the run holding `begin`
    Q8Launch L{};
    L.p = shard.master;
    L.copy = shard.param_copy;
    L.g = shard.grad;
    L.s0 = static_cast<std::uint8_t*>(shard.state[0]);
    L.s1 = static_cast<std::uint8_t*>(shard.state[1]);
    L.begin = begin;
    std::size_t k = r;
    for (; k < num_runs && L.nruns < kMaxRuns; ++k) {
      if (runs[k].count == 0) continue;
      L.run_end[L.nruns] = runs[k].at + runs[k].count;
      L.sc[L.nruns] = sc[static_cast<std::size_t>(runs[k].group)];
      ++L.nruns;
    }
    const std::size_t covered = L.run_end[L.nruns - 1];
    L.end = covered == shard.count ? covered : covered / kB * kB;
    ZERO_CHECK(L.end > begin, kInvalidArgument, "GPU optimizer step: more than ", kMaxRuns,
               " parameter-group runs inside one quantization block of ", kB, " elements at ",
               begin);
    launches.push_back(L);
    begin = L.end;
  }
  return launches;
}

}  // namespace

void optimizer_step_runs(const OptimizerParams* groups, std::size_t num_groups,
                         const ShardRef& shard, const StepRun* runs, std::size_t num_runs,
                         std::int64_t step, float grad_scale, void* stream) {
  ZERO_CHECK(groups != nullptr && num_groups > 0, kInvalidArgument,
             "GPU optimizer step: no parameter groups");
  ZERO_CHECK(runs != nullptr || num_runs == 0, kInvalidArgument,
             "GPU optimizer step: runs is null");
  const std::vector<StepScalars> sc = group_scalars(groups, num_groups, step, grad_scale);
  check_runs(shard, runs, num_runs, num_groups);
  if (shard.count == 0) return;
  const OptimizerParams& first = groups[0];
  if (first.state_dtype() != MomentDType::kInt8) {
    for (std::size_t r = 0; r < num_runs; ++r) {
      if (runs[r].count == 0) continue;
      const ShardRef part = shard.part(runs[r].at, runs[r].count, first.state_dtype());
      optimizer_step(groups[static_cast<std::size_t>(runs[r].group)], &part, 1, step, grad_scale,
                     stream);
    }
    return;
  }
  const Copy c = check_int8_shard(shard);
  const Q8Fn fn = q8_pick(shard.grad_dtype, c);
  ZERO_CHECK(fn != nullptr, kInternal, "GPU optimizer step: no int8 kernel for grad ",
             to_string(shard.grad_dtype));
  for (const Q8Launch& L : q8_launches(shard, runs, num_runs, sc)) {
    fn(L, static_cast<cudaStream_t>(stream));
  }
}

}  // namespace zero::detail::kernels
