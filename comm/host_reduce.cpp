#include "comm/host_reduce.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <emmintrin.h>
#define ZERO_HAVE_SSE2_STREAM 1
#else
#define ZERO_HAVE_SSE2_STREAM 0
#endif

namespace zero::detail {

namespace {

inline void add_into(float* __restrict acc, const float* __restrict x, std::size_t len) {
  for (std::size_t i = 0; i < len; ++i) acc[i] += x[i];
}

// NaN-propagating max: a NaN in x replaces acc; a NaN already in acc stays.
inline void max_into(float* __restrict acc, const float* __restrict x, std::size_t len) {
  for (std::size_t i = 0; i < len; ++i) {
    const float a = acc[i];
    const float b = x[i];
    acc[i] = (b > a || b != b) ? b : a;
  }
}

inline void sum_pair(float* __restrict acc, const float* __restrict a, const float* __restrict b,
                     std::size_t len) {
  for (std::size_t i = 0; i < len; ++i) acc[i] = a[i] + b[i];
}

inline void apply(float* acc, const float* x, std::size_t len, ReduceOp op) {
  if (op == ReduceOp::kMax) {
    max_into(acc, x, len);
  } else {
    add_into(acc, x, len);
  }
}

const char* byte_at(const void* p, std::size_t elements, DType t) {
  return static_cast<const char*>(p) + elements * dtype_size(t);
}

}  // namespace

void reduce_block(const void* const* srcs, int n, std::size_t offset, std::size_t len, DType dtype,
                  ReduceOp op, float* acc, float* scratch) {
  if (dtype == DType::kF32) {
    const float* s0 = reinterpret_cast<const float*>(byte_at(srcs[0], offset, dtype));
    if (n >= 2 && op != ReduceOp::kMax) {  // first pair fused: one pass less over acc
      const float* s1 = reinterpret_cast<const float*>(byte_at(srcs[1], offset, dtype));
      sum_pair(acc, s0, s1, len);
    } else {
      std::memcpy(acc, s0, len * sizeof(float));
      if (n >= 2)
        apply(acc, reinterpret_cast<const float*>(byte_at(srcs[1], offset, dtype)), len, op);
    }
    for (int s = 2; s < n; ++s) {
      apply(acc, reinterpret_cast<const float*>(byte_at(srcs[s], offset, dtype)), len, op);
    }
  } else {
    convert(byte_at(srcs[0], offset, dtype), dtype, acc, DType::kF32, len);
    for (int s = 1; s < n; ++s) {
      convert(byte_at(srcs[s], offset, dtype), dtype, scratch, DType::kF32, len);
      apply(acc, scratch, len, op);
    }
  }
  if (op == ReduceOp::kAvg) {
    const float divisor = static_cast<float>(n);
    for (std::size_t i = 0; i < len; ++i) acc[i] /= divisor;
  }
}

void combine(const void* in, void* inout, std::size_t len, DType dtype, ReduceOp op) {
  const ReduceOp how = op == ReduceOp::kMax ? ReduceOp::kMax : ReduceOp::kSum;
  if (dtype == DType::kF32) {
    apply(static_cast<float*>(inout), static_cast<const float*>(in), len, how);
    return;
  }
  float a[kReduceBlock];
  float b[kReduceBlock];
  for (std::size_t done = 0; done < len; done += kReduceBlock) {
    const std::size_t m = std::min(kReduceBlock, len - done);
    convert(byte_at(inout, done, dtype), dtype, a, DType::kF32, m);
    convert(byte_at(in, done, dtype), dtype, b, DType::kF32, m);
    apply(a, b, m, how);
    convert(a, DType::kF32, const_cast<char*>(byte_at(inout, done, dtype)), dtype, m);
  }
}

void divide_by(void* buf, std::size_t len, DType dtype, float divisor) {
  if (dtype == DType::kF32) {
    float* p = static_cast<float*>(buf);
    for (std::size_t i = 0; i < len; ++i) p[i] /= divisor;
    return;
  }
  float a[kReduceBlock];
  for (std::size_t done = 0; done < len; done += kReduceBlock) {
    const std::size_t m = std::min(kReduceBlock, len - done);
    char* p = const_cast<char*>(byte_at(buf, done, dtype));
    convert(p, dtype, a, DType::kF32, m);
    for (std::size_t i = 0; i < m; ++i) a[i] /= divisor;
    convert(a, DType::kF32, p, dtype, m);
  }
}

void copy_out(void* dst, const void* src, std::size_t bytes, bool streaming) {
#if ZERO_HAVE_SSE2_STREAM
  if (streaming && bytes >= 256) {
    char* d = static_cast<char*>(dst);
    const char* s = static_cast<const char*>(src);
    // Head up to 16-byte alignment of the destination, then 64 bytes per step, then the tail.
    const std::size_t head = (16 - (reinterpret_cast<std::uintptr_t>(d) & 15)) & 15;
    std::memcpy(d, s, head);
    d += head;
    s += head;
    bytes -= head;
    std::size_t i = 0;
    for (; i + 64 <= bytes; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
      const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
    }
    std::memcpy(d + i, s + i, bytes - i);
    return;
  }
#endif
  (void)streaming;
  std::memcpy(dst, src, bytes);
}

void stream_fence() {
#if ZERO_HAVE_SSE2_STREAM
  _mm_sfence();
#endif
}

}  // namespace zero::detail
