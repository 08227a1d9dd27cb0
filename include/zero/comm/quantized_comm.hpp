// zero/comm/quantized_comm.hpp — quantized collectives: the block-wise int8 all-gather of ZeRO++'s
// qwZ, the int8 reduce-scatter of its qgZ (an all-to-all of quantized chunks, then the reduction
// in f32 of what each rank sent, read back — never a sum of int8), and an all-reduce for the
// replicas of hybrid sharding built from the all-gather (every rank sums the same read-back
// chunks in rank order, so every replica ends with the same bits).
//
// Wire format: a rank's `count` elements travel as one packed chunk (QuantizedChunk): the int8
// values, then one f32 scale per block of `block` elements (zero/device/quantize.hpp's layout),
// padded to 16 bytes. Chunks ride the communicator as f32 elements (all_gather / all_to_all move
// bytes unchanged). Bytes on the wire per element: 1 + 4 / block, against 2 or 4 unquantized.
//
// Error: every element comes back within m / 254 (1 + 2^-13) of what was sent, m the absolute
// maximum of its block on the rank that sent it (zero/device/detail/quantize_math.hpp); a reduction
// of N ranks is within the sum of its N contributions' bounds (plus the f32 sum's rounding and the
// final rounding to the buffer's dtype). Non-finite input is zero::Error(kInvalidArgument) naming
// the element, raised on the rank that holds it before anything is sent; the other ranks' waits
// then fail (kRemoteFailure / kTimeout) as for any collective a rank left.
//
// Buffers are the DeviceOps' memory (host memory on the CPU device, device memory with NCCL);
// `staging` is caller-owned memory of the *_staging_bytes(size(), ...) size, untouched while
// the collective is in flight. The start / finish pairs let a caller overlap the transfer with
// compute: start, wait on the handle, finish.
//
// Thread safety: as the communicator's — one rank's thread.
#pragma once

#include <cstddef>

#include "zero/comm/comm.hpp"
#include "zero/core/dtype.hpp"
#include "zero/device/device_ops.hpp"

namespace zero {

// Elements per quantization block unless configured (zero_optimization.quantization_block_size).
inline constexpr std::size_t kDefaultQuantBlock = 256;

// One rank's packed chunk of `count` elements in blocks of `block`.
struct QuantizedChunk {
  std::size_t count = 0;
  std::size_t block = kDefaultQuantBlock;
  static constexpr std::size_t kAlign = 16;
  std::size_t scales_offset() const noexcept { return (count + kAlign - 1) / kAlign * kAlign; }
  std::size_t bytes() const;  // the chunk, a multiple of kAlign
};

// ---- qwZ: all-gather

// Staging sizes take the group's rank count (the engine's placement sizes its pools with them).
std::size_t quantized_all_gather_staging_bytes(int ranks, std::size_t count, std::size_t block);
// Quantizes `send` (this rank's `count` elements of `dtype`) into this rank's chunk of `staging`
// and starts the all-gather of the chunks. `send` may lie inside the later `recv`.
CommHandle start_quantized_all_gather(Communicator& comm, DeviceOps& dev, const void* send,
                                      std::size_t count, DType dtype, std::size_t block,
                                      void* staging);
// After the handle completed: recv (size() x count elements of `dtype`) = every rank's chunk
// read back, rank q's at q x count.
void finish_quantized_all_gather(const Communicator& comm, DeviceOps& dev, const void* staging,
                                 void* recv, std::size_t count, DType dtype, std::size_t block);
void quantized_all_gather(Communicator& comm, DeviceOps& dev, const void* send, void* recv,
                          std::size_t count, DType dtype, std::size_t block, void* staging);

// ---- qgZ: reduce-scatter

std::size_t quantized_reduce_scatter_staging_bytes(int ranks, std::size_t recv_count,
                                                   std::size_t block);
// Quantizes each of the size() chunks of `send` (size() x recv_count elements of `dtype`)
// into `staging` and starts the all-to-all that brings every rank's chunk r to rank r.
CommHandle start_quantized_reduce_scatter(Communicator& comm, DeviceOps& dev, const void* send,
                                          std::size_t recv_count, DType dtype, std::size_t block,
                                          void* staging);
// After the handle completed: recv (recv_count elements of `dtype`, may lie inside the send
// buffer) = the f32 sum in rank order of the received chunks read back, divided by size() for
// kAvg. REQUIRES: op is kSum or kAvg.
void finish_quantized_reduce_scatter(const Communicator& comm, DeviceOps& dev, const void* staging,
                                     void* recv, std::size_t recv_count, DType dtype,
                                     std::size_t block, ReduceOp op);
void quantized_reduce_scatter(Communicator& comm, DeviceOps& dev, const void* send, void* recv,
                              std::size_t recv_count, DType dtype, std::size_t block, ReduceOp op,
                              void* staging);

// ---- all-reduce (hybrid sharding's replicas)

std::size_t quantized_all_reduce_staging_bytes(int ranks, std::size_t count, std::size_t block);
// In place on `buf` (count elements of `dtype`): an all-gather of quantized chunks, then every
// rank sums all of them read back, in rank order (its own too: the replicas stay identical).
// Bytes sent per rank: (size() - 1) x the chunk, against 2 (size() - 1) / size() x the
// unquantized buffer of a ring all-reduce: fewer for f32 up to size() = 7 (bf16: 3), the group
// counts hybrid sharding replicates over. REQUIRES: op is kSum or kAvg.
void quantized_all_reduce(Communicator& comm, DeviceOps& dev, void* buf, std::size_t count,
                          DType dtype, std::size_t block, ReduceOp op, void* staging);
// The asynchronous form: start_quantized_all_gather(comm, dev, buf, ...) into `staging`, wait,
// then this: buf = the sum (kAvg: mean) of every rank's chunk read back, in rank order.
void finish_quantized_all_reduce(const Communicator& comm, DeviceOps& dev, const void* staging,
                                 void* buf, std::size_t count, DType dtype, std::size_t block,
                                 ReduceOp op);

}  // namespace zero
