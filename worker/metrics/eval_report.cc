// The evaluation suites' names and results as JSON: contract in worker/metrics/eval_report.h.
#include "worker/metrics/eval_report.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_join.h"

namespace oomb {

const char* SuiteName(EvalSuite suite) {
  switch (suite) {
    case EvalSuite::kPositions:
      return "positions";
    case EvalSuite::kPasskey:
      return "passkey";
    case EvalSuite::kNeedle:
      return "needle";
    case EvalSuite::kRuler:
      return "ruler";
  }
  return "";
}

const char* RulerTaskName(RulerTask task) {
  static constexpr const char* kNames[] = {"niah_single_1",
                                           "niah_single_2",
                                           "niah_single_3",
                                           "niah_multikey_1",
                                           "niah_multikey_2",
                                           "niah_multikey_3",
                                           "niah_multivalue",
                                           "niah_multiquery",
                                           "vt",
                                           "cwe",
                                           "fwe"};
  const auto i = static_cast<size_t>(task);
  return i < std::size(kNames) ? kNames[i] : "";
}

std::optional<RulerTask> RulerTaskNamed(std::string_view name) {
  for (const RulerTask t : kRulerTasks) {
    if (name == RulerTaskName(t)) return t;
  }
  return std::nullopt;
}

std::string RulerTaskNames() {
  return absl::StrJoin(kRulerTasks, ", ", [](std::string* out, RulerTask t) { out->append(RulerTaskName(t)); });
}

std::optional<EvalSuite> SuiteNamed(std::string_view name) {
  for (const EvalSuite s : kEvalSuites) {
    if (name == SuiteName(s)) return s;
  }
  return std::nullopt;
}

std::string SuiteNames() {
  return absl::StrJoin(kEvalSuites, ", ", [](std::string* out, EvalSuite s) { out->append(SuiteName(s)); });
}

std::optional<double> SuiteResult::accuracy() const {
  int64_t correct = 0, trials = 0;
  for (const RetrievalScore& c : cells) {
    correct += c.correct;
    trials += c.trials;
  }
  if (trials == 0) return std::nullopt;
  return static_cast<double>(correct) / static_cast<double>(trials);
}

bool RulerNeedsHaystack(const std::vector<RulerTask>& tasks) {
  static constexpr RulerTask kEssays[] = {RulerTask::kNiahSingle2, RulerTask::kNiahSingle3, RulerTask::kNiahMultikey1,
                                          RulerTask::kNiahMultivalue, RulerTask::kNiahMultiquery};
  return tasks.empty() || std::any_of(tasks.begin(), tasks.end(), [](RulerTask t) {
           return std::find(std::begin(kEssays), std::end(kEssays), t) != std::end(kEssays);
         });
}

std::string RulerGenerator(RulerTask task) { return std::string("ruler/") + RulerTaskName(task); }

std::vector<std::pair<int64_t, double>> SuiteResult::averages() const {
  std::map<int64_t, std::pair<double, int64_t>> sums;  // length -> (sum of scores, tasks)
  for (const RulerScore& r : ruler) {
    sums[r.length].first += r.score;
    ++sums[r.length].second;
  }
  std::vector<std::pair<int64_t, double>> out;
  for (const auto& [length, sum] : sums) out.emplace_back(length, sum.first / static_cast<double>(sum.second));
  return out;
}

std::optional<int64_t> SuiteResult::effective_length() const {
  if (ruler.empty()) return std::nullopt;
  int64_t effective = 0;
  for (const auto& [length, score] : averages()) {
    if (score < threshold) break;
    effective = length;
  }
  return effective;
}

nlohmann::json EvalReportJson(const EvalReport& report) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [suite, result] : report) {
    nlohmann::json& out = j[SuiteName(suite)];
    out = nlohmann::json::object();
    for (const PositionLoss& p : result.buckets) {
      out["buckets"].push_back(
          {{"begin", p.begin}, {"end", p.end}, {"loss", p.loss}, {"tokens", p.tokens}, {"hits", p.hits}});
    }
    for (const RetrievalScore& c : result.cells) {
      out["cells"].push_back({{"length", c.length}, {"depth", c.depth}, {"correct", c.correct}, {"trials", c.trials}});
    }
    if (const std::optional<double> a = result.accuracy()) out["accuracy"] = *a;
    if (result.ruler.empty()) continue;
    for (const RulerScore& r : result.ruler) {
      out["scores"].push_back(
          {{"task", RulerTaskName(r.task)}, {"length", r.length}, {"score", r.score}, {"samples", r.samples}});
    }
    for (const auto& [length, score] : result.averages())
      out["averages"].push_back({{"length", length}, {"score", score}});
    out["threshold"] = result.threshold;
    out["effective_length"] = *result.effective_length();
  }
  return j;
}

}  // namespace oomb
