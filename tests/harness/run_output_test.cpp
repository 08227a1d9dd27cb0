// What a person watching zero-train and zero-bench sees besides the figures: the SVG charts
// (zero-train --plot, zero-bench --svg) are well-formed XML with one point per step and per
// evaluation, one step-time bar per configuration scaled to the measured step time and labelled
// as the memory chart's bars; the progress status line is redrawn in place on a terminal and
// gone at the end, never shares a line with stdout, and off a terminal is plain lines (zero-bench)
// or nothing (zero-train), as --no-progress is everywhere.
//
// The XML check is a small parser here (balanced tags, quoted attributes, entities): nothing is
// installed for the test. The chart writer's escaping and ticks are checked directly too.
#include <gtest/gtest.h>
#include <pty.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/run_command.hpp"
#include "common/svg_chart.hpp"
#include "common/temp_dir.hpp"

#ifndef ZERO_BENCH_BIN
#error "ZERO_BENCH_BIN must name the zero-bench binary"
#endif

namespace {

// ---- Running the programs

using zero::testing::CmdResult;

// Piped: stdout and stderr are not a terminal.
CmdResult run(const std::string& cmd) { return zero::testing::run_command(cmd); }

// `cmd` (through /bin/sh) with stdout and stderr on a pseudo-terminal of 300 columns: what a
// terminal would receive, byte for byte.
CmdResult run_on_terminal(const std::string& cmd) {
  CmdResult r;
  winsize ws{};
  ws.ws_row = 50;
  ws.ws_col = 300;
  int master = -1;
  const pid_t pid = forkpty(&master, nullptr, nullptr, &ws);
  if (pid < 0) return r;
  if (pid == 0) {
    setenv("TERM", "xterm", 1);
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  char buf[4096];
  for (;;) {
    const ssize_t n = read(master, buf, sizeof buf);
    if (n > 0) {
      r.out.append(buf, static_cast<std::size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      break;  // EIO: the child side closed
    }
  }
  close(master);
  int st = 0;
  waitpid(pid, &st, 0);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

// The screen a terminal shows after `bytes` (no wrapping: the pty is wide): "\r" to column 0,
// "\n" one row down (the pty turns it into "\r\n"), "\033[K" erases to the end of the row.
// Any other escape sequence or control byte is an error: the programs write no others.
std::vector<std::string> screen(const std::string& bytes, std::string* error) {
  std::vector<std::string> rows(1);
  std::size_t row = 0, col = 0;
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    const char c = bytes[i];
    if (c == '\r') {
      col = 0;
    } else if (c == '\n') {
      if (++row == rows.size()) rows.emplace_back();
    } else if (c == '\033') {
      if (bytes.compare(i, 3, "\033[K") != 0) {
        *error = "unexpected escape sequence at byte " + std::to_string(i);
        return rows;
      }
      if (rows[row].size() > col) rows[row].resize(col);
      i += 2;
    } else if (static_cast<unsigned char>(c) < 0x20 && c != '\t') {
      *error = "unexpected control byte " + std::to_string(static_cast<int>(c));
      return rows;
    } else {
      if (rows[row].size() <= col) rows[row].resize(col + 1, ' ');
      rows[row][col++] = c;
    }
  }
  while (!rows.empty() && rows.back().empty()) rows.pop_back();
  return rows;
}

using zero::testing::read_file;

int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (std::size_t p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1)) {
    ++n;
  }
  return n;
}

// ---- A small XML reader: well-formedness and the elements

struct Element {
  std::string name;
  std::map<std::string, std::string> attrs;  // values with the entities resolved
  std::string text;                          // the element's own character data
  int parent = -1;                           // index in Xml::elements; -1: the root
};

struct Xml {
  std::vector<Element> elements;  // in document order
  std::string error;              // empty: well-formed

  // Whether element i lies inside an element named `name` with class="cls".
  bool inside(int i, const std::string& name, const std::string& cls) const {
    for (int p = elements[static_cast<std::size_t>(i)].parent; p >= 0;
         p = elements[static_cast<std::size_t>(p)].parent) {
      const Element& e = elements[static_cast<std::size_t>(p)];
      const auto c = e.attrs.find("class");
      if (e.name == name && c != e.attrs.end() && c->second == cls) return true;
    }
    return false;
  }
  std::vector<int> find(const std::string& name, const std::string& cls = "") const {
    std::vector<int> out;
    for (std::size_t i = 0; i < elements.size(); ++i) {
      const auto c = elements[i].attrs.find("class");
      if (elements[i].name == name &&
          (cls.empty() || (c != elements[i].attrs.end() && c->second == cls))) {
        out.push_back(static_cast<int>(i));
      }
    }
    return out;
  }
};

// Appends `raw` to `out` with the XML entities resolved; false on a bare '&' or an unknown one.
bool unescape(const std::string& raw, std::string& out) {
  static const std::map<std::string, char> kNamed = {
      {"amp", '&'}, {"lt", '<'}, {"gt", '>'}, {"quot", '"'}, {"apos", '\''}};
  for (std::size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] != '&') {
      out += raw[i];
      continue;
    }
    const std::size_t semi = raw.find(';', i);
    if (semi == std::string::npos || semi - i > 10) return false;
    const std::string name = raw.substr(i + 1, semi - i - 1);
    if (kNamed.count(name) != 0) {
      out += kNamed.at(name);
    } else if (name.size() > 1 && name[0] == '#') {
      const bool hex = name[1] == 'x';
      const std::string digits = name.substr(hex ? 2 : 1);
      if (digits.empty() || digits.find_first_not_of(hex ? "0123456789abcdefABCDEF"
                                                         : "0123456789") != std::string::npos) {
        return false;
      }
      out += '?';  // a character reference: its value does not matter here
    } else {
      return false;
    }
    i = semi;
  }
  return true;
}

Xml parse_xml(const std::string& s) {
  Xml x;
  std::vector<int> open;
  bool root_seen = false;
  std::size_t i = 0;
  auto fail = [&](const std::string& what) {
    x.error = what + " at byte " + std::to_string(i);
    return x;
  };
  auto is_name = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '-' || c == '_' || c == ':' ||
           c == '.';
  };
  auto name_at = [&]() {
    const std::size_t b = i;
    while (i < s.size() && is_name(s[i])) ++i;
    return s.substr(b, i - b);
  };
  auto skip_space = [&]() {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i])) != 0) ++i;
  };
  while (i < s.size()) {
    if (s[i] != '<') {
      std::size_t j = s.find('<', i);
      if (j == std::string::npos) j = s.size();
      const std::string text = s.substr(i, j - i);
      if (open.empty()) {
        if (text.find_first_not_of(" \t\r\n") != std::string::npos) {
          return fail("text outside the root element");
        }
      } else if (!unescape(text, x.elements[static_cast<std::size_t>(open.back())].text)) {
        return fail("a bare '&' or an unknown entity in text");
      }
      i = j;
      continue;
    }
    if (s.compare(i, 4, "<!--") == 0 || s.compare(i, 2, "<?") == 0) {
      const bool comment = s[i + 1] == '!';
      const std::size_t j = s.find(comment ? "-->" : "?>", i + 2);
      if (j == std::string::npos) return fail("unterminated comment or declaration");
      i = j + (comment ? 3 : 2);
      continue;
    }
    if (s.compare(i, 2, "</") == 0) {
      i += 2;
      const std::string name = name_at();
      skip_space();
      if (i >= s.size() || s[i] != '>') return fail("bad end tag </" + name);
      ++i;
      if (open.empty()) return fail("end tag </" + name + "> with nothing open");
      const std::string& top = x.elements[static_cast<std::size_t>(open.back())].name;
      if (top != name) return fail("</" + name + "> closes <" + top + ">");
      open.pop_back();
      continue;
    }
    ++i;
    Element e;
    e.name = name_at();
    if (e.name.empty()) return fail("a '<' that starts no tag");
    if (open.empty() && root_seen) return fail("a second root element <" + e.name + ">");
    root_seen = true;
    e.parent = open.empty() ? -1 : open.back();
    for (;;) {
      const std::size_t before = i;
      skip_space();
      if (i + 1 < s.size() && s[i] == '/' && s[i + 1] == '>') {
        i += 2;
        x.elements.push_back(e);
        break;
      }
      if (i < s.size() && s[i] == '>') {
        ++i;
        x.elements.push_back(e);
        open.push_back(static_cast<int>(x.elements.size()) - 1);
        break;
      }
      if (i == before) return fail("attributes of <" + e.name + "> not separated by space");
      const std::string attr = name_at();
      if (attr.empty()) return fail("bad attribute in <" + e.name + ">");
      skip_space();
      if (i >= s.size() || s[i] != '=') return fail("attribute " + attr + " without '='");
      ++i;
      skip_space();
      if (i >= s.size() || (s[i] != '"' && s[i] != '\'')) {
        return fail("attribute " + attr + " not quoted");
      }
      const char quote = s[i++];
      const std::size_t end = s.find(quote, i);
      if (end == std::string::npos) return fail("unterminated attribute " + attr);
      const std::string raw = s.substr(i, end - i);
      if (raw.find('<') != std::string::npos) return fail("'<' in attribute " + attr);
      std::string value;
      if (!unescape(raw, value)) return fail("a bare '&' in attribute " + attr);
      if (!e.attrs.emplace(attr, value).second) return fail("attribute " + attr + " twice");
      i = end + 1;
    }
  }
  if (!open.empty()) {
    return fail("<" + x.elements[static_cast<std::size_t>(open.back())].name + "> never closed");
  }
  if (!root_seen) return fail("no root element");
  return x;
}

// "x1,y1 x2,y2 ...": the points of a polyline.
std::vector<std::pair<double, double>> points(const std::string& text) {
  std::vector<std::pair<double, double>> out;
  std::istringstream in(text);
  std::string pair;
  while (in >> pair) {
    const std::size_t comma = pair.find(',');
    if (comma == std::string::npos) return {};
    out.emplace_back(std::stod(pair.substr(0, comma)), std::stod(pair.substr(comma + 1)));
  }
  return out;
}

std::string all_text(const Xml& x) {
  std::string t;
  for (const Element& e : x.elements) t += e.text + "\n";
  return t;
}

// ---- The tests

// The checker itself: what it must refuse, so that the tests below can fail.
TEST(Xml, TheCheckerRefusesMalformedDocuments) {
  EXPECT_EQ(parse_xml("<svg a=\"1\"><g><rect x='2'/></g><text>a &amp; b</text></svg>").error, "");
  for (const char* bad :
       {"<svg><g></svg>", "<svg><text>a & b</text></svg>", "<svg a=\"1\" a=\"2\"/>", "<svg x=1/>",
        "<svg/><svg/>", "<svg><g>", "<svg a=\"1\"b=\"2\"/>", "</svg>", "<svg>&bogus;</svg>",
        "text<svg/>", "<svg a=\"<\"/>"}) {
    EXPECT_NE(parse_xml(bad).error, "") << bad;
  }
  const Xml x = parse_xml("<svg><g class=\"k\"><text>a &lt; b</text></g><text>c</text></svg>");
  ASSERT_EQ(x.error, "");
  ASSERT_EQ(x.elements.size(), 4u);
  EXPECT_EQ(x.elements[2].text, "a < b");
  EXPECT_TRUE(x.inside(2, "g", "k"));
  EXPECT_FALSE(x.inside(3, "g", "k"));
}

// The chart writer: text that XML would misread is escaped (a series named with markup is still
// one well-formed polyline, its name intact), and the axes get nice ticks around the data.
TEST(SvgChart, TextIsEscapedAndTicksAreNice) {
  EXPECT_EQ(zero::svg::escape("a<b & \"c\" 'd'>\x01"),
            "a&lt;b &amp; &quot;c&quot; &apos;d&apos;&gt;");
  zero::svg::LineChart chart;
  chart.title = "loss <stage 3> & \"friends\"";
  chart.series.push_back({.name = "a<b&c", .color = "#000", .points = {{1, 2}, {2, 1}, {3, 0.5}}});
  const Xml x = parse_xml(zero::svg::document(chart.width, chart.height, zero::svg::render(chart)));
  ASSERT_EQ(x.error, "");
  const std::vector<int> series = x.find("polyline", "series");
  ASSERT_EQ(series.size(), 1u);
  EXPECT_EQ(x.elements[static_cast<std::size_t>(series[0])].attrs.at("data-series"), "a<b&c");
  EXPECT_EQ(points(x.elements[static_cast<std::size_t>(series[0])].attrs.at("points")).size(), 3u);
  EXPECT_NE(all_text(x).find("loss <stage 3> & \"friends\""), std::string::npos);

  const zero::svg::Ticks t = zero::svg::nice_ticks(2.35, 4.36, 6);
  EXPECT_DOUBLE_EQ(t.step, 0.5);
  EXPECT_DOUBLE_EQ(t.lo, 2.0);
  EXPECT_DOUBLE_EQ(t.hi, 4.5);
  EXPECT_EQ(t.values.size(), 6u);
  const zero::svg::Ticks steps = zero::svg::nice_ticks(1, 150, 8);
  EXPECT_DOUBLE_EQ(steps.step, 20);
  EXPECT_DOUBLE_EQ(steps.lo, 0);
  EXPECT_DOUBLE_EQ(steps.hi, 160);
  const zero::svg::Ticks one = zero::svg::nice_ticks(3, 3);  // one value: a range around it
  EXPECT_LT(one.lo, 3);
  EXPECT_GT(one.hi, 3);
  EXPECT_EQ(zero::svg::tick_label(0.25, 0.05), "0.25");
  EXPECT_EQ(zero::svg::tick_label(200, 50), "200");
  EXPECT_EQ(zero::svg::tick_label(2.5, 0.5), "2.5");
}

constexpr const char* kTinyModel = " --layers 2 --dim 32 --heads 2 --seq 16";

TEST(ZeroTrain, PlotHasOnePointPerStepAndPerEvaluation) {
  const zero::testing::TempDir tmp;
  const std::string plot = tmp.file("loss.svg");
  const CmdResult r =
      run(std::string(ZERO_TRAIN_BIN) + kTinyModel +
          " --batch 2 --ranks 2 --zero-stage 1 --steps 12 --eval-every 5 --plot " + plot);
  ASSERT_EQ(r.status, 0) << r.out;
  // Off a terminal zero-train adds nothing: no carriage returns, no escape codes, no status.
  EXPECT_EQ(r.out.find('\r'), std::string::npos);
  EXPECT_EQ(r.out.find('\033'), std::string::npos);
  EXPECT_EQ(r.out.find("zero-train: step"), std::string::npos);
  const Xml x = parse_xml(read_file(plot));
  ASSERT_EQ(x.error, "") << plot;
  ASSERT_EQ(x.elements.front().name, "svg");
  const double width = std::stod(x.elements.front().attrs.at("width"));
  const double height = std::stod(x.elements.front().attrs.at("height"));
  const std::vector<int> series = x.find("polyline", "series");
  ASSERT_EQ(series.size(), 2u);
  std::map<std::string, std::vector<std::pair<double, double>>> by_name;
  for (int i : series) {
    const Element& e = x.elements[static_cast<std::size_t>(i)];
    by_name[e.attrs.at("data-series")] = points(e.attrs.at("points"));
  }
  std::vector<std::pair<double, double>> train, val;
  for (const auto& [name, p] : by_name) {
    (name.find("training") != std::string::npos ? train : val) = p;
  }
  EXPECT_EQ(train.size(), 12u);  // every step
  EXPECT_EQ(val.size(), 3u);     // steps 5, 10 and the last (12)
  for (const auto* curve : {&train, &val}) {
    for (std::size_t k = 0; k < curve->size(); ++k) {
      const auto [px, py] = (*curve)[k];
      EXPECT_TRUE(px >= 0 && px <= width && py >= 0 && py <= height) << px << "," << py;
      if (k > 0) {
        EXPECT_GT(px, (*curve)[k - 1].first);  // steps in order, left to right
      }
    }
  }
  // The validation points are at training steps 5, 10 and 12: the same x as those.
  ASSERT_EQ(val.size(), 3u);
  ASSERT_EQ(train.size(), 12u);
  EXPECT_NEAR(val[0].first, train[4].first, 0.01);
  EXPECT_NEAR(val[1].first, train[9].first, 0.01);
  EXPECT_NEAR(val[2].first, train[11].first, 0.01);
  // The loss falls: the last training point sits lower on the chart (larger y) than the first.
  EXPECT_GT(train.back().second, train.front().second);
  EXPECT_EQ(x.find("circle").size(), 3u + 1u);  // a marker per evaluation, one in the legend
  const std::string text = all_text(x);
  for (const char* needle : {"stage 1", "2 ranks", "parameters", "training loss", "validation loss",
                             "step\n", "loss ("}) {
    EXPECT_NE(text.find(needle), std::string::npos) << needle << " not in the text:\n" << text;
  }
  EXPECT_GE(x.find("text").size(), 12u);  // ticks on both axes
}

TEST(ZeroBench, SvgHasAStepTimeBarPerConfiguration) {
  const zero::testing::TempDir tmp;
  const std::string svg = tmp.file("bench.svg"), json = tmp.file("bench.json");
  const CmdResult r =
      run(std::string(ZERO_BENCH_BIN) + kTinyModel +
          " --ranks 2 --steps 2 --batch 1 --offload none,cpu --svg " + svg + " --json " + json);
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json all = nlohmann::json::parse(read_file(json));
  ASSERT_EQ(all.size(), 14u);  // stages 0-3 x {none, sqrt}, then 1-3 x {none, sqrt} offloaded
  // Off a terminal: one plain line per configuration as it starts, in order.
  EXPECT_EQ(r.out.find('\r'), std::string::npos);
  EXPECT_EQ(r.out.find('\033'), std::string::npos);
  EXPECT_EQ(count(r.out, "[zero-bench] configuration "), 14) << r.out;
  EXPECT_NE(r.out.find("[zero-bench] configuration 1/14: stage 0\n"), std::string::npos);
  EXPECT_NE(r.out.find("[zero-bench] configuration 14/14: stage 3 +ckpt sqrt +off cpu\n"),
            std::string::npos);

  const Xml x = parse_xml(read_file(svg));
  ASSERT_EQ(x.error, "") << svg;
  const std::vector<int> bars = x.find("g", "bar");
  ASSERT_EQ(bars.size(), all.size());
  // Each bar: the stack's height over the step time is the same for all (one scale), and the
  // thin bar of the executing time is there; labelled as the memory chart labels its bars.
  std::vector<std::string> step_labels, memory_labels;
  std::vector<double> stack_px(bars.size(), 0), marker_px(bars.size(), -1);
  for (std::size_t i = 0; i < x.elements.size(); ++i) {
    const Element& e = x.elements[i];
    const int idx = static_cast<int>(i);
    const bool in_step_chart = x.inside(idx, "g", "bar-chart");
    if (e.name == "text" && e.text.rfind("stage ", 0) == 0) {
      (in_step_chart ? step_labels : memory_labels).push_back(e.text);
    }
    for (std::size_t b = 0; b < bars.size(); ++b) {
      if (e.name != "rect" || e.parent != bars[b]) continue;
      // The rect's tooltip (its <title> child) names what it is.
      std::string what;
      for (std::size_t t = i + 1; t < x.elements.size(); ++t) {
        if (x.elements[t].parent == idx && x.elements[t].name == "title") {
          what = x.elements[t].text;
        }
      }
      const double h = std::stod(e.attrs.at("height"));
      if (what.rfind("communication executing", 0) == 0) {
        marker_px[b] = h;
      } else {
        stack_px[b] += h;
      }
    }
  }
  std::vector<std::string> expected;
  for (const auto& c : all) expected.push_back("stage " + std::to_string(c["stage"].get<int>()));
  EXPECT_EQ(step_labels, expected);
  EXPECT_EQ(memory_labels, expected);
  double px_per_ms = 0;
  for (std::size_t b = 0; b < bars.size(); ++b) {
    const auto& r0 = all[b]["per_rank"][0];
    const double step = std::max(r0["step_ms"].get<double>(), r0["comm_wait_ms"].get<double>());
    ASSERT_GT(step, 0);
    if (b == 0) px_per_ms = stack_px[0] / step;
    EXPECT_NEAR(stack_px[b] / step, px_per_ms, 0.01 * px_per_ms + 0.02 / step) << "bar " << b;
    EXPECT_GE(marker_px[b], 0) << "bar " << b << " has no bar of the executing time";
    EXPECT_NEAR(marker_px[b], r0["comm_busy_ms"].get<double>() * px_per_ms,
                0.1 + 0.002 * marker_px[b])
        << "bar " << b;
  }
  const std::string text = all_text(x);
  for (const char* needle :
       {"step time", "ms per step", "communication exposed", "communication executing",
        "rest of the step", "memory per rank", "ckpt sqrt", "offload cpu"}) {
    EXPECT_NE(text.find(needle), std::string::npos) << needle << " not in the text";
  }
}

TEST(Progress, OnATerminalTheStatusLineIsRedrawnInPlaceAndGoneAtTheEnd) {
  const CmdResult r = run_on_terminal(std::string(ZERO_TRAIN_BIN) + kTinyModel +
                                      " --batch 2 --ranks 2 --steps 8 --eval-every 4");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("\r\033[Kzero-train: step 8/8, "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(", ETA "), std::string::npos) << r.out;
  std::string error;
  const std::vector<std::string> rows = screen(r.out, &error);
  ASSERT_EQ(error, "");
  // What stays on the screen: the program's stdout lines, each whole and on its own row.
  int step_rows = 0, eval_rows = 0;
  for (const std::string& row : rows) {
    EXPECT_EQ(row.find("zero-train: step"), std::string::npos) << "left on the screen: " << row;
    if (row.find(" | loss ") != std::string::npos) {
      ++step_rows;
      EXPECT_EQ(row.rfind("step ", 0), 0u) << "a step line shares its row: " << row;
    }
    if (row.find("validation loss") != std::string::npos) {
      ++eval_rows;
      EXPECT_EQ(row.rfind("eval ", 0), 0u) << "an eval line shares its row: " << row;
    }
  }
  EXPECT_EQ(step_rows, 8);
  EXPECT_EQ(eval_rows, 2);

  const CmdResult b = run_on_terminal(std::string(ZERO_BENCH_BIN) + kTinyModel +
                                      " --ranks 2 --steps 2 --batch 1 --stages 0,3 --checkpoint "
                                      "none --offload none");
  ASSERT_EQ(b.status, 0) << b.out;
  EXPECT_NE(b.out.find("\r\033[Kzero-bench: configuration 2/2 (stage 3) step 2/2, ETA "),
            std::string::npos)
      << b.out;
  EXPECT_EQ(b.out.find("[zero-bench] configuration"), std::string::npos);  // not as lines
  const std::vector<std::string> bench_rows = screen(b.out, &error);
  ASSERT_EQ(error, "");
  for (const std::string& row : bench_rows) {
    EXPECT_EQ(row.find("zero-bench: configuration"), std::string::npos) << "left: " << row;
  }
  EXPECT_EQ(count(b.out, "== stage "), 2);
}

TEST(Progress, NoProgressWritesNothingAnywhere) {
  const CmdResult t = run_on_terminal(std::string(ZERO_TRAIN_BIN) + kTinyModel +
                                      " --batch 2 --ranks 2 --steps 3 --no-progress");
  ASSERT_EQ(t.status, 0) << t.out;
  EXPECT_EQ(t.out.find('\033'), std::string::npos);
  EXPECT_EQ(t.out.find("zero-train: step"), std::string::npos);
  const CmdResult b = run(std::string(ZERO_BENCH_BIN) + kTinyModel +
                          " --ranks 2 --steps 2 --batch 1 --stages 0 --checkpoint none "
                          "--offload none --no-progress");
  ASSERT_EQ(b.status, 0) << b.out;
  EXPECT_EQ(b.out.find("[zero-bench] configuration"), std::string::npos);
  EXPECT_EQ(b.out.find('\033'), std::string::npos);
}

}  // namespace
