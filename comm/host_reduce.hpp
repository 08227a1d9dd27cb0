// comm/host_reduce.hpp — the element-wise reduction arithmetic of the host backends.
//
// One definition of sum / avg / max over f32, f16 and bf16, accumulating in fp32, shared by the
// in-process backend (which reduces a block of every rank's buffer at once) and the MPI
// backend's user-defined ops (which combine two buffers). max propagates NaN: a NaN in any input
// gives NaN (the fp16 overflow check depends on seeing it).
//
// Thread safety: pure functions on caller-owned memory; safe to call concurrently.
#pragma once

#include <cstddef>

#include "zero/comm/comm.hpp"

namespace zero::detail {

// Elements per block of the blocked reductions: 16 KiB of fp32 accumulator plus a conversion
// buffer stay in L1/L2 while every rank's block streams through.
inline constexpr std::size_t kReduceBlock = 4096;

// acc[i] = op over s of srcs[s][offset + i] for i < len, in the order s = 0, 1, ..., n-1
// (the fixed order the in-process determinism rests on); avg divides the fp32 sum by `n`.
// REQUIRES: len <= kReduceBlock, acc and scratch hold kReduceBlock floats.
void reduce_block(const void* const* srcs, int n, std::size_t offset, std::size_t len, DType dtype,
                  ReduceOp op, float* acc, float* scratch);

// inout[i] = op(in[i], inout[i]) for i < len (sum or max; avg is a sum followed by
// divide_by()). 16-bit values are combined in fp32 and rounded once.
void combine(const void* in, void* inout, std::size_t len, DType dtype, ReduceOp op);

// buf[i] /= divisor in fp32 (then rounded once for 16-bit types).
void divide_by(void* buf, std::size_t len, DType dtype, float divisor);

// Copies `bytes` from src to dst. With `streaming`, the stores bypass the cache (SSE2
// non-temporal stores, baseline x86-64): for results nobody reads soon this saves the
// read-for-ownership of every destination line, a third of a copy's memory traffic. Streaming
// stores are weakly ordered: call stream_fence() before another thread may read dst.
void copy_out(void* dst, const void* src, std::size_t bytes, bool streaming);
void stream_fence();

// Results of at least this size (bytes written by one rank in one collective) are stored
// streaming: half the 32 MiB L3 of the machines we measure on, so they would mostly be evicted
// before anyone reads them anyway; smaller results stay in cache for the consumer.
inline constexpr std::size_t kStreamingThreshold = std::size_t{16} << 20;

}  // namespace zero::detail
