// What a long-context evaluation found (worker/job/eval_suites.h): the loss by position and
// the retrieval suites' exact-match counts. Produced by `oombd model eval` and by a job's
// evaluation section (carried in its StepReport). Torch-free.
#ifndef OOMB_WORKER_METRICS_EVAL_REPORT_H_
#define OOMB_WORKER_METRICS_EVAL_REPORT_H_

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace oomb {

// The suites (proto Evaluation.Suite, whose words SuiteName spells), in the order they run and
// are reported: positions (a data set's loss by position), passkey and needle (retrieval).
enum class EvalSuite { kPositions, kPasskey, kNeedle };
inline constexpr EvalSuite kEvalSuites[] = {EvalSuite::kPositions, EvalSuite::kPasskey, EvalSuite::kNeedle};

const char* SuiteName(EvalSuite suite);
std::optional<EvalSuite> SuiteNamed(std::string_view name);
// "positions, passkey, needle": for messages naming the choices.
std::string SuiteNames();

struct PositionLoss {
  int64_t begin = 0, end = 0;  // positions [begin, end) within a sample (t predicts token t + 1)
  double loss = 0;             // mean next-token cross-entropy of the label tokens there
  int64_t tokens = 0;
  int64_t hits = 0;  // label tokens that are their logits' argmax (greedy decoding's choice)
};

struct RetrievalScore {
  int64_t length = 0;
  double depth = 0;
  int64_t correct = 0, trials = 0;  // exact matches of the greedy continuation
};

// One suite's results: positions fills buckets; passkey and needle fill cells, by (length,
// depth) in the order run.
struct SuiteResult {
  std::vector<PositionLoss> buckets;
  std::vector<RetrievalScore> cells;

  // Correct over trials across the cells; nullopt without any trial.
  std::optional<double> accuracy() const;
};

// The suites that ran, by suite.
using EvalReport = std::map<EvalSuite, SuiteResult>;

// As `oombd model eval` prints it, metrics.jsonl records it and the API's EvaluationResult.suites
// maps it to JSON: {"positions": {"buckets": [{begin, end, loss, tokens, hits}]}, "passkey":
// {"accuracy", "cells": [{length, depth, correct, trials}]}, ...} for the suites that ran.
nlohmann::json EvalReportJson(const EvalReport& report);

}  // namespace oomb

#endif  // OOMB_WORKER_METRICS_EVAL_REPORT_H_
