// The long-context evaluation suites (`oombd model eval --suite ...`, a job's evaluation
// section; EvalSuite in worker/metrics/eval_report.h): their documents, the position buckets of
// the loss-by-position suite, and the scoring of both with a trainer's forward pass (chunked over
// pages like training, so an evaluation fits wherever a training step of its length does), each
// suite behind one interface (Suite, MakeSuite). Torch-free header.
//
// Retrieval suites, scored by exact match of the greedy continuation, never by wording: a
// document is `length` tokens whose only labels are the answer's tokens; it is correct when
// the model's argmax at every answer position is the answer's next token (teacher-forced,
// which is exactly when greedy decoding from the question continues with the whole answer).
//   passkey: a random 5-digit key hidden at a depth of synthetic filler (Mohtashami & Jaggi,
//            2023, "Landmark Attention"), then "What is the pass key? The pass key is" + key;
//   needle:  a "special magic number" fact about a city hidden at a depth of real text (the
//            haystack file, from a seeded offset), then the question and the number.
//   ruler:   RULER's synthetic tasks (worker/job/ruler.h), scored as RULER scores them: the
//            greedy generation of each task's token budget after the prompt, string_match_all
//            over its expected answers, averaged by task and length (0 .. 100), and the
//            effective length over the tasks' averages (SuiteResult::effective_length).
// Pieces are tokenized one by one and joined, so lengths and depths are exact; a depth is the
// fraction of the filler before the hidden fact (0: right after the instruction, 1: just
// before the question). Keys, cities and offsets come from `seed`: runs with the same seed
// compare.
#ifndef OOMB_WORKER_JOB_EVAL_SUITES_H_
#define OOMB_WORKER_JOB_EVAL_SUITES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/data/sequence.h"
#include "worker/hf/tokenizer.h"
#include "worker/job/ruler.h"
#include "worker/metrics/eval_report.h"

namespace oomb {

class ChunkTrainer;

struct RetrievalOptions {
  std::vector<int64_t> lengths = {4096};  // tokens per document
  int64_t depths = 5;                     // depths 0, 1/(depths-1), ..., 1 (one: 0.5)
  int64_t trials = 1;                     // documents per (length, depth), each with its own key
  uint64_t seed = 1;
};

struct RetrievalDoc {
  Document doc;  // labels: the answer's tokens only
  int64_t length = 0;
  double depth = 0;
  std::string answer;
};

// INVALID_ARGUMENT naming a length too short for the instruction, fact and question (callers
// prefix the field or flag of the lengths).
absl::StatusOr<std::vector<RetrievalDoc>> PasskeyDocs(const Tokenizer& tokenizer, const RetrievalOptions& options);
// `haystack`: UTF-8 text, at least as long as the longest length (INVALID_ARGUMENT otherwise;
// callers prefix the haystack's field or flag).
absl::StatusOr<std::vector<RetrievalDoc>> NeedleDocs(const Tokenizer& tokenizer, const std::string& haystack,
                                                     const RetrievalOptions& options);

// [0, 1024), [1024, 2048), [2048, 4096), ... doubling until `longest` positions are covered.
std::vector<std::pair<int64_t, int64_t>> PositionBuckets(int64_t longest);

struct DataScore {
  double loss_sum = 0;  // cross-entropy summed over the label tokens
  int64_t tokens = 0;   // label tokens
  int64_t samples = 0;
  std::vector<PositionLoss> positions;  // by_position only
};

// `seqs` (each sample its own sequence) through `trainer`'s forward: their loss and, with
// `by_position`, their loss by PositionBuckets. The trainer's errors.
absl::StatusOr<DataScore> ScoreData(ChunkTrainer& trainer, const std::vector<TokenSequence>& seqs, bool by_position);

// Each document scored by the exact match of its answer, gathered by (length, depth) in the
// documents' order.
absl::StatusOr<std::vector<RetrievalScore>> ScoreRetrieval(ChunkTrainer& trainer,
                                                           const std::vector<RetrievalDoc>& docs);

// One suite with its inputs made: the one interface a job's evaluation section and `oombd model
// eval` run every suite through.
class Suite {
 public:
  virtual ~Suite() = default;
  // The longest sequence it runs, in tokens (0 when it has nothing to run).
  virtual int64_t longest() const = 0;
  // Its results with `trainer`'s forward; the trainer's errors (LibTorch's unconverted: callers
  // run it inside their LibTorch boundary).
  virtual absl::StatusOr<SuiteResult> Score(ChunkTrainer& trainer) const = 0;
};

// What the suites are made from; each suite reads its own.
struct SuiteInputs {
  std::vector<Document> samples;  // positions: each scored as its own sequence
  // passkey, needle, ruler: writes their documents (ruler keeps it, to read the generations).
  std::shared_ptr<const Tokenizer> tokenizer;
  RetrievalOptions retrieval;  // passkey, needle
  std::string haystack;        // needle: the UTF-8 text the fact is hidden in; ruler: its essay
  RulerOptions ruler;          // ruler: tasks, lengths, samples, seed
  double ruler_threshold = kRulerThreshold;
  // ruler: tokens beyond its longest length that its generations need planned (one chunk: a
  // plan leaves out a sequence's last chunk, which a generation reads).
  int64_t ruler_margin = 0;
};

// `suite` made from `inputs`: PasskeyDocs', NeedleDocs', RulerPromptFormat's and RulerDocs'
// errors (callers prefix the field or flag of the lengths, or of the haystack).
absl::StatusOr<std::unique_ptr<Suite>> MakeSuite(EvalSuite suite, const SuiteInputs& inputs);

}  // namespace oomb

#endif  // OOMB_WORKER_JOB_EVAL_SUITES_H_
