// torch/units.cpp — how a LibTorch trainer's parameters are grouped into units
// (zero/torch/torch.hpp).
#include <algorithm>
#include <string>
#include <unordered_set>

#include "zero/core/error.hpp"
#include "zero/torch/torch.hpp"

namespace zero::torch {
namespace {

constexpr const char* kRoot = "<root>";

void add(TensorUnit& unit, const std::string& name, const at::Tensor& t) {
  unit.param_names.push_back(name);
  unit.params.push_back(t);
}

std::vector<TensorUnit> non_empty(std::vector<TensorUnit> units) {
  std::erase_if(units, [](const TensorUnit& u) { return u.params.empty(); });
  return units;
}

// "a.b.c" starts with the module path "a.b" (or the path is the root "").
bool under(const std::string& param, const std::string& module_path) {
  if (module_path.empty()) return true;
  return param.size() > module_path.size() &&
         param.compare(0, module_path.size(), module_path) == 0 && param[module_path.size()] == '.';
}

}  // namespace

std::vector<TensorUnit> units_by_child(const ::torch::nn::Module& model) {
  std::vector<TensorUnit> units;
  units.push_back({kRoot, {}, {}});
  for (const auto& p : model.named_parameters(/*recurse=*/false)) add(units[0], p.key(), p.value());
  for (const auto& child : model.named_children()) {
    TensorUnit u{child.key(), {}, {}};
    for (const auto& p : child.value()->named_parameters(/*recurse=*/true))
      add(u, child.key() + "." + p.key(), p.value());
    units.push_back(std::move(u));
  }
  return non_empty(std::move(units));
}

std::vector<TensorUnit> units_of(const ::torch::nn::Module& model,
                                 const std::vector<std::shared_ptr<::torch::nn::Module>>& marked) {
  // The path of each marked module inside `model`.
  const auto modules = model.named_modules(/*name_prefix=*/"", /*include_self=*/false);
  std::vector<std::string> paths;
  for (std::size_t m = 0; m < marked.size(); ++m) {
    ZERO_CHECK(marked[m] != nullptr, kInvalidArgument, "zero::torch::units_of: marked module ", m,
               " is null");
    const auto it = std::find_if(modules.begin(), modules.end(), [&](const auto& item) {
      return item.value().get() == marked[m].get();
    });
    ZERO_CHECK(it != modules.end(), kInvalidArgument, "zero::torch::units_of: marked module ", m,
               " (", marked[m]->name(), ") is not a submodule of the model");
    paths.push_back(it->key());
  }
  std::vector<TensorUnit> units;
  units.push_back({kRoot, {}, {}});
  for (const std::string& p : paths) units.push_back({p, {}, {}});
  for (const auto& p : model.named_parameters(/*recurse=*/true)) {
    // The innermost marked module holding the parameter (the longest path).
    std::size_t best = 0;
    std::size_t best_len = 0;
    for (std::size_t m = 0; m < paths.size(); ++m)
      if (under(p.key(), paths[m]) && (best == 0 || paths[m].size() > best_len)) {
        best = m + 1;
        best_len = paths[m].size();
      }
    add(units[best], p.key(), p.value());
  }
  return non_empty(std::move(units));
}

std::vector<TensorUnit> units_by_prefix(
    const ::torch::OrderedDict<std::string, at::Tensor>& named) {
  std::vector<TensorUnit> units;
  for (const auto& p : named) {
    const std::string& name = p.key();
    const auto dot = name.find('.');
    const std::string prefix = dot == std::string::npos ? std::string(kRoot) : name.substr(0, dot);
    auto it = std::find_if(units.begin(), units.end(),
                           [&](const TensorUnit& u) { return u.name == prefix; });
    if (it == units.end()) {
      units.push_back({prefix, {}, {}});
      it = units.end() - 1;
    }
    add(*it, name, p.value());
  }
  return units;
}

std::vector<TensorUnit> units_of(const std::vector<at::Tensor>& params) {
  std::vector<TensorUnit> units;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::string name = "param." + std::to_string(i);
    units.push_back({name, {name}, {params[i]}});
  }
  return units;
}

std::vector<TensorUnit> units_of(const std::vector<::torch::optim::OptimizerParamGroup>& groups) {
  std::vector<TensorUnit> units;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const std::string name = "group." + std::to_string(g);
    TensorUnit u{name, {}, {}};
    for (std::size_t i = 0; i < groups[g].params().size(); ++i)
      add(u, name + "." + std::to_string(i), groups[g].params()[i]);
    units.push_back(std::move(u));
  }
  return non_empty(std::move(units));
}

TensorBytes tensor_bytes(const std::vector<at::Tensor>& params) {
  TensorBytes b;
  std::unordered_set<const void*> seen;
  auto count = [&](const at::Tensor& t, std::size_t& into) {
    if (!t.defined() || !t.has_storage()) return;
    const c10::StorageImpl* s = t.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
    // A released stage-3 parameter keeps its byte size and holds no memory (bound_storage.hpp).
    if (seen.insert(s).second && s->data() != nullptr) into += s->nbytes();
  };
  for (const at::Tensor& p : params) {
    count(p, b.params);
    count(p.grad(), b.grads);
  }
  return b;
}

}  // namespace zero::torch
