// Quantized collectives (see zero/comm/quantized_comm.hpp): the packing is DeviceOps' quantize and
// dequantize-sum (zero/device/quantize.hpp's math on either device), the transport the
// communicator's byte-preserving all_gather / all_to_all with the chunks as f32 elements.
#include "zero/comm/quantized_comm.hpp"

#include <cstdint>

#include "zero/core/error.hpp"
#include "zero/device/quantize.hpp"

namespace zero {

namespace {

char* byte_at(void* p, std::size_t bytes) { return static_cast<char*>(p) + bytes; }
const char* byte_at(const void* p, std::size_t bytes) {
  return static_cast<const char*>(p) + bytes;
}

void check_block(const char* what, std::size_t block) {
  ZERO_CHECK(block >= 1, kInvalidArgument, what, ": quantization block must be >= 1, got ", block);
}

// The chunk of `count` elements at `chunk`, quantized from src.
void pack(DeviceOps& dev, const void* src, DType dtype, const QuantizedChunk& c, void* chunk) {
  dev.quantize_int8(src, dtype, c.count, c.block, static_cast<std::int8_t*>(chunk),
                    reinterpret_cast<float*>(byte_at(chunk, c.scales_offset())));
}

float divisor_of(const char* what, ReduceOp op, int size) {
  ZERO_CHECK(op == ReduceOp::kSum || op == ReduceOp::kAvg, kInvalidArgument, what, ": reduce op ",
             to_string(op), " is not supported (sum or avg)");
  return op == ReduceOp::kAvg ? static_cast<float>(size) : 1.0f;
}

}  // namespace

std::size_t QuantizedChunk::bytes() const {
  const std::size_t raw = scales_offset() + sizeof(float) * num_blocks(count, block);
  return (raw + kAlign - 1) / kAlign * kAlign;
}

// ---- all-gather

std::size_t quantized_all_gather_staging_bytes(int ranks, std::size_t count, std::size_t block) {
  check_block("quantized all_gather", block);
  return static_cast<std::size_t>(ranks) * QuantizedChunk{count, block}.bytes();
}

CommHandle start_quantized_all_gather(Communicator& comm, DeviceOps& dev, const void* send,
                                      std::size_t count, DType dtype, std::size_t block,
                                      void* staging) {
  check_block("quantized all_gather", block);
  const QuantizedChunk c{count, block};
  char* own = byte_at(staging, static_cast<std::size_t>(comm.rank()) * c.bytes());
  pack(dev, send, dtype, c, own);
  return comm.all_gather_async(own, staging, c.bytes() / sizeof(float), DType::kF32);
}

void finish_quantized_all_gather(const Communicator& comm, DeviceOps& dev, const void* staging,
                                 void* recv, std::size_t count, DType dtype, std::size_t block) {
  const QuantizedChunk c{count, block};
  const std::size_t es = dtype_size(dtype);
  for (int q = 0; q < comm.size(); ++q) {
    const auto qs = static_cast<std::size_t>(q);
    dev.dequantize_sum_int8(byte_at(staging, qs * c.bytes()), c.bytes(), c.scales_offset(), 1,
                            count, block, 1.0f, byte_at(recv, qs * count * es), dtype);
  }
}

void quantized_all_gather(Communicator& comm, DeviceOps& dev, const void* send, void* recv,
                          std::size_t count, DType dtype, std::size_t block, void* staging) {
  start_quantized_all_gather(comm, dev, send, count, dtype, block, staging).wait();
  finish_quantized_all_gather(comm, dev, staging, recv, count, dtype, block);
}

// ---- reduce-scatter

std::size_t quantized_reduce_scatter_staging_bytes(int ranks, std::size_t recv_count,
                                                   std::size_t block) {
  check_block("quantized reduce_scatter", block);
  return 2 * static_cast<std::size_t>(ranks) * QuantizedChunk{recv_count, block}.bytes();
}

CommHandle start_quantized_reduce_scatter(Communicator& comm, DeviceOps& dev, const void* send,
                                          std::size_t recv_count, DType dtype, std::size_t block,
                                          void* staging) {
  check_block("quantized reduce_scatter", block);
  const QuantizedChunk c{recv_count, block};
  const auto n = static_cast<std::size_t>(comm.size());
  const std::size_t es = dtype_size(dtype);
  for (std::size_t q = 0; q < n; ++q) {
    pack(dev, byte_at(send, q * recv_count * es), dtype, c, byte_at(staging, q * c.bytes()));
  }
  return comm.all_to_all_async(staging, byte_at(staging, n * c.bytes()), c.bytes() / sizeof(float),
                               DType::kF32);
}

void finish_quantized_reduce_scatter(const Communicator& comm, DeviceOps& dev, const void* staging,
                                     void* recv, std::size_t recv_count, DType dtype,
                                     std::size_t block, ReduceOp op) {
  const QuantizedChunk c{recv_count, block};
  const auto n = static_cast<std::size_t>(comm.size());
  const float divisor = divisor_of("quantized reduce_scatter", op, comm.size());
  dev.dequantize_sum_int8(byte_at(staging, n * c.bytes()), c.bytes(), c.scales_offset(),
                          comm.size(), recv_count, block, divisor, recv, dtype);
}

void quantized_reduce_scatter(Communicator& comm, DeviceOps& dev, const void* send, void* recv,
                              std::size_t recv_count, DType dtype, std::size_t block, ReduceOp op,
                              void* staging) {
  divisor_of("quantized reduce_scatter", op, comm.size());  // refuse before sending
  start_quantized_reduce_scatter(comm, dev, send, recv_count, dtype, block, staging).wait();
  finish_quantized_reduce_scatter(comm, dev, staging, recv, recv_count, dtype, block, op);
}

// ---- all-reduce

std::size_t quantized_all_reduce_staging_bytes(int ranks, std::size_t count, std::size_t block) {
  return quantized_all_gather_staging_bytes(ranks, count, block);
}

void quantized_all_reduce(Communicator& comm, DeviceOps& dev, void* buf, std::size_t count,
                          DType dtype, std::size_t block, ReduceOp op, void* staging) {
  divisor_of("quantized all_reduce", op, comm.size());  // refuse before sending
  start_quantized_all_gather(comm, dev, buf, count, dtype, block, staging).wait();
  finish_quantized_all_reduce(comm, dev, staging, buf, count, dtype, block, op);
}

void finish_quantized_all_reduce(const Communicator& comm, DeviceOps& dev, const void* staging,
                                 void* buf, std::size_t count, DType dtype, std::size_t block,
                                 ReduceOp op) {
  const float divisor = divisor_of("quantized all_reduce", op, comm.size());
  const QuantizedChunk c{count, block};
  dev.dequantize_sum_int8(static_cast<const char*>(staging), c.bytes(), c.scales_offset(),
                          comm.size(), count, block, divisor, buf, dtype);
}

}  // namespace zero
