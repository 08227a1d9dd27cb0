// A character-level MLP language model (Bengio et al. 2003) trained the usual C++ way: one flat
// parameter buffer, one flat gradient buffer, forward and backward written out, and a
// hand-written AdamW — then swapped to zero with the few lines under ZERO_SWAP (the two
// binaries char-mlp and char-mlp-zero are this file built without and with it):
//
//   char-mlp       [--steps N] [--data FILE]
//   char-mlp-zero  [--steps N] [--data FILE] [--ranks N] [--zero-stage S] [--config ds.json]
//
// Both print the loss every 50 steps and, at the end, a checksum of the parameters (so runs at
// different stages can be compared bit for bit).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>
#ifdef ZERO_SWAP
#include <mutex>

#include "zero/comm/comm.hpp"
#include "zero/config/config.hpp"
#include "zero/engine/engine.hpp"
#endif

namespace {

constexpr int kContext = 3, kEmbed = 8, kHidden = 64, kBatch = 32;

struct Model {
  int vocab = 0;
  // Offsets into the flat buffer.
  std::size_t C, W1, b1, W2, b2, count;
  explicit Model(int v) : vocab(v) {
    C = 0;
    W1 = C + static_cast<std::size_t>(v * kEmbed);
    b1 = W1 + static_cast<std::size_t>(kContext * kEmbed * kHidden);
    W2 = b1 + kHidden;
    b2 = W2 + static_cast<std::size_t>(kHidden * v);
    count = b2 + static_cast<std::size_t>(v);
  }
};

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) return {};
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

// Forward and backward of one batch; gradients accumulate into g. Returns the mean loss.
float forward_backward(const Model& m, const float* p, float* g, const std::vector<int>& data,
                       std::mt19937_64& rng) {
  const int V = m.vocab;
  std::uniform_int_distribution<std::size_t> pick(0, data.size() - kContext - 1);
  float loss = 0.0f;
  std::vector<float> x(kContext * kEmbed), h(kHidden), logits(static_cast<std::size_t>(V));
  std::vector<float> dh(kHidden), dx(kContext * kEmbed);
  for (int b = 0; b < kBatch; ++b) {
    const std::size_t at = pick(rng);
    for (int c = 0; c < kContext; ++c) {
      std::memcpy(&x[static_cast<std::size_t>(c * kEmbed)],
                  p + m.C + static_cast<std::size_t>(data[at + c] * kEmbed), kEmbed * 4);
    }
    for (int j = 0; j < kHidden; ++j) {
      float a = p[m.b1 + j];
      for (int i = 0; i < kContext * kEmbed; ++i)
        a += x[static_cast<std::size_t>(i)] * p[m.W1 + static_cast<std::size_t>(i * kHidden + j)];
      h[static_cast<std::size_t>(j)] = std::tanh(a);
    }
    float mx = -1e30f;
    for (int v = 0; v < V; ++v) {
      float a = p[m.b2 + v];
      for (int j = 0; j < kHidden; ++j)
        a += h[static_cast<std::size_t>(j)] * p[m.W2 + static_cast<std::size_t>(j * V + v)];
      logits[static_cast<std::size_t>(v)] = a;
      mx = std::max(mx, a);
    }
    float sum = 0.0f;
    for (float& l : logits) sum += (l = std::exp(l - mx));
    const int target = data[at + kContext];
    loss -= std::log(logits[static_cast<std::size_t>(target)] / sum) / kBatch;
    // Backward.
    std::fill(dh.begin(), dh.end(), 0.0f);
    for (int v = 0; v < V; ++v) {
      const float d =
          (logits[static_cast<std::size_t>(v)] / sum - (v == target ? 1.0f : 0.0f)) / kBatch;
      g[m.b2 + v] += d;
      for (int j = 0; j < kHidden; ++j) {
        g[m.W2 + static_cast<std::size_t>(j * V + v)] += d * h[static_cast<std::size_t>(j)];
        dh[static_cast<std::size_t>(j)] += d * p[m.W2 + static_cast<std::size_t>(j * V + v)];
      }
    }
    std::fill(dx.begin(), dx.end(), 0.0f);
    for (int j = 0; j < kHidden; ++j) {
      const float da = dh[static_cast<std::size_t>(j)] *
                       (1.0f - h[static_cast<std::size_t>(j)] * h[static_cast<std::size_t>(j)]);
      g[m.b1 + j] += da;
      for (int i = 0; i < kContext * kEmbed; ++i) {
        g[m.W1 + static_cast<std::size_t>(i * kHidden + j)] += da * x[static_cast<std::size_t>(i)];
        dx[static_cast<std::size_t>(i)] += da * p[m.W1 + static_cast<std::size_t>(i * kHidden + j)];
      }
    }
    for (int c = 0; c < kContext; ++c) {
      for (int e = 0; e < kEmbed; ++e)
        g[m.C + static_cast<std::size_t>(data[at + c] * kEmbed + e)] +=
            dx[static_cast<std::size_t>(c * kEmbed + e)];
    }
  }
  return loss;
}

#ifndef ZERO_SWAP
// llm.c-style AdamW over the flat buffer.
void adamw(float* p, const float* g, float* m, float* v, std::size_t n, int t, float lr) {
  const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.01f;
  const float c1 = 1.0f - std::pow(b1, static_cast<float>(t)),
              c2 = 1.0f - std::pow(b2, static_cast<float>(t));
  for (std::size_t i = 0; i < n; ++i) {
    m[i] = b1 * m[i] + (1 - b1) * g[i];
    v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
    p[i] -= lr * ((m[i] / c1) / (std::sqrt(v[i] / c2) + eps) + wd * p[i]);
  }
}
#endif

std::uint64_t checksum(const float* p, std::size_t n) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t u;
    std::memcpy(&u, &p[i], 4);
    h = (h ^ u) * 1099511628211ull;
  }
  return h;
}

}  // namespace

int main(int argc, char** argv) try {
  int steps = 300;
  std::string path = "/usr/share/common-licenses/GPL-3";
  std::vector<std::string> rest;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc) {
      steps = std::atoi(argv[++i]);
    } else if (a == "--data" && i + 1 < argc) {
      path = argv[++i];
    } else {
      rest.push_back(a);
    }
  }
  const std::string text = read_text(path);
  if (text.size() < 100) {
    std::fprintf(stderr, "cannot read training text '%s'\n", path.c_str());
    return 2;
  }
  int index[256];
  std::fill(index, index + 256, -1);
  std::vector<int> data;
  int vocab = 0;
  for (unsigned char ch : text) {
    if (index[ch] < 0) index[ch] = vocab++;
    data.push_back(index[ch]);
  }
  const Model model(vocab);
#ifdef ZERO_SWAP
  int ranks = 2;
  std::vector<const char*> cargs{argv[0]};
  for (std::size_t i = 0; i < rest.size(); ++i) {
    if (rest[i] == "--ranks" && i + 1 < rest.size()) {
      ranks = std::atoi(rest[++i].c_str());
    } else {
      cargs.push_back(rest[i].c_str());
    }
  }
  std::vector<std::string> unused;
  const zero::Config cfg =
      zero::config_from_command_line(static_cast<int>(cargs.size()), cargs.data(), &unused);
  std::mutex print;
  zero::ThreadGroup::run(ranks, [&](zero::Communicator& comm) {
    const int rank = comm.rank();
    const std::size_t cap = zero::attach_capacity(model.count, comm.size());
#else
  if (!rest.empty()) {
    std::fprintf(stderr, "unknown argument '%s'\n", rest[0].c_str());
    return 2;
  }
  {
    const int rank = 0;
    const std::size_t cap = model.count;
#endif
    std::vector<float> params(cap, 0.0f), grads(cap, 0.0f);
    std::mt19937_64 init(1234);
    std::normal_distribution<float> nd(0.0f, 0.1f);
    for (std::size_t i = 0; i < model.count; ++i) params[i] = nd(init);
#ifdef ZERO_SWAP
    auto opt = zero::Engine::attach(comm, cfg, params.data(), grads.data(), model.count, cap,
                                    zero::DType::kF32);
#else
    std::vector<float> m(cap, 0.0f), v(cap, 0.0f);
#endif
    std::mt19937_64 rng(99 + static_cast<std::uint64_t>(rank));
    float avg = 0.0f;
    for (int step = 1; step <= steps; ++step) {
      std::fill(grads.begin(), grads.end(), 0.0f);
      const float loss = forward_backward(model, params.data(), grads.data(), data, rng);
      avg = step == 1 ? loss : 0.95f * avg + 0.05f * loss;
#ifdef ZERO_SWAP
      opt->step();
      if (rank == 0 && (step % 50 == 0 || step == steps)) {
        std::lock_guard<std::mutex> lock(print);
#else
      adamw(params.data(), grads.data(), m.data(), v.data(), model.count, step, 1e-3f);
      if (step % 50 == 0 || step == steps) {
#endif
        std::printf("step %4d  loss %.4f (smoothed %.4f)\n", step, loss, avg);
      }
    }
    if (rank == 0) {
      std::printf("final smoothed loss %.4f  uniform %.4f  params %zu  checksum %016llx\n", avg,
                  std::log(static_cast<float>(vocab)), model.count,
                  static_cast<unsigned long long>(checksum(params.data(), model.count)));
    }
#ifdef ZERO_SWAP
  });
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
