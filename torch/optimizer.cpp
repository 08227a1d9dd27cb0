// torch/optimizer.cpp — zero::torch::Optimizer (zero/torch/torch.hpp): the module's parameters
// bound to the engine's storage, the gradient hooks on their accumulators, the step.
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_set>

#include "torch/optimizer_impl.hpp"
#include "zero/core/error.hpp"
#include "zero/core/log.hpp"
#include "zero/torch/torch.hpp"

namespace zero::torch {
namespace {

using ::torch::autograd::variable_list;

std::vector<std::int64_t> shape_of(const at::Tensor& t) {
  return {t.sizes().begin(), t.sizes().end()};
}

// The engine's shape of a parameter: a 0-dim tensor is one element.
std::vector<std::int64_t> engine_shape(const at::Tensor& t) {
  auto s = shape_of(t);
  if (s.empty()) s.push_back(1);
  return s;
}

}  // namespace

namespace {

struct PreHook : ::torch::autograd::FunctionPreHook {
  PreHook(std::shared_ptr<Optimizer::Impl::HookTarget> t, UnitId u, int i)
      : target(std::move(t)), unit(u), index(i) {}
  variable_list operator()(const variable_list& grads) override {
    if (target->impl != nullptr) target->impl->on_gradient(unit, index);
    return grads;
  }
  std::shared_ptr<Optimizer::Impl::HookTarget> target;
  UnitId unit;
  int index;
};

struct PostHook : ::torch::autograd::FunctionPostHook {
  PostHook(std::shared_ptr<Optimizer::Impl::HookTarget> t, UnitId u, int i)
      : target(std::move(t)), unit(u), index(i) {}
  variable_list operator()(const variable_list& outputs, const variable_list&) override {
    if (target->impl != nullptr) target->impl->on_accumulated(unit, index);
    return outputs;
  }
  std::shared_ptr<Optimizer::Impl::HookTarget> target;
  UnitId unit;
  int index;
};

// Drops tensors with no elements and tensors already in an earlier unit; checks the rest, and
// puts a unit's frozen parameters (requires_grad = false) in a unit of their own before it (the
// engine's units are all frozen or all trainable: engine/placement.hpp frozen_unit). origin[k]:
// the index in `units` of the unit engine unit k came from (a split's two halves share it).
std::vector<TensorUnit> checked(std::vector<TensorUnit> units, const EngineOptions& options,
                                std::vector<int>& origin) {
  origin.clear();
  ZERO_CHECK(options.device.is_cpu() && options.device_ops == nullptr, kInvalidArgument,
             "zero::torch: the LibTorch adapter trains CPU tensors (EngineOptions::device must be "
             "the CPU, no device_ops)");
  std::unordered_set<const void*> seen;
  std::vector<TensorUnit> out;
  for (std::size_t k = 0; k < units.size(); ++k) {
    TensorUnit& u = units[k];
    ZERO_CHECK(u.param_names.size() == u.params.size(), kInvalidArgument, "zero::torch: unit '",
               u.name, "' has ", u.params.size(), " parameters and ", u.param_names.size(),
               " names");
    TensorUnit kept{u.name, {}, {}}, frozen{u.name, {}, {}};
    for (std::size_t i = 0; i < u.params.size(); ++i) {
      const at::Tensor& t = u.params[i];
      const std::string& name = u.param_names[i];
      ZERO_CHECK(t.defined(), kInvalidArgument, "zero::torch: parameter '", name,
                 "' is an undefined tensor");
      if (!seen.insert(t.unsafeGetTensorImpl()).second) continue;  // tied: its first unit
      if (t.numel() == 0) {
        ZERO_LOG(kInfo, "zero::torch: parameter '", name,
                 "' has no elements: left to the model, not trained");
        continue;
      }
      ZERO_CHECK(t.device().is_cpu() && t.layout() == at::kStrided, kInvalidArgument,
                 "zero::torch: parameter '", name, "' is a ", t.toString(),
                 " tensor; the adapter takes dense CPU tensors");
      ZERO_CHECK(at::isFloatingType(t.scalar_type()), kInvalidArgument, "zero::torch: parameter '",
                 name, "' has dtype ", t.scalar_type(), "; parameters must be floating point");
      ZERO_CHECK(t.is_leaf(), kInvalidArgument, "zero::torch: parameter '", name,
                 "' is not a leaf tensor (it has a grad_fn)");
      // A live zero::torch::Optimizer's hook on its gradient accumulator: a second optimizer.
      if (const auto acc = ::torch::autograd::impl::try_get_grad_accumulator(t))
        for (const auto& hook : acc->pre_hooks()) {
          const auto* ours = dynamic_cast<const PreHook*>(hook.get());
          ZERO_CHECK(ours == nullptr || ours->target->impl == nullptr, kInvalidArgument,
                     "zero::torch: parameter '", name,
                     "' is already trained by another zero::torch::Optimizer; one optimizer per "
                     "model (its parameters live in that optimizer's engine): give one "
                     "optimizer all the parameters, or destroy the first before making another");
        }
      TensorUnit& into = t.requires_grad() ? kept : frozen;
      into.param_names.push_back(name);
      into.params.push_back(t);
    }
    if (!frozen.params.empty()) {
      if (!kept.params.empty()) frozen.name += " (frozen)";
      out.push_back(std::move(frozen));
      origin.push_back(static_cast<int>(k));
    }
    if (!kept.params.empty()) {
      out.push_back(std::move(kept));
      origin.push_back(static_cast<int>(k));
    }
  }
  ZERO_CHECK(!out.empty(), kInvalidArgument, "zero::torch: no parameter (none given)");
  return out;
}

}  // namespace

Optimizer::Impl::Impl(Communicator& c, std::vector<TensorUnit> u, const Config& config,
                      EngineOptions options, const std::unordered_map<const void*, int>& group_of)
    : comm(c) {
  std::vector<int> origin;  // the release groups of stage 3's gather on use
  units = checked(std::move(u), options, origin);
  engine = std::make_unique<Engine>(comm, config, options);
  w = engine->param_dtype();
  shard_params = engine->stage() == 3;
  declare_units(group_of);
  broadcast_values();
  bind_params();
  waiting.resize(units.size());
  for (std::size_t uid = 0; uid < units.size(); ++uid) waiting[uid] = trainable_params(uid);
  handed.assign(units.size(), false);
  target->impl = this;
  watch_operators(std::move(origin));
}

void Optimizer::Impl::declare_units(const std::unordered_map<const void*, int>& group_of) {
  for (const TensorUnit& tu : units) {
    UnitSpec spec{tu.name, {}};
    for (std::size_t i = 0; i < tu.params.size(); ++i) {
      int group = 0;
      const bool trainable = tu.params[i].requires_grad();
      if (!group_of.empty() && trainable) {
        const auto it = group_of.find(tu.params[i].unsafeGetTensorImpl());
        ZERO_CHECK(it != group_of.end(), kInvalidArgument, "zero::torch: parameter '",
                   tu.param_names[i],
                   "' requires grad but is in no parameter group (torch::optim would never step "
                   "it): list it in a group, or set requires_grad(false)");
        group = it->second;
      }
      spec.params.push_back({tu.param_names[i], engine_shape(tu.params[i]), group, trainable});
    }
    engine->add_unit(std::move(spec));
  }
}

// Rank 0's values, on every rank (DDP's broadcast at construction), become the engine's.
void Optimizer::Impl::broadcast_values() {
  for (UnitId uid = 0; uid < static_cast<UnitId>(units.size()); ++uid) {
    const TensorUnit& tu = units[static_cast<std::size_t>(uid)];
    std::size_t total = 0;
    for (const at::Tensor& t : tu.params) total += static_cast<std::size_t>(t.numel());
    std::vector<float> values(total);
    std::size_t offset = 0;
    for (const at::Tensor& t : tu.params) {
      const at::Tensor f = t.detach().to(at::kFloat).contiguous();
      std::copy_n(f.data_ptr<float>(), f.numel(), values.data() + offset);
      offset += static_cast<std::size_t>(t.numel());
    }
    comm.broadcast(values.data(), values.data(), total, DType::kF32, 0);
    offset = 0;
    for (std::size_t i = 0; i < tu.params.size(); ++i) {
      const auto n = static_cast<std::size_t>(tu.params[i].numel());
      engine->set_param(uid, static_cast<int>(i), values.data() + offset, n);
      offset += n;
    }
  }
}

// The module's tensors become views of the engine's working copy (stage 3: empty until an
// operator reads them). set_data keeps each tensor's identity; it resets a gradient accumulator
// made for the old dtype, so the accumulators are taken after it.
void Optimizer::Impl::bind_params() {
  params.resize(units.size());
  for (UnitId uid = 0; uid < static_cast<UnitId>(units.size()); ++uid) {
    const TensorUnit& tu = units[static_cast<std::size_t>(uid)];
    auto& ps = params[static_cast<std::size_t>(uid)];
    GatherGuard whole;
    if (!shard_params) whole = engine->gather(uid);  // kept whole: a view that never moves
    for (std::size_t i = 0; i < tu.params.size(); ++i) {
      Param p;
      p.unit = uid;
      p.index = static_cast<int>(i);
      p.name = tu.param_names[i];
      p.tensor = tu.params[i];
      p.shape = shape_of(p.tensor);
      p.bound = detail::make_bound_tensor(p.shape, w);
      p.handed = detail::make_bound_tensor(p.shape, w);
      if (!shard_params) detail::bind(p.bound.storage, whole.param(p.index));
      p.tensor.set_data(p.bound.tensor);
      p.tensor.mutable_grad().reset();
      if (!p.tensor.requires_grad()) {  // frozen: no gradient, no hooks
        ps.push_back(std::move(p));
        continue;
      }
      p.accumulator = ::torch::autograd::impl::grad_accumulator(p.tensor);
      ZERO_CHECK(p.accumulator != nullptr, kInternal, "no gradient accumulator for '", p.name, "'");
      p.accumulator->add_pre_hook(std::make_unique<PreHook>(target, uid, p.index));
      p.post_hook = p.accumulator->add_post_hook(std::make_unique<PostHook>(target, uid, p.index));
      ps.push_back(std::move(p));
    }
  }
}

// Every stage watches the handed-over gradients; stage 3 also gathers on use.
void Optimizer::Impl::watch_operators(std::vector<int> origin) {
  std::vector<std::vector<c10::StorageImpl*>> storages(units.size());
  if (shard_params)
    for (std::size_t uid = 0; uid < units.size(); ++uid)
      for (const Param& p : params[uid]) storages[uid].push_back(p.bound.storage);
  watch = std::make_unique<detail::OperatorWatch>(*engine, std::move(storages), std::move(origin));
}

Optimizer::Impl::~Impl() {
  try {
    if (!detached) own_values(/*gather=*/false);
  } catch (const std::exception& e) {
    ZERO_LOG(kWarn, "zero::torch: giving the parameters their own storage failed: ", e.what());
  }
  unhook();
}

void Optimizer::Impl::unhook() {
  target->impl = nullptr;
  watch.reset();
  for (auto& ps : params)
    for (Param& p : ps) {
      if (p.accumulator) p.accumulator->del_post_hook(p.post_hook);
      p.accumulator.reset();
    }
}

void Optimizer::Impl::raise_gather_error() const {
  if (watch && watch->error()) std::rethrow_exception(watch->error());
}

// ---- the gradient hooks

void Optimizer::Impl::on_gradient(UnitId u, int i) {
  raise_gather_error();
  Param& p = params[static_cast<std::size_t>(u)][static_cast<std::size_t>(i)];
  ZERO_CHECK(!handed[static_cast<std::size_t>(u)] && !p.tensor.grad().defined(), kInvalidArgument,
             "zero::torch: parameter '", p.name, "' (unit '",
             units[static_cast<std::size_t>(u)].name,
             "') got a second gradient in one micro-step: call optimizer.step() after every "
             "backward() (gradient accumulation is the config's gradient_accumulation_steps)");
  in_micro_step = true;
  p.grad_view = detail::view_tensor(engine->grad(u, i), p.shape);
  p.tensor.mutable_grad() = p.grad_view;
}

void Optimizer::Impl::on_accumulated(UnitId u, int i) {
  Param& p = params[static_cast<std::size_t>(u)][static_cast<std::size_t>(i)];
  // Autograd accumulates in place (into the engine's buffer) unless grad mode is on in backward
  // (create_graph = true), where it assigns a new tensor: then its values are copied over.
  const at::Tensor& g = p.tensor.grad();
  if (g.defined() && !g.is_same(p.grad_view)) {
    ::torch::NoGradGuard no_grad;
    p.grad_view.copy_(g);
    p.tensor.mutable_grad() = p.grad_view;
  }
  if (--waiting[static_cast<std::size_t>(u)] == 0) hand_over(u, /*from_backward=*/true);
}

void Optimizer::Impl::hand_over(UnitId u, bool from_backward) {
  const auto us = static_cast<std::size_t>(u);
  // The engine's buffer is the reduce-scatter's from here: .grad must not view it any more. It
  // stays defined (a tensor of no memory that no operator may read) so that code reading it
  // fails naming the parameter instead of finding no gradient (clip_grad_norm_ would return 0).
  for (Param& p : params[us]) {
    p.grad_view.reset();
    if (from_backward) {
      p.tensor.mutable_grad() = p.handed.tensor;
      watch->watch_grad(p.handed.storage, p.name);
    } else {
      p.tensor.mutable_grad().reset();
    }
  }
  handed[us] = true;
  engine->grads_ready(u);
}

void Optimizer::Impl::reset_grads() {
  for (auto& ps : params)
    for (Param& p : ps) p.tensor.mutable_grad().reset();
  if (watch) watch->unwatch_grads();
}

void Optimizer::Impl::own_values(bool gather) {
  // set_data is an ATen operator: with the stage-3 callback still in place it would gather the
  // parameter it replaces (a collective, on this rank alone when it unwinds an error).
  if (watch) {
    watch->release_all();
    watch.reset();
  }
  for (auto& ps : params)
    for (Param& p : ps) {
      p.tensor.mutable_grad().reset();
      if (shard_params && !gather) {
        p.tensor.set_data(at::empty({0}, p.tensor.options()));
        continue;
      }
      std::vector<float> values(static_cast<std::size_t>(p.tensor.numel()));
      engine->read_param(p.unit, p.index, values.data(), values.size());
      at::Tensor own = ::torch::from_blob(values.data(), p.shape, at::kFloat)
                           .to(detail::scalar_type(w), /*non_blocking=*/false, /*copy=*/true);
      p.tensor.set_data(own);
    }
}

// ---- the public face

Optimizer::Optimizer(Communicator& comm, std::vector<TensorUnit> units, const Config& config,
                     EngineOptions options)
    : impl_(std::make_unique<Impl>(comm, std::move(units), config, std::move(options))) {}
Optimizer::Optimizer(Communicator& comm, const ::torch::nn::Module& model, const Config& config,
                     EngineOptions options)
    : Optimizer(comm, units_by_child(model), config, std::move(options)) {}
Optimizer::Optimizer(Communicator& comm, const std::vector<at::Tensor>& params,
                     const Config& config, EngineOptions options)
    : Optimizer(comm, units_of(params), config, std::move(options)) {}
Optimizer::Optimizer(Communicator& comm, const ::torch::OrderedDict<std::string, at::Tensor>& named,
                     const Config& config, EngineOptions options)
    : Optimizer(comm, units_by_prefix(named), config, std::move(options)) {}
Optimizer::Optimizer(Communicator& comm,
                     const std::vector<::torch::optim::OptimizerParamGroup>& groups,
                     const Config& config, EngineOptions options)
    : Optimizer(comm, units_of(groups), groups, nullptr, config, std::move(options)) {}
Optimizer::Optimizer(Communicator& comm, std::vector<TensorUnit> units,
                     const std::vector<::torch::optim::OptimizerParamGroup>& groups,
                     const ::torch::optim::OptimizerOptions& defaults, const Config& config,
                     EngineOptions options)
    : Optimizer(comm, std::move(units), groups, &defaults, config, std::move(options)) {}
Optimizer::Optimizer(Communicator& comm, const ::torch::nn::Module& model,
                     const std::vector<::torch::optim::OptimizerParamGroup>& groups,
                     const ::torch::optim::OptimizerOptions& defaults, const Config& config,
                     EngineOptions options)
    : Optimizer(comm, units_by_child(model), groups, &defaults, config, std::move(options)) {}
Optimizer::Optimizer(Communicator& comm, const ::torch::nn::Module& model,
                     const ::torch::optim::OptimizerOptions& defaults, const Config& config,
                     EngineOptions options)
    : Optimizer(comm, units_by_child(model), {}, &defaults, config, std::move(options)) {}
Optimizer::Optimizer(Communicator& comm, std::vector<TensorUnit> units,
                     const std::vector<::torch::optim::OptimizerParamGroup>& groups,
                     const ::torch::optim::OptimizerOptions* defaults, const Config& config,
                     EngineOptions options) {
  EngineGroups g = engine_groups(groups, defaults, config);
  options.param_groups = std::move(g.groups);
  impl_ = std::make_unique<Impl>(comm, std::move(units), g.config, std::move(options), g.group_of);
}
Optimizer::~Optimizer() = default;

void Optimizer::zero_grad() {
  Impl& m = *impl_;
  ZERO_CHECK(!m.in_micro_step, kInvalidArgument,
             "zero::torch: zero_grad() after backward() and before step(): the gradients are "
             "already the engine's (stages 2-3 are reducing them); call step() first");
  m.reset_grads();
}

StepResult Optimizer::step() {
  Impl& m = *impl_;
  ZERO_CHECK(!m.detached, kInvalidArgument, "zero::torch: step() after detach()");
  m.raise_gather_error();
  m.reset_grads();
  m.watch->release_all();
  for (UnitId u = 0; u < static_cast<UnitId>(m.units.size()); ++u)
    if (!m.handed[static_cast<std::size_t>(u)])
      m.hand_over(u, /*from_backward=*/false);  // no (or a partial) gradient
  StepResult r;
  if (m.clip_once > 0.0) {
    const double config_clip = m.engine->config().gradient_clipping;
    m.engine->set_gradient_clipping(m.clip_once);
    m.clip_once = 0.0;
    try {
      r = m.engine->step();
    } catch (...) {
      m.engine->set_gradient_clipping(config_clip);
      throw;
    }
    m.engine->set_gradient_clipping(config_clip);
  } else {
    r = m.engine->step();
  }
  for (std::size_t u = 0; u < m.units.size(); ++u) {
    m.waiting[u] = m.trainable_params(u);
    m.handed[u] = false;
  }
  m.in_micro_step = false;
  return r;
}

void Optimizer::clip_grad_norm_(double max_norm, double norm_type) {
  ZERO_CHECK(max_norm > 0.0 && std::isfinite(max_norm), kInvalidArgument,
             "zero::torch: clip_grad_norm_(max_norm = ", max_norm,
             "): max_norm must be positive and finite");
  ZERO_CHECK(norm_type == 2.0, kInvalidArgument,
             "zero::torch: clip_grad_norm_(norm_type = ", norm_type,
             "): the engine clips the L2 norm (norm_type 2) of the step's gradient");
  impl_->clip_once = max_norm;
}

at::Tensor Optimizer::scale_loss(const at::Tensor& loss) const {
  return loss * impl_->engine->loss_scale();
}

void Optimizer::detach() {
  Impl& m = *impl_;
  ZERO_CHECK(!m.in_micro_step, kInvalidArgument,
             "zero::torch: detach() between backward() and step()");
  m.own_values(/*gather=*/true);
  m.unhook();
  m.detached = true;
}

Engine& Optimizer::engine() noexcept { return *impl_->engine; }
const std::vector<TensorUnit>& Optimizer::units() const noexcept { return impl_->units; }

std::vector<at::Tensor> Optimizer::parameters() const {
  std::vector<at::Tensor> out;
  for (const auto& ps : impl_->params)
    for (const auto& p : ps) out.push_back(p.tensor);
  return out;
}

}  // namespace zero::torch
