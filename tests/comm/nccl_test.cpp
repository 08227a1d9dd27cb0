// The NCCL backend at world size 1 on one GPU (NCCL refuses two ranks on one GPU; multi-rank runs
// need a multi-GPU machine and torchrun / mpirun). Skips with the reason when there is no GPU;
// the error a missing GPU gives is checked everywhere.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "comm/collective_checks.hpp"
#include "common/gpu_rank.hpp"
#include "zero/comm/comm.hpp"
#include "zero/device/detail/cuda_runtime.hpp"

namespace zero::test {
namespace {

bool have_gpu() { return detail::cuda::device_count() > 0; }

using zero::testing::single_gpu_comm;

#define CUDA_OK(call) ASSERT_EQ(cudaSuccess, (call)) << #call

// A GuardedBuffer mirrored in device memory (guards included).
class DeviceMirror {
 public:
  explicit DeviceMirror(GuardedBuffer& host) : host_(host) {
    EXPECT_EQ(cudaSuccess, cudaMalloc(&dev_, host.raw_size()));
    upload();
  }
  ~DeviceMirror() { cudaFree(dev_); }
  void* data() { return static_cast<char*>(dev_) + host_.guard_bytes(); }
  void upload() { cudaMemcpy(dev_, host_.raw(), host_.raw_size(), cudaMemcpyHostToDevice); }
  void download() { cudaMemcpy(host_.raw(), dev_, host_.raw_size(), cudaMemcpyDeviceToHost); }

 private:
  GuardedBuffer& host_;
  void* dev_ = nullptr;
};

TEST(Nccl, WithoutADeviceTheBackendIsACudaError) {
  if (have_gpu()) GTEST_SKIP() << "a CUDA device is present";
  try {
    single_gpu_comm();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(ErrorCode::kCuda, e.code()) << e.what();
    EXPECT_NE(std::string::npos, e.message().find("no CUDA device")) << e.what();
  }
  // auto never picks NCCL without a device, even for device buffers.
  CommOptions options;
  options.device_buffers = true;
  EXPECT_EQ("thread", make_communicator(options)->backend());
}

TEST(Nccl, EveryCollectiveMatchesReferenceOnOneGpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << detail::cuda::unavailable_reason();
  auto c = single_gpu_comm();
  EXPECT_EQ("nccl", c->backend());
  std::uint64_t seed = 1;
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{97}, std::size_t{4099},
                              (std::size_t{64} << 20) / dtype_size(t) + 3}) {
      for (bool in_place : {false, true}) {
        const std::string where =
            detail::cat(to_string(t), " count ", count, in_place ? " in-place" : " out-of-place");
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
          ++seed;
          GuardedBuffer send(count, t), recv(count, t);
          send.fill_input(seed, 0, 0, count);
          DeviceMirror ds(send), dr(recv);
          c->all_reduce(ds.data(), in_place ? ds.data() : dr.data(), count, t, op);
          GuardedBuffer& out = in_place ? send : recv;
          (in_place ? ds : dr).download();
          EXPECT_TRUE(out.guards_intact()) << where;
          EXPECT_EQ("", compare(out.data(), count, t, 0,
                                [&](std::size_t i) {
                                  return expected_reduction(seed, 1, i, t, op,
                                                            Exactness::kTolerance);
                                }))
              << "all_reduce " << to_string(op) << " " << where;
          // reduce_scatter at size 1 is an all_reduce of recv_count elements.
          GuardedBuffer rs(count, t);
          DeviceMirror drs(rs);
          send.fill_input(seed, 0, 0, count);
          ds.upload();
          c->reduce_scatter(ds.data(), in_place ? ds.data() : drs.data(), count, t, op);
          (in_place ? ds : drs).download();
          EXPECT_EQ("", compare((in_place ? send : rs).data(), count, t, 0,
                                [&](std::size_t i) {
                                  return expected_reduction(seed, 1, i, t, op,
                                                            Exactness::kTolerance);
                                }))
              << "reduce_scatter " << to_string(op) << " " << where;
        }
        ++seed;
        GuardedBuffer send(count, t), recv(count, t);
        send.fill_input(seed, 0, 0, count);
        DeviceMirror ds(send), dr(recv);
        CommHandle h = c->all_gather_async(ds.data(), in_place ? ds.data() : dr.data(), count, t);
        CommHandle b = c->broadcast_async(ds.data(), dr.data(), count, t, 0);
        b.wait();
        EXPECT_TRUE(h.test()) << "issue order";
        dr.download();
        EXPECT_EQ("", compare(recv.data(), count, t, 0,
                              [&](std::size_t i) {
                                return Expected{input_value(seed, 0, i, t), 0.0};
                              }))
            << "all_gather + broadcast " << where;
      }
    }
  }
  c->barrier();
  auto sub = c->split(0, 0);
  ASSERT_NE(nullptr, sub);
  EXPECT_EQ(std::vector<int>{0}, sub->world_ranks());
  sub->barrier();
  EXPECT_GT(c->stats()[Collective::kAllReduce].calls, 0u);
}

}  // namespace
}  // namespace zero::test
