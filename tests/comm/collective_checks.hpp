// tests/comm/collective_checks.hpp — backend-independent checks of every collective against a
// float64 reference, shared by the in-process and the MPI tests.
//
// Every rank's input is a pure function of (seed, rank, element), so each rank can compute the
// reference for all ranks without communicating, for any element, without storing it (the
// 64 MiB cases too). Inputs are random in [-1, 1), never zero-filled; outputs are poisoned with
// NaN before the collective and surrounded by guard elements, so an element left unwritten or a
// write past the end is caught.
//
// Thread safety: the functions use only their arguments; each rank thread calls them with its
// own communicator.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "zero/comm/comm.hpp"
#include "zero/core/dtype.hpp"

namespace zero::test {

// How a backend's reductions are checked.
enum class Exactness {
  // In-process: f32 accumulation in rank order 0..N-1, one rounding: compared bitwise.
  kFixedOrder,
  // Any order, one rounding to 16 bits per combining step (MPI): compared with a tolerance.
  kTolerance,
};

inline std::uint64_t splitmix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline float round_to(float v, DType t) {
  switch (t) {
    case DType::kF32: return v;
    case DType::kF16: return f16_to_f32(f32_to_f16(v));
    case DType::kBF16: return bf16_to_f32(f32_to_bf16(v));
  }
  return v;
}

// Rank q's input element i: uniform in [-1, 1) on a 2^-23 grid, representable in t, never 0.
inline float input_value(std::uint64_t seed, int q, std::size_t i, DType t) {
  const std::uint64_t h = splitmix(seed * 0x100000001B3ull ^ (std::uint64_t(q) << 48) ^ i);
  float v = static_cast<float>(static_cast<std::int64_t>(h >> 40) - (1 << 23)) / float(1 << 23);
  if (v == 0.0f) v = 0.5f;
  return round_to(v, t);
}

inline float load(const void* buf, std::size_t i, DType t) {
  return load_as_f32(static_cast<const char*>(buf) + i * dtype_size(t), t);
}

inline void store(void* buf, std::size_t i, DType t, float v) {
  char* p = static_cast<char*>(buf) + i * dtype_size(t);
  if (t == DType::kF32) {
    std::memcpy(p, &v, 4);
  } else {
    const std::uint16_t h = t == DType::kF16 ? f32_to_f16(v) : f32_to_bf16(v);
    std::memcpy(p, &h, 2);
  }
}

// Element buffer of `n` elements with `kGuard` poisoned guard elements on both sides.
inline constexpr std::size_t kGuard = 5;
class GuardedBuffer {
 public:
  GuardedBuffer(std::size_t n, DType t)
      : n_(n), t_(t), bytes_((n + 2 * kGuard) * dtype_size(t), static_cast<char>(0xFF)) {}
  void* data() { return bytes_.data() + kGuard * dtype_size(t_); }
  const void* data() const { return bytes_.data() + kGuard * dtype_size(t_); }
  std::size_t size() const { return n_; }
  void poison() { std::memset(bytes_.data(), 0xFF, bytes_.size()); }
  // The whole allocation, guards included (for mirroring into device memory).
  char* raw() { return bytes_.data(); }
  std::size_t raw_size() const { return bytes_.size(); }
  std::size_t guard_bytes() const { return kGuard * dtype_size(t_); }
  // Guards still all 0xFF.
  bool guards_intact() const {
    const std::size_t g = kGuard * dtype_size(t_);
    for (std::size_t k = 0; k < g; ++k) {
      if (static_cast<unsigned char>(bytes_[k]) != 0xFF) return false;
      if (static_cast<unsigned char>(bytes_[bytes_.size() - 1 - k]) != 0xFF) return false;
    }
    return true;
  }
  void fill_input(std::uint64_t seed, int q, std::size_t offset, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) store(data(), offset + i, t_, input_value(seed, q, i, t_));
  }

 private:
  std::size_t n_;
  DType t_;
  std::vector<char> bytes_;
};

// The expected reduction of element i over ranks 0..n-1, and the tolerance to allow.
struct Expected {
  double value;
  double tolerance;  // 0: exact (bitwise as a float value)
};

inline Expected expected_reduction(std::uint64_t seed, int n, std::size_t i, DType t, ReduceOp op,
                                   Exactness ex) {
  if (op == ReduceOp::kMax) {
    float m = input_value(seed, 0, i, t);
    for (int q = 1; q < n; ++q) m = std::max(m, input_value(seed, q, i, t));
    return {m, 0.0};
  }
  if (ex == Exactness::kFixedOrder) {
    float acc = input_value(seed, 0, i, t);
    for (int q = 1; q < n; ++q) acc += input_value(seed, q, i, t);
    if (op == ReduceOp::kAvg) acc /= static_cast<float>(n);
    return {round_to(acc, t), 0.0};
  }
  double sum = 0;
  double abs_sum = 0;
  for (int q = 0; q < n; ++q) {
    const double v = input_value(seed, q, i, t);
    sum += v;
    abs_sum += std::fabs(v);
  }
  // Each of the n - 1 combining steps rounds once in fp32 and, for 16-bit types, once more to
  // the type (relative error 2^-11 f16, 2^-8 bf16); the final avg division rounds once more.
  const double eps16 = t == DType::kF16 ? 0x1p-11 : t == DType::kBF16 ? 0x1p-8 : 0.0;
  double tol = n * (0x1p-24 + eps16) * abs_sum + 0x1p-24;
  if (op == ReduceOp::kAvg) {
    sum /= n;
    tol = tol / n + eps16 * std::fabs(sum) + 0x1p-24;
  }
  return {sum, tol};
}

// Describes the first bad element of `got` (n elements at offset `first` of the logical result),
// or "" when all match. `expect(i)` gives the expected value of logical element i.
template <typename ExpectFn>
std::string compare(const void* got, std::size_t n, DType t, std::size_t first, ExpectFn expect) {
  std::size_t bad = 0;
  std::string first_bad;
  for (std::size_t k = 0; k < n; ++k) {
    const float g = load(got, k, t);
    const Expected e = expect(first + k);
    const bool ok = !std::isnan(g) && (e.tolerance == 0.0 ? double(g) == e.value
                                                          : std::fabs(g - e.value) <= e.tolerance);
    if (!ok && bad++ == 0) {
      first_bad = detail::cat("element ", first + k, ": got ", g, ", expected ", e.value, " +- ",
                              e.tolerance);
    }
  }
  return bad == 0 ? "" : detail::cat(bad, " of ", n, " elements wrong; first ", first_bad);
}

// ---- one collective, checked. Each returns "" or what went wrong, on this rank.

inline std::string check_all_reduce(Communicator& c, std::size_t count, DType t, ReduceOp op,
                                    bool in_place, std::uint64_t seed, Exactness ex) {
  const int n = c.size();
  GuardedBuffer send(count, t);
  GuardedBuffer recv(count, t);
  send.fill_input(seed, c.rank(), 0, count);
  if (in_place) {
    c.all_reduce(send.data(), send.data(), count, t, op);
  } else {
    c.all_reduce(send.data(), recv.data(), count, t, op);
    if (!recv.guards_intact()) return "write outside recv";
    // The input must be untouched.
    const std::string s = compare(send.data(), count, t, 0, [&](std::size_t i) {
      return Expected{input_value(seed, c.rank(), i, t), 0.0};
    });
    if (!s.empty()) return "send modified: " + s;
  }
  GuardedBuffer& out = in_place ? send : recv;
  if (!out.guards_intact()) return "write outside the buffer";
  return compare(out.data(), count, t, 0,
                 [&](std::size_t i) { return expected_reduction(seed, n, i, t, op, ex); });
}

inline std::string check_reduce_scatter(Communicator& c, std::size_t recv_count, DType t,
                                        ReduceOp op, bool in_place, std::uint64_t seed,
                                        Exactness ex) {
  const int n = c.size();
  const int r = c.rank();
  const std::size_t total = recv_count * n;
  GuardedBuffer send(total, t);
  GuardedBuffer recv(recv_count, t);
  send.fill_input(seed, r, 0, total);
  void* out =
      in_place ? static_cast<char*>(send.data()) + r * recv_count * dtype_size(t) : recv.data();
  c.reduce_scatter(send.data(), out, recv_count, t, op);
  if (!send.guards_intact() || !recv.guards_intact()) return "write outside the buffers";
  // Everything of send but (in-place) this rank's shard is untouched.
  for (int q = 0; q < n; ++q) {
    if (in_place && q == r) continue;
    const char* shard = static_cast<const char*>(send.data()) + q * recv_count * dtype_size(t);
    const std::string s = compare(shard, recv_count, t, q * recv_count, [&](std::size_t i) {
      return Expected{input_value(seed, r, i, t), 0.0};
    });
    if (!s.empty()) return detail::cat("send shard ", q, " modified: ", s);
  }
  return compare(out, recv_count, t, r * recv_count,
                 [&](std::size_t i) { return expected_reduction(seed, n, i, t, op, ex); });
}

inline std::string check_all_gather(Communicator& c, std::size_t send_count, DType t, bool in_place,
                                    std::uint64_t seed) {
  const int n = c.size();
  const int r = c.rank();
  GuardedBuffer send(send_count, t);
  GuardedBuffer recv(send_count * n, t);
  void* in = send.data();
  if (in_place) {
    in = static_cast<char*>(recv.data()) + r * send_count * dtype_size(t);
    recv.fill_input(seed, r, r * send_count, send_count);
  } else {
    send.fill_input(seed, r, 0, send_count);
  }
  c.all_gather(in, recv.data(), send_count, t);
  if (!recv.guards_intact() || !send.guards_intact()) return "write outside the buffers";
  for (int q = 0; q < n; ++q) {
    const char* part = static_cast<const char*>(recv.data()) + q * send_count * dtype_size(t);
    const std::string s = compare(part, send_count, t, 0, [&](std::size_t i) {
      return Expected{input_value(seed, q, i, t), 0.0};
    });
    if (!s.empty()) return detail::cat("part of rank ", q, ": ", s);
  }
  return "";
}

inline std::string check_all_to_all(Communicator& c, std::size_t count, DType t,
                                    std::uint64_t seed) {
  const int n = c.size();
  const int r = c.rank();
  GuardedBuffer send(count * n, t);
  GuardedBuffer recv(count * n, t);
  send.fill_input(seed, r, 0, count * n);  // chunk q: this rank's elements [q count, (q+1) count)
  c.all_to_all(send.data(), recv.data(), count, t);
  if (!recv.guards_intact() || !send.guards_intact()) return "write outside the buffers";
  const std::string unchanged = compare(send.data(), count * n, t, 0, [&](std::size_t i) {
    return Expected{input_value(seed, r, i, t), 0.0};
  });
  if (!unchanged.empty()) return detail::cat("send modified: ", unchanged);
  for (int q = 0; q < n; ++q) {
    const char* part = static_cast<const char*>(recv.data()) + q * count * dtype_size(t);
    const std::string s = compare(part, count, t, 0, [&](std::size_t i) {
      return Expected{input_value(seed, q, static_cast<std::size_t>(r) * count + i, t), 0.0};
    });
    if (!s.empty()) return detail::cat("chunk from rank ", q, ": ", s);
  }
  return "";
}

// all_gather and all_to_all move bytes unchanged (the quantized collectives' packed chunks ride
// them as f32 elements): arbitrary bit patterns, NaN payloads and signalling NaNs among them,
// arrive bit for bit.
inline std::string check_bytes_preserved(Communicator& c, std::size_t words, std::uint64_t seed) {
  const int n = c.size();
  const auto r = static_cast<std::uint64_t>(c.rank());
  auto word = [&](std::uint64_t q, std::size_t i) {
    const std::uint64_t h = splitmix(seed ^ (q << 40) ^ i);
    // Every fourth word a NaN (quiet or signalling, any payload), the rest any bits.
    return static_cast<std::uint32_t>(i % 4 == 0 ? (0x7f800001u | (h & 0x807fffffu)) : h);
  };
  std::vector<std::uint32_t> send(words * n), recv(words * n, 0);
  for (std::size_t i = 0; i < send.size(); ++i) send[i] = word(r, i);
  c.all_gather(send.data(), recv.data(), words, DType::kF32);
  for (int q = 0; q < n; ++q) {
    for (std::size_t i = 0; i < words; ++i) {
      if (recv[q * words + i] != word(static_cast<std::uint64_t>(q), i)) {
        return detail::cat("all_gather changed word ", i, " of rank ", q);
      }
    }
  }
  c.all_to_all(send.data(), recv.data(), words, DType::kF32);
  for (int q = 0; q < n; ++q) {
    for (std::size_t i = 0; i < words; ++i) {
      if (recv[q * words + i] != word(static_cast<std::uint64_t>(q), r * words + i)) {
        return detail::cat("all_to_all changed word ", i, " from rank ", q);
      }
    }
  }
  return "";
}

inline std::string check_broadcast(Communicator& c, std::size_t count, DType t, int root,
                                   bool in_place, std::uint64_t seed) {
  GuardedBuffer send(count, t);
  GuardedBuffer recv(count, t);
  const bool is_root = c.rank() == root;
  if (is_root) (in_place ? recv : send).fill_input(seed, root, 0, count);
  const void* in = is_root ? (in_place ? recv.data() : send.data()) : nullptr;
  c.broadcast(in, recv.data(), count, t, root);
  if (!recv.guards_intact()) return "write outside recv";
  return compare(recv.data(), count, t, 0, [&](std::size_t i) {
    return Expected{input_value(seed, root, i, t), 0.0};
  });
}

// ---- the matrix: every op x in-place mode x count for one dtype, on one rank.

inline std::vector<std::size_t> matrix_counts(int n) {
  // 0, 1, primes (not divisible by n), a reduction block boundary +-1, and n * k + 1.
  return {0, 1, 2, 3, 7, 13, 97, 251, 1031, 4095, 4097, 10007, std::size_t(n) * 1000 + 1};
}

inline void run_matrix(Communicator& c, DType t, Exactness ex, std::uint64_t seed) {
  std::uint64_t s = seed;
  EXPECT_EQ("", check_bytes_preserved(c, 1031, ++s)) << " [rank " << c.rank() << "]";
  for (std::size_t count : matrix_counts(c.size())) {
    for (bool in_place : {false, true}) {
      const std::string where =
          detail::cat(" [rank ", c.rank(), " of ", c.size(), ", ", to_string(t), ", count ", count,
                      in_place ? ", in-place" : ", out-of-place", "]");
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
        EXPECT_EQ("", check_all_reduce(c, count, t, op, in_place, ++s, ex))
            << "all_reduce " << to_string(op) << where;
        EXPECT_EQ("", check_reduce_scatter(c, count, t, op, in_place, ++s, ex))
            << "reduce_scatter " << to_string(op) << where;
      }
      EXPECT_EQ("", check_all_gather(c, count, t, in_place, ++s)) << "all_gather" << where;
      if (!in_place) {
        EXPECT_EQ("", check_all_to_all(c, count, t, ++s)) << "all_to_all" << where;
      }
      for (int root : {0, c.size() - 1}) {
        EXPECT_EQ("", check_broadcast(c, count, t, root, in_place, ++s))
            << "broadcast root " << root << where;
      }
    }
  }
}

// Issues many asynchronous collectives of mixed kinds and sizes at once and checks that they
// complete in issue order (a later one never completes before an earlier one) and correctly.
inline void run_async_in_order(Communicator& c, Exactness ex) {
  constexpr int kOps = 48;
  const DType t = DType::kF32;
  std::vector<GuardedBuffer> send;
  std::vector<GuardedBuffer> recv;
  std::vector<std::size_t> counts;
  for (int k = 0; k < kOps; ++k) {
    const std::size_t count = 1 + static_cast<std::size_t>(k) * 997 % 20011;
    counts.push_back(count);
    send.emplace_back(count * c.size(), t);
    recv.emplace_back(count * c.size(), t);
    send.back().fill_input(500 + k, c.rank(), 0, count * c.size());
  }
  std::vector<CommHandle> handles;
  for (int k = 0; k < kOps; ++k) {
    switch (k % 3) {
      case 0:
        handles.push_back(
            c.all_reduce_async(send[k].data(), recv[k].data(), counts[k], t, ReduceOp::kSum));
        break;
      case 1:
        handles.push_back(
            c.reduce_scatter_async(send[k].data(), recv[k].data(), counts[k], t, ReduceOp::kMax));
        break;
      default: handles.push_back(c.all_gather_async(send[k].data(), recv[k].data(), counts[k], t));
    }
  }
  // Sweep from the last to the first: if a later op is complete, every earlier one must be.
  std::vector<bool> done(kOps, false);
  int remaining = kOps;
  while (remaining > 0) {
    bool later_done = false;
    for (int k = kOps - 1; k >= 0; --k) {
      if (!done[k] && handles[k].test()) {
        done[k] = true;
        --remaining;
      }
      if (later_done) {
        EXPECT_TRUE(done[k]) << "op " << k << " incomplete while a later op completed";
      }
      later_done = later_done || done[k];
    }
  }
  for (int k = 0; k < kOps; ++k) {
    std::string r;
    const std::size_t count = counts[k];
    switch (k % 3) {
      case 0:
        r = compare(recv[k].data(), count, t, 0, [&](std::size_t i) {
          return expected_reduction(500 + k, c.size(), i, t, ReduceOp::kSum, ex);
        });
        break;
      case 1:
        r = compare(recv[k].data(), count, t, c.rank() * count, [&](std::size_t i) {
          return expected_reduction(500 + k, c.size(), i, t, ReduceOp::kMax, ex);
        });
        break;
      default:
        for (int q = 0; q < c.size() && r.empty(); ++q) {
          r = compare(static_cast<const char*>(recv[k].data()) + q * count * 4, count, t, 0,
                      [&](std::size_t i) {
                        return Expected{input_value(500 + k, q, i, t), 0};
                      });
        }
    }
    EXPECT_EQ("", r) << "op " << k;
  }
}

}  // namespace zero::test
