// What a step of the GPT trainer costs in arithmetic (gpt/gpt_cost.hpp).
#include "gpt/gpt_cost.hpp"

#include <algorithm>
#include <chrono>

#include "zero/comm.hpp"
#include "zero/config.hpp"
#include "zero/engine.hpp"

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

double measure_flops(GptConfig g, int rows, int repeats) {
  const CharCorpus corpus = CharCorpus::from_file(kDefaultCorpus);
  if (g.vocab == 0) g.vocab = corpus.vocab_size();
  g.validate();
  ThreadGroup group(1);
  auto comm = group.communicator(0);
  Engine e(*comm, Config{});
  GptModel m(g, e.tracker());
  m.declare(e);
  m.init(e, 1);
  double best = 1e300;
  for (int k = 0; k <= std::max(repeats, 1); ++k) {
    const TokenBatch b = corpus.batch(Split::kTrain, rows, g.seq, 0, 0, static_cast<unsigned>(k));
    const auto t0 = std::chrono::steady_clock::now();
    (void)m.forward_backward(e, b);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (k > 0) best = std::min(best, s);  // k = 0 warms up (first touch of the workspace)
    (void)e.step();
  }
  return static_cast<double>(rows) * g.seq * model_flops_per_token(g) / best;
}

}  // namespace zero::gpt
