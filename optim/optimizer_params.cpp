// OptimizerParams: names, validation and the per-step scalars (from the config:
// config/from_config.cpp).
#include <cctype>
#include <cmath>
#include <string>
#include <type_traits>

#include "zero/core/error.hpp"
#include "zero/optim/optimizer.hpp"

namespace zero {

std::string_view to_string(OptimizerType t) noexcept {
  switch (t) {
    case OptimizerType::kAdam: return "Adam";
    case OptimizerType::kAdamW: return "AdamW";
    case OptimizerType::kSgd: return "SGD";
    case OptimizerType::kLion: return "Lion";
    case OptimizerType::kAdagrad: return "Adagrad";
  }
  return "unknown";
}

OptimizerType parse_optimizer_type(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "adam") return OptimizerType::kAdam;
  if (lower == "adamw") return OptimizerType::kAdamW;
  if (lower == "sgd") return OptimizerType::kSgd;
  if (lower == "lion") return OptimizerType::kLion;
  if (lower == "adagrad") return OptimizerType::kAdagrad;
  ZERO_THROW(kInvalidArgument, "unknown optimizer type '", std::string(name),
             "' (expected Adam, AdamW, SGD, Lion or Adagrad)");
}

std::string_view to_string(MomentDType t) noexcept {
  switch (t) {
    case MomentDType::kF32: return "f32";
    case MomentDType::kBF16: return "bf16";
    case MomentDType::kInt8: return "int8";
  }
  return "unknown";
}

MomentDType parse_moment_dtype(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "f32" || lower == "fp32" || lower == "float32") return MomentDType::kF32;
  if (lower == "bf16" || lower == "bfloat16") return MomentDType::kBF16;
  if (lower == "int8") return MomentDType::kInt8;
  ZERO_THROW(kInvalidArgument, "unknown moment dtype '", std::string(name),
             "' (expected f32, bf16 or int8)");
}

std::size_t state_bytes(MomentDType t, std::size_t n) noexcept {
  switch (t) {
    case MomentDType::kF32: return 4 * n;
    case MomentDType::kBF16: return 2 * n;
    case MomentDType::kInt8: return detail::optim::moment_bytes(n);
  }
  return 0;
}

std::size_t state_block(MomentDType t) noexcept {
  return t == MomentDType::kInt8 ? kInt8MomentBlock : 1;
}

namespace {

bool is_adam(OptimizerType t) { return t == OptimizerType::kAdam || t == OptimizerType::kAdamW; }

// Checks every field; `prefix` names the key in messages ("" or "optimizer.params.").
void check_params(const OptimizerParams& p, ErrorCode code, const std::string& prefix) {
  auto fail = [&](const std::string& field, double value, const char* rule) {
    detail::throw_error(
        code,
        detail::cat(prefix, field, " = ", value, " is invalid for ", to_string(p.type), ": ", rule),
        __FILE__, __LINE__);
  };
  auto finite_nonneg = [&](const char* field, double v) {
    if (!std::isfinite(v) || v < 0.0) fail(field, v, "must be finite and >= 0");
  };
  finite_nonneg("lr", p.lr);
  finite_nonneg("weight_decay", p.weight_decay);
  if (is_adam(p.type) || p.type == OptimizerType::kLion) {
    // Lion allows beta1 = 1 (c = m); a moment decay of 1 never forgets, so beta2 < 1.
    if (p.type == OptimizerType::kLion) {
      if (!(p.beta1 >= 0.0 && p.beta1 <= 1.0)) fail("betas[0]", p.beta1, "must be in [0, 1]");
    } else if (!(p.beta1 >= 0.0 && p.beta1 < 1.0)) {
      fail("betas[0]", p.beta1, "must be in [0, 1)");
    }
    if (!(p.beta2 >= 0.0 && p.beta2 < 1.0)) fail("betas[1]", p.beta2, "must be in [0, 1)");
  }
  if (is_adam(p.type) || p.type == OptimizerType::kAdagrad) finite_nonneg("eps", p.eps);
  if (p.type == OptimizerType::kSgd) {
    finite_nonneg("momentum", p.momentum);
    if (!std::isfinite(p.dampening) || p.dampening < 0.0 || p.dampening > 1.0) {
      fail("dampening", p.dampening, "must be in [0, 1]");
    }
    if (p.nesterov && (p.momentum <= 0.0 || p.dampening != 0.0)) {
      fail("nesterov", 1.0, "Nesterov momentum requires momentum > 0 and dampening = 0");
    }
  }
  if (p.moment_dtype != MomentDType::kF32 && !is_adam(p.type)) {
    detail::throw_error(
        code,
        detail::cat(prefix, "moment_dtype = ", to_string(p.moment_dtype), " is invalid for ",
                    to_string(p.type),
                    ": bf16 and int8 moments are for Adam/AdamW only; otherwise f32"),
        __FILE__, __LINE__);
  }
}

}  // namespace

void OptimizerParams::validate() const { check_params(*this, ErrorCode::kInvalidArgument, ""); }

OptimizerParams ParamGroup::apply(const OptimizerParams& base) const {
  ZERO_CHECK(!name.empty(), kInvalidArgument, "parameter group: the name must not be empty");
  OptimizerParams p = base;
  auto set = [](auto& field, const auto& value) {
    if (value) field = *value;
  };
  set(p.lr, lr);
  set(p.beta1, beta1);
  set(p.beta2, beta2);
  set(p.eps, eps);
  set(p.weight_decay, weight_decay);
  set(p.momentum, momentum);
  set(p.dampening, dampening);
  set(p.bias_correction, bias_correction);
  set(p.nesterov, nesterov);
  check_params(p, ErrorCode::kInvalidArgument, "parameter group '" + name + "': ");
  // One state layout for every group: the shard's state arrays are shared, sized by the
  // optimizer's own group. A group may use fewer of them (SGD momentum 0 in an optimizer with
  // momentum: its runs step as plain SGD, rule_of() per group, and leave the buffer at zero, as
  // torch.optim.SGD keeps no buffer for such a group), never more.
  ZERO_CHECK(p.num_states() <= base.num_states(), kInvalidArgument, "parameter group '", name,
             "': momentum = ", p.momentum, " gives ", to_string(p.type), " ", p.num_states(),
             " state array(s) but the optimizer's own group has ", base.num_states(),
             " (momentum = ", base.momentum,
             "): the state is laid out by the optimizer's own group; give it momentum > 0");
  return p;
}

ShardRef ShardRef::part(std::size_t at, std::size_t n, MomentDType state_dtype) const {
  ZERO_CHECK(at <= count && n <= count - at, kInvalidArgument, "ShardRef::part(", at, ", ", n,
             ") of a shard of ", count, " elements");
  const std::size_t block = state_block(state_dtype);
  ZERO_CHECK(at % block == 0 && ((at + n) % block == 0 || at + n == count), kInvalidArgument,
             "ShardRef::part(", at, ", ", n, ") of a shard of ", count, " elements with ",
             to_string(state_dtype), " state: a part starts and ends on a block of ", block,
             " elements (or at the shard's end)");
  auto shift = [](auto* p, std::size_t bytes) {
    using Byte =
        std::conditional_t<std::is_const_v<std::remove_pointer_t<decltype(p)>>, const char, char>;
    return p == nullptr ? p : static_cast<decltype(p)>(static_cast<Byte*>(p) + bytes);
  };
  ShardRef r = *this;
  r.count = n;
  r.master = master + at;
  r.grad = shift(grad, at * dtype_size(grad_dtype));
  for (void*& st : r.state) st = shift(st, state_bytes(state_dtype, at));
  r.param_copy = shift(param_copy, at * dtype_size(param_copy_dtype));
  return r;
}

int OptimizerParams::num_states() const noexcept {
  switch (type) {
    case OptimizerType::kAdam:
    case OptimizerType::kAdamW: return 2;
    case OptimizerType::kSgd: return momentum > 0.0 ? 1 : 0;
    case OptimizerType::kLion:
    case OptimizerType::kAdagrad: return 1;
  }
  return 0;
}

namespace detail::optim {

Rule rule_of(const OptimizerParams& p) noexcept {
  switch (p.type) {
    case OptimizerType::kAdam:
    case OptimizerType::kAdamW: return Rule::kAdam;
    case OptimizerType::kSgd: return p.momentum > 0.0 ? Rule::kSgdMomentum : Rule::kSgd;
    case OptimizerType::kLion: return Rule::kLion;
    case OptimizerType::kAdagrad: return Rule::kAdagrad;
  }
  return Rule::kSgd;
}

StepScalars make_step_scalars(const OptimizerParams& p, std::int64_t step, float grad_scale) {
  p.validate();
  ZERO_CHECK(step >= 1, kInvalidArgument, "optimizer step number ", step,
             " must be >= 1 (the 1-based count of updates including this one)");
  ZERO_CHECK(std::isfinite(grad_scale) && grad_scale > 0.0f, kInvalidArgument, "grad_scale ",
             grad_scale, " must be finite and > 0");
  StepScalars s;
  s.grad_scale = grad_scale;
  const auto f = [](double x) { return static_cast<float>(x); };
  switch (p.type) {
    case OptimizerType::kAdam:
    case OptimizerType::kAdamW: {
      const bool decoupled = p.type == OptimizerType::kAdamW || p.adam_w_mode;
      const double t = static_cast<double>(step);
      const double bc1 = p.bias_correction ? 1.0 - std::pow(p.beta1, t) : 1.0;
      const double bc2 = p.bias_correction ? 1.0 - std::pow(p.beta2, t) : 1.0;
      s.beta1 = f(p.beta1);
      s.one_minus_beta1 = f(1.0 - p.beta1);
      s.beta2 = f(p.beta2);
      s.one_minus_beta2 = f(1.0 - p.beta2);
      // beta2 = 0 with bias correction: bc2 = 1. beta1 = 0: bc1 = 1. Never 0 for step >= 1.
      s.inv_sqrt_bc2 = f(1.0 / std::sqrt(bc2));
      s.eps = f(p.eps);
      s.neg_step = f(-p.lr / bc1);
      s.l2_wd = decoupled ? 0.0f : f(p.weight_decay);
      s.neg_lr_wd = decoupled ? f(-p.lr * p.weight_decay) : 0.0f;
      break;
    }
    case OptimizerType::kSgd:
      s.neg_step = f(-p.lr);
      s.l2_wd = f(p.weight_decay);
      if (p.momentum > 0.0) {
        const bool first = step == 1;  // torch.optim.SGD: buf = g on the first step
        s.beta1 = first ? 0.0f : f(p.momentum);
        s.one_minus_beta1 = first ? 1.0f : f(1.0 - p.dampening);
        s.beta2 = p.nesterov ? f(p.momentum) : 0.0f;
        s.nesterov = p.nesterov;
      }
      break;
    case OptimizerType::kLion:
      s.beta1 = f(p.beta1);
      s.one_minus_beta1 = f(1.0 - p.beta1);
      s.beta2 = f(p.beta2);
      s.one_minus_beta2 = f(1.0 - p.beta2);
      s.neg_step = f(-p.lr);
      s.neg_lr_wd = f(-p.lr * p.weight_decay);
      break;
    case OptimizerType::kAdagrad:
      s.eps = f(p.eps);
      s.neg_step = f(-p.lr);
      s.l2_wd = f(p.weight_decay);
      break;
  }
  return s;
}

}  // namespace detail::optim
}  // namespace zero
