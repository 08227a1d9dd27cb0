#include "ckpt/agree.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <string>

#include "zero/core/error.hpp"

namespace zero::ckpt::detail {

void agree(Communicator& comm, const std::exception_ptr& local) {
  const int n = comm.size();
  // The lowest failing rank r contributes n - r (exact in f32 for any world size used).
  float flag = local ? static_cast<float>(n - comm.rank()) : 0.0f;
  comm.all_reduce(&flag, &flag, 1, DType::kF32, ReduceOp::kMax);
  if (flag == 0.0f) return;
  const int root = n - static_cast<int>(flag);
  // The root's code and message, as bytes (the collectives copy f32 words bit for bit).
  constexpr std::size_t kWords = 512;
  std::array<float, kWords> buf{};
  ErrorCode code = ErrorCode::kInternal;
  std::string message;
  if (comm.rank() == root) {
    try {
      std::rethrow_exception(local);
    } catch (const Error& e) {
      code = e.code();
      message = e.message();
    } catch (const std::exception& e) {
      message = e.what();
    }
    auto* bytes = reinterpret_cast<char*>(buf.data());
    const auto c = static_cast<std::uint32_t>(code);
    std::memcpy(bytes, &c, 4);
    std::memcpy(bytes + 4, message.data(), std::min(message.size(), kWords * 4 - 5));
  }
  comm.broadcast(buf.data(), buf.data(), kWords, DType::kF32, root);
  if (comm.rank() == root) std::rethrow_exception(local);
  const auto* bytes = reinterpret_cast<const char*>(buf.data());
  std::uint32_t c = 0;
  std::memcpy(&c, bytes, 4);
  throw Error(static_cast<ErrorCode>(c),
              "rank " + std::to_string(root) + ": " + std::string(bytes + 4), __FILE__, __LINE__);
}

}  // namespace zero::ckpt::detail
