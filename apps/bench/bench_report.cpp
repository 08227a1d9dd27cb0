#include "bench/bench_report.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/svg_chart.hpp"
#include "zero/device/memory_report.hpp"

namespace zero::bench {

namespace {

constexpr MemCategory kModelState[] = {MemCategory::kParams16, MemCategory::kMasterParams,
                                       MemCategory::kOptimizerState, MemCategory::kGradients};

std::string mib(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f MiB", bytes / 1048576.0);
  return b;
}

std::string ratio(double measured, double predicted) {
  if (predicted <= 0) return measured == 0 ? "   -" : "   n/a";
  char b[32];
  std::snprintf(b, sizeof b, "%.4f", measured / predicted);
  return b;
}

}  // namespace

std::vector<std::uint64_t> pack(const RankFigures& f) {
  std::vector<std::uint64_t> w;
  w.push_back(static_cast<std::uint64_t>(f.rank));
  for (std::size_t k = 0; k < kNumMemCategories; ++k) {
    for (std::size_t t = 0; t < kNumMemTiers; ++t) {
      w.push_back(f.current[k][t]);
      w.push_back(f.peak[k][t]);
    }
  }
  for (std::size_t v : {f.total_current, f.total_peak, f.buffers, f.comm_bytes_per_step,
                        f.cross_group_bytes_per_step}) {
    w.push_back(v);
  }
  for (double d : {f.step_ms, f.last_loss, f.comm_busy_ms, f.comm_wait_ms, f.traced_step_ms,
                   f.untraced_step_ms}) {
    std::uint64_t bits = 0;
    std::memcpy(&bits, &d, 8);
    w.push_back(bits);
  }
  return w;
}

RankFigures unpack(const std::uint64_t* w) {
  RankFigures f;
  f.rank = static_cast<int>(*w++);
  for (std::size_t k = 0; k < kNumMemCategories; ++k) {
    for (std::size_t t = 0; t < kNumMemTiers; ++t) {
      f.current[k][t] = *w++;
      f.peak[k][t] = *w++;
    }
  }
  f.total_current = *w++;
  f.total_peak = *w++;
  f.buffers = *w++;
  f.comm_bytes_per_step = *w++;
  f.cross_group_bytes_per_step = *w++;
  for (double* d : {&f.step_ms, &f.last_loss, &f.comm_busy_ms, &f.comm_wait_ms, &f.traced_step_ms,
                    &f.untraced_step_ms}) {
    std::memcpy(d, w++, 8);
  }
  return f;
}

std::string label(const ConfigFigures& c) {
  return "stage " + std::to_string(c.stage) +
         (c.checkpoint == "none" ? "" : " +ckpt " + c.checkpoint) +
         (c.offload == "none" || c.offload.empty() ? "" : " +off " + c.offload) +
         (c.hybrid > 0 ? " +hsdp " + std::to_string(c.hybrid) : "") +
         (c.quantized ? " +int8" : "") + (c.comm_debug ? " +comm_debug" : "");
}

std::size_t RankFigures::category(MemCategory c) const {
  std::size_t s = 0;
  for (std::size_t t = 0; t < kNumMemTiers; ++t) {
    if (t != static_cast<std::size_t>(MemTier::kNvme)) s += current[static_cast<std::size_t>(c)][t];
  }
  return s;
}

std::size_t RankFigures::category_peak(MemCategory c) const {
  std::size_t s = 0;
  for (std::size_t t = 0; t < kNumMemTiers; ++t) {
    if (t != static_cast<std::size_t>(MemTier::kNvme)) s += peak[static_cast<std::size_t>(c)][t];
  }
  return s;
}

std::size_t RankFigures::model_state() const {
  std::size_t s = 0;
  for (MemCategory c : kModelState) {
    const auto k = static_cast<std::size_t>(c);
    s += current[k][static_cast<std::size_t>(MemTier::kDevice)] +
         current[k][static_cast<std::size_t>(MemTier::kHost)];
  }
  return s - buffers;
}

std::size_t RankFigures::tier(MemTier t) const {
  std::size_t s = 0;
  for (std::size_t k = 0; k < kNumMemCategories; ++k) s += current[k][static_cast<std::size_t>(t)];
  return s;
}

std::string format_config(const ConfigFigures& c) {
  std::ostringstream os;
  char line[512];
  std::snprintf(line, sizeof line,
                "== %s | N=%d ranks | %s params, %s gradient reduction | %zu parameters%s\n",
                label(c).c_str(), c.ranks, c.dtype.c_str(), c.reduce_dtype.c_str(), c.params,
                c.trainable_params == c.params
                    ? ""
                    : (", " + std::to_string(c.trainable_params) + " trainable").c_str());
  os << line;
  std::snprintf(line, sizeof line, "%-22s %14s %14s %8s %14s %14s\n", "per rank (rank 0)",
                "measured", "predicted", "ratio", "peak", "all ranks");
  os << line;
  const RankFigures& r0 = c.per_rank.front();
  auto row = [&](const std::string& name, double measured, double predicted, double peak,
                 double all) {
    std::snprintf(line, sizeof line, "%-22s %14s %14s %8s %14s %14s\n", name.c_str(),
                  mib(measured).c_str(), mib(predicted).c_str(), ratio(measured, predicted).c_str(),
                  mib(peak).c_str(), mib(all).c_str());
    os << line;
  };
  for (std::size_t k = 0; k < kNumMemCategories; ++k) {
    const auto cat = static_cast<MemCategory>(k);
    std::size_t all = 0;
    for (const auto& r : c.per_rank) all += r.category(cat);
    std::size_t predicted = c.plan.bytes[k];
    if (cat == MemCategory::kActivations) continue;  // compared at the peak, below
    if (cat == MemCategory::kOther) predicted = c.predicted_other;
    if (r0.category_peak(cat) == 0 && predicted == 0) continue;
    row(std::string(to_string(cat)), static_cast<double>(r0.category(cat)),
        static_cast<double>(predicted), static_cast<double>(r0.category_peak(cat)),
        static_cast<double>(all));
  }
  {
    std::size_t all = 0;
    for (const auto& r : c.per_rank) all += r.category_peak(MemCategory::kActivations);
    row("activations peak", static_cast<double>(r0.category_peak(MemCategory::kActivations)),
        static_cast<double>(c.predicted_activations),
        static_cast<double>(r0.category_peak(MemCategory::kActivations)), static_cast<double>(all));
  }
  // Offload: the files on NVMe by category, against the planner.
  for (std::size_t k = 0; k < kNumMemCategories; ++k) {
    const auto cat = static_cast<MemCategory>(k);
    const std::size_t nv = r0.current[k][static_cast<std::size_t>(MemTier::kNvme)];
    if (nv == 0 && c.plan.nvme[k] == 0) continue;
    std::size_t all = 0;
    for (const auto& r : c.per_rank) all += r.current[k][static_cast<std::size_t>(MemTier::kNvme)];
    row(std::string(to_string(cat)) + " @NVMe", static_cast<double>(nv),
        static_cast<double>(c.plan.nvme[k]), static_cast<double>(nv), static_cast<double>(all));
  }
  std::size_t all_total = 0;
  for (const auto& r : c.per_rank) all_total += r.total_peak;
  row("total (peak)", static_cast<double>(r0.total_peak), static_cast<double>(c.predicted_total()),
      static_cast<double>(r0.total_peak), static_cast<double>(all_total));
  std::snprintf(line, sizeof line,
                "model states (params16+master+optimizer+gradients, less %s of declared buffers):"
                " %s; DESIGN.md formula %s; ratio %s\n",
                mib(static_cast<double>(r0.buffers)).c_str(),
                mib(static_cast<double>(r0.model_state())).c_str(), mib(c.formula.total()).c_str(),
                ratio(static_cast<double>(r0.model_state()), c.formula.total()).c_str());
  os << line;
  std::size_t plan_pinned = 0, plan_nvme = 0;
  for (std::size_t k = 0; k < kNumMemCategories; ++k) {
    plan_pinned += c.plan.pinned[k];
    plan_nvme += c.plan.nvme[k];
  }
  std::snprintf(
      line, sizeof line,
      "where the bytes are (rank 0, current): device/host %s, pinned host %s (predicted %s), "
      "NVMe %s (predicted %s)%s\n",
      mib(static_cast<double>(r0.tier(MemTier::kDevice) + r0.tier(MemTier::kHost))).c_str(),
      mib(static_cast<double>(r0.tier(MemTier::kPinned))).c_str(),
      mib(static_cast<double>(plan_pinned)).c_str(),
      mib(static_cast<double>(r0.tier(MemTier::kNvme))).c_str(),
      mib(static_cast<double>(plan_nvme)).c_str(),
      c.offload.rfind("cpu", 0) == 0 ? " (CPU-only run: pinned is the same RAM; host offload saves"
                                       " nothing here)"
                                     : "");
  os << line;
  if (c.offload != "none" && !c.offload.empty()) {
    // offload_optimizer.ratio as the placement cut it (by unit): the planner's figure.
    std::snprintf(
        line, sizeof line, "optimizer offload %s: %zu of %zu stepped elements per rank %s (%.3f)\n",
        c.offload.c_str(), c.plan.stepped_offloaded, c.plan.stepped,
        c.offload.rfind("nvme", 0) == 0 ? "in the NVMe file, the rest pinned" : "off the device",
        c.plan.offload_fraction());
    os << line;
  }
  for (const auto& r : c.per_rank) {
    std::snprintf(line, sizeof line,
                  "  rank %d: model states %s, peak %s, step %.1f ms, comm %s/step (%.1f ms "
                  "executing, %.1f ms exposed), loss %.4f\n",
                  r.rank, mib(static_cast<double>(r.model_state())).c_str(),
                  mib(static_cast<double>(r.total_peak)).c_str(), r.step_ms,
                  mib(static_cast<double>(r.comm_bytes_per_step)).c_str(), r.comm_busy_ms,
                  r.comm_wait_ms, r.last_loss);
    os << line;
  }
  std::snprintf(
      line, sizeof line,
      "step %.1f ms (stage 0: %.1f ms, ratio %s); comm %s/step/rank (theory %s, ratio %s);"
      " process RSS %s\n\n",
      r0.step_ms, c.step_ms_stage0, ratio(r0.step_ms, c.step_ms_stage0).c_str(),
      mib(static_cast<double>(r0.comm_bytes_per_step)).c_str(), mib(c.comm_theory_bytes).c_str(),
      ratio(static_cast<double>(r0.comm_bytes_per_step), c.comm_theory_bytes).c_str(),
      mib(static_cast<double>(c.process_rss)).c_str());
  if (c.hybrid > 0) {
    // Drop the blank line ending the block: the hybrid line belongs to it.
    std::string block(line);
    block.pop_back();
    os << block;
    std::snprintf(
        line, sizeof line,
        "hybrid: sharded over groups of %d, %d groups; across groups %s/step/rank "
        "(theory %s = %s, ratio %s)\n\n",
        c.hybrid, c.ranks / c.hybrid,
        mib(static_cast<double>(r0.cross_group_bytes_per_step)).c_str(),
        c.quantized ? "(R-1) x the int8 chunk of each shard" : "2 (R-1)/R x shard",
        mib(c.cross_group_theory_bytes).c_str(),
        ratio(static_cast<double>(r0.cross_group_bytes_per_step), c.cross_group_theory_bytes)
            .c_str());
  }
  os << line;
  return os.str();
}

std::string format_summary(const std::vector<ConfigFigures>& all) {
  std::ostringstream os;
  char line[512];
  os << "== summary (per rank, rank 0; model states less declared buffers)\n";
  bool traced = false;
  for (const auto& c : all) traced = traced || c.per_rank.front().traced_step_ms > 0;
  std::snprintf(line, sizeof line, "%-28s %13s %13s %7s %13s %13s %13s %8s %8s %8s %8s%s\n",
                "config", "model states", "formula", "ratio", "vs stage 0", "activations",
                "peak total", "step ms", "vs st.0", "comm ms", "exposed",
                traced ? "  traced ms  traced/off" : "");
  os << line;
  std::size_t stage0_state = 0;
  for (const auto& c : all) {
    if (c.stage == 0 && c.checkpoint == all.front().checkpoint) {
      stage0_state = c.per_rank.front().model_state();
    }
  }
  for (const auto& c : all) {
    const RankFigures& r = c.per_rank.front();
    char vs0[32] = "-";
    if (stage0_state > 0) {
      std::snprintf(vs0, sizeof vs0, "%.3f", static_cast<double>(r.model_state()) / stage0_state);
    }
    char trace_cols[64] = "";
    if (r.traced_step_ms > 0) {
      std::snprintf(trace_cols, sizeof trace_cols, " %10.1f %11s", r.traced_step_ms,
                    ratio(r.traced_step_ms, r.untraced_step_ms).c_str());
    }
    std::snprintf(line, sizeof line, "%-28s %13s %13s %7s %13s %13s %13s %8.1f %8s %8.1f %8.1f%s\n",
                  label(c).c_str(), mib(static_cast<double>(r.model_state())).c_str(),
                  mib(c.formula.total()).c_str(),
                  ratio(static_cast<double>(r.model_state()), c.formula.total()).c_str(), vs0,
                  mib(static_cast<double>(r.category_peak(MemCategory::kActivations))).c_str(),
                  mib(static_cast<double>(r.total_peak)).c_str(), r.step_ms,
                  ratio(r.step_ms, c.step_ms_stage0).c_str(), r.comm_busy_ms, r.comm_wait_ms,
                  trace_cols);
    os << line;
  }
  // comm_debug detail (--comm-debug): each such configuration's step beside the same one's
  // without the fingerprint check, measured in this run.
  for (const auto& d : all) {
    if (!d.comm_debug) continue;
    for (const auto& c : all) {
      if (c.comm_debug || c.stage != d.stage || c.checkpoint != d.checkpoint ||
          c.offload != d.offload || c.hybrid != d.hybrid || c.quantized != d.quantized) {
        continue;
      }
      const double on = d.per_rank.front().step_ms, off = c.per_rank.front().step_ms;
      std::snprintf(line, sizeof line,
                    "comm_debug detail, %s: step %.2f ms, %.2f ms without (ratio %s)\n",
                    label(c).c_str(), on, off, ratio(on, off).c_str());
      os << line;
    }
  }
  // Hybrid sharding and quantized collectives: what each configuration sends, and of it across
  // groups, each beside its formula.
  bool grouped = false;
  for (const auto& c : all) grouped = grouped || c.hybrid > 0 || c.quantized;
  if (!grouped) return os.str();
  os << "== communication per step (per rank, rank 0)\n";
  std::snprintf(line, sizeof line, "%-28s %13s %13s %7s %13s %13s %7s\n", "config", "sent",
                "formula", "ratio", "across groups", "formula", "ratio");
  os << line;
  for (const auto& c : all) {
    const RankFigures& r = c.per_rank.front();
    const auto sent = static_cast<double>(r.comm_bytes_per_step);
    const auto cross = static_cast<double>(r.cross_group_bytes_per_step);
    std::snprintf(line, sizeof line, "%-28s %13s %13s %7s %13s %13s %7s\n", label(c).c_str(),
                  mib(sent).c_str(), mib(c.comm_theory_bytes).c_str(),
                  ratio(sent, c.comm_theory_bytes).c_str(), c.hybrid > 0 ? mib(cross).c_str() : "-",
                  c.hybrid > 0 ? mib(c.cross_group_theory_bytes).c_str() : "-",
                  c.hybrid > 0 ? ratio(cross, c.cross_group_theory_bytes).c_str() : "-");
    os << line;
  }
  return os.str();
}

std::string to_json(const std::vector<ConfigFigures>& all) {
  using nlohmann::json;
  json out = json::array();
  for (const auto& c : all) {
    json cj;
    cj["stage"] = c.stage;
    cj["checkpoint"] = c.checkpoint;
    cj["offload"] = c.offload;
    cj["hybrid_shard_size"] = c.hybrid;
    cj["quantized"] = c.quantized;
    cj["comm_debug"] = c.comm_debug ? "detail" : "off";
    cj["cross_group_theory_bytes_per_step"] = c.cross_group_theory_bytes;
    cj["ranks"] = c.ranks;
    cj["dtype"] = c.dtype;
    cj["reduce_dtype"] = c.reduce_dtype;
    cj["params"] = c.params;
    cj["trainable_params"] = c.trainable_params;
    cj["process_rss"] = c.process_rss;
    cj["step_ms_stage0"] = c.step_ms_stage0;
    cj["comm_theory_bytes_per_step"] = c.comm_theory_bytes;
    json pred;
    for (std::size_t k = 0; k < kNumMemCategories; ++k) {
      pred[std::string(to_string(static_cast<MemCategory>(k)))] = c.plan.bytes[k];
    }
    json nvme;
    for (std::size_t k = 0; k < kNumMemCategories; ++k) {
      if (c.plan.nvme[k] > 0)
        nvme[std::string(to_string(static_cast<MemCategory>(k)))] = c.plan.nvme[k];
    }
    pred["nvme"] = nvme;
    json pinned;
    for (std::size_t k = 0; k < kNumMemCategories; ++k) {
      if (c.plan.pinned[k] > 0)
        pinned[std::string(to_string(static_cast<MemCategory>(k)))] = c.plan.pinned[k];
    }
    pred["pinned"] = pinned;
    // offload_optimizer.ratio as cut: of this rank's stepped elements, those offloaded.
    pred["stepped"] = c.plan.stepped;
    pred["stepped_offloaded"] = c.plan.stepped_offloaded;
    pred["activations_peak"] = c.predicted_activations;
    pred["other"] = c.predicted_other;
    pred["total"] = c.predicted_total();
    pred["model_state"] = c.plan.model_state();
    cj["predicted"] = pred;
    cj["formula"] = {{"params", c.formula.params},
                     {"grads", c.formula.grads},
                     {"optimizer", c.formula.optimizer},
                     {"offloaded", c.formula.offloaded},
                     {"total", c.formula.total()}};
    json ranks = json::array();
    for (const auto& r : c.per_rank) {
      json rj;
      rj["rank"] = r.rank;
      json cats;
      for (std::size_t k = 0; k < kNumMemCategories; ++k) {
        json tiers;
        for (std::size_t t = 0; t < kNumMemTiers; ++t) {
          tiers[std::string(to_string(static_cast<MemTier>(t)))] = {{"current", r.current[k][t]},
                                                                    {"peak", r.peak[k][t]}};
        }
        cats[std::string(to_string(static_cast<MemCategory>(k)))] = tiers;
      }
      rj["categories"] = cats;
      rj["total_current"] = r.total_current;
      rj["total_peak"] = r.total_peak;
      rj["buffers"] = r.buffers;
      rj["model_state"] = r.model_state();
      rj["step_ms"] = r.step_ms;
      rj["comm_busy_ms"] = r.comm_busy_ms;
      rj["comm_wait_ms"] = r.comm_wait_ms;
      if (r.traced_step_ms > 0) {
        rj["traced_step_ms"] = r.traced_step_ms;
        rj["untraced_step_ms"] = r.untraced_step_ms;
      }
      rj["comm_bytes_per_step"] = r.comm_bytes_per_step;
      rj["cross_group_bytes_per_step"] = r.cross_group_bytes_per_step;
      rj["loss"] = r.last_loss;
      ranks.push_back(rj);
    }
    cj["per_rank"] = ranks;
    out.push_back(cj);
  }
  return out.dump(1);
}

std::string to_csv(const std::vector<ConfigFigures>& all) {
  std::ostringstream os;
  os << "stage,checkpoint,ranks,rank,dtype,params";
  for (std::size_t k = 0; k < kNumMemCategories; ++k) {
    os << ',' << to_string(static_cast<MemCategory>(k));
  }
  os << ",activations_peak,total_current,total_peak,model_state,formula,predicted_total,step_ms,"
        "comm_bytes_per_step,offload,nvme_bytes,comm_busy_ms,comm_wait_ms,traced_step_ms,"
        "untraced_step_ms,trainable_params\n";
  for (const auto& c : all) {
    for (const auto& r : c.per_rank) {
      os << c.stage << ',' << c.checkpoint << ',' << c.ranks << ',' << r.rank << ',' << c.dtype
         << ',' << c.params;
      for (std::size_t k = 0; k < kNumMemCategories; ++k) {
        os << ',' << r.category(static_cast<MemCategory>(k));
      }
      os << ',' << r.category_peak(MemCategory::kActivations) << ',' << r.total_current << ','
         << r.total_peak << ',' << r.model_state() << ','
         << static_cast<std::size_t>(c.formula.total()) << ',' << c.predicted_total() << ','
         << r.step_ms << ',' << r.comm_bytes_per_step << ',' << c.offload << ','
         << r.tier(MemTier::kNvme) << ',' << r.comm_busy_ms << ',' << r.comm_wait_ms << ','
         << r.traced_step_ms << ',' << r.untraced_step_ms << ',' << c.trainable_params << '\n';
    }
  }
  return os.str();
}

std::string to_svg(const std::vector<ConfigFigures>& all) {
  // Rank 0's memory per configuration: the categories at their current value after the step,
  // activations at their peak (they are freed at the end of backward).
  static const char* kColors[kNumMemCategories] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2",
                                                   "#59a14f", "#edc948", "#b07aa1", "#9c755f"};
  const double bar_w = 70, gap = 30, left = 80, top = 50, height = 360;
  const double memory_height = top + height + 106;
  // Below it, rank 0's step time per configuration, the bars under the memory chart's: the time
  // its thread was blocked on collectives (exposed) and the rest of the step, stacked; beside
  // them a thin bar of the collectives' executing time (overlapped with compute or not).
  svg::BarChart steps;
  steps.title = "zero-bench: step time per configuration, rank 0 (median of the measured steps)";
  steps.y_label = "ms per step";
  steps.unit = "ms";
  steps.segments = {{"rest of the step (step time - exposed communication)", "#4e79a7"},
                    {"communication exposed (rank 0 blocked on collectives)", "#e15759"}};
  steps.marker = {"communication executing (all collectives, overlapped or not)", "#f28e2b"};
  steps.plot_left = left;
  steps.slot = bar_w + gap;
  steps.bar_width = bar_w;
  steps.plot_height = 240;
  for (const auto& c : all) {
    const RankFigures& r = c.per_rank.front();
    svg::BarChart::Bar b;
    b.label = {"stage " + std::to_string(c.stage),
               c.checkpoint == "none" ? "" : "ckpt " + c.checkpoint,
               c.offload == "none" ? "" : "offload " + c.offload};
    b.values = {std::max(0.0, r.step_ms - r.comm_wait_ms), r.comm_wait_ms};
    b.marker = r.comm_busy_ms;
    steps.bars.push_back(std::move(b));
  }
  const double width = std::max(left + all.size() * (bar_w + gap) + 200, svg::width(steps));
  double max_total = 1;
  std::vector<std::array<double, kNumMemCategories>> stacks;
  for (const auto& c : all) {
    std::array<double, kNumMemCategories> s{};
    const RankFigures& r = c.per_rank.front();
    double t = 0;
    for (std::size_t k = 0; k < kNumMemCategories; ++k) {
      const auto cat = static_cast<MemCategory>(k);
      s[k] = static_cast<double>(cat == MemCategory::kActivations ? r.category_peak(cat)
                                                                  : r.category(cat));
      t += s[k];
    }
    max_total = std::max(max_total, t);
    stacks.push_back(s);
  }
  // The axis in MiB at nice steps (its top: the scale of the bars).
  const svg::Ticks mib_ticks = svg::nice_ticks(0, max_total / 1048576, 5);
  const double scale = mib_ticks.hi * 1048576;
  std::ostringstream os;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                "font-family=\"sans-serif\" font-size=\"12\">\n",
                width, memory_height + svg::height(steps));
  os << buf;
  std::snprintf(buf, sizeof buf,
                "<text x=\"%.0f\" y=\"24\" font-size=\"15\" font-weight=\"bold\">"
                "zero-bench: memory per rank by category, rank 0"
                " (N=%d, %zu parameters, %s; NVMe files not shown)</text>\n",
                left, all.empty() ? 0 : all.front().ranks, all.empty() ? 0 : all.front().params,
                all.empty() ? "" : all.front().dtype.c_str());
  os << buf;
  for (double v : mib_ticks.values) {
    const double y = top + height - height * v / mib_ticks.hi;
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                  "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%s MiB</text>\n",
                  left - 5, y, left + all.size() * (bar_w + gap), y, left - 8, y + 4,
                  svg::tick_label(v, mib_ticks.step).c_str());
    os << buf;
  }
  for (std::size_t i = 0; i < all.size(); ++i) {
    const double x = left + 10 + i * (bar_w + gap);
    double y = top + height;
    for (std::size_t k = 0; k < kNumMemCategories; ++k) {
      const double h = height * stacks[i][k] / scale;
      if (h <= 0) continue;
      y -= h;
      std::snprintf(buf, sizeof buf,
                    "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.0f\" height=\"%.2f\" fill=\"%s\">"
                    "<title>%s: %.2f MiB</title></rect>\n",
                    x, y, bar_w, h, kColors[k],
                    std::string(to_string(static_cast<MemCategory>(k))).c_str(),
                    stacks[i][k] / 1048576);
      os << buf;
    }
    double total = 0;
    for (double v : stacks[i]) total += v;
    std::snprintf(buf, sizeof buf,
                  "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.*f</text>\n"
                  "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">stage %d</text>\n"
                  "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n"
                  "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
                  x + bar_w / 2, y - 5, total < 10 * 1048576 ? 2 : 1, total / 1048576,
                  x + bar_w / 2, top + height + 18, all[i].stage, x + bar_w / 2, top + height + 34,
                  all[i].checkpoint == "none" ? "" : ("ckpt " + all[i].checkpoint).c_str(),
                  x + bar_w / 2, top + height + 50,
                  all[i].offload == "none" ? "" : ("offload " + all[i].offload).c_str());
    os << buf;
  }
  const double lx = left + all.size() * (bar_w + gap) + 20;
  for (std::size_t k = 0; k < kNumMemCategories; ++k) {
    const double ly = top + 20 * static_cast<double>(k);
    std::snprintf(buf, sizeof buf,
                  "<rect x=\"%.0f\" y=\"%.0f\" width=\"14\" height=\"14\" fill=\"%s\"/>"
                  "<text x=\"%.0f\" y=\"%.0f\">%s%s</text>\n",
                  lx, ly, kColors[k], lx + 20, ly + 12,
                  std::string(to_string(static_cast<MemCategory>(k))).c_str(),
                  static_cast<MemCategory>(k) == MemCategory::kActivations ? " (peak)" : "");
    os << buf;
  }
  os << svg::render(steps, 0, memory_height);
  os << "</svg>\n";
  return os.str();
}

}  // namespace zero::bench
