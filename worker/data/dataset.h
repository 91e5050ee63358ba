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
// Exactly one format per line (a line with two is an error). Tokenization follows
// transformers: "text" and "prompt" are encoded with the tokenizer's special tokens (its
// post-processor: Llama-3 prepends <|begin_of_text|>; SmolLM2 and Qwen2 add nothing), the
// completion without; a conversation is encoded whole, as rendered, and a token carries its
// label when it starts inside an assistant span (so a BPE merge across a span boundary gives
// the same ids as transformers).
// Blank lines are skipped. Every error names the file and the 1-based line:
//   "data.train: /data/a.jsonl:12: invalid JSON: ..."  (INVALID_ARGUMENT)
// too_long: "truncate" cuts a sample to max_seq_len, "drop" skips it, "error" fails naming the
// line and the length.
//
// The file is read line by line (never loaded whole); the documents are kept in memory as
// token ids. Pre-tokenized lines take a simdjson fast path (much faster than nlohmann on long
// id lists); every other line, and every line with an error, goes through nlohmann, which words
// the messages.
#ifndef OOMB_WORKER_DATA_DATASET_H_
#define OOMB_WORKER_DATA_DATASET_H_

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/data/sequence.h"
#include "worker/hf/chat_template.h"
#include "worker/hf/tokenizer.h"

namespace oomb {

// What to do with a sample longer than max_seq_len: cut it, skip it, or fail naming its line.
enum class TooLong { kTruncate, kDrop, kError };

struct DatasetOptions {
  std::string field = "data.train";  // the job-spec field named in errors
  int64_t max_seq_len = 131072;
  TooLong too_long = TooLong::kTruncate;
  // Bound of "input_ids" and "labels" values: [0, vocab_size). Use the model's embedding rows
  // (config.json vocab_size), which may exceed the tokenizer's. 0: the tokenizer's vocab_size
  // (which then loads the tokenizer even for a pre-tokenized file).
  int64_t vocab_size = 0;
};

// The longest line a dataset may hold for samples of `max_seq_len` tokens: 64 bytes a token
// (a pre-tokenized line with labels takes about 20 a token, text about 4, and a JSON-escaped
// character up to 12), at least 16 MiB and at most 256 MiB. A longer line is refused, naming file:line, once that
// many bytes of it were read: reading a file takes memory bounded by this, not by its lines.
size_t MaxLineBytes(int64_t max_seq_len);

struct DatasetStats {
  int64_t samples = 0;       // documents kept
  int64_t tokens = 0;        // tokens kept
  int64_t longest = 0;       // tokens of the longest sample kept (after truncation)
  int64_t label_tokens = 0;  // tokens kept that carry a label (the loss is over these)
  int64_t dropped = 0;
  int64_t truncated = 0;
  // Histogram of kept sample lengths: counts[i] for [bounds[i-1], bounds[i]), the last bucket
  // open-ended.
  std::vector<int64_t> length_bounds = {128, 512, 2048, 8192, 32768, 131072, 524288};
  std::vector<int64_t> length_counts = std::vector<int64_t>(8, 0);
  // Samples kept by the string of their "generator" field: the evaluation suite whose generator
  // wrote them (`oombd data retrieval`: "passkey", "needle", "ruler/<task>").
  std::map<std::string, int64_t> generators;
};

// What the reader tokenizes text with. Only "text", "prompt"/"completion" and "messages"
// samples need it, so a pre-tokenized file (with DatasetOptions::vocab_size set) reads without
// a tokenizer.json.
struct TextTokenizer {
  const Tokenizer* tokenizer = nullptr;  // required
  const ChatTemplate* chat = nullptr;    // null: "messages" samples are FAILED_PRECONDITION
  absl::Status chat_error;               // why `chat` is null (ChatTemplate::FromJinja's error)
};
// Called at most once per read, on the first sample that needs it; the pointers must outlive
// the read. Its error fails the read, with its code and its message prefixed by the field, the
// file and the line of that sample ("data.train: /d/a.jsonl:3: " + message).
using TokenizerLoader = std::function<absl::StatusOr<TextTokenizer>()>;

// A model directory's tokenizer and chat template, loaded on the first sample that holds text:
// a model without tokenizer.json (e.g. a test model) reads pre-tokenized {"input_ids"} data,
// and a text sample is then an error naming its line. `model_field` names the directory in
// that error ("model.path", "--model").
class ModelTokenizer {
 public:
  ModelTokenizer(Dir model_dir, std::string model_field);
  // For ReadJsonlDataset; valid while this object lives.
  TokenizerLoader Loader();
  // What was loaded (null / nullopt when no sample needed it); the object gives them up.
  std::unique_ptr<Tokenizer> TakeTokenizer() { return std::move(tokenizer_); }
  std::optional<ChatTemplate> TakeChat() { return std::move(chat_); }

 private:
  Dir model_dir_;
  std::string model_field_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::optional<ChatTemplate> chat_;
  absl::Status chat_error_;
  absl::Status load_error_;
};

// config.json's vocab_size in `model_dir`: the bound of pre-tokenized ids (the model's
// embedding rows, DatasetOptions::vocab_size); 0 when it has none.
absl::StatusOr<int64_t> ModelVocabSize(const Dir& model_dir);

// Reads every sample of `file`. INVALID_ARGUMENT with reason BAD_DATA for the first bad line
// (naming it, with at most a short escaped excerpt of its content) and when the file holds no
// sample;
// FAILED_PRECONDITION for a "messages" line when the model has no supported chat template; the
// loader's error (with the line) when a sample needs a tokenizer that cannot be loaded.
absl::StatusOr<std::vector<Document>> ReadJsonlDataset(const File& file, const TokenizerLoader& tokenizer,
                                                       const DatasetOptions& options, DatasetStats* stats);
// `stats` (optional) is overwritten with the read's summary.

// As above with a tokenizer already loaded; `chat` may be null.
absl::StatusOr<std::vector<Document>> ReadJsonlDataset(const File& file, const Tokenizer& tokenizer,
                                                       const ChatTemplate* chat, const DatasetOptions& options,
                                                       DatasetStats* stats);

// The formats of a line (see the file comment).
enum class RecordKind { kText, kPromptCompletion, kMessages, kInputIds };
inline constexpr size_t kRecordKinds = 4;
// "text", "prompt_completion", "messages", "input_ids".
std::string_view RecordKindName(RecordKind kind);

struct RecordCounts {
  int64_t records = 0;                             // lines that are not blank
  std::array<int64_t, kRecordKinds> by_kind = {};  // indexed by RecordKind
};

// Checks every line of `file` as ReadJsonlDataset reads it, short of tokenizing: valid UTF-8,
// JSON, one object of one format whose fields have the right types ("input_ids" integers >= 0,
// "labels" as many, each -100 or >= 0); an uploaded dataset's check, before any model is known.
// Errors as ReadJsonlDataset's, naming `field`, `shown_path` (the file as its owner knows it; an
// upload's temporary file has another name) and the line; lines of any length up to
// MaxLineBytes of the longest context (256 MiB).
absl::StatusOr<RecordCounts> CheckJsonlRecords(const File& file, const std::string& field,
                                               const std::string& shown_path);

// CheckJsonlRecords over bytes that come in pieces (an upload's, as they arrive), a line split
// anywhere between two: Feed every piece in order, then Finish. The first error ends the check
// (Feed returns it, or a later Feed, and Finish); memory: one line at most where a piece cuts it,
// and with `threads` > 1 about 2 x `threads` pieces.
//
// `max_line_bytes` bounds a line (0: MaxLineBytes of the longest context, 256 MiB); a longer one
// is an error naming the line and `limit_key` (where the bound is set, e.g. a config key) as
// soon as that many of its bytes were fed. Memory beyond the pieces: a line being assembled,
// and for a line being checked about 5 times its size (the line, simdjson's and nlohmann's
// copies), on each checking thread.
//
// `threads` > 1: lines are checked on that many threads of the checker's own, a block of whole
// lines at a time (what the pieces fed hold up to their last newline), so that the check keeps
// up with a fast client; the counts, the errors and which error comes first (the first line's)
// are those of the check on one thread.
//
// Thread-compatible (its own threads are internal).
class JsonlRecordChecker {
 public:
  JsonlRecordChecker(std::string field, std::string shown_path, int threads = 1, size_t max_line_bytes = 0,
                     std::string limit_key = "");
  ~JsonlRecordChecker();
  JsonlRecordChecker(const JsonlRecordChecker&) = delete;
  JsonlRecordChecker& operator=(const JsonlRecordChecker&) = delete;

  absl::Status Feed(std::string_view bytes);
  // The same for a piece the checker may keep: with threads, its lines are checked where they
  // are, not copied.
  absl::Status Feed(std::shared_ptr<const std::string> piece);
  // The counts, once the last line (without its "\n") is checked; "no samples" when none.
  absl::StatusOr<RecordCounts> Finish();

 private:
  struct Parser;
  struct Block;
  struct Workers;
  absl::Status FeedLines(std::string_view bytes);                     // on this thread
  absl::Status FeedBlocks(std::shared_ptr<const std::string> piece);  // to the workers
  void Dispatch(std::string head, std::shared_ptr<const std::string> piece, size_t begin, size_t end);
  void Collect(bool all);  // folds the blocks checked, in order
  void Work();             // a worker's loop
  absl::Status Check(std::string_view line);
  absl::Status CheckPartial();                 // partial_ as one line
  absl::Status CheckWhole(std::string* line);  // one line, its "\n" if any, checked where it is
  absl::Status TooLong() const;                // the line line_no_ is longer than max_line_bytes_

  const std::string field_, shown_path_, limit_key_;
  const size_t max_line_bytes_;
  std::unique_ptr<Parser> parser_;
  std::unique_ptr<Workers> workers_;  // threads > 1
  std::string partial_;               // the line the last piece ended in
  int64_t line_no_ = 1;               // of the next line to check (with workers: to dispatch)
  RecordCounts counts_;
  absl::Status status_;
};

// Orders the documents (a seeded shuffle unless shuffle_seed < 0) and forms sequences of at
// most max_seq_len tokens: with packing, consecutive documents share a sequence (positions
// restart, no attention across them); without, one document per sequence.
std::vector<TokenSequence> PackDocuments(const std::vector<Document>& docs, int64_t max_seq_len, bool packing,
                                         int64_t shuffle_seed);

}  // namespace oomb

#endif  // OOMB_WORKER_DATA_DATASET_H_
