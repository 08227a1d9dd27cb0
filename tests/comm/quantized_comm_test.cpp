// The quantized collectives (zero/comm/quantized_comm.hpp) over in-process ranks: all-gather,
// reduce-scatter and all-reduce within the block-wise int8 bound on random and adversarial data
// (constant blocks, one outlier per block, zeros) for every dtype, odd counts and block sizes at
// 1 to 5 ranks; the wire volume; non-finite input refused on the rank that holds it, naming the
// element, the others failing promptly instead of hanging.
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "comm/quantized_checks.hpp"
#include "common/expect_error.hpp"
#include "zero/comm/comm.hpp"
#include "zero/comm/quantized_comm.hpp"
#include "zero/device/device_ops.hpp"

namespace zero::test {
namespace {

TEST(QuantizedComm, EveryCollectiveStaysWithinTheBound) {
  for (int n : {1, 2, 3, 4, 5}) {
    ThreadGroup::run(n, [&](Communicator& c) {
      CpuDeviceOps dev;
      run_quantized_matrix(c, dev, 900 + 10 * n);
    });
  }
}

TEST(QuantizedComm, TheWireCarriesOneBytePerElementPlusScales) {
  ThreadGroup::run(4, [](Communicator& c) {
    CpuDeviceOps dev;
    const std::size_t count = 4096, block = 256;
    const QuantizedChunk chunk{count, block};
    EXPECT_EQ(chunk.bytes(), 4096u + 16 * 4);
    std::vector<float> full(4 * count, 0.5f), part(count);
    std::vector<char> staging(quantized_reduce_scatter_staging_bytes(c.size(), count, block));
    c.reset_stats();
    quantized_reduce_scatter(c, dev, full.data(), part.data(), count, DType::kF32, block,
                             ReduceOp::kAvg, staging.data());
    quantized_all_gather(c, dev, part.data(), full.data(), count, DType::kF32, block,
                         staging.data());
    const CommStats s = c.stats();
    // (N - 1) chunks each way, against (N - 1) x 16 KiB for the f32 collectives.
    EXPECT_EQ(s[Collective::kAllToAll].bytes_sent, 3 * chunk.bytes());
    EXPECT_EQ(s[Collective::kAllGather].bytes_sent, 3 * chunk.bytes());
    EXPECT_EQ(s[Collective::kReduceScatter].calls, 0u);
    for (float v : full) ASSERT_EQ(v, 0.5f);  // a constant comes back exactly
  });
}

TEST(QuantizedComm, NonFiniteInputIsRefusedNamingTheElementAndNoRankHangs) {
  for (bool gather : {true, false}) {
    try {
      ThreadGroup::run(
          3,
          [&](Communicator& c) {
            CpuDeviceOps dev;
            const std::size_t count = 600;
            std::vector<float> send(3 * count, 1.0f), recv(3 * count);
            if (c.rank() == 1) send[517] = -std::numeric_limits<float>::infinity();
            std::vector<char> staging(quantized_reduce_scatter_staging_bytes(c.size(), count, 256));
            if (gather) {
              quantized_all_gather(c, dev, send.data(), recv.data(), count, DType::kF32, 256,
                                   staging.data());
            } else {
              quantized_reduce_scatter(c, dev, send.data(), recv.data(), count, DType::kF32, 256,
                                       ReduceOp::kSum, staging.data());
            }
          },
          30.0);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(ErrorCode::kInvalidArgument, e.code()) << e.what();
      EXPECT_NE(std::string::npos, e.message().find("element 517 (block 2 of 256 elements)"))
          << e.what();
      EXPECT_NE(std::string::npos, e.message().find("-inf")) << e.what();
    }
  }
}

TEST(QuantizedComm, BadArgumentsAreRefused) {
  ThreadGroup::run(2, [](Communicator& c) {
    CpuDeviceOps dev;
    std::vector<float> buf(64);
    std::vector<char> staging(4096);
    testing::expect_error(
        [&] {
          quantized_reduce_scatter(c, dev, buf.data(), buf.data(), 16, DType::kF32, 8,
                                   ReduceOp::kMax, staging.data());
        },
        ErrorCode::kInvalidArgument, "reduce op max is not supported");
    testing::expect_error([&] { (void)quantized_all_gather_staging_bytes(c.size(), 16, 0); },
                          ErrorCode::kInvalidArgument, "quantization block must be >= 1");
  });
}

}  // namespace
}  // namespace zero::test
