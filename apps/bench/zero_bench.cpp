// zero-bench — what each ZeRO stage saves, measured: trains the GPT model of zero-train for a
// few steps per configuration (stages 0-3, with and without activation checkpointing) at N
// in-process ranks (or the ranks of an mpirun launch), and prints per rank and in total the
// tracker's bytes by category beside the planner's prediction and DESIGN.md's formula, the
// step time, and the bytes communicated per step.
//
//   zero-bench [--ranks N] [--steps S] [--stages 0,1,2,3] [--checkpoint none,sqrt]
//              [--layers L] [--dim D] [--heads H] [--seq T] [--batch B] [--dtype bf16|f16|f32]
//              [--reduce-dtype bf16|f16|f32] [--data FILE] [--config ds.json] [--set k=v]...
//              [--offload none,cpu,nvme] [--nvme-path DIR] [--memory-budget BYTES] [--comm-debug]
//              [--json FILE] [--csv FILE] [--svg FILE] [--trace FILE] [--metrics FILE]
//              [--no-progress]
//   zero-bench --plan --params 7.5e9 --ranks 64          DESIGN.md / ZeRO-paper figures
//   zero-bench --plan --layers L --dim D [--vocab V] ... --ranks N   this engine, predicted
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_options.hpp"
#include "bench/bench_report.hpp"
#include "common/files.hpp"
#include "common/progress.hpp"
#include "gpt/gpt_fit.hpp"
#include "gpt/gpt_flags.hpp"
#include "gpt/gpt_model.hpp"
#include "zero/comm/comm.hpp"
#include "zero/comm/quantized_comm.hpp"
#include "zero/config/comm_config.hpp"
#include "zero/config/config.hpp"
#include "zero/core/error.hpp"
#include "zero/device/memory.hpp"
#include "zero/device/memory_report.hpp"
#include "zero/engine/activation_checkpointing.hpp"
#include "zero/engine/engine.hpp"
#include "zero/engine/fit.hpp"
#include "zero/engine/plan.hpp"
#include "zero/optim/optimizer.hpp"

namespace {

using namespace zero;
using bench::ConfigFigures;
using bench::kUsage;
using bench::make_config;
using bench::Options;
using bench::parse;
using bench::RankFigures;
using Clock = std::chrono::steady_clock;

// Bytes one rank sends per step by DESIGN.md's accounting (ring volumes, (N-1)/N of each
// buffer): gradients once (all_reduce: twice) in the reduce dtype; parameters gathered in the
// working dtype in stages 1-2 once, in stage 3 at every gather of the trainer's order (2 per unit
// — DESIGN.md's 3Ψ — plus one per block that checkpointing recomputes); the 16-byte norm exchange.
// Stage 3 with qwZ + qgZ: every gather and every unit's reduction moves (N-1) packed int8 chunks
// of the unit's shard (zero/comm/quantized_comm.hpp's QuantizedChunk: values, scales, 16-byte
// padding).
double comm_theory(const PlanInput& pin, const PlanResult& plan, int n, int stage,
                   const Config& cfg) {
  const double f = static_cast<double>(n - 1) / n;
  const ZeroOptimizationConfig& z = cfg.zero_optimization;
  if (stage == 3 && z.zero_quantized_weights && z.zero_quantized_gradients) {
    const auto block = static_cast<std::size_t>(z.quantization_block_size);
    auto chunk = [&](std::size_t u) {
      return static_cast<double>(QuantizedChunk{plan.unit_padded[u] / n, block}.bytes());
    };
    double bytes = (n - 1) * 16.0;
    for (std::size_t u = 0; u < plan.unit_padded.size(); ++u) {  // the trainable units' reduction
      if (pin.units[u].params[0].trainable) bytes += (n - 1) * chunk(u);
    }
    for (UnitId u : pin.gather_order) bytes += (n - 1) * chunk(static_cast<std::size_t>(u));
    return bytes;
  }
  const DType w = working_dtype(cfg);
  const DType r = reduce_dtype_of(cfg);
  const double rs = static_cast<double>(dtype_size(r)), ws = static_cast<double>(dtype_size(w));
  // Frozen units are neither reduced nor gathered after the step (the trainable ones: psi).
  const double psi = static_cast<double>(plan.psi_trainable_padded);
  if (stage == 0) return 2 * f * psi * rs;
  if (stage < 3) return f * psi * (rs + ws) + (n - 1) * 16.0;
  double gathered = 0;
  for (UnitId u : pin.gather_order) {
    gathered += static_cast<double>(plan.unit_padded[static_cast<std::size_t>(u)]);
  }
  return f * psi * rs + f * gathered * ws + (n - 1) * 16.0;
}

// --metrics: one JSON line per rank per measured step, from every rank's thread.
struct MetricsLog {
  std::mutex mu;
  std::ofstream out;
};

// Of the optimizer state (and the stages 2-3 gradient partition), the fraction off the compute
// device: offload_optimizer.ratio with device cpu; all of it with nvme (the ratio splits it
// between the file and pinned memory, both off the device).
double device_offload_fraction(const Config& cfg) {
  const OffloadConfig& oo = cfg.zero_optimization.offload_optimizer;
  return oo.device == OffloadDevice::kCpu ? oo.ratio : 1.0;
}

// One configuration's run. trace_path non-empty: with the timeline recorded and written there.
// step_done (if set) is called by rank 0 with the steps done after each step (the progress).
// One configuration's run (`kind`: its stage, checkpointing, offload and hybrid group size).
ConfigFigures run_config(const Options& o, const gpt::CharCorpus& corpus, const ConfigFigures& kind,
                         Communicator* mpi_world, const std::string& trace_path = "",
                         MetricsLog* metrics = nullptr,
                         const std::function<void(int)>& step_done = nullptr) {
  const int stage = kind.stage;
  const std::string& ckpt = kind.checkpoint;
  const std::string& offload = kind.offload;
  Config cfg = make_config(o, stage, offload, kind.hybrid, kind.quantized, kind.comm_debug);
  cfg.trace.enabled = !trace_path.empty();
  gpt::GptConfig g = o.model;
  g.vocab = corpus.vocab_size();
  const CheckpointSpec spec = CheckpointSpec::resolve(ckpt, cfg.activation_checkpointing);
  const int n = mpi_world != nullptr ? mpi_world->size() : o.ranks;

  ConfigFigures c;
  c.stage = stage;
  c.checkpoint = ckpt;
  c.offload = offload;
  c.hybrid = kind.hybrid;
  c.quantized = kind.quantized;
  c.comm_debug = kind.comm_debug;
  c.ranks = n;
  // The ranks the state is sharded over (hybrid: the group), and the groups holding copies.
  const int sharded = kind.hybrid > 0 ? kind.hybrid : n;
  const int replicas = n / sharded;
  c.dtype = o.dtype;
  c.reduce_dtype = o.reduce_dtype;
  c.params = g.num_params();
  c.trainable_params = g.trainable_params();
  {
    PlanInput pin;
    pin.units = gpt::model_units(g, cfg);
    pin.ranks = n;
    pin.config = cfg;
    pin.gather_order = gpt::GptModel::gather_order(g, spec);
    pin.grads_held = gpt::GptModel::grads_held(g);
    c.plan = plan_engine_memory(pin);
    c.comm_theory_bytes = comm_theory(pin, c.plan, sharded, stage, cfg);
    // Hybrid: each reduced gradient shard all-reduced across the replicas, once per step (ring
    // volume 2 (R - 1) / R of the shard in the reduce dtype).
    // With qgZ: (R - 1) packed int8 chunks of each unit's shard (an all-gather of them).
    c.cross_group_theory_bytes = 2.0 * (replicas - 1) / replicas *
                                 static_cast<double>(c.plan.psi_trainable_padded) / sharded *
                                 static_cast<double>(dtype_size(reduce_dtype_of(cfg)));
    if (kind.quantized && replicas > 1) {
      c.cross_group_theory_bytes = 0;
      for (std::size_t u = 0; u < c.plan.unit_padded.size(); ++u) {
        if (!pin.units[u].params[0].trainable) continue;
        const std::size_t padded = c.plan.unit_padded[u];
        c.cross_group_theory_bytes +=
            (replicas - 1) *
            static_cast<double>(QuantizedChunk{
                padded / static_cast<std::size_t>(sharded),
                static_cast<std::size_t>(cfg.zero_optimization.quantization_block_size)}
                                    .bytes());
      }
    }
    c.comm_theory_bytes += c.cross_group_theory_bytes;
    MemoryTracker t;
    gpt::GptModel m(g, t);
    c.predicted_activations = m.activation_bytes(o.batch, g.seq, spec);
    c.predicted_other = m.workspace_bytes(o.batch, g.seq);
  }
  const DType w = parse_dtype(o.dtype), r = parse_dtype(o.reduce_dtype);
  // K: the fp32 master and the moments at their bytes per element (DESIGN.md's 12 for f32
  // Adam; 8 with bf16 moments; 4 + 2 (1 + 4 / 256) with int8's codes and block scales).
  const OptimizerParams op = OptimizerParams::from_config(cfg.optimizer);
  const double moment = static_cast<double>(state_bytes(op.state_dtype(), kInt8MomentBlock)) /
                        static_cast<double>(kInt8MomentBlock);
  c.formula = zero_formula(static_cast<double>(c.params), sharded, stage,
                           static_cast<double>(dtype_size(w)), static_cast<double>(dtype_size(r)),
                           4 + op.num_states() * moment, offload != "none", false,
                           static_cast<double>(c.trainable_params), device_offload_fraction(cfg));
  c.per_rank.resize(static_cast<std::size_t>(n));
  std::mutex mu;

  auto body = [&](Communicator& comm) {
    // This configuration's comm_debug (the MPI world outlives it: set for each one).
    comm.set_debug(comm_options(cfg).debug);
    MemoryTracker tracker(comm.rank());
    if (o.memory_budget > 0) tracker.set_memory_budget(static_cast<std::size_t>(o.memory_budget));
    EngineOptions eo;
    eo.tracker = &tracker;
    Engine e(comm, cfg, eo);
    gpt::GptModel model(g, e.tracker());
    model.set_checkpointing(spec);
    model.declare(e);
    model.init(e, 1);
    std::vector<double> times, busy, wait;
    std::uint64_t sent = 0, cross = 0;  // over the measured steps, every communicator of the engine
    double loss = 0;
    for (int step = 0; step < o.steps; ++step) {
      if (step == 1) comm.reset_stats();  // the first step warms up (first touch, pools)
      const gpt::TokenBatch b = corpus.batch(gpt::Split::kTrain, o.batch, g.seq, comm.rank(),
                                             static_cast<std::uint64_t>(step), 0);
      comm.barrier();
      const auto t0 = Clock::now();
      loss = model.forward_backward(e, b);
      const StepResult r = e.step();
      comm.barrier();
      if (step_done && comm.rank() == 0) step_done(step + 1);
      if (step > 0) {
        times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        busy.push_back(r.metrics.comm_busy_s);
        wait.push_back(r.metrics.comm_wait_s);
        sent += r.metrics.comm_bytes_sent;
        cross += r.metrics.comm_cross_group_bytes_sent;
        if (metrics != nullptr) {
          std::lock_guard<std::mutex> lock(metrics->mu);
          metrics->out << "{\"config\":\"" << bench::label(c) << "\",\"rank\":" << comm.rank()
                       << ",\"step\":" << step + 1 << ",\"loss\":" << loss
                       << ",\"metrics\":" << to_json(r.metrics) << "}\n";
        }
      }
    }
    if (!trace_path.empty()) e.write_trace(trace_path);
    RankFigures f;
    f.rank = comm.rank();
    const MemoryTracker& t = e.tracker();
    for (std::size_t k = 0; k < kNumMemCategories; ++k) {
      for (std::size_t tier = 0; tier < kNumMemTiers; ++tier) {
        f.current[k][tier] = t.current(static_cast<MemCategory>(k), static_cast<MemTier>(tier));
        f.peak[k][tier] = t.peak(static_cast<MemCategory>(k), static_cast<MemTier>(tier));
      }
    }
    f.total_current = t.current_memory();
    f.total_peak = t.peak_memory();
    const Engine::Buffers bb = e.buffer_bytes();
    f.buffers = bb.in_flight_grads + bb.gathered_params;
    f.comm_bytes_per_step = static_cast<std::size_t>(sent / (o.steps - 1));
    f.cross_group_bytes_per_step = static_cast<std::size_t>(cross / (o.steps - 1));
    auto median_ms = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2] * 1e3;
    };
    f.step_ms = median_ms(times);
    f.comm_busy_ms = median_ms(busy);
    f.comm_wait_ms = median_ms(wait);
    f.last_loss = loss;
    comm.barrier();  // every engine still alive: the process RSS holds all ranks
    std::lock_guard<std::mutex> lock(mu);
    if (comm.rank() == 0) c.process_rss = process_memory().rss_bytes;
    c.per_rank[static_cast<std::size_t>(comm.rank())] = f;
  };
  if (mpi_world != nullptr) {
    body(*mpi_world);
    // Each process measured its own rank: all-gather every rank's figures (bits copied).
    const std::vector<std::uint64_t> mine =
        bench::pack(c.per_rank[static_cast<std::size_t>(mpi_world->rank())]);
    std::vector<std::uint64_t> all(mine.size() * static_cast<std::size_t>(n));
    mpi_world->all_gather(mine.data(), all.data(), mine.size() * 2, DType::kF32);
    for (int q = 0; q < n; ++q) {
      c.per_rank[static_cast<std::size_t>(q)] =
          bench::unpack(all.data() + static_cast<std::size_t>(q) * mine.size());
    }
  } else {
    ThreadGroup::run(n, body, cfg.comm_timeout_s);
  }
  return c;
}

// --trace FILE for one configuration: "trace.json" -> "trace.stage3-ckpt-sqrt.json".
std::string trace_file(const std::string& path, const ConfigFigures& c) {
  std::string tag = "stage" + std::to_string(c.stage);
  if (c.checkpoint != "none") tag += "-ckpt-" + c.checkpoint;
  if (c.offload != "none") tag += "-off-" + c.offload;
  if (c.hybrid > 0) tag += "-hsdp-" + std::to_string(c.hybrid);
  if (c.quantized) tag += "-int8";
  const std::size_t slash = path.find_last_of('/');
  const std::size_t dot = path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) {
    return path + "." + tag;
  }
  return path.substr(0, dot) + "." + tag + path.substr(dot);
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  ZERO_CHECK(out.good(), kIO, "cannot write '", path, "'");
  out << text;
  ZERO_CHECK(out.good(), kIO, "writing '", path, "' failed");
}

int plan_only(const Options& o) {
  const int n = o.ranks;
  if (o.params > 0) {
    std::printf("DESIGN.md model-state bytes per rank, Ψ = %.4g parameters, N = %d, K = 12\n",
                o.params, n);
    std::printf("(16-bit params and gradients, fp32 master + Adam moments; GB = 1e9 bytes)\n");
    std::printf("%-34s %12s %12s %12s %12s %12s\n", "configuration", "params", "gradients",
                "optimizer", "on device", "offloaded");
    for (int stage = 0; stage <= 3; ++stage) {
      for (int off = 0; off < (stage == 0 ? 1 : stage == 3 ? 3 : 2); ++off) {
        const FormulaBytes f = zero_formula(o.params, n, stage, 2, 2, 12, off >= 1, off >= 2);
        const char* names[] = {"", " + optimizer offload", " + optimizer & param offload"};
        char label[64];
        std::snprintf(label, sizeof label, "stage %d%s", stage, names[off]);
        std::printf("%-34s %9.2f GB %9.2f GB %9.2f GB %9.2f GB %9.2f GB\n", label, f.params / 1e9,
                    f.grads / 1e9, f.optimizer / 1e9, f.total() / 1e9, f.offloaded / 1e9);
      }
    }
    return 0;
  }
  gpt::GptConfig g = o.model;
  g.vocab = o.vocab > 0 ? o.vocab : gpt::CharCorpus::from_file(o.data).vocab_size();
  std::printf(
      "this engine, predicted per rank: GPT %d layers, dim %d, vocab %d, seq %d, batch %d"
      " per rank, N = %d, %s params, %s reduction; %zu parameters, %zu trainable\n",
      g.layers, g.dim, g.vocab, g.seq, o.batch, n, o.dtype.c_str(), o.reduce_dtype.c_str(),
      g.num_params(), g.trainable_params());
  std::printf("%-18s %12s %12s %12s %12s %12s %12s %12s  %s\n", "configuration", "params16",
              "master", "optimizer", "gradients", "comm buf", "activations", "total",
              "largest gathered unit");
  for (const std::string& off : o.offloads) {
    for (const std::string& ck : o.checkpoints) {
      for (int stage : o.stages) {
        if (off != "none" && stage == 0) continue;
        const Config cfg = make_config(o, stage, off);
        PlanInput pin;
        pin.units = gpt::model_units(g, cfg);
        pin.ranks = n;
        pin.config = cfg;
        const CheckpointSpec spec = CheckpointSpec::resolve(ck, cfg.activation_checkpointing);
        pin.gather_order = gpt::GptModel::gather_order(g, spec);
        pin.grads_held = gpt::GptModel::grads_held(g);
        const PlanResult p = plan_engine_memory(pin);
        MemoryTracker t;
        gpt::GptModel m(g, t);
        const std::size_t act = m.activation_bytes(o.batch, g.seq, spec);
        const std::size_t other = m.workspace_bytes(o.batch, g.seq);
        auto mib = [](std::size_t b) { return static_cast<double>(b) / 1048576.0; };
        char label[64];
        std::snprintf(label, sizeof label, "stage %d%s%s", stage,
                      ck == "none" ? "" : (" +" + ck).c_str(),
                      off == "none" ? "" : (" +" + off).c_str());
        std::size_t nvme = 0, pinned = 0;
        for (std::size_t k = 0; k < kNumMemCategories; ++k) {
          nvme += p.nvme[k];
          pinned += p.pinned[k];
        }
        std::printf(
            "%-18s %8.2f MiB %8.2f MiB %8.2f MiB %8.2f MiB %8.2f MiB %8.2f MiB %8.2f MiB  %s (%zu "
            "elements)%s\n",
            label, mib(p.at(MemCategory::kParams16)), mib(p.at(MemCategory::kMasterParams)),
            mib(p.at(MemCategory::kOptimizerState)), mib(p.at(MemCategory::kGradients)),
            mib(p.at(MemCategory::kCommBuffers)), mib(act), mib(p.total() + act + other),
            p.largest_unit_name.c_str(), p.largest_unit,
            off == "none" ? ""
                          : ("; of it pinned " + std::to_string(mib(pinned)).substr(0, 8) +
                             " MiB; NVMe files " + std::to_string(mib(nvme)).substr(0, 8) + " MiB")
                                .c_str());
      }
    }
  }
  MemoryTracker scratch;
  const gpt::GptModel shape(g, scratch);
  std::printf("(total includes the trainer's workspace: %.2f MiB)\n",
              static_cast<double>(shape.workspace_bytes(o.batch, g.seq)) / 1048576.0);
  return 0;
}

int run(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
  }
  const Options o = parse(argc, argv);
  if (o.plan) return plan_only(o);
  // Files written during or after the run: a directory that is not there fails now.
  for (const auto& [path, flag] :
       {std::pair{o.json, "--json"}, std::pair{o.csv, "--csv"}, std::pair{o.svg, "--svg"},
        std::pair{o.trace, "--trace"}, std::pair{o.metrics, "--metrics"}}) {
    if (!path.empty()) common::require_directory_of(path, flag);
  }
  const gpt::CharCorpus corpus = gpt::CharCorpus::from_file(o.data);
  // Under mpirun / srun / torchrun: the ranks are processes; otherwise in-process threads.
  std::unique_ptr<Communicator> world;
  if (detect_launch().size > 1) {
    world = make_communicator(CommOptions{});
  }
  const bool printer = world == nullptr || world->rank() == 0;
  std::unique_ptr<MetricsLog> metrics;
  if (!o.metrics.empty()) {
    metrics = std::make_unique<MetricsLog>();
    // Under a launcher every process writes its own rank's lines to a file of its own.
    const std::string path =
        world == nullptr ? o.metrics : o.metrics + ".rank" + std::to_string(world->rank());
    metrics->out.open(path, std::ios::trunc);
    ZERO_CHECK(metrics->out.good(), kIO, "--metrics: cannot write '", path, "'");
  }
  std::vector<ConfigFigures> all;
  std::map<std::string, double> stage0_ms;  // by checkpointing policy, without offload
  // The configurations to run, each one's config built now: a bad --config / --set fails at
  // once (one line on stderr), not after the configurations before it ran.
  std::vector<ConfigFigures> kinds;
  auto add_kind = [&](int stage, const std::string& ck, const std::string& off, int hybrid,
                      bool quantized = false, bool comm_debug = false) {
    ConfigFigures k;
    k.stage = stage;
    k.checkpoint = ck;
    k.offload = off;
    k.hybrid = hybrid;
    k.quantized = quantized;
    k.comm_debug = comm_debug;
    (void)make_config(o, stage, off, hybrid, quantized, comm_debug);
    kinds.push_back(std::move(k));
  };
  for (const std::string& off : o.offloads) {
    for (const std::string& ck : o.checkpoints) {
      for (int stage : o.stages) {
        if (off != "none" && stage == 0) continue;  // offload needs a sharded optimizer
        // The step during backward needs the gradient partition on the host (stages 2-3).
        if (bench::parse_offload(off).overlap_step && stage < 2) continue;
        add_kind(stage, ck, off, 0);
        // The fingerprint check's cost: the same configuration again at once, with it on.
        if (o.comm_debug) add_kind(stage, ck, off, 0, false, true);
      }
    }
  }
  if (o.hybrid > 0) {  // hybrid sharding shards stages 1-3, without offload here
    for (const std::string& ck : o.checkpoints) {
      for (int stage : o.stages) {
        if (stage > 0) add_kind(stage, ck, "none", o.hybrid);
      }
    }
  }
  if (o.quantized) {  // ZeRO++ quantizes stage 3's collectives: flat, and hybrid with --hybrid
    for (const std::string& ck : o.checkpoints) {
      add_kind(3, ck, "none", 0, true);
      if (o.hybrid > 0) add_kind(3, ck, "none", o.hybrid, true);
    }
  }
  // Budgets at start (zero/engine/fit.hpp): every configuration's planned bytes — the engine's
  // placement for the model, the model's activations and workspace, times the ranks of this process
  // — against --memory-budget per rank or what the machine has left; one that cannot fit refuses
  // the run before anything is allocated, naming it, the tier, the shortfall and what fits.
  {
    // In-process ranks: first the threads they take (one short line), then their memory.
    if (world == nullptr) ThreadGroup::check_size(o.ranks, "--ranks");
    const int world_size = world != nullptr ? world->size() : o.ranks;
    const int local = world != nullptr ? std::max(detect_launch().local_size, 1) : o.ranks;
    gpt::GptConfig g = o.model;
    g.vocab = corpus.vocab_size();
    MemoryBudget budget = machine_budget(Device::cpu(), o.nvme_path);
    if (o.memory_budget > 0) {
      const auto b = static_cast<std::size_t>(o.memory_budget);
      budget.host = b * static_cast<std::size_t>(local);
      budget.host_from =
          "--memory-budget " + format_bytes(b) + " per rank x " + std::to_string(local) + " ranks";
    }
    std::string refused;
    for (const ConfigFigures& kind : kinds) {
      const Config cfg =
          make_config(o, kind.stage, kind.offload, kind.hybrid, kind.quantized, kind.comm_debug);
      const gpt::FitResult r = gpt::check_fit(
          g, cfg, CheckpointSpec::resolve(kind.checkpoint, cfg.activation_checkpointing), o.batch,
          world_size, local, budget, /*device_is_host=*/true, o.nvme_path);
      if (!r.fits()) {
        refused += (refused.empty() ? " " : "; ") + bench::label(kind) + ": " +
                   r.message([&](const gpt::FitCandidate& c) {
                     std::string f = "--stages " + std::to_string(c.stage) + " --checkpoint " +
                                     (c.checkpoint.empty() ? kind.checkpoint : c.checkpoint);
                     if (c.nvme_optimizer) f += " --offload nvme --nvme-path " + c.nvme_dir;
                     if (c.nvme_params) f += " --set zero_optimization.offload_param.device=nvme";
                     return f;
                   });
      }
    }
    if (!refused.empty()) {
      ZERO_THROW(kOutOfMemory,
                 "configurations that cannot fit (leave them out with --stages / "
                 "--checkpoint / --offload, or lower the model or batch):",
                 refused);
    }
  }
  const int total = static_cast<int>(kinds.size());
  // How far the run is (the printing rank): a status line on a terminal, one line per
  // configuration elsewhere. Runs per configuration: measured, and with --trace traced, then
  // untraced again (the traced run's baseline is the mean of the two around it).
  common::Progress progress("zero-bench", printer && o.progress);
  const int runs = o.trace.empty() ? 1 : 3;
  int index = 0;  // of the configuration running, from 1
  for (const ConfigFigures& kind : kinds) {
    ++index;
    const std::string name = bench::label(kind);
    const std::string of = std::to_string(index) + "/" + std::to_string(total);
    progress.milestone("configuration " + of + ": " + name);
    auto step_done = [&](int run) {  // run 0: measured, 1: traced, 2: untraced again
      return [&, run](int steps) {
        progress.update(
            "configuration " + of + " (" + name +
                (run == 1   ? ", traced"
                 : run == 2 ? ", untraced again"
                            : "") +
                ") step " + std::to_string(steps) + "/" + std::to_string(o.steps),
            ((index - 1) * runs + run + static_cast<double>(steps) / o.steps) / (total * runs));
      };
    };
    step_done(0)(0);
    ConfigFigures c = run_config(o, corpus, kind, world.get(), "", metrics.get(), step_done(0));
    if (!o.trace.empty()) {  // the same configuration again, traced: the tracing's cost
      const std::string path = trace_file(o.trace, c);
      const ConfigFigures t = run_config(o, corpus, kind, world.get(), path, nullptr, step_done(1));
      const ConfigFigures again =
          run_config(o, corpus, kind, world.get(), "", nullptr, step_done(2));
      for (std::size_t q = 0; q < c.per_rank.size(); ++q) {
        c.per_rank[q].traced_step_ms = t.per_rank[q].step_ms;
        c.per_rank[q].untraced_step_ms = (c.per_rank[q].step_ms + again.per_rank[q].step_ms) / 2;
      }
      const common::Progress::Pause pause(progress);
      if (printer) {
        std::printf("[zero-bench] timeline of %s: %s\n", bench::label(c).c_str(), path.c_str());
      }
    }
    if (kind.stage == 0 && kind.offload == "none" && !kind.comm_debug) {
      stage0_ms[kind.checkpoint] = c.per_rank.front().step_ms;
    }
    c.step_ms_stage0 = stage0_ms[kind.checkpoint];
    {
      const common::Progress::Pause pause(progress);
      if (printer) std::printf("%s", bench::format_config(c).c_str());
      std::fflush(stdout);
    }
    all.push_back(std::move(c));
  }
  progress.finish();
  if (!printer) return 0;
  std::printf("%s", bench::format_summary(all).c_str());
  if (!o.json.empty()) write_file(o.json, bench::to_json(all));
  if (!o.csv.empty()) write_file(o.csv, bench::to_csv(all));
  if (!o.svg.empty()) write_file(o.svg, bench::to_svg(all));
  return 0;
}

}  // namespace

int main(int argc, char** argv) try { return run(argc, argv); } catch (...) {
  return zero::report_exception("zero-bench");
}
