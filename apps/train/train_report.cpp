// What zero-train reports of a run besides its step lines (see train/train_report.hpp).
#include "train/train_report.hpp"

#include <algorithm>
#include <exception>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "zero/core/error.hpp"

namespace zero::train {

void LossPlot::write(const std::string& note) {
  written = true;
  svg::LineChart chart;
  chart.title = title + note;
  chart.x_label = "step";
  chart.y_label = "loss (nats per character, mean over ranks)";
  chart.width = std::max(900.0, 40 + 8.5 * static_cast<double>(chart.title.size()));
  chart.series.push_back({.name = "training loss (every step)",
                          .color = "#4e79a7",
                          .points = train,
                          .stroke_width = 1.25});
  if (!against.empty()) {
    chart.series.push_back({.name = "training loss of " + against_name,
                            .color = "#f28e2b",
                            .points = against,
                            .stroke_width = 1.25});
  }
  chart.series.push_back({.name = "validation loss (every --eval-every steps)",
                          .color = "#e15759",
                          .points = val,
                          .markers = true,
                          .stroke_width = 2});
  std::ofstream out(path, std::ios::trunc);
  out << svg::document(chart.width, chart.height, svg::render(chart));
  ZERO_CHECK(out.good(), kIO, "--plot: cannot write '", path, "'");
}

LossPlot::~LossPlot() {
  if (path.empty() || written || std::uncaught_exceptions() == 0) return;
  try {
    const double last = train.empty() ? 0 : train.back().x;
    write(" (stopped by an error after step " + std::to_string(static_cast<long long>(last)) + ")");
  } catch (...) {
  }
}

std::vector<svg::Point> read_loss_curve(const std::string& path) {
  std::ifstream in(path);
  ZERO_CHECK(in.good(), kIO, "--plot-against: cannot read '", path, "'");
  std::vector<svg::Point> out;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    ZERO_CHECK(j.is_object() && j.contains("step") && j.contains("loss") && j["step"].is_number() &&
                   j["loss"].is_number(),
               kInvalidArgument, "--plot-against: '", path, "' line ", n,
               " is not a zero-train --metrics line (a JSON object with \"step\" and \"loss\")");
    if (j.value("rank", 0) != 0) continue;
    out.push_back({j["step"].get<double>(), j["loss"].get<double>()});
  }
  ZERO_CHECK(!out.empty(), kInvalidArgument, "--plot-against: '", path,
             "' holds no step of rank 0");
  return out;
}

double final_loss(const std::vector<svg::Point>& curve, std::size_t n) {
  const std::size_t k = std::min(n, curve.size());
  double s = 0;
  for (std::size_t i = curve.size() - k; i < curve.size(); ++i) s += curve[i].y;
  return k > 0 ? s / static_cast<double>(k) : 0.0;
}

std::string metrics_line(const StepLine& s, const MemoryTracker& tracker,
                         const StepMetrics& engine) {
  std::ostringstream os;
  os << "{\"step\":" << s.step << ",\"rank\":" << s.rank << ",\"loss\":" << s.loss
     << ",\"rank_loss\":" << s.rank_loss << ",\"step_s\":" << s.step_s
     << ",\"tokens_per_s\":" << s.tokens / s.step_s
     << ",\"model_flops_per_s_per_rank\":" << s.flops_per_rank;
  if (s.mfu > 0) os << ",\"mfu\":" << s.mfu;
  os << ",\"lr\":" << s.lr << ",\"grad_norm\":" << s.grad_norm
     << ",\"applied\":" << (s.applied ? "true" : "false") << ",\"peak_bytes\":{";
  for (std::size_t k = 0; k < kNumMemTiers; ++k) {
    const auto tier = static_cast<MemTier>(k);
    os << (k > 0 ? "," : "") << '"' << to_string(tier) << "\":" << tracker.peak(tier);
  }
  os << "},\"engine\":" << to_json(engine) << "}";
  return os.str();
}

}  // namespace zero::train
