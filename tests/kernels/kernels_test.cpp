// The CUDA kernels against the CPU path: the optimizer step bit for bit (the same per-element
// functions: an FMA exactly where they write fma(), no other contraction on either side),
// grad_stats to 1e-12 relative, scale and cast bit for bit. Without a device the GPU comparisons
// skip and say why; the launchers must then fail with zero::Error(kCuda), and bad arguments with
// kInvalidArgument, never crash.
// (A test may use the CUDA runtime directly for copies; the library keeps it in kernels/.)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/gpu_rank.hpp"
#include "device/grad_accumulate.hpp"
#include "zero/core/dtype.hpp"
#include "zero/core/error.hpp"
#include "zero/device/detail/cuda_runtime.hpp"
#include "zero/device/detail/kernels.hpp"
#include "zero/optim/optimizer.hpp"

namespace zero {
namespace {

namespace k = detail::kernels;

bool have_device() { return detail::cuda::device_count() > 0; }

void ok(cudaError_t e, const char* what) {
  ASSERT_EQ(e, cudaSuccess) << what << ": " << cudaGetErrorString(e);
}

// A device array holding a host vector, with `offset_bytes` of misalignment.
struct DeviceArray {
  char* base = nullptr;
  void* data = nullptr;
  std::size_t bytes = 0;
  DeviceArray(const void* host, std::size_t nbytes, std::size_t offset_bytes) : bytes(nbytes) {
    ok(cudaMalloc(&base, nbytes + 64), "cudaMalloc");
    data = base + offset_bytes;
    if (nbytes > 0) ok(cudaMemcpy(data, host, nbytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { cudaFree(base); }
  template <typename T>
  std::vector<T> read() const {
    std::vector<T> out(bytes / sizeof(T));
    if (bytes > 0)
      ok(cudaMemcpy(out.data(), data, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    return out;
  }
};

std::vector<OptimizerParams> variants() {
  std::vector<OptimizerParams> v;
  OptimizerParams p;
  p.weight_decay = 0.01;
  v.push_back(p);  // AdamW
  p.moment_dtype = MomentDType::kBF16;
  v.push_back(p);
  p = {};
  p.type = OptimizerType::kAdam;
  p.adam_w_mode = false;
  p.weight_decay = 0.05;
  v.push_back(p);
  p = {};
  p.type = OptimizerType::kSgd;
  p.lr = 0.05;
  v.push_back(p);
  p.momentum = 0.9;
  p.dampening = 0.1;
  v.push_back(p);
  p.dampening = 0;
  p.nesterov = true;
  v.push_back(p);
  p = {};
  p.type = OptimizerType::kLion;
  p.lr = 1e-4;
  p.weight_decay = 0.1;
  v.push_back(p);
  p = {};
  p.type = OptimizerType::kAdagrad;
  p.lr = 1e-2;
  p.weight_decay = 0.01;
  v.push_back(p);
  return v;
}

// One shard's host data.
struct HostShard {
  std::size_t n = 0;
  std::vector<float> p, s0, s1, g32;
  std::vector<std::uint16_t> g16, s0h, s1h, copy;
};

HostShard make_shard(std::size_t n, DType gdt, const OptimizerParams& hp, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), pos(0.01f, 1.0f);
  HostShard h;
  h.n = n;
  h.p.resize(n), h.s0.resize(n), h.s1.resize(n), h.g32.resize(n), h.g16.resize(n);
  h.s0h.resize(n), h.s1h.resize(n), h.copy.assign(n, 0xffff);
  for (std::size_t i = 0; i < n; ++i) {
    h.p[i] = u(rng) + 2.0f;
    h.s0[i] = hp.type == OptimizerType::kAdagrad ? pos(rng) : u(rng) * 0.1f;
    h.s1[i] = pos(rng) * 0.01f;
    h.s0h[i] = f32_to_bf16(h.s0[i]);
    h.s1h[i] = f32_to_bf16(h.s1[i]);
    if (hp.state_dtype() == MomentDType::kBF16) {
      h.s0[i] = bf16_to_f32(h.s0h[i]);
      h.s1[i] = bf16_to_f32(h.s1h[i]);
    }
    const float g = u(rng) * 4.0f + 0.01f;
    h.g32[i] = g;
    h.g16[i] = gdt == DType::kF16 ? f32_to_f16(g) : f32_to_bf16(g);
  }
  return h;
}

TEST(Kernels, OptimizerStepMatchesCpuBitwise) {
  REQUIRE_DEVICE();
  std::mt19937 rng(3);
  for (const OptimizerParams& hp : variants()) {
    const bool bf16_state = hp.state_dtype() == MomentDType::kBF16;
    for (DType gdt : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (int copy_kind = 0; copy_kind < 3; ++copy_kind) {
        for (std::size_t misalign : {std::size_t{0}, std::size_t{1}}) {
          const std::vector<std::size_t> sizes = {1, 7, 4099, 1000003};
          std::vector<HostShard> host;
          for (std::size_t n : sizes) host.push_back(make_shard(n, gdt, hp, rng));
          std::vector<HostShard> cpu = host;
          // Device copies; misalign by one element to take the element-by-element path.
          std::vector<std::unique_ptr<DeviceArray>> keep;
          std::vector<ShardRef> dev(host.size()), ref(host.size());
          for (std::size_t j = 0; j < host.size(); ++j) {
            HostShard& h = host[j];
            auto put = [&](const void* src, std::size_t esize) {
              keep.push_back(std::make_unique<DeviceArray>(src, h.n * esize, misalign * esize));
              return keep.back()->data;
            };
            ShardRef& d = dev[j];
            d.count = h.n;
            d.master = static_cast<float*>(put(h.p.data(), 4));
            d.grad = gdt == DType::kF32 ? put(h.g32.data(), 4) : put(h.g16.data(), 2);
            d.grad_dtype = gdt;
            d.state[0] = bf16_state ? put(h.s0h.data(), 2) : put(h.s0.data(), 4);
            d.state[1] = bf16_state ? put(h.s1h.data(), 2) : put(h.s1.data(), 4);
            if (copy_kind > 0) {
              d.param_copy = put(h.copy.data(), 2);
              d.param_copy_dtype = copy_kind == 1 ? DType::kBF16 : DType::kF16;
            }
            HostShard& c = cpu[j];
            ShardRef& r = ref[j];
            r = d;
            r.master = c.p.data();
            r.grad = gdt == DType::kF32 ? static_cast<const void*>(c.g32.data()) : c.g16.data();
            r.state[0] = bf16_state ? static_cast<void*>(c.s0h.data()) : c.s0.data();
            r.state[1] = bf16_state ? static_cast<void*>(c.s1h.data()) : c.s1.data();
            r.param_copy = copy_kind > 0 ? c.copy.data() : nullptr;
          }
          CpuExecOptions scalar;
          scalar.isa = Isa::kScalar;
          CpuOptimizer opt(scalar);
          for (std::int64_t step = 1; step <= 10; ++step) {
            k::optimizer_step(hp, dev.data(), dev.size(), step, 0.3f, nullptr);
            for (const ShardRef& r : ref) opt.step(hp, r, step, 0.3f);
          }
          ok(cudaDeviceSynchronize(), "sync");
          const std::string what =
              std::string(to_string(hp.type)) + " grad " + std::string(to_string(gdt)) + " copy " +
              std::to_string(copy_kind) + " misalign " + std::to_string(misalign);
          std::size_t a = 0;
          for (std::size_t j = 0; j < host.size(); ++j) {
            const HostShard& c = cpu[j];
            const auto p = keep[a++]->read<float>();
            EXPECT_EQ(std::memcmp(p.data(), c.p.data(), c.n * 4), 0) << what << " master " << j;
            ++a;  // grad
            for (int s = 0; s < 2; ++s) {
              if (s >= hp.num_states()) {
                ++a;
                continue;
              }
              if (bf16_state) {
                const auto got = keep[a++]->read<std::uint16_t>();
                EXPECT_EQ(got, s == 0 ? c.s0h : c.s1h) << what << " state " << s;
              } else {
                const auto got = keep[a++]->read<float>();
                EXPECT_EQ(std::memcmp(got.data(), (s == 0 ? c.s0 : c.s1).data(), c.n * 4), 0)
                    << what << " state " << s;
              }
            }
            if (copy_kind > 0) {
              EXPECT_EQ(keep[a++]->read<std::uint16_t>(), c.copy) << what;
            }
          }
        }
      }
    }
  }
}

// int8 moments: the kernel (one thread block per quantization block, the element's run among
// the launch's) against the CPU scalar path, bit for bit: parameter-group runs that cut blocks,
// more runs than one launch takes (so launches split on block boundaries), odd sizes, 10 steps.
TEST(Kernels, Int8MomentStepMatchesCpuBitwise) {
  REQUIRE_DEVICE();
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  OptimizerParams a;
  a.moment_dtype = MomentDType::kInt8;
  a.weight_decay = 0.01;
  OptimizerParams b = a;
  b.weight_decay = 0.0;
  b.lr = 3e-3;
  b.beta1 = 0.8;
  const std::vector<OptimizerParams> groups = {a, b};
  for (DType gdt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int copy_kind = 0; copy_kind < 3; ++copy_kind) {
      for (std::size_t n :
           {std::size_t{1}, std::size_t{300}, std::size_t{4099}, std::size_t{1000003}}) {
        // Runs of 1..700 elements alternating groups: up to ~3 per block, thousands in all.
        std::vector<StepRun> runs;
        for (std::size_t at = 0; at < n;) {
          const std::size_t len = std::min<std::size_t>(n - at, 1 + rng() % 700);
          runs.push_back({at, len, static_cast<int>(runs.size() % 2)});
          at += len;
        }
        std::vector<float> p(n), g32(n);
        std::vector<std::uint16_t> g16(n), copy(n, 0xffff);
        for (std::size_t i = 0; i < n; ++i) {
          p[i] = u(rng);
          g32[i] = u(rng) * std::pow(10.0f, 3 * u(rng));
          g16[i] = gdt == DType::kF16 ? f32_to_f16(g32[i]) : f32_to_bf16(g32[i]);
        }
        const std::size_t sb = state_bytes(MomentDType::kInt8, n);
        std::vector<std::uint8_t> m(sb, 0), v(sb, 0);
        DeviceArray dp(p.data(), n * 4, 0), dm(m.data(), sb, 0), dv(v.data(), sb, 0),
            dcopy(copy.data(), n * 2, 0);
        DeviceArray dg(gdt == DType::kF32 ? static_cast<const void*>(g32.data()) : g16.data(),
                       n * dtype_size(gdt), 0);
        ShardRef d, r;
        d.count = r.count = n;
        d.master = static_cast<float*>(dp.data);
        d.grad = dg.data;
        d.grad_dtype = r.grad_dtype = gdt;
        d.state[0] = dm.data;
        d.state[1] = dv.data;
        r.master = p.data();
        r.grad = gdt == DType::kF32 ? static_cast<const void*>(g32.data()) : g16.data();
        r.state[0] = m.data();
        r.state[1] = v.data();
        if (copy_kind > 0) {
          d.param_copy = dcopy.data;
          r.param_copy = copy.data();
          d.param_copy_dtype = r.param_copy_dtype = copy_kind == 1 ? DType::kBF16 : DType::kF16;
        }
        CpuExecOptions scalar;
        scalar.isa = Isa::kScalar;
        CpuOptimizer opt(scalar);
        for (std::int64_t step = 1; step <= 10; ++step) {
          k::optimizer_step_runs(groups.data(), 2, d, runs.data(), runs.size(), step, 0.5f,
                                 nullptr);
          opt.step(groups.data(), 2, r, runs.data(), runs.size(), step, 0.5f);
        }
        ok(cudaDeviceSynchronize(), "sync");
        const std::string what = "grad " + std::string(to_string(gdt)) + " copy " +
                                 std::to_string(copy_kind) + " n " + std::to_string(n);
        EXPECT_EQ(std::memcmp(dp.read<float>().data(), p.data(), n * 4), 0) << what << " master";
        EXPECT_EQ(dm.read<std::uint8_t>(), m) << what << " m";
        EXPECT_EQ(dv.read<std::uint8_t>(), v) << what << " v";
        if (copy_kind > 0) {
          EXPECT_EQ(dcopy.read<std::uint16_t>(), copy) << what << " copy";
        }
      }
    }
  }
}

TEST(Kernels, GradStatsMatchesCpu) {
  REQUIRE_DEVICE();
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> a(1000003);
  std::vector<std::uint16_t> b(4099), c(77);
  for (float& x : a) x = u(rng);
  for (auto& x : b) x = f32_to_bf16(u(rng));
  for (auto& x : c) x = f32_to_f16(u(rng));
  DeviceArray da(a.data(), a.size() * 4, 4), db(b.data(), b.size() * 2, 0),
      dc(c.data(), c.size() * 2, 2);
  const k::GradRef refs[3] = {{da.data, a.size(), DType::kF32},
                              {db.data, b.size(), DType::kBF16},
                              {dc.data, c.size(), DType::kF16}};
  const GradStats got = k::grad_stats(refs, 3, nullptr);
  CpuOptimizer opt;
  const double want = opt.grad_stats(a.data(), DType::kF32, a.size()).sum_squares +
                      opt.grad_stats(b.data(), DType::kBF16, b.size()).sum_squares +
                      opt.grad_stats(c.data(), DType::kF16, c.size()).sum_squares;
  EXPECT_FALSE(got.non_finite);
  EXPECT_NEAR(got.sum_squares, want, 1e-12 * want);
  c[76] = f32_to_f16(std::numeric_limits<float>::infinity());
  DeviceArray dinf(c.data(), c.size() * 2, 0);
  const k::GradRef bad = {dinf.data, c.size(), DType::kF16};
  EXPECT_TRUE(k::grad_stats(&bad, 1, nullptr).non_finite);
}

TEST(Kernels, ScaleAndCastMatchCpuBitwise) {
  REQUIRE_DEVICE();
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-100.0f, 100.0f);
  const std::size_t n = 100003;
  std::vector<float> f(n);
  for (float& x : f) x = u(rng);
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    std::vector<std::uint16_t> h(n);
    convert(f.data(), DType::kF32, h.data(), t == DType::kF32 ? DType::kBF16 : t, n);
    const void* src = t == DType::kF32 ? static_cast<const void*>(f.data()) : h.data();
    const std::size_t es = dtype_size(t);
    for (std::size_t misalign : {std::size_t{0}, std::size_t{1}}) {
      DeviceArray d(src, n * es, misalign * es);
      k::scale(d.data, t, n, 1.0f / 1024.0f * 3.0f, nullptr);
      std::vector<float> want(n);
      for (std::size_t i = 0; i < n; ++i) {
        const float x = t == DType::kF32 ? f[i] : load_as_f32(&h[i], t);
        want[i] = x * (1.0f / 1024.0f * 3.0f);
      }
      if (t == DType::kF32) {
        const auto got = d.read<float>();
        EXPECT_EQ(std::memcmp(got.data(), want.data(), n * 4), 0) << "misalign " << misalign;
      } else {
        std::vector<std::uint16_t> w(n);
        convert(want.data(), DType::kF32, w.data(), t, n);
        EXPECT_EQ(d.read<std::uint16_t>(), w) << to_string(t);
      }
    }
    // cast f32 -> t and back
    if (t == DType::kF32) continue;
    DeviceArray d32(f.data(), n * 4, 0);
    std::vector<std::uint16_t> zeros(n, 0);
    DeviceArray d16(zeros.data(), n * 2, 2);
    k::cast(d32.data, DType::kF32, d16.data, t, n, nullptr);
    std::vector<std::uint16_t> w(n);
    convert(f.data(), DType::kF32, w.data(), t, n);
    EXPECT_EQ(d16.read<std::uint16_t>(), w) << to_string(t);
  }
}

TEST(Kernels, AccumulateMatchesCpuBitwise) {
  REQUIRE_DEVICE();
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  const std::size_t n = 100003;
  std::vector<float> a(n), b(n);
  for (float& x : a) x = u(rng);
  for (float& x : b) x = u(rng);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (DType st : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (bool first : {true, false}) {
        std::vector<char> dst(n * dtype_size(dt)), src(n * dtype_size(st));
        convert(a.data(), DType::kF32, dst.data(), dt, n);
        convert(b.data(), DType::kF32, src.data(), st, n);
        DeviceArray dd(dst.data(), dst.size(), 0), ds(src.data(), src.size(), 0);
        k::accumulate(dd.data, dt, ds.data, st, n, first, nullptr);
        detail::accumulate(dst.data(), dt, src.data(), st, n, first);
        EXPECT_EQ(dd.read<char>(), dst)
            << to_string(dt) << " += " << to_string(st) << (first ? " (first)" : "");
      }
    }
  }
}

// Runs everywhere: argument errors come before any CUDA call; without a device the launchers
// fail with kCuda instead of crashing.
TEST(Kernels, BadArgumentsAndMissingDeviceAreErrors) {
  OptimizerParams hp;
  ShardRef s;
  s.count = 10;
  try {
    k::optimizer_step(hp, &s, 1, 1, 1.0f, nullptr);
    ADD_FAILURE() << "no error for a null master";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find("master is null"), std::string::npos) << e.what();
  }
  EXPECT_THROW(k::optimizer_step(hp, &s, 1, 0, 1.0f, nullptr), Error);  // step 0
  EXPECT_THROW(k::scale(nullptr, DType::kF32, 4, 2.0f, nullptr), Error);
  EXPECT_THROW(k::cast(nullptr, DType::kF32, nullptr, DType::kBF16, 4, nullptr), Error);
  EXPECT_NO_THROW(k::optimizer_step(hp, nullptr, 0, 1, 1.0f, nullptr));
  // int8 moments step through optimizer_step_runs (a block is stepped whole); runs must tile.
  OptimizerParams q8;
  q8.moment_dtype = MomentDType::kInt8;
  EXPECT_THROW(k::optimizer_step(q8, &s, 1, 1, 1.0f, nullptr), Error);
  const StepRun half{0, 5, 0};
  EXPECT_THROW(k::optimizer_step_runs(&q8, 1, s, &half, 1, 1, 1.0f, nullptr), Error);
  if (have_device()) return;
  // No device: a well-formed call reaches CUDA and must report its failure as kCuda.
  alignas(16) static float dummy[16];
  try {
    k::scale(dummy, DType::kF32, 16, 2.0f, nullptr);
    ADD_FAILURE() << "no error without a device";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCuda) << e.what();
  }
}

}  // namespace
}  // namespace zero
