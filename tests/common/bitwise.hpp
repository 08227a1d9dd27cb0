// tests/common/bitwise.hpp — "the same bits", the comparison behind every bitwise claim of the
// tests (stage k against stage 0, a resumed run against the uninterrupted one, an export against
// the gathered parameters): byte equality of the values, so that the sign of zero and NaN
// payloads count and no tolerance hides in a floating-point ==.
//
// Thread safety: pure functions of their arguments.
#pragma once

#include <cstddef>
#include <cstring>
#include <type_traits>
#include <vector>

namespace zero::testing {

// Whether the n values at a and b have the same bytes.
template <typename T>
bool same_bits(const T* a, const T* b, std::size_t n) {
  static_assert(std::is_trivially_copyable_v<T>, "bytes of a value type");
  return n == 0 || std::memcmp(a, b, n * sizeof(T)) == 0;
}

inline bool same_bits(float a, float b) { return same_bits(&a, &b, 1); }

// How many of the n values at a and b differ in their bits.
template <typename T>
std::size_t bits_differing(const T* a, const T* b, std::size_t n) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) bad += same_bits(a + i, b + i, 1) ? 0 : 1;
  return bad;
}

// The same sizes and the same bits.
template <typename T, typename = std::enable_if_t<std::is_trivially_copyable_v<T>>>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && same_bits(a.data(), b.data(), a.size());
}

// Tensor by tensor (e.g. the parameters unit by unit): the same shapes and the same bits.
template <typename T>
bool bitwise_equal(const std::vector<std::vector<T>>& a, const std::vector<std::vector<T>>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!bitwise_equal(a[i], b[i])) return false;
  }
  return true;
}

}  // namespace zero::testing
