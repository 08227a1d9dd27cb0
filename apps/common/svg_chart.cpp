#include "common/svg_chart.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace zero::svg {

namespace {

// Text width estimate for the layout (no font metrics here): sans-serif (DejaVu Sans, Liberation
// Sans, Arial) averages ~0.55 em per character in Latin text.
double text_width(std::string_view text, double font_size) {
  return 0.55 * font_size * static_cast<double>(text.size());
}

// Heckbert's nicenum, rounding: the nice number (1, 2, 5 x 10^k) nearest x > 0.
double nice_number(double x) {
  const double exp = std::floor(std::log10(x));
  const double f = x / std::pow(10.0, exp);
  const double nf = f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10;
  return nf * std::pow(10.0, exp);
}

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", v);
  return b;
}

constexpr const char* kGrid = "#e4e4e4";
constexpr const char* kAxis = "#555";
constexpr const char* kText = "#222";

}  // namespace

std::string escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\t' || c == '\n') out += c;
    }
  }
  return out;
}

Ticks nice_ticks(double lo, double hi, int target) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) lo = 0, hi = 1;
  if (lo > hi) std::swap(lo, hi);
  if (hi - lo < 1e-12 * std::max(1.0, std::fabs(hi))) {  // one value: a range around it
    const double pad = lo == 0 ? 1 : std::fabs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  target = std::max(target, 2);
  Ticks t;
  // The step from the data's range itself (Heckbert first rounds the range up to a nice
  // number, which can halve the ticks: 2.0-4.4 would get 2, 3, 4, 5).
  t.step = nice_number((hi - lo) / target);
  t.lo = std::floor(lo / t.step) * t.step;
  t.hi = std::ceil(hi / t.step) * t.step;
  const auto n = static_cast<int>(std::llround((t.hi - t.lo) / t.step));
  for (int i = 0; i <= n; ++i) {
    double v = t.lo + i * t.step;
    if (std::fabs(v) < t.step * 1e-9) v = 0;  // -0.0 and 1e-17 print as 0
    t.values.push_back(v);
  }
  return t;
}

std::string tick_label(double value, double step) {
  char b[32];
  const double mag = std::max(std::fabs(value), step);
  if (mag >= 1e6 || (mag < 1e-4 && mag > 0)) {
    std::snprintf(b, sizeof b, "%.2g", value);
    return b;
  }
  const int decimals = std::clamp(static_cast<int>(std::ceil(-std::log10(step) - 1e-9)), 0, 6);
  std::snprintf(b, sizeof b, "%.*f", decimals, value);
  return b;
}

std::string document(double width, double height, const std::string& body) {
  std::ostringstream os;
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << std::ceil(width) << "\" height=\""
     << std::ceil(height) << "\" viewBox=\"0 0 " << std::ceil(width) << ' ' << std::ceil(height)
     << "\" font-family=\"sans-serif\" font-size=\"12\" fill=\"" << kText << "\">\n"
     << "<rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>\n"
     << body << "</svg>\n";
  return os.str();
}

// ---- Line chart

std::string render(const LineChart& chart, double x, double y) {
  std::ostringstream os;
  os << "<g class=\"line-chart\">\n";
  os << "<text class=\"title\" x=\"" << num(x + 16) << "\" y=\"" << num(y + 24)
     << "\" font-size=\"15\" font-weight=\"bold\">" << escape(chart.title) << "</text>\n";
  // Legend: one row under the title.
  os << "<g class=\"legend\">\n";
  double lx = x + 16;
  const double ly = y + 46;
  for (const Series& s : chart.series) {
    os << "<line x1=\"" << num(lx) << "\" y1=\"" << num(ly - 4) << "\" x2=\"" << num(lx + 24)
       << "\" y2=\"" << num(ly - 4) << "\" stroke=\"" << s.color << "\" stroke-width=\"2.5\"/>";
    if (s.markers) {
      os << "<circle cx=\"" << num(lx + 12) << "\" cy=\"" << num(ly - 4) << "\" r=\"3.5\" fill=\""
         << s.color << "\"/>";
    }
    os << "<text x=\"" << num(lx + 30) << "\" y=\"" << num(ly) << "\">" << escape(s.name)
       << "</text>\n";
    lx += 30 + text_width(s.name, 12) + 28;
  }
  os << "</g>\n";
  // The data's range.
  double x_lo = INFINITY, x_hi = -INFINITY, y_lo = INFINITY, y_hi = -INFINITY;
  for (const Series& s : chart.series) {
    for (const Point& p : s.points) {
      if (!std::isfinite(p.x) || !std::isfinite(p.y)) continue;
      x_lo = std::min(x_lo, p.x), x_hi = std::max(x_hi, p.x);
      y_lo = std::min(y_lo, p.y), y_hi = std::max(y_hi, p.y);
    }
  }
  if (chart.y_from_zero) y_lo = std::min(0.0, y_lo);
  const Ticks xt = nice_ticks(x_lo, x_hi, 8);
  const Ticks yt = nice_ticks(y_lo, y_hi, 6);
  const double left = x + 72, right = x + chart.width - 24;
  const double top = y + 64, bottom = y + chart.height - 50;
  auto px = [&](double v) { return left + (v - xt.lo) / (xt.hi - xt.lo) * (right - left); };
  auto py = [&](double v) { return bottom - (v - yt.lo) / (yt.hi - yt.lo) * (bottom - top); };
  // Grid, ticks and their labels.
  os << "<g class=\"axis\">\n";
  for (double v : yt.values) {
    os << "<line x1=\"" << num(left) << "\" y1=\"" << num(py(v)) << "\" x2=\"" << num(right)
       << "\" y2=\"" << num(py(v)) << "\" stroke=\"" << kGrid << "\"/>"
       << "<text x=\"" << num(left - 7) << "\" y=\"" << num(py(v) + 4) << "\" text-anchor=\"end\">"
       << tick_label(v, yt.step) << "</text>\n";
  }
  for (double v : xt.values) {
    os << "<line x1=\"" << num(px(v)) << "\" y1=\"" << num(top) << "\" x2=\"" << num(px(v))
       << "\" y2=\"" << num(bottom + 5) << "\" stroke=\"" << kGrid << "\"/>"
       << "<text x=\"" << num(px(v)) << "\" y=\"" << num(bottom + 19)
       << "\" text-anchor=\"middle\">" << tick_label(v, xt.step) << "</text>\n";
  }
  os << "<rect x=\"" << num(left) << "\" y=\"" << num(top) << "\" width=\"" << num(right - left)
     << "\" height=\"" << num(bottom - top) << "\" fill=\"none\" stroke=\"" << kAxis << "\"/>\n";
  os << "<text x=\"" << num((left + right) / 2) << "\" y=\"" << num(bottom + 40)
     << "\" text-anchor=\"middle\">" << escape(chart.x_label) << "</text>\n";
  const double yl_x = x + 18, yl_y = (top + bottom) / 2;
  os << "<text x=\"" << num(yl_x) << "\" y=\"" << num(yl_y) << "\" text-anchor=\"middle\" "
     << "transform=\"rotate(-90 " << num(yl_x) << ' ' << num(yl_y) << ")\">"
     << escape(chart.y_label) << "</text>\n";
  os << "</g>\n";
  // The series: one polyline each (drawn in order: the last on top).
  for (const Series& s : chart.series) {
    os << "<polyline class=\"series\" data-series=\"" << escape(s.name)
       << "\" fill=\"none\" stroke=\"" << s.color << "\" stroke-width=\"" << s.stroke_width
       << "\" stroke-linejoin=\"round\" points=\"";
    bool first = true;
    for (const Point& p : s.points) {
      if (!std::isfinite(p.x) || !std::isfinite(p.y)) continue;
      os << (first ? "" : " ") << num(px(p.x)) << ',' << num(py(p.y));
      first = false;
    }
    os << "\"/>\n";
    if (s.markers) {
      os << "<g class=\"markers\" fill=\"" << s.color << "\">";
      for (const Point& p : s.points) {
        if (!std::isfinite(p.x) || !std::isfinite(p.y)) continue;
        os << "<circle cx=\"" << num(px(p.x)) << "\" cy=\"" << num(py(p.y))
           << "\" r=\"3.5\"><title>" << escape(s.name) << ": " << tick_label(p.x, 1) << ", "
           << tick_label(p.y, 0.0001) << "</title></circle>";
      }
      os << "</g>\n";
    }
  }
  os << "</g>\n";
  return os.str();
}

// ---- Stacked bar chart

namespace {

constexpr double kBarTop = 48;     // the plot's top below the box's: the title above it
constexpr double kLabelLine = 16;  // a label line under the bars
constexpr double kMarkerWidth = 10, kMarkerGap = 3;

double legend_width(const BarChart& c) {
  double w = 0;
  for (const auto& s : c.segments) w = std::max(w, text_width(s.name, 12));
  w = std::max(w, text_width(c.marker.name, 12));
  return 20 + 20 + w + 10;  // gap, swatch, text, margin
}

std::size_t label_lines(const BarChart& c) {
  std::size_t n = 0;
  for (const auto& b : c.bars) n = std::max(n, b.label.size());
  return n;
}

std::string amount(double v) {
  char b[32];
  std::snprintf(b, sizeof b, v >= 100 ? "%.0f" : v >= 10 ? "%.1f" : "%.2f", v);
  return b;
}

}  // namespace

double width(const BarChart& c) {
  const double plot = c.plot_left + static_cast<double>(c.bars.size()) * c.slot;
  return std::max(plot + legend_width(c), c.plot_left + text_width(c.title, 15) + 16);
}

double height(const BarChart& c) {
  return kBarTop + c.plot_height + 8 + kLabelLine * static_cast<double>(label_lines(c)) + 12;
}

std::string render(const BarChart& c, double x, double y) {
  std::ostringstream os;
  os << "<g class=\"bar-chart\">\n";
  // The title over the plot (a panel above with the same plot_left lines up with it).
  os << "<text class=\"title\" x=\"" << num(x + c.plot_left) << "\" y=\"" << num(y + 24)
     << "\" font-size=\"15\" font-weight=\"bold\">" << escape(c.title) << "</text>\n";
  double max_v = 0;
  for (const auto& b : c.bars) {
    double total = 0;
    for (double v : b.values) total += std::max(0.0, v);
    max_v = std::max(max_v, total);
    if (std::isfinite(b.marker)) max_v = std::max(max_v, b.marker);
  }
  const Ticks yt = nice_ticks(0, max_v > 0 ? max_v : 1, 5);
  const double left = x + c.plot_left;
  const double right = left + static_cast<double>(c.bars.size()) * c.slot;
  const double top = y + kBarTop, bottom = top + c.plot_height;
  auto py = [&](double v) { return bottom - (v - yt.lo) / (yt.hi - yt.lo) * c.plot_height; };
  os << "<g class=\"axis\">\n";
  for (double v : yt.values) {
    os << "<line x1=\"" << num(left - 5) << "\" y1=\"" << num(py(v)) << "\" x2=\"" << num(right)
       << "\" y2=\"" << num(py(v)) << "\" stroke=\"" << kGrid << "\"/>"
       << "<text x=\"" << num(left - 8) << "\" y=\"" << num(py(v) + 4) << "\" text-anchor=\"end\">"
       << tick_label(v, yt.step) << "</text>\n";
  }
  os << "<line x1=\"" << num(left) << "\" y1=\"" << num(bottom) << "\" x2=\"" << num(right)
     << "\" y2=\"" << num(bottom) << "\" stroke=\"" << kAxis << "\"/>\n";
  const double yl_x = x + 16, yl_y = (top + bottom) / 2;
  os << "<text x=\"" << num(yl_x) << "\" y=\"" << num(yl_y) << "\" text-anchor=\"middle\" "
     << "transform=\"rotate(-90 " << num(yl_x) << ' ' << num(yl_y) << ")\">" << escape(c.y_label)
     << "</text>\n";
  os << "</g>\n";
  const bool with_marker = !c.marker.name.empty();
  const double stack_w = with_marker ? c.bar_width - kMarkerWidth - kMarkerGap : c.bar_width;
  for (std::size_t i = 0; i < c.bars.size(); ++i) {
    const BarChart::Bar& b = c.bars[i];
    const double bx = left + 10 + static_cast<double>(i) * c.slot;
    os << "<g class=\"bar\">";
    double total = 0;
    for (std::size_t k = 0; k < b.values.size() && k < c.segments.size(); ++k) {
      const double v = std::max(0.0, b.values[k]);
      if (v > 0) {
        os << "<rect x=\"" << num(bx) << "\" y=\"" << num(py(total + v)) << "\" width=\""
           << num(stack_w) << "\" height=\"" << num(py(total) - py(total + v)) << "\" fill=\""
           << c.segments[k].color << "\"><title>" << escape(c.segments[k].name) << ": " << amount(v)
           << ' ' << escape(c.unit) << "</title></rect>";
      }
      total += v;
    }
    if (with_marker && std::isfinite(b.marker)) {
      const double m = std::max(0.0, b.marker);
      os << "<rect x=\"" << num(bx + stack_w + kMarkerGap) << "\" y=\"" << num(py(m))
         << "\" width=\"" << num(kMarkerWidth) << "\" height=\"" << num(py(0) - py(m))
         << "\" fill=\"" << c.marker.color << "\"><title>" << escape(c.marker.name) << ": "
         << amount(m) << ' ' << escape(c.unit) << "</title></rect>";
    }
    os << "<text x=\"" << num(bx + stack_w / 2) << "\" y=\"" << num(py(total) - 5)
       << "\" text-anchor=\"middle\">" << amount(total) << "</text>";
    for (std::size_t l = 0; l < b.label.size(); ++l) {
      if (b.label[l].empty()) continue;  // the row stays: lines line up across bars
      os << "<text x=\"" << num(bx + c.bar_width / 2) << "\" y=\""
         << num(bottom + 18 + kLabelLine * static_cast<double>(l)) << "\" text-anchor=\"middle\">"
         << escape(b.label[l]) << "</text>";
    }
    os << "</g>\n";
  }
  // Legend, right of the plot.
  os << "<g class=\"legend\">\n";
  const double lx = right + 20;
  double ly = top;
  auto entry = [&](const BarChart::Segment& s, double swatch_w) {
    os << "<rect x=\"" << num(lx + (14 - swatch_w) / 2) << "\" y=\"" << num(ly) << "\" width=\""
       << num(swatch_w) << "\" height=\"14\" fill=\"" << s.color << "\"/><text x=\"" << num(lx + 20)
       << "\" y=\"" << num(ly + 12) << "\">" << escape(s.name) << "</text>\n";
    ly += 20;
  };
  // Top of the stack first, as the eye reads the bars.
  for (std::size_t k = c.segments.size(); k-- > 0;) entry(c.segments[k], 14);
  if (with_marker) entry(c.marker, 6);
  os << "</g>\n</g>\n";
  return os.str();
}

}  // namespace zero::svg
