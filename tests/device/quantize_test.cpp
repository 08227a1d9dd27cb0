// Block-wise int8 quantization against a float64 reference: every element read back within the
// stated bound (m / 254 x (1 + 2^-13), m the block's absolute maximum) on random data of odd
// sizes and block sizes, and on adversarial blocks — constant, one outlier among tiny values,
// zeros, alternating signs at the maximum, subnormals; values and scales equal to the float64
// reference's choice except at exact rounding ties; the f32 reduction of dequantized parts; and
// non-finite input refused naming the element.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/expect_error.hpp"
#include "zero/device/quantize.hpp"

namespace zero {
namespace {

using zero::testing::expect_error;

constexpr double kBoundFactor = 1.0 + 1.0 / 8192.0;  // 1 + 2^-13: the header's bound

struct Quantized {
  std::vector<std::int8_t> q;
  std::vector<float> scales;
  std::vector<float> back;
};

Quantized round_trip(const std::vector<float>& x, std::size_t block) {
  Quantized r;
  r.q.assign(x.size(), 99);  // poisoned: every element must be written
  r.scales.assign(num_blocks(x.size(), block), -1.0f);
  r.back.assign(x.size(), std::numeric_limits<float>::quiet_NaN());
  quantize_int8(x.data(), x.size(), block, r.q.data(), r.scales.data());
  dequantize_int8(r.q.data(), r.scales.data(), x.size(), block, r.back.data());
  return r;
}

// Checks the round trip of x against a float64 reference; returns the largest error over the
// bound's m / 254 seen (<= kBoundFactor when it holds).
double check(const std::vector<float>& x, std::size_t block, const std::string& what) {
  const Quantized r = round_trip(x, block);
  double worst = 0;
  for (std::size_t lo = 0, b = 0; lo < x.size(); lo += block, ++b) {
    const std::size_t hi = std::min(x.size(), lo + block);
    double m = 0;
    for (std::size_t i = lo; i < hi; ++i) m = std::max(m, std::fabs(static_cast<double>(x[i])));
    EXPECT_NEAR(r.scales[b], m < std::ldexp(1.0, -120) ? 0.0 : m / 127.0, m / 127.0 * 1e-6 + 1e-45)
        << what << " block " << b;
    for (std::size_t i = lo; i < hi; ++i) {
      EXPECT_GE(r.q[i], -127) << what << " element " << i;
      EXPECT_LE(r.q[i], 127) << what << " element " << i;
      const double err = std::fabs(static_cast<double>(r.back[i]) - x[i]);
      if (m < std::ldexp(1.0, -120)) {  // zero and tiny blocks are stored as zero
        EXPECT_EQ(r.q[i], 0) << what;
        EXPECT_EQ(r.back[i], 0.0f) << what;
        EXPECT_LE(err, m) << what;
        continue;
      }
      // The float64 reference's level: x * 127 / m rounded half to even; f32 rounding may
      // choose the neighbour only when x sits within a few ulp of a tie.
      const double t = static_cast<double>(x[i]) * 127.0 / m;
      const double ref = std::nearbyint(t);
      if (std::fabs(std::fabs(t - std::trunc(t)) - 0.5) > 1e-4) {
        EXPECT_EQ(r.q[i], static_cast<int>(ref)) << what << " element " << i << " x " << x[i];
      }
      worst = std::max(worst, err / (m / 254.0));
      EXPECT_LE(err, m / 254.0 * kBoundFactor) << what << " element " << i << " x " << x[i];
    }
  }
  return worst;
}

TEST(Quantize, RandomDataOfOddSizesStaysWithinTheBound) {
  std::mt19937 rng(17);
  double worst = 0;
  for (std::size_t block : {1u, 7u, 256u, 2048u}) {
    for (std::size_t count : {0u, 1u, 255u, 256u, 257u, 5000u, 65537u}) {
      for (double spread : {1e-30, 1e-3, 1.0, 1e30}) {
        std::normal_distribution<float> n(0.0f, static_cast<float>(spread));
        std::vector<float> x(count);
        for (float& v : x) v = n(rng);
        worst =
            std::max(worst, check(x, block,
                                  "block " + std::to_string(block) + " count " +
                                      std::to_string(count) + " spread " + std::to_string(spread)));
      }
    }
  }
  std::printf("largest error seen: %.6f x m / 254\n", worst);
  EXPECT_GT(worst, 0.9);  // the bound is tight: random data come near s / 2
}

TEST(Quantize, AdversarialBlocks) {
  const std::size_t block = 256;
  std::vector<float> x(block * 6 + 3);
  for (std::size_t i = 0; i < block; ++i) x[i] = 3.14159f;                 // constant
  for (std::size_t i = block; i < 2 * block; ++i) x[i] = 1e-6f * (i % 5);  // tiny ...
  x[block + 100] = -4096.0f;                                               // ... outlier
  for (std::size_t i = 2 * block; i < 3 * block; ++i) x[i] = 0.0f;         // zeros
  for (std::size_t i = 3 * block; i < 4 * block; ++i) x[i] = (i % 2 ? 1.0f : -1.0f) * 1e38f;
  for (std::size_t i = 4 * block; i < 5 * block; ++i) {
    x[i] = std::numeric_limits<float>::denorm_min() * static_cast<float>(i % 17);  // subnormal
  }
  for (std::size_t i = 5 * block; i < x.size(); ++i) x[i] = -0.0f;  // negative zeros + tail
  // Just above and just below the smallest block kept (2^-120), scales in f32's subnormal range.
  std::vector<float> edge(2 * block);
  for (std::size_t i = 0; i < block; ++i) {
    edge[i] = std::ldexp(1.0f, -120) * (1.0f + static_cast<float>(i) / block) * (i % 2 ? 1 : -1);
    edge[block + i] = std::ldexp(1.0f, -121) * static_cast<float>(i) / block;
  }
  check(edge, block, "edge of the smallest block kept");
  check(x, block, "adversarial");
  const Quantized r = round_trip(x, block);
  // A constant block comes back within one f32 rounding and at the top level.
  for (std::size_t i = 0; i < block; ++i) {
    EXPECT_EQ(r.q[i], 127);
    EXPECT_NEAR(r.back[i], 3.14159f, 3.14159f * 2.4e-7f);
  }
  // The outlier is exact at -127 levels; everything else in its block rounds to zero.
  EXPECT_EQ(r.q[block + 100], -127);
  EXPECT_EQ(r.back[block + 100], -4096.0f);
  for (std::size_t i = block; i < 2 * block; ++i) {
    if (i != block + 100) {
      EXPECT_EQ(r.q[i], 0) << i;
    }
  }
  // Zero blocks stay exactly zero (scale 0), -0 included, and so does the subnormal block;
  // alternating maxima keep their sign.
  EXPECT_EQ(r.scales[2], 0.0f);
  EXPECT_EQ(r.scales[4], 0.0f);
  EXPECT_EQ(r.scales[5], 0.0f);
  for (std::size_t i = 3 * block; i < 4 * block; ++i) EXPECT_EQ(r.q[i], i % 2 ? 127 : -127);
}

TEST(Quantize, DequantizedPartsSumInF32) {
  // qgZ: each rank's gradient quantized, the parts dequantized and summed in f32 in rank order;
  // the sum is within the sum of the parts' bounds of the exact sum.
  std::mt19937 rng(5);
  std::normal_distribution<float> n(0.0f, 1.0f);
  const std::size_t count = 3000, block = 256, ranks = 4;
  std::vector<std::vector<float>> parts(ranks, std::vector<float>(count));
  std::vector<double> exact(count, 0.0), bound(count, 0.0);
  std::vector<float> sum(count, 0.0f);
  for (std::size_t r = 0; r < ranks; ++r) {
    for (float& v : parts[r]) v = n(rng) * static_cast<float>(r + 1);
    const Quantized qr = round_trip(parts[r], block);
    dequantize_add_int8(qr.q.data(), qr.scales.data(), count, block, sum.data());
    for (std::size_t i = 0; i < count; ++i) {
      exact[i] += parts[r][i];
      bound[i] += qr.scales[i / block] / 2.0 * kBoundFactor;
    }
  }
  for (std::size_t i = 0; i < count; ++i) {
    EXPECT_LE(std::fabs(sum[i] - exact[i]), bound[i] + std::fabs(exact[i]) * 4.8e-7) << i;
  }
}

TEST(Quantize, SixteenBitInputQuantizesAsItsF32Value) {
  // 16-bit values are exact in f32: quantizing them is quantizing their f32 values, bit for bit.
  std::mt19937 rng(41);
  std::normal_distribution<float> n(0.0f, 2.0f);
  for (DType t : {DType::kBF16, DType::kF16}) {
    for (std::size_t count : {1u, 255u, 257u, 5000u}) {
      std::vector<std::uint16_t> x(count);
      std::vector<float> wide(count);
      for (std::size_t i = 0; i < count; ++i) {
        float v = n(rng);
        convert(&v, DType::kF32, &x[i], t, 1);
        convert(&x[i], t, &wide[i], DType::kF32, 1);
      }
      std::vector<std::int8_t> q0(count), q1(count, 99);
      std::vector<float> s0(num_blocks(count, 256)), s1(s0.size(), -1.0f);
      quantize_int8(wide.data(), count, 256, q0.data(), s0.data());
      quantize_int8(x.data(), t, count, 256, q1.data(), s1.data());
      EXPECT_EQ(q1, q0) << to_string(t) << " count " << count;
      EXPECT_EQ(std::memcmp(s1.data(), s0.data(), s0.size() * 4), 0) << to_string(t);
    }
    std::vector<std::uint16_t> bad(600, 0);
    const float inf = -std::numeric_limits<float>::infinity();
    convert(&inf, DType::kF32, &bad[513], t, 1);
    std::vector<std::int8_t> q(600);
    std::vector<float> sc(3);
    expect_error([&] { quantize_int8(bad.data(), t, 600, 256, q.data(), sc.data()); },
                 ErrorCode::kInvalidArgument, "element 513 (block 2 of 256 elements, ");
  }
}

TEST(Quantize, DequantizeSumMatchesAScalarReferenceInEveryDtype) {
  // Packed chunks (values, then scales) at a stride, as the quantized collectives lay them out;
  // the reference is written here: the f32 sum in chunk order, divided, rounded once.
  std::mt19937 rng(43);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (int chunks : {1, 3, 4}) {
    for (std::size_t count : {1u, 100u, 257u, 3001u}) {
      const std::size_t block = 64, nb = num_blocks(count, block);
      const std::size_t scales_offset = (count + 15) / 16 * 16;
      const std::size_t stride = (scales_offset + 4 * nb + 15) / 16 * 16;
      std::vector<char> packed(stride * chunks);
      for (int k = 0; k < chunks; ++k) {
        std::vector<float> x(count);
        for (float& v : x) v = n(rng) * static_cast<float>(k + 1);
        char* c = packed.data() + k * stride;
        quantize_int8(x.data(), count, block, reinterpret_cast<std::int8_t*>(c),
                      reinterpret_cast<float*>(c + scales_offset));
      }
      for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
        for (float divisor : {1.0f, static_cast<float>(chunks)}) {
          std::vector<char> out(count * dtype_size(t), '\xff');
          dequantize_sum_int8(packed.data(), stride, scales_offset, chunks, count, block, divisor,
                              out.data(), t);
          for (std::size_t i = 0; i < count; ++i) {
            float acc = 0.0f;
            for (int k = 0; k < chunks; ++k) {
              const char* c = packed.data() + k * stride;
              const float v = static_cast<float>(reinterpret_cast<const std::int8_t*>(c)[i]) *
                              reinterpret_cast<const float*>(c + scales_offset)[i / block];
              acc = k == 0 ? v : acc + v;
            }
            acc = acc / divisor;
            std::uint32_t want = 0, got = 0;
            convert(&acc, DType::kF32, &want, t, 1);
            std::memcpy(&got, out.data() + i * dtype_size(t), dtype_size(t));
            ASSERT_EQ(got, want) << to_string(t) << " chunks " << chunks << " count " << count
                                 << " element " << i << " divisor " << divisor;
          }
        }
      }
    }
  }
}

TEST(Quantize, EveryPathGivesTheSameBits) {
  std::mt19937 rng(23);
  std::normal_distribution<float> n(0.0f, 3.0f);
  std::vector<Isa> paths{Isa::kScalar};
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    if (isa_supported(isa)) paths.push_back(isa);
  }
  std::printf("paths run: %zu (best: %s)\n", paths.size(),
              std::string(to_string(best_isa())).c_str());
  for (std::size_t block : {1u, 15u, 16u, 17u, 256u, 2048u}) {
    for (std::size_t count : {1u, 31u, 33u, 4097u, 20000u}) {
      std::vector<float> x(count);
      for (float& v : x) v = n(rng);
      x[count / 2] = 0.5f * 127.0f;  // ties and exact levels among the random values
      std::vector<std::int8_t> q0(count), q1(count);
      std::vector<float> s0(num_blocks(count, block)), s1(s0.size()), d0(count, 1.0f),
          d1(count, 1.0f);
      quantize_int8(x.data(), count, block, q0.data(), s0.data(), Isa::kScalar);
      dequantize_add_int8(q0.data(), s0.data(), count, block, d0.data(), Isa::kScalar);
      for (Isa isa : paths) {
        std::fill(q1.begin(), q1.end(), 99);
        std::fill(d1.begin(), d1.end(), 1.0f);
        quantize_int8(x.data(), count, block, q1.data(), s1.data(), isa);
        dequantize_add_int8(q1.data(), s1.data(), count, block, d1.data(), isa);
        const std::string what = std::string(to_string(isa)) + " block " + std::to_string(block) +
                                 " count " + std::to_string(count);
        EXPECT_EQ(q1, q0) << what;
        EXPECT_EQ(std::memcmp(s1.data(), s0.data(), s0.size() * 4), 0) << what;
        EXPECT_EQ(std::memcmp(d1.data(), d0.data(), count * 4), 0) << what;
        std::vector<float> nan = x;
        nan[count - 1] = std::numeric_limits<float>::quiet_NaN();
        expect_error([&] { quantize_int8(nan.data(), count, block, q1.data(), s1.data(), isa); },
                     ErrorCode::kInvalidArgument, "element " + std::to_string(count - 1));
      }
    }
  }
}

TEST(Quantize, NonFiniteInputAndBadArgumentsAreRefused) {
  std::vector<float> x(1000, 1.0f);
  std::vector<std::int8_t> q(1000);
  std::vector<float> s(num_blocks(1000, 256));
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    std::vector<float> y = x;
    y[700] = bad;
    y[900] = bad;  // the first one is named
    expect_error([&] { quantize_int8(y.data(), y.size(), 256, q.data(), s.data()); },
                 ErrorCode::kInvalidArgument, "element 700 (block 2 of 256 elements)");
  }
  expect_error([&] { quantize_int8(x.data(), x.size(), 0, q.data(), s.data()); },
               ErrorCode::kInvalidArgument, "block size must be >= 1");
  expect_error([&] { quantize_int8(x.data(), x.size(), 256, nullptr, s.data()); },
               ErrorCode::kInvalidArgument, "null buffer");
  expect_error([&] { dequantize_int8(q.data(), nullptr, 10, 256, x.data()); },
               ErrorCode::kInvalidArgument, "null buffer");
  EXPECT_EQ(num_blocks(0, 256), 0u);
  EXPECT_EQ(num_blocks(257, 256), 2u);
  quantize_int8(nullptr, 0, 256, nullptr, nullptr);  // nothing to do: fine
}

}  // namespace
}  // namespace zero
