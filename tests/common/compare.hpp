// tests/common/compare.hpp — trained parameters read out of an engine (per tensor, as f32) and
// compared: bitwise (tests/common/bitwise.hpp), or by how far apart they are. Shared by the
// engine, checkpoint and offload tests. Thread safety: read_params is a collective (every rank
// calls it, each on its own engine); the comparisons are pure.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/bitwise.hpp"
#include "zero/engine/engine.hpp"

namespace zero::testing {

using Tensors = std::vector<std::vector<float>>;

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

// Root mean square of the element-wise difference.
inline double rms_diff(const Tensors& a, const Tensors& b) {
  double s = 0.0;
  std::size_t n = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    for (std::size_t k = 0; k < a[i].size() && k < b[i].size(); ++k, ++n) {
      const double d = static_cast<double>(a[i][k]) - b[i][k];
      s += d * d;
    }
  }
  return n > 0 ? std::sqrt(s / static_cast<double>(n)) : 0.0;
}

// Every parameter of the engine, unit by unit in declaration order, as f32 (its working-dtype
// values). Stage 3: a collective (every rank must call it).
inline Tensors read_params(Engine& e) {
  Tensors params;
  for (UnitId u = 0; u < e.num_units(); ++u) {
    for (std::size_t p = 0; p < e.unit(u).params.size(); ++p) {
      std::vector<float> v(e.unit(u).params[p].numel());
      e.read_param(u, static_cast<int>(p), v.data(), v.size());
      params.push_back(std::move(v));
    }
  }
  return params;
}

}  // namespace zero::testing
