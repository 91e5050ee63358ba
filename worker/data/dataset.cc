#include "worker/data/dataset.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "worker/common/status.h"

namespace oomb {
namespace {

using nlohmann::json;

class LineError {
 public:
  LineError(const DatasetOptions& o, const std::string& path, int64_t line)
      : prefix_(absl::StrCat(o.field, ": ", path, ":", line, ": ")) {}
  absl::Status operator()(const std::string& msg) const { return absl::InvalidArgumentError(prefix_ + msg); }

 private:
  std::string prefix_;
};

// Structural UTF-8 check (lead bytes and continuation bytes), for a message that names the
// byte; the JSON parser rejects the rest (overlong forms, surrogates).
bool ValidUtf8(const std::string& s, size_t* bad_offset) {
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

std::vector<int64_t> Encode(const Tokenizer& tok, const std::string& text) {
  const std::vector<int32_t> ids = tok.Encode(text);
  return std::vector<int64_t>(ids.begin(), ids.end());
}

absl::StatusOr<Document> ParseLine(const json& j, const Tokenizer& tok, const ChatTemplate* chat,
                                   const LineError& err) {
  if (!j.is_object()) return err("expected a JSON object");
  Document d;
  auto string_field = [&](const char* key) -> absl::StatusOr<std::string> {
    const auto it = j.find(key);
    if (!it->is_string()) return err(absl::StrCat("field '", key, "': expected a string, got ", it->type_name()));
    return it->get<std::string>();
  };
  if (j.contains("text")) {
    OOMB_ASSIGN_OR_RETURN(std::string text, string_field("text"));
    d.ids = Encode(tok, text);
    d.labels = d.ids;
  } else if (j.contains("prompt") || j.contains("completion")) {
    if (!j.contains("prompt") || !j.contains("completion")) return err("'prompt' and 'completion' go together");
    OOMB_ASSIGN_OR_RETURN(std::string prompt, string_field("prompt"));
    OOMB_ASSIGN_OR_RETURN(std::string completion, string_field("completion"));
    d.ids = Encode(tok, prompt);
    d.labels.assign(d.ids.size(), kIgnoreLabel);
    const std::vector<int64_t> c = Encode(tok, completion);
    d.ids.insert(d.ids.end(), c.begin(), c.end());
    d.labels.insert(d.labels.end(), c.begin(), c.end());
  } else if (j.contains("messages")) {
    const json& m = j["messages"];
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
    if (chat == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(err("").message(), "the model has no supported chat template for 'messages' samples"));
    }
    auto rendered = chat->Render(msgs);
    if (!rendered.ok()) return err(std::string(rendered.status().message()));
    // Tokenize the text between spans without loss, each assistant span with loss.
    size_t pos = 0;
    auto add = [&](size_t begin, size_t end, bool loss) {
      if (end <= begin) return;
      const std::vector<int64_t> ids = Encode(tok, rendered->text.substr(begin, end - begin));
      d.ids.insert(d.ids.end(), ids.begin(), ids.end());
      if (loss) {
        d.labels.insert(d.labels.end(), ids.begin(), ids.end());
      } else {
        d.labels.insert(d.labels.end(), ids.size(), kIgnoreLabel);
      }
    };
    for (const AssistantSpan& s : rendered->assistant_spans) {
      add(pos, s.content_begin, false);
      add(s.content_begin, s.turn_end, true);
      pos = s.turn_end;
    }
    add(pos, rendered->text.size(), false);
  } else if (j.contains("input_ids")) {
    const json& ids = j["input_ids"];
    if (!ids.is_array()) return err("field 'input_ids': expected an array of token ids");
    for (size_t i = 0; i < ids.size(); ++i) {
      if (!ids[i].is_number_integer()) return err(absl::StrCat("input_ids[", i, "]: expected an integer"));
      const int64_t id = ids[i].get<int64_t>();
      if (id < 0 || id >= tok.vocab_size()) {
        return err(absl::StrCat("input_ids[", i, "] = ", id, " is outside the vocabulary [0, ", tok.vocab_size(), ")"));
      }
      d.ids.push_back(id);
    }
    if (j.contains("labels")) {
      const json& labels = j["labels"];
      if (!labels.is_array() || labels.size() != ids.size()) {
        return err(absl::StrCat("field 'labels': expected an array of ", ids.size(), " integers"));
      }
      for (size_t i = 0; i < labels.size(); ++i) {
        if (!labels[i].is_number_integer()) return err(absl::StrCat("labels[", i, "]: expected an integer"));
        const int64_t l = labels[i].get<int64_t>();
        if (l != kIgnoreLabel && (l < 0 || l >= tok.vocab_size())) {
          return err(absl::StrCat("labels[", i, "] = ", l, " is neither -100 nor in the vocabulary"));
        }
        d.labels.push_back(l);
      }
    } else {
      d.labels = d.ids;
    }
  } else {
    return err("no known field: expected 'text', 'prompt'/'completion', 'messages' or 'input_ids'");
  }
  if (d.ids.empty()) return err("empty sample (no tokens)");
  return d;
}

}  // namespace

absl::StatusOr<std::vector<Document>> ReadJsonlDataset(const std::string& path, const Tokenizer& tokenizer,
                                                       const ChatTemplate* chat, const DatasetOptions& options,
                                                       DatasetStats* stats) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(options.field, ": cannot open ", path));
  std::vector<Document> docs;
  DatasetStats local;
  DatasetStats& st = stats != nullptr ? *stats : local;
  std::string line;
  for (int64_t line_no = 1; std::getline(in, line); ++line_no) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    const LineError err(options, path, line_no);
    size_t bad = 0;
    if (!ValidUtf8(line, &bad)) return err(absl::StrCat("invalid UTF-8 at byte ", bad + 1, " of the line"));
    json j;
    try {
      j = json::parse(line);
    } catch (const json::parse_error& e) {
      return err(absl::StrCat("invalid JSON: ", e.what()));
    }
    OOMB_ASSIGN_OR_RETURN(Document d, ParseLine(j, tokenizer, chat, err));
    d.line = line_no;
    const int64_t n = static_cast<int64_t>(d.ids.size());
    if (n > options.max_seq_len) {
      if (options.too_long == "error") {
        return err(absl::StrCat("sample of ", n, " tokens is longer than data.max_seq_len (", options.max_seq_len,
                                ") and data.too_long is 'error'"));
      }
      if (options.too_long == "drop") {
        ++st.dropped;
        continue;
      }
      d.ids.resize(options.max_seq_len);
      d.labels.resize(options.max_seq_len);
      ++st.truncated;
    }
    ++st.samples;
    st.tokens += static_cast<int64_t>(d.ids.size());
    const auto bucket =
        std::upper_bound(st.length_bounds.begin(), st.length_bounds.end(), static_cast<int64_t>(d.ids.size())) -
        st.length_bounds.begin();
    ++st.length_counts[bucket];
    docs.push_back(std::move(d));
  }
  if (in.bad()) return absl::InternalError(absl::StrCat(options.field, ": error reading ", path));
  if (docs.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.field, ": ", path, ": no samples",
                     st.dropped > 0 ? " (every sample was longer than max_seq_len)" : ""));
  }
  return docs;
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

}  // namespace oomb
