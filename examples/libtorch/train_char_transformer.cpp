// A LibTorch trainer written the usual way — a char transformer (char_transformer.hpp),
// torch::optim::AdamW, `zero_grad(); loss.backward(); step();` — and the same trainer swapped to
// zero by the lines under ZERO_SWAP (the binaries char-transformer and char-transformer-zero are
// this file built without and with it):
//
//   char-transformer       [--steps N] [--data FILE] [--layers L] [--embed D]
//   char-transformer-zero  [--steps N] [--data FILE] [--layers L] [--embed D] [--ranks N]
//                          [--zero-stage S] [--config ds.json] [--set key=value ...]
//                          [--checkpoint-activations]
//   mpirun -np N char-transformer-zero ...   (one rank per process)
//
// Both print the loss every 25 steps and, at the end, a checksum of the parameters. zero's
// ranks split each batch of 16 sequences between them (the global batch stays 16), so the runs
// at every N and stage train the same model on the same data.
#include <torch/torch.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "char_transformer.hpp"
#ifdef ZERO_SWAP
#include <mutex>

#include "zero/comm/comm.hpp"
#include "zero/config/comm_config.hpp"
#include "zero/config/config.hpp"
#include "zero/torch/torch.hpp"  // ZERO_SWAP: the adapter
#endif

namespace {

constexpr int kBatch = 16;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) return {};
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

std::uint64_t checksum(const torch::nn::Module& model) {
  std::uint64_t h = 1469598103934665603ull;
  for (const auto& p : model.parameters()) {
    const auto f = p.detach().to(torch::kFloat).contiguous();
    const float* d = f.data_ptr<float>();
    for (std::int64_t i = 0; i < f.numel(); ++i) {
      std::uint32_t u;
      std::memcpy(&u, &d[i], 4);
      h = (h ^ u) * 1099511628211ull;
    }
  }
  return h;
}

}  // namespace

int main(int argc, char** argv) try {
  int steps = 200;
  std::string path = "/usr/share/common-licenses/GPL-3";
  char_transformer::Dims dims;
  std::vector<std::string> rest;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc) {
      steps = std::atoi(argv[++i]);
    } else if (a == "--data" && i + 1 < argc) {
      path = argv[++i];
    } else if (a == "--layers" && i + 1 < argc) {
      dims.layers = std::atoi(argv[++i]);
    } else if (a == "--embed" && i + 1 < argc) {
      dims.embed = std::atoi(argv[++i]);
    } else {
      rest.push_back(a);
    }
  }
  const std::string text = read_text(path);
  if (text.size() < 1000) {
    std::fprintf(stderr, "cannot read training text '%s'\n", path.c_str());
    return 2;
  }
  int index[256];
  std::fill(index, index + 256, -1);
  std::vector<std::int64_t> ids;
  int vocab = 0;
  for (unsigned char ch : text) {
    if (index[ch] < 0) index[ch] = vocab++;
    ids.push_back(index[ch]);
  }
  dims.vocab = vocab;
  const auto corpus = torch::tensor(ids, torch::kLong);
  // Batch `step`: kBatch windows at positions drawn from a generator seeded by the step.
  auto batch = [&](int step) {
    auto gen = at::detail::createCPUGenerator(1000 + static_cast<std::uint64_t>(step));
    auto starts = torch::randint(corpus.size(0) - dims.context - 1, {kBatch}, gen, torch::kLong);
    std::vector<torch::Tensor> rows;
    for (int b = 0; b < kBatch; ++b)
      rows.push_back(corpus.slice(0, starts[b].item<std::int64_t>(),
                                  starts[b].item<std::int64_t>() + dims.context + 1));
    return torch::stack(rows);
  };
  torch::set_num_threads(1);
#ifdef ZERO_SWAP
  int ranks = 2;
  bool checkpoint_activations = false;  // every block recomputed in backward
  std::vector<std::string> zero_args;
  for (std::size_t i = 0; i < rest.size(); ++i) {
    if (rest[i] == "--ranks" && i + 1 < rest.size()) {
      ranks = std::atoi(rest[++i].c_str());
    } else if (rest[i] == "--checkpoint-activations") {
      checkpoint_activations = true;
    } else {
      zero_args.push_back(rest[i]);
    }
  }
  // ZERO_SWAP: AdamWOptions(1e-3)'s values (LibTorch's defaults) become the config's optimizer
  // block; --config, ZERO_* and --zero-stage / --set choose the rest per run.
  zero::ConfigBuilder builder;
  builder.merge_json(R"({"optimizer": {"type": "AdamW", "params": {"lr": 1e-3,
      "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}}})");
  builder.apply_env();
  const std::vector<std::string> unused = builder.apply_args(zero_args);
  const zero::Config cfg = builder.build();
  if (!unused.empty()) {
    std::fprintf(stderr, "unknown argument '%s'\n", unused[0].c_str());
    return 2;
  }
  const bool mpi = zero::detect_launch().size > 1;  // mpirun / torchrun: a rank per process
  if (mpi) ranks = 1;
  std::vector<char_transformer::Model> models;
  for (int q = 0; q < ranks; ++q) {  // made here: torch::manual_seed is process-wide
    torch::manual_seed(1);
    models.emplace_back(dims);
  }
  std::mutex print;
  auto train = [&](zero::Communicator& comm) {
    char_transformer::Model& model = models[mpi ? 0 : static_cast<std::size_t>(comm.rank())];
    const int rank = comm.rank(), world = comm.size();
    zero::torch::Optimizer optimizer(comm, *model, cfg);  // ZERO_SWAP: was torch::optim::AdamW
    const int rows = kBatch / world;                      // ZERO_SWAP: this rank's rows
    // ZERO_SWAP: activation checkpointing (the config's activation_checkpointing keys), each
    // block's forward recomputed in backward.
    zero::torch::ActivationCheckpointing ac(optimizer);
    char_transformer::ModelImpl::BlockRunner run;
    if (checkpoint_activations)
      run = [&ac](const std::function<torch::Tensor(const torch::Tensor&)>& block,
                  const torch::Tensor& x) { return ac.checkpoint(block, x); };
#else
  if (!rest.empty()) {
    std::fprintf(stderr, "unknown argument '%s'\n", rest[0].c_str());
    return 2;
  }
  {
    torch::manual_seed(1);
    char_transformer::Model model(dims);
    const int rank = 0, rows = kBatch;
    torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
#endif
    float avg = 0.0f;
    for (int step = 1; step <= steps; ++step) {
      const auto seq = batch(step).slice(0, rank * rows, (rank + 1) * rows);
      optimizer.zero_grad();
#ifdef ZERO_SWAP
      auto loss = char_transformer::loss(model, seq.slice(1, 0, dims.context),
                                         seq.slice(1, 1, dims.context + 1), run);
#else
      auto loss = char_transformer::loss(model, seq.slice(1, 0, dims.context),
                                         seq.slice(1, 1, dims.context + 1));
#endif
      loss.backward();
      optimizer.step();
      const float l = loss.item<float>();
      avg = step == 1 ? l : 0.9f * avg + 0.1f * l;
#ifdef ZERO_SWAP
      if (rank == 0 && (step % 25 == 0 || step == steps)) {
        std::lock_guard<std::mutex> lock(print);
#else
      if (step % 25 == 0 || step == steps) {
#endif
        std::printf("step %4d  loss %.4f (smoothed %.4f)\n", step, l, avg);
      }
    }
#ifdef ZERO_SWAP
    optimizer.detach();  // ZERO_SWAP: the full parameters back in the module (stage 3: gathered)
#endif
    if (rank == 0) {
      std::size_t n = 0;
      for (const auto& p : model->parameters()) n += static_cast<std::size_t>(p.numel());
      std::printf("final smoothed loss %.4f  uniform %.4f  params %zu  checksum %016llx\n", avg,
                  std::log(static_cast<float>(vocab)), n,
                  static_cast<unsigned long long>(checksum(*model)));
    }
#ifdef ZERO_SWAP
  };
  if (mpi) {
    auto comm = zero::make_communicator(zero::comm_options(cfg));
    train(*comm);
  } else {
    zero::ThreadGroup::run(ranks, train, cfg.comm_timeout_s);
  }
#else
  }
#endif
  return 0;
} catch (const std::exception& e) {  // the plain trainer does not link zero
  std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
  return 2;
} catch (...) {
  std::fprintf(stderr, "%s: unknown exception\n", argv[0]);
  return 2;
}
