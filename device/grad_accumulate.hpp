// device/grad_accumulate.hpp — dst (=|+=) src across element types, for gradient accumulation.
//
// first: dst = src converted to dst's type; otherwise dst = dst + src computed in f32 and
// rounded once to dst's type. Elementwise and deterministic (the result does not depend on how
// the work is split). Parallel over oneTBB.
//
// Thread safety: safe on disjoint destinations.
#pragma once

#include <cstddef>

#include "zero/core/dtype.hpp"

namespace zero::detail {

void accumulate(void* dst, DType dst_type, const void* src, DType src_type, std::size_t n,
                bool first);

}  // namespace zero::detail
