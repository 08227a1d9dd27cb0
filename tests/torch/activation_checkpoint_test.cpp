// zero::torch::ActivationCheckpointing: the char transformer with every block checkpointed
// against the plain run at stages 0-3 (losses and parameters bitwise: the recompute runs the
// same operators on the same inputs), sequential() in the config's number_checkpoints segments,
// dropout recomputed with the forward's random state, the tracker's charge of the kept inputs,
// and LibTorch's own activation memory measured both ways (a counting CPU allocator) beside the
// step time the recompute costs, same run.
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cstdio>

#include "common/expect_error.hpp"
#include "torch_runs.hpp"

namespace zero::testing {
namespace {

// Every CPU allocation LibTorch makes while installed, counted: live bytes and their peak.
class CountingAllocator final : public c10::Allocator {
 public:
  // Installed for the object's lifetime. Never destroyed while a tensor it allocated lives:
  // the tests make one that lives to the end of the process.
  CountingAllocator() : base_(c10::GetCPUAllocator()) { c10::SetCPUAllocator(this, kPriority); }
  ~CountingAllocator() override { c10::SetCPUAllocator(base_, kPriority); }
  // A header before the data holds the size; data and context are one pointer, as
  // Allocator::raw_allocate requires.
  c10::DataPtr allocate(std::size_t n) const override {
    auto* block = static_cast<char*>(c10::alloc_cpu(n + kHeader));
    *reinterpret_cast<std::size_t*>(block) = n;
    *reinterpret_cast<const CountingAllocator**>(block + sizeof(std::size_t)) = this;
    const std::int64_t now = live_ += static_cast<std::int64_t>(n);
    std::int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    void* data = block + kHeader;
    return {data, data, &release, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void reset_peak() { peak_ = live_.load(); }
  std::int64_t live() const { return live_; }
  std::int64_t peak() const { return peak_; }

 private:
  static constexpr std::uint8_t kPriority = 100;
  static constexpr std::size_t kHeader = 64;  // keeps alloc_cpu's 64-byte alignment
  static void release(void* data) {
    char* block = static_cast<char*>(data) - kHeader;
    const std::size_t n = *reinterpret_cast<std::size_t*>(block);
    const auto* owner = *reinterpret_cast<const CountingAllocator**>(block + sizeof(std::size_t));
    owner->live_ -= static_cast<std::int64_t>(n);
    c10::free_cpu(block);
  }
  c10::Allocator* base_;
  mutable std::atomic<std::int64_t> live_{0}, peak_{0};
};

Config ac_config(int stage, int number_checkpoints = 0, bool cpu = false) {
  std::string j = R"({"zero_optimization": {"stage": )" + std::to_string(stage);
  if (stage == 3) j += R"(, "stage3_param_persistence_threshold": 0)";
  j += R"(}, "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.01}})";
  if (number_checkpoints > 0 || cpu)
    j += R"(, "activation_checkpointing": {"number_checkpoints": )" +
         std::to_string(number_checkpoints) + R"(, "cpu_checkpointing": )" +
         (cpu ? "true" : "false") + "}";
  return parse_config(j + "}");
}

struct AcRun {
  std::vector<::torch::Tensor> params;
  std::vector<float> losses;
  std::int64_t torch_peak = 0;    // LibTorch's live bytes above the step's start, at most
  std::size_t tracker_kept = 0;   // the tracker's kActivations after forward, rank 0
  std::size_t tracker_after = 0;  // and after step()
  double seconds = 0;             // forward + backward + step, all steps, rank 0
};

// The char transformer at `stage` on `ranks` in-process ranks; every block checkpointed when
// `checkpoint`. `counter` (with ranks == 1) measures LibTorch's allocations.
AcRun train_ac(int stage, int ranks, bool checkpoint, const ct::Dims& d, int steps,
               CountingAllocator* counter = nullptr) {
  const TokenData data = make_data(steps, d);
  std::vector<ct::Model> models;
  for (int q = 0; q < ranks; ++q) models.push_back(make_model(d, 1 + q));
  AcRun out;
  std::mutex mu;
  ThreadGroup::run(ranks, [&](Communicator& comm) {
    const int q = comm.rank();
    ct::Model& model = models[static_cast<std::size_t>(q)];
    zero::torch::Optimizer opt(comm, *model, ac_config(stage));
    zero::torch::ActivationCheckpointing ac(opt);
    ct::ModelImpl::BlockRunner run;
    if (checkpoint)
      run = [&ac](const std::function<::torch::Tensor(const ::torch::Tensor&)>& block,
                  const ::torch::Tensor& x) { return ac.checkpoint(block, x); };
    const int rows = kBatch / ranks;
    std::vector<float> losses;
    std::int64_t peak = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int s = 0; s < steps; ++s) {
      auto tok = data.tokens[static_cast<std::size_t>(s)].slice(0, q * rows, (q + 1) * rows);
      auto tgt = data.targets[static_cast<std::size_t>(s)].slice(0, q * rows, (q + 1) * rows);
      opt.zero_grad();
      const std::int64_t base = counter != nullptr ? counter->live() : 0;
      if (counter != nullptr) counter->reset_peak();
      auto loss = ct::loss(model, tok, tgt, run);
      if (q == 0) out.tracker_kept = opt.engine().tracker().current(MemCategory::kActivations);
      loss.backward();
      if (counter != nullptr) peak = std::max(peak, counter->peak() - base);
      opt.step();
      losses.push_back(loss.item<float>());
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (q == 0) out.tracker_after = opt.engine().tracker().current(MemCategory::kActivations);
    opt.detach();
    if (q == 0) {
      std::lock_guard<std::mutex> lock(mu);
      out.params = snapshot(*model);
      out.losses = losses;
      out.torch_peak = peak;
      out.seconds = secs;
    }
  });
  return out;
}

TEST(TorchActivationCheckpointing, CharTransformerBitwiseThePlainRunAtEveryStage) {
  const ct::Dims d = test_dims();
  // The kept inputs: one [B/N, T, C] f32 activation per block.
  const std::size_t per_block = static_cast<std::size_t>(kBatch / 2 * d.context * d.embed) * 4;
  const AcRun plain0 = train_ac(0, 2, false, d, 8);
  for (int stage = 0; stage <= 3; ++stage) {
    const AcRun plain = stage == 0 ? plain0 : train_ac(stage, 2, false, d, 8);
    const AcRun ckpt = train_ac(stage, 2, true, d, 8);
    EXPECT_TRUE(bitwise_equal(ckpt.params, plain.params)) << "stage " << stage;
    EXPECT_EQ(ckpt.losses, plain.losses) << "stage " << stage;
    EXPECT_TRUE(bitwise_equal(ckpt.params, plain0.params)) << "stage " << stage;
    EXPECT_EQ(ckpt.tracker_kept, per_block * static_cast<std::size_t>(d.layers))
        << "stage " << stage;
    EXPECT_EQ(plain.tracker_kept, 0u);
    EXPECT_EQ(ckpt.tracker_after, 0u) << "stage " << stage << ": the charge outlived the graph";
  }
}

// LibTorch's activation memory, both ways, and the recompute's time, in one run (printed; the
// assertion is on bytes only: checkpointing must lower LibTorch's peak).
TEST(TorchActivationCheckpointing, LowersLibTorchsPeakActivationMemory) {
  const ct::Dims d{65, 64, 4, 6, 32};
  static auto* counter = new CountingAllocator();  // outlives every tensor it allocates
  for (int stage : {0, 3}) {
    const AcRun plain = train_ac(stage, 1, false, d, 3, counter);
    const AcRun ckpt = train_ac(stage, 1, true, d, 3, counter);
    std::printf(
        "stage %d, 1 rank, %lld layers, batch %d x %lld: LibTorch peak above the step's start "
        "%.2f MiB plain, %.2f MiB checkpointed (ratio %.3f); time %.3f s vs %.3f s (ratio %.3f)\n",
        stage, static_cast<long long>(d.layers), kBatch, static_cast<long long>(d.context),
        plain.torch_peak / 1048576.0, ckpt.torch_peak / 1048576.0,
        static_cast<double>(ckpt.torch_peak) / static_cast<double>(plain.torch_peak), plain.seconds,
        ckpt.seconds, ckpt.seconds / plain.seconds);
    EXPECT_GT(plain.torch_peak, 0);
    EXPECT_LT(ckpt.torch_peak, plain.torch_peak * 3 / 4) << "stage " << stage;
    EXPECT_TRUE(bitwise_equal(ckpt.params, plain.params)) << "stage " << stage;
  }
}

// sequential() cuts the layers into the config's number_checkpoints segments; a dropout layer
// recomputes with the forward's random state; the inputs' gradient flows out too.
TEST(TorchActivationCheckpointing, SequentialSegmentsDropoutAndInputGradients) {
  namespace nn = ::torch::nn;
  for (int segments : {1, 2, 3, 5}) {
    ::torch::manual_seed(4);
    std::vector<nn::Linear> lins;
    for (int l = 0; l < 5; ++l) lins.emplace_back(6, 6);
    nn::Dropout drop(0.3);
    std::vector<zero::torch::ActivationCheckpointing::Layer> layers;
    for (auto& lin : lins)
      layers.push_back(
          [lin, drop](const ::torch::Tensor& x) mutable { return drop(::torch::tanh(lin(x))); });
    const ::torch::Tensor x0 = ::torch::randn({4, 6});
    auto grads = [&](bool checkpointed) {
      for (auto& lin : lins) lin->zero_grad();
      ::torch::Tensor x = x0.clone().requires_grad_(true);
      ::torch::manual_seed(17);
      ::torch::Tensor y;
      zero::torch::ActivationCheckpointing ac(ac_config(0, segments), nullptr);
      EXPECT_EQ(ac.number_checkpoints(), segments);
      if (checkpointed) {
        y = ac.sequential(layers, x);
      } else {
        y = x;
        for (auto& f : layers) y = f(y);
      }
      ::torch::manual_seed(99);  // the recompute must not draw from the state at backward
      y.pow(2).sum().backward();
      std::vector<::torch::Tensor> g{x.grad().clone()};
      for (auto& lin : lins) g.push_back(lin->weight.grad().clone());
      g.push_back(y.detach());
      return g;
    };
    EXPECT_TRUE(bitwise_equal(grads(true), grads(false))) << segments << " segments";
  }
  zero::torch::ActivationCheckpointing ac(ac_config(0, 3), nullptr);
  std::vector<zero::torch::ActivationCheckpointing::Layer> two(
      2, [](const ::torch::Tensor& x) { return x * 2; });
  expect_error([&] { ac.sequential(two, ::torch::ones({2}, ::torch::requires_grad())); },
               ErrorCode::kInvalidArgument, "number_checkpoints");
}

TEST(TorchActivationCheckpointing, CpuCheckpointingChargesThePinnedTier) {
  MemoryTracker tracker;
  zero::torch::ActivationCheckpointing ac(ac_config(0, 0, /*cpu=*/true), &tracker);
  EXPECT_TRUE(ac.cpu_checkpointing());
  ::torch::Tensor w = ::torch::randn({8, 8}, ::torch::requires_grad());
  ::torch::Tensor x = ::torch::randn({3, 8});
  ::torch::Tensor y = ac.checkpoint([w](const ::torch::Tensor& in) { return in.matmul(w); }, x);
  EXPECT_EQ(tracker.current(MemCategory::kActivations, MemTier::kPinned), 3u * 8 * 4);
  EXPECT_EQ(tracker.current(MemCategory::kActivations, MemTier::kDevice), 0u);
  y.sum().backward();
  y = ::torch::Tensor();  // the graph goes with its last output
  EXPECT_EQ(tracker.current(MemCategory::kActivations), 0u);
  EXPECT_TRUE(::torch::allclose(w.grad(), x.t().matmul(::torch::ones({3, 8}))));
}

}  // namespace
}  // namespace zero::testing
