// torch/operator_watch.hpp — what LibTorch's operators read, seen before their kernels run:
// stage 3's parameters, gathered when an operator is about to read them and released when
// operators move on to other units; and, at every stage, the gradients the optimizer has handed
// to the engine, which no operator may read (below).
//
// LibTorch (1.13) has no forward hooks in C++, and a module's forward is not virtual, so the
// module cannot be wrapped without changing the trainer's code. What every read of a parameter
// does go through is the ATen dispatcher, and the dispatcher runs RecordFunction callbacks
// with the operator's inputs before its kernel. A thread-local callback looks each input's
// StorageImpl up among the units' parameter storages (views share it: weight.t(), the tensors
// autograd saves for backward); for every unit the operator reads it gathers the unit
// (Engine::gather: the all-gather, or the prefetch already in flight, and the prefetch of what
// comes next) and binds the parameters' storages to the gathered buffer.
//
// The release rule, safe by construction: units are released only when a top-level operator
// starts (one no other operator of this thread is running: the trainer's call, or an operator
// autograd's engine runs for a backward node), and then only the units that operator does not
// read. An operator's kernel may hold pointers into every unit it read until it returns, and it
// may run nested operators on part of its inputs (aten::addmm reads the weight's and the bias's
// units, then runs aten::expand on the bias alone): a nested operator gathers what it reads and
// releases nothing. Every pointer into a unit is taken by an operator on this thread (views and
// autograd's saved tensors share the parameter's storage, so reading them gathers it), and at a
// top-level start none is running: what is released is read by no one. So a unit is live from
// the first operator that reads it to the next top-level operator that reads other units and
// not it — the module-boundary release of FSDP without hooks on modules — and again in
// backward, where autograd's kernels read the saved parameters. The depth is counted by the
// callback's end half (RecordFunction calls it when the operator returns or throws).
//
// Release groups: the engine's units of one trainer's unit (a child module split into
// "<unit> (frozen)" and "<unit>", torch/optimizer.cpp) are released together: an operator
// that reads one half keeps the other live, so a block is held from its first operator to the
// next top-level one that reads neither half, as the child's one unit was. Released alone, the
// frozen half of a LoRA or BitFit block would go at every LayerNorm or adapter operator and be
// all-gathered again by the next Linear (3x the all-gathers per step in torch_frozen_test). A
// unit is still released only by an operator that does not read it: the rule above holds.
//
// Handed-over gradients: once a unit's gradients are the engine's (reduced, sharded, accumulated
// in its own buffers), each parameter's .grad is a tensor of its shape with no memory, watched
// here. An operator that reads one (torch::nn::utils::clip_grad_norm_, a gradient-norm log) is
// an error naming the parameter — never the silent 0 an undefined .grad gives clip_grad_norm_.
//
// LibTorch catches and logs every exception a RecordFunction callback throws, so a failed gather
// or a read of a handed-over gradient is kept (error()) and the storages are bound to zeros for
// the kernel that is about to run; the optimizer raises the error at the next gradient hook or
// step().
//
// Thread safety: registered for, and used on, the thread that creates it (one rank's thread).
#pragma once

#include <torch/torch.h>

#include <cstddef>
#include <exception>
#include <string>
#include <unordered_map>
#include <vector>

#include "zero/engine/engine.hpp"

namespace zero::torch::detail {

class OperatorWatch {
 public:
  // storages[u][i]: the storage of parameter i of unit u (stage 3; empty otherwise).
  // release_group[u]: units with the same value are released together (empty: each unit alone).
  OperatorWatch(Engine& engine, std::vector<std::vector<c10::StorageImpl*>> storages,
                std::vector<int> release_group = {});
  ~OperatorWatch();  // removes the callback, releases what is gathered
  OperatorWatch(const OperatorWatch&) = delete;
  OperatorWatch& operator=(const OperatorWatch&) = delete;

  // Called by the callback with the operator's inputs (tensors and tensor lists).
  void on_operator(const c10::IValue* inputs, std::size_t count);
  // Called by the callback when an operator returns (or throws).
  void on_operator_end();
  // Releases every gathered unit (before the engine's step, or detach()).
  void release_all();
  // A handed-over gradient's storage (of parameter `name`): reading it is an error. unwatch
  // forgets every one (their storages are the optimizer's; bound to nothing again).
  void watch_grad(c10::StorageImpl* s, std::string name);
  void unwatch_grads();
  // The first error a gather hit (null: none).
  std::exception_ptr error() const noexcept { return error_; }
  // Units gathered by an operator so far (all micro-steps).
  std::size_t gathers() const noexcept { return gathers_; }

 private:
  void see(const at::Tensor& t);
  void gather(UnitId u);
  void release(UnitId u);

  Engine& engine_;
  std::vector<std::vector<c10::StorageImpl*>> storages_;
  std::vector<int> release_group_;  // per unit
  std::unordered_map<const c10::StorageImpl*, UnitId> unit_of_;
  std::vector<GatherGuard> guards_;
  std::vector<bool> live_;
  std::vector<UnitId> touched_;              // units the current operator reads
  std::vector<std::vector<char>> fallback_;  // zeros a kernel reads after a failed gather
  std::unordered_map<c10::StorageImpl*, std::string> grads_;  // handed over
  std::vector<std::vector<char>> grad_zeros_;  // what a kernel reads of a handed-over gradient
  std::exception_ptr error_;
  std::size_t gathers_ = 0;
  int depth_ = 0;  // operators running on this thread (the one starting included, in on_operator)
  std::uint64_t callback_ = 0;
  OperatorWatch* previous_ = nullptr;  // the thread's previous instance (nested optimizers)
};

}  // namespace zero::torch::detail
