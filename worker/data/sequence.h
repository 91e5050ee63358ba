// A training sequence: token ids with their shifted labels, RoPE positions and document
// boundaries. Torch-free; the data pipeline produces it and the trainer consumes it.
#ifndef OOMB_WORKER_DATA_SEQUENCE_H_
#define OOMB_WORKER_DATA_SEQUENCE_H_

#include <cstdint>
#include <vector>

namespace oomb {

inline constexpr int64_t kIgnoreLabel = -100;

// One document: ids, and per-token labels aligned with them as in Hugging Face (labels[t] is
// the token the model should produce at t, usually ids[t]; kIgnoreLabel where no loss).
struct Document {
  std::vector<int64_t> ids;
  std::vector<int64_t> labels;
  int64_t line = 0;  // 1-based line of the dataset file it came from (0: not from a file)
};

// Documents packed one after another; positions restart at each document and no token
// attends to, or predicts, another document's tokens.
struct TokenSequence {
  std::vector<int64_t> ids;        // [T]
  std::vector<int64_t> labels;     // [T] shifted: labels[t] is the target of position t
  std::vector<int64_t> positions;  // [T] RoPE positions
  std::vector<int64_t> doc_start;  // [T] index of each token's document start

  int64_t size() const { return static_cast<int64_t>(ids.size()); }
  int64_t label_tokens() const;
  // Appends a document (shifting its labels inside the document: its last token predicts
  // nothing).
  void Append(const Document& doc);
  // One document whose labels are its ids.
  static TokenSequence FromDocument(const std::vector<int64_t>& ids);
  static TokenSequence Pack(const std::vector<std::vector<int64_t>>& docs);
};

}  // namespace oomb

#endif  // OOMB_WORKER_DATA_SEQUENCE_H_
