#include "ckpt/fresh_state.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "zero/core/error.hpp"

namespace zero::ckpt::detail {

FreshStateLoader::FreshStateLoader(Engine& engine) : engine_(engine) {
  const OptimizerParams& op = engine.optimizer_params();
  if (op.num_states() == 0) return;
  std::size_t n = 0;
  for (UnitId u = 0; u < engine.num_units(); ++u) n = std::max(n, engine.unit_step_numel(u));
  bytes_ = state_bytes(op.state_dtype(), n);
  if (bytes_ == 0) return;
  void* p = ::mmap(nullptr, bytes_, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ZERO_CHECK(p != MAP_FAILED, kOutOfMemory, "load: mapping ", bytes_,
             " bytes of fresh optimizer state failed: ", std::strerror(errno));
  zeros_ = p;
}

FreshStateLoader::~FreshStateLoader() {
  if (zeros_ != nullptr) ::munmap(zeros_, bytes_);
}

void FreshStateLoader::load(UnitId u, const float* master) {
  const std::vector<const void*> states(
      static_cast<std::size_t>(engine_.optimizer_params().num_states()), zeros_);
  engine_.load_shard(u, master, states.data());
}

void FreshStateLoader::finish() { engine_.finish_load(0, 0, std::nullopt); }

}  // namespace zero::ckpt::detail
