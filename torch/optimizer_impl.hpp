// torch/optimizer_impl.hpp — the state behind zero::torch::Optimizer (zero/torch/torch.hpp),
// shared by the files that implement it: optimizer.cpp (binding, hooks, step), full_weights.cpp
// (full weights and checkpoints mid-training).
//
// Thread safety: one rank's optimizer, used from that rank's thread.
#pragma once

#include <torch/csrc/autograd/function.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "torch/bound_storage.hpp"
#include "torch/operator_watch.hpp"
#include "zero/torch/torch.hpp"

namespace zero::torch {

// The trainer's torch::optim set-up (torch/param_groups.cpp): the config with its optimizer
// block from `defaults` (null: the config's own), the engine's groups 1.. (the torch groups with
// options, "group.<k>"), and each parameter's group (by TensorImpl; groups without options: 0).
struct EngineGroups {
  Config config;
  std::vector<ParamGroup> groups;
  std::unordered_map<const void*, int> group_of;
};
EngineGroups engine_groups(const std::vector<::torch::optim::OptimizerParamGroup>& groups,
                           const ::torch::optim::OptimizerOptions* defaults, const Config& config);

struct Optimizer::Impl {
  struct Param {
    UnitId unit = 0;
    int index = 0;
    std::string name;
    at::Tensor tensor;                // the module's parameter (its identity is kept)
    std::vector<std::int64_t> shape;  // LibTorch's shape
    detail::BoundTensor bound;        // its data since set_data
    at::Tensor grad_view;             // the engine's gradient buffer while the unit is in flight
    detail::BoundTensor handed;       // .grad once handed over: no memory, watched
    std::shared_ptr<::torch::autograd::Node> accumulator;
    std::uintptr_t post_hook = 0;
  };
  // What the hooks reach; `impl` is cleared when the optimizer goes (LibTorch 1.13 cannot remove
  // a pre hook, and a graph built earlier may keep an accumulator alive).
  struct HookTarget {
    Impl* impl = nullptr;
  };

  // `group_of`: each parameter's group (EngineOptions::param_groups); empty: every parameter
  // in group 0, else a parameter it does not list is an error naming it.
  Impl(Communicator& c, std::vector<TensorUnit> u, const Config& config, EngineOptions options,
       const std::unordered_map<const void*, int>& group_of = {});
  ~Impl();

  void on_gradient(UnitId u, int i);     // before autograd accumulates into .grad
  void on_accumulated(UnitId u, int i);  // after
  // Gives unit u's gradients to the engine; from backward, .grad becomes the watched `handed`.
  void hand_over(UnitId u, bool from_backward);
  void reset_grads();  // every .grad undefined, none watched
  void raise_gather_error() const;
  void unhook();
  void own_values(bool gather);  // every parameter gets its own storage back
  // The constructor's steps, in order: the units declared to the engine (each parameter's group),
  // rank 0's values broadcast into it, the module's tensors bound to its storage and hooked,
  // the operator watch made (origin: checked()'s unit of each engine unit).
  void declare_units(const std::unordered_map<const void*, int>& group_of);
  void broadcast_values();
  void bind_params();
  void watch_operators(std::vector<int> origin);
  // Unit u's parameters that get a gradient (a frozen unit's: none).
  int trainable_params(std::size_t u) const {
    int n = 0;
    for (const Param& p : params[u]) n += p.tensor.requires_grad() ? 1 : 0;
    return n;
  }

  Communicator& comm;
  std::vector<TensorUnit> units;
  std::unique_ptr<Engine> engine;
  DType w = DType::kF32;
  bool shard_params = false;
  std::vector<std::vector<Param>> params;  // [unit][index]
  std::vector<int> waiting;                // per unit: parameters without a gradient yet
  std::vector<bool> handed;                // per unit: grads_ready this micro-step
  bool in_micro_step = false;              // a gradient arrived since the last step()
  bool detached = false;
  std::shared_ptr<HookTarget> target = std::make_shared<HookTarget>();
  std::unique_ptr<detail::OperatorWatch> watch;
  double clip_once = 0.0;  // clip_grad_norm_'s max norm for the next step() (0: the config's)
};

}  // namespace zero::torch
