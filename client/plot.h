// A job's curves, read from its STEP events: what `oomb plot` draws (an SVG document of four
// panels: loss with the validation loss, learning rate, tokens per second, memory) and what
// `oomb get` sums up in a one-line sparkline of the loss. The SVG is written as text (elements
// and attributes, no image encoding); any browser, Inkscape or cairosvg renders it.
//
// Thread-safety: free functions without shared state.
#ifndef OOMB_CLIENT_PLOT_H_
#define OOMB_CLIENT_PLOT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "oomb/v1/jobs.pb.h"

namespace oomb::client {

// One value per optimizer step, in step order: the vectors have the length of `step`, but for
// the validation loss, which has a point per step that evaluated (a STEP event's
// Progress.eval_loss is the last one: a step evaluated where it changes).
struct JobCurves {
  std::vector<double> step;
  std::vector<double> loss;
  std::vector<double> learning_rate;
  std::vector<double> tokens_per_second;
  std::vector<double> device_bytes;  // the step's device memory peak (Progress.gpu_memory_bytes)
  std::vector<double> host_bytes;    // KV bytes in the host tier at the step's peak
  std::vector<double> eval_step, eval_loss;
};

// The curves of a job's STEP events (other events are ignored). A step reported twice (a run
// resumed from an earlier checkpoint trains it again) keeps its newest report.
JobCurves CurvesFromEvents(const std::vector<v1::JobEvent>& events);

// "▇▆▅▄▃▂▂▁": `values` in at most `width` (≥ 1) characters, each the mean of its share of the
// values, scaled from their minimum (▁) to their maximum (█); all equal: a flat line of ▄.
// Empty for no values.
std::string Sparkline(const std::vector<double>& values, int width);

// The SVG document (960 × 640 px) of the four panels, titled `title`. Each panel's y range is
// its data's (labelled at both ends), its x range the steps'; a series of more than 2,000 points
// is drawn through every k-th one (the last always); a series of one point (a one-step job), and
// the validation loss, as dots.
std::string PlotSvg(const JobCurves& curves, const std::string& title);

}  // namespace oomb::client

#endif  // OOMB_CLIENT_PLOT_H_
