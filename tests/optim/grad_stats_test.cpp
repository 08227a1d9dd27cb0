// CpuOptimizer::grad_stats (the sum of squares for the gradient norm, and the inf / NaN check of
// the loss scaler) against a long-double sum, the same bits on every ISA and thread count, and
// every non-finite value found wherever it sits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <vector>

#include "optim/isas.hpp"
#include "zero/core/cpu_features.hpp"
#include "zero/core/dtype.hpp"
#include "zero/optim/optimizer.hpp"

namespace zero {
namespace {

using testing::available_isas;

double decode(std::uint16_t h, DType t) {
  return t == DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

// ---- grad_stats
TEST(GradStats, SumOfSquaresMatchesFloat64AndIsTheSameBitsOnEveryPath) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (std::size_t n : {std::size_t{1}, std::size_t{15}, std::size_t{17}, std::size_t{1000003}}) {
      std::vector<float> f(n + 1);
      std::vector<std::uint16_t> h(n + 1);
      long double want = 0;
      for (std::size_t i = 0; i < n; ++i) {
        float x = u(rng);
        if (x == 0.0f) x = 1.0f;
        h[i + 1] = t == DType::kF16 ? f32_to_f16(x) : f32_to_bf16(x);
        f[i + 1] = t == DType::kF32 ? x : static_cast<float>(decode(h[i + 1], t));
        want += static_cast<long double>(f[i + 1]) * f[i + 1];
      }
      const void* data = t == DType::kF32 ? static_cast<const void*>(f.data() + 1)
                                          : static_cast<const void*>(h.data() + 1);
      std::optional<double> first;
      for (Isa isa : available_isas()) {
        for (int threads : {1, 2}) {
          CpuExecOptions o;
          o.isa = isa;
          o.threads = threads;
          o.block_elems = 4096;
          const GradStats s = CpuOptimizer(o).grad_stats(data, t, n);
          EXPECT_FALSE(s.non_finite);
          EXPECT_NEAR(s.sum_squares, static_cast<double>(want), 1e-13 * static_cast<double>(want))
              << to_string(t) << " n " << n << " " << to_string(isa);
          if (!first) first = s.sum_squares;
          EXPECT_EQ(std::memcmp(&*first, &s.sum_squares, sizeof(double)), 0)
              << "bits differ: " << to_string(t) << " n " << n << " " << to_string(isa)
              << " threads " << threads;
        }
      }
    }
  }
}

TEST(GradStats, FindsInfAndNanAnywhere) {
  const std::size_t n = 1000;
  for (Isa isa : available_isas()) {
    CpuExecOptions o;
    o.isa = isa;
    o.block_elems = 128;
    CpuOptimizer opt(o);
    for (std::size_t pos :
         {std::size_t{0}, std::size_t{15}, std::size_t{16}, std::size_t{500}, std::size_t{999}}) {
      for (float bad :
           {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
            std::numeric_limits<float>::quiet_NaN()}) {
        std::vector<float> f(n, 1.0f);
        f[pos] = bad;
        EXPECT_TRUE(opt.grad_stats(f.data(), DType::kF32, n).non_finite)
            << to_string(isa) << " pos " << pos;
        std::vector<std::uint16_t> h(n, 0x3c00);  // 1.0 in f16
        h[pos] = f32_to_f16(bad);
        EXPECT_TRUE(opt.grad_stats(h.data(), DType::kF16, n).non_finite);
        std::vector<std::uint16_t> b(n, 0x3f80);  // 1.0 in bf16
        b[pos] = f32_to_bf16(bad);
        EXPECT_TRUE(opt.grad_stats(b.data(), DType::kBF16, n).non_finite);
      }
    }
    // The largest finite values do not overflow the double sum.
    std::vector<float> big(n, std::numeric_limits<float>::max());
    const GradStats s = opt.grad_stats(big.data(), DType::kF32, n);
    EXPECT_FALSE(s.non_finite);
    EXPECT_TRUE(std::isfinite(s.sum_squares));
  }
}

}  // namespace
}  // namespace zero
