// A job's evaluation section: contract in worker/job/evaluation_schedule.h.
#include "worker/job/evaluation_schedule.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/common/status.h"
#include "worker/plan/memory_planner.h"
#include "worker/train/torch_status.h"

namespace oomb {

namespace {

// The model's tokenizer, which the retrieval suites and ruler write their documents with (and
// ruler reads its generations with).
absl::StatusOr<std::shared_ptr<const Tokenizer>> SuiteTokenizer(const JobData& data) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::FromModelDir(*data.model_dir);
  if (!t.ok() && t.status().code() == absl::StatusCode::kNotFound && !ReasonOf(t.status()).has_value()) {
    // A spec this model cannot run: the suites write their documents with its tokenizer.
    return WithReason(
        absl::FailedPreconditionError(absl::StrCat(
            "evaluation.suites: passkey, needle and ruler need the model's tokenizer, and ", t.status().message())),
        Reason::kBadSpec);
  }
  if (!t.ok()) return Annotate(t.status(), "evaluation.suites");
  return std::shared_ptr<const Tokenizer>(*std::move(t));
}

// The ruler suite's inputs besides the tokenizer and the haystack.
void SetRuler(const JobConfig& job, SuiteInputs* inputs) {
  const JobConfig::Evaluation& e = job.evaluation;
  inputs->ruler = {.tasks = e.ruler_tasks, .lengths = e.lengths, .samples = e.ruler_samples, .seed = e.seed};
  inputs->ruler_threshold = e.ruler_threshold;
  // chunk_tokens auto picks at most kAutoChunkMax.
  inputs->ruler_margin = job.memory.chunk_tokens > 0 ? job.memory.chunk_tokens : kAutoChunkMax;
}

}  // namespace

std::string TrainedOnEvaluatedSuites(const JobConfig::Evaluation& e, const std::map<std::string, int64_t>& generators) {
  std::vector<std::string> marks;
  for (const EvalSuite suite : e.suites) {
    if (suite == EvalSuite::kPasskey || suite == EvalSuite::kNeedle) marks.push_back(SuiteName(suite));
    if (suite != EvalSuite::kRuler) continue;
    for (const RulerTask t : kRulerTasks) {
      if (e.ruler_tasks.empty() || std::find(e.ruler_tasks.begin(), e.ruler_tasks.end(), t) != e.ruler_tasks.end()) {
        marks.push_back(RulerGenerator(t));
      }
    }
  }
  std::vector<std::string> found;
  for (const std::string& mark : marks) {
    if (auto it = generators.find(mark); it != generators.end()) found.push_back(absl::StrCat(it->second, " ", mark));
  }
  if (found.empty()) return "";
  return absl::StrCat("data.train holds samples written by the generators of suites this job evaluates (",
                      absl::StrJoin(found, ", "),
                      "; oombd data retrieval marks them): their scores measure a format the model was trained "
                      "on, not long-context ability; evaluate formats the training data does not contain");
}

absl::StatusOr<EvaluationSchedule> EvaluationSchedule::Prepare(const JobConfig& job, const JobData& data,
                                                               const FileAccess& files) {
  const JobConfig::Evaluation& e = job.evaluation;
  EvaluationSchedule schedule(e);
  const auto wants = [&](EvalSuite suite) {
    return std::find(e.suites.begin(), e.suites.end(), suite) != e.suites.end();
  };
  SuiteInputs inputs;
  inputs.retrieval = {e.lengths, e.depths, e.trials, e.seed};
  if (wants(EvalSuite::kPositions)) inputs.samples = data.validation;
  SetRuler(job, &inputs);
  if (wants(EvalSuite::kPasskey) || wants(EvalSuite::kNeedle) || wants(EvalSuite::kRuler)) {
    OOMB_ASSIGN_OR_RETURN(inputs.tokenizer, SuiteTokenizer(data));
  }
  if (wants(EvalSuite::kRuler) && e.haystack.empty() && RulerNeedsHaystack(e.ruler_tasks)) {
    return WithReason(absl::InvalidArgumentError("evaluation.haystack: required by the ruler suite's essay tasks "
                                                 "(niah_single_2, _3, niah_multikey_1, niah_multivalue, "
                                                 "niah_multiquery)"),
                      Reason::kBadSpec);
  }
  if (wants(EvalSuite::kNeedle) || (wants(EvalSuite::kRuler) && !e.haystack.empty())) {
    absl::StatusOr<File> file = files.OpenFile(e.haystack);
    absl::StatusOr<std::string> text = file.ok() ? file->ReadAll() : file.status();
    if (!text.ok()) return Annotate(text.status(), "evaluation.haystack");
    inputs.haystack = *std::move(text);
  }
  for (const EvalSuite suite : e.suites) {
    absl::StatusOr<std::unique_ptr<Suite>> made = MakeSuite(suite, inputs);
    if (!made.ok()) {
      return Annotate(made.status(), suite == EvalSuite::kNeedle ? "evaluation.haystack" : "evaluation.lengths");
    }
    schedule.suites_.emplace_back(suite, *std::move(made));
  }
  return schedule;
}

bool EvaluationSchedule::Due(int64_t step, int64_t total_steps) const {
  return !suites_.empty() && (step == total_steps || (every_steps_ > 0 && step % every_steps_ == 0));
}

int64_t EvaluationSchedule::longest() const {
  int64_t longest = 1;
  for (const auto& [suite, s] : suites_) longest = std::max(longest, s->longest());
  return longest;
}

absl::StatusOr<EvalReport> EvaluationSchedule::Run(ChunkTrainer& trainer) const {
  EvalReport report;
  OOMB_RETURN_IF_ERROR(Guarded([&]() -> absl::Status {
    for (const auto& [suite, s] : suites_) {
      OOMB_ASSIGN_OR_RETURN(report[suite], s->Score(trainer));
    }
    return absl::OkStatus();
  }));
  return report;
}

}  // namespace oomb
