// zero-train — trains the GPT-style decoder (apps/gpt) with the ZeRO engine, character by
// character, on a text file (default: the GPL-3 text every Debian machine has).
//
//   zero-train [--zero-stage S] [--ranks N] [--config ds.json] [--set key=value]...
//              [--layers L] [--dim D] [--heads H] [--seq T] [--batch B] [--steps K]
//              [--dtype f32|bf16|f16] [--grad-accum A] [--lr X] [--checkpoint-activations [P]]
//              [--data FILE] [--eval-every K] [--seed S]
//              [--offload-optimizer none|cpu|nvme] [--offload-param none|cpu|nvme]
//              [--nvme-path DIR] [--memory-budget BYTES] [--device cpu|cuda]
//              [--save-dir DIR [--save-every K] [--keep K] [--save-async]] [--resume [DIR]]
//              [--trace FILE] [--metrics FILE] [--peak-flops F] [--plot FILE] [--no-progress]
//
// Ranks: --ranks N runs N in-process ranks (threads); launched by mpirun / srun / torchrun the
// ranks are the processes. Per step it prints: step, loss, tokens/s, lr, grad norm, loss scale,
// and rank 0's tracked memory (current / peak). On a terminal, stderr holds one status line (step,
// steps/s, ETA) under those lines; --plot FILE draws the loss curves as an SVG chart.
//
// --device cuda (a build with ZERO_WITH_CUDA): the model runs on a GPU (GptCudaModel), the
// engine on the same GPU and stream, over NCCL; one rank per process and one GPU per rank
// (--ranks 1, or one process per GPU under mpirun / srun / torchrun: GPU = the local rank).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#if defined(ZERO_GPT_WITH_CUDA)
#include <cuda_runtime.h>

#include "gpt/gpt_cuda.hpp"
#endif
#include "common/files.hpp"
#include "common/progress.hpp"
#include "gpt/gpt_cost.hpp"
#include "gpt/gpt_fit.hpp"
#include "gpt/gpt_flags.hpp"
#include "gpt/gpt_model.hpp"
#include "train/train_options.hpp"
#include "train/train_report.hpp"
#include "zero/ckpt/ckpt.hpp"
#include "zero/comm/comm.hpp"
#include "zero/config/comm_config.hpp"
#include "zero/config/config.hpp"
#include "zero/core/error.hpp"
#include "zero/device/memory_report.hpp"
#include "zero/engine/activation_checkpointing.hpp"
#include "zero/engine/engine.hpp"
#include "zero/engine/fit.hpp"

namespace {

using namespace zero;
using Clock = std::chrono::steady_clock;
using train::bad;
using train::Options;

// Where a rank computes: the CPU (GptModel, any communicator), or one GPU (GptCudaModel; the
// engine and the NCCL communicator on `stream`, a cudaStream_t).
struct Placement {
  Device device = Device::cpu();
  void* stream = nullptr;
};

#if defined(ZERO_GPT_WITH_CUDA)
void cuda_ok(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) {
    ZERO_THROW(kCuda, "zero-train --device cuda: ", what, ": ", cudaGetErrorName(rc), ": ",
               cudaGetErrorString(rc));
  }
}
#endif

// The mean of x over the ranks. NCCL reduces device memory only: on a GPU, x goes through
// `scratch` (one float on the device).
float mean_over_ranks(Communicator& comm, float x, const Placement& where, const Buffer& scratch) {
  if (!where.device.is_cuda()) {
    comm.all_reduce(&x, &x, 1, DType::kF32, ReduceOp::kAvg);
    return x;
  }
#if defined(ZERO_GPT_WITH_CUDA)
  const auto stream = static_cast<cudaStream_t>(where.stream);
  cuda_ok(cudaMemcpyAsync(scratch.data(), &x, sizeof(float), cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync (loss to the device)");
  comm.all_reduce(scratch.data(), scratch.data(), 1, DType::kF32, ReduceOp::kAvg);
  cuda_ok(cudaMemcpyAsync(&x, scratch.data(), sizeof(float), cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync (loss to the host)");
  cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
#endif
  return x;
}

// One rank's training. `make_model(config, tracker)` returns the model (a unique_ptr to
// GptModel or GptCudaModel: the same surface).
template <typename MakeModel>
void train_rank(Communicator& comm, const Options& o, const Config& cfg,
                const gpt::CharCorpus& corpus, std::mutex& print, std::ostream* metrics,
                const Placement& where, MakeModel&& make_model) {
  gpt::GptConfig g = o.model;
  g.vocab = corpus.vocab_size();
  // Every rank's memory (all tiers but NVMe files) capped at --memory-budget: an allocation past
  // it is an error naming the rank and the bytes.
  MemoryTracker tracker(comm.rank());
  tracker.set_memory_budget(static_cast<std::size_t>(o.memory_budget));
  EngineOptions eo;
  eo.tracker = &tracker;
  eo.device = where.device;
  eo.cuda_stream = where.stream;
  Engine e(comm, cfg, eo);
  // The engine resolved the batch keys for this world size (derived the one not given, checked
  // train_batch_size): the micro batch and the accumulation are its.
  const Config& run_cfg = e.config();
  ZERO_CHECK(run_cfg.train_micro_batch_size_per_gpu <= (1 << 20), kConfig,
             "train_micro_batch_size_per_gpu = ", run_cfg.train_micro_batch_size_per_gpu,
             ": zero-train takes at most 2^20 sequences per micro-step");
  ZERO_CHECK(run_cfg.gradient_accumulation_steps <= (1 << 20), kConfig,
             "gradient_accumulation_steps = ", run_cfg.gradient_accumulation_steps,
             ": zero-train takes at most 2^20 micro-steps per step");
  const int batch = static_cast<int>(run_cfg.train_micro_batch_size_per_gpu);
  const Buffer loss_scratch = where.device.is_cuda() ? Buffer::device(tracker, MemCategory::kOther,
                                                                      sizeof(float), where.device)
                                                     : Buffer();
  auto model_ptr = make_model(g, e.tracker());
  auto& model = *model_ptr;
  const CheckpointSpec ckpt_spec =
      CheckpointSpec::resolve(o.checkpoint, cfg.activation_checkpointing);
  const std::string ckpt_text =
      ckpt_spec.to_string() + (ckpt_spec.cpu_checkpointing ? " (cpu_checkpointing)" : "");
  model.set_checkpointing(ckpt_spec);
  model.declare(e);
  model.init(e, o.seed);
  const bool printer = comm.rank() == 0;
  if (printer) {
    std::lock_guard<std::mutex> lock(print);
    std::printf(
        "zero-train: %zu parameters (%d layers, dim %d, %d heads, seq %d, vocab %d), "
        "stage %d, %d ranks (%s) on %s, %s, batch %d x %d per rank, accumulation %lld, "
        "checkpointing %s; unigram entropy of the corpus %.3f nats\n",
        g.num_params(), g.layers, g.dim, g.heads, g.seq, g.vocab, e.stage(), comm.size(),
        std::string(comm.backend()).c_str(), where.device.to_string().c_str(),
        std::string(to_string(e.param_dtype())).c_str(), batch, g.seq,
        static_cast<long long>(run_cfg.gradient_accumulation_steps), ckpt_text.c_str(),
        corpus.unigram_entropy());
    // The fp32 master and Adam moments of this rank's shards, wherever they are.
    const std::size_t opt =
        tracker.current(MemCategory::kMasterParams) + tracker.current(MemCategory::kOptimizerState);
    std::printf(
        "rank 0: optimizer state (fp32 master + moments) %s, of it in NVMe files %s; "
        "memory budget %s\n",
        format_bytes(opt).c_str(),
        format_bytes(tracker.current(MemCategory::kMasterParams, MemTier::kNvme) +
                     tracker.current(MemCategory::kOptimizerState, MemTier::kNvme))
            .c_str(),
        o.memory_budget > 0 ? format_bytes(static_cast<std::size_t>(o.memory_budget)).c_str()
                            : "none");
  }
  // Resume: the engine's state from the checkpoint (any world size and stage), the data
  // position from the trainer's bytes ("step=<k> seed=<s>": the batches are a function of both).
  int first = 0;
  if (o.resume) {
    const ckpt::LoadResult lr = ckpt::load(e, o.resume_dir.empty() ? o.save_dir : o.resume_dir);
    unsigned long long seed = 0;
    if (std::sscanf(lr.trainer_state.c_str(), "step=%d seed=%llu", &first, &seed) != 2) {
      ZERO_THROW(kCorruption, "zero-train --resume: '", lr.path,
                 "' holds no zero-train data position (trainer.bin: '",
                 lr.trainer_state.substr(0, 60), "')");
    }
    if (seed != o.seed) {
      bad("--resume: the checkpoint was trained with --seed " + std::to_string(seed) + ", not " +
          std::to_string(o.seed));
    }
    if (printer) {
      std::lock_guard<std::mutex> lock(print);
      std::printf("resumed from %s: step %d (saved by %d ranks at stage %d)\n", lr.path.c_str(),
                  first, lr.saved_world_size, lr.saved_stage);
    }
  }
  std::unique_ptr<ckpt::Saver> saver;
  if (!o.save_dir.empty()) {
    saver = std::make_unique<ckpt::Saver>(
        e, ckpt::SaveOptions{.dir = o.save_dir, .keep = o.keep, .async = o.save_async});
  }
  const auto accum = static_cast<int>(run_cfg.gradient_accumulation_steps);
  // Skipped steps (non-finite gradients: fp16 overflow, or a learning rate that diverged): a
  // warning after kSkipWarn in a row, an error when every step of the run was skipped.
  constexpr int kSkipWarn = 10;
  int skipped_in_a_row = 0, ran = 0;
  train::LossPlot plot;
  if (printer && !o.plot.empty()) {
    plot.path = o.plot;
    plot.title = "zero-train: loss, stage " + std::to_string(e.stage()) + ", " +
                 std::to_string(comm.size()) + (comm.size() == 1 ? " rank, " : " ranks, ") +
                 std::to_string(g.num_params()) + " parameters (" + std::to_string(g.layers) +
                 " layers, dim " + std::to_string(g.dim) + ", seq " + std::to_string(g.seq) +
                 "), " + std::string(to_string(e.param_dtype()));
    const ZeroOptimizationConfig& z = run_cfg.zero_optimization;
    if (e.stage() == 3 && (z.zero_quantized_weights || z.zero_quantized_gradients)) {
      plot.title += std::string(", ") +
                    (z.zero_quantized_weights && z.zero_quantized_gradients
                         ? "qwZ + qgZ"
                         : (z.zero_quantized_weights ? "qwZ" : "qgZ")) +
                    " (int8, block " + std::to_string(z.quantization_block_size) + ")";
    }
    if (e.optimizer_params().state_dtype() != MomentDType::kF32) {
      plot.title +=
          ", " + std::string(to_string(e.optimizer_params().state_dtype())) + " optimizer moments";
    }
    if (!o.plot_against.empty()) {
      plot.against = train::read_loss_curve(o.plot_against);
      plot.against_name = o.plot_against;
    }
  }
  // The status line (a terminal's stderr, the printing rank): steps done, pace and ETA; cleared
  // while a line goes to stdout (Pause, under `print`).
  common::Progress progress("zero-train", printer && o.progress);
  progress.update("step " + std::to_string(first) + "/" + std::to_string(o.steps), 0);
  for (int step = first; step < o.steps; ++step) {
    const auto t0 = Clock::now();
    double loss = 0;
    StepResult r;
    for (int m = 0; m < accum; ++m) {
      const gpt::TokenBatch b =
          corpus.batch(gpt::Split::kTrain, batch, g.seq, comm.rank(),
                       static_cast<std::uint64_t>(step), static_cast<std::uint64_t>(m), o.seed);
      loss += model.forward_backward(e, b) / accum;
      r = e.step();
    }
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    ++ran;
    skipped_in_a_row = r.applied ? 0 : skipped_in_a_row + 1;
    if (printer && skipped_in_a_row == kSkipWarn) {
      std::lock_guard<std::mutex> lock(print);
      const common::Progress::Pause pause(progress);
      std::fprintf(stderr,
                   "zero-train: warning: %d steps in a row skipped for non-finite gradients "
                   "(step %d, lr %.3g, loss scale %g): check optimizer.params.lr and fp16\n",
                   kSkipWarn, step + 1, r.lr, r.loss_scale);
    }
    // The mean loss over ranks (every rank prints the same number).
    const float l = mean_over_ranks(comm, static_cast<float>(loss), where, loss_scratch);
    // Throughput of the whole job (every rank's tokens in this rank's step time), and model
    // FLOP/s per rank against --peak-flops (MFU).
    const double tokens = static_cast<double>(batch) * g.seq * accum * comm.size();
    const double flops_per_rank = tokens * gpt::model_flops_per_token(g) / comm.size() / secs;
    const double mfu = o.peak_flops > 0 ? flops_per_rank / o.peak_flops : 0.0;
    if (printer) {
      if (!plot.path.empty()) plot.train.push_back({static_cast<double>(step + 1), l});
      char mfu_text[32] = "";
      if (mfu > 0) std::snprintf(mfu_text, sizeof mfu_text, " (MFU %.2f%%)", 100 * mfu);
      std::lock_guard<std::mutex> lock(print);
      const common::Progress::Pause pause(progress);
      std::printf(
          "step %5d | loss %.4f | %8.0f tok/s | %.3g model FLOP/s/rank%s | exposed comm %.0f%% | "
          "lr %.3e | grad norm %8.4f | scale %g%s | rank 0 memory %s (peak %s)\n",
          step + 1, l, tokens / secs, flops_per_rank, mfu_text,
          r.metrics.window_s > 0 ? 100 * r.metrics.comm_wait_s / r.metrics.window_s : 0.0, r.lr,
          r.grad_norm, r.loss_scale, r.applied ? "" : " (skipped)",
          format_bytes(e.tracker().current_memory()).c_str(),
          format_bytes(e.tracker().peak_memory()).c_str());
      std::fflush(stdout);
      if (progress.on_terminal()) {
        const int done = step + 1 - first, todo = o.steps - first;
        const double rate = done / std::max(progress.elapsed_s(), 1e-9);
        char status[96];
        std::snprintf(status, sizeof status,
                      rate >= 1 ? "step %d/%d, %.1f step/s" : "step %d/%d, %.2g s/step", step + 1,
                      o.steps, rate >= 1 ? rate : 1 / rate);
        progress.update(status, static_cast<double>(done) / todo);
      }
    }
    if (metrics != nullptr) {
      const std::string line = train::metrics_line({.step = step + 1,
                                                    .rank = comm.rank(),
                                                    .loss = l,
                                                    .rank_loss = loss,
                                                    .step_s = secs,
                                                    .tokens = tokens,
                                                    .flops_per_rank = flops_per_rank,
                                                    .mfu = mfu,
                                                    .lr = r.lr,
                                                    .grad_norm = r.grad_norm,
                                                    .applied = r.applied},
                                                   e.tracker(), r.metrics);
      std::lock_guard<std::mutex> lock(print);
      *metrics << line << '\n';
      metrics->flush();
    }
    if (saver && ((o.save_every > 0 && (step + 1) % o.save_every == 0) || step + 1 == o.steps)) {
      const auto s0 = Clock::now();
      const ckpt::SaveInfo info =
          saver->save("step=" + std::to_string(step + 1) + " seed=" + std::to_string(o.seed));
      const double stall = std::chrono::duration<double>(Clock::now() - s0).count();
      if (printer) {
        std::lock_guard<std::mutex> lock(print);
        const common::Progress::Pause pause(progress);
        std::printf("save  %5d | %s | rank 0 wrote %s | step stall %.3f s%s\n", step + 1,
                    info.path.c_str(), format_bytes(info.bytes).c_str(), stall,
                    o.save_async ? " (asynchronous: written in the background)" : "");
      }
    }
    if (o.eval_every > 0 && ((step + 1) % o.eval_every == 0 || step + 1 == o.steps)) {
      const gpt::TokenBatch vb = corpus.batch(gpt::Split::kVal, batch, g.seq, comm.rank(), 0, 0, 7);
      const float vl =
          mean_over_ranks(comm, static_cast<float>(model.forward_loss(e, vb)), where, loss_scratch);
      if (printer) {
        if (!plot.path.empty()) plot.val.push_back({static_cast<double>(step + 1), vl});
        std::lock_guard<std::mutex> lock(print);
        const common::Progress::Pause pause(progress);
        std::printf("eval  %5d | validation loss %.4f\n", step + 1, vl);
      }
    }
  }
  progress.finish();
  if (!plot.path.empty()) {
    plot.write();
    std::lock_guard<std::mutex> lock(print);
    std::printf("loss curves (SVG): %s\n", plot.path.c_str());
    if (!plot.against.empty()) {
      const double mine = train::final_loss(plot.train), theirs = train::final_loss(plot.against);
      std::printf("final training loss (mean of the last 10 steps) %.4f, %s %.4f: %+.2f%%\n", mine,
                  plot.against_name.c_str(), theirs, 100.0 * (mine - theirs) / theirs);
    }
  }
  if (saver) saver->wait();
  if (e.tracer() != nullptr) {  // --trace / trace.enabled: every rank's timeline, one file
    e.write_trace(run_cfg.trace.path);
    if (printer) {
      std::lock_guard<std::mutex> lock(print);
      std::printf(
          "timeline (Chrome trace JSON, https://ui.perfetto.dev): %s%s\n",
          run_cfg.trace.path.c_str(),
          comm.backend() == "nccl" ? " (one file per rank: .rank<r> before the extension)" : "");
    }
  }
  // A skipped step leaves the parameters as they were: once every step skips (parameters or
  // gradients gone non-finite: a learning rate that diverged), none will train again. A run
  // that ends in kSkipWarn or more skipped steps, or skipped all of them, did not train.
  if (ran > 0 && (skipped_in_a_row == ran || skipped_in_a_row >= kSkipWarn)) {
    ZERO_THROW(kConfig, "every step was skipped from step ", o.steps - skipped_in_a_row + 1,
               " on (", skipped_in_a_row, " of ", ran, " steps; non-finite gradients, lr ",
               run_cfg.optimizer.lr,
               "): the model does not train; check optimizer.params.lr and the fp16 loss scale");
  }
  if (printer) {
    std::lock_guard<std::mutex> lock(print);
    std::printf("%s", e.memory_report().table().c_str());
  }
}

// Budgets at start (zero/engine/fit.hpp): the run's planned bytes per tier — the engine's placement
// for the model's units, the model's activations and workspace — times the ranks of this process,
// against --memory-budget per rank or else what the machine has left (host memory under the
// memory cgroup, the device's free memory); refused before any rank allocates, naming the tier,
// the shortfall and a configuration that fits.
void check_fits(const Options& o, const Config& cfg, const gpt::CharCorpus& corpus, int world,
                int local, const Device& device) {
  gpt::GptConfig g = o.model;
  g.vocab = corpus.vocab_size();
  const Config run = cfg.resolve_batch(world);
  const CheckpointSpec spec = CheckpointSpec::resolve(o.checkpoint, cfg.activation_checkpointing);
  const std::string& nvme = cfg.zero_optimization.offload_optimizer.nvme_path;
  const std::string nvme_dir = nvme.empty() ? "/tmp" : nvme;
  MemoryBudget budget = machine_budget(device, nvme_dir);
  if (o.memory_budget > 0) {  // the tracker's cap: every rank's memory, all tiers but NVMe
    const auto b = static_cast<std::size_t>(o.memory_budget);
    const std::string from = "--memory-budget " + format_bytes(b) + " per rank";
    if (device.is_cuda()) {
      budget.device = b;
      budget.device_from = from;
    } else {
      budget.host = b * static_cast<std::size_t>(local);
      budget.host_from = from + " x " + std::to_string(local) + " ranks";
    }
  }
  const gpt::FitResult r =
      gpt::check_fit(g, run, spec, static_cast<int>(run.train_micro_batch_size_per_gpu), world,
                     local, budget, !device.is_cuda(), nvme_dir);
  if (!r.fits()) {
    ZERO_THROW(kOutOfMemory, "the run ", r.message([](const gpt::FitCandidate& c) {
      std::string f = "--zero-stage " + std::to_string(c.stage);
      if (!c.checkpoint.empty()) f += " --checkpoint-activations " + c.checkpoint;
      if (c.nvme_optimizer) f += " --offload-optimizer nvme";
      if (c.nvme_params) f += " --offload-param nvme";
      if (c.nvme_optimizer || c.nvme_params) f += " --nvme-path " + c.nvme_dir;
      return f;
    }));
  }
}

std::unique_ptr<gpt::GptModel> make_cpu_model(const gpt::GptConfig& g, MemoryTracker& tracker) {
  return std::make_unique<gpt::GptModel>(g, tracker);
}

#if defined(ZERO_GPT_WITH_CUDA)
// --device cuda: this process is one rank on GPU <local rank>, with its own compute stream
// shared by the model, the engine and the NCCL communicator.
void train_on_gpu(const Options& o, const Config& cfg, const gpt::CharCorpus& corpus,
                  std::mutex& print, std::ostream* metrics) {
  const LaunchInfo launch = detect_launch();
  if (launch.size == 1 && o.ranks != 1) {
    bad("--device cuda runs one rank per process and one GPU per rank: use --ranks 1, or start "
        "one process per GPU with mpirun / srun / torchrun");
  }
  const int gpu = launch.local_rank;
  cuda_ok(cudaSetDevice(gpu), "cudaSetDevice");
  check_fits(o, cfg, corpus, launch.size, 1, Device::cuda(gpu));
  struct Stream {  // destroyed after the communicator, the engine and the model
    cudaStream_t s = nullptr;
    ~Stream() {
      if (s != nullptr) cudaStreamDestroy(s);
    }
  } stream;
  cuda_ok(cudaStreamCreate(&stream.s), "cudaStreamCreate");
  CommOptions co;
  co.backend = "nccl";
  co.cuda_stream = stream.s;
  co.device = gpu;
  auto comm = make_communicator(cfg, co);
  const Placement where{Device::cuda(gpu), stream.s};
  train_rank(*comm, o, cfg, corpus, print, metrics, where,
             [&](const gpt::GptConfig& g, MemoryTracker& tracker) {
               return std::make_unique<gpt::GptCudaModel>(g, tracker, gpu, stream.s);
             });
}
#endif

int run(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(train::kUsage, stdout);
      return 0;
    }
  }
  const Options o = train::parse(argc, argv);
  const Config cfg = train::make_config(o);
  // Files written at the end of the run: a directory that is not there fails now, not after it.
  if (!o.plot.empty()) common::require_directory_of(o.plot, "--plot");
  if (!o.plot_against.empty()) (void)train::read_loss_curve(o.plot_against);  // fail now
  if (cfg.trace.enabled) {
    common::require_directory_of(cfg.trace.path, "--trace / config key 'trace.path'");
  }
  const gpt::CharCorpus corpus = gpt::CharCorpus::from_file(o.data);
  std::mutex print;
  // --metrics: in-process ranks share one file (lines under the print lock); under a launcher
  // each process writes its own, FILE.rank<r>.
  std::ofstream metrics_file;
  std::ostream* metrics = nullptr;
  if (!o.metrics.empty()) {
    const LaunchInfo launch = detect_launch();
    const std::string path =
        launch.size > 1 ? o.metrics + ".rank" + std::to_string(launch.rank) : o.metrics;
    metrics_file.open(path, std::ios::trunc);
    ZERO_CHECK(metrics_file.good(), kIO, "--metrics: cannot write '", path, "'");
    metrics = &metrics_file;
  }
#if defined(ZERO_GPT_WITH_CUDA)
  if (o.device == "cuda") {
    train_on_gpu(o, cfg, corpus, print, metrics);
    return 0;
  }
#endif
  if (const LaunchInfo launch = detect_launch(); launch.size > 1) {
    // mpirun / srun / torchrun: this process is one rank, sharing the node with local_size.
    check_fits(o, cfg, corpus, launch.size, std::max(launch.local_size, 1), Device::cpu());
    auto comm = make_communicator(cfg);
    train_rank(*comm, o, cfg, corpus, print, metrics, Placement{}, make_cpu_model);
    return 0;
  }
  // In-process ranks: first the threads they take (one short line), then their memory.
  ThreadGroup::check_size(o.ranks, "--ranks");
  check_fits(o, cfg, corpus, o.ranks, o.ranks, Device::cpu());
  ThreadGroup::run(
      o.ranks,
      [&](Communicator& comm) {
        train_rank(comm, o, cfg, corpus, print, metrics, Placement{}, make_cpu_model);
      },
      cfg.comm_timeout_s);
  return 0;
}

}  // namespace

// Any exception (a zero::Error, a std::exception from a library, anything else) is one line on
// stderr and exit status 2, never an abort.
int main(int argc, char** argv) try { return run(argc, argv); } catch (...) {
  return zero::report_exception("zero-train");
}
