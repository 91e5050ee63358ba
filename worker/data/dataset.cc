#include "worker/data/dataset.h"

#include <pthread.h>
#include <simdjson.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <thread>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "worker/common/status.h"

namespace oomb {
namespace {

using nlohmann::json;

class LineError {
 public:
  LineError(const DatasetOptions& o, const std::string& path, int64_t line)
      : prefix_(absl::StrCat(o.field, ": ", path, ":", line, ": ")) {}
  // The message is cut short: a parser's message may quote the whole line.
  absl::Status operator()(const std::string& msg) const {
    return WithReason(absl::InvalidArgumentError(prefix_ + Excerpt(msg, kMaxDetailBytes)), Reason::kBadData);
  }
  static constexpr size_t kMaxDetailBytes = 300;

 private:
  std::string prefix_;
};

// Lines of a file, read in blocks ("\n"-terminated, the last one possibly not), each of at most
// `max_line_bytes`: a longer line ends the reading (Next returns false, too_long() is true) as
// soon as that many bytes of it were read, so memory stays bounded whatever the file holds.
class LineReader {
 public:
  LineReader(const File& file, size_t max_line_bytes) : file_(file), max_line_bytes_(max_line_bytes) {}
  bool Next(std::string* line) {
    line->clear();
    for (;;) {
      const size_t nl = buffer_.find('\n', pos_);
      const size_t end = nl != std::string::npos ? nl : buffer_.size();
      if (line->size() + (end - pos_) > max_line_bytes_) {
        too_long_ = true;
        return false;
      }
      line->append(buffer_, pos_, end - pos_);
      if (nl != std::string::npos) {
        pos_ = nl + 1;
        return true;
      }
      pos_ = buffer_.size();
      if (!Fill()) return !line->empty();
    }
  }
  const absl::Status& status() const { return status_; }
  bool too_long() const { return too_long_; }

 private:
  bool Fill() {
    buffer_.resize(kBlock);
    pos_ = 0;
    for (;;) {
      const ssize_t n = ::pread(file_.fd(), buffer_.data(), kBlock, offset_);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) status_ = ErrnoStatus(errno, "read", file_.path());
      buffer_.resize(n > 0 ? static_cast<size_t>(n) : 0);
      offset_ += n > 0 ? n : 0;
      return n > 0;
    }
  }
  static constexpr size_t kBlock = size_t{1} << 20;
  const File& file_;
  const size_t max_line_bytes_;
  bool too_long_ = false;
  std::string buffer_;
  size_t pos_ = 0;
  off_t offset_ = 0;
  absl::Status status_;
};

// Structural UTF-8 check (lead bytes and continuation bytes), for a message that names the
// byte; the JSON parser rejects the rest (overlong forms, surrogates).
bool ValidUtf8(std::string_view s, size_t* bad_offset) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80 ? 0 : (c >> 5) == 0x6 ? 1 : (c >> 4) == 0xE ? 2 : (c >> 3) == 0x1E ? 3 : -1;
    bool ok = n >= 0 && i + n < s.size();
    for (int k = 1; ok && k <= n; ++k) ok = (static_cast<unsigned char>(s[i + k]) >> 6) == 0x2;
    if (!ok) {
      *bad_offset = i;
      return false;
    }
    i += n + 1;
  }
  return true;
}

// The tokenizer, loaded on the first sample that needs one.
class LazyTokenizer {
 public:
  explicit LazyTokenizer(const TokenizerLoader& load) : load_(load) {}
  absl::StatusOr<TextTokenizer> Get(const LineError& err) {
    if (!loaded_) {
      auto t = load_ ? load_() : absl::FailedPreconditionError("no tokenizer");
      status_ = t.status();
      if (t.ok()) tools_ = *t;
      if (status_.ok() && tools_.tokenizer == nullptr) status_ = absl::InternalError("the tokenizer loader gave null");
      loaded_ = true;
    }
    if (!status_.ok()) {
      return absl::Status(status_.code(), absl::StrCat(err("").message(), status_.message()));
    }
    return tools_;
  }

  // Bytes of text token `id` stands for: an added token's content, else one byte per
  // character of its byte-level string. Only after a successful Get().
  size_t TokenBytes(int32_t id) {
    if (added_.empty()) {
      for (const AddedToken& a : tools_.tokenizer->added_tokens()) added_[a.id] = a.content.size();
      added_[-1] = 0;  // marks the map as built
    }
    if (const auto it = added_.find(id); it != added_.end()) return it->second;
    const std::optional<std::string> s = tools_.tokenizer->IdToToken(id);
    if (!s) return 0;
    return static_cast<size_t>(
        std::count_if(s->begin(), s->end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
  }

 private:
  const TokenizerLoader& load_;
  bool loaded_ = false;
  absl::Status status_;
  TextTokenizer tools_;
  std::unordered_map<int32_t, size_t> added_;
};

// Token ids of `text`; `special` applies the tokenizer's post-processor as HF's tokenizer(text)
// does by default (Llama-3 prepends <|begin_of_text|>; SmolLM2 and Qwen2 add nothing).
absl::StatusOr<std::vector<int64_t>> Encode(const Tokenizer& tok, const std::string& text, bool special,
                                            const LineError& err) {
  auto ids = tok.EncodeChecked(text, special);
  if (!ids.ok()) return err(absl::StrCat("tokenizing: ", ids.status().message()));
  return std::vector<int64_t>(ids->begin(), ids->end());
}

absl::StatusOr<std::string> StringField(const json& j, const char* key, const LineError& err) {
  const auto it = j.find(key);
  if (!it->is_string()) return err(absl::StrCat("field '", key, "': expected a string, got ", it->type_name()));
  return it->get<std::string>();
}

absl::StatusOr<Document> ParseText(const json& j, LazyTokenizer& lazy, const LineError& err) {
  Document d;
  OOMB_ASSIGN_OR_RETURN(std::string text, StringField(j, "text", err));
  OOMB_ASSIGN_OR_RETURN(TextTokenizer t, lazy.Get(err));
  OOMB_ASSIGN_OR_RETURN(d.ids, Encode(*t.tokenizer, text, /*special=*/true, err));
  d.labels = d.ids;
  return d;
}

absl::StatusOr<Document> ParsePromptCompletion(const json& j, LazyTokenizer& lazy, const LineError& err) {
  if (!j.contains("prompt") || !j.contains("completion")) return err("'prompt' and 'completion' go together");
  Document d;
  OOMB_ASSIGN_OR_RETURN(std::string prompt, StringField(j, "prompt", err));
  OOMB_ASSIGN_OR_RETURN(std::string completion, StringField(j, "completion", err));
  OOMB_ASSIGN_OR_RETURN(TextTokenizer t, lazy.Get(err));
  OOMB_ASSIGN_OR_RETURN(d.ids, Encode(*t.tokenizer, prompt, /*special=*/true, err));
  d.labels.assign(d.ids.size(), kIgnoreLabel);
  OOMB_ASSIGN_OR_RETURN(const std::vector<int64_t> c, Encode(*t.tokenizer, completion, /*special=*/false, err));
  d.ids.insert(d.ids.end(), c.begin(), c.end());
  d.labels.insert(d.labels.end(), c.begin(), c.end());
  return d;
}

absl::StatusOr<std::vector<ChatMessage>> ParseMessageList(const json& m, const LineError& err) {
  if (!m.is_array() || m.empty()) return err("field 'messages': expected a non-empty array");
  std::vector<ChatMessage> msgs;
  for (size_t i = 0; i < m.size(); ++i) {
    const json& x = m[i];
    if (!x.is_object() || !x.contains("role") || !x.contains("content") || !x["role"].is_string() ||
        !x["content"].is_string()) {
      return err(absl::StrCat("messages[", i, "]: expected {\"role\": string, \"content\": string}"));
    }
    const std::string role = x["role"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant") {
      return err(absl::StrCat("messages[", i, "]: unknown role '", role, "' (system, user, assistant)"));
    }
    msgs.push_back({role, x["content"].get<std::string>()});
  }
  return msgs;
}

// The rendered chat tokenized span by span, each assistant span (content and end-of-turn
// marker) labelled: the fallback when token byte lengths do not add up to the text.
absl::StatusOr<Document> EncodeBySpans(const Tokenizer& tok, const RenderedChat& chat, const LineError& err) {
  Document d;
  auto add = [&](size_t begin, size_t end, bool loss) -> absl::Status {
    if (end <= begin) return absl::OkStatus();
    OOMB_ASSIGN_OR_RETURN(const std::vector<int64_t> ids,
                          Encode(tok, chat.text.substr(begin, end - begin), false, err));
    d.ids.insert(d.ids.end(), ids.begin(), ids.end());
    if (loss) {
      d.labels.insert(d.labels.end(), ids.begin(), ids.end());
    } else {
      d.labels.insert(d.labels.end(), ids.size(), kIgnoreLabel);
    }
    return absl::OkStatus();
  };
  size_t pos = 0;
  for (const AssistantSpan& s : chat.assistant_spans) {
    OOMB_RETURN_IF_ERROR(add(pos, s.content_begin, false));
    OOMB_RETURN_IF_ERROR(add(s.content_begin, s.turn_end, true));
    pos = s.turn_end;
  }
  OOMB_RETURN_IF_ERROR(add(pos, chat.text.size(), false));
  return d;
}

absl::StatusOr<Document> ParseMessages(const json& j, LazyTokenizer& lazy, const LineError& err) {
  OOMB_ASSIGN_OR_RETURN(const std::vector<ChatMessage> msgs, ParseMessageList(j["messages"], err));
  OOMB_ASSIGN_OR_RETURN(TextTokenizer t, lazy.Get(err));
  if (t.chat == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(err("").message(), "the model has no supported chat template for 'messages' samples",
                     t.chat_error.ok() ? "" : absl::StrCat(" (", t.chat_error.message(), ")")));
  }
  auto rendered = t.chat->Render(msgs);
  if (!rendered.ok()) return err(std::string(rendered.status().message()));
  // The ids are the tokenization of the whole rendered text, as transformers' chat training
  // makes them; a token carries its label when it starts inside an assistant span (content
  // and end-of-turn marker). Tokens are placed by their byte lengths; when those do not add up
  // to the text (a normalizer changed it), each span is tokenized on its own instead.
  Document d;
  OOMB_ASSIGN_OR_RETURN(d.ids, Encode(*t.tokenizer, rendered->text, false, err));
  const std::vector<AssistantSpan>& spans = rendered->assistant_spans;
  size_t byte = 0, span = 0;
  for (const int64_t id : d.ids) {
    while (span < spans.size() && byte >= spans[span].turn_end) ++span;
    const bool loss = span < spans.size() && byte >= spans[span].content_begin;
    d.labels.push_back(loss ? id : kIgnoreLabel);
    byte += lazy.TokenBytes(static_cast<int32_t>(id));
  }
  if (byte != rendered->text.size()) return EncodeBySpans(*t.tokenizer, *rendered, err);
  return d;
}

absl::StatusOr<std::vector<int64_t>> ParseLabels(const json& labels, size_t count, int64_t vocab_size,
                                                 const LineError& err) {
  if (!labels.is_array() || labels.size() != count) {
    return err(absl::StrCat("field 'labels': expected an array of ", count, " integers (one per input id)"));
  }
  std::vector<int64_t> out;
  for (size_t i = 0; i < labels.size(); ++i) {
    if (!labels[i].is_number_integer()) {
      return err(absl::StrCat("labels[", i, "]: expected an integer, got ", labels[i].dump()));
    }
    // An unsigned value above INT64_MAX would wrap (2^64 - 100 to -100): reject it first.
    const bool wraps = labels[i].is_number_unsigned() && labels[i].get<uint64_t>() > INT64_MAX;
    const int64_t l = labels[i].get<int64_t>();
    if (wraps || (l != kIgnoreLabel && (l < 0 || l >= vocab_size))) {
      return err(absl::StrCat("labels[", i, "] = ", labels[i].dump(), " is neither -100 nor in the vocabulary [0, ",
                              vocab_size, ")"));
    }
    out.push_back(l);
  }
  return out;
}

absl::StatusOr<Document> ParseInputIds(const json& j, LazyTokenizer& lazy, int64_t vocab_size, const LineError& err) {
  const json& ids = j["input_ids"];
  if (!ids.is_array()) {
    return err(absl::StrCat("field 'input_ids': expected an array of token ids, got ", ids.type_name()));
  }
  if (vocab_size <= 0) {
    OOMB_ASSIGN_OR_RETURN(TextTokenizer t, lazy.Get(err));
    vocab_size = t.tokenizer->vocab_size();
  }
  Document d;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!ids[i].is_number_integer()) {
      return err(absl::StrCat("input_ids[", i, "]: expected an integer, got ", ids[i].dump()));
    }
    const int64_t id = ids[i].get<int64_t>();
    if (id < 0 || id >= vocab_size || (ids[i].is_number_unsigned() && ids[i].get<uint64_t>() > INT64_MAX)) {
      return err(
          absl::StrCat("input_ids[", i, "] = ", ids[i].dump(), " is outside the vocabulary [0, ", vocab_size, ")"));
    }
    d.ids.push_back(id);
  }
  if (j.contains("labels")) {
    OOMB_ASSIGN_OR_RETURN(d.labels, ParseLabels(j["labels"], ids.size(), vocab_size, err));
  } else {
    d.labels = d.ids;
  }
  return d;
}

// Which of the formats a line's object is in (one, and only one).
absl::StatusOr<RecordKind> FormatOf(const json& j, const LineError& err) {
  if (!j.is_object()) return err(absl::StrCat("expected a JSON object, got ", j.type_name()));
  int formats = 0;
  for (const char* key : {"text", "messages", "input_ids"}) formats += j.contains(key) ? 1 : 0;
  formats += (j.contains("prompt") || j.contains("completion")) ? 1 : 0;
  if (formats > 1) {
    return err("more than one sample format: use one of 'text', 'prompt'/'completion', 'messages', 'input_ids'");
  }
  if (j.contains("text")) return RecordKind::kText;
  if (j.contains("prompt") || j.contains("completion")) return RecordKind::kPromptCompletion;
  if (j.contains("messages")) return RecordKind::kMessages;
  if (j.contains("input_ids")) return RecordKind::kInputIds;
  return err("no known field: expected 'text', 'prompt'/'completion', 'messages' or 'input_ids'");
}

absl::StatusOr<Document> ParseLine(const json& j, LazyTokenizer& lazy, int64_t vocab_size, const LineError& err) {
  OOMB_ASSIGN_OR_RETURN(const RecordKind kind, FormatOf(j, err));
  absl::StatusOr<Document> d;
  switch (kind) {
    case RecordKind::kText:
      d = ParseText(j, lazy, err);
      break;
    case RecordKind::kPromptCompletion:
      d = ParsePromptCompletion(j, lazy, err);
      break;
    case RecordKind::kMessages:
      d = ParseMessages(j, lazy, err);
      break;
    case RecordKind::kInputIds:
      d = ParseInputIds(j, lazy, vocab_size, err);
      break;
  }
  if (d.ok() && d->ids.empty()) return err("empty sample (no tokens)");
  return d;
}

// A line's shape as ParseLine would read it, without a tokenizer: the fields' types, ids
// non-negative, labels as many as the ids.
absl::StatusOr<RecordKind> CheckLine(const json& j, const LineError& err) {
  OOMB_ASSIGN_OR_RETURN(const RecordKind kind, FormatOf(j, err));
  switch (kind) {
    case RecordKind::kText:
      OOMB_RETURN_IF_ERROR(StringField(j, "text", err).status());
      break;
    case RecordKind::kPromptCompletion:
      if (!j.contains("prompt") || !j.contains("completion")) return err("'prompt' and 'completion' go together");
      OOMB_RETURN_IF_ERROR(StringField(j, "prompt", err).status());
      OOMB_RETURN_IF_ERROR(StringField(j, "completion", err).status());
      break;
    case RecordKind::kMessages:
      OOMB_RETURN_IF_ERROR(ParseMessageList(j["messages"], err).status());
      break;
    case RecordKind::kInputIds: {
      const json& ids = j["input_ids"];
      if (!ids.is_array() || ids.empty()) return err("field 'input_ids': expected a non-empty array of token ids");
      for (size_t i = 0; i < ids.size(); ++i) {
        if (!ids[i].is_number_integer() || (!ids[i].is_number_unsigned() && ids[i].get<int64_t>() < 0)) {
          return err(absl::StrCat("input_ids[", i, "]: expected a token id (an integer >= 0), got ", ids[i].dump()));
        }
      }
      if (j.contains("labels")) {
        OOMB_RETURN_IF_ERROR(ParseLabels(j["labels"], ids.size(), INT64_MAX, err).status());
      }
      break;
    }
  }
  return kind;
}

// The fast path for pre-tokenized lines, where parsing is the whole cost: simdjson parses a
// long id list many times faster than nlohmann. It accepts only a clean {"input_ids": [...]}
// or {"input_ids": [...], "labels": [...]} line whose every value is valid; anything else
// (another format, a duplicate or extra key, any error, invalid UTF-8: simdjson checks the whole
// line) returns false and the line goes through nlohmann and ParseLine, which give the error
// messages. So both paths agree on every accepted line, and messages are unchanged. (The DOM
// API, not On-Demand: simdjson picks the DOM's SIMD kernels when it runs; On-Demand's are fixed
// when it is compiled, the portable scalar ones here.)
// `line` has SIMDJSON_PADDING readable bytes after its end; `d` null: the line is only checked.
bool FastInputIds(simdjson::dom::parser& parser, std::string_view line, int64_t vocab_size, Document* d) {
  using simdjson::SUCCESS;
  if (vocab_size <= 0) return false;
  simdjson::dom::object obj;
  if (parser.parse(line.data(), line.size(), /*realloc_if_needed=*/false).get_object().get(obj) != SUCCESS) {
    return false;
  }
  simdjson::dom::array ids, labels;
  bool has_ids = false, has_labels = false;
  for (const auto field : obj) {
    if (field.key == "input_ids" && !has_ids) {
      has_ids = field.value.get_array().get(ids) == SUCCESS;
      if (!has_ids) return false;
    } else if (field.key == "labels" && !has_labels) {
      has_labels = field.value.get_array().get(labels) == SUCCESS;
      if (!has_labels) return false;
    } else {
      return false;
    }
  }
  if (!has_ids || ids.size() == 0 || (has_labels && labels.size() != ids.size())) return false;
  if (d != nullptr) d->ids.reserve(ids.size());
  for (const auto v : ids) {
    int64_t id = 0;
    if (v.get_int64().get(id) != SUCCESS || id < 0 || id >= vocab_size) return false;
    if (d != nullptr) d->ids.push_back(id);
  }
  if (!has_labels) {
    if (d != nullptr) d->labels = d->ids;
    return true;
  }
  if (d != nullptr) d->labels.reserve(labels.size());
  for (const auto v : labels) {
    int64_t l = 0;
    if (v.get_int64().get(l) != SUCCESS) return false;
    if (l != kIgnoreLabel && (l < 0 || l >= vocab_size)) return false;
    if (d != nullptr) d->labels.push_back(l);
  }
  return true;
}

}  // namespace

size_t MaxLineBytes(int64_t max_seq_len) {
  constexpr int64_t kMinBytes = int64_t{16} << 20, kMaxBytes = int64_t{256} << 20, kBytesPerToken = 64;
  return static_cast<size_t>(std::clamp(std::min(max_seq_len, kMaxBytes) * kBytesPerToken, kMinBytes, kMaxBytes));
}

absl::StatusOr<std::vector<Document>> ReadJsonlDataset(const File& file, const Tokenizer& tokenizer,
                                                       const ChatTemplate* chat, const DatasetOptions& options,
                                                       DatasetStats* stats) {
  const TokenizerLoader load = [&]() -> absl::StatusOr<TextTokenizer> { return TextTokenizer{&tokenizer, chat, {}}; };
  return ReadJsonlDataset(file, load, options, stats);
}

absl::StatusOr<std::vector<Document>> ReadJsonlDataset(const File& file, const TokenizerLoader& tokenizer,
                                                       const DatasetOptions& options, DatasetStats* stats) {
  const std::string& path = file.path();
  const size_t max_line_bytes = MaxLineBytes(options.max_seq_len);
  LineReader in(file, max_line_bytes);
  std::vector<Document> docs;
  DatasetStats local;
  DatasetStats& st = stats != nullptr ? *stats : local;
  st = DatasetStats();
  LazyTokenizer lazy(tokenizer);
  simdjson::dom::parser parser;
  std::string line;
  int64_t line_no = 1;
  for (; in.Next(&line); ++line_no) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    const LineError err(options, path, line_no);
    Document d;
    std::string generator;
    line.reserve(line.size() + simdjson::SIMDJSON_PADDING);     // parsed in place, not copied
    if (!FastInputIds(parser, line, options.vocab_size, &d)) {  // what it accepts is valid UTF-8
      d = Document();
      size_t bad = 0;
      if (!ValidUtf8(line, &bad)) return err(absl::StrCat("invalid UTF-8 at byte ", bad + 1, " of the line"));
      json j;
      try {
        j = json::parse(line);
      } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers like 1e999
        return err(absl::StrCat("invalid JSON: ", e.what()));
      }
      OOMB_ASSIGN_OR_RETURN(d, ParseLine(j, lazy, options.vocab_size, err));
      if (j.contains("generator") && j["generator"].is_string()) generator = j["generator"].get<std::string>();
    }
    d.line = line_no;
    const int64_t n = static_cast<int64_t>(d.ids.size());
    if (n > options.max_seq_len) {
      if (options.too_long == TooLong::kError) {
        return err(absl::StrCat("sample of ", n, " tokens is longer than data.max_seq_len (", options.max_seq_len,
                                ") and data.too_long is 'error'"));
      }
      if (options.too_long == TooLong::kDrop) {
        ++st.dropped;
        continue;
      }
      d.ids.resize(options.max_seq_len);
      d.labels.resize(options.max_seq_len);
      ++st.truncated;
    }
    ++st.samples;
    st.tokens += static_cast<int64_t>(d.ids.size());
    st.longest = std::max(st.longest, static_cast<int64_t>(d.ids.size()));
    // Shifted within the document (TokenSequence::Append): the first token predicts nothing.
    for (size_t t = 1; t < d.labels.size(); ++t) st.label_tokens += d.labels[t] != kIgnoreLabel ? 1 : 0;
    const auto bucket =
        std::upper_bound(st.length_bounds.begin(), st.length_bounds.end(), static_cast<int64_t>(d.ids.size())) -
        st.length_bounds.begin();
    ++st.length_counts[bucket];
    if (!generator.empty()) ++st.generators[generator];
    docs.push_back(std::move(d));
  }
  if (!in.status().ok()) return Annotate(in.status(), options.field);
  if (in.too_long()) {
    return LineError(options, path, line_no)(
        absl::StrCat("the line is longer than ", max_line_bytes, " bytes, more than a sample of data.max_seq_len (",
                     options.max_seq_len, ") tokens can hold; split long texts into samples (oombd data build)"));
  }
  if (docs.empty()) {
    return WithReason(
        absl::InvalidArgumentError(absl::StrCat(options.field, ": ", path, ": no samples",
                                                st.dropped > 0 ? " (every sample was longer than max_seq_len)" : "")),
        Reason::kBadData);
  }
  return docs;
}

struct JsonlRecordChecker::Parser {
  simdjson::dom::parser simdjson;
};

// Whole lines: `head` (the line the pieces before began, ended in this piece), then
// piece[begin, end).
struct JsonlRecordChecker::Block {
  std::string head;
  std::shared_ptr<const std::string> piece;  // may be null
  size_t begin = 0, end = 0;
  int64_t first_line = 0;
  bool done = false;
  RecordCounts counts;
  absl::Status status;
};

struct JsonlRecordChecker::Workers {
  explicit Workers(size_t n) : max_blocks(2 * n) {}
  const size_t max_blocks;  // dispatched and not yet collected
  absl::Mutex mu;
  std::deque<std::shared_ptr<Block>> queue ABSL_GUARDED_BY(mu);  // not taken yet
  std::deque<std::shared_ptr<Block>> order ABSL_GUARDED_BY(mu);  // not collected yet, in order
  bool stopping ABSL_GUARDED_BY(mu) = false;
  std::vector<std::thread> threads;
};

JsonlRecordChecker::JsonlRecordChecker(std::string field, std::string shown_path, int threads, size_t max_line_bytes,
                                       std::string limit_key)
    : field_(std::move(field)),
      shown_path_(std::move(shown_path)),
      limit_key_(std::move(limit_key)),
      max_line_bytes_(max_line_bytes > 0 ? max_line_bytes : MaxLineBytes(int64_t{1} << 31)),
      parser_(std::make_unique<Parser>()) {
  if (threads <= 1) return;
  workers_ = std::make_unique<Workers>(static_cast<size_t>(threads));
  for (int i = 0; i < threads; ++i) workers_->threads.emplace_back([this] { Work(); });
}

JsonlRecordChecker::~JsonlRecordChecker() {
  if (workers_ == nullptr) return;
  {
    absl::MutexLock lock(&workers_->mu);
    workers_->stopping = true;
  }
  for (std::thread& t : workers_->threads) t.join();
}

absl::Status JsonlRecordChecker::Feed(std::string_view bytes) {
  return workers_ != nullptr ? FeedBlocks(std::make_shared<const std::string>(bytes)) : FeedLines(bytes);
}

absl::Status JsonlRecordChecker::Feed(std::shared_ptr<const std::string> piece) {
  return workers_ != nullptr ? FeedBlocks(std::move(piece)) : FeedLines(*piece);
}

absl::Status JsonlRecordChecker::FeedLines(std::string_view bytes) {
  for (size_t pos = 0; status_.ok() && pos < bytes.size();) {
    const void* found = std::memchr(bytes.data() + pos, '\n', bytes.size() - pos);
    const size_t end =
        found != nullptr ? static_cast<size_t>(static_cast<const char*>(found) - bytes.data()) : bytes.size();
    if (partial_.size() + (end - pos) > max_line_bytes_) {
      status_ = TooLong();
      break;
    }
    if (found == nullptr) {
      partial_.append(bytes.data() + pos, end - pos);
      break;
    }
    if (partial_.empty() && end + simdjson::SIMDJSON_PADDING <= bytes.size()) {
      status_ = Check(bytes.substr(pos, end - pos));  // in place: the rest of `bytes` pads it
    } else {
      partial_.append(bytes.data() + pos, end - pos);
      status_ = CheckPartial();
    }
    pos = end + 1;
  }
  return status_;
}

namespace {

int64_t CountLines(std::string_view bytes) {
  int64_t n = 0;
  for (const char *p = bytes.data(), *end = p + bytes.size();
       (p = static_cast<const char*>(std::memchr(p, '\n', static_cast<size_t>(end - p)))) != nullptr; ++p) {
    ++n;
  }
  return n;
}

}  // namespace

absl::Status JsonlRecordChecker::FeedBlocks(std::shared_ptr<const std::string> piece) {
  Collect(/*all=*/false);
  if (!status_.ok()) return status_;
  std::string_view bytes(*piece);
  const void* last = ::memrchr(bytes.data(), '\n', bytes.size());
  if (last != nullptr) {  // whole lines to the workers, the rest begins the next line
    const size_t cut = static_cast<size_t>(static_cast<const char*>(last) - bytes.data()) + 1;
    size_t begin = 0;
    std::string head;
    if (!partial_.empty()) {  // the line the pieces before began ends at this one's first newline
      begin = static_cast<size_t>(static_cast<const char*>(std::memchr(bytes.data(), '\n', cut)) - bytes.data()) + 1;
      head = std::move(partial_);
      head.append(bytes.data(), begin);
      partial_.clear();
    }
    Dispatch(std::move(head), piece, begin, cut);
    bytes.remove_prefix(cut);
  }
  if (partial_.size() + bytes.size() > max_line_bytes_) {
    Collect(/*all=*/true);  // an error in an earlier line comes first
    if (!status_.ok()) return status_;
    status_ = TooLong();
    return status_;
  }
  partial_.append(bytes);
  return status_;
}

void JsonlRecordChecker::Dispatch(std::string head, std::shared_ptr<const std::string> piece, size_t begin,
                                  size_t end) {
  auto block = std::make_shared<Block>();
  block->first_line = line_no_;
  line_no_ +=
      CountLines(head) + (piece != nullptr ? CountLines(std::string_view(*piece).substr(begin, end - begin)) : 0);
  block->head = std::move(head);
  block->piece = std::move(piece);
  block->begin = begin;
  block->end = end;
  {
    absl::MutexLock lock(&workers_->mu);
    workers_->queue.push_back(block);
    workers_->order.push_back(block);
  }
  Collect(/*all=*/false);
}

void JsonlRecordChecker::Collect(bool all) {
  Workers& w = *workers_;
  absl::MutexLock lock(&w.mu);
  while (!w.order.empty()) {
    Block* front = w.order.front().get();
    if (!front->done) {
      if (!all && w.order.size() <= w.max_blocks) break;
      w.mu.Await(absl::Condition(
          +[](Block* b) { return b->done; }, front));
    }
    for (size_t k = 0; k < kRecordKinds; ++k) counts_.by_kind[k] += front->counts.by_kind[k];
    counts_.records += front->counts.records;
    if (!front->status.ok() && status_.ok()) status_ = front->status;
    w.order.pop_front();
  }
}

void JsonlRecordChecker::Work() {
  ::pthread_setname_np(::pthread_self(), "oomb-check");
  Workers& w = *workers_;
  JsonlRecordChecker lines(field_, shown_path_, 1, max_line_bytes_, limit_key_);  // reused block after block
  for (;;) {
    std::shared_ptr<Block> block;
    {
      absl::MutexLock lock(&w.mu);
      w.mu.Await(absl::Condition(
          +[](Workers* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu) { return w->stopping || !w->queue.empty(); }, &w));
      if (w.stopping) return;
      block = std::move(w.queue.front());
      w.queue.pop_front();
    }
    lines.line_no_ = block->first_line;
    lines.counts_ = RecordCounts();
    lines.status_ = absl::OkStatus();
    absl::Status s = block->head.empty() ? absl::OkStatus() : lines.CheckWhole(&block->head);
    block->head = std::string();  // its memory back at once
    if (s.ok() && block->piece != nullptr) {
      s = lines.FeedLines(std::string_view(*block->piece).substr(block->begin, block->end - block->begin));
    }
    if (s.ok() && !lines.partial_.empty()) s = lines.CheckPartial();  // the file's last line
    lines.partial_.clear();
    absl::MutexLock lock(&w.mu);
    block->counts = lines.counts_;
    block->status = s;
    block->done = true;
  }
}

absl::StatusOr<RecordCounts> JsonlRecordChecker::Finish() {
  if (workers_ != nullptr) {
    if (status_.ok() && !partial_.empty()) Dispatch(std::move(partial_), nullptr, 0, 0);
    partial_.clear();
    Collect(/*all=*/true);
  } else if (status_.ok() && !partial_.empty()) {
    status_ = CheckPartial();
  }
  if (status_.ok() && counts_.records == 0) {
    status_ = WithReason(absl::InvalidArgumentError(absl::StrCat(field_, ": ", shown_path_, ": no samples")),
                         Reason::kBadData);
  }
  if (!status_.ok()) return status_;
  return counts_;
}

absl::Status JsonlRecordChecker::TooLong() const {
  return LineError(DatasetOptions{.field = field_}, shown_path_, line_no_)(
      absl::StrCat("the line is longer than ", max_line_bytes_, " bytes",
                   limit_key_.empty() ? "" : absl::StrCat(" (", limit_key_, ")"), "; split long texts into samples"));
}

// A block's head: one line (the pieces before began it), not copied again.
absl::Status JsonlRecordChecker::CheckWhole(std::string* line) {
  if (!line->empty() && line->back() == '\n') line->pop_back();
  if (line->size() > max_line_bytes_) return TooLong();
  line->reserve(line->size() + simdjson::SIMDJSON_PADDING);
  return Check(*line);
}

absl::Status JsonlRecordChecker::CheckPartial() {
  partial_.reserve(partial_.size() + simdjson::SIMDJSON_PADDING);
  const absl::Status s = Check(partial_);
  partial_.clear();
  return s;
}

absl::Status JsonlRecordChecker::Check(std::string_view line) {
  const int64_t line_no = line_no_++;
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (line.find_first_not_of(" \t") == std::string_view::npos) return absl::OkStatus();
  // Pre-tokenized lines, any vocabulary: FastInputIds accepts only what CheckLine would.
  if (FastInputIds(parser_->simdjson, line, std::numeric_limits<int64_t>::max(), nullptr)) {
    ++counts_.by_kind[static_cast<size_t>(RecordKind::kInputIds)];
    ++counts_.records;
    return absl::OkStatus();
  }
  const LineError err(DatasetOptions{.field = field_}, shown_path_, line_no);
  size_t bad = 0;
  if (!ValidUtf8(line, &bad)) return err(absl::StrCat("invalid UTF-8 at byte ", bad + 1, " of the line"));
  json j;
  try {
    j = json::parse(line.begin(), line.end());  // not copied first
  } catch (const json::exception& e) {
    return err(absl::StrCat("invalid JSON: ", e.what()));
  }
  OOMB_ASSIGN_OR_RETURN(const RecordKind kind, CheckLine(j, err));
  ++counts_.by_kind[static_cast<size_t>(kind)];
  ++counts_.records;
  return absl::OkStatus();
}

absl::StatusOr<RecordCounts> CheckJsonlRecords(const File& file, const std::string& field,
                                               const std::string& shown_path) {
  JsonlRecordChecker checker(field, shown_path);
  std::string block(size_t{4} << 20, '\0');
  for (off_t offset = 0;;) {
    const ssize_t n = ::pread(file.fd(), block.data(), block.size(), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Annotate(ErrnoStatus(errno, "read", file.path()), field);
    if (n == 0) break;
    offset += n;
    OOMB_RETURN_IF_ERROR(checker.Feed(std::string_view(block.data(), static_cast<size_t>(n))));
  }
  return checker.Finish();
}

std::string_view RecordKindName(RecordKind kind) {
  switch (kind) {
    case RecordKind::kText:
      return "text";
    case RecordKind::kPromptCompletion:
      return "prompt_completion";
    case RecordKind::kMessages:
      return "messages";
    case RecordKind::kInputIds:
      return "input_ids";
  }
  return "";
}

std::vector<TokenSequence> PackDocuments(const std::vector<Document>& docs, int64_t max_seq_len, bool packing,
                                         int64_t shuffle_seed) {
  std::vector<size_t> order(docs.size());
  std::iota(order.begin(), order.end(), 0);
  if (shuffle_seed >= 0) {
    std::mt19937_64 rng(static_cast<uint64_t>(shuffle_seed));
    for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng() % i]);
  }
  std::vector<TokenSequence> out;
  TokenSequence cur;
  for (size_t idx : order) {
    const Document& d = docs[idx];
    if (!packing || cur.size() + static_cast<int64_t>(d.ids.size()) > max_seq_len) {
      if (cur.size() > 0) out.push_back(std::move(cur));
      cur = TokenSequence();
    }
    cur.Append(d);
  }
  if (cur.size() > 0) out.push_back(std::move(cur));
  return out;
}

ModelTokenizer::ModelTokenizer(Dir model_dir, std::string model_field)
    : model_dir_(std::move(model_dir)), model_field_(std::move(model_field)) {}

TokenizerLoader ModelTokenizer::Loader() {
  return [this]() -> absl::StatusOr<TextTokenizer> {
    if (tokenizer_ == nullptr) {
      if (!load_error_.ok()) return load_error_;
      auto tokenizer = Tokenizer::FromModelDir(model_dir_);
      if (!tokenizer.ok()) {
        const std::string context = absl::StrCat(
            "this sample needs the model's tokenizer (or use pre-tokenized {\"input_ids\": [...]} samples): ",
            model_field_);
        load_error_ = ReasonOf(tokenizer.status()) == Reason::kPathDenied
                          ? Annotate(tokenizer.status(), context)
                          : absl::InvalidArgumentError(absl::StrCat(context, ": ", tokenizer.status().message()));
        return load_error_;
      }
      tokenizer_ = *std::move(tokenizer);
      ChatSpecialTokens special;
      if (auto bos = tokenizer_->bos_id()) special.bos = tokenizer_->IdToToken(*bos).value_or("");
      if (auto eos = tokenizer_->eos_id()) special.eos = tokenizer_->IdToToken(*eos).value_or("");
      auto chat = ChatTemplate::FromJinja(tokenizer_->chat_template(), std::move(special));
      if (chat.ok()) {
        chat_ = *chat;
      } else {
        chat_error_ = chat.status();
      }
    }
    return TextTokenizer{tokenizer_.get(), chat_ ? &*chat_ : nullptr, chat_error_};
  };
}

absl::StatusOr<int64_t> ModelVocabSize(const Dir& model_dir) {
  OOMB_ASSIGN_OR_RETURN(std::string text, model_dir.ReadFile("config.json", int64_t{16} << 20));
  const auto config = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  const auto it = config.is_object() ? config.find("vocab_size") : config.end();
  if (it == config.end() || !it->is_number_integer() || it->get<int64_t>() <= 0) return 0;
  return it->get<int64_t>();
}

}  // namespace oomb
