// zero/core/detail/dtype_convert.hpp — bulk converters with the ISA chosen by the caller.
//
// zero::convert() and friends dispatch on zero::best_isa(); these entry points take the ISA
// explicitly so tests and benchmarks can run every path this CPU has. REQUIRES:
// isa_supported(isa), else zero::Error(kInvalidArgument).
#pragma once

#include <cstddef>
#include <cstdint>

#include "zero/core/cpu_features.hpp"

namespace zero::detail {

void f32_to_bf16(Isa isa, const float* src, std::uint16_t* dst, std::size_t n);
void bf16_to_f32(Isa isa, const std::uint16_t* src, float* dst, std::size_t n);
void f32_to_f16(Isa isa, const float* src, std::uint16_t* dst, std::size_t n);
void f16_to_f32(Isa isa, const std::uint16_t* src, float* dst, std::size_t n);

}  // namespace zero::detail
