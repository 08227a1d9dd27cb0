// Block-wise int8 quantization on the CPU (see zero/quantize.hpp): one oneTBB task range of
// blocks at a time, each element through the shared per-element math
// (zero/detail/quantize_math.hpp), so a CUDA kernel over the same functions gives the same bits.
#include "zero/quantize.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

#include "zero/detail/quantize_math.hpp"
#include "zero/error.hpp"

namespace zero {

namespace {

// Blocks per task: enough elements that a task is worth its scheduling (~64 Ki elements).
std::size_t grain(std::size_t block) {
  return std::max<std::size_t>(1, (std::size_t{1} << 16) / block);
}

void check_args(const char* what, const void* a, const void* b, const void* c, std::size_t count,
                std::size_t block) {
  ZERO_CHECK(block >= 1, kInvalidArgument, what, ": block size must be >= 1, got ", block);
  ZERO_CHECK(count == 0 || (a != nullptr && b != nullptr && c != nullptr), kInvalidArgument, what,
             ": null buffer for ", count, " elements");
}

template <typename Body>
void for_blocks(std::size_t count, std::size_t block, Body&& body) {
  const std::size_t blocks = num_blocks(count, block);
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, blocks, grain(block)),
                    [&](const tbb::blocked_range<std::size_t>& r) {
                      for (std::size_t b = r.begin(); b < r.end(); ++b) {
                        const std::size_t lo = b * block;
                        body(b, lo, std::min(count, lo + block));
                      }
                    });
}

}  // namespace

std::size_t num_blocks(std::size_t count, std::size_t block) {
  ZERO_CHECK(block >= 1, kInvalidArgument, "num_blocks: block size must be >= 1, got ", block);
  return count / block + (count % block != 0 ? 1 : 0);
}

void quantize_int8(const float* x, std::size_t count, std::size_t block, std::int8_t* q,
                   float* scales) {
  check_args("quantize_int8", x, q, scales, count, block);
  // The first non-finite element (the smallest index any task saw), reported after the loop.
  std::atomic<std::size_t> bad{std::numeric_limits<std::size_t>::max()};
  for_blocks(count, block, [&](std::size_t b, std::size_t lo, std::size_t hi) {
    float absmax = 0.0f;
    bool finite = true;
    for (std::size_t i = lo; i < hi; ++i) {
      const float a = std::fabs(x[i]);
      finite = finite && a <= std::numeric_limits<float>::max();  // false for Inf and NaN
      absmax = std::max(absmax, a);
    }
    if (!finite) {
      std::size_t i = lo;
      while (std::isfinite(x[i])) ++i;
      std::size_t seen = bad.load(std::memory_order_relaxed);
      while (i < seen && !bad.compare_exchange_weak(seen, i, std::memory_order_relaxed)) {
      }
      return;
    }
    const float inverse = detail::quant::block_inverse(absmax);
    scales[b] = detail::quant::block_scale(absmax);
    for (std::size_t i = lo; i < hi; ++i) q[i] = detail::quant::quantize_one(x[i], inverse);
  });
  const std::size_t i = bad.load();
  ZERO_CHECK(i == std::numeric_limits<std::size_t>::max(), kInvalidArgument,
             "quantize_int8: element ", i, " (block ", i / block, " of ", block, " elements) is ",
             x[i],
             ": block-wise int8 quantization carries finite values only (a non-finite gradient "
             "or parameter upstream?)");
}

void dequantize_int8(const std::int8_t* q, const float* scales, std::size_t count,
                     std::size_t block, float* out) {
  check_args("dequantize_int8", q, scales, out, count, block);
  for_blocks(count, block, [&](std::size_t b, std::size_t lo, std::size_t hi) {
    const float s = scales[b];
    for (std::size_t i = lo; i < hi; ++i) out[i] = detail::quant::dequantize_one(q[i], s);
  });
}

void dequantize_add_int8(const std::int8_t* q, const float* scales, std::size_t count,
                         std::size_t block, float* out) {
  check_args("dequantize_add_int8", q, scales, out, count, block);
  for_blocks(count, block, [&](std::size_t b, std::size_t lo, std::size_t hi) {
    const float s = scales[b];
    for (std::size_t i = lo; i < hi; ++i) out[i] += detail::quant::dequantize_one(q[i], s);
  });
}

}  // namespace zero
