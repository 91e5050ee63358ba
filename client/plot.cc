#include "client/plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

namespace oomb::client {
namespace {

// The SVG's layout, pixels: a 2 × 2 grid of panels below the title.
constexpr int kWidth = 960, kHeight = 640, kTitleHeight = 40;
constexpr int kPanelWidth = kWidth / 2, kPanelHeight = (kHeight - kTitleHeight) / 2;
// A panel's plot area inside it: room for the y labels on the left, the panel's title above,
// the step labels below.
constexpr int kLeft = 80, kRight = 20, kTop = 34, kBottom = 36;
constexpr size_t kMostPoints = 2000;

// Text content of an element: & < > escaped (the title holds a display name).
std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

struct Series {
  const std::vector<double>* x;
  const std::vector<double>* y;
  const char* name;
  const char* color;
  bool markers;  // points (the validation loss) rather than a line
};

struct Range {
  double lo = 0, hi = 1;
};

Range Extent(const std::vector<const std::vector<double>*>& all) {
  Range r{INFINITY, -INFINITY};
  for (const std::vector<double>* v : all) {
    for (double d : *v) {
      if (!std::isfinite(d)) continue;
      r.lo = std::min(r.lo, d);
      r.hi = std::max(r.hi, d);
    }
  }
  if (!std::isfinite(r.lo)) return Range{};
  if (r.hi == r.lo) {  // a flat series: a band around it
    const double pad = r.lo == 0 ? 1 : std::abs(r.lo) * 0.05;
    r.lo -= pad;
    r.hi += pad;
  }
  return r;
}

// One panel at (x0, y0): a frame, the y range's ends and the step range's ends as labels, its
// series as polylines (or circles), and a legend in its title line.
void Panel(std::ostringstream& svg, int x0, int y0, const std::string& title, const Range& steps,
           const std::vector<Series>& series, double scale) {
  const int left = x0 + kLeft, top = y0 + kTop;
  const int w = kPanelWidth - kLeft - kRight, h = kPanelHeight - kTop - kBottom;
  std::vector<const std::vector<double>*> ys;
  for (const Series& s : series) ys.push_back(s.y);
  const Range r = Extent(ys);
  const auto px = [&](double step) { return left + (step - steps.lo) / (steps.hi - steps.lo) * w; };
  const auto py = [&](double v) { return top + h - (v - r.lo) / (r.hi - r.lo) * h; };
  svg << fmt::format(R"(<g class="panel"><text x="{}" y="{}" font-size="14" font-weight="bold">{}</text>)", left,
                     y0 + 20, Escape(title));
  int legend_x = left + 8 * static_cast<int>(title.size()) + 24;
  for (const Series& s : series) {
    svg << fmt::format(R"(<text x="{}" y="{}" font-size="12" fill="{}">{}</text>)", legend_x, y0 + 20, s.color, s.name);
    legend_x += 8 * static_cast<int>(std::string(s.name).size()) + 16;
  }
  svg << fmt::format(R"(<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#888"/>)", left, top, w, h);
  for (const double v : {r.lo, r.hi}) {
    svg << fmt::format(R"(<text x="{}" y="{:.1f}" font-size="11" text-anchor="end">{:.4g}</text>)", left - 6, py(v) + 4,
                       v / scale);
  }
  for (const double s : {steps.lo, steps.hi}) {
    svg << fmt::format(R"(<text x="{:.1f}" y="{}" font-size="11" text-anchor="middle">{:.0f}</text>)", px(s),
                       top + h + 16, s);
  }
  svg << fmt::format(R"(<text x="{}" y="{}" font-size="11" text-anchor="middle" fill="#555">step</text>)", left + w / 2,
                     top + h + 30);
  for (const Series& s : series) {
    const size_t n = s.y->size();
    if (n == 0) continue;
    const size_t every = (n + kMostPoints - 1) / kMostPoints;
    if (s.markers || n == 1) {  // (one point is no line)
      for (size_t i = 0; i < n; i += every) {
        svg << fmt::format(R"(<circle cx="{:.1f}" cy="{:.1f}" r="3.5" fill="{}"/>)", px((*s.x)[i]), py((*s.y)[i]),
                           s.color);
      }
      continue;
    }
    svg << fmt::format(R"(<polyline fill="none" stroke="{}" stroke-width="1.5" data-series="{}" points=")", s.color,
                       s.name);
    for (size_t i = 0; i < n; i += every) svg << fmt::format("{:.1f},{:.1f} ", px((*s.x)[i]), py((*s.y)[i]));
    if ((n - 1) % every != 0) svg << fmt::format("{:.1f},{:.1f}", px((*s.x)[n - 1]), py((*s.y)[n - 1]));
    svg << R"("/>)";
  }
  svg << "</g>\n";
}

}  // namespace

JobCurves CurvesFromEvents(const std::vector<v1::JobEvent>& events) {
  std::map<int64_t, const v1::Progress*> by_step;  // the newest report of each step
  for (const v1::JobEvent& e : events) {
    if (e.type() == v1::JobEvent::STEP && e.progress().step() > 0) by_step[e.progress().step()] = &e.progress();
  }
  JobCurves c;
  double last_eval = 0;
  for (const auto& [step, p] : by_step) {
    c.step.push_back(static_cast<double>(step));
    c.loss.push_back(p->loss());
    c.learning_rate.push_back(p->learning_rate());
    c.tokens_per_second.push_back(p->tokens_per_second());
    c.device_bytes.push_back(static_cast<double>(p->gpu_memory_bytes()));
    c.host_bytes.push_back(static_cast<double>(p->host_memory_bytes()));
    if (p->eval_loss() > 0 && p->eval_loss() != last_eval) {  // Progress carries the last one on
      c.eval_step.push_back(static_cast<double>(step));
      c.eval_loss.push_back(p->eval_loss());
    }
    last_eval = p->eval_loss();
  }
  return c;
}

std::string Sparkline(const std::vector<double>& values, int width) {
  static constexpr const char* kBlocks[] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  if (values.empty() || width < 1) return "";
  const size_t n = values.size(), cells = std::min(n, static_cast<size_t>(width));
  std::vector<double> means(cells, 0);
  for (size_t i = 0; i < cells; ++i) {
    const size_t begin = i * n / cells, end = (i + 1) * n / cells;
    for (size_t k = begin; k < end; ++k) means[i] += values[k];
    means[i] /= static_cast<double>(end - begin);
  }
  const auto [lo, hi] = std::minmax_element(means.begin(), means.end());
  std::string out;
  for (double m : means) {
    const int level = *hi == *lo ? 3 : static_cast<int>(std::lround((m - *lo) / (*hi - *lo) * 7));
    out += kBlocks[std::clamp(level, 0, 7)];
  }
  return out;
}

std::string PlotSvg(const JobCurves& c, const std::string& title) {
  const Range steps = Extent({&c.step});
  constexpr double kMiB = 1024.0 * 1024.0;
  std::ostringstream svg;
  svg << fmt::format(R"(<svg xmlns="http://www.w3.org/2000/svg" width="{0}" height="{1}" viewBox="0 0 {0} {1}" )"
                     R"(font-family="DejaVu Sans, Arial, sans-serif">)"
                     "\n"
                     R"(<rect width="{0}" height="{1}" fill="white"/>)"
                     "\n"
                     R"(<text x="{2}" y="26" font-size="18" text-anchor="middle">{3}</text>)"
                     "\n",
                     kWidth, kHeight, kWidth / 2, Escape(title));
  const int y1 = kTitleHeight, y2 = kTitleHeight + kPanelHeight;
  Panel(svg, 0, y1, "loss", steps,
        {{&c.step, &c.loss, "train", "#1f77b4", false}, {&c.eval_step, &c.eval_loss, "validation", "#d62728", true}},
        1);
  Panel(svg, kPanelWidth, y1, "learning rate", steps, {{&c.step, &c.learning_rate, "lr", "#2ca02c", false}}, 1);
  Panel(svg, 0, y2, "tokens/s", steps, {{&c.step, &c.tokens_per_second, "last step", "#9467bd", false}}, 1);
  Panel(svg, kPanelWidth, y2, "memory (MiB)", steps,
        {{&c.step, &c.device_bytes, "device peak", "#ff7f0e", false},
         {&c.step, &c.host_bytes, "host KV", "#8c564b", false}},
        kMiB);
  svg << "</svg>\n";
  return svg.str();
}

}  // namespace oomb::client
