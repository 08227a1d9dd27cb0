// bench_torch: step time of a LibTorch model (the example's char transformer) trained with
// torch::optim::AdamW on one rank with the whole batch, against zero::torch at stages 0-3 on
// N = 1 and N = 4 in-process ranks (each rank 1/N of the batch), in the same run. Reports the
// median step (zero_grad + forward + backward + step) and its ratio to AdamW's.
//
//   bench_torch [--steps S] [--warmup W] [--embed D] [--layers L] [--context T] [--batch B]
//               [--ranks N ...]
//
// Ratios, not times, are the figure (timings on these machines are noisy); in-process ranks
// share the machine's cores, so at N = 4 the ratio also carries 4 ranks' compute on them.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

// The workload is the example's model (not API): the bench times the trainer a user starts from,
// and the figures match the example's (char-transformer-zero).
#include "examples/libtorch/char_transformer.hpp"
#include "zero/comm/comm.hpp"
#include "zero/config/config.hpp"
#include "zero/torch/torch.hpp"

namespace {

namespace ct = char_transformer;
using Clock = std::chrono::steady_clock;

struct Options {
  int steps = 10, warmup = 2;
  ct::Dims dims{65, 128, 4, 4, 64};
  int batch = 16;
  std::vector<int> ranks{1, 4};
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

torch::Tensor make_batch(const Options& o, int step) {
  auto gen = at::detail::createCPUGenerator(100 + static_cast<std::uint64_t>(step));
  return torch::randint(o.dims.vocab, {o.batch, o.dims.context + 1}, gen, torch::kLong);
}

// Median seconds per step; `step_fn(seq)` does one training step on the rows it is given.
template <typename Step>
double time_steps(const Options& o, int rank, int world, Step&& step_fn) {
  std::vector<double> times;
  const int rows = o.batch / world;
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    const auto seq = make_batch(o, s).slice(0, rank * rows, (rank + 1) * rows);
    const auto t0 = Clock::now();
    step_fn(seq.slice(1, 0, o.dims.context), seq.slice(1, 1, o.dims.context + 1));
    if (s >= o.warmup) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return median(times);
}

double run_adamw(const Options& o) {
  torch::manual_seed(1);
  ct::Model model(o.dims);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
  return time_steps(o, 0, 1, [&](const torch::Tensor& x, const torch::Tensor& y) {
    opt.zero_grad();
    ct::loss(model, x, y).backward();
    opt.step();
  });
}

double run_zero(const Options& o, int stage, int ranks) {
  const zero::Config cfg = zero::parse_config(
      R"({"zero_optimization": {"stage": )" + std::to_string(stage) +
      (stage == 3 ? R"(, "stage3_param_persistence_threshold": 0)" : "") +
      R"(}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}}})");
  std::vector<ct::Model> models;
  for (int q = 0; q < ranks; ++q) {
    torch::manual_seed(1);
    models.emplace_back(o.dims);
  }
  std::vector<double> rank_times(static_cast<std::size_t>(ranks));
  zero::ThreadGroup::run(ranks, [&](zero::Communicator& comm) {
    ct::Model& model = models[static_cast<std::size_t>(comm.rank())];
    zero::torch::Optimizer opt(comm, *model, cfg);
    rank_times[static_cast<std::size_t>(comm.rank())] =
        time_steps(o, comm.rank(), ranks, [&](const torch::Tensor& x, const torch::Tensor& y) {
          opt.zero_grad();
          ct::loss(model, x, y).backward();
          opt.step();
        });
  });
  return *std::max_element(rank_times.begin(), rank_times.end());
}

}  // namespace

int main(int argc, char** argv) try {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> int {
      if (i + 1 >= argc) throw std::invalid_argument("missing value after " + a);
      return std::atoi(argv[++i]);
    };
    if (a == "--steps")
      o.steps = next();
    else if (a == "--warmup")
      o.warmup = next();
    else if (a == "--embed")
      o.dims.embed = next();
    else if (a == "--layers")
      o.dims.layers = next();
    else if (a == "--context")
      o.dims.context = next();
    else if (a == "--batch")
      o.batch = next();
    else if (a == "--ranks") {
      o.ranks.clear();
      while (i + 1 < argc && argv[i + 1][0] != '-') o.ranks.push_back(std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "unknown argument '%s'\n", a.c_str());
      return 2;
    }
  }
  for (int n : o.ranks)
    if (n < 1 || o.batch % n != 0) {
      std::fprintf(stderr, "--batch %d must be a multiple of every --ranks value (%d)\n", o.batch,
                   n);
      return 2;
    }
  torch::set_num_threads(1);  // one thread per rank: N ranks are N threads
  std::size_t params = 0;
  {
    torch::manual_seed(1);
    ct::Model m(o.dims);
    for (const auto& p : m->parameters()) params += static_cast<std::size_t>(p.numel());
  }
  std::printf(
      "char transformer: %zu parameters (embed %lld, %lld layers), batch %d x %lld, f32, "
      "median of %d steps\n",
      params, static_cast<long long>(o.dims.embed), static_cast<long long>(o.dims.layers), o.batch,
      static_cast<long long>(o.dims.context), o.steps);
  const double base = run_adamw(o);
  std::printf("%-30s %10.2f ms  1.00x\n", "torch::optim::AdamW (N=1)", base * 1e3);
  for (int n : o.ranks)
    for (int stage = 0; stage <= 3; ++stage) {
      const double t = run_zero(o, stage, n);
      std::printf(
          "%-30s %10.2f ms  %.2fx\n",
          ("zero stage " + std::to_string(stage) + " (N=" + std::to_string(n) + ")").c_str(),
          t * 1e3, t / base);
    }
  return 0;
} catch (...) {
  return zero::report_exception("bench_torch");
}
