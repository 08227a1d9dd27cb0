// What a step of the GPT trainer costs in arithmetic (gpt/gpt_cost.hpp).
#include "gpt/gpt_cost.hpp"

#include <algorithm>
#include <chrono>

#include "zero/comm/comm.hpp"
#include "zero/config/config.hpp"
#include "zero/core/error.hpp"
#include "zero/engine/engine.hpp"

namespace zero::gpt {

double model_flops_per_token(const GptConfig& g) {
  const double matmul_params = static_cast<double>(g.num_params()) - double{1} * g.seq * g.dim;
  return 6.0 * matmul_params + 12.0 * g.layers * g.dim * g.seq;
}

double step_flops_per_token(const GptConfig& g, const CheckpointSpec& spec) {
  double f = model_flops_per_token(g);
  if (spec.policy != CheckpointPolicy::kNone) {
    // The blocks' weights: all but the embeddings (wte, wpe) and ln_f's gain and bias.
    const double blocks =
        static_cast<double>(g.num_params()) - double{1} * (g.vocab + g.seq) * g.dim - 2.0 * g.dim;
    f += 2.0 * blocks + 4.0 * g.layers * g.dim * g.seq;
  }
  return f;
}

double measure_flops(GptConfig g, int rows, int repeats, int ranks) {
  const CharCorpus corpus = CharCorpus::from_file(kDefaultCorpus);
  if (g.vocab == 0) g.vocab = corpus.vocab_size();
  g.validate();
  ZERO_CHECK(ranks >= 1 && rows >= 1, kInvalidArgument, "measure_flops: ranks ", ranks, ", rows ",
             rows);
  double best = 1e300;
  // Stage 0: forward and backward communicate nothing (the all-reduce is in step(), untimed);
  // the ranks start each timed micro-step together, as zero-train's do.
  ThreadGroup::run(ranks, [&](Communicator& comm) {
    Engine e(comm, Config{});
    GptModel m(g, e.tracker());
    m.declare(e);
    m.init(e, 1);
    for (int k = 0; k <= std::max(repeats, 1); ++k) {
      const TokenBatch b =
          corpus.batch(Split::kTrain, rows, g.seq, comm.rank(), 0, static_cast<unsigned>(k));
      comm.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      (void)m.forward_backward(e, b);
      comm.barrier();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (k > 0 && comm.rank() == 0) best = std::min(best, s);  // k = 0 warms up
      (void)e.step();
    }
  });
  return static_cast<double>(ranks) * rows * g.seq * model_flops_per_token(g) / best;
}

}  // namespace zero::gpt
