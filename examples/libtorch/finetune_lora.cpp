// Fine-tuning with zero::torch: a char transformer (char_transformer.hpp) "pretrained" by one
// run, exported to safetensors through a zero checkpoint (ckpt::Saver, ckpt::consolidate), and
// imported (ckpt::import_safetensors with a name map) into the same model with low-rank adapters
// (LoRA, Hu et al. 2021, arXiv:2106.09685) on every attention and MLP Linear: the base frozen
// (requires_grad(false): no gradient, master or optimizer state in the engine), the adapters and
// the LayerNorms trained with nanoGPT's two AdamW groups (decay on >= 2-D parameters, none on the
// rest) on another slice of the text.
//
//   char-transformer-lora [--ranks N] [--zero-stage S] [--pretrain-steps K] [--steps K]
//                         [--lora-rank R] [--lora-alpha A] [--layers L] [--embed D]
//                         [--data FILE] [--work-dir DIR] [--pretrained FILE.safetensors]
//                         [--config ds.json] [--set key=value ...]
//   mpirun -np N char-transformer-lora ...   (one rank per process)
//
// Phases: (1) pretrain on the first 70% of the text and write DIR/pretrained.safetensors
// (skipped with --pretrained); (2) two steps of the same LoRA model all-trainable, for its memory
// (from the second step stage 3 prefetches along the recorded order: the pools have their size);
// (3) fine-tune on the next 20% and evaluate on the last 10% before and after. It prints the
// losses, checks that every frozen parameter is bitwise the imported weights after training and
// (when it pretrained) that the imported weights are bitwise the pretrained ones, and prints the
// engine tracker's bytes per rank of the LoRA run against the all-trainable run. Exit status 1
// when a check fails, 2 on bad input.
#include <torch/torch.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "char_transformer.hpp"
#include "zero/ckpt/ckpt.hpp"
#include "zero/comm/comm.hpp"
#include "zero/config/comm_config.hpp"
#include "zero/config/config.hpp"
#include "zero/core/error.hpp"
#include "zero/device/memory.hpp"
#include "zero/torch/torch.hpp"

namespace {

namespace ct = char_transformer;

constexpr int kBatch = 16;  // global batch: each rank trains on kBatch / N rows

// ---- the LoRA model

// y = x W^T + b + (alpha / r) (x A^T) B^T. W, b: the pretrained Linear's, named as
// torch::nn::Linear names them (so the base keeps its pretrained names), frozen when asked;
// A [r, in] uniform in +-1/sqrt(in) (torch's Linear init), B [out, r] zero: the adapted model
// starts as the base (the LoRA paper's initialisation).
struct LoraLinearImpl : torch::nn::Module {
  LoraLinearImpl(std::int64_t in, std::int64_t out, bool with_bias, std::int64_t r, double alpha)
      : scale(alpha / static_cast<double>(r)) {
    torch::nn::Linear init(torch::nn::LinearOptions(in, out).bias(with_bias));
    weight = register_parameter("weight", init->weight.detach().clone());
    if (with_bias) bias = register_parameter("bias", init->bias.detach().clone());
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    lora_A = register_parameter("lora_A", torch::empty({r, in}).uniform_(-bound, bound));
    lora_B = register_parameter("lora_B", torch::zeros({out, r}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return torch::linear(x, weight, bias) + scale * torch::linear(torch::linear(x, lora_A), lora_B);
  }
  double scale;
  torch::Tensor weight, bias, lora_A, lora_B;
};
TORCH_MODULE(LoraLinear);

// char_transformer's Block with every Linear a LoraLinear (same names, same computation).
struct LoraBlockImpl : torch::nn::Module {
  LoraBlockImpl(const ct::Dims& d, std::int64_t r, double alpha)
      : heads(d.heads),
        ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d.embed})))),
        qkv(register_module("qkv", LoraLinear(d.embed, 3 * d.embed, false, r, alpha))),
        proj(register_module("proj", LoraLinear(d.embed, d.embed, true, r, alpha))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d.embed})))),
        fc(register_module("fc", LoraLinear(d.embed, 4 * d.embed, true, r, alpha))),
        out(register_module("out", LoraLinear(4 * d.embed, d.embed, true, r, alpha))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = x + proj->forward(ct::causal_attention(qkv->forward(ln1->forward(x)), heads));
    return h + out->forward(torch::gelu(fc->forward(ln2->forward(h))));
  }
  std::int64_t heads;
  torch::nn::LayerNorm ln1;
  LoraLinear qkv, proj;
  torch::nn::LayerNorm ln2;
  LoraLinear fc, out;
};
TORCH_MODULE(LoraBlock);

// char_transformer's Model with LoRA blocks; the embeddings and the head as they were.
struct LoraModelImpl : torch::nn::Module {
  LoraModelImpl(const ct::Dims& d, std::int64_t r, double alpha)
      : wte(register_module("wte", torch::nn::Embedding(d.vocab, d.embed))),
        wpe(register_module("wpe", torch::nn::Embedding(d.context, d.embed))),
        ln_f(register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d.embed})))),
        head(register_module("head", torch::nn::Linear(d.embed, d.vocab))) {
    for (std::int64_t l = 0; l < d.layers; ++l)
      blocks.push_back(register_module("block" + std::to_string(l), LoraBlock(d, r, alpha)));
  }
  torch::Tensor forward(const torch::Tensor& tokens) {
    auto x = wte->forward(tokens) + wpe->forward(torch::arange(tokens.size(1), torch::kLong));
    for (auto& b : blocks) x = b->forward(x);
    return head->forward(ln_f->forward(x)).to(torch::kFloat);
  }
  torch::nn::Embedding wte, wpe;
  std::vector<LoraBlock> blocks;
  torch::nn::LayerNorm ln_f;
  torch::nn::Linear head;
};
TORCH_MODULE(LoraModel);

// What fine-tuning trains: the adapters and the LayerNorms; the rest is the frozen base.
bool fine_tuned(const std::string& name) {
  return name.find("lora_") != std::string::npos || name.find("ln") != std::string::npos;
}

// nanoGPT's groups over the parameters that require grad: weight decay on >= 2-D, none otherwise.
std::vector<torch::optim::OptimizerParamGroup> decay_groups(const torch::nn::Module& model,
                                                            double weight_decay) {
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& p : model.parameters())
    if (p.requires_grad()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(
                                 torch::optim::AdamWOptions().weight_decay(weight_decay)));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(
                                    torch::optim::AdamWOptions().weight_decay(0.0)));
  return groups;
}

// ---- data

struct Text {
  torch::Tensor ids;  // the whole text as vocabulary indices
  int vocab = 0;
};

Text read_text(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream os;
  os << in.rdbuf();
  const std::string text = os.str();
  if (!in || text.size() < 2000)
    ZERO_THROW(kInvalidArgument, "cannot read a training text of >= 2000 bytes from '", path, "'");
  int index[256];
  std::fill(index, index + 256, -1);
  Text t;
  std::vector<std::int64_t> ids;
  for (unsigned char ch : text) {
    if (index[ch] < 0) index[ch] = t.vocab++;
    ids.push_back(index[ch]);
  }
  t.ids = torch::tensor(ids, torch::kLong);
  return t;
}

// kBatch windows of context + 1 tokens from ids[begin, end), at positions drawn from a
// generator seeded by `seed` (the same on every rank).
torch::Tensor batch(const Text& t, double begin, double end, std::int64_t context,
                    std::uint64_t seed) {
  const auto n = t.ids.size(0);
  const auto lo = static_cast<std::int64_t>(begin * static_cast<double>(n));
  const auto hi = static_cast<std::int64_t>(end * static_cast<double>(n));
  auto gen = at::detail::createCPUGenerator(seed);
  auto starts = torch::randint(lo, hi - context - 1, {kBatch}, gen, torch::kLong);
  std::vector<torch::Tensor> rows;
  for (int b = 0; b < kBatch; ++b) {
    const auto s = starts[b].item<std::int64_t>();
    rows.push_back(t.ids.slice(0, s, s + context + 1));
  }
  return torch::stack(rows);
}

template <class M>
torch::Tensor loss_of(M& model, const torch::Tensor& seq, std::int64_t context) {
  auto logits = model->forward(seq.slice(1, 0, context));
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                              seq.slice(1, 1, context + 1).reshape({-1}));
}

// ---- the engine's memory, per rank

struct Bytes {
  std::size_t params16 = 0, gradients = 0, master = 0, state = 0;
  std::size_t trained() const { return gradients + master + state; }
};

Bytes tracker_bytes(zero::Engine& e) {
  const zero::MemoryTracker& t = e.tracker();
  Bytes b;
  b.params16 = t.current(zero::MemCategory::kParams16);
  for (std::size_t tier = 0; tier < zero::kNumMemTiers; ++tier)  // gradients: at their peak
    b.gradients += t.peak(zero::MemCategory::kGradients, static_cast<zero::MemTier>(tier));
  b.master = t.current(zero::MemCategory::kMasterParams);
  b.state = t.current(zero::MemCategory::kOptimizerState);
  return b;
}

}  // namespace

int main(int argc, char** argv) try {
  // --config / --zero-stage / --set are the config's (as for every zero trainer); CLI11 the rest.
  zero::ConfigBuilder builder;
  builder.apply_env();
  std::vector<std::string> args =
      builder.apply_args(std::vector<std::string>(argv + 1, argv + argc));
  // Stage 3: shard this small model's units too (DeepSpeed's default threshold, 1e5 elements,
  // keeps every one of them whole), unless the config says otherwise.
  if (const zero::Config c = builder.build();
      c.zero_optimization.stage == 3 &&
      c.zero_optimization.stage3_param_persistence_threshold ==
          zero::ZeroOptimizationConfig{}.stage3_param_persistence_threshold)
    builder.set("zero_optimization.stage3_param_persistence_threshold=0");
  const zero::Config cfg = builder.build();

  int ranks = 2, pretrain_steps = 300, steps = 200;
  std::int64_t lora_rank = 4;
  double lora_alpha = 8.0, pretrain_lr = 2e-3, lr = 1e-2;
  ct::Dims dims;
  std::string data = "/usr/share/common-licenses/GPL-3", work_dir = "lora-run", pretrained;
  CLI::App app{"char-transformer-lora: pretrain, export to safetensors, import, fine-tune LoRA"};
  app.add_option("--ranks", ranks, "in-process ranks (ignored under mpirun)")
      ->check(CLI::IsMember({1, 2, 4, 8, 16}));
  app.add_option("--pretrain-steps", pretrain_steps, "pretraining steps")
      ->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "fine-tuning steps")->check(CLI::PositiveNumber);
  app.add_option("--lora-rank", lora_rank, "adapter rank r")->check(CLI::PositiveNumber);
  app.add_option("--lora-alpha", lora_alpha, "adapter scale alpha (the update is alpha/r B A)")
      ->check(CLI::PositiveNumber);
  app.add_option("--pretrain-lr", pretrain_lr, "pretraining AdamW lr")->check(CLI::PositiveNumber);
  app.add_option("--lr", lr, "fine-tuning AdamW lr")->check(CLI::PositiveNumber);
  app.add_option("--layers", dims.layers, "transformer blocks")->check(CLI::PositiveNumber);
  app.add_option("--embed", dims.embed, "embedding width (a multiple of 4: 4 heads)")
      ->check(CLI::PositiveNumber);
  app.add_option("--data", data, "training text");
  app.add_option("--work-dir", work_dir, "where the checkpoint and the safetensors go");
  app.add_option("--pretrained", pretrained,
                 "start from this safetensors file (of a pretraining run of these dims) instead of "
                 "pretraining")
      ->check(CLI::ExistingFile);
  std::reverse(args.begin(), args.end());  // CLI11's parse(vector) takes them last first
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (dims.embed % dims.heads != 0)
    ZERO_THROW(kInvalidArgument, "--embed ", dims.embed, " is not a multiple of ", dims.heads);
  const Text text = read_text(data);
  dims.vocab = text.vocab;
  torch::set_num_threads(1);

  const bool mpi = zero::detect_launch().size > 1;  // mpirun / torchrun: a rank per process
  if (mpi) ranks = 1;
  std::unique_ptr<zero::Communicator> mpi_comm;
  if (mpi) mpi_comm = zero::make_communicator(zero::comm_options(cfg));
  auto run_ranks = [&](const std::function<void(zero::Communicator&)>& fn) {
    if (mpi) {
      fn(*mpi_comm);
    } else {
      zero::ThreadGroup::run(ranks, fn, cfg.comm_timeout_s);
    }
  };
  const int world = mpi ? mpi_comm->size() : ranks;
  if (kBatch % world != 0)
    ZERO_THROW(kInvalidArgument, "the batch of ", kBatch, " rows does not split over ", world,
               " ranks (1, 2, 4, 8 or 16)");
  const int rows = kBatch / world;
  const bool printer = !mpi || mpi_comm->rank() == 0;  // the process of rank 0
  std::mutex print;
  auto say = [&](int rank, const char* format, auto... values) {  // rank 0 prints a line
    if (rank != 0) return;
    std::lock_guard<std::mutex> lock(print);
    std::printf(format, values...);
    std::printf("\n");
    std::fflush(stdout);
  };
  if (printer)
    std::printf(
        "char-transformer-lora: %d ranks, stage %d, %lld layers x %lld, vocab %d, LoRA r %lld "
        "alpha %g\n",
        world, cfg.zero_optimization.stage, static_cast<long long>(dims.layers),
        static_cast<long long>(dims.embed), dims.vocab, static_cast<long long>(lora_rank),
        lora_alpha);

  // ---- 1. pretrain on text [0, 0.7) and export through a zero checkpoint
  std::map<std::string, torch::Tensor> reference;  // rank 0: the pretrained values by name
  if (pretrained.empty()) {
    std::filesystem::create_directories(work_dir);
    pretrained = work_dir + "/pretrained.safetensors";
    const std::string ckpt_dir = work_dir + "/pretrain-ckpt";
    if (printer) std::filesystem::remove_all(ckpt_dir);  // this program's own: a fresh root
    if (mpi) mpi_comm->barrier();
    std::vector<ct::Model> models;
    for (int q = 0; q < ranks; ++q) {  // made here: torch::manual_seed is process-wide
      torch::manual_seed(1);
      models.emplace_back(dims);
    }
    run_ranks([&](zero::Communicator& comm) {
      ct::Model& model = models[mpi ? 0 : static_cast<std::size_t>(comm.rank())];
      const int rank = comm.rank();
      zero::torch::Optimizer opt(comm, *model, decay_groups(*model, 0.1),
                                 torch::optim::AdamWOptions(pretrain_lr), cfg);
      for (int step = 1; step <= pretrain_steps; ++step) {
        const auto seq = batch(text, 0.0, 0.7, dims.context, 1000 + step)
                             .slice(0, rank * rows, (rank + 1) * rows);
        opt.zero_grad();
        auto loss =
            ct::loss(model, seq.slice(1, 0, dims.context), seq.slice(1, 1, dims.context + 1));
        loss.backward();
        opt.step();
        if (step == 1 || step % 100 == 0 || step == pretrain_steps) {
          say(rank, "pretrain step %4d  loss %.4f", step, loss.item<float>());
        }
      }
      zero::ckpt::Saver saver(opt.engine(), {.dir = ckpt_dir, .keep = 1});
      opt.save_checkpoint(saver);
      opt.for_each_full_parameter(
          [&](const std::string& name, const at::Tensor& v) { reference[name] = v.clone(); },
          /*rank0_only=*/true);
      if (rank == 0) {  // the documented way out: consolidate the checkpoint (the f32 masters)
        const std::size_t bytes = zero::ckpt::consolidate(ckpt_dir, pretrained, zero::DType::kF32);
        say(rank, "exported %s (%zu bytes) from %s", pretrained.c_str(), bytes, ckpt_dir.c_str());
      }
      comm.barrier();  // the file is whole before any rank imports it
    });
  }

  // The name map: a fine-tuning engine parameter "<unit>.<param>" (the unit split in two:
  // "block0 (frozen)" and "block0") reads the tensor the pretraining engine named
  // "<child>.<param>" (its units were the model's children); the adapters are new: "" keeps them
  // as initialised.
  zero::ckpt::ImportOptions name_map;
  name_map.rename = [](const std::string& engine_name) -> std::string {
    const std::string param = engine_name.substr(engine_name.find('.') + 1);
    if (param.find("lora_") != std::string::npos) return "";
    return param.substr(0, param.find('.')) + "." + param;
  };

  // ---- 2 and 3. the LoRA model, all-trainable (memory only) and fine-tuned
  const auto eval_seq = batch(text, 0.9, 1.0, dims.context, 7);
  Bytes all_trainable, lora;
  int failures = 0;
  for (const bool all : {true, false}) {
    std::vector<LoraModel> models;
    for (int q = 0; q < ranks; ++q) {
      torch::manual_seed(2);
      models.emplace_back(dims, lora_rank, lora_alpha);
      for (auto& p : models.back()->named_parameters())
        p.value().set_requires_grad(all || fine_tuned(p.key()));
    }
    std::set<std::string> frozen;
    for (const auto& p : models[0]->named_parameters())
      if (!p.value().requires_grad()) frozen.insert(p.key());
    run_ranks([&](zero::Communicator& comm) {
      LoraModel& model = models[mpi ? 0 : static_cast<std::size_t>(comm.rank())];
      const int rank = comm.rank();
      zero::torch::Optimizer opt(comm, *model, decay_groups(*model, 0.1),
                                 torch::optim::AdamWOptions(lr), cfg);
      const zero::ckpt::ImportResult imported =
          zero::ckpt::import_safetensors(opt.engine(), pretrained, name_map);
      std::map<std::string, torch::Tensor> start;  // rank 0: every parameter after the import
      opt.for_each_full_parameter(
          [&](const std::string& name, const at::Tensor& v) { start[name] = v.clone(); },
          /*rank0_only=*/true);
      if (!all) {
        say(rank, "imported %zu tensors from %s; %zu base parameters frozen, %zu trained",
            imported.imported, pretrained.c_str(), frozen.size(), start.size() - frozen.size());
      }
      auto eval = [&] {
        torch::NoGradGuard no_grad;
        return loss_of(model, eval_seq, dims.context).item<float>();
      };
      const float before = all ? 0.0f : eval();
      // The all-trainable run: as many steps as it takes the pools to reach their size (the
      // first records the gather order, the second prefetches along it), at most the LoRA run's.
      const int run_steps = all ? std::min(2, steps) : steps;
      for (int step = 1; step <= run_steps; ++step) {
        const auto seq = batch(text, 0.7, 0.9, dims.context, 5000 + step)
                             .slice(0, rank * rows, (rank + 1) * rows);
        opt.zero_grad();
        auto loss = loss_of(model, seq, dims.context);
        loss.backward();
        opt.step();
        if (!all && (step == 1 || step % 50 == 0 || step == steps)) {
          say(rank, "fine-tune step %4d  loss %.4f", step, loss.item<float>());
        }
      }
      if (rank == 0) (all ? all_trainable : lora) = tracker_bytes(opt.engine());
      if (all) return;
      const float after = eval();
      say(rank, "held-out loss (text [0.9, 1.0)): before fine-tuning %.4f, after %.4f", before,
          after);
      // The checks: the frozen base bitwise the imported weights, and these the pretrained ones.
      std::size_t changed = 0, differ = 0;
      opt.for_each_full_parameter(
          [&](const std::string& name, const at::Tensor& v) {
            if (frozen.count(name) && !torch::equal(v, start.at(name))) ++changed;
          },
          /*rank0_only=*/true);
      for (const auto& [name, v] : start) {
        const auto it = reference.find(name);
        if (it != reference.end() && !torch::equal(v, it->second)) ++differ;
      }
      if (rank != 0) return;
      say(rank, "frozen base after training: %zu of %zu parameters changed: %s", changed,
          frozen.size(), changed == 0 ? "bitwise the imported weights" : "FAIL");
      if (!reference.empty()) {
        say(rank, "imported weights: %zu of %zu differ from pretraining's: %s", differ,
            reference.size(), differ == 0 ? "bitwise" : "FAIL");
      }
      failures += (changed != 0) + (differ != 0);
    });
  }

  if (!printer) return 0;  // rank 0 checks and prints
  std::printf("\nengine tracker, bytes on rank 0 of %d, stage %d (gradients: peak)\n", world,
              cfg.zero_optimization.stage);
  std::printf("%-22s %12s %12s %12s %12s\n", "model", "params16", "gradients", "master", "state");
  for (const auto& [label, b] : {std::pair<const char*, Bytes>{"all-trainable", all_trainable},
                                 {"LoRA (base frozen)", lora}})
    std::printf("%-22s %12zu %12zu %12zu %12zu\n", label, b.params16, b.gradients, b.master,
                b.state);
  // master: 0 in both with an f32 working dtype (the working copy is the master).
  const bool smaller = lora.gradients < all_trainable.gradients &&
                       lora.master <= all_trainable.master && lora.state < all_trainable.state &&
                       lora.trained() < all_trainable.trained();
  std::printf("gradients + master + state: LoRA %zu, all-trainable %zu (%.1f%%): %s\n",
              lora.trained(), all_trainable.trained(),
              100.0 * static_cast<double>(lora.trained()) /
                  static_cast<double>(std::max<std::size_t>(1, all_trainable.trained())),
              smaller ? "each below the all-trainable run's" : "FAIL: not below");
  failures += !smaller;
  return failures == 0 ? 0 : 1;
} catch (...) {
  return zero::report_exception("char-transformer-lora");
}
