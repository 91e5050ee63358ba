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

absl::StatusOr<EvaluationSchedule> EvaluationSchedule::Prepare(const JobConfig& job, const JobData& data,
                                                               const FileAccess& files) {
  const JobConfig::Evaluation& e = job.evaluation;
  EvaluationSchedule schedule(e);
  const auto wants = [&](const char* suite) {
    return std::find(e.suites.begin(), e.suites.end(), suite) != e.suites.end();
  };
  if (wants("positions")) {
    for (const Document& d : data.validation) {
      schedule.samples_.emplace_back();
      schedule.samples_.back().Append(d);
    }
  }
  if (!wants("passkey") && !wants("needle")) return schedule;
  const Tokenizer* tokenizer = data.tokenizer.get();
  std::unique_ptr<Tokenizer> loaded;
  if (tokenizer == nullptr) {  // pre-tokenized data: the tokenizer was not needed until now
    absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::FromModelDir(*data.model_dir);
    if (!t.ok() && t.status().code() == absl::StatusCode::kNotFound && !ReasonOf(t.status()).has_value()) {
      // A spec this model cannot run: the suites write their documents with its tokenizer.
      return WithReason(
          absl::FailedPreconditionError(absl::StrCat(
              "evaluation.suites: passkey and needle need the model's tokenizer, and ", t.status().message())),
          Reason::kBadSpec);
    }
    if (!t.ok()) return Annotate(t.status(), "evaluation.suites");
    loaded = *std::move(t);
    tokenizer = loaded.get();
  }
  const RetrievalOptions options{e.lengths, e.depths, e.trials, e.seed};
  if (wants("passkey")) {
    absl::StatusOr<std::vector<RetrievalDoc>> docs = PasskeyDocs(*tokenizer, options);
    if (!docs.ok()) return Annotate(docs.status(), "evaluation.lengths");
    schedule.passkey_ = *std::move(docs);
  }
  if (wants("needle")) {
    absl::StatusOr<File> file = files.OpenFile(e.haystack);
    absl::StatusOr<std::string> text = file.ok() ? file->ReadAll() : file.status();
    absl::StatusOr<std::vector<RetrievalDoc>> docs = text.ok() ? NeedleDocs(*tokenizer, *text, options) : text.status();
    if (!docs.ok()) return Annotate(docs.status(), "evaluation.haystack");
    schedule.needle_ = *std::move(docs);
  }
  return schedule;
}

bool EvaluationSchedule::Due(int64_t step, int64_t total_steps) const {
  return any_ && (step == total_steps || (every_steps_ > 0 && step % every_steps_ == 0));
}

int64_t EvaluationSchedule::longest() const {
  int64_t longest = 1;
  for (const TokenSequence& s : samples_) longest = std::max(longest, s.size());
  for (const auto* docs : {&passkey_, &needle_}) {
    for (const RetrievalDoc& d : *docs) longest = std::max(longest, d.length);
  }
  return longest;
}

absl::StatusOr<EvalReport> EvaluationSchedule::Run(ChunkTrainer& trainer) const {
  EvalReport report;
  OOMB_RETURN_IF_ERROR(Guarded([&]() -> absl::Status {
    if (!samples_.empty()) {
      OOMB_ASSIGN_OR_RETURN(DataScore d, ScoreData(trainer, samples_, /*by_position=*/true));
      report.positions = std::move(d.positions);
    }
    if (!passkey_.empty()) {
      OOMB_ASSIGN_OR_RETURN(report.passkey, ScoreRetrieval(trainer, passkey_));
    }
    if (!needle_.empty()) {
      OOMB_ASSIGN_OR_RETURN(report.needle, ScoreRetrieval(trainer, needle_));
    }
    return absl::OkStatus();
  }));
  return report;
}

}  // namespace oomb
