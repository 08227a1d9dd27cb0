// torch/operator_watch.cpp — see operator_watch.hpp.
//
// Compiled with NDEBUG always (torch/CMakeLists.txt): at::RecordFunction has a debug-only
// member (inputs_valid_) before the fields inputs() reads, so a TU built without NDEBUG reads the
// release-built libtorch's RecordFunction at the wrong offsets.
#include "torch/operator_watch.hpp"

#include <ATen/record_function.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "torch/bound_storage.hpp"
#include "zero/core/error.hpp"
#include "zero/core/log.hpp"

namespace zero::torch::detail {
namespace {

thread_local OperatorWatch* tls_current = nullptr;

// Records that run operators without reading a parameter themselves do not enclose: autograd's
// engine records each backward node it evaluates ("autograd::engine::evaluate_function: <node>")
// and Tensor::backward() is the operator aten::_backward; the operators inside them (the node's
// ATen calls) take every pointer there is. Counted as enclosing, they would make every backward
// operator nested, and nothing would be released in backward.
bool encloses(const at::RecordFunction& fn) {
  static constexpr char kNode[] = "autograd::engine::evaluate_function";
  const char* name = fn.name();
  return std::strcmp(name, "aten::_backward") != 0 &&
         std::strncmp(name, kNode, sizeof(kNode) - 1) != 0;
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  OperatorWatch* g = tls_current;
  if (g != nullptr && encloses(fn)) {
    const auto inputs = fn.inputs();
    g->on_operator(inputs.data(), inputs.size());
  }
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  OperatorWatch* g = tls_current;
  if (g != nullptr && encloses(fn)) g->on_operator_end();
}

}  // namespace

OperatorWatch::OperatorWatch(Engine& engine, std::vector<std::vector<c10::StorageImpl*>> storages,
                             std::vector<int> release_group)
    : engine_(engine), storages_(std::move(storages)), release_group_(std::move(release_group)) {
  const std::size_t n = storages_.size();
  if (release_group_.empty()) {
    for (std::size_t u = 0; u < n; ++u) release_group_.push_back(static_cast<int>(u));
  }
  ZERO_CHECK(release_group_.size() == n, kInternal, "OperatorWatch: ", release_group_.size(),
             " release groups for ", n, " units");
  guards_.resize(n);
  live_.assign(n, false);
  fallback_.resize(n);
  for (UnitId u = 0; u < static_cast<UnitId>(n); ++u)
    for (c10::StorageImpl* s : storages_[static_cast<std::size_t>(u)]) unit_of_.emplace(s, u);
  previous_ = tls_current;
  tls_current = this;
  callback_ = at::addThreadLocalCallback(at::RecordFunctionCallback(on_start, on_end)
                                             .needsInputs(true)
                                             .scopes({at::RecordScope::FUNCTION}));
}

OperatorWatch::~OperatorWatch() {
  at::removeCallback(callback_);
  tls_current = previous_;
  try {
    release_all();
  } catch (const std::exception& e) {
    ZERO_LOG(kWarn, "zero::torch: releasing the gathered units failed: ", e.what());
  }
}

void OperatorWatch::on_operator(const c10::IValue* inputs, std::size_t count) {
  // The depth before this operator: 0 for one the trainer (or autograd's engine) called, more
  // for an operator another one runs (aten::linear runs aten::t and aten::addmm, aten::addmm
  // runs aten::expand on the bias): the outer operator may hold pointers into any unit it read.
  const int depth = depth_++;
  touched_.clear();
  for (std::size_t k = 0; k < count; ++k) {
    const c10::IValue& v = inputs[k];
    if (v.isTensor()) {
      see(v.toTensor());
    } else if (v.isTensorList()) {
      const auto list = v.toTensorList();
      for (std::size_t j = 0; j < list.size(); ++j) see(list.get(j));
    }
  }
  if (touched_.empty()) return;  // an operator on activations only: nothing changes
  for (UnitId u : touched_) gather(u);
  if (depth > 0) return;  // inside another operator: release nothing
  // Live units of no group the operator reads (a unit it reads is in such a group: kept).
  auto read_group = [&](UnitId u) {
    const int g = release_group_[static_cast<std::size_t>(u)];
    return std::any_of(touched_.begin(), touched_.end(),
                       [&](UnitId t) { return release_group_[static_cast<std::size_t>(t)] == g; });
  };
  for (UnitId u = 0; u < static_cast<UnitId>(live_.size()); ++u)
    if (live_[static_cast<std::size_t>(u)] && !read_group(u)) release(u);
}

void OperatorWatch::on_operator_end() {
  if (depth_ > 0) --depth_;  // (an operator that began before the callback was added: none)
}

void OperatorWatch::see(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return;
  c10::StorageImpl* s = t.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
  if (!grads_.empty()) {
    const auto g = grads_.find(s);
    if (g != grads_.end() && s->data() == nullptr) {
      if (!error_) {
        try {
          ZERO_THROW(kInvalidArgument, "zero::torch: an operator read the .grad of parameter '",
                     g->second,
                     "' after backward handed it to the engine (the engine reduces, shards and "
                     "accumulates gradients in its own buffers; .grad is not the step's "
                     "gradient). torch::nn::utils::clip_grad_norm_ reads .grad: use "
                     "optimizer.clip_grad_norm_(max_norm) or the config's gradient_clipping, "
                     "and StepResult::grad_norm for the norm");
        } catch (...) {
          error_ = std::current_exception();
        }
      }
      grad_zeros_.emplace_back(s->nbytes(), 0);
      bind(s, grad_zeros_.back().data(), s->nbytes());
      return;
    }
  }
  const auto it = unit_of_.find(s);
  if (it == unit_of_.end()) return;
  if (std::find(touched_.begin(), touched_.end(), it->second) == touched_.end())
    touched_.push_back(it->second);
}

void OperatorWatch::gather(UnitId u) {
  const auto us = static_cast<std::size_t>(u);
  if (live_[us]) return;
  auto& storages = storages_[us];
  if (!error_) {
    try {
      guards_[us] = engine_.gather(u);
      for (std::size_t i = 0; i < storages.size(); ++i)
        bind(storages[i], guards_[us].param(static_cast<int>(i)));
      live_[us] = true;
      ++gathers_;
      return;
    } catch (...) {
      error_ = std::current_exception();
      guards_[us] = GatherGuard();
    }
  }
  // After a failure no collective is entered again (the other ranks may be gone): the kernel
  // reads zeros and the error surfaces at the next hook or step().
  const UnitSpec& spec = engine_.unit(u);
  const std::size_t elem = dtype_size(engine_.param_dtype());
  std::size_t total = 0;
  for (const ParamSpec& p : spec.params) total += p.numel() * elem;
  fallback_[us].assign(total, 0);
  std::size_t offset = 0;
  for (std::size_t i = 0; i < storages.size(); ++i) {
    const std::size_t bytes = spec.params[i].numel() * elem;
    bind(storages[i], fallback_[us].data() + offset, bytes);
    offset += bytes;
  }
  live_[us] = true;
}

void OperatorWatch::release(UnitId u) {
  const auto us = static_cast<std::size_t>(u);
  if (!live_[us]) return;
  for (c10::StorageImpl* s : storages_[us]) unbind(s);
  live_[us] = false;
  fallback_[us].clear();
  fallback_[us].shrink_to_fit();
  guards_[us].release();
}

void OperatorWatch::watch_grad(c10::StorageImpl* s, std::string name) {
  grads_[s] = std::move(name);
}

void OperatorWatch::unwatch_grads() {
  for (auto& g : grads_) unbind(g.first);
  grads_.clear();
  grad_zeros_.clear();
}

void OperatorWatch::release_all() {
  for (UnitId u = 0; u < static_cast<UnitId>(live_.size()); ++u) release(u);
}

}  // namespace zero::torch::detail
