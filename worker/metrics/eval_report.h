// What a long-context evaluation found (worker/job/eval_suites.h): the loss by position, the
// retrieval suites' exact-match counts and RULER's scores by task and length (worker/job/ruler.h). Produced by `oombd
// model eval` and by a job's evaluation section (carried in its StepReport). Torch-free.
#ifndef OOMB_WORKER_METRICS_EVAL_REPORT_H_
#define OOMB_WORKER_METRICS_EVAL_REPORT_H_

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace oomb {

// The suites (proto Evaluation.Suite, whose words SuiteName spells), in the order they run and
// are reported: positions (a data set's loss by position), passkey and needle (retrieval), ruler
// (RULER's synthetic tasks, held-out formats scored on greedy generations).
enum class EvalSuite { kPositions, kPasskey, kNeedle, kRuler };
inline constexpr EvalSuite kEvalSuites[] = {EvalSuite::kPositions, EvalSuite::kPasskey, EvalSuite::kNeedle,
                                            EvalSuite::kRuler};

const char* SuiteName(EvalSuite suite);
std::optional<EvalSuite> SuiteNamed(std::string_view name);
// "positions, passkey, needle, ruler": for messages naming the choices.
std::string SuiteNames();

// RULER's 11 synthetic tasks (proto Evaluation.RulerTask), in the order of RULER's
// RULER/scripts/synthetic.yaml and under its names (RulerTaskName): niah_single_1 .. niah_multiquery,
// vt, cwe, fwe. Their documents: worker/job/ruler.h.
enum class RulerTask {
  kNiahSingle1,
  kNiahSingle2,
  kNiahSingle3,
  kNiahMultikey1,
  kNiahMultikey2,
  kNiahMultikey3,
  kNiahMultivalue,
  kNiahMultiquery,
  kVt,
  kCwe,
  kFwe
};
inline constexpr RulerTask kRulerTasks[] = {RulerTask::kNiahSingle1,
                                            RulerTask::kNiahSingle2,
                                            RulerTask::kNiahSingle3,
                                            RulerTask::kNiahMultikey1,
                                            RulerTask::kNiahMultikey2,
                                            RulerTask::kNiahMultikey3,
                                            RulerTask::kNiahMultivalue,
                                            RulerTask::kNiahMultiquery,
                                            RulerTask::kVt,
                                            RulerTask::kCwe,
                                            RulerTask::kFwe};

const char* RulerTaskName(RulerTask task);
std::optional<RulerTask> RulerTaskNamed(std::string_view name);
// "niah_single_1, ..., fwe": for messages naming the choices.
std::string RulerTaskNames();

// Whether `tasks` (empty: all) hold one of the essay tasks (niah_single_2, _3, niah_multikey_1,
// niah_multivalue, niah_multiquery), which need a haystack.
bool RulerNeedsHaystack(const std::vector<RulerTask>& tasks);

// The "generator" mark `oombd data retrieval` writes on a line made from `task`'s documents:
// "ruler/" and RULER's name (a job that trains on it while evaluating the task is warned).
std::string RulerGenerator(RulerTask task);

// RULER's threshold of the effective length: Llama-2-7B's average over the tasks at 4K, 85.6
// (Hsieh et al., 2024, section 4).
inline constexpr double kRulerThreshold = 85.6;

// One RULER task at one length.
struct RulerScore {
  RulerTask task = RulerTask::kNiahSingle1;
  int64_t length = 0;   // tokens per document: the prompt and the task's generation budget
  double score = 0;     // 0 .. 100, as RULER reports it: the mean over documents of string_match_all
  int64_t samples = 0;  // documents
};

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
// depth) in the order run; ruler fills ruler, by task then length, and its threshold.
struct SuiteResult {
  std::vector<PositionLoss> buckets;
  std::vector<RetrievalScore> cells;
  std::vector<RulerScore> ruler = {};
  double threshold = kRulerThreshold;  // ruler: the effective length's

  // Correct over trials across the cells; nullopt without any trial.
  std::optional<double> accuracy() const;
  // ruler: the mean score over the tasks run at each length, by increasing length.
  std::vector<std::pair<int64_t, double>> averages() const;
  // ruler: RULER's effective length, the longest length L whose average, and the average at
  // every shorter length run, is at least `threshold` (the paper counts Llama-2-7B's own 85.6 at
  // 4K as effective there); 0 when the shortest length falls below it; nullopt without scores.
  std::optional<int64_t> effective_length() const;
};

// The suites that ran, by suite.
using EvalReport = std::map<EvalSuite, SuiteResult>;

// As `oombd model eval` prints it, metrics.jsonl records it and the API's EvaluationResult.suites
// maps it to JSON: {"positions": {"buckets": [{begin, end, loss, tokens, hits}]}, "passkey":
// {"accuracy", "cells": [{length, depth, correct, trials}]}, "ruler": {"scores": [{task, length,
// score, samples}], "averages": [{length, score}], "threshold", "effective_length"}} for the
// suites that ran.
nlohmann::json EvalReportJson(const EvalReport& report);

}  // namespace oomb

#endif  // OOMB_WORKER_METRICS_EVAL_REPORT_H_
