// f16 / bf16 <-> f32 conversions: exhaustive over the 65,536 16-bit patterns, against an
// independent reference (exact double arithmetic over a table of every representable value),
// and the bulk converters of every ISA path against the scalar functions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "zero/core/cpu_features.hpp"
#include "zero/core/detail/dtype_convert.hpp"
#include "zero/core/dtype.hpp"
#include "zero/core/error.hpp"

namespace zero {
namespace {

// ---- the reference: formats described by their field widths, decoded with ldexp

struct Format {
  int exp_bits;
  int mant_bits;
  int bias() const { return (1 << (exp_bits - 1)) - 1; }
  int max_exp_field() const { return (1 << exp_bits) - 1; }
};
constexpr Format kF16{5, 10};
constexpr Format kBF16{8, 7};

bool ref_is_nan(Format f, std::uint16_t h) {
  return ((h >> f.mant_bits) & f.max_exp_field()) == f.max_exp_field() &&
         (h & ((1u << f.mant_bits) - 1)) != 0;
}

// Exact value of a 16-bit pattern (Inf as +-inf; NaN not handled here).
double ref_decode(Format f, std::uint16_t h) {
  const int sign = h >> 15;
  const int e = (h >> f.mant_bits) & f.max_exp_field();
  const int m = h & ((1 << f.mant_bits) - 1);
  double v;
  if (e == f.max_exp_field()) {
    v = INFINITY;
  } else if (e == 0) {
    v = std::ldexp(static_cast<double>(m), 1 - f.bias() - f.mant_bits);
  } else {
    v = std::ldexp(static_cast<double>(m + (1 << f.mant_bits)), e - f.bias() - f.mant_bits);
  }
  return sign ? -v : v;
}

// Round-to-nearest-even by search over the table of non-negative finite values (sorted by
// pattern, which sorts them by value).
std::uint16_t ref_encode(Format f, float x) {
  const std::uint32_t u = f32_bits(x);
  const std::uint16_t sign = (u >> 31) ? 0x8000 : 0;
  const std::uint16_t inf = static_cast<std::uint16_t>(f.max_exp_field() << f.mant_bits);
  const double a = std::fabs(static_cast<double>(x));
  if (std::isinf(a)) return sign | inf;
  // Largest finite pattern, and the value one ulp above it (where Inf "sits" for rounding).
  const std::uint16_t max_pat = inf - 1;
  const double max_val = ref_decode(f, max_pat);
  const double beyond = std::ldexp(1.0, f.max_exp_field() - f.bias());
  // Binary search over patterns [0, max_pat] for the largest value <= a.
  std::uint32_t lo = 0, hi = max_pat;
  if (a >= max_val) {
    lo = max_pat;
  } else {
    while (lo < hi) {
      const std::uint32_t mid = (lo + hi + 1) / 2;
      if (ref_decode(f, static_cast<std::uint16_t>(mid)) <= a) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
  }
  const double below = ref_decode(f, static_cast<std::uint16_t>(lo));
  const double above = lo == max_pat ? beyond : ref_decode(f, static_cast<std::uint16_t>(lo + 1));
  const std::uint32_t above_pat = lo == max_pat ? inf : lo + 1;
  const double d_below = a - below, d_above = above - a;
  std::uint32_t pick;
  if (d_below < d_above) {
    pick = lo;
  } else if (d_above < d_below) {
    pick = above_pat;
  } else {
    pick = (lo & 1u) == 0 ? lo : above_pat;  // tie: even mantissa
  }
  return static_cast<std::uint16_t>(sign | pick);
}

// The documented NaN policy: sign and top payload bits kept, quiet bit set.
std::uint16_t ref_nan_encode(Format f, float x) {
  const std::uint32_t u = f32_bits(x);
  const std::uint32_t top = (u & 0x7fffffu) >> (23 - f.mant_bits);
  return static_cast<std::uint16_t>(((u >> 31) << 15) | (f.max_exp_field() << f.mant_bits) |
                                    (1u << (f.mant_bits - 1)) | top);
}

std::uint16_t scalar_encode(Format f, float x) {
  return f.exp_bits == 5 ? f32_to_f16(x) : f32_to_bf16(x);
}
float scalar_decode(Format f, std::uint16_t h) {
  return f.exp_bits == 5 ? f16_to_f32(h) : bf16_to_f32(h);
}

class FormatTest : public ::testing::TestWithParam<Format> {};

TEST_P(FormatTest, EveryPatternDecodesExactlyAndRoundTrips) {
  const Format f = GetParam();
  for (std::uint32_t p = 0; p < 65536; ++p) {
    const auto h = static_cast<std::uint16_t>(p);
    const float v = scalar_decode(f, h);
    if (ref_is_nan(f, h)) {
      ASSERT_TRUE(std::isnan(v)) << std::hex << p;
      // Quiet, sign and payload kept: f32 mantissa top bits are the 16-bit payload.
      const std::uint32_t u = f32_bits(v);
      EXPECT_EQ(u >> 31, p >> 15u) << std::hex << p;
      // f16 -> f32 quiets (as vcvtph2ps does); bf16 -> f32 is a plain bit extension.
      if (f.exp_bits == 5) {
        EXPECT_NE(u & 0x400000u, 0u) << "NaN not made quiet: " << std::hex << p;
      }
      EXPECT_EQ((u >> (23 - f.mant_bits)) & ((1u << (f.mant_bits - 1)) - 1),
                p & ((1u << (f.mant_bits - 1)) - 1))
          << "payload lost: " << std::hex << p;
      // Back to 16 bits: the quiet version of the same NaN.
      EXPECT_EQ(scalar_encode(f, v), p | (1u << (f.mant_bits - 1))) << std::hex << p;
      continue;
    }
    ASSERT_EQ(static_cast<double>(v), ref_decode(f, h)) << std::hex << p;
    if (v == 0.0f) {
      ASSERT_EQ(std::signbit(v), (p >> 15) != 0) << std::hex << p;
    }
    ASSERT_EQ(scalar_encode(f, v), h) << "round trip of pattern " << std::hex << p;
  }
}

// Every rounding boundary: each representable value, the midpoints to its neighbours, and the
// f32 values one ulp either side of each midpoint; plus random floats of every magnitude.
TEST_P(FormatTest, EncodeMatchesReferenceAtEveryBoundaryAndOnRandomFloats) {
  const Format f = GetParam();
  std::vector<float> inputs;
  const std::uint16_t inf = static_cast<std::uint16_t>(f.max_exp_field() << f.mant_bits);
  for (std::uint32_t p = 0; p < inf; ++p) {
    const double lo = ref_decode(f, static_cast<std::uint16_t>(p));
    const double hi = p + 1 == inf ? std::ldexp(1.0, f.max_exp_field() - f.bias())
                                   : ref_decode(f, static_cast<std::uint16_t>(p + 1));
    const float mid = static_cast<float>((lo + hi) / 2);  // exact in f32 for both formats
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
    for (float x :
         {static_cast<float>(lo), mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
      inputs.push_back(x);
      inputs.push_back(-x);
    }
  }
  std::mt19937 rng(1234);
  std::uniform_int_distribution<std::uint32_t> bits;
  for (int i = 0; i < 2'000'000; ++i) {
    const float x = f32_from_bits(bits(rng));
    if (!std::isnan(x)) inputs.push_back(x);
  }
  for (float x : {0.0f, -0.0f, INFINITY, -INFINITY, 1e-45f, -1e-45f, 3.4028235e38f, 1.17549435e-38f,
                  1.1754942e-38f, 65504.0f, 65519.996f, 65520.0f, 5.9604645e-08f, 2.9802322e-08f,
                  2.9802326e-08f}) {
    inputs.push_back(x);
  }
  std::size_t checked = 0;
  for (float x : inputs) {
    ASSERT_EQ(scalar_encode(f, x), ref_encode(f, x))
        << "x = " << x << " bits " << std::hex << f32_bits(x);
    ++checked;
  }
  EXPECT_GT(checked, 2'000'000u);
}

TEST_P(FormatTest, NanPolicyKeepsSignAndTopPayloadAndQuiets) {
  const Format f = GetParam();
  std::mt19937 rng(99);
  std::uniform_int_distribution<std::uint32_t> payload(1, 0x7fffff);
  for (int i = 0; i < 100000; ++i) {
    const std::uint32_t u = ((i & 1) ? 0xff800000u : 0x7f800000u) | payload(rng);
    const float x = f32_from_bits(u);
    ASSERT_TRUE(std::isnan(x));
    ASSERT_EQ(scalar_encode(f, x), ref_nan_encode(f, x)) << std::hex << u;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, FormatTest, ::testing::Values(kF16, kBF16), [](const auto& info) {
  return info.param.exp_bits == 5 ? "f16" : "bf16";
});

// ---- bulk converters: every ISA this CPU has, bitwise equal to the scalar functions

std::vector<Isa> available_isas() {
  std::vector<Isa> out;
  for (Isa i : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (isa_supported(i)) out.push_back(i);
  }
  return out;
}

// Random bit patterns with a heavy share of the edge classes (NaN, Inf, subnormal, ties).
std::vector<std::uint32_t> edge_heavy_f32(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::uint32_t> bits;
  std::vector<std::uint32_t> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t u = bits(rng);
    switch (u % 8) {
      case 0: u = (u & 0x807fffffu); break;                // subnormal / zero
      case 1: u = (u & 0x807fffffu) | 0x7f800000u; break;  // Inf / NaN
      case 2: u = (u & 0xffff0000u) | 0x8000u; break;      // bf16 tie
      case 3: u = (u & 0xffffe000u) | 0x1000u; break;      // f16 tie (normal range)
      case 4: u = (u & 0x80ffffffu) | 0x33000000u; break;  // around f16 subnormals
      default: break;
    }
    v[i] = u;
  }
  return v;
}

constexpr std::size_t kLengths[] = {0, 1, 7, 15, 16, 17, 31, 33, 1000, 4099, 100003};

TEST(BulkConvert, EveryIsaMatchesScalarAtOddLengthsAndMisalignedPointers) {
  const auto isas = available_isas();
  ASSERT_FALSE(isas.empty());
  std::printf("ISA paths tested: ");
  for (Isa i : isas) std::printf("%s ", std::string(to_string(i)).c_str());
  std::printf("(avx512_bf16: %d)\n", cpu_features().avx512_bf16 ? 1 : 0);
  const auto src32 = edge_heavy_f32(100003 + 8, 7);
  std::vector<std::uint16_t> src16(100003 + 8);
  {
    std::mt19937 rng(8);
    for (auto& h : src16) h = static_cast<std::uint16_t>(rng());
  }
  constexpr std::uint16_t kPoison16 = 0xdead;
  constexpr std::uint32_t kPoison32 = 0xdeadbeef;
  for (Isa isa : isas) {
    for (std::size_t n : kLengths) {
      for (std::size_t off : {0u, 1u, 3u}) {  // misaligned source and destination starts
        const float* s32 = reinterpret_cast<const float*>(src32.data() + off);
        const std::uint16_t* s16 = src16.data() + off;
        // f32 -> 16
        for (bool bf : {true, false}) {
          std::vector<std::uint16_t> out(n + off + 2, kPoison16);
          if (bf) {
            detail::f32_to_bf16(isa, s32, out.data() + off, n);
          } else {
            detail::f32_to_f16(isa, s32, out.data() + off, n);
          }
          for (std::size_t i = 0; i < off; ++i)
            ASSERT_EQ(out[i], kPoison16) << "wrote before start";
          for (std::size_t i = 0; i < n; ++i) {
            const std::uint16_t want = bf ? f32_to_bf16(s32[i]) : f32_to_f16(s32[i]);
            ASSERT_EQ(out[off + i], want) << to_string(isa) << (bf ? " bf16" : " f16") << " n=" << n
                                          << " i=" << i << " in=" << std::hex << f32_bits(s32[i]);
          }
          ASSERT_EQ(out[off + n], kPoison16) << "wrote past end";
          ASSERT_EQ(out[off + n + 1], kPoison16) << "wrote past end";
        }
        // 16 -> f32
        for (bool bf : {true, false}) {
          std::vector<std::uint32_t> out(n + off + 2, kPoison32);
          float* d = reinterpret_cast<float*>(out.data() + off);
          if (bf) {
            detail::bf16_to_f32(isa, s16, d, n);
          } else {
            detail::f16_to_f32(isa, s16, d, n);
          }
          for (std::size_t i = 0; i < off; ++i) ASSERT_EQ(out[i], kPoison32);
          for (std::size_t i = 0; i < n; ++i) {
            const float want = bf ? bf16_to_f32(s16[i]) : f16_to_f32(s16[i]);
            ASSERT_EQ(out[off + i], f32_bits(want))
                << to_string(isa) << " n=" << n << " i=" << i << " in=" << std::hex << s16[i];
          }
          ASSERT_EQ(out[off + n], kPoison32);
        }
      }
    }
  }
}

TEST(BulkConvert, ConvertDispatchesEveryPairIncludingF16ToBf16) {
  const auto src = edge_heavy_f32(5003, 11);
  std::vector<std::uint16_t> h(5003), b(5003), hb(5003);
  convert(src.data(), DType::kF32, h.data(), DType::kF16, h.size());
  convert(src.data(), DType::kF32, b.data(), DType::kBF16, b.size());
  convert(h.data(), DType::kF16, hb.data(), DType::kBF16, h.size());
  for (std::size_t i = 0; i < src.size(); ++i) {
    const float x = f32_from_bits(src[i]);
    ASSERT_EQ(h[i], f32_to_f16(x));
    ASSERT_EQ(b[i], f32_to_bf16(x));
    ASSERT_EQ(hb[i], f32_to_bf16(f16_to_f32(h[i])));
  }
  std::vector<float> same(5003, 1.0f);
  convert(src.data(), DType::kF32, same.data(), DType::kF32, same.size());
  EXPECT_EQ(std::memcmp(same.data(), src.data(), src.size() * 4), 0);
}

TEST(BulkConvert, NullPointerIsAnError) {
  std::uint16_t d[4];
  try {
    convert(nullptr, DType::kF32, d, DType::kBF16, 4);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("null"), std::string::npos) << e.what();
  }
}

TEST(DType, NamesParseAndUnknownNameIsAnError) {
  EXPECT_EQ(parse_dtype("bf16"), DType::kBF16);
  EXPECT_EQ(parse_dtype("fp16"), DType::kF16);
  EXPECT_EQ(parse_dtype("float32"), DType::kF32);
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  try {
    parse_dtype("fp8");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp8"), std::string::npos);
  }
}

TEST(CpuFeatures, UnsupportedIsaIsRejected) {
  for (Isa i : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (isa_supported(i)) continue;
    float s = 1;
    std::uint16_t d;
    EXPECT_THROW(detail::f32_to_bf16(i, &s, &d, 1), Error);
  }
  EXPECT_THROW(parse_isa("sse9"), Error);
  EXPECT_TRUE(isa_supported(Isa::kScalar));
}

}  // namespace
}  // namespace zero
