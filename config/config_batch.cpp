// Config::resolve_batch: DeepSpeed's batch rules (train_batch_size = micro batch x accumulation x
// world size, the key not given derived), applied at engine start when the world size is known.
#include <cstdint>
#include <optional>
#include <string>

#include "zero/config/config.hpp"
#include "zero/core/error.hpp"

namespace zero {

namespace {

// a * b, or nullopt when it overflows int64.
std::optional<std::int64_t> times(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// "train_micro_batch_size_per_gpu (4) x gradient_accumulation_steps (derived) x world size (2)":
// the three numbers and the world size, the derived one named so.
std::string batch_terms(const Config& c, int world_size, int derived) {
  auto term = [&](const char* key, std::int64_t v, bool d) {
    return std::string(key) + " (" + (d ? std::string("derived") : std::to_string(v)) + ")";
  };
  return term("train_micro_batch_size_per_gpu", c.train_micro_batch_size_per_gpu, derived == 0) +
         " x " + term("gradient_accumulation_steps", c.gradient_accumulation_steps, derived == 1) +
         " x world size (" + std::to_string(world_size) + ")";
}

}  // namespace

// DeepSpeed's DeepSpeedConfig._set_batch_related_parameters, then _batch_assertion.
Config Config::resolve_batch(int world_size) const {
  ZERO_CHECK(world_size >= 1, kInvalidArgument, "world size must be >= 1, got ", world_size);
  Config c = *this;
  const bool micro_given = micro_batch_given || train_micro_batch_size_per_gpu != 1;
  const bool accum_given = accumulation_given || gradient_accumulation_steps != 1;
  ZERO_CHECK(c.train_micro_batch_size_per_gpu >= 1 && c.gradient_accumulation_steps >= 1, kConfig,
             "config keys 'train_micro_batch_size_per_gpu' (", c.train_micro_batch_size_per_gpu,
             ") and 'gradient_accumulation_steps' (", c.gradient_accumulation_steps,
             ") must be >= 1");
  if (c.train_batch_size == 0) return c;  // not set: micro x accumulation x ranks, not pinned
  ZERO_CHECK(c.train_batch_size >= 1, kConfig,
             "config key 'train_batch_size' = ", c.train_batch_size, ": must be >= 1");
  const std::int64_t t = c.train_batch_size;
  if (!micro_given || !accum_given) {
    // The one not given (both: accumulation 1) is derived, and must come out whole.
    const std::int64_t other = micro_given   ? c.train_micro_batch_size_per_gpu
                               : accum_given ? c.gradient_accumulation_steps
                                             : 1;
    const std::optional<std::int64_t> per = times(other, world_size);
    if (!per || t % *per != 0) {
      ZERO_THROW(kConfig, "config key 'train_batch_size' = ", t, " cannot be ",
                 batch_terms(c, world_size, micro_given ? 1 : 0), ": ", t, " is not a multiple of ",
                 per ? std::to_string(*per) : "an int64", " (DeepSpeed derives the key not given)");
    }
    if (micro_given) {
      c.gradient_accumulation_steps = t / *per;
    } else {
      c.train_micro_batch_size_per_gpu = t / *per;
      c.gradient_accumulation_steps = other;
    }
  }
  c.micro_batch_given = c.accumulation_given = true;
  const std::optional<std::int64_t> want =
      times(c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps);
  const std::optional<std::int64_t> all = want ? times(*want, world_size) : std::nullopt;
  if (!all || *all != t) {
    ZERO_THROW(kConfig, "config key 'train_batch_size' = ", t, " must equal ",
               batch_terms(c, world_size, -1), " = ", all ? std::to_string(*all) : "(overflows)");
  }
  return c;
}

void Config::validate_for_world_size(int world_size) const { (void)resolve_batch(world_size); }

}  // namespace zero
