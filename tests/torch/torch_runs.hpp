// The runs the zero::torch tests compare: the example's char transformer trained with
// ::torch::optim::AdamW on one rank with the whole batch (the reference), and with
// zero::torch::Optimizer on N in-process ranks, each with its slice of the batch.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "common/bitwise.hpp"
#include "examples/libtorch/char_transformer.hpp"
#include "zero/comm/comm.hpp"
#include "zero/config/config.hpp"
#include "zero/torch/torch.hpp"

namespace zero::testing {

namespace ct = char_transformer;

// Odd sizes: embed 10 (not a multiple of the alignment), vocab 13, 2 heads, 2 layers.
inline ct::Dims test_dims() { return {13, 10, 2, 2, 6}; }
constexpr int kBatch = 12;  // sequences per micro-step over all ranks (divisible by 1..4)
constexpr double kLr = 3e-3, kWeightDecay = 0.01;

struct TorchRun {
  int stage = 0;
  int ranks = 1;
  std::string dtype = "f32";  // f32 | bf16
  int accumulation = 1;
  double clip = 0.0;
  bool clip_by_call = false;     // optimizer.clip_grad_norm_(clip) each step, not gradient_clipping
  std::string offload = "none";  // offload_optimizer.device
  bool marked = false;           // units_of(model, blocks) instead of units_by_child
  int steps = 20;
  // zero_optimization bucket keys (0: the defaults, DeepSpeed's: 5e8 / 5e7 / 1e9 elements, which
  // hold a small model's gradients and gathered parameters whole).
  long reduce_bucket = 0, prefetch_bucket = 0, max_live = 0;
  // stage3_param_persistence_threshold: 0 shards every unit (DeepSpeed's 1e5 would keep every
  // unit of these small models whole, and stage 3 would gather nothing).
  long persistence = 0;
};

inline Config torch_config(const TorchRun& r) {
  std::string j = R"({"zero_optimization": {"stage": )" + std::to_string(r.stage);
  if (r.reduce_bucket > 0) j += R"(, "reduce_bucket_size": )" + std::to_string(r.reduce_bucket);
  if (r.prefetch_bucket > 0)
    j += R"(, "stage3_prefetch_bucket_size": )" + std::to_string(r.prefetch_bucket);
  if (r.stage == 3)
    j += R"(, "stage3_param_persistence_threshold": )" + std::to_string(r.persistence);
  if (r.max_live > 0) j += R"(, "stage3_max_live_parameters": )" + std::to_string(r.max_live);
  if (r.offload != "none")
    j += R"(, "offload_optimizer": {"device": ")" + r.offload + R"(", "pin_memory": true})";
  j += R"(}, "gradient_accumulation_steps": )" + std::to_string(r.accumulation) +
       R"(, "gradient_clipping": )" + std::to_string(r.clip_by_call ? 0.0 : r.clip) +
       R"(, "optimizer": {"type": "AdamW", "params": {"lr": )" + std::to_string(kLr) +
       R"(, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": )" + std::to_string(kWeightDecay) +
       "}}";
  if (r.dtype == "bf16") j += R"(, "bf16": {"enabled": true})";
  j += "}";
  return parse_config(j);
}

// Tokens and targets of every micro-step: [kBatch, context] int64, made once from a seed.
struct TokenData {
  std::vector<::torch::Tensor> tokens, targets;
};

inline TokenData make_data(int micro_steps, const ct::Dims& d, int seed = 7) {
  ::torch::manual_seed(seed);
  TokenData data;
  for (int s = 0; s < micro_steps; ++s) {
    auto seq = ::torch::randint(d.vocab, {kBatch, d.context + 1}, ::torch::kLong);
    data.tokens.push_back(seq.slice(1, 0, d.context).contiguous());
    data.targets.push_back(seq.slice(1, 1, d.context + 1).contiguous());
  }
  return data;
}

// The model every run starts from (seed 1); other seeds for the ranks > 0, whose values the
// optimizer replaces with rank 0's.
inline ct::Model make_model(const ct::Dims& d, int seed = 1) {
  ::torch::manual_seed(seed);
  return ct::Model(d);
}

// f32 copies of the parameters, in named_parameters order.
inline std::vector<::torch::Tensor> snapshot(const ::torch::nn::Module& m) {
  std::vector<::torch::Tensor> out;
  for (const auto& p : m.named_parameters())
    out.push_back(p.value().detach().to(::torch::kFloat).clone());
  return out;
}

// ::torch::optim::AdamW on one rank, each step on the whole batch of every micro-step of the step.
inline std::vector<::torch::Tensor> train_reference(const TorchRun& r, const TokenData& data) {
  const ct::Dims d = test_dims();
  ct::Model model = make_model(d);
  ::torch::optim::AdamW opt(
      model->parameters(),
      ::torch::optim::AdamWOptions(kLr).betas({0.9, 0.999}).eps(1e-8).weight_decay(kWeightDecay));
  for (int s = 0; s < r.steps; ++s) {
    std::vector<::torch::Tensor> tok, tgt;
    for (int a = 0; a < r.accumulation; ++a) {
      tok.push_back(data.tokens[static_cast<std::size_t>(s * r.accumulation + a)]);
      tgt.push_back(data.targets[static_cast<std::size_t>(s * r.accumulation + a)]);
    }
    opt.zero_grad();
    auto loss = ct::loss(model, ::torch::cat(tok), ::torch::cat(tgt));
    loss.backward();
    if (r.clip > 0) ::torch::nn::utils::clip_grad_norm_(model->parameters(), r.clip);
    opt.step();
  }
  return snapshot(*model);
}

// bf16 mixed precision done by hand in LibTorch, the algorithm the engine runs: a bf16 model for
// forward and backward on the whole batch, an f32 master copy stepped by torch::optim::AdamW
// with the bf16 gradients widened to f32, the model re-made from the master after each step.
inline std::vector<::torch::Tensor> train_reference_bf16(const TorchRun& r, const TokenData& data) {
  const ct::Dims d = test_dims();
  ct::Model model = make_model(d);
  std::vector<::torch::Tensor> master;
  for (auto& p : model->parameters()) master.push_back(p.detach().clone().set_requires_grad(true));
  model->to(::torch::kBFloat16);
  {
    ::torch::NoGradGuard no_grad;
    const auto params = model->parameters();
    for (std::size_t i = 0; i < params.size(); ++i) params[i].copy_(master[i]);
  }
  ::torch::optim::AdamW opt(
      master,
      ::torch::optim::AdamWOptions(kLr).betas({0.9, 0.999}).eps(1e-8).weight_decay(kWeightDecay));
  for (int s = 0; s < r.steps; ++s) {
    model->zero_grad();
    auto loss = ct::loss(model, data.tokens[static_cast<std::size_t>(s)],
                         data.targets[static_cast<std::size_t>(s)]);
    loss.backward();
    const auto params = model->parameters();
    for (std::size_t i = 0; i < params.size(); ++i)
      master[i].mutable_grad() = params[i].grad().to(::torch::kFloat);
    opt.step();
    ::torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < params.size(); ++i) params[i].copy_(master[i]);
  }
  return snapshot(*model);
}

inline std::vector<std::shared_ptr<::torch::nn::Module>> blocks_of(ct::Model& m) {
  std::vector<std::shared_ptr<::torch::nn::Module>> out;
  for (auto& b : m->blocks) out.push_back(b.ptr());
  out.push_back(m->head.ptr());
  return out;
}

struct ZeroResult {
  std::vector<::torch::Tensor> params;  // rank 0's after detach(), f32
  std::vector<float> losses;            // rank 0's micro-step losses
};

// zero::torch::Optimizer on r.ranks in-process ranks; rank q trains on rows
// [q B/N, (q+1) B/N) of every micro-batch. `body` (optional) runs on each rank after the
// optimizer is made, before training (a test's extra checks).
inline ZeroResult train_zero(const TorchRun& r, const TokenData& data) {
  const ct::Dims d = test_dims();
  std::vector<ct::Model> models;
  for (int q = 0; q < r.ranks; ++q) models.push_back(make_model(d, 1 + q));
  const Config config = torch_config(r);
  ZeroResult result;
  std::mutex mu;
  ThreadGroup::run(r.ranks, [&](Communicator& comm) {
    const int q = comm.rank();
    ct::Model& model = models[static_cast<std::size_t>(q)];
    auto units = r.marked ? zero::torch::units_of(*model, blocks_of(model))
                          : zero::torch::units_by_child(*model);
    zero::torch::Optimizer opt(comm, std::move(units), config);
    const int rows = kBatch / r.ranks;
    std::vector<float> losses;
    for (int m = 0; m < r.steps * r.accumulation; ++m) {
      auto tok = data.tokens[static_cast<std::size_t>(m)].slice(0, q * rows, (q + 1) * rows);
      auto tgt = data.targets[static_cast<std::size_t>(m)].slice(0, q * rows, (q + 1) * rows);
      opt.zero_grad();
      auto loss = ct::loss(model, tok, tgt);
      loss.backward();
      if (r.clip_by_call) opt.clip_grad_norm_(r.clip);
      opt.step();
      losses.push_back(loss.item<float>());
    }
    opt.detach();
    if (q == 0) {
      std::lock_guard<std::mutex> lock(mu);
      result.params = snapshot(*model);
      result.losses = losses;
    }
  });
  return result;
}

// zero::torch on `ranks` in-process ranks for `steps` steps of one micro-step, rank q on rows
// [q B/N, (q+1) B/N) of each batch; make(comm, model) builds the rank's optimizer
// (std::unique_ptr<zero::torch::Optimizer>). Rank 0's parameters after detach(), f32.
template <typename Make>
std::vector<::torch::Tensor> train_zero_with(int ranks, int steps, const TokenData& data,
                                             Make&& make) {
  std::vector<ct::Model> models;
  for (int q = 0; q < ranks; ++q) models.push_back(make_model(test_dims(), 1 + q));
  std::vector<::torch::Tensor> out;
  std::mutex mu;
  ThreadGroup::run(ranks, [&](Communicator& comm) {
    const int q = comm.rank();
    ct::Model& model = models[static_cast<std::size_t>(q)];
    auto opt = make(comm, model);
    const int rows = kBatch / ranks;
    for (int s = 0; s < steps; ++s) {
      opt->zero_grad();
      ct::loss(model, data.tokens[static_cast<std::size_t>(s)].slice(0, q * rows, (q + 1) * rows),
               data.targets[static_cast<std::size_t>(s)].slice(0, q * rows, (q + 1) * rows))
          .backward();
      opt->step();
    }
    opt->detach();
    if (q == 0) {
      std::lock_guard<std::mutex> lock(mu);
      out = snapshot(*model);
    }
  });
  return out;
}

// max over tensors of max|a - b| / max|b|.
inline double max_rel_diff(const std::vector<::torch::Tensor>& a,
                           const std::vector<::torch::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const double scale = std::max(b[i].abs().max().item<double>(), 1e-30);
    worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>() / scale);
  }
  return worst;
}

// max over tensors of max|a - b|, and the mean |a - b| over all elements.
inline std::pair<double, double> abs_diff(const std::vector<::torch::Tensor>& a,
                                          const std::vector<::torch::Tensor>& b) {
  double worst = 0, sum = 0, n = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const auto d = (a[i] - b[i]).abs();
    worst = std::max(worst, d.max().item<double>());
    sum += d.sum().item<double>();
    n += static_cast<double>(d.numel());
  }
  return {worst, n > 0 ? sum / n : 0.0};
}

// The same tensors, value for value (torch::equal) and byte for byte (tests/common/bitwise.hpp:
// the sign of zero counts too).
inline bool bitwise_equal(const std::vector<::torch::Tensor>& a,
                          const std::vector<::torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].scalar_type() != b[i].scalar_type() || !::torch::equal(a[i], b[i])) return false;
    const ::torch::Tensor x = a[i].contiguous().cpu(), y = b[i].contiguous().cpu();
    if (!same_bits(static_cast<const unsigned char*>(x.data_ptr()),
                   static_cast<const unsigned char*>(y.data_ptr()), x.nbytes())) {
      return false;
    }
  }
  return true;
}

}  // namespace zero::testing
