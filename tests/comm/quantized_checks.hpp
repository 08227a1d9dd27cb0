// tests/comm/quantized_checks.hpp — the quantized collectives (zero/comm/quantized_comm.hpp)
// against a float64 reference, shared by the in-process and the MPI tests.
//
// Every rank's input is a pure function of (pattern, seed, rank, element), so each rank computes
// the reference of every rank without communicating. Patterns: random values whose magnitude
// changes from block to block, constant blocks, one outlier per block among small values, all
// zeros. Outputs are poisoned (NaN) and guarded. The bound checked per element is the header's:
// m / 254 (1 + 2^-13) per contribution, m the absolute maximum of the block the contributing
// rank quantized, plus the f32 sum's roundings and the final rounding to the dtype.
//
// Thread safety: the functions use only their arguments.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "comm/collective_checks.hpp"
#include "zero/comm/quantized_comm.hpp"
#include "zero/device/device_ops.hpp"

namespace zero::test {

enum class Pattern { kRandom, kConstant, kOutlier, kZeros };
inline const char* to_string(Pattern p) {
  switch (p) {
    case Pattern::kRandom: return "random";
    case Pattern::kConstant: return "constant blocks";
    case Pattern::kOutlier: return "one outlier per block";
    case Pattern::kZeros: return "zeros";
  }
  return "?";
}

// Rank q's element i (representable in t), quantized in blocks of `block` from element `base`.
inline float pattern_value(Pattern p, std::uint64_t seed, int q, std::size_t i, std::size_t base,
                           std::size_t block, DType t) {
  const std::size_t b = (i - base) / block;
  const float scale = std::ldexp(1.0f, static_cast<int>(b % 13) - 6);  // 2^-6 .. 2^6 per block
  switch (p) {
    case Pattern::kRandom: return round_to(input_value(seed, q, i, t) * scale, t);
    case Pattern::kConstant: return round_to(input_value(seed, q, base + b * block, t) * scale, t);
    case Pattern::kOutlier: {
      const bool outlier = (i - base) % block == (b * 7 + static_cast<std::size_t>(q)) % block;
      return round_to(input_value(seed, q, i, t) * (outlier ? 1000.0f : 0.01f), t);
    }
    case Pattern::kZeros: return 0.0f;
  }
  return 0.0f;
}

// Rank q's input over [base, base + count), quantized in blocks of `block` from base: the
// values and each block's largest |x|, computed once per check.
struct ChunkInput {
  std::vector<double> x, block_max;
  std::size_t block;
  ChunkInput(Pattern p, std::uint64_t seed, int q, std::size_t base, std::size_t count,
             std::size_t blk, DType t)
      : x(count), block_max((count + blk - 1) / blk, 0.0), block(blk) {
    for (std::size_t i = 0; i < count; ++i) {
      x[i] = pattern_value(p, seed, q, base + i, base, blk, t);
      block_max[i / blk] = std::max(block_max[i / blk], std::fabs(x[i]));
    }
  }
  double max_of(std::size_t i) const { return block_max[i / block]; }
};

// Every rank's chunk of [base, base + count).
inline std::vector<ChunkInput> all_inputs(int n, Pattern p, std::uint64_t seed, std::size_t base,
                                          std::size_t count, std::size_t block, DType t) {
  std::vector<ChunkInput> out;
  for (int q = 0; q < n; ++q) out.emplace_back(p, seed, q, base, count, block, t);
  return out;
}

// Half an ulp of the dtype, relative (the final rounding); 0 for f32 (its sum's roundings are
// counted apart).
inline double dtype_rounding(DType t) {
  return t == DType::kF32 ? 0.0 : (t == DType::kBF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11));
}

inline constexpr double kQuantBound = (1.0 + 1.0 / 8192.0) / 254.0;

inline std::string check_quantized_all_gather(Communicator& c, DeviceOps& dev, std::size_t count,
                                              std::size_t block, DType t, Pattern p,
                                              std::uint64_t seed) {
  const int n = c.size();
  const int r = c.rank();
  GuardedBuffer send(count, t), recv(count * n, t);
  for (std::size_t i = 0; i < count; ++i)
    store(send.data(), i, t, pattern_value(p, seed, r, i, 0, block, t));
  std::vector<char> staging(quantized_all_gather_staging_bytes(c.size(), count, block), '\x5a');
  quantized_all_gather(c, dev, send.data(), recv.data(), count, t, block, staging.data());
  if (!recv.guards_intact() || !send.guards_intact()) return "write outside the buffers";
  const std::vector<ChunkInput> in = all_inputs(n, p, seed, 0, count, block, t);
  for (int q = 0; q < n; ++q) {
    for (std::size_t i = 0; i < count; ++i) {
      const double x = in[static_cast<std::size_t>(q)].x[i];
      const double got = load(recv.data(), q * count + i, t);
      const double m = in[static_cast<std::size_t>(q)].max_of(i);
      double bound = m * kQuantBound + std::fabs(x) * dtype_rounding(t);
      if (p == Pattern::kZeros) bound = 0;
      if (p == Pattern::kConstant) bound = t == DType::kF32 ? std::fabs(x) * 0x1p-23 : 0.0;
      if (!(std::fabs(got - x) <= bound)) {
        return detail::cat(to_string(p), ": rank ", q, " element ", i, " came back ", got,
                           ", sent ", x, ", bound ", bound);
      }
    }
  }
  return "";
}

inline std::string check_quantized_reduce_scatter(Communicator& c, DeviceOps& dev,
                                                  std::size_t count, std::size_t block, DType t,
                                                  Pattern p, ReduceOp op, std::uint64_t seed) {
  const int n = c.size();
  const int r = c.rank();
  const std::size_t total = count * static_cast<std::size_t>(n);
  GuardedBuffer send(total, t), recv(count, t);
  // Each rank's chunk q is quantized from its own start: blocks restart at q * count.
  for (std::size_t i = 0; i < total; ++i) {
    store(send.data(), i, t, pattern_value(p, seed, r, i, i / count * count, block, t));
  }
  std::vector<char> staging(quantized_reduce_scatter_staging_bytes(c.size(), count, block), '\x5a');
  quantized_reduce_scatter(c, dev, send.data(), recv.data(), count, t, block, op, staging.data());
  if (!recv.guards_intact() || !send.guards_intact()) return "write outside the buffers";
  const double div = op == ReduceOp::kAvg ? n : 1;
  const std::size_t base = static_cast<std::size_t>(r) * count;
  const std::vector<ChunkInput> in = all_inputs(n, p, seed, base, count, block, t);
  for (std::size_t i = 0; i < count; ++i) {
    double exact = 0, bound = 0, mag = 0;
    for (const ChunkInput& q : in) {
      exact += q.x[i];
      mag += std::fabs(q.x[i]);
      bound += q.max_of(i) * kQuantBound;
    }
    exact /= div;
    bound = bound / div + (mag / div) * (n * 0x1p-23) + std::fabs(exact) * dtype_rounding(t) +
            (bound / div) * dtype_rounding(t);
    const double got = load(recv.data(), i, t);
    if (p == Pattern::kZeros) bound = 0;
    if (!(std::fabs(got - exact) <= bound)) {
      return detail::cat(to_string(p), " ", zero::to_string(op), ": element ", i, " of rank ", r,
                         " is ", got, ", exact ", exact, ", bound ", bound);
    }
  }
  return "";
}

// Every rank ends with the same bits, within the bound of the exact sum.
inline std::string check_quantized_all_reduce(Communicator& c, DeviceOps& dev, std::size_t count,
                                              std::size_t block, DType t, std::uint64_t seed) {
  const int n = c.size();
  GuardedBuffer buf(count, t);
  for (std::size_t i = 0; i < count; ++i) {
    store(buf.data(), i, t, pattern_value(Pattern::kRandom, seed, c.rank(), i, 0, block, t));
  }
  std::vector<char> staging(quantized_all_reduce_staging_bytes(c.size(), count, block));
  quantized_all_reduce(c, dev, buf.data(), count, t, block, ReduceOp::kAvg, staging.data());
  if (!buf.guards_intact()) return "write outside the buffer";
  const std::vector<ChunkInput> in = all_inputs(n, Pattern::kRandom, seed, 0, count, block, t);
  for (std::size_t i = 0; i < count; ++i) {
    double exact = 0, bound = 0;
    for (const ChunkInput& q : in) {
      exact += q.x[i];
      bound += q.max_of(i) * kQuantBound;
    }
    exact /= n;
    bound =
        bound / n * (1 + dtype_rounding(t)) + std::fabs(exact) * dtype_rounding(t) + n * 0x1p-23;
    const double got = load(buf.data(), i, t);
    if (!(std::fabs(got - exact) <= bound)) {
      return detail::cat("all_reduce element ", i, " is ", got, ", exact ", exact);
    }
  }
  // The same bits everywhere: gather every rank's result and compare with this rank's.
  const std::size_t bytes = count * dtype_size(t);
  std::vector<char> all(bytes * static_cast<std::size_t>(n));
  c.all_gather(buf.data(), all.data(), count, t);  // moves the bits unchanged
  for (int q = 0; q < n && bytes > 0; ++q) {
    if (std::memcmp(all.data() + q * bytes, buf.data(), bytes) != 0) {
      return detail::cat("all_reduce: rank ", q, " ended with other bits than rank ", c.rank());
    }
  }
  return "";
}

// The matrix one rank runs: dtypes x odd counts x block sizes x patterns.
inline void run_quantized_matrix(Communicator& c, DeviceOps& dev, std::uint64_t seed) {
  std::uint64_t s = seed;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (std::size_t count : {0u, 1u, 7u, 255u, 257u, 1000u, 4099u}) {
      for (std::size_t block : {1u, 7u, 256u}) {
        const std::string where =
            detail::cat(" [rank ", c.rank(), " of ", c.size(), ", ", zero::to_string(t), ", count ",
                        count, ", block ", block, "]");
        for (Pattern p :
             {Pattern::kRandom, Pattern::kConstant, Pattern::kOutlier, Pattern::kZeros}) {
          EXPECT_EQ("", check_quantized_all_gather(c, dev, count, block, t, p, ++s))
              << "quantized all_gather" << where;
          for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
            EXPECT_EQ("", check_quantized_reduce_scatter(c, dev, count, block, t, p, op, ++s))
                << "quantized reduce_scatter" << where;
          }
        }
        EXPECT_EQ("", check_quantized_all_reduce(c, dev, count, block, t, ++s))
            << "quantized all_reduce" << where;
      }
    }
  }
}

}  // namespace zero::test
