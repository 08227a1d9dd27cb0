// core/nvtx.hpp — NVTX ranges on the calling thread (zero/core/trace.hpp's TraceScope): Nsight
// Systems shows them; without a profiler attached NVTX does nothing. No-ops in a build without
// CUDA (NVTX 3 is header-only: nothing is linked).
#pragma once

namespace zero::detail {

void nvtx_push(const char* name) noexcept;
void nvtx_pop() noexcept;

}  // namespace zero::detail
