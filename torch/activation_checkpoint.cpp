// torch/activation_checkpoint.cpp — zero::torch::ActivationCheckpointing (zero/torch/torch.hpp):
// a custom autograd function whose forward runs without a graph and whose backward recomputes.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/custom_function.h>

#include <memory>
#include <mutex>
#include <string>

#include "zero/core/error.hpp"
#include "zero/engine/activation_checkpointing.hpp"
#include "zero/torch/torch.hpp"

namespace zero::torch {
namespace {

using ::torch::autograd::AutogradContext;
using ::torch::autograd::variable_list;

// What one checkpoint keeps besides its inputs (the autograd context's saved variables): the
// function, the generator state of its forward, and the tracker charge of the kept inputs
// (released when the graph, and this with it, is freed).
struct CheckpointState : ::torch::CustomClassHolder {
  ActivationCheckpointing::Fn fn;
  at::Generator rng;  // a clone of the CPU generator at the forward
  MemoryTracker* tracker = nullptr;
  MemTier tier = MemTier::kDevice;
  std::size_t bytes = 0;
  std::vector<c10::Device> devices;  // where each input was (cpu_checkpointing moves them)
  ~CheckpointState() override {
    if (tracker != nullptr && bytes > 0) tracker->release(MemCategory::kActivations, tier, bytes);
  }
};

struct CheckpointFunction : ::torch::autograd::Function<CheckpointFunction> {
  static variable_list forward(AutogradContext* ctx, c10::intrusive_ptr<CheckpointState> st,
                               bool cpu, at::TensorList inputs) {
    {
      at::Generator cpu_gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(cpu_gen.mutex());
      st->rng = cpu_gen.clone();
    }
    std::vector<at::Tensor> plain;  // the last input is checkpoint()'s anchor
    for (std::size_t i = 0; i + 1 < inputs.size(); ++i) plain.push_back(inputs[i].detach());
    variable_list outputs = st->fn(plain);  // grad mode is off here: no graph is kept
    for (const at::Tensor& out : outputs)
      ZERO_CHECK(out.defined(), kInvalidArgument,
                 "zero::torch::checkpoint: the function returned an undefined tensor");
    std::vector<at::Tensor> kept;
    for (const at::Tensor& x : inputs) {
      st->devices.push_back(x.device());
      at::Tensor k = cpu && !x.device().is_cpu() ? x.to(at::kCPU) : x;
      st->bytes += k.defined() ? k.numel() * k.element_size() : 0;
      kept.push_back(k);
    }
    ctx->save_for_backward(kept);
    if (st->tracker != nullptr) st->tracker->charge(MemCategory::kActivations, st->tier, st->bytes);
    ctx->saved_data["state"] = c10::IValue::make_capsule(st);
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto st =
        c10::static_intrusive_pointer_cast<CheckpointState>(ctx->saved_data["state"].toCapsule());
    const variable_list kept = ctx->get_saved_variables();
    std::vector<at::Tensor> inputs;
    for (std::size_t i = 0; i + 1 < kept.size(); ++i) {  // the last: checkpoint()'s anchor
      at::Tensor x = kept[i].detach();
      if (x.device() != st->devices[i]) x = x.to(st->devices[i]);
      if (at::isFloatingType(x.scalar_type())) x.requires_grad_(true);
      inputs.push_back(x);
    }
    variable_list outputs;
    {
      // The forward's generator state for the recompute, the current one back afterwards.
      at::Generator cpu_gen = at::detail::getDefaultCPUGenerator();
      at::Generator now;
      {
        std::lock_guard<std::mutex> lock(cpu_gen.mutex());
        now = cpu_gen.clone();
        cpu_gen.set_state(st->rng.get_state());
      }
      at::AutoGradMode grad(true);
      outputs = st->fn(inputs);
      std::lock_guard<std::mutex> lock(cpu_gen.mutex());
      cpu_gen.set_state(now.get_state());
    }
    ZERO_CHECK(outputs.size() == grad_outputs.size(), kInvalidArgument,
               "zero::torch::checkpoint: the recompute returned ", outputs.size(),
               " tensors, the forward ", grad_outputs.size(),
               " (the function must be deterministic)");
    variable_list with_grad, grads;
    for (std::size_t i = 0; i < outputs.size(); ++i)
      if (outputs[i].requires_grad() && grad_outputs[i].defined()) {
        with_grad.push_back(outputs[i]);
        grads.push_back(grad_outputs[i]);
      }
    if (!with_grad.empty()) ::torch::autograd::backward(with_grad, grads);
    variable_list result{at::Tensor(), at::Tensor()};  // st, cpu
    for (const at::Tensor& x : inputs)
      result.push_back(x.requires_grad() ? x.grad() : at::Tensor());
    result.emplace_back();  // the anchor
    return result;
  }
};

}  // namespace

ActivationCheckpointing::ActivationCheckpointing(Optimizer& optimizer)
    : ActivationCheckpointing(optimizer.engine().config(), &optimizer.engine().tracker()) {}

ActivationCheckpointing::ActivationCheckpointing(const Config& config, MemoryTracker* tracker)
    : tracker_(tracker),
      cpu_(config.activation_checkpointing.cpu_checkpointing),
      segments_(static_cast<int>(config.activation_checkpointing.number_checkpoints)) {}

std::vector<at::Tensor> ActivationCheckpointing::checkpoint(const Fn& fn,
                                                            const std::vector<at::Tensor>& inputs) {
  ZERO_CHECK(static_cast<bool>(fn), kInvalidArgument, "zero::torch::checkpoint: no function");
  if (!at::GradMode::is_enabled()) return fn(inputs);  // no backward will come: nothing to keep
  auto st = c10::make_intrusive<CheckpointState>();
  st->fn = fn;
  st->tracker = tracker_;
  st->tier = cpu_ ? MemTier::kPinned : MemTier::kDevice;
  // An input that requires grad, so that the outputs get this node even when no input does
  // (the first layer's input is data; the parameters fn reads are not inputs): else autograd
  // would skip the recompute and the parameters would get no gradient.
  std::vector<at::Tensor> args = inputs;
  args.push_back(at::empty({0}).requires_grad_(true));
  return CheckpointFunction::apply(st, cpu_, at::TensorList(args));
}

at::Tensor ActivationCheckpointing::checkpoint(const Layer& fn, const at::Tensor& input) {
  ZERO_CHECK(static_cast<bool>(fn), kInvalidArgument, "zero::torch::checkpoint: no function");
  // Copied into the function the backward runs: it outlives this call.
  const auto out = checkpoint(
      [fn](const std::vector<at::Tensor>& in) -> std::vector<at::Tensor> { return {fn(in[0])}; },
      std::vector<at::Tensor>{input});
  return out[0];
}

at::Tensor ActivationCheckpointing::sequential(const std::vector<Layer>& layers,
                                               const at::Tensor& input, int segments) {
  const int n = static_cast<int>(layers.size());
  ZERO_CHECK(n > 0, kInvalidArgument, "zero::torch::checkpoint sequential: no layers");
  if (segments <= 0) segments = segments_ > 0 ? segments_ : n;
  ZERO_CHECK(segments <= n, kInvalidArgument, "zero::torch::checkpoint sequential: ", segments,
             " segments for ", n, " layers (activation_checkpointing.number_checkpoints)");
  CheckpointSpec spec;
  spec.policy = CheckpointPolicy::kExplicit;
  spec.boundaries = {-segments};  // "segments evenly spread", as CheckpointSpec::from_config
  const std::vector<int> starts = segment_starts(n, spec);
  // Shared by the segments' recomputes, which run after this returns.
  const auto kept = std::make_shared<const std::vector<Layer>>(layers);
  at::Tensor x = input;
  for (std::size_t s = 0; s < starts.size(); ++s) {
    const int first = starts[s];
    const int last = s + 1 < starts.size() ? starts[s + 1] : n;
    x = checkpoint(
        [kept, first, last](const at::Tensor& in) {
          at::Tensor h = in;
          for (int l = first; l < last; ++l) h = (*kept)[static_cast<std::size_t>(l)](h);
          return h;
        },
        x);
  }
  return x;
}

}  // namespace zero::torch
