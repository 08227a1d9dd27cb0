#include "zero/core/cpu_features.hpp"

#include <cpuid.h>

#include <cstdlib>
#include <string>

#include "zero/core/error.hpp"

namespace zero {

namespace {

std::uint64_t xgetbv0() {
  std::uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (std::uint64_t{edx} << 32) | eax;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(1, &a, &b, &c, &d) == 0) return f;
  const bool osxsave = (c & bit_OSXSAVE) != 0;
  const bool avx = (c & bit_AVX) != 0;
  const bool fma = (c & bit_FMA) != 0;
  const bool f16c = (c & bit_F16C) != 0;
  if (!osxsave || !avx) return f;
  const std::uint64_t xcr0 = xgetbv0();
  const bool ymm_ok = (xcr0 & 0x6) == 0x6;    // SSE + AVX state
  const bool zmm_ok = (xcr0 & 0xe6) == 0xe6;  // + opmask, ZMM_Hi256, Hi16_ZMM
  if (!ymm_ok) return f;
  f.f16c = f16c;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return f;
  f.avx2 = (b & bit_AVX2) != 0 && fma;
  f.avx512 = zmm_ok && (b & bit_AVX512F) != 0 && (b & bit_AVX512BW) != 0 &&
             (b & bit_AVX512VL) != 0 && (b & bit_AVX512DQ) != 0 && f.avx2;
  unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
  if (f.avx512 && __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1) != 0) {
    f.avx512_bf16 = (a1 & (1u << 5)) != 0;
  }
  return f;
}

Isa detect_best(const CpuFeatures& f) {
  // The AVX-512 and AVX2 paths also use F16C for f16; a CPU with AVX2 but no F16C does not exist
  // in practice, but keep the check honest.
  if (f.avx512 && f.f16c) return Isa::kAvx512;
  if (f.avx2 && f.f16c) return Isa::kAvx2;
  return Isa::kScalar;
}

}  // namespace

const CpuFeatures& cpu_features() noexcept {
  static const CpuFeatures features = detect();
  return features;
}

bool isa_supported(Isa isa) noexcept {
  return static_cast<int>(isa) <= static_cast<int>(detect_best(cpu_features()));
}

Isa best_isa() {
  static const Isa isa = [] {
    const Isa hw = detect_best(cpu_features());
    const char* env = std::getenv("ZERO_ISA");
    if (env == nullptr || *env == '\0') return hw;
    const Isa want = parse_isa(env);
    ZERO_CHECK(isa_supported(want), kInvalidArgument, "ZERO_ISA=", env,
               " asks for an instruction set this CPU does not have (best available: ",
               to_string(hw), ")");
    return want;
  }();
  return isa;
}

std::string_view to_string(Isa isa) noexcept {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "unknown";
}

Isa parse_isa(std::string_view name) {
  if (name == "scalar") return Isa::kScalar;
  if (name == "avx2") return Isa::kAvx2;
  if (name == "avx512") return Isa::kAvx512;
  ZERO_THROW(kInvalidArgument, "unknown ISA '", std::string(name),
             "' (expected scalar, avx2 or avx512)");
}

}  // namespace zero
