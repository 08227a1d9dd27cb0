#include "device/grad_accumulate.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <cstring>

namespace zero::detail {

namespace {
constexpr std::size_t kBlock = 4096;  // elements per inner block (16 KiB of f32: in L1)
constexpr std::size_t kGrain = 16 * kBlock;
}  // namespace

void accumulate(void* dst, DType dst_type, const void* src, DType src_type, std::size_t n,
                bool first) {
  if (n == 0) return;
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  const std::size_t ds = dtype_size(dst_type), ss = dtype_size(src_type);
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n, kGrain), [&](const auto& r) {
    float a[kBlock];
    float b[kBlock];
    for (std::size_t i = r.begin(); i < r.end(); i += kBlock) {
      const std::size_t m = std::min(kBlock, r.end() - i);
      if (first) {
        convert(s + i * ss, src_type, d + i * ds, dst_type, m);
        continue;
      }
      convert(s + i * ss, src_type, b, DType::kF32, m);
      if (dst_type == DType::kF32) {
        float* df = reinterpret_cast<float*>(d + i * ds);
        for (std::size_t k = 0; k < m; ++k) df[k] += b[k];
      } else {
        convert(d + i * ds, dst_type, a, DType::kF32, m);
        for (std::size_t k = 0; k < m; ++k) a[k] += b[k];
        convert(a, DType::kF32, d + i * ds, dst_type, m);
      }
    }
  });
}

}  // namespace zero::detail
