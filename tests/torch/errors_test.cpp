// zero::torch's errors and edges: what a trainer written for torch::optim does that the engine
// cannot take is an error naming it; the model stays usable after the optimizer goes.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "common/expect_error.hpp"
#include "torch_runs.hpp"

namespace zero::testing {
namespace {

// One rank, one model: runs fn(optimizer, model) on an in-process rank.
template <typename F>
void with_optimizer(int stage, F&& fn) {
  ct::Model model = make_model(test_dims());
  TorchRun r;
  r.stage = stage;
  const Config config = torch_config(r);
  ThreadGroup::run(1, [&](Communicator& comm) {
    zero::torch::Optimizer opt(comm, *model, config);
    fn(opt, model);
  });
}

const TokenData& data() {
  static const TokenData d = make_data(4, test_dims());
  return d;
}

::torch::Tensor loss_of(ct::Model& m, int k = 0) {
  return ct::loss(m, data().tokens[static_cast<std::size_t>(k)],
                  data().targets[static_cast<std::size_t>(k)]);
}

TEST(TorchErrors, SecondBackwardBeforeStepNamesTheParameter) {
  for (int stage : {0, 2, 3}) {
    with_optimizer(stage, [](zero::torch::Optimizer& opt, ct::Model& m) {
      loss_of(m).backward();
      expect_error([&] { loss_of(m, 1).backward(); }, ErrorCode::kInvalidArgument,
                   "got a second gradient in one micro-step");
    });
  }
}

TEST(TorchErrors, ZeroGradBetweenBackwardAndStep) {
  with_optimizer(2, [](zero::torch::Optimizer& opt, ct::Model& m) {
    loss_of(m).backward();
    expect_error([&] { opt.zero_grad(); }, ErrorCode::kInvalidArgument, "call step() first");
    opt.step();
    opt.zero_grad();  // fine after the step
  });
}

// torch::nn::utils::clip_grad_norm_ after backward finds no whole gradient (the engine holds it):
// it must not silently return 0; step() raises an error naming the parameter and the way out.
TEST(TorchErrors, TorchClipGradNormAfterTheSwapIsAnErrorNotASilentZero) {
  for (int stage : {0, 1, 2, 3}) {
    with_optimizer(stage, [&](zero::torch::Optimizer& opt, ct::Model& m) {
      loss_of(m).backward();
      for (const auto& p : m->parameters()) EXPECT_TRUE(p.grad().defined());
      EXPECT_EQ(zero::torch::tensor_bytes(m->parameters()).grads, 0u);
      ::torch::nn::utils::clip_grad_norm_(m->parameters(), 1.0);
      expect_error([&] { opt.step(); }, ErrorCode::kInvalidArgument,
                   "optimizer.clip_grad_norm_(max_norm)");
    });
  }
  with_optimizer(2, [&](zero::torch::Optimizer& opt, ct::Model& m) {
    loss_of(m).backward();
    ::torch::Tensor n = m->named_parameters()["head.bias"].grad().norm();
    (void)n;
    expect_error([&] { opt.step(); }, ErrorCode::kInvalidArgument, "'head.bias'");
  });
  // Not reading .grad: the step goes on, and .grad is undefined after it.
  with_optimizer(3, [&](zero::torch::Optimizer& opt, ct::Model& m) {
    loss_of(m).backward();
    opt.clip_grad_norm_(0.5);
    const StepResult r = opt.step();
    EXPECT_GT(r.grad_norm, 0.0);
    for (const auto& p : m->parameters()) EXPECT_FALSE(p.grad().defined());
    expect_error([&] { opt.clip_grad_norm_(0.0); }, ErrorCode::kInvalidArgument, "max_norm");
    expect_error([&] { opt.clip_grad_norm_(1.0, 1.0); }, ErrorCode::kInvalidArgument, "L2");
  });
}

TEST(TorchErrors, TwoOptimizersOnOneModelAreNamedAsSuch) {
  with_optimizer(2, [&](zero::torch::Optimizer& opt, ct::Model& m) {
    ThreadGroup::run(1, [&](Communicator& comm) {
      TorchRun r;
      expect_error([&] { zero::torch::Optimizer second(comm, *m, torch_config(r)); },
                   ErrorCode::kInvalidArgument,
                   "already trained by another zero::torch::Optimizer");
    });
  });
  // After the first is gone, a second is fine.
  ct::Model model = make_model(test_dims());
  ThreadGroup::run(1, [&](Communicator& comm) {
    TorchRun r;
    { zero::torch::Optimizer first(comm, *model, torch_config(r)); }
    zero::torch::Optimizer second(comm, *model, torch_config(r));
    loss_of(model).backward();
    second.step();
  });
}

TEST(TorchErrors, MarkedModuleOutsideTheModel) {
  ct::Model model = make_model(test_dims());
  auto stranger = ::torch::nn::Linear(3, 3);
  expect_error([&] { zero::torch::units_of(*model, {stranger.ptr()}); },
               ErrorCode::kInvalidArgument, "is not a submodule of the model");
}

// The trainer's options and the config: a key given both ways differently, another rule in a
// group, an unsupported option, a parameter in no group — each named.
TEST(TorchErrors, ParameterGroupsAndTheTrainersOptions) {
  namespace optim = ::torch::optim;
  ct::Model model = make_model(test_dims());
  ThreadGroup::run(1, [&](Communicator& comm) {
    const Config wd0 = parse_config(R"({"optimizer": {"params": {"weight_decay": 0.0}}})");
    expect_error([&] { zero::torch::Optimizer opt(comm, *model, optim::AdamWOptions(1e-3), wd0); },
                 ErrorCode::kConfig,
                 "'optimizer.params.weight_decay' = 0 but the trainer's "
                 "AdamWOptions::weight_decay = 0.01");
    const Config sgd = parse_config(R"({"optimizer": {"type": "SGD"}})");
    expect_error([&] { zero::torch::Optimizer opt(comm, *model, optim::AdamWOptions(1e-3), sgd); },
                 ErrorCode::kConfig, "'optimizer.type' = \"SGD\" but the trainer passes");
    const Config none = parse_config("{}");
    expect_error(
        [&] {
          zero::torch::Optimizer opt(comm, *model, optim::AdamWOptions(1e-3).amsgrad(true), none);
        },
        ErrorCode::kConfig, "amsgrad");
    std::vector<optim::OptimizerParamGroup> mixed;
    mixed.emplace_back(model->wte->parameters(), std::make_unique<optim::SGDOptions>(0.1));
    mixed.emplace_back(model->head->parameters());
    expect_error(
        [&] { zero::torch::Optimizer opt(comm, *model, mixed, optim::AdamWOptions(1e-3), none); },
        ErrorCode::kConfig,
        "parameter group 0's options are SGDOptions but the optimizer is AdamW");
    std::vector<optim::OptimizerParamGroup> partial;
    partial.emplace_back(model->wte->parameters());
    expect_error(
        [&] { zero::torch::Optimizer opt(comm, *model, partial, optim::AdamWOptions(1e-3), none); },
        ErrorCode::kInvalidArgument,
        "parameter 'wpe.weight' requires grad but is in no parameter group");
  });
}

TEST(TorchErrors, NonCpuDeviceIsRefused) {
  ct::Model model = make_model(test_dims());
  const Config config = torch_config(TorchRun{});
  ThreadGroup::run(1, [&](Communicator& comm) {
    EngineOptions o;
    o.device = Device::cuda(0);
    expect_error([&] { zero::torch::Optimizer opt(comm, *model, config, o); },
                 ErrorCode::kInvalidArgument, "trains CPU tensors");
  });
}

// Stage 3: a gather that fails inside an operator (LibTorch swallows exceptions thrown by
// RecordFunction callbacks) must not crash the kernel nor go unnoticed: rank 1 leaves before the
// forward, rank 0's first gather fails, the kernel reads zeros and the error is raised at the
// next gradient hook (backward) or step().
TEST(TorchErrors, Stage3GatherFailureInsideAnOperatorSurfaces) {
  std::vector<ct::Model> models{make_model(test_dims()), make_model(test_dims(), 2)};
  TorchRun r;
  r.stage = 3;
  r.ranks = 2;
  const Config config = torch_config(r);
  bool rank0_saw_error = false;
  std::string what;
  ErrorCode code = ErrorCode::kInternal;
  try {
    ThreadGroup::run(
        2,
        [&](Communicator& comm) {
          ct::Model& m = models[static_cast<std::size_t>(comm.rank())];
          zero::torch::Optimizer opt(comm, *m, config);
          if (comm.rank() == 1) throw std::runtime_error("rank 1 leaves");
          try {
            loss_of(m).backward();
            opt.step();
          } catch (const Error& e) {
            rank0_saw_error = true;
            what = e.what();
            code = e.code();
          }
        },
        /*timeout_s=*/20);
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 leaves"), std::string::npos);
  }
  EXPECT_TRUE(rank0_saw_error);
  EXPECT_EQ(code, ErrorCode::kRemoteFailure) << what;  // the collective, named; not a crash
  EXPECT_NE(what.find("all_gather"), std::string::npos) << what;
  std::printf("rank 0: %s\n", what.c_str());
}

// The model outlives its optimizer: stages 0-2 keep the trained values in storage of their own;
// stage 3 after detach() too.
TEST(TorchEdges, ModelUsableAfterTheOptimizer) {
  for (int stage : {0, 2, 3}) {
    ct::Model model = make_model(test_dims());
    TorchRun r;
    r.stage = stage;
    const Config config = torch_config(r);
    ::torch::Tensor before;
    ThreadGroup::run(1, [&](Communicator& comm) {
      zero::torch::Optimizer opt(comm, *model, config);
      loss_of(model).backward();
      opt.step();
      ::torch::NoGradGuard no_grad;
      before = loss_of(model, 2).detach().clone();
      if (stage == 3) opt.detach();
    });
    ::torch::NoGradGuard no_grad;
    EXPECT_TRUE(::torch::equal(loss_of(model, 2), before)) << "stage " << stage;
  }
}

// A unit backward never reaches (a child the forward does not use) is handed to the engine at
// step() with a zero gradient; the stages still agree bitwise.
struct WithSpare : ::torch::nn::Module {
  WithSpare() {
    used = register_module("used", ::torch::nn::Linear(5, 3));
    spare = register_module("spare", ::torch::nn::Linear(4, 2));
  }
  ::torch::nn::Linear used{nullptr}, spare{nullptr};
};

TEST(TorchEdges, UnusedUnitIsSteppedWithAZeroGradient) {
  std::vector<std::vector<::torch::Tensor>> finals;
  for (int stage : {0, 2, 3}) {
    ::torch::manual_seed(3);
    auto model = std::make_shared<WithSpare>();
    TorchRun r;
    r.stage = stage;
    r.ranks = 2;
    const Config config = torch_config(r);
    std::vector<::torch::Tensor> out;
    std::vector<std::shared_ptr<WithSpare>> models{model, std::make_shared<WithSpare>()};
    ThreadGroup::run(2, [&](Communicator& comm) {
      auto& m = models[static_cast<std::size_t>(comm.rank())];
      zero::torch::Optimizer opt(comm, *m, config);
      for (int s = 0; s < 3; ++s) {
        opt.zero_grad();
        auto x = ::torch::ones({2, 5}) * (comm.rank() + 1);
        m->used->forward(x).pow(2).mean().backward();
        opt.step();
      }
      opt.detach();
      if (comm.rank() == 0) out = snapshot(*m);
    });
    finals.push_back(out);
  }
  EXPECT_TRUE(bitwise_equal(finals[0], finals[1]));
  EXPECT_TRUE(bitwise_equal(finals[0], finals[2]));
}

}  // namespace
}  // namespace zero::testing
