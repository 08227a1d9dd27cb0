// torch/full_weights.cpp — zero::torch::Optimizer's full weights and checkpoints
// mid-training (zero/torch/torch.hpp): each unit read whole once (Engine::read_unit), the
// parameters handed out as tensors over the gathered buffer, a Module::save-shaped archive of them,
// and the engine's checkpoints behind the adapter's checks.
#include <torch/serialize.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <unordered_map>

#include "torch/optimizer_impl.hpp"
#include "zero/core/error.hpp"

namespace zero::torch {
namespace {

using Full = std::unordered_map<const c10::TensorImpl*, at::Tensor>;

// What Module::save writes (LibTorch 1.13, torch/csrc/api/src/nn/module.cpp): the module's own
// parameters, then its buffers (is_buffer), then each serializable child as a nested archive;
// a trained parameter's value is its full copy.
void write_module(const ::torch::nn::Module& module, ::torch::serialize::OutputArchive& archive,
                  const Full& full) {
  for (const auto& p : module.named_parameters(/*recurse=*/false)) {
    const auto it = full.find(p.value().unsafeGetTensorImpl());
    archive.write(p.key(), it != full.end() ? it->second : p.value());
  }
  for (const auto& b : module.named_buffers(/*recurse=*/false))
    archive.write(b.key(), b.value(), /*is_buffer=*/true);
  for (const auto& child : module.named_children()) {
    if (!child.value()->is_serializable()) continue;
    ::torch::serialize::OutputArchive child_archive(archive.compilation_unit());
    write_module(*child.value(), child_archive, full);
    archive.write(child.key(), child_archive);
  }
}

}  // namespace

void Optimizer::for_each_full_parameter(
    const std::function<void(const std::string&, const at::Tensor&)>& fn, bool rank0_only) {
  Impl& m = *impl_;
  ZERO_CHECK(!m.detached, kInvalidArgument,
             "zero::torch: the full parameters were asked for after detach() (the module holds "
             "them: read its parameters)");
  ZERO_CHECK(!m.in_micro_step, kInvalidArgument,
             "zero::torch: the full parameters were asked for between backward() and step(); ask "
             "after step() (every rank at the same point: stage 3 gathers each unit)");
  m.raise_gather_error();
  const bool calls = !rank0_only || m.comm.rank() == 0;
  for (UnitId u = 0; u < static_cast<UnitId>(m.units.size()); ++u) {
    const GatherGuard g = m.engine->read_unit(u);
    if (!calls) continue;
    for (const Impl::Param& p : m.params[static_cast<std::size_t>(u)])
      fn(p.name, detail::view_tensor(g.param(p.index), p.shape));
  }
}

::torch::OrderedDict<std::string, at::Tensor> Optimizer::full_state_dict(bool rank0_only) {
  ::torch::OrderedDict<std::string, at::Tensor> out;
  for_each_full_parameter(
      [&](const std::string& name, const at::Tensor& v) { out.insert(name, v.clone()); },
      rank0_only);
  return out;
}

void Optimizer::save_model(const ::torch::nn::Module& model, const std::string& path,
                           at::ScalarType dtype) {
  Impl& m = *impl_;
  Full full;
  std::size_t next = 0;
  std::vector<const c10::TensorImpl*> order;
  for (const auto& ps : m.params)
    for (const Impl::Param& p : ps) order.push_back(p.tensor.unsafeGetTensorImpl());
  for_each_full_parameter(
      [&](const std::string&, const at::Tensor& v) {
        full[order[next++]] = v.to(dtype, /*non_blocking=*/false, /*copy=*/true);
      },
      /*rank0_only=*/true);
  if (m.comm.rank() != 0) return;
  const std::string tmp = path + ".tmp";
  try {
    ::torch::serialize::OutputArchive archive(std::make_shared<::torch::jit::CompilationUnit>());
    write_module(model, archive, full);
    archive.save_to(tmp);
  } catch (const c10::Error& e) {
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    ZERO_THROW(kIO, "zero::torch::save_model: writing '", tmp,
               "' failed: ", e.what_without_backtrace());
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  ZERO_CHECK(!ec, kIO, "zero::torch::save_model: renaming '", tmp, "' to '", path,
             "': ", ec.message());
}

ckpt::SaveInfo Optimizer::save_checkpoint(ckpt::Saver& saver, std::string_view trainer_state) {
  Impl& m = *impl_;
  ZERO_CHECK(!m.detached, kInvalidArgument, "zero::torch: save_checkpoint after detach()");
  ZERO_CHECK(!m.in_micro_step, kInvalidArgument,
             "zero::torch: save_checkpoint between backward() and step(); save after step()");
  m.raise_gather_error();
  return saver.save(trainer_state);
}

ckpt::LoadResult Optimizer::load_checkpoint(const std::string& path) {
  Impl& m = *impl_;
  ZERO_CHECK(!m.detached, kInvalidArgument, "zero::torch: load_checkpoint after detach()");
  ZERO_CHECK(
      !m.in_micro_step && m.engine->training_state().steps == 0 && m.engine->micro_step() == 0,
      kInvalidArgument, "zero::torch: load_checkpoint after training began; load '", path,
      "' right after constructing the optimizer, before the first backward() / step()");
  // A forward (evaluation) before the load leaves units gathered by operators.
  if (m.watch) m.watch->release_all();
  return ckpt::load(*m.engine, path);
}

}  // namespace zero::torch
