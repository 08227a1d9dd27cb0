// zero/core/cpu_features.hpp — which SIMD paths this CPU can run, decided once at run time.
//
// The library is built for baseline x86-64 (never -march=native); hot loops have AVX-512 and
// AVX2 variants compiled with function target attributes and are chosen here. The environment
// variable ZERO_ISA (scalar | avx2 | avx512) caps the choice, so tests and benchmarks can run
// every path the machine has; asking for a path the CPU lacks is a zero::Error.
//
// Thread safety: all functions are safe to call concurrently (results are computed once).
#pragma once

#include <cstdint>
#include <string_view>

namespace zero {

enum class Isa : std::uint8_t { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

struct CpuFeatures {
  bool avx2 = false;         // AVX2 + FMA
  bool f16c = false;         // F16C (f16 <-> f32 conversion)
  bool avx512 = false;       // AVX512 F + BW + VL + DQ
  bool avx512_bf16 = false;  // AVX512_BF16 (vcvtneps2bf16)
};

// What the CPU (and OS, via XGETBV) supports.
const CpuFeatures& cpu_features() noexcept;

// The best ISA the CPU supports, capped by ZERO_ISA when set (read once).
Isa best_isa();

// True when `isa` can run on this CPU.
bool isa_supported(Isa isa) noexcept;

std::string_view to_string(Isa isa) noexcept;
// "scalar" | "avx2" | "avx512"; throws zero::Error(kInvalidArgument) otherwise.
Isa parse_isa(std::string_view name);

}  // namespace zero
