// common/svg_chart.hpp — small SVG charts for the example programs: a line chart (zero-train's
// loss curves) and a stacked bar chart (zero-bench's step time), each drawn as one <g> element so
// that a document can hold several panels; axes with "nice" ticks; text escaped for XML.
//
// The elements carry classes a test (or a stylesheet) can find: class="series" on a line chart's
// <polyline> (one per series, one point per finite Point, data-series="<name>"), class="bar" on a
// bar chart's <g> (one per bar), class="legend", class="title", class="axis".
//
// Thread safety: pure functions of their arguments.
#pragma once

#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace zero::svg {

// `text` for an SVG text node or a quoted attribute value: & < > " ' as entities; control bytes
// other than tab and newline (not allowed in XML 1.0) dropped.
std::string escape(std::string_view text);

// Axis ticks at a "nice" step (1, 2 or 5 x 10^k) covering [lo, hi] in about `target` intervals
// (Heckbert, "Nice numbers for graph labels", Graphics Gems, 1990). lo == hi (or non-finite)
// still gives a usable range around them.
struct Ticks {
  double lo = 0, hi = 1;  // the axis: lo <= the data's min, hi >= its max, multiples of step
  double step = 1;
  std::vector<double> values;  // lo, lo + step, ..., hi
};
Ticks nice_ticks(double lo, double hi, int target = 5);
// A tick's text with as many decimals as `step` needs: "0.25", "1.5", "200"; "1.2e+06" for large.
std::string tick_label(double value, double step);

// A whole SVG document of width x height (pixels, white background) around `body`.
std::string document(double width, double height, const std::string& body);

// ---- Line chart

struct Point {
  double x = 0, y = 0;
};

struct Series {
  std::string name;           // the legend's text
  std::string color;          // CSS colour
  std::vector<Point> points;  // in order of x; non-finite points are left out
  bool markers = false;       // a dot at each point too (a sparse series: evaluations)
  double stroke_width = 1.5;
};

struct LineChart {
  std::string title, x_label, y_label;
  std::vector<Series> series;
  bool y_from_zero = false;  // the y axis starts at 0 (else at the data's nice minimum)
  double width = 820, height = 480;
};

// The chart in the box (x, y, chart.width, chart.height): title on top, the legend in a row
// under it, the plot with its axes and labels below.
std::string render(const LineChart& chart, double x = 0, double y = 0);

// ---- Stacked bar chart

struct BarChart {
  struct Segment {
    std::string name, color;
  };
  struct Bar {
    std::vector<std::string> label;  // lines of text under the bar
    std::vector<double> values;      // one per segment, stacked from the bottom
    // The thin bar beside the stack (BarChart::marker); NaN: none for this bar.
    double marker = std::numeric_limits<double>::quiet_NaN();
  };
  std::string title, y_label;
  std::string unit;  // after the numbers in tooltips and above the stacks ("ms")
  std::vector<Segment> segments;
  Segment marker;  // name empty: no thin bars
  std::vector<Bar> bars;
  // Geometry: the plot starts plot_left from the box's left edge; bar i is centred in
  // [plot_left + i * slot, plot_left + (i + 1) * slot) less a 10-pixel left margin, bar_width
  // wide (stack and thin bar together). Set them to line bars up with another panel's.
  double plot_left = 80, slot = 100, bar_width = 70, plot_height = 300;
};

// The box the chart needs: the plot, its labels and the legend on the right.
double width(const BarChart& chart);
double height(const BarChart& chart);
std::string render(const BarChart& chart, double x = 0, double y = 0);

}  // namespace zero::svg
