// tests/common/gpu_rank.hpp — what the GPU tests (comm, engine, kernels) share: the skip when
// there is no CUDA device, and one rank's single-GPU NCCL communicator (world size 1 on cuda:0:
// NCCL refuses two ranks on one GPU). Thread safety: the test's thread.
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "zero/comm/comm.hpp"
#include "zero/device/detail/cuda_runtime.hpp"

#define REQUIRE_DEVICE()                                                                \
  do {                                                                                  \
    if (::zero::detail::cuda::device_count() == 0) {                                    \
      GTEST_SKIP() << "no CUDA device: " << ::zero::detail::cuda::unavailable_reason(); \
    }                                                                                   \
  } while (0)

namespace zero::testing {

// Rank 0 of 1 on cuda:0 over NCCL; collectives wait for `stream` (a cudaStream_t; null: the
// legacy default stream), which must be the engine's EngineOptions::cuda_stream.
inline std::unique_ptr<Communicator> single_gpu_comm(void* stream = nullptr) {
  CommOptions co;
  co.timeout_s = 120;
  co.backend = "nccl";
  co.rank = 0;
  co.size = 1;
  co.local_rank = 0;
  co.cuda_stream = stream;
  return make_communicator(co);
}

}  // namespace zero::testing
