// Convergence with 8-bit optimizer moments (below), and with ZeRO++'s quantized collectives:
// the GPT example (zero-train, its default model
// and 2 in-process ranks, stage 3) for 200 steps with qwZ + qgZ against the same run without:
// the final training loss (the mean of the last 10 steps, as zero-train's --plot-against reports
// it) and the final validation loss within 2%; the quantized run sends fewer bytes (the int8
// chunks, about a quarter of f32); both curves in one SVG (--plot --plot-against); and
// --plot-against's own errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/run_command.hpp"
#include "common/temp_dir.hpp"

namespace zero::testing {
namespace {

struct TrainRun {
  std::vector<double> loss;  // rank 0's, per step
  double sent = 0;           // rank 0's bytes sent over the run
  double validation = 0;     // the last evaluation's
};

TrainRun read_run(const std::string& metrics, const std::string& out) {
  TrainRun r;
  std::ifstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j["rank"].get<int>() != 0) continue;
    r.loss.push_back(j["loss"].get<double>());
    r.sent += j["engine"]["comm_sent_bytes"].get<double>();
  }
  const std::size_t at = out.rfind("validation loss ");
  if (at != std::string::npos) r.validation = std::stod(out.substr(at + 16));
  return r;
}

double final_loss(const TrainRun& r) {
  double s = 0;
  for (std::size_t i = r.loss.size() - 10; i < r.loss.size(); ++i) s += r.loss[i];
  return s / 10;
}

constexpr const char* kQuantized =
    " --set zero_optimization.zero_quantized_weights=true"
    " --set zero_optimization.zero_quantized_gradients=true";

TEST(Convergence, QuantizedCollectivesTrainTheGptWithin2PercentOf200Steps) {
  const testing::TempDir tmp;
  const std::string base = tmp.file("plain.jsonl"), quant = tmp.file("quant.jsonl"),
                    svg = tmp.file("curves.svg");
  const std::string cmd = std::string(ZERO_TRAIN_BIN) + " --zero-stage 3 --steps 200 --no-progress";
  const CmdResult a = run_command(cmd + " --metrics " + base);
  ASSERT_EQ(a.status, 0) << a.out;
  const CmdResult b = run_command(cmd + kQuantized + " --metrics " + quant + " --plot " + svg +
                                  " --plot-against " + base);
  ASSERT_EQ(b.status, 0) << b.out;
  const TrainRun pa = read_run(base, a.out), pb = read_run(quant, b.out);
  ASSERT_EQ(pa.loss.size(), 200u);
  ASSERT_EQ(pb.loss.size(), 200u);
  const double la = final_loss(pa), lb = final_loss(pb);
  std::printf(
      "final training loss (mean of the last 10 steps): qwZ + qgZ %.4f, without %.4f "
      "(%+.2f%%); validation %.4f vs %.4f (%+.2f%%); bytes sent %.3g vs %.3g (ratio "
      "%.4f)\n",
      lb, la, 100 * (lb - la) / la, pb.validation, pa.validation,
      100 * (pb.validation - pa.validation) / pa.validation, pb.sent, pa.sent, pb.sent / pa.sent);
  EXPECT_LE(std::fabs(lb - la), 0.02 * la);
  ASSERT_GT(pa.validation, 0);
  EXPECT_LE(std::fabs(pb.validation - pa.validation), 0.02 * pa.validation);
  // Both runs learned (the first steps' loss is ~4.36 nats, the unigram entropy 3.14).
  EXPECT_LT(la, 3.0);
  // The int8 chunks: a byte and 4 / 256 of a scale per f32 element, plus the norm exchange.
  EXPECT_LT(pb.sent / pa.sent, 0.27);
  EXPECT_GT(pb.sent / pa.sent, 0.25);
  // zero-train's own comparison line, and both curves in the SVG.
  EXPECT_NE(b.out.find("final training loss (mean of the last 10 steps)"), std::string::npos)
      << b.out;
  const std::string doc = read_file(svg);
  EXPECT_NE(doc.find("qwZ + qgZ (int8, block 256)"), std::string::npos);
  EXPECT_NE(doc.find("data-series=\"training loss of " + base + "\""), std::string::npos) << doc;
  EXPECT_NE(doc.find("data-series=\"training loss (every step)\""), std::string::npos);
}

// 8-bit optimizer moments (bitsandbytes' block-wise scheme, moment_dtype int8) against f32
// moments: the GPT example for 300 steps, same seed and data, 2 ranks, stage 2: final training
// (mean of the last 10 steps) and validation loss within 1%; both curves in one SVG.
TEST(Convergence, Int8MomentsTrainTheGptWithin1PercentOf300Steps) {
  const testing::TempDir tmp;
  const std::string base = tmp.file("f32moments.jsonl"), q8 = tmp.file("int8moments.jsonl"),
                    svg = tmp.file("moments.svg");
  const std::string cmd = std::string(ZERO_TRAIN_BIN) +
                          " --zero-stage 2 --steps 300 --eval-every 100 --seed 1 --no-progress";
  const CmdResult a = run_command(cmd + " --metrics " + base);
  ASSERT_EQ(a.status, 0) << a.out;
  const CmdResult b = run_command(cmd + " --set optimizer.params.moment_dtype=int8 --metrics " +
                                  q8 + " --plot " + svg + " --plot-against " + base);
  ASSERT_EQ(b.status, 0) << b.out;
  const TrainRun pa = read_run(base, a.out), pb = read_run(q8, b.out);
  ASSERT_EQ(pa.loss.size(), 300u);
  ASSERT_EQ(pb.loss.size(), 300u);
  const double la = final_loss(pa), lb = final_loss(pb);
  std::printf(
      "final training loss (mean of the last 10 steps): int8 moments %.4f, f32 moments %.4f "
      "(%+.2f%%); validation %.4f vs %.4f (%+.2f%%)\n",
      lb, la, 100 * (lb - la) / la, pb.validation, pa.validation,
      100 * (pb.validation - pa.validation) / pa.validation);
  EXPECT_LE(std::fabs(lb - la), 0.01 * la);
  ASSERT_GT(pa.validation, 0);
  EXPECT_LE(std::fabs(pb.validation - pa.validation), 0.01 * pa.validation);
  EXPECT_LT(la, 3.0);  // both learned
  EXPECT_NE(la, lb) << "the moment dtype changed nothing";
  EXPECT_NE(read_file(svg).find("int8 optimizer moments"), std::string::npos);
}

TEST(Convergence, PlotAgainstRefusesWhatItCannotDraw) {
  const testing::TempDir tmp;
  const std::string bad = tmp.file("bad.jsonl");
  std::ofstream(bad) << "{\"step\": 1, \"loss\": 2.0, \"rank\": 0}\nnot json\n";
  const std::string cmd = std::string(ZERO_TRAIN_BIN) + " --steps 1 --no-progress";
  CmdResult r = run_command(cmd + " --plot-against " + bad);
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--plot-against needs --plot FILE"), std::string::npos) << r.out;
  r = run_command(cmd + " --plot " + tmp.file("x.svg") + " --plot-against " + bad);
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("'" + bad + "' line 2 is not a zero-train --metrics line"),
            std::string::npos)
      << r.out;
  r = run_command(cmd + " --plot " + tmp.file("x.svg") + " --plot-against /nonexistent/m.jsonl");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("cannot read '/nonexistent/m.jsonl'"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace zero::testing
