// A job's evaluation section: contract in worker/job/evaluation_schedule.h.
#include "worker/job/evaluation_schedule.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/common/status.h"
#include "worker/train/torch_status.h"

namespace oomb {

namespace {

// The tokenizer the retrieval suites write their documents with: the data's, else the model's
// (pre-tokenized data did not need it until now), held in `loaded`.
absl::StatusOr<const Tokenizer*> SuiteTokenizer(const JobData& data, std::unique_ptr<Tokenizer>* loaded) {
  if (data.tokenizer != nullptr) return data.tokenizer.get();
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::FromModelDir(*data.model_dir);
  if (!t.ok() && t.status().code() == absl::StatusCode::kNotFound && !ReasonOf(t.status()).has_value()) {
    // A spec this model cannot run: the suites write their documents with its tokenizer.
    return WithReason(
        absl::FailedPreconditionError(absl::StrCat(
            "evaluation.suites: passkey and needle need the model's tokenizer, and ", t.status().message())),
        Reason::kBadSpec);
  }
  if (!t.ok()) return Annotate(t.status(), "evaluation.suites");
  *loaded = *std::move(t);
  return loaded->get();
}

}  // namespace

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
  std::unique_ptr<Tokenizer> loaded;
  if (wants(EvalSuite::kPasskey) || wants(EvalSuite::kNeedle)) {
    OOMB_ASSIGN_OR_RETURN(inputs.tokenizer, SuiteTokenizer(data, &loaded));
  }
  if (wants(EvalSuite::kNeedle)) {
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
