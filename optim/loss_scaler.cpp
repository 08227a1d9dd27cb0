// LossScaler: DeepSpeed's DynamicLossScaler.update_scale, step for step (see the header).
#include "zero/optim/loss_scaler.hpp"

#include <algorithm>
#include <cmath>

#include "zero/core/error.hpp"

namespace zero {

namespace {
bool positive_finite(double x) { return std::isfinite(x) && x > 0.0; }
}  // namespace

LossScaler LossScaler::fixed(double scale) {
  ZERO_CHECK(positive_finite(scale), kInvalidArgument, "static loss scale ", scale,
             " must be finite and > 0");
  LossScaler s;
  s.state_.scale = scale;
  return s;
}

LossScaler LossScaler::dynamic(double init_scale, int scale_window, int hysteresis,
                               bool consecutive_hysteresis, double min_scale, double scale_factor,
                               bool raise_error_at_min_scale) {
  ZERO_CHECK(positive_finite(init_scale), kInvalidArgument, "initial loss scale ", init_scale,
             " must be finite and > 0");
  ZERO_CHECK(scale_window >= 1, kInvalidArgument, "loss_scale_window ", scale_window,
             " must be >= 1");
  ZERO_CHECK(hysteresis >= 1, kInvalidArgument, "hysteresis ", hysteresis, " must be >= 1");
  ZERO_CHECK(positive_finite(min_scale), kInvalidArgument, "min_loss_scale ", min_scale,
             " must be finite and > 0");
  ZERO_CHECK(std::isfinite(scale_factor) && scale_factor > 1.0, kInvalidArgument,
             "loss scale factor ", scale_factor, " must be finite and > 1");
  LossScaler s;
  s.dynamic_ = true;
  s.scale_factor_ = scale_factor;
  s.scale_window_ = scale_window;
  s.hysteresis_ = hysteresis;
  s.consecutive_hysteresis_ = consecutive_hysteresis;
  s.min_scale_ = min_scale;
  s.raise_error_at_min_scale_ = raise_error_at_min_scale;
  s.state_.scale = init_scale;
  s.state_.cur_hysteresis = hysteresis;
  return s;
}

void LossScaler::load_state(const State& s) {
  ZERO_CHECK(positive_finite(s.scale), kInvalidArgument, "LossScaler::load_state: scale ", s.scale,
             " must be finite and > 0");
  ZERO_CHECK(s.cur_hysteresis >= 1, kInvalidArgument, "LossScaler::load_state: cur_hysteresis ",
             s.cur_hysteresis, " must be >= 1");
  state_ = s;
}

bool LossScaler::update(bool overflow) {
  if (!dynamic_) return !overflow;
  State& s = state_;
  if (overflow) {
    if (hysteresis_ == 1 || s.cur_hysteresis == 1) {
      if (s.scale == min_scale_ && raise_error_at_min_scale_) {
        ZERO_THROW(kInvalidArgument,
                   "loss scale already at minimum (fp16.min_loss_scale = ", min_scale_,
                   ") and the gradients still overflow: cannot decrease the scale any more "
                   "(check the model for Inf/NaN, or lower fp16.min_loss_scale)");
      }
      s.scale = std::max(s.scale / scale_factor_, min_scale_);
    } else {
      s.cur_hysteresis -= 1;
    }
    s.last_overflow_iter = s.iter;
  } else {
    if (consecutive_hysteresis_) s.cur_hysteresis = hysteresis_;
    if ((s.iter - s.last_overflow_iter) % scale_window_ == 0) {
      if (!consecutive_hysteresis_) s.cur_hysteresis = hysteresis_;
      s.scale *= scale_factor_;
    }
  }
  s.iter += 1;
  return !overflow;
}

}  // namespace zero
