// Uses the installed headers and library: a config, a tracked buffer, a conversion, an error.
#include <zero/config/config.hpp>
#include <zero/core/dtype.hpp>
#include <zero/core/error.hpp>
#include <zero/device/memory.hpp>

#include <cstdio>

int main() {
  const zero::Config cfg = zero::parse_config(R"({"zero_optimization": {"stage": 2}})");
  zero::MemoryTracker tracker;
  zero::Buffer b = zero::Buffer::host(tracker, zero::MemCategory::kGradients, 1024);
  const float x = 1.0f / 3.0f;
  std::uint16_t h = 0;
  zero::convert(&x, zero::DType::kF32, &h, zero::DType::kBF16, 1);
  try {
    zero::parse_config(R"({"zero_optimization": {"stage": 9}})");
    return 1;
  } catch (const zero::Error& e) {
    std::printf("consumer: stage %d, tracked %zu bytes, bf16(1/3) = 0x%04x, error ok: %s\n",
                cfg.zero_optimization.stage, tracker.current_memory(), h, e.what());
  }
  return (cfg.zero_optimization.stage == 2 && tracker.current_memory() == 1024 && h == 0x3eab) ? 0
                                                                                               : 1;
}
