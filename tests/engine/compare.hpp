// Comparisons of trained parameters (per tensor, as f32) shared by the engine tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace zero::testing {

using Tensors = std::vector<std::vector<float>>;

// Same shapes and the same bits.
inline bool bitwise_equal(const Tensors& a, const Tensors& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != b[i].size()) return false;
    if (std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0) return false;
  }
  return true;
}

// Largest absolute difference over the elements both have.
inline double max_abs_diff(const Tensors& a, const Tensors& b) {
  double d = 0.0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    for (std::size_t k = 0; k < a[i].size() && k < b[i].size(); ++k) {
      d = std::max(d, std::fabs(static_cast<double>(a[i][k]) - b[i][k]));
    }
  }
  return d;
}

}  // namespace zero::testing
