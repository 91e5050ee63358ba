// The evaluation suites' names and results as JSON: contract in worker/metrics/eval_report.h.
#include "worker/metrics/eval_report.h"

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
  }
  return "";
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
  }
  return j;
}

}  // namespace oomb
