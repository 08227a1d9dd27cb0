// The GPU's block-wise int8 quantization against the CPU path (zero/device/quantize.hpp): the same
// int8 values, scales and dequantized f32 bits on random data of odd sizes, adversarial blocks, and
// the first non-finite element reported through the device word. Without a device the
// comparisons skip and say why; bad arguments are kInvalidArgument and a well-formed launch is
// kCuda, never a crash.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "zero/core/error.hpp"
#include "zero/device/detail/cuda_runtime.hpp"
#include "zero/device/detail/kernels.hpp"
#include "zero/device/quantize.hpp"

namespace zero {
namespace {

namespace k = detail::kernels;

void ok(cudaError_t e, const char* what) {
  ASSERT_EQ(e, cudaSuccess) << what << ": " << cudaGetErrorString(e);
}

template <typename T>
struct Device {
  T* p = nullptr;
  std::size_t n = 0;
  explicit Device(std::size_t count) : n(count) {
    ok(cudaMalloc(&p, std::max<std::size_t>(1, n) * sizeof(T)), "cudaMalloc");
  }
  Device(const std::vector<T>& host) : Device(host.size()) {
    if (n > 0) ok(cudaMemcpy(p, host.data(), n * sizeof(T), cudaMemcpyHostToDevice), "H2D");
  }
  ~Device() { cudaFree(p); }
  std::vector<T> read() const {
    std::vector<T> out(n);
    if (n > 0) ok(cudaMemcpy(out.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "D2H");
    return out;
  }
};

TEST(QuantizeKernel, SameBitsAsTheCpu) {
  if (detail::cuda::device_count() == 0) {
    GTEST_SKIP() << "no CUDA device: " << detail::cuda::unavailable_reason();
  }
  std::mt19937 rng(41);
  std::normal_distribution<float> n(0.0f, 2.0f);
  for (std::size_t block : {1u, 255u, 256u, 2048u, 5000u}) {
    for (std::size_t count : {1u, 1000u, 65537u}) {
      std::vector<float> x(count);
      for (float& v : x) v = n(rng);
      for (std::size_t i = 0; i < std::min<std::size_t>(count, block); ++i) x[i] = 0.0f;  // zeros
      std::vector<std::int8_t> q(count);
      std::vector<float> s(num_blocks(count, block)), back(count, 0.5f);
      quantize_int8(x.data(), count, block, q.data(), s.data(), Isa::kScalar);
      dequantize_add_int8(q.data(), s.data(), count, block, back.data(), Isa::kScalar);
      Device<float> dx(x), ds(s.size()), dback(std::vector<float>(count, 0.5f));
      Device<std::int8_t> dq(count);
      Device<unsigned long long> bad(std::vector<unsigned long long>{~0ull});
      k::quantize_int8(dx.p, count, block, dq.p, ds.p, bad.p, nullptr);
      k::dequantize_int8(dq.p, ds.p, count, block, dback.p, /*add=*/true, nullptr);
      ok(cudaDeviceSynchronize(), "quantize");
      const std::string what = "block " + std::to_string(block) + " count " + std::to_string(count);
      EXPECT_EQ(dq.read(), q) << what;
      const std::vector<float> gs = ds.read(), gb = dback.read();
      EXPECT_EQ(std::memcmp(gs.data(), s.data(), s.size() * 4), 0) << what;
      EXPECT_EQ(std::memcmp(gb.data(), back.data(), count * 4), 0) << what;
      EXPECT_EQ(bad.read()[0], ~0ull) << what;
      x[count - 1] = std::numeric_limits<float>::infinity();
      if (count > 2) x[count / 2] = std::numeric_limits<float>::quiet_NaN();
      Device<float> dx2(x);
      Device<unsigned long long> bad2(std::vector<unsigned long long>{~0ull});
      k::quantize_int8(dx2.p, count, block, dq.p, ds.p, bad2.p, nullptr);
      ok(cudaDeviceSynchronize(), "quantize non-finite");
      EXPECT_EQ(bad2.read()[0], count > 2 ? count / 2 : count - 1) << what;
    }
  }
}

TEST(QuantizeKernel, BadArgumentsAndNoDevice) {
  EXPECT_THROW(k::quantize_int8(nullptr, 4, 256, nullptr, nullptr, nullptr, nullptr), Error);
  EXPECT_THROW(k::dequantize_int8(nullptr, nullptr, 4, 0, nullptr, false, nullptr), Error);
  EXPECT_NO_THROW(k::quantize_int8(nullptr, 0, 256, nullptr, nullptr, nullptr, nullptr));
  if (detail::cuda::device_count() > 0) return;
  static float x[4];
  static std::int8_t q[4];
  static float s[1];
  try {
    k::quantize_int8(x, 4, 256, q, s, nullptr, nullptr);
    ADD_FAILURE() << "no error without a device";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCuda) << e.what();
  }
}

}  // namespace
}  // namespace zero
