// A small character-level decoder-only transformer (GPT-style: token + position embeddings,
// pre-LayerNorm blocks of causal self-attention and a GELU MLP, a final LayerNorm and a linear
// head), written the usual LibTorch way (TORCH_MODULE holders). The example trainer, the
// zero::torch tests and bench_torch train it. Nothing in it knows about zero.
//
// qkv has no bias (nanoGPT's bias = False): the key part of such a bias only adds a constant to
// each row of the attention scores, which softmax ignores, so its gradient is zero up to
// rounding — and Adam turns rounding noise into steps of ±lr, which makes two correct
// implementations disagree by lr per step on those weights.
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>

namespace char_transformer {

struct Dims {
  std::int64_t vocab = 65;
  std::int64_t embed = 64;
  std::int64_t heads = 4;
  std::int64_t layers = 2;
  std::int64_t context = 32;
};

// Causal multi-head self-attention of the qkv projection's output [B, T, 3C] -> [B, T, C]
// (before the output projection). Shared with the LoRA block of finetune_lora.cpp.
inline torch::Tensor causal_attention(const torch::Tensor& qkv_out, std::int64_t heads) {
  const auto B = qkv_out.size(0), T = qkv_out.size(1), C = qkv_out.size(2) / 3;
  auto parts = qkv_out.chunk(3, /*dim=*/2);
  auto split = [&](const torch::Tensor& t) {
    return t.view({B, T, heads, C / heads}).transpose(1, 2);  // [B, H, T, C/H]
  };
  auto q = split(parts[0]), k = split(parts[1]), v = split(parts[2]);
  auto att = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(C / heads));
  auto mask = torch::ones({T, T}, torch::kBool).triu(1);
  att = torch::softmax(att.masked_fill(mask, -INFINITY), -1);
  return torch::matmul(att, v).transpose(1, 2).contiguous().view({B, T, C});
}

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(const Dims& d)
      : heads(d.heads),
        ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d.embed})))),
        qkv(register_module(
            "qkv", torch::nn::Linear(torch::nn::LinearOptions(d.embed, 3 * d.embed).bias(false)))),
        proj(register_module("proj", torch::nn::Linear(d.embed, d.embed))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d.embed})))),
        fc(register_module("fc", torch::nn::Linear(d.embed, 4 * d.embed))),
        out(register_module("out", torch::nn::Linear(4 * d.embed, d.embed))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    auto h = x + proj->forward(causal_attention(qkv->forward(ln1->forward(x)), heads));
    return h + out->forward(torch::gelu(fc->forward(ln2->forward(h))));
  }

  std::int64_t heads;
  torch::nn::LayerNorm ln1;
  torch::nn::Linear qkv, proj;
  torch::nn::LayerNorm ln2;
  torch::nn::Linear fc, out;
};
TORCH_MODULE(Block);

struct ModelImpl : torch::nn::Module {
  explicit ModelImpl(const Dims& d)
      : wte(register_module("wte", torch::nn::Embedding(d.vocab, d.embed))),
        wpe(register_module("wpe", torch::nn::Embedding(d.context, d.embed))),
        ln_f(register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d.embed})))),
        head(register_module("head", torch::nn::Linear(d.embed, d.vocab))) {
    for (std::int64_t l = 0; l < d.layers; ++l)
      blocks.push_back(register_module("block" + std::to_string(l), Block(d)));
  }

  // How a block runs: given the block's forward and its input, return its output. Empty: the
  // block is called plainly; a trainer passes an activation-checkpointing wrapper here.
  using BlockRunner = std::function<torch::Tensor(
      const std::function<torch::Tensor(const torch::Tensor&)>& block, const torch::Tensor& x)>;

  // tokens [B, T] (int64) -> logits [B, T, vocab], float32 whatever the parameters' dtype.
  torch::Tensor forward(const torch::Tensor& tokens, const BlockRunner& run = nullptr) {
    const auto T = tokens.size(1);
    auto pos = torch::arange(T, torch::kLong);
    auto x = wte->forward(tokens) + wpe->forward(pos);
    for (auto& b : blocks) {
      if (!run) {
        x = b->forward(x);
        continue;
      }
      Block block = b;  // a holder (shared pointer): the wrapper may call it after this returns
      x = run([block](const torch::Tensor& in) mutable { return block->forward(in); }, x);
    }
    return head->forward(ln_f->forward(x)).to(torch::kFloat);
  }

  torch::nn::Embedding wte, wpe;
  std::vector<Block> blocks;
  torch::nn::LayerNorm ln_f;
  torch::nn::Linear head;
};
TORCH_MODULE(Model);

// Mean cross-entropy of next-token prediction over the batch.
inline torch::Tensor loss(Model& model, const torch::Tensor& tokens, const torch::Tensor& targets,
                          const ModelImpl::BlockRunner& run = nullptr) {
  auto logits = model->forward(tokens, run);
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                              targets.reshape({-1}));
}

}  // namespace char_transformer
