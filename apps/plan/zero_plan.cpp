// zero-plan: the fastest configuration that provably fits, chosen before a single allocation
// (zero/plan/choose.hpp), and why each other one lost.
//
//   zero-plan --profile machine.json [--layers L --dim D --heads H --seq T | --units FILE |
//             --safetensors PATH [--unit-pattern REGEX] [--activation-bytes B] [--seq T]]
//             [--batch B] [--ranks N] [--ranks-per-node K] [--device cpu|cuda]
//             [--host-memory B] [--device-memory B] [--nvme-path DIR] [--nvme-capacity B]
//             [--config ds.json] [--set key=value]... [--margin F] [--stages 0,1,2,3]
//             [--moment-dtypes f32,bf16,int8] [--max-live 1000000000,0] [--hybrid none,node]
//             [--quantized none,weights,gradients,both] [--top K] [--all]
//             [--write-config FILE] [--report FILE]
//
// The model: the GPT trainer's shape (apps/gpt: its units, activations and workspace from its
// own accounting), a JSON list of units (plan/plan_model.hpp), or a safetensors file / Hugging
// Face sharded set read from its headers alone (zero/plan/choose.hpp units_from_safetensors: a unit
// per layer prefix by default, --unit-pattern to group otherwise; activations declared with
// --activation-bytes, FLOPs 6 x parameters x batch x seq). The written config is the
// DeepSpeed JSON zero-train --config takes (micro batch, stage, tiers, moment dtype, buckets,
// stage-3 prefetch, max-live and persistence, activation_checkpointing.number_checkpoints; across
// nodes (--ranks-per-node below --ranks) hybrid_shard_size and zero_quantized_weights /
// _gradients).
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "gpt/gpt_flags.hpp"
#include "gpt/gpt_model.hpp"
#include "plan/plan_model.hpp"
#include "zero/config/config.hpp"
#include "zero/core/error.hpp"
#include "zero/device/memory_report.hpp"
#include "zero/plan/choose.hpp"
#include "zero/plan/profile.hpp"

namespace {

using namespace zero;

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string x; std::getline(in, x, ',');) {
    if (!x.empty()) out.push_back(x);
  }
  return out;
}

std::string secs(double s) {
  char b[32];
  std::snprintf(b, sizeof b, s < 1e-3 ? "%.3g ms" : "%.4g s", s < 1e-3 ? s * 1e3 : s);
  return b;
}

std::string time_text(const Candidate& c) {
  if (!c.untimed.empty()) return "untimed (" + c.untimed + ")";
  return secs(c.time.total()) + " = compute " + secs(c.time.compute) + " + comm " +
         secs(c.time.comm) + " + optimizer " + secs(c.time.optimizer) + " + offload I/O " +
         secs(c.time.offload_io);
}

void print_chosen(const Choice& ch, const World& w) {
  const Candidate& c = ch.candidates[static_cast<std::size_t>(ch.chosen)];
  std::printf("chosen: %s\n", c.label.c_str());
  std::printf("  per rank by category:");
  for (std::size_t k = 0; k < kNumMemCategories; ++k) {
    const std::size_t b = c.plan.bytes[k] + c.plan.nvme[k];
    if (b == 0) continue;
    std::printf(" %s %s%s%s", std::string(to_string(static_cast<MemCategory>(k))).c_str(),
                format_bytes(b).c_str(), c.plan.pinned[k] > 0 ? " (pinned)" : "",
                c.plan.nvme[k] > 0 ? " (NVMe)" : "");
  }
  std::printf(" + trainer (activations, workspace) %s\n", format_bytes(c.trainer_bytes).c_str());
  auto tier = [](const char* name, std::size_t need, std::size_t has) {
    std::printf("  %s: %s", name, format_bytes(need).c_str());
    if (has > 0) {
      std::printf(" of %s (%.1f%%, %s to spare)", format_bytes(has).c_str(),
                  100.0 * static_cast<double>(need) / static_cast<double>(has),
                  format_bytes(has - need).c_str());
    }
    std::printf("\n");
  };
  std::printf("  this node (%d ranks), budgets less the %.0f%% margin:\n", w.local(),
              100 * ch.margin);
  tier("host memory", c.need.host, ch.budget.host);
  if (!w.device_is_host) {
    tier("device memory per rank", c.need.device / static_cast<std::size_t>(w.local()),
         ch.budget.device);
  }
  if (c.need.nvme > 0) tier("NVMe", c.need.nvme, ch.budget.nvme);
  std::printf("  predicted step: %s\n", time_text(c).c_str());
}

// --report FILE: every candidate as JSON (for tests and tables): its sets, fit, need per tier
// for the node, bytes per rank per tier (the device tier with the trainer's), time by phase.
void write_report(const Choice& ch, const World& w, const std::string& path) {
  using json = nlohmann::ordered_json;
  json cands = json::array();
  for (std::size_t i = 0; i < ch.candidates.size(); ++i) {
    const Candidate& c = ch.candidates[i];
    std::size_t pinned = 0, on_device = c.trainer_bytes, nvme = 0;
    for (std::size_t k = 0; k < kNumMemCategories; ++k) {
      pinned += c.plan.pinned[k];
      on_device += c.plan.bytes[k] - c.plan.pinned[k];
      nvme += c.plan.nvme[k];
    }
    json cats = json::object();
    for (std::size_t k = 0; k < kNumMemCategories; ++k) {
      if (c.plan.bytes[k] + c.plan.nvme[k] == 0) continue;
      cats[std::string(to_string(static_cast<MemCategory>(k)))] = {
          {"bytes", c.plan.bytes[k]}, {"pinned", c.plan.pinned[k]}, {"nvme", c.plan.nvme[k]}};
    }
    cands.push_back(
        {{"label", c.label},
         {"sets", c.sets},
         {"fits", c.fits()},
         {"why", static_cast<int>(i) == ch.chosen ? "chosen" : ch.why_lost(i)},
         {"need", {{"host", c.need.host}, {"device", c.need.device}, {"nvme", c.need.nvme}}},
         {"per_rank", {{"device", on_device}, {"pinned", pinned}, {"nvme", nvme}}},
         {"categories", cats},
         {"model_state", c.plan.model_state()},
         {"buffers",
          {{"in_flight_grads", c.plan.in_flight_grad_bytes},
           {"staging", c.plan.staging_bytes},
           {"gathered_params", c.plan.gathered_param_bytes}}},
         {"trainer_bytes", c.trainer_bytes},
         {"psi", c.plan.psi},
         {"largest_unit", c.plan.largest_unit},
         {"time",
          {{"compute", c.time.compute},
           {"comm", c.time.comm},
           {"optimizer", c.time.optimizer},
           {"offload_io", c.time.offload_io},
           {"total", c.time.total()}}},
         {"untimed", c.untimed}});
  }
  const json j = {
      {"chosen", ch.chosen},
      {"ranks", w.ranks},
      {"budget",
       {{"host", ch.budget.host}, {"device", ch.budget.device}, {"nvme", ch.budget.nvme}}},
      {"rejected", ch.rejected},
      {"candidates", cands}};
  std::ofstream out(path, std::ios::trunc);
  ZERO_CHECK(out.good(), kIO, "--report: cannot write '", path, "'");
  out << j.dump(1) << "\n";
}

int run(int argc, char** argv) {
  CLI::App app{"zero-plan: the fastest zero configuration that provably fits, and why"};
  std::string safetensors_path, unit_pattern = kLayerUnitPattern, activation_bytes;
  std::string profile_path, units_path, config_path, write_config, report, device = "cpu";
  std::string host_mem, device_mem, nvme_cap, nvme_path, stages = "0,1,2,3",
                                                         dtypes = "f32,bf16,int8";
  std::string max_live = "1000000000,0", hybrid = "none,node",
              quantized = "none,weights,gradients,both";
  std::vector<std::string> sets;
  gpt::GptConfig g;
  g.layers = 4;  // zero-train's default shape
  g.dim = 128;
  int batch = 8, ranks = 2, per_node = 0, top = 8;
  double margin = 0.05;
  bool all = false;
  app.add_option("--profile", profile_path, "machine profile (zero-env --calibrate --out FILE)")
      ->required();
  app.add_option("--units", units_path, "the model as a JSON list of units (instead of GPT)");
  app.add_option("--safetensors", safetensors_path,
                 "the model from a safetensors file, a sharded set's index or their directory "
                 "(headers only)");
  app.add_option("--unit-pattern", unit_pattern,
                 "with --safetensors: a regex whose first group names a tensor's unit (default: "
                 "the layer prefix, " +
                     std::string(kLayerUnitPattern) + "; no match: the name less its last part)");
  app.add_option("--activation-bytes", activation_bytes,
                 "with --safetensors: activations and workspace per rank per micro-step (e.g. "
                 "512M; default 0)");
  app.add_option("--layers", g.layers, "GPT blocks (default 4)");
  app.add_option("--dim", g.dim, "GPT width (default 128)");
  app.add_option("--heads", g.heads, "GPT heads (default 4)");
  app.add_option("--seq", g.seq, "sequence length (default 64)");
  app.add_option("--vocab", g.vocab, "GPT vocabulary (default: the default corpus's)");
  app.add_option("--batch", batch, "sequences per rank per micro-step (default 8)");
  app.add_option("--ranks", ranks, "data-parallel ranks (default 2)");
  app.add_option("--ranks-per-node", per_node, "ranks sharing a node's host memory (default all)");
  app.add_option("--device", device, "cpu (in-process ranks) or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--host-memory", host_mem, "host memory per node, e.g. 2G (default unlimited)");
  app.add_option("--device-memory", device_mem, "device memory per rank (cuda)");
  app.add_option("--nvme-path", nvme_path, "swap directory: NVMe candidates (default none)");
  app.add_option("--nvme-capacity", nvme_cap, "NVMe bytes per node (default unlimited)");
  app.add_option("--config", config_path, "base DeepSpeed JSON config");
  app.add_option("--set", sets, "key.path=value over the base config (repeatable)");
  app.add_option("--margin", margin, "fraction of each budget kept free (default 0.05)")
      ->check(CLI::Range(0.0, 0.99));
  app.add_option("--stages", stages, "stages to consider (default 0,1,2,3)");
  app.add_option("--moment-dtypes", dtypes, "moment dtypes to consider (default f32,bf16,int8)");
  app.add_option("--max-live", max_live,
                 "stage3_max_live_parameters tried with a prefetch, elements; 0: twice the "
                 "largest unit (default 1000000000,0)");
  app.add_option("--hybrid", hybrid,
                 "across nodes: none and/or node (hybrid_shard_size = ranks per node; default "
                 "none,node)");
  app.add_option("--quantized", quantized,
                 "across nodes at stage 3: none, weights (qwZ), gradients (qgZ), both (default "
                 "all four)");
  app.add_option("--top", top, "runner-ups shown (default 8)");
  app.add_flag("--all", all, "show every configuration considered");
  app.add_option("--write-config", write_config, "write the choice as DeepSpeed JSON");
  app.add_option("--report", report, "write every configuration considered as JSON");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  // The base: the user's JSON (or {}) with the micro batch and the --set keys applied.
  std::string base_json = "{}";
  if (!config_path.empty()) {
    std::ifstream in(config_path);
    ZERO_CHECK(in.good(), kIO, "--config: cannot read '", config_path, "'");
    std::ostringstream text;
    text << in.rdbuf();
    base_json = text.str();
  }
  std::vector<std::string> base_sets = {"train_micro_batch_size_per_gpu=" + std::to_string(batch)};
  base_sets.insert(base_sets.end(), sets.begin(), sets.end());
  base_json = config_document(base_json, base_sets);
  const Config base = ConfigBuilder().merge_json(base_json, "--config / --set").build();
  const MachineProfile profile = read_profile(profile_path);

  World w;
  w.ranks = ranks;
  w.ranks_per_node = per_node;
  w.device_is_host = device == "cpu";
  auto bytes = [](const char* flag, const std::string& v) {
    return v.empty() ? std::size_t{0} : static_cast<std::size_t>(gpt::flag_bytes(flag, v));
  };
  w.host_bytes = bytes("--host-memory", host_mem);
  w.device_bytes = bytes("--device-memory", device_mem);
  w.nvme_bytes = bytes("--nvme-capacity", nvme_cap);
  w.nvme_path = nvme_path;

  ChooseSpace space;
  space.stages.clear();
  for (const std::string& s : split(stages)) space.stages.push_back(gpt::flag_int("--stages", s));
  space.moment_dtypes = split(dtypes);
  space.max_live.clear();
  for (const std::string& m : split(max_live)) {
    const double v = gpt::flag_bytes("--max-live", m);
    ZERO_CHECK(v >= 0, kInvalidArgument, "--max-live expects elements >= 0, got '", m, "'");
    space.max_live.push_back(static_cast<std::int64_t>(v));
  }
  space.hybrid = split(hybrid);
  space.quantized = split(quantized);
  TrainerModel trainer;
  std::string model_text;
  ZERO_CHECK(units_path.empty() || safetensors_path.empty(), kInvalidArgument,
             "zero-plan: --units and --safetensors are two models: give one");
  if (!units_path.empty()) {
    trainer = plan::units_trainer(units_path);
    model_text = units_path;
  } else if (!safetensors_path.empty()) {
    trainer = plan::safetensors_trainer(safetensors_path, unit_pattern,
                                        bytes("--activation-bytes", activation_bytes),
                                        static_cast<double>(batch) * g.seq);
    const PlanInput pin = trainer.plan_input(base);
    std::size_t params = 0;
    for (const UnitSpec& u : pin.units) {
      for (const ParamSpec& p : u.params) params += p.numel();
    }
    model_text = safetensors_path + " (" + std::to_string(pin.units.size()) + " units, " +
                 std::to_string(params) + " parameters)";
  } else {
    if (g.vocab == 0) g.vocab = gpt::CharCorpus::from_file(gpt::kDefaultCorpus).vocab_size();
    g.validate();
    trainer = plan::gpt_trainer(g, batch, base);
    // Checkpointing on: sqrt(layers) segments, zero-train's "sqrt".
    space.checkpoint_segments = static_cast<int>(std::ceil(std::sqrt(g.layers)));
    model_text = "GPT " + std::to_string(g.layers) + " layers x " + std::to_string(g.dim) +
                 ", seq " + std::to_string(g.seq) + ", " + std::to_string(g.num_params()) +
                 " parameters";
  }
  const Choice ch = choose_config(trainer, base_json, w, profile, space, margin);
  std::size_t fit = 0;
  for (const Candidate& c : ch.candidates) fit += c.fits() ? 1 : 0;
  std::printf("zero-plan: %s, micro-batch %d, %d ranks (%d per node), device %s; profile %s\n",
              model_text.c_str(), batch, w.ranks, w.local(), device.c_str(), profile_path.c_str());
  std::printf("%zu configurations considered (%zu more refused by the config reader), %zu fit\n",
              ch.candidates.size(), ch.rejected, fit);
  if (ch.chosen < 0) {
    std::printf("nothing fits; the closest:\n");
  } else {
    print_chosen(ch, w);
    std::printf("runner-ups:\n");
  }
  // The next fitting ones, then the non-fitting ones (least short first).
  std::size_t shown_fit = 0, shown_short = 0;
  for (std::size_t i = 0; i < ch.candidates.size(); ++i) {
    if (static_cast<int>(i) == ch.chosen) continue;
    const Candidate& c = ch.candidates[i];
    std::size_t& shown = c.fits() ? shown_fit : shown_short;
    if (!all && shown >= static_cast<std::size_t>(top)) continue;
    ++shown;
    std::printf("  %s: %s; %s\n", c.label.c_str(),
                c.untimed.empty() ? secs(c.time.total()).c_str() : "untimed",
                ch.why_lost(i).c_str());
  }
  // What memory costs: the fastest configuration regardless of the budget, when it is not the
  // choice.
  const Candidate* fastest = nullptr;
  for (const Candidate& c : ch.candidates) {
    if (c.untimed.empty() && (fastest == nullptr || c.time.total() < fastest->time.total())) {
      fastest = &c;
    }
  }
  if (fastest != nullptr && !fastest->fits()) {
    std::printf("fastest regardless of memory: %s: %s; %s\n", fastest->label.c_str(),
                secs(fastest->time.total()).c_str(),
                ch.why_lost(static_cast<std::size_t>(fastest - ch.candidates.data())).c_str());
  }
  if (!report.empty()) write_report(ch, w, report);
  if (!write_config.empty()) {
    ZERO_CHECK(ch.chosen >= 0, kOutOfMemory, "zero-plan: nothing fits: no --write-config");
    std::ofstream out(write_config, std::ios::trunc);
    ZERO_CHECK(out.good(), kIO, "--write-config: cannot write '", write_config, "'");
    out << ch.candidates[static_cast<std::size_t>(ch.chosen)].json;
    ZERO_CHECK(out.good(), kIO, "--write-config: short write to '", write_config, "'");
    std::printf("wrote %s (zero-train --config %s)\n", write_config.c_str(), write_config.c_str());
  }
  return ch.chosen >= 0 ? 0 : 2;
}

}  // namespace

int main(int argc, char** argv) try { return run(argc, argv); } catch (...) {
  return zero::report_exception("zero-plan");
}
