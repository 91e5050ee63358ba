// Reading fine-tuning datasets (JSONL) into documents and packing them into training sequences.
// Torch-free.
//
// One JSON object per line, in one of the formats other fine-tuning services accept:
//   {"text": "..."}                                     loss on every token
//   {"prompt": "...", "completion": "..."}              loss on the completion
//   {"messages": [{"role": "...", "content": "..."}, ...]}
//                                                       rendered with the model's chat template,
//                                                       loss on assistant turns (content and the
//                                                       end-of-turn marker)
//   {"input_ids": [...], "labels": [...]}               pre-tokenized; labels optional (= ids),
//                                                       -100 for no loss
// Blank lines are skipped. Every error names the file and the 1-based line:
//   "data.train: /data/a.jsonl:12: invalid JSON: ..."  (INVALID_ARGUMENT)
// too_long: "truncate" cuts a sample to max_seq_len, "drop" skips it, "error" fails naming the
// line and the length.
//
// The file is read line by line (never loaded whole); the documents are kept in memory as
// token ids.
#ifndef OOMB_WORKER_DATA_DATASET_H_
#define OOMB_WORKER_DATA_DATASET_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/data/sequence.h"
#include "worker/model/chat_template.h"
#include "worker/model/tokenizer.h"

namespace oomb {

struct DatasetOptions {
  std::string field = "data.train";  // the job-spec field named in errors
  int64_t max_seq_len = 131072;
  std::string too_long = "truncate";  // truncate | drop | error
};

struct DatasetStats {
  int64_t samples = 0;  // documents kept
  int64_t tokens = 0;   // tokens kept
  int64_t dropped = 0;
  int64_t truncated = 0;
  // Histogram of kept sample lengths: counts[i] for [bounds[i-1], bounds[i]), the last bucket
  // open-ended.
  std::vector<int64_t> length_bounds = {128, 512, 2048, 8192, 32768, 131072, 524288};
  std::vector<int64_t> length_counts = std::vector<int64_t>(8, 0);
};

// Reads every sample. `chat` is needed only for "messages" lines (FAILED_PRECONDITION naming
// the line when it is absent). INVALID_ARGUMENT for the first bad line; NOT_FOUND when the
// file does not exist; INVALID_ARGUMENT when it holds no sample.
absl::StatusOr<std::vector<Document>> ReadJsonlDataset(const std::string& path, const Tokenizer& tokenizer,
                                                       const ChatTemplate* chat, const DatasetOptions& options,
                                                       DatasetStats* stats);

// Orders the documents (a seeded shuffle unless shuffle_seed < 0) and forms sequences of at
// most max_seq_len tokens: with packing, consecutive documents share a sequence (positions
// restart, no attention across them); without, one document per sequence.
std::vector<TokenSequence> PackDocuments(const std::vector<Document>& docs, int64_t max_seq_len, bool packing,
                                         int64_t shuffle_seed);

}  // namespace oomb

#endif  // OOMB_WORKER_DATA_DATASET_H_
