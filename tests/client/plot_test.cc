// `oomb plot` and the sparkline of `oomb get` (client/plot.h), without a server: the curves are
// the STEP events' (a step trained again after a resume keeps its newest report), the sparkline
// follows the values, and the SVG's polylines pass through every step's value where the axes
// say. (tests/python/test_readme.py renders a real job's SVG to pixels.)
#include "client/plot.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <regex>
#include <sstream>

namespace oomb::client {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::JobEvent StepEvent(int64_t sequence, int64_t step, double loss, double eval_loss = 0) {
  v1::JobEvent e;
  e.set_sequence(sequence);
  e.set_type(v1::JobEvent::STEP);
  e.mutable_progress()->set_step(step);
  e.mutable_progress()->set_loss(loss);
  e.mutable_progress()->set_learning_rate(1e-4 * static_cast<double>(step));
  e.mutable_progress()->set_tokens_per_second(1000 + step);
  e.mutable_progress()->set_gpu_memory_bytes(step << 20);
  if (eval_loss > 0) e.mutable_progress()->set_eval_loss(eval_loss);
  return e;
}

TEST(PlotTest, CurvesKeepTheNewestReportOfEachStepAndTheStepsThatEvaluated) {
  v1::JobEvent log;
  log.set_type(v1::JobEvent::LOG);
  // Step 2 trained again by a resumed run, which evaluated at it and at step 4; Progress carries
  // the last validation loss on.
  const JobCurves c = CurvesFromEvents({log, StepEvent(2, 1, 3.0), StepEvent(3, 2, 2.5), StepEvent(4, 3, 2.0),
                                        StepEvent(5, 2, 2.4, 2.6), StepEvent(6, 3, 2.1, 2.6), StepEvent(7, 4, 1.9, 2.2),
                                        StepEvent(8, 5, 1.8, 2.2)});
  EXPECT_THAT(c.step, ElementsAre(1, 2, 3, 4, 5));
  EXPECT_THAT(c.loss, ElementsAre(3.0, 2.4, 2.1, 1.9, 1.8));
  EXPECT_THAT(c.device_bytes, ElementsAre(1 << 20, 2 << 20, 3 << 20, 4 << 20, 5 << 20));
  EXPECT_THAT(c.eval_step, ElementsAre(2, 4));
  EXPECT_THAT(c.eval_loss, ElementsAre(2.6, 2.2));
}

TEST(PlotTest, SparklineFollowsTheValues) {
  EXPECT_EQ(Sparkline({4, 3, 2, 1}, 40), "█▆▃▁");
  EXPECT_EQ(Sparkline({1, 1, 1}, 40), "▄▄▄");
  EXPECT_EQ(Sparkline({}, 40), "");
  // 8 values in 4 cells: the mean of each pair.
  EXPECT_EQ(Sparkline({0, 0, 1, 1, 2, 2, 3, 3}, 4), "▁▃▆█");
  EXPECT_EQ(Sparkline(std::vector<double>(1000, 2.0), 40).size(), 40 * std::string("▄").size());
}

// The points of the polyline named `series` in `svg`.
std::vector<std::pair<double, double>> Polyline(const std::string& svg, const std::string& series) {
  const std::regex line("data-series=\"" + series + "\" points=\"([^\"]*)\"");
  std::smatch m;
  if (!std::regex_search(svg, m, line)) return {};
  std::vector<std::pair<double, double>> out;
  std::istringstream in(m[1].str());
  for (std::string p; in >> p;) {
    const size_t comma = p.find(',');
    out.emplace_back(std::stod(p.substr(0, comma)), std::stod(p.substr(comma + 1)));
  }
  return out;
}

TEST(PlotTest, SvgDrawsEveryStepWhereTheAxesSay) {
  std::vector<v1::JobEvent> events;
  for (int s = 1; s <= 5; ++s) events.push_back(StepEvent(s, s, 6.0 - s, s == 4 ? 1.5 : 0));
  const std::string svg = PlotSvg(CurvesFromEvents(events), "projects/p/jobs/a<b>");
  EXPECT_THAT(svg, HasSubstr("<svg xmlns=\"http://www.w3.org/2000/svg\""));
  EXPECT_THAT(svg, HasSubstr("projects/p/jobs/a&lt;b&gt;"));  // escaped
  for (const char* panel : {">loss<", ">learning rate<", ">tokens/s<", ">memory (MiB)<"}) {
    EXPECT_THAT(svg, HasSubstr(panel));
  }
  const std::vector<std::pair<double, double>> loss = Polyline(svg, "train");
  ASSERT_EQ(loss.size(), 5u);
  // Steps 1..5 from the plot area's left to its right; loss 5 (step 1) at its top, 1 at its bottom.
  for (size_t i = 1; i < loss.size(); ++i) {
    EXPECT_NEAR(loss[i].first - loss[i - 1].first, (loss[4].first - loss[0].first) / 4, 0.11);
    EXPECT_GT(loss[i].second, loss[i - 1].second);  // SVG's y grows downwards
  }
  EXPECT_THAT(svg, HasSubstr(">5<"));      // the loss axis' top label
  EXPECT_THAT(svg, HasSubstr("<circle"));  // the validation loss at step 4
  EXPECT_EQ(Polyline(svg, "device peak").size(), 5u);
  EXPECT_EQ(Polyline(svg, "lr").size(), 5u);
}

TEST(PlotTest, LongRunsAreDrawnThroughAtMostTwoThousandPointsEndingAtTheLast) {
  std::vector<v1::JobEvent> events;
  for (int s = 1; s <= 5001; ++s) events.push_back(StepEvent(s, s, 1.0 + 1.0 / s));
  const std::vector<std::pair<double, double>> loss = Polyline(PlotSvg(CurvesFromEvents(events), "j"), "train");
  EXPECT_LE(loss.size(), 2001u);
  EXPECT_GE(loss.size(), 1000u);
  const std::vector<std::pair<double, double>> one =
      Polyline(PlotSvg(CurvesFromEvents({StepEvent(1, 1, 2.0), StepEvent(2, 5001, 1.0)}), "j"), "train");
  ASSERT_EQ(one.size(), 2u);
  EXPECT_DOUBLE_EQ(loss.back().first, one.back().first);  // the last step is drawn
}

}  // namespace
}  // namespace oomb::client
