// Block-wise int8 quantization on the CPU (see zero/device/quantize.hpp): oneTBB ranges of blocks,
// each block through the loops of device/quantize_kernels.hpp (baseline here, AVX-512 in
// device/quantize_avx512.cpp), every element by the shared per-element math
// (zero/device/detail/quantize_math.hpp), so the paths and a CUDA kernel over the same functions
// give the same bits.
#include "zero/device/quantize.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <string_view>
#include <vector>

#include "device/quantize_kernels.hpp"
#include "zero/core/error.hpp"
#include "zero/device/detail/quantize_math.hpp"

namespace zero {

// ---- the baseline loops
namespace detail::quant::scalar {

BlockMax block_max(const float* x, std::size_t n) {
  // Branch-free: whether any |x| fails <= FLT_MAX (Inf, and NaN, for which every comparison is
  // false), and the maximum.
  float absmax = 0.0f;
  int non_finite = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    non_finite |= !(a <= std::numeric_limits<float>::max());
    absmax = a > absmax ? a : absmax;
  }
  return {absmax, non_finite == 0};
}

void quantize(const float* x, std::size_t n, float inverse, std::int8_t* q) {
  for (std::size_t i = 0; i < n; ++i) q[i] = quantize_one(x[i], inverse);
}

void dequantize(const std::int8_t* q, std::size_t n, float scale, float* out, bool add) {
  for (std::size_t i = 0; i < n; ++i) {
    const float v = dequantize_one(q[i], scale);
    out[i] = add ? out[i] + v : v;
  }
}

}  // namespace detail::quant::scalar

namespace {

namespace quant = detail::quant;

// Blocks per task: enough elements that a task is worth its scheduling (~64 Ki elements).
std::size_t grain(std::size_t block) {
  return std::max<std::size_t>(1, (std::size_t{1} << 16) / block);
}

void check_args(const char* what, const void* a, const void* b, const void* c, std::size_t count,
                std::size_t block, Isa isa) {
  ZERO_CHECK(block >= 1, kInvalidArgument, what, ": block size must be >= 1, got ", block);
  ZERO_CHECK(count == 0 || (a != nullptr && b != nullptr && c != nullptr), kInvalidArgument, what,
             ": null buffer for ", count, " elements");
  ZERO_CHECK(isa_supported(isa), kInvalidArgument, what, ": this CPU cannot run the ",
             to_string(isa), " path");
}

template <typename Body>
void for_blocks(std::size_t count, std::size_t block, Body&& body) {
  const std::size_t blocks = num_blocks(count, block);
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, blocks, grain(block)),
                    [&](const tbb::blocked_range<std::size_t>& r) {
                      for (std::size_t b = r.begin(); b < r.end(); ++b) {
                        const std::size_t lo = b * block;
                        body(b, lo, std::min(count, lo + block) - lo);
                      }
                    });
}

void dequantize_blocks(const char* what, const std::int8_t* q, const float* scales,
                       std::size_t count, std::size_t block, float* out, bool add, Isa isa) {
  check_args(what, q, scales, out, count, block, isa);
  const bool wide = isa == Isa::kAvx512;
  for_blocks(count, block, [&](std::size_t b, std::size_t lo, std::size_t n) {
    (wide ? quant::avx512::dequantize : quant::scalar::dequantize)(q + lo, n, scales[b], out + lo,
                                                                   add);
  });
}

}  // namespace

std::size_t num_blocks(std::size_t count, std::size_t block) {
  ZERO_CHECK(block >= 1, kInvalidArgument, "num_blocks: block size must be >= 1, got ", block);
  return count / block + (count % block != 0 ? 1 : 0);
}

void quantize_int8(const float* x, std::size_t count, std::size_t block, std::int8_t* q,
                   float* scales, Isa isa) {
  quantize_int8(x, DType::kF32, count, block, q, scales, isa);
}

void quantize_int8(const void* x, DType dtype, std::size_t count, std::size_t block, std::int8_t* q,
                   float* scales, Isa isa) {
  check_args("quantize_int8", x, q, scales, count, block, isa);
  const bool wide = isa == Isa::kAvx512;
  const std::size_t es = dtype_size(dtype);
  // The first non-finite element (the smallest index any task saw), reported after the loop.
  std::atomic<std::size_t> bad{std::numeric_limits<std::size_t>::max()};
  for_blocks(count, block, [&](std::size_t b, std::size_t lo, std::size_t n) {
    // The block in f32: read in place, or converted (exact for 16-bit input).
    const float* xb = static_cast<const float*>(x) + lo;
    if (dtype != DType::kF32) {
      thread_local std::vector<float> wide_x;
      wide_x.resize(n);
      convert(static_cast<const char*>(x) + lo * es, dtype, wide_x.data(), DType::kF32, n);
      xb = wide_x.data();
    }
    const quant::BlockMax m =
        wide ? quant::avx512::block_max(xb, n) : quant::scalar::block_max(xb, n);
    if (!m.finite) {
      std::size_t i = 0;
      while (std::isfinite(xb[i])) ++i;
      std::size_t seen = bad.load(std::memory_order_relaxed);
      while (lo + i < seen && !bad.compare_exchange_weak(seen, lo + i, std::memory_order_relaxed)) {
      }
      return;
    }
    scales[b] = quant::block_scale(m.absmax);
    (wide ? quant::avx512::quantize : quant::scalar::quantize)(
        xb, n, quant::block_inverse(m.absmax), q + lo);
  });
  const std::size_t i = bad.load();
  if (i == std::numeric_limits<std::size_t>::max()) return;
  float v = 0.0f;
  convert(static_cast<const char*>(x) + i * es, dtype, &v, DType::kF32, 1);
  detail::throw_non_finite("quantize_int8", i, block, dtype, v);
}

namespace detail {
void throw_non_finite(std::string_view where, std::size_t i, std::size_t block, DType dtype,
                      float value) {
  ZERO_THROW(kInvalidArgument, where, ": element ", i, " (block ", i / block, " of ", block,
             " elements", dtype == DType::kF32 ? "" : ", ",
             dtype == DType::kF32 ? std::string_view() : to_string(dtype), ") is ", value,
             ": block-wise int8 quantization carries finite values only (a non-finite gradient "
             "or parameter upstream?)");
}
}  // namespace detail

void dequantize_sum_int8(const char* chunks, std::size_t stride, std::size_t scales_offset, int n,
                         std::size_t count, std::size_t block, float divisor, void* out,
                         DType dtype, Isa isa) {
  check_args("dequantize_sum_int8", chunks, chunks, out, count, block, isa);
  ZERO_CHECK(n >= 1 && divisor > 0.0f, kInvalidArgument, "dequantize_sum_int8: ", n,
             " chunks, divisor ", divisor, " (need n >= 1, divisor > 0)");
  ZERO_CHECK(scales_offset % alignof(float) == 0 && stride % alignof(float) == 0, kInvalidArgument,
             "dequantize_sum_int8: scales offset ", scales_offset, " and stride ", stride,
             " must be multiples of 4 bytes");
  const bool wide = isa == Isa::kAvx512;
  const auto dequantize = wide ? quant::avx512::dequantize : quant::scalar::dequantize;
  const std::size_t es = dtype_size(dtype);
  const bool direct = dtype == DType::kF32 && divisor == 1.0f;  // sum straight into out
  for_blocks(count, block, [&](std::size_t b, std::size_t lo, std::size_t len) {
    thread_local std::vector<float> acc;
    if (!direct) acc.resize(len);
    float* sum = direct ? static_cast<float*>(out) + lo : acc.data();
    for (int k = 0; k < n; ++k) {
      const char* chunk = chunks + static_cast<std::size_t>(k) * stride;
      const float scale = reinterpret_cast<const float*>(chunk + scales_offset)[b];
      dequantize(reinterpret_cast<const std::int8_t*>(chunk) + lo, len, scale, sum, k > 0);
    }
    if (direct) return;
    if (divisor != 1.0f) {
      for (std::size_t i = 0; i < len; ++i) sum[i] = sum[i] / divisor;
    }
    convert(sum, DType::kF32, static_cast<char*>(out) + lo * es, dtype, len);
  });
}

void dequantize_int8(const std::int8_t* q, const float* scales, std::size_t count,
                     std::size_t block, float* out, Isa isa) {
  dequantize_blocks("dequantize_int8", q, scales, count, block, out, /*add=*/false, isa);
}

void dequantize_add_int8(const std::int8_t* q, const float* scales, std::size_t count,
                         std::size_t block, float* out, Isa isa) {
  dequantize_blocks("dequantize_add_int8", q, scales, count, block, out, /*add=*/true, isa);
}

}  // namespace zero
