// A job's evaluation section (evaluation.suites; worker/job/eval_suites.h): its inputs, made
// once when the run starts, when it is due, and one evaluation of them with the run's trainer.
#ifndef OOMB_WORKER_JOB_EVALUATION_SCHEDULE_H_
#define OOMB_WORKER_JOB_EVALUATION_SCHEDULE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/common/file_access.h"
#include "worker/job/eval_suites.h"
#include "worker/job/job_data.h"
#include "worker/metrics/eval_report.h"
#include "worker/plan/job_config.h"

namespace oomb {

// A warning for the job's events when the training data holds samples that an evaluated suite's
// own generator wrote (`oombd data retrieval` marks them, DatasetStats::generators: "passkey",
// "needle", "ruler/<task>" for a ruler task evaluated): a score on a format trained on says
// little about long context. "" when there are none.
std::string TrainedOnEvaluatedSuites(const JobConfig::Evaluation& evaluation,
                                     const std::map<std::string, int64_t>& generators);

class EvaluationSchedule {
 public:
  // The suites' inputs: positions scores data.validation's samples, one sequence each; passkey
  // and needle write their documents with the model's tokenizer (needle into
  // evaluation.haystack, opened through `files`). Errors name the field; a model without a
  // tokenizer cannot run passkey or needle (BAD_SPEC).
  static absl::StatusOr<EvaluationSchedule> Prepare(const JobConfig& job, const JobData& data, const FileAccess& files);

  // After every evaluation.every_steps-th step and the last (`total_steps`); never without suites.
  bool Due(int64_t step, int64_t total_steps) const;
  // The longest sequence an evaluation runs, in tokens (at least 1).
  int64_t longest() const;
  // One evaluation: the suites' scores with `trainer`'s forward (LibTorch errors as statuses).
  absl::StatusOr<EvalReport> Run(ChunkTrainer& trainer) const;

 private:
  explicit EvaluationSchedule(const JobConfig::Evaluation& e) : every_steps_(e.every_steps) {}

  int64_t every_steps_ = 0;
  std::vector<std::pair<EvalSuite, std::unique_ptr<Suite>>> suites_;  // in the spec's order
};

}  // namespace oomb

#endif  // OOMB_WORKER_JOB_EVALUATION_SCHEDULE_H_
