// torch/bound_storage.hpp — a LibTorch tensor whose storage is memory of the engine's.
//
// A parameter handed to the engine keeps its identity (the module's tensor, its autograd meta
// and hooks) and gets, through Variable::set_data, a tensor over a StorageImpl of our own that
// owns no memory: bind() points it at the engine's working copy of the parameter, unbind() leaves
// it at 0 bytes (a released stage-3 unit). Views of the parameter (weight.t(), the tensors
// autograd saves) share the StorageImpl, so they see every bind and unbind.
//
// Thread safety: a storage belongs to one rank's optimizer; used from that rank's thread.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "zero/core/dtype.hpp"
#include "zero/core/error.hpp"
#include "zero/device/device.hpp"

namespace zero::torch::detail {

inline at::ScalarType scalar_type(DType d) {
  switch (d) {
    case DType::kF32: return at::kFloat;
    case DType::kBF16: return at::kBFloat16;
    case DType::kF16: return at::kHalf;
  }
  ZERO_THROW(kInternal, "no LibTorch dtype for ", to_string(d));
}

struct BoundTensor {
  at::Tensor tensor;
  c10::StorageImpl* storage = nullptr;  // owned by the tensor's Storage
};

// A CPU tensor of `shape` and `dtype` over a non-resizable storage of no allocator and no memory
// (unbound: its byte size is the tensor's, its data null).
inline BoundTensor make_bound_tensor(const std::vector<std::int64_t>& shape, DType dtype) {
  std::size_t bytes = dtype_size(dtype);
  for (const std::int64_t d : shape) bytes *= static_cast<std::size_t>(d);
  auto storage = c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), bytes, c10::DataPtr(nullptr, c10::Device(c10::kCPU)),
      /*allocator=*/nullptr, /*resizable=*/false);
  c10::StorageImpl* raw = storage.get();
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(std::move(storage)), c10::DispatchKeySet(c10::DispatchKey::CPU),
      c10::scalarTypeToTypeMeta(scalar_type(dtype)));
  t.unsafeGetTensorImpl()->set_sizes_contiguous(shape);
  return {std::move(t), raw};
}

inline void bind(c10::StorageImpl* s, void* data, std::size_t bytes) {
  s->set_data_ptr_noswap(c10::DataPtr(data, c10::Device(c10::kCPU)));
  s->set_nbytes(bytes);
}

inline void bind(c10::StorageImpl* s, const View& v) { bind(s, v.data, v.bytes()); }

// Unbound (a released stage-3 unit): no memory, the byte size kept. A null buffer of nonzero
// size is what LibTorch's writer refuses: torch::save of the model (or of the parameter) throws
// ("PytorchStreamWriter failed writing file data/<k>: invalid parameter") instead of writing an
// empty storage that torch::load accepts and the first use of crashes on; a kernel reading it
// fails with LibTorch's "data is not allocated yet", as for a 0-byte storage.
inline void unbind(c10::StorageImpl* s) { bind(s, nullptr, s->nbytes()); }

// A tensor over memory the caller keeps alive (the engine's gradient buffer of a parameter).
inline at::Tensor view_tensor(const View& v, const std::vector<std::int64_t>& shape) {
  return ::torch::from_blob(v.data, shape, ::torch::TensorOptions().dtype(scalar_type(v.dtype)));
}

}  // namespace zero::torch::detail
