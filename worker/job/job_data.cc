// A job's data: contract in worker/job/job_data.h.
#include "worker/job/job_data.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/common/status.h"

namespace oomb {
namespace {

// The first `max_tokens` tokens of `docs` in their order, the last document kept cut; 0: all.
void KeepFirstTokens(int64_t max_tokens, std::vector<Document>* docs) {
  if (max_tokens <= 0) return;
  int64_t budget = max_tokens;
  size_t kept = 0;
  for (; kept < docs->size() && budget > 0; ++kept) {
    Document& doc = (*docs)[kept];
    if (static_cast<int64_t>(doc.ids.size()) > budget) {
      doc.ids.resize(budget);
      doc.labels.resize(budget);
    }
    budget -= static_cast<int64_t>(doc.ids.size());
  }
  docs->resize(kept);
}

}  // namespace

absl::StatusOr<JobData> ReadJobData(const JobConfig& job, const FileAccess& files) {
  JobData data;
  absl::StatusOr<Dir> model_dir = files.OpenDir(job.model.path);
  if (!model_dir.ok()) return Annotate(model_dir.status(), "model.path");
  data.model_dir = *model_dir;
  ModelTokenizer model_tokenizer(*model_dir, "model.path");
  const TokenizerLoader loader = model_tokenizer.Loader();
  DatasetOptions options;
  options.max_seq_len = job.data.max_seq_len;
  options.too_long = job.data.too_long;
  absl::StatusOr<int64_t> vocab = ModelVocabSize(*model_dir);
  if (!vocab.ok()) return Annotate(vocab.status(), "model.path");
  options.vocab_size = *vocab;
  if (job.method.type != TrainMethod::kEvaluate) {
    absl::StatusOr<File> train = files.OpenFile(job.data.train);
    if (!train.ok()) return Annotate(train.status(), "data.train");
    OOMB_ASSIGN_OR_RETURN(data.train, ReadJsonlDataset(*train, loader, options, &data.stats));
    if (data.stats.label_tokens == 0) {
      return WithReason(absl::InvalidArgumentError(absl::StrCat(
                            "data.train: ", job.data.train,
                            ": no token carries a label (every label is -100, or no sample has an assistant turn "
                            "or more than one token): there is nothing to train on")),
                        Reason::kBadData);
    }
  }
  if (!job.data.validation.empty()) {
    options.field = "data.validation";
    absl::StatusOr<File> validation = files.OpenFile(job.data.validation);
    if (!validation.ok()) return Annotate(validation.status(), "data.validation");
    OOMB_ASSIGN_OR_RETURN(data.validation, ReadJsonlDataset(*validation, loader, options, nullptr));
    KeepFirstTokens(job.data.validation_max_tokens, &data.validation);
  }
  data.tokenizer = model_tokenizer.TakeTokenizer();
  data.chat = model_tokenizer.TakeChat();
  return data;
}

TrainingBatches::TrainingBatches(const JobConfig& job, std::vector<Document> docs) : job_(job), docs_(std::move(docs)) {
  const std::vector<TokenSequence>& first = Epoch(0);
  for (const TokenSequence& s : first) longest_ = std::max(longest_, s.size());
  const int64_t per_epoch = static_cast<int64_t>(first.size()), batch = job.training.batch_sequences;
  total_steps_ = job.method.type == TrainMethod::kEvaluate ? 0
                 : job.training.max_steps > 0              ? job.training.max_steps
                                                           : job.training.epochs * ((per_epoch + batch - 1) / batch);
}

const std::vector<TokenSequence>& TrainingBatches::Epoch(int64_t epoch) {
  if (epoch != packed_epoch_) {
    const int64_t seed = job_.data.shuffle_seed < 0 ? -1 : job_.data.shuffle_seed + epoch;
    epoch_sequences_ = PackDocuments(docs_, job_.data.max_seq_len, job_.data.packing, seed);
    packed_epoch_ = epoch;
  }
  return epoch_sequences_;
}

std::vector<TokenSequence> TrainingBatches::Next(const TrainerState& state, TrainerState* next) {
  std::vector<TokenSequence> batch;
  *next = state;
  for (int64_t i = 0; i < job_.training.batch_sequences; ++i) {
    const auto& seqs = Epoch(next->epoch);
    batch.push_back(seqs[next->cursor]);
    if (++next->cursor == static_cast<int64_t>(seqs.size())) {
      next->cursor = 0;
      ++next->epoch;
    }
  }
  return batch;
}

}  // namespace oomb
