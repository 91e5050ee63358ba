// What a long-context evaluation found (worker/job/eval_suites.h): the loss by position and
// the retrieval suites' exact-match counts. Produced by `oombd model eval` and by a job's
// evaluation section (carried in its StepReport). Torch-free.
#ifndef OOMB_WORKER_METRICS_EVAL_REPORT_H_
#define OOMB_WORKER_METRICS_EVAL_REPORT_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

namespace oomb {

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

// Correct over trials across the cells; nullopt without any trial.
inline std::optional<double> Accuracy(const std::vector<RetrievalScore>& cells) {
  int64_t correct = 0, trials = 0;
  for (const RetrievalScore& c : cells) {
    correct += c.correct;
    trials += c.trials;
  }
  if (trials == 0) return std::nullopt;
  return static_cast<double>(correct) / static_cast<double>(trials);
}

struct EvalReport {
  std::vector<PositionLoss> positions;          // the positions suite
  std::vector<RetrievalScore> passkey, needle;  // by (length, depth), in the order run
};

// As `oombd model eval` prints it and metrics.jsonl records it: "positions": [{begin, end,
// loss, tokens, hits}], and per retrieval suite run {"accuracy", "cells": [{length, depth,
// correct, trials}]}.
nlohmann::json EvalReportJson(const EvalReport& report);

}  // namespace oomb

#endif  // OOMB_WORKER_METRICS_EVAL_REPORT_H_
