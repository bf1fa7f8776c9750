#include "worker/metrics/svg_plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <fstream>
#include <limits>

#include "common/error.h"

namespace dlaunch::metrics {
namespace {

struct Series {
  std::string label;
  std::string colour;
  bool dots;  // markers for sparse (per-epoch) series
  std::vector<std::pair<double, double>> points;
};

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// "Nice" tick step for a range: 1, 2 or 5 times a power of ten.
double tick_step(double span, int target) {
  double raw = span / std::max(target, 1);
  double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * mag >= raw) return m * mag;
  }
  return 10 * mag;
}

void panel(std::string& svg, double x0, double y0, double w, double h, const std::string& title,
           const std::string& y_label, std::vector<Series> series, bool zero_based) {
  double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin, ymin = xmin, ymax = -xmin;
  for (auto& s : series) {
    for (auto [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      xmin = std::min(xmin, x), xmax = std::max(xmax, x);
      ymin = std::min(ymin, y), ymax = std::max(ymax, y);
    }
  }
  svg += fmt::format(R"(<text x="{}" y="{}" font-size="14" text-anchor="middle">{}</text>)" "\n",
                     x0 + w / 2, y0 - 8, escape(title));
  svg += fmt::format(R"(<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#888"/>)" "\n",
                     x0, y0, w, h);
  if (!std::isfinite(xmin)) {
    svg += fmt::format(R"(<text x="{}" y="{}" font-size="12" text-anchor="middle">no data</text>)" "\n",
                       x0 + w / 2, y0 + h / 2);
    return;
  }
  if (zero_based) ymin = std::min(ymin, 0.0);
  if (xmax - xmin < 1e-9) xmax = xmin + 1;
  if (ymax - ymin < 1e-9) ymax = ymin + 1;
  ymax += (ymax - ymin) * 0.05;
  auto px = [&](double x) { return x0 + (x - xmin) / (xmax - xmin) * w; };
  auto py = [&](double y) { return y0 + h - (y - ymin) / (ymax - ymin) * h; };
  // Grid and tick labels.
  double ys = tick_step(ymax - ymin, 5);
  for (double t = std::ceil(ymin / ys) * ys; t <= ymax + 1e-12; t += ys) {
    svg += fmt::format(R"(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="#eee"/>)" "\n",
                       x0, py(t), x0 + w, py(t));
    svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="10" text-anchor="end">{:g}</text>)" "\n",
                       x0 - 4, py(t) + 3, t);
  }
  double xs = tick_step(xmax - xmin, 6);
  for (double t = std::ceil(xmin / xs) * xs; t <= xmax + 1e-12; t += xs) {
    svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="10" text-anchor="middle">{:g}</text>)" "\n",
                       px(t), y0 + h + 14, t);
  }
  svg += fmt::format(R"(<text x="{}" y="{}" font-size="11" text-anchor="middle">epoch</text>)" "\n",
                     x0 + w / 2, y0 + h + 30);
  svg += fmt::format(R"svg(<text x="{}" y="{}" font-size="11" text-anchor="middle" transform="rotate(-90 {} {})">{}</text>)svg" "\n",
                     x0 - 40, y0 + h / 2, x0 - 40, y0 + h / 2, escape(y_label));
  // Curves and legend.
  int legend = 0;
  for (auto& s : series) {
    if (s.points.empty()) continue;
    std::string pts;
    for (auto [x, y] : s.points) {
      if (std::isfinite(x) && std::isfinite(y)) pts += fmt::format("{:.1f},{:.1f} ", px(x), py(y));
    }
    svg += fmt::format(R"(<polyline fill="none" stroke="{}" stroke-width="{}" points="{}"/>)" "\n",
                       s.colour, s.dots ? 2 : 1, pts);
    if (s.dots) {
      for (auto [x, y] : s.points) {
        svg += fmt::format(R"(<circle cx="{:.1f}" cy="{:.1f}" r="3" fill="{}"/>)" "\n", px(x), py(y), s.colour);
      }
    }
    // The legend sits under the panel, where it cannot hide a curve.
    const double lx = x0 + 150 * (legend % 3), ly = y0 + h + 48 + 16 * (legend / 3);
    svg += fmt::format(R"(<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="{}" stroke-width="2"/>)"
                       R"(<text x="{}" y="{}" font-size="11">{}</text>)" "\n",
                       lx, ly, lx + 18, ly, s.colour, lx + 24, ly + 4, escape(s.label));
    ++legend;
  }
}

double number(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : std::nan("");
}

}  // namespace

std::vector<nlohmann::json> surviving_records(const std::vector<nlohmann::json>& records) {
  // Each list stays sorted by its key: a record first drops those it supersedes, all at its end.
  std::vector<nlohmann::json> steps, epochs;
  auto drop_from = [](std::vector<nlohmann::json>& kept, const char* key, double from) {
    while (!kept.empty() && !(number(kept.back(), key) < from)) kept.pop_back();
  };
  for (const auto& r : records) {
    const std::string kind = r.value("kind", "");
    if (kind == "start") {
      const double resumed_at = number(r, "step");
      if (std::isnan(resumed_at)) continue;
      drop_from(steps, "step", resumed_at + 1);
      drop_from(epochs, "step", resumed_at + 1);
    } else if (kind == "step" && !std::isnan(number(r, "step"))) {
      drop_from(steps, "step", number(r, "step"));
      steps.push_back(r);
    } else if (kind == "epoch" && !std::isnan(number(r, "epoch"))) {
      drop_from(epochs, "epoch", number(r, "epoch"));
      epochs.push_back(r);
    }
  }
  steps.insert(steps.end(), epochs.begin(), epochs.end());
  return steps;
}

std::string render_curves_svg(const std::vector<nlohmann::json>& records, const std::string& title) {
  Series step_loss{"train loss (steps)", "#9ecae1", false, {}};
  Series train_loss{"train loss (epoch)", "#3182bd", true, {}};
  Series test_loss{"test loss", "#e6550d", true, {}};
  Series train_acc{"train accuracy", "#3182bd", true, {}};
  Series test_acc{"test accuracy", "#e6550d", true, {}};
  auto num = number;
  for (const auto& r : surviving_records(records)) {
    std::string kind = r.value("kind", "");
    if (kind == "step") {
      step_loss.points.emplace_back(num(r, "epoch_progress"), num(r, "loss"));
    } else if (kind == "epoch") {
      double e = num(r, "epoch");
      train_loss.points.emplace_back(e, num(r, "loss"));
      train_acc.points.emplace_back(e, 100 * num(r, "train_accuracy"));
      if (r.contains("test_loss")) test_loss.points.emplace_back(e, num(r, "test_loss"));
      if (r.contains("test_accuracy")) test_acc.points.emplace_back(e, 100 * num(r, "test_accuracy"));
    }
  }
  const int W = 960, H = 430;
  std::string svg = fmt::format(
      R"(<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" viewBox="0 0 {} {}" font-family="sans-serif">)" "\n"
      R"(<rect width="100%" height="100%" fill="white"/>)" "\n"
      R"(<text x="{}" y="22" font-size="16" text-anchor="middle">{}</text>)" "\n",
      W, H, W, H, W / 2, escape(title));
  panel(svg, 70, 60, 360, 280, "loss", "cross-entropy", {step_loss, train_loss, test_loss}, true);
  panel(svg, 560, 60, 360, 280, "accuracy", "accuracy (%)", {train_acc, test_acc}, false);
  svg += "</svg>\n";
  return svg;
}

void write_curves_svg(const std::string& path, const std::vector<nlohmann::json>& records,
                      const std::string& title) {
  std::ofstream out(path, std::ios::trunc);
  out << render_curves_svg(records, title);
  if (!out) throw SystemError(errno_message("writing " + path, errno));
}

}  // namespace dlaunch::metrics
