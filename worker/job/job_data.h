// A job's data, for the executor (worker/job/executor.h) and ValidateJobData: its datasets read
// and checked with the model's tokenizer, and the training sequences batch by batch.
#ifndef OOMB_WORKER_JOB_JOB_DATA_H_
#define OOMB_WORKER_JOB_JOB_DATA_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/common/file_access.h"
#include "worker/data/dataset.h"
#include "worker/hf/chat_template.h"
#include "worker/hf/tokenizer.h"
#include "worker/plan/job_config.h"
#include "worker/train/checkpoint.h"

namespace oomb {

// The datasets of a job, read and checked, with the model directory and the tokenizer that read
// them (null when every sample was pre-tokenized).
struct JobData {
  std::optional<Dir> model_dir;
  std::unique_ptr<Tokenizer> tokenizer;
  std::optional<ChatTemplate> chat;
  std::vector<Document> train;  // none for method.type evaluate
  DatasetStats stats;
  std::vector<Document> validation;
};

// Opens model.path and reads data.train and data.validation through `files`, errors naming the
// field (and the file and line). The tokenizer is loaded only when a sample needs one.
absl::StatusOr<JobData> ReadJobData(const JobConfig& job, const FileAccess& files);

// The training sequences of a job, epoch by epoch (packed by data.packing, shuffled with
// data.shuffle_seed + epoch), taken training.batch_sequences at a time.
class TrainingBatches {
 public:
  TrainingBatches(const JobConfig& job, std::vector<Document> docs);

  // training.max_steps, else training.epochs of ceil(sequences / batch) steps; 0 for evaluate.
  int64_t total_steps() const { return total_steps_; }
  // The longest sequence of an epoch, in tokens (at least 1).
  int64_t longest() const { return longest_; }
  // The global batch of the step after `state`, and the state after it in `next`. Held by value:
  // a batch that crosses into the next epoch re-packs its sequences.
  std::vector<TokenSequence> Next(const TrainerState& state, TrainerState* next);

 private:
  const std::vector<TokenSequence>& Epoch(int64_t epoch);

  const JobConfig& job_;
  std::vector<Document> docs_;
  std::vector<TokenSequence> epoch_sequences_;
  int64_t packed_epoch_ = -1;
  int64_t total_steps_ = 0;
  int64_t longest_ = 1;
};

}  // namespace oomb

#endif  // OOMB_WORKER_JOB_JOB_DATA_H_
