// zero/optim/loss_scaler.hpp — fp16 loss scaling with DeepSpeed's semantics.
//
// The trainer multiplies its loss by scale() before backward; after backward the engine reads
// the gradients once (CpuOptimizer::grad_stats or the CUDA norm kernel), calls update(overflow)
// and steps the optimizer only when it returns true, with grad_scale = 1/scale() x the clip
// coefficient. On overflow nothing is stepped: master parameters and optimizer state stay as
// they were. The state machine is DeepSpeed's DynamicLossScaler.update_scale
// (deepspeed/runtime/fp16/loss_scaler.py):
//   overflow:    if hysteresis == 1 or cur_hysteresis == 1: scale = max(scale / 2, min_scale)
//                (an error if scale is already min_scale); else cur_hysteresis -= 1.
//                last_overflow_iter = iter.
//   no overflow: if consecutive_hysteresis: cur_hysteresis = hysteresis.
//                if (iter - last_overflow_iter) % loss_scale_window == 0:
//                  if not consecutive_hysteresis: cur_hysteresis = hysteresis; scale *= 2.
//   then iter += 1.
// With a static scale (fp16.loss_scale > 0, or fp16 disabled: scale 1) the scale never
// changes; update() still reports whether to step.
//
// Thread safety: a LossScaler is a plain value; not synchronised.
#pragma once

#include <cstdint>

namespace zero {

struct Fp16Config;

class LossScaler {
 public:
  // Everything DeepSpeed's DynamicLossScaler keeps; also what a checkpoint must save.
  struct State {
    double scale = 1.0;
    std::int64_t iter = 0;  // cur_iter
    std::int64_t last_overflow_iter = -1;
    int cur_hysteresis = 1;
  };

  // A static scale. REQUIRES: scale finite and > 0, else zero::Error(kInvalidArgument).
  static LossScaler fixed(double scale);
  // A dynamic scale starting at init_scale. REQUIRES (zero::Error(kInvalidArgument) naming the
  // argument otherwise): init_scale, min_scale finite, > 0; scale_window >= 1; hysteresis >= 1;
  // scale_factor > 1. raise_error_at_min_scale as DeepSpeed (true: an overflow at min_scale
  // is an error; false: the scale stays at min_scale).
  static LossScaler dynamic(double init_scale, int scale_window, int hysteresis,
                            bool consecutive_hysteresis, double min_scale,
                            double scale_factor = 2.0, bool raise_error_at_min_scale = true);
  // fp16 disabled: fixed(1). loss_scale > 0: fixed(loss_scale). Otherwise dynamic with
  // 2^initial_scale_power, loss_scale_window, hysteresis, consecutive_hysteresis,
  // min_loss_scale. Throws zero::Error(kConfig) naming the fp16.* key for a bad value.
  static LossScaler from_config(const Fp16Config& fp16);

  double scale() const noexcept { return state_.scale; }
  bool is_dynamic() const noexcept { return dynamic_; }
  const State& state() const noexcept { return state_; }
  // Restores a saved state (checkpoint). REQUIRES: scale finite > 0, cur_hysteresis >= 1.
  void load_state(const State& s);

  // The factor the optimizer multiplies gradients by: clip_coefficient / (scale() x divisor),
  // one rounding. The engine passes gradient_accumulation_steps as the divisor (the step's
  // gradient is the mean over the micro-steps); scale() x 1 is exact, so divisor 1 changes no bit.
  float grad_scale(double clip_coefficient = 1.0, double divisor = 1.0) const noexcept {
    return static_cast<float>(clip_coefficient / (state_.scale * divisor));
  }

  // Records this step's overflow status and returns true when the optimizer step should run
  // (no overflow). Throws zero::Error(kInvalidArgument) — "loss scale already at minimum" — when
  // a dynamic scaler overflows at min_scale with raise_error_at_min_scale; the state is then
  // unchanged.
  bool update(bool overflow);

 private:
  LossScaler() = default;

  bool dynamic_ = false;
  double scale_factor_ = 2.0;
  int scale_window_ = 1000;
  int hysteresis_ = 1;  // DeepSpeed's delayed_shift
  bool consecutive_hysteresis_ = false;
  double min_scale_ = 1.0;
  bool raise_error_at_min_scale_ = true;
  State state_{};
};

}  // namespace zero
