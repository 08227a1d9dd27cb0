#include "zero/comm/host_reduce.hpp"

#include <algorithm>
#include <cstring>

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
    std::memcpy(acc, byte_at(srcs[0], offset, dtype), len * sizeof(float));
    for (int s = 1; s < n; ++s) {
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

}  // namespace zero::detail
