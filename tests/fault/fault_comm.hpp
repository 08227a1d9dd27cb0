// tests/fault/fault_comm.hpp — a communicator that injects a fault into the rank that uses it:
// it forwards every collective to an inner communicator and, once armed, runs an action (kill
// the process, throw, hang) when the rank issues the n-th collective of a given kind. Lets the
// fault tests place a fault at a known point of the engine's step (the engine's collectives are
// its only visible events) without hooks in the engine.
//
// Thread safety: as a Communicator (one rank's thread).
#pragma once

#include <functional>
#include <string>

#include "zero/comm/comm.hpp"

namespace zero::testing {

class FaultComm final : public Communicator {
 public:
  explicit FaultComm(Communicator& inner)
      : Communicator(inner.rank(), inner.size(), inner.world_ranks(), inner.timeout_s()),
        inner_(inner) {}
  std::string_view backend() const noexcept override { return inner_.backend(); }

  // Runs `action(what)` when this rank issues its `nth` (1-based) collective of `kind` from
  // now on, before the collective is handed to the inner communicator.
  void arm(Collective kind, int nth, std::function<void(const std::string&)> action) {
    kind_ = kind;
    left_ = nth;
    action_ = std::move(action);
  }

 protected:
  CommHandle start(const detail::CollectiveArgs& a) override {
    if (action_ && a.kind == kind_ && --left_ == 0) {
      auto action = std::move(action_);
      action_ = nullptr;
      action(describe(a));
    }
    switch (a.kind) {
      case Collective::kAllReduce:
        return inner_.all_reduce_async(a.send, a.recv, a.count, a.dtype, a.op);
      case Collective::kReduceScatter:
        return inner_.reduce_scatter_async(a.send, a.recv, a.count, a.dtype, a.op);
      case Collective::kAllGather: return inner_.all_gather_async(a.send, a.recv, a.count, a.dtype);
      case Collective::kBroadcast:
        return inner_.broadcast_async(a.send, a.recv, a.count, a.dtype, a.root);
      case Collective::kBarrier: return inner_.barrier_async();
      case Collective::kAllToAll: return inner_.all_to_all_async(a.send, a.recv, a.count, a.dtype);
    }
    ZERO_THROW(kInternal, "unknown collective");
  }
  std::unique_ptr<Communicator> split_impl(int, int) override {
    ZERO_THROW(kInvalidArgument, "FaultComm: split is not supported");
  }

 private:
  Communicator& inner_;
  Collective kind_ = Collective::kBarrier;
  int left_ = 0;
  std::function<void(const std::string&)> action_;
};

}  // namespace zero::testing
