// Scalar block functions: the shared per-element functions in a plain loop. Runs on any
// x86-64 and is the reference the SIMD paths must match bit for bit.
#include "optim/cpu_kernels.hpp"

namespace zero::detail::optim {
namespace {

template <Rule R, DType G, DType S, Copy C>
struct ScalarBlock {
  static void run(const BlockArgs& a, std::size_t begin, std::size_t end) {
    scalar_range<R, G, S, C>(a, begin, end);
  }
};

template <DType G, Copy C>
struct ScalarQ8Block {
  static void run(const BlockArgs& a, std::size_t begin, std::size_t end) {
    q8_blocks<ScalarQ8<G, C>>(a, begin, end);
  }
};

}  // namespace

BlockFn select_q8_scalar(DType grad, Copy copy) noexcept {
  return select_q8<ScalarQ8Block>(grad, copy);
}

BlockFn select_scalar(Rule r, DType grad, DType state, Copy copy) noexcept {
  return select_block<ScalarBlock>(r, grad, state, copy);
}

SumsqFn sumsq_scalar(DType grad) noexcept {
  switch (grad) {
    case DType::kF32: return &scalar_sumsq<DType::kF32>;
    case DType::kBF16: return &scalar_sumsq<DType::kBF16>;
    case DType::kF16: return &scalar_sumsq<DType::kF16>;
  }
  return nullptr;
}

}  // namespace zero::detail::optim
