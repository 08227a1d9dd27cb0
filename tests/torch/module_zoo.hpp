// The torch::nn modules a transformer, CNN or RNN trainer uses, each in a small model with the
// three ways a trainer hands its parameters to zero::torch (one unit per tensor from
// parameters(), one per child module, marked submodules), and the runs that train them on
// N in-process ranks (each rank its slice of every batch) at a stage.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "zero/comm/comm.hpp"
#include "zero/config/config.hpp"
#include "zero/torch/torch.hpp"

namespace zero::testing {

namespace nn = ::torch::nn;
using ::torch::Tensor;

// A model: its module tree, the submodules a trainer would mark (fully_shard style), and its
// loss on rows [lo, hi) of a batch.
struct ZooModel {
  std::shared_ptr<nn::Module> root;
  std::vector<std::shared_ptr<nn::Module>> marks;
  std::function<Tensor(const Tensor& x, const Tensor& tokens, std::int64_t lo, std::int64_t hi)>
      loss;
};

struct ZooCase {
  std::string name;
  std::function<ZooModel()> make;  // seeded by the caller
};

// Every batch has kZooBatch rows (divisible by 1..3): a float input [rows, 12] and tokens
// [rows, 5] in [0, 13).
constexpr std::int64_t kZooBatch = 6;

struct ZooBatch {
  Tensor x, tokens, target;
};

inline std::vector<ZooBatch> zoo_batches(int n, int seed = 11) {
  ::torch::manual_seed(seed);
  std::vector<ZooBatch> out;
  for (int i = 0; i < n; ++i)
    out.push_back({::torch::randn({kZooBatch, 12}), ::torch::randint(13, {kZooBatch, 5}),
                   ::torch::randn({kZooBatch, 3})});
  return out;
}

// A module with named children and a forward given as a function of them.
struct ZooNet : nn::Module {
  template <typename M>
  M add(const std::string& name, M m) {
    return register_module(name, m);
  }
};

// Mean squared distance of the model's [rows, 3] output to a fixed target made from the rows.
inline Tensor zoo_mse(const Tensor& out, const Tensor& x) {
  const Tensor target = x.slice(1, 0, 3).tanh();
  return (out - target).pow(2).mean();
}

inline std::vector<ZooCase> zoo_cases() {
  std::vector<ZooCase> cases;
  auto slice = [](const Tensor& t, std::int64_t lo, std::int64_t hi) { return t.slice(0, lo, hi); };

  cases.push_back({"Sequential_Linear", [=] {
                     auto seq = nn::Sequential(nn::Linear(12, 9), nn::ReLU(), nn::Linear(9, 7),
                                               nn::Tanh(), nn::Linear(7, 3));
                     ZooModel m{seq.ptr(), {}, {}};
                     for (auto& c : seq->children()) m.marks.push_back(c);
                     m.loss = [seq](const Tensor& x, const Tensor&, auto lo, auto hi) mutable {
                       const Tensor xs = x.slice(0, lo, hi);
                       return zoo_mse(seq->forward(xs), xs);
                     };
                     return m;
                   }});
  cases.push_back({"Conv1d", [=] {
                     auto net = std::make_shared<ZooNet>();
                     auto c1 = net->add("c1", nn::Conv1d(nn::Conv1dOptions(3, 4, 3)));
                     auto c2 = net->add("c2", nn::Conv1d(nn::Conv1dOptions(4, 2, 2).stride(2)));
                     auto head = net->add("head", nn::Linear(2, 3));
                     ZooModel m{net, {c1.ptr(), c2.ptr(), head.ptr()}, {}};
                     m.loss = [=](const Tensor& x, const Tensor&, auto lo, auto hi) mutable {
                       const Tensor xs = slice(x, lo, hi);
                       Tensor h = c2(::torch::relu(c1(xs.view({-1, 3, 4}))));  // [r, 2, 1]
                       return zoo_mse(head(h.flatten(1)), xs);
                     };
                     return m;
                   }});
  cases.push_back({"Conv2d_BatchNorm2d", [=] {
                     auto net = std::make_shared<ZooNet>();
                     auto c1 = net->add("c1", nn::Conv2d(nn::Conv2dOptions(3, 4, 2)));
                     auto bn = net->add("bn", nn::BatchNorm2d(4));
                     auto c2 = net->add("c2", nn::Conv2d(nn::Conv2dOptions(4, 3, 1).bias(false)));
                     ZooModel m{net, {c1.ptr(), bn.ptr(), c2.ptr()}, {}};
                     m.loss = [=](const Tensor& x, const Tensor&, auto lo, auto hi) mutable {
                       const Tensor xs = slice(x, lo, hi);
                       Tensor h = c2(::torch::relu(bn(c1(xs.view({-1, 3, 2, 2})))));  // [r,3,1,1]
                       return zoo_mse(h.flatten(1), xs);
                     };
                     return m;
                   }});
  cases.push_back({"Embedding", [=] {
                     auto net = std::make_shared<ZooNet>();
                     auto emb = net->add("emb", nn::Embedding(13, 6));
                     auto head = net->add("head", nn::Linear(6, 3));
                     ZooModel m{net, {emb.ptr(), head.ptr()}, {}};
                     m.loss = [=](const Tensor& x, const Tensor& t, auto lo, auto hi) mutable {
                       return zoo_mse(head(emb(slice(t, lo, hi)).mean(1)), slice(x, lo, hi));
                     };
                     return m;
                   }});
  cases.push_back(
      {"EmbeddingBag", [=] {
         auto net = std::make_shared<ZooNet>();
         auto bag =
             net->add("bag", nn::EmbeddingBag(nn::EmbeddingBagOptions(13, 6).mode(::torch::kMean)));
         auto head = net->add("head", nn::Linear(6, 3));
         ZooModel m{net, {bag.ptr(), head.ptr()}, {}};
         m.loss = [=](const Tensor& x, const Tensor& t, auto lo, auto hi) mutable {
           return zoo_mse(head(bag(slice(t, lo, hi))), slice(x, lo, hi));
         };
         return m;
       }});
  cases.push_back({"LayerNorm_GroupNorm", [=] {
                     auto net = std::make_shared<ZooNet>();
                     auto fc = net->add("fc", nn::Linear(12, 8));
                     auto ln = net->add("ln", nn::LayerNorm(nn::LayerNormOptions({8})));
                     auto gn = net->add("gn", nn::GroupNorm(2, 8));
                     auto head = net->add("head", nn::Linear(8, 3));
                     ZooModel m{net, {fc.ptr(), ln.ptr(), gn.ptr(), head.ptr()}, {}};
                     m.loss = [=](const Tensor& x, const Tensor&, auto lo, auto hi) mutable {
                       const Tensor xs = slice(x, lo, hi);
                       Tensor h = gn(ln(fc(xs)).unsqueeze(2)).squeeze(2);
                       return zoo_mse(head(h), xs);
                     };
                     return m;
                   }});
  cases.push_back({"Bilinear", [=] {
                     auto net = std::make_shared<ZooNet>();
                     auto bl = net->add("bl", nn::Bilinear(5, 7, 4));
                     auto head = net->add("head", nn::Linear(4, 3));
                     ZooModel m{net, {bl.ptr(), head.ptr()}, {}};
                     m.loss = [=](const Tensor& x, const Tensor&, auto lo, auto hi) mutable {
                       const Tensor xs = slice(x, lo, hi);
                       return zoo_mse(head(bl(xs.slice(1, 0, 5), xs.slice(1, 5, 12))), xs);
                     };
                     return m;
                   }});
  cases.push_back({"MultiheadAttention", [=] {
                     auto net = std::make_shared<ZooNet>();
                     auto in = net->add("in", nn::Linear(3, 8));
                     auto attn = net->add("attn", nn::MultiheadAttention(8, 2));
                     auto head = net->add("head", nn::Linear(8, 3));
                     ZooModel m{net, {in.ptr(), attn.ptr(), head.ptr()}, {}};
                     m.loss = [=](const Tensor& x, const Tensor&, auto lo, auto hi) mutable {
                       const Tensor xs = slice(x, lo, hi);
                       Tensor s = in(xs.view({-1, 4, 3})).transpose(0, 1);  // [L=4, r, 8]
                       Tensor a = std::get<0>(attn(s, s, s));
                       return zoo_mse(head(a.mean(0)), xs);
                     };
                     return m;
                   }});
  cases.push_back(
      {"TransformerEncoder", [=] {
         auto net = std::make_shared<ZooNet>();
         auto in = net->add("in", nn::Linear(3, 8));
         auto enc = net->add(
             "enc",
             nn::TransformerEncoder(
                 nn::TransformerEncoderLayer(
                     nn::TransformerEncoderLayerOptions(8, 2).dim_feedforward(16).dropout(0.0)),
                 2));
         auto head = net->add("head", nn::Linear(8, 3));
         ZooModel m{net, {in.ptr(), head.ptr()}, {}};
         for (auto& layer : enc->layers->children()) m.marks.push_back(layer);
         m.loss = [=](const Tensor& x, const Tensor&, auto lo, auto hi) mutable {
           const Tensor xs = slice(x, lo, hi);
           Tensor s = in(xs.view({-1, 4, 3})).transpose(0, 1);
           return zoo_mse(head(enc(s).mean(0)), xs);
         };
         return m;
       }});
  cases.push_back(
      {"TransformerDecoderLayer", [=] {
         auto net = std::make_shared<ZooNet>();
         auto in = net->add("in", nn::Linear(3, 8));
         auto mem = net->add("mem", nn::Embedding(13, 8));
         auto dec = net->add(
             "dec", nn::TransformerDecoderLayer(
                        nn::TransformerDecoderLayerOptions(8, 2).dim_feedforward(16).dropout(0.0)));
         auto head = net->add("head", nn::Linear(8, 3));
         ZooModel m{net, {in.ptr(), mem.ptr(), dec.ptr(), head.ptr()}, {}};
         m.loss = [=](const Tensor& x, const Tensor& t, auto lo, auto hi) mutable {
           const Tensor xs = slice(x, lo, hi);
           Tensor tgt = in(xs.view({-1, 4, 3})).transpose(0, 1);
           Tensor memory = mem(slice(t, lo, hi)).transpose(0, 1);  // [5, r, 8]
           return zoo_mse(head(dec(tgt, memory).mean(0)), xs);
         };
         return m;
       }});
  cases.push_back({"LSTM", [=] {
                     auto net = std::make_shared<ZooNet>();
                     auto rnn = net->add("rnn", nn::LSTM(nn::LSTMOptions(3, 6).num_layers(2)));
                     auto head = net->add("head", nn::Linear(6, 3));
                     ZooModel m{net, {rnn.ptr(), head.ptr()}, {}};
                     m.loss = [=](const Tensor& x, const Tensor&, auto lo, auto hi) mutable {
                       const Tensor xs = slice(x, lo, hi);
                       Tensor out = std::get<0>(rnn(xs.view({-1, 4, 3}).transpose(0, 1)));
                       return zoo_mse(head(out[-1]), xs);
                     };
                     return m;
                   }});
  cases.push_back({"GRU", [=] {
                     auto net = std::make_shared<ZooNet>();
                     auto rnn = net->add("rnn", nn::GRU(nn::GRUOptions(3, 5)));
                     auto head = net->add("head", nn::Linear(5, 3));
                     ZooModel m{net, {rnn.ptr(), head.ptr()}, {}};
                     m.loss = [=](const Tensor& x, const Tensor&, auto lo, auto hi) mutable {
                       const Tensor xs = slice(x, lo, hi);
                       Tensor out = std::get<0>(rnn(xs.view({-1, 4, 3}).transpose(0, 1)));
                       return zoo_mse(head(out.mean(0)), xs);
                     };
                     return m;
                   }});
  cases.push_back({"FrozenLayer", [=] {
                     auto net = std::make_shared<ZooNet>();
                     auto base = net->add("base", nn::Linear(12, 8));
                     auto head = net->add("head", nn::Linear(8, 3));
                     for (auto& p : base->parameters()) p.set_requires_grad(false);
                     ZooModel m{net, {base.ptr(), head.ptr()}, {}};
                     m.loss = [=](const Tensor& x, const Tensor&, auto lo, auto hi) mutable {
                       const Tensor xs = slice(x, lo, hi);
                       return zoo_mse(head(::torch::gelu(base(xs))), xs);
                     };
                     return m;
                   }});
  // Tied embeddings with a bias of the head's own: the output projection reads the embedding's
  // weight and the head's bias in one operator (aten::linear -> aten::addmm -> aten::expand).
  cases.push_back({"TiedEmbeddingSeparateBias", [=] {
                     auto net = std::make_shared<ZooNet>();
                     auto emb = net->add("emb", nn::Embedding(13, 6));
                     auto mix = net->add("mix", nn::Linear(6, 6));
                     auto head = net->add("head", std::make_shared<ZooNet>());
                     Tensor bias = head->register_parameter("bias", ::torch::zeros({13}));
                     ZooModel m{net, {emb.ptr(), mix.ptr(), head}, {}};
                     m.loss = [=](const Tensor&, const Tensor& t, auto lo, auto hi) mutable {
                       const Tensor ts = slice(t, lo, hi);
                       Tensor logits = ::torch::linear(::torch::tanh(mix(emb(ts))), emb->weight,
                                                       bias);  // [r, 5, 13]
                       return ::torch::nn::functional::cross_entropy(logits.reshape({-1, 13}),
                                                                     ts.roll(1, 1).reshape({-1}));
                     };
                     return m;
                   }});
  return cases;
}

enum class UnitsFrom { kParameters, kChildren, kMarked };

inline const char* to_string(UnitsFrom u) {
  switch (u) {
    case UnitsFrom::kParameters: return "parameters";
    case UnitsFrom::kChildren: return "children";
    case UnitsFrom::kMarked: return "marked";
  }
  return "?";
}

struct ZooResult {
  std::vector<Tensor> params;     // rank 0's, after detach(), in named_parameters order
  std::vector<float> losses;      // rank 0's
  std::size_t bytes_at_rest = 0;  // max over ranks of LibTorch's parameter bytes after step()
};

inline Config zoo_config(int stage) {
  std::string j = R"({"zero_optimization": {"stage": )" + std::to_string(stage);
  if (stage == 3) j += R"(, "stage3_param_persistence_threshold": 0)";
  j += R"(}, "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}}})";
  return parse_config(j);
}

inline std::vector<zero::torch::TensorUnit> zoo_units(ZooModel& m, UnitsFrom from) {
  switch (from) {
    case UnitsFrom::kParameters: return zero::torch::units_of(m.root->parameters());
    case UnitsFrom::kChildren: return zero::torch::units_by_child(*m.root);
    case UnitsFrom::kMarked: return zero::torch::units_of(*m.root, m.marks);
  }
  return {};
}

// Trains `c` for `steps` steps on `ranks` in-process ranks at `stage`.
inline ZooResult train_zoo(const ZooCase& c, UnitsFrom from, int ranks, int stage, int steps) {
  const auto batches = zoo_batches(steps);
  std::vector<ZooModel> models;
  for (int q = 0; q < ranks; ++q) {
    ::torch::manual_seed(100 + q);  // rank 0's values are broadcast; the others differ
    models.push_back(c.make());
  }
  const Config config = zoo_config(stage);
  ZooResult result;
  std::mutex mu;
  ThreadGroup::run(ranks, [&](Communicator& comm) {
    const int q = comm.rank();
    ZooModel& m = models[static_cast<std::size_t>(q)];
    zero::torch::Optimizer opt(comm, zoo_units(m, from), config);
    const std::int64_t rows = kZooBatch / ranks;
    std::vector<float> losses;
    std::size_t rest = 0;
    for (int s = 0; s < steps; ++s) {
      const ZooBatch& b = batches[static_cast<std::size_t>(s)];
      opt.zero_grad();
      Tensor loss = m.loss(b.x, b.tokens, q * rows, (q + 1) * rows);
      loss.backward();
      opt.step();
      losses.push_back(loss.item<float>());
      rest = std::max(rest, zero::torch::tensor_bytes(opt.parameters()).params);
    }
    opt.detach();
    std::lock_guard<std::mutex> lock(mu);
    result.bytes_at_rest = std::max(result.bytes_at_rest, rest);
    if (q == 0) {
      for (const auto& p : m.root->named_parameters())
        result.params.push_back(p.value().detach().clone());
      result.losses = losses;
    }
  });
  return result;
}

}  // namespace zero::testing
