// NVTX ranges (see core/nvtx.hpp).
#include "core/nvtx.hpp"

#if ZERO_WITH_CUDA
#include <nvtx3/nvToolsExt.h>  // header-only NVTX 3 (CUDA toolkit)
#endif

namespace zero::detail {

#if ZERO_WITH_CUDA
void nvtx_push(const char* name) noexcept { nvtxRangePushA(name); }
void nvtx_pop() noexcept { nvtxRangePop(); }
#else
void nvtx_push(const char*) noexcept {}
void nvtx_pop() noexcept {}
#endif

}  // namespace zero::detail
