#include "worker/hf/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "worker/common/status.h"
#include "worker/hf/unicode.h"

namespace oomb {
namespace {

using Json = nlohmann::json;

// The pre-tokenization regex of GPT-2, used by ByteLevel with use_regex.
constexpr char kGpt2Pattern[] = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Unicode White_Space as a PCRE2 class body: what Oniguruma's \s matches. PCRE2's own \s (with
// UCP) misses U+0085, so patterns are rewritten to use this.
constexpr char kWhitespaceClass[] =
    R"(\t\n\x{0B}\f\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

// Words longer than this are not cached (they are rare and would bloat the cache).
constexpr size_t kMaxCachedWordBytes = 256;
constexpr size_t kMaxCacheEntries = 1 << 18;

// Replaces \s and \S outside character classes, and \s inside them, by kWhitespaceClass.
std::string RewriteWhitespace(std::string_view p) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char n = p[i + 1];
      if (n == 's') {
        out += in_class ? std::string(kWhitespaceClass) : absl::StrCat("[", kWhitespaceClass, "]");
      } else if (n == 'S' && !in_class) {
        out += absl::StrCat("[^", kWhitespaceClass, "]");
      } else {
        out += c;
        out += n;
      }
      ++i;
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

struct CodeDeleter {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};

// Per-call PCRE2 state (match data and JIT stack are not shareable between threads).
class MatchScratch {
 public:
  MatchScratch()
      : md_(pcre2_match_data_create(16, nullptr)),
        mc_(pcre2_match_context_create(nullptr)),
        js_(pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr)) {
    if (mc_ != nullptr && js_ != nullptr) pcre2_jit_stack_assign(mc_, nullptr, js_);
  }
  ~MatchScratch() {
    pcre2_match_data_free(md_);
    pcre2_match_context_free(mc_);
    pcre2_jit_stack_free(js_);
  }
  MatchScratch(const MatchScratch&) = delete;
  MatchScratch& operator=(const MatchScratch&) = delete;
  pcre2_match_data* md() const { return md_; }
  pcre2_match_context* mc() const { return mc_; }

 private:
  pcre2_match_data* md_;
  pcre2_match_context* mc_;
  pcre2_jit_stack* js_;
};

class Regex {
 public:
  static absl::StatusOr<std::shared_ptr<const Regex>> Compile(const std::string& pattern, bool literal) {
    int err = 0;
    PCRE2_SIZE err_off = 0;
    const std::string p = literal ? pattern : RewriteWhitespace(pattern);
    // PCRE2_LITERAL admits no PCRE2_UCP (a literal has no character classes to widen).
    const uint32_t opts = PCRE2_UTF | PCRE2_NO_UTF_CHECK | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(), opts, &err, &err_off, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(err, buf, sizeof(buf));
      return absl::InvalidArgumentError(absl::StrCat("regex '", pattern, "' does not compile at offset ", err_off, ": ",
                                                     reinterpret_cast<const char*>(buf)));
    }
    auto r = std::shared_ptr<Regex>(new Regex());
    r->code_.reset(code);
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter on failure
    return r;
  }

  // Appends the [begin, end) of every non-overlapping match, scanning left to right; after an
  // empty match the scan moves on by one character (as Oniguruma's find_iter does).
  absl::Status FindAll(std::string_view s, const MatchScratch& scratch,
                       std::vector<std::pair<size_t, size_t>>* out) const {
    size_t start = 0;
    while (start <= s.size()) {
      const int rc = pcre2_match(code_.get(), reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), start,
                                 PCRE2_NO_UTF_CHECK, scratch.md(), scratch.mc());
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR buf[256];
        pcre2_get_error_message(rc, buf, sizeof(buf));
        return absl::ResourceExhaustedError(absl::StrCat("regex match failed: ", reinterpret_cast<const char*>(buf)));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch.md());
      const size_t b = ov[0], e = ov[1];
      out->emplace_back(b, e);
      if (e > b) {
        start = e;
      } else {
        if (e >= s.size()) break;
        size_t next = e;
        NextCodePoint(s, &next);
        start = next;
      }
    }
    return absl::OkStatus();
  }

 private:
  Regex() = default;
  std::unique_ptr<pcre2_code, CodeDeleter> code_;
};

// \w of the first / last character, for added tokens with single_word.
bool IsWordChar(char32_t cp) {
  static const auto* const kWord = [] {
    auto r = Regex::Compile(R"(^\w$)", false);
    return r.ok() ? new std::shared_ptr<const Regex>(*r) : nullptr;
  }();
  if (kWord == nullptr) return false;
  std::string s;
  AppendUtf8(cp, &s);
  MatchScratch scratch;
  std::vector<std::pair<size_t, size_t>> m;
  return (*kWord)->FindAll(s, scratch, &m).ok() && !m.empty();
}

char32_t LastCodePoint(std::string_view s) {
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return NextCodePoint(s, &i);
}

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

absl::StatusOr<Behavior> ParseBehavior(const std::string& s) {
  if (s == "Removed") return Behavior::kRemoved;
  if (s == "Isolated") return Behavior::kIsolated;
  if (s == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (s == "MergedWithNext") return Behavior::kMergedWithNext;
  if (s == "Contiguous") return Behavior::kContiguous;
  return absl::InvalidArgumentError(absl::StrCat("unknown split behavior '", s, "'"));
}

struct PreTokStep {
  enum class Kind { kSplit, kPrefixSpace } kind = Kind::kSplit;
  std::shared_ptr<const Regex> regex;
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;
};

struct Piece {
  size_t begin, end;
  bool match;
};

// The GPT-2 byte -> printable code point table.
std::array<char32_t, 256> BytesToUnicode() {
  std::array<char32_t, 256> table{};
  std::array<bool, 256> direct{};
  for (int b = '!'; b <= '~'; ++b) direct[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
  int n = 0;
  for (int b = 0; b < 256; ++b) table[b] = direct[b] ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
  return table;
}

// Reads an optional bool field; INVALID_ARGUMENT when present with another type.
absl::StatusOr<bool> OptBool(const Json& j, const char* key, bool def, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  if (!it->is_boolean()) return absl::InvalidArgumentError(absl::StrCat(where, ": '", key, "' is not a boolean"));
  return it->get<bool>();
}

std::string TypeOf(const Json& j) {
  auto it = j.find("type");
  return (it != j.end() && it->is_string()) ? it->get<std::string>() : "";
}

// The pieces a split step keeps of `parts` (matches and the text between them), by its behavior.
void KeepPieces(Behavior behavior, const std::vector<Piece>& parts, std::vector<Piece>* kept) {
  kept->clear();
  switch (behavior) {
    case Behavior::kRemoved:
      for (const Piece& x : parts) {
        if (!x.match) kept->push_back(x);
      }
      break;
    case Behavior::kIsolated:
      *kept = parts;
      break;
    case Behavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const Piece& x : parts) {
        if (x.match && !previous_match && !kept->empty()) {
          kept->back().end = x.end;
        } else {
          kept->push_back(x);
        }
        previous_match = x.match;
      }
      break;
    }
    case Behavior::kMergedWithNext: {
      bool previous_match = false;
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->match && !previous_match && !kept->empty()) {
          kept->back().begin = it->begin;
        } else {
          kept->push_back(*it);
        }
        previous_match = it->match;
      }
      std::reverse(kept->begin(), kept->end());
      break;
    }
    case Behavior::kContiguous: {
      bool previous_match = false;
      for (const Piece& x : parts) {
        if (x.match == previous_match && !kept->empty()) {
          kept->back().end = x.end;
        } else {
          kept->push_back(x);
        }
        previous_match = x.match;
      }
      break;
    }
  }
}

}  // namespace

struct Tokenizer::Impl {
  std::string origin;

  // Model.
  absl::flat_hash_map<std::string, int32_t> vocab;
  std::vector<std::string> id_to_token;  // vocab string, or added-token content
  std::vector<bool> has_token;
  absl::flat_hash_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (left, right) -> (rank, new id)
  std::array<int32_t, 256> byte_id{};                                 // -1 when the byte's char is not in the vocab
  std::array<std::string, 256> byte_char{};                           // UTF-8 of the byte's printable char
  std::array<int16_t, 324> char_byte{};                               // code point -> byte, -1 if none
  std::optional<int32_t> unk_id;
  bool fuse_unk = false;
  bool ignore_merges = false;
  // Symbols: mapped bytes (the ByteLevel pre-tokenizer), else the text's characters, with
  // unknown ones spelled as <0xXX> byte tokens (byte_fallback, SentencePiece-style BPE).
  bool byte_level = false;
  bool byte_fallback = false;
  std::array<int32_t, 256> fallback_id{};  // <0xXX>'s id, -1 when absent

  // Added tokens.
  std::vector<AddedToken> added;
  absl::flat_hash_map<std::string, int32_t> added_by_content;
  std::vector<bool> is_special;
  // Candidates by first byte, longest first; [0] matches raw text, [1] normalized text.
  std::array<std::array<std::vector<const AddedToken*>, 256>, 2> matchers;

  // The normalizers in order: NFC, Replace (a literal string), Prepend.
  struct NormStep {
    enum class Kind { kNfc, kReplace, kPrepend } kind;
    std::string from, to;
  };
  std::vector<NormStep> normalizers;
  std::vector<PreTokStep> steps;
  // Decoding without ByteLevel: each token's Replace steps, runs of <0xXX> tokens as bytes
  // (ByteFallback), the tokens joined (Fuse), then `strip_start` leading `strip` strings removed.
  std::vector<std::pair<std::string, std::string>> decode_replace;
  bool decode_byte_fallback = false;
  std::string strip;
  int64_t strip_start = 0;
  std::vector<int32_t> template_prefix, template_suffix;

  std::optional<int32_t> bos, eos, pad;
  std::string chat_template;

  mutable absl::Mutex cache_mu;
  mutable absl::flat_hash_map<std::string, std::vector<int32_t>> cache ABSL_GUARDED_BY(cache_mu);

  absl::Status Load(const Json& j);
  absl::Status LoadModel(const Json& m);
  absl::Status LoadVocab(const Json& m, const std::string& where);
  absl::Status LoadMerges(const Json& m, const std::string& where);
  absl::Status LoadNormalizer(const Json& n);
  absl::Status LoadPreTokenizer(const Json& p, bool* byte_level);
  absl::Status LoadPostProcessor(const Json& p);
  absl::Status LoadDecoder(const Json& d);
  absl::Status LoadAddedTokens(const Json& a);
  std::string Normalize(std::string_view text) const;
  std::string DecodeText(const std::vector<const std::string*>& tokens) const;

  struct Segment {
    std::string_view text;
    int32_t id;  // -1 for text
  };
  void SplitAdded(int which, std::string_view s, std::vector<Segment>* out) const;
  absl::Status EncodeValid(std::string_view text, bool add_special, std::vector<int32_t>* ids) const;
  absl::Status EncodeSegment(std::string_view text, const MatchScratch& scratch, std::vector<int32_t>* ids) const;
  void Bpe(std::string_view word, std::vector<int32_t>* ids) const;
  void BpeUncached(std::string_view word, std::vector<int32_t>* ids) const;
  // The ids BPE starts from: a byte-level symbol a byte, else one a character (<0xXX> byte
  // tokens for a character not in the vocab, with byte_fallback); unk where HF puts it.
  std::vector<int32_t> InitialSymbols(std::string_view word) const;
};

// ---------------------------------------------------------------------------------------------
// Loading

absl::Status Tokenizer::Impl::Load(const Json& j) {
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(origin, ": not a JSON object"));
  auto m = j.find("model");
  if (m == j.end() || !m->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": missing or non-object 'model'"));
  }
  OOMB_RETURN_IF_ERROR(LoadModel(*m));
  if (auto a = j.find("added_tokens"); a != j.end() && !a->is_null()) OOMB_RETURN_IF_ERROR(LoadAddedTokens(*a));
  if (auto n = j.find("normalizer"); n != j.end() && !n->is_null()) OOMB_RETURN_IF_ERROR(LoadNormalizer(*n));
  bool byte_level = false;
  if (auto p = j.find("pre_tokenizer"); p != j.end() && !p->is_null()) {
    OOMB_RETURN_IF_ERROR(LoadPreTokenizer(*p, &byte_level));
  }
  this->byte_level = byte_level;
  if (!byte_level && !byte_fallback) {
    return absl::UnimplementedError(
        absl::StrCat(origin, ": pre_tokenizer has no ByteLevel step; only byte-level BPE tokenizers are supported"));
  }
  if (auto p = j.find("post_processor"); p != j.end() && !p->is_null()) OOMB_RETURN_IF_ERROR(LoadPostProcessor(*p));
  auto d = j.find("decoder");
  if (d == j.end() || d->is_null()) {
    return absl::UnimplementedError(absl::StrCat(origin, ": no decoder; only the ByteLevel decoder is supported"));
  }
  return LoadDecoder(*d);
}

absl::Status Tokenizer::Impl::LoadModel(const Json& m) {
  const std::string where = absl::StrCat(origin, ": model");
  const std::string type = TypeOf(m);
  if (type != "BPE") {
    return absl::UnimplementedError(
        absl::StrCat(where, ": type '", type.empty() ? "<missing>" : type, "' is not supported (only byte-level BPE)"));
  }
  if (auto d = m.find("dropout"); d != m.end() && !d->is_null() && !(d->is_number() && d->get<double>() == 0.0)) {
    return absl::UnimplementedError(absl::StrCat(where, ": BPE dropout is not supported"));
  }
  OOMB_ASSIGN_OR_RETURN(byte_fallback, OptBool(m, "byte_fallback", false, where));
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = m.find(key);
    if (it != m.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty())) {
      return absl::UnimplementedError(absl::StrCat(where, ": '", key, "' is not supported"));
    }
  }
  OOMB_ASSIGN_OR_RETURN(fuse_unk, OptBool(m, "fuse_unk", false, where));
  OOMB_ASSIGN_OR_RETURN(ignore_merges, OptBool(m, "ignore_merges", false, where));

  OOMB_RETURN_IF_ERROR(LoadVocab(m, where));
  OOMB_RETURN_IF_ERROR(LoadMerges(m, where));

  if (auto u = m.find("unk_token"); u != m.end() && !u->is_null()) {
    if (!u->is_string()) return absl::InvalidArgumentError(absl::StrCat(where, ": 'unk_token' is not a string"));
    auto it = vocab.find(u->get<std::string>());
    if (it == vocab.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": unk_token '", u->get<std::string>(), "' is not in the vocab"));
    }
    unk_id = it->second;
  }

  const auto table = BytesToUnicode();
  char_byte.fill(-1);
  for (int b = 0; b < 256; ++b) {
    AppendUtf8(table[b], &byte_char[b]);
    char_byte[table[b]] = static_cast<int16_t>(b);
    auto it = vocab.find(byte_char[b]);
    byte_id[b] = it == vocab.end() ? -1 : it->second;
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto fb = vocab.find(name);
    fallback_id[b] = fb == vocab.end() ? -1 : fb->second;
  }
  return absl::OkStatus();
}

absl::Status Tokenizer::Impl::LoadVocab(const Json& m, const std::string& where) {
  auto v = m.find("vocab");
  if (v == m.end() || !v->is_object()) return absl::InvalidArgumentError(absl::StrCat(where, ": missing 'vocab'"));
  vocab.reserve(v->size());
  int32_t max_id = -1;
  for (auto it = v->begin(); it != v->end(); ++it) {
    if (!it.value().is_number_unsigned() || it.value().get<uint64_t>() > (1u << 30)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": vocab entry '", it.key(), "' has no valid id"));
    }
    const auto id = static_cast<int32_t>(it.value().get<uint64_t>());
    vocab[it.key()] = id;
    max_id = std::max(max_id, id);
  }
  id_to_token.assign(max_id + 1, "");
  has_token.assign(max_id + 1, false);
  for (const auto& [tok, id] : vocab) {
    id_to_token[id] = tok;
    has_token[id] = true;
  }
  return absl::OkStatus();
}

// Merges as "a b" strings or [a, b] pairs; every token and every product must be in the vocab.
absl::Status Tokenizer::Impl::LoadMerges(const Json& m, const std::string& where) {
  auto mg = m.find("merges");
  if (mg == m.end() || !mg->is_array()) return absl::InvalidArgumentError(absl::StrCat(where, ": missing 'merges'"));
  merges.reserve(mg->size());
  int32_t rank = 0;
  for (const Json& e : *mg) {
    std::string a, b;
    if (e.is_string()) {
      const std::string line = e.get<std::string>();
      const size_t sp = line.find(' ');
      if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": merge #", rank, " '", line, "' is not two tokens separated by one space"));
      }
      a = line.substr(0, sp);
      b = line.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      return absl::InvalidArgumentError(absl::StrCat(where, ": merge #", rank, " is neither \"a b\" nor [a, b]"));
    }
    const auto ia = vocab.find(a), ib = vocab.find(b), iab = vocab.find(a + b);
    for (const auto& [tok, it] : {std::pair{&a, ia}, std::pair{&b, ib}}) {
      if (it == vocab.end()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": merge #", rank, " '", a, " ", b, "' uses token '",
                                                       *tok, "', which is not in the vocab"));
      }
    }
    if (iab == vocab.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": merge #", rank, " '", a, " ", b, "' makes '", a + b, "', which is not in the vocab"));
    }
    const uint64_t key = (static_cast<uint64_t>(ia->second) << 32) | static_cast<uint32_t>(ib->second);
    merges[key] = {rank, iab->second};  // a repeated merge keeps its last rank, as in HF
    ++rank;
  }
  return absl::OkStatus();
}

absl::Status Tokenizer::Impl::LoadAddedTokens(const Json& a) {
  const std::string where = absl::StrCat(origin, ": added_tokens");
  if (!a.is_array()) return absl::InvalidArgumentError(absl::StrCat(where, " is not an array"));
  for (const Json& e : a) {
    if (!e.is_object() || !e.contains("id") || !e["id"].is_number_unsigned() || !e.contains("content") ||
        !e["content"].is_string() || e["content"].get<std::string>().empty() || e["id"].get<uint64_t>() > (1u << 30)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": entry ", e.dump(), " needs an 'id' and a 'content'"));
    }
    AddedToken t;
    t.id = static_cast<int32_t>(e["id"].get<uint64_t>());
    t.content = e["content"].get<std::string>();
    if (!IsValidUtf8(t.content)) return absl::InvalidArgumentError(absl::StrCat(where, ": content is not UTF-8"));
    OOMB_ASSIGN_OR_RETURN(t.single_word, OptBool(e, "single_word", false, where));
    OOMB_ASSIGN_OR_RETURN(t.lstrip, OptBool(e, "lstrip", false, where));
    OOMB_ASSIGN_OR_RETURN(t.rstrip, OptBool(e, "rstrip", false, where));
    OOMB_ASSIGN_OR_RETURN(t.normalized, OptBool(e, "normalized", false, where));
    OOMB_ASSIGN_OR_RETURN(t.special, OptBool(e, "special", false, where));
    added.push_back(std::move(t));
  }
  for (const AddedToken& t : added) {
    added_by_content[t.content] = t.id;
    if (static_cast<size_t>(t.id) >= id_to_token.size()) {
      id_to_token.resize(t.id + 1);
      has_token.resize(t.id + 1, false);
    }
    id_to_token[t.id] = t.content;
    has_token[t.id] = true;
  }
  is_special.assign(id_to_token.size(), false);
  for (const AddedToken& t : added) is_special[t.id] = t.special;
  return absl::OkStatus();
}

absl::Status Tokenizer::Impl::LoadNormalizer(const Json& n) {
  const std::string type = TypeOf(n);
  if (type == "NFC") {
    normalizers.push_back({NormStep::Kind::kNfc, "", ""});
    return absl::OkStatus();
  }
  if (type == "Replace" && n.contains("pattern") && n["pattern"].is_object() && n["pattern"].contains("String") &&
      n["pattern"]["String"].is_string() && n.contains("content") && n["content"].is_string() &&
      !n["pattern"]["String"].get<std::string>().empty()) {
    normalizers.push_back({NormStep::Kind::kReplace, n["pattern"]["String"], n["content"]});
    return absl::OkStatus();
  }
  if (type == "Prepend" && n.contains("prepend") && n["prepend"].is_string()) {
    normalizers.push_back({NormStep::Kind::kPrepend, "", n["prepend"]});
    return absl::OkStatus();
  }
  if (type == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array()) {
    for (const Json& s : n["normalizers"]) OOMB_RETURN_IF_ERROR(LoadNormalizer(s));
    return absl::OkStatus();
  }
  return absl::UnimplementedError(absl::StrCat(
      origin, ": normalizer '", type, "' is not supported (only NFC, Replace of a string, Prepend and Sequence)"));
}

std::string Tokenizer::Impl::Normalize(std::string_view text) const {
  std::string out(text);
  for (const NormStep& n : normalizers) {
    switch (n.kind) {
      case NormStep::Kind::kNfc:
        out = NfcNormalize(out);
        break;
      case NormStep::Kind::kReplace:
        out = absl::StrReplaceAll(out, {{n.from, n.to}});
        break;
      case NormStep::Kind::kPrepend:
        if (!out.empty()) out = n.to + out;
        break;
    }
  }
  return out;
}

absl::Status Tokenizer::Impl::LoadPreTokenizer(const Json& p, bool* byte_level) {
  const std::string type = TypeOf(p);
  const std::string where = absl::StrCat(origin, ": pre_tokenizer ", type);
  if (type == "Sequence") {
    auto it = p.find("pretokenizers");
    if (it == p.end() || !it->is_array()) return absl::InvalidArgumentError(where + ": missing 'pretokenizers'");
    for (const Json& s : *it) OOMB_RETURN_IF_ERROR(LoadPreTokenizer(s, byte_level));
    return absl::OkStatus();
  }
  if (*byte_level) {
    return absl::UnimplementedError(
        absl::StrCat(where, ": pre-tokenizers after ByteLevel are not supported (they would see mapped bytes)"));
  }
  PreTokStep step;
  if (type == "Split") {
    auto pat = p.find("pattern");
    if (pat == p.end() || !pat->is_object()) return absl::InvalidArgumentError(where + ": missing 'pattern'");
    bool literal;
    std::string text;
    if (pat->contains("Regex") && (*pat)["Regex"].is_string()) {
      literal = false;
      text = (*pat)["Regex"].get<std::string>();
    } else if (pat->contains("String") && (*pat)["String"].is_string()) {
      literal = true;
      text = (*pat)["String"].get<std::string>();
    } else {
      return absl::InvalidArgumentError(where + ": 'pattern' needs 'Regex' or 'String'");
    }
    auto re = Regex::Compile(text, literal);
    if (!re.ok()) return Annotate(re.status(), where);
    step.regex = *re;
    auto beh = p.find("behavior");
    if (beh == p.end() || !beh->is_string()) return absl::InvalidArgumentError(where + ": missing 'behavior'");
    auto b = ParseBehavior(beh->get<std::string>());
    if (!b.ok()) return Annotate(b.status(), where);
    step.behavior = *b;
    OOMB_ASSIGN_OR_RETURN(step.invert, OptBool(p, "invert", false, where));
    steps.push_back(std::move(step));
    return absl::OkStatus();
  }
  if (type == "Digits") {
    OOMB_ASSIGN_OR_RETURN(bool individual, OptBool(p, "individual_digits", false, where));
    OOMB_ASSIGN_OR_RETURN(step.regex, Regex::Compile(R"(\p{N})", false));
    step.behavior = individual ? Behavior::kIsolated : Behavior::kContiguous;
    steps.push_back(std::move(step));
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    OOMB_ASSIGN_OR_RETURN(bool prefix, OptBool(p, "add_prefix_space", true, where));
    OOMB_ASSIGN_OR_RETURN(bool use_regex, OptBool(p, "use_regex", true, where));
    if (prefix) {
      PreTokStep s;
      s.kind = PreTokStep::Kind::kPrefixSpace;
      steps.push_back(s);
    }
    if (use_regex) {
      OOMB_ASSIGN_OR_RETURN(step.regex, Regex::Compile(kGpt2Pattern, false));
      step.behavior = Behavior::kIsolated;
      steps.push_back(std::move(step));
    }
    *byte_level = true;
    return absl::OkStatus();
  }
  return absl::UnimplementedError(
      absl::StrCat(origin, ": pre_tokenizer '", type, "' is not supported (only Sequence, Split, Digits, ByteLevel)"));
}

absl::Status Tokenizer::Impl::LoadPostProcessor(const Json& p) {
  const std::string type = TypeOf(p);
  const std::string where = absl::StrCat(origin, ": post_processor ", type);
  if (type == "ByteLevel") return absl::OkStatus();  // only adjusts offsets
  if (type == "Sequence") {
    auto it = p.find("processors");
    if (it == p.end() || !it->is_array()) return absl::InvalidArgumentError(where + ": missing 'processors'");
    for (const Json& s : *it) OOMB_RETURN_IF_ERROR(LoadPostProcessor(s));
    return absl::OkStatus();
  }
  if (type != "TemplateProcessing") {
    return absl::UnimplementedError(absl::StrCat(origin, ": post_processor '", type,
                                                 "' is not supported (only TemplateProcessing, ByteLevel, Sequence)"));
  }
  auto single = p.find("single");
  auto specials = p.find("special_tokens");
  if (single == p.end() || !single->is_array() || (specials != p.end() && !specials->is_object())) {
    return absl::InvalidArgumentError(where + ": needs a 'single' array and a 'special_tokens' object");
  }
  std::vector<int32_t> prefix, suffix;
  bool seen_a = false;
  for (const Json& item : *single) {
    if (item.contains("Sequence")) {
      const Json& s = item["Sequence"];
      if (!s.is_object() || s.value("id", "") != "A" || seen_a) {
        return absl::InvalidArgumentError(where + ": 'single' must hold sequence A exactly once");
      }
      seen_a = true;
    } else if (item.contains("SpecialToken") && item["SpecialToken"].is_object() &&
               item["SpecialToken"].contains("id") && item["SpecialToken"]["id"].is_string()) {
      const std::string name = item["SpecialToken"]["id"].get<std::string>();
      if (specials == p.end() || !specials->contains(name) || !(*specials)[name].contains("ids") ||
          !(*specials)[name]["ids"].is_array()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": special token '", name, "' has no ids"));
      }
      for (const Json& id : (*specials)[name]["ids"]) {
        if (!id.is_number_unsigned() || id.get<uint64_t>() >= has_token.size() || !has_token[id.get<uint64_t>()]) {
          return absl::InvalidArgumentError(absl::StrCat(where, ": special token '", name, "' has an unknown id"));
        }
        (seen_a ? suffix : prefix).push_back(static_cast<int32_t>(id.get<uint64_t>()));
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat(where, ": bad template item ", item.dump()));
    }
  }
  if (!seen_a) return absl::InvalidArgumentError(where + ": 'single' lacks sequence A");
  template_prefix.insert(template_prefix.end(), prefix.begin(), prefix.end());
  template_suffix.insert(template_suffix.end(), suffix.begin(), suffix.end());
  return absl::OkStatus();
}

absl::Status Tokenizer::Impl::LoadDecoder(const Json& d) {
  const std::string type = TypeOf(d);
  if (type == "ByteLevel" && byte_level) return absl::OkStatus();
  if (type == "Sequence" && d.contains("decoders") && d["decoders"].is_array()) {
    for (const Json& s : d["decoders"]) OOMB_RETURN_IF_ERROR(LoadDecoder(s));
    return absl::OkStatus();
  }
  if (!byte_level && strip_start == 0) {  // SentencePiece-style: Replace, ByteFallback, Fuse, Strip
    if (type == "Replace" && d.contains("pattern") && d["pattern"].is_object() && d["pattern"].contains("String") &&
        d["pattern"]["String"].is_string() && d.contains("content") && d["content"].is_string()) {
      decode_replace.emplace_back(d["pattern"]["String"], d["content"]);
      return absl::OkStatus();
    }
    if (type == "ByteFallback") {
      decode_byte_fallback = true;
      return absl::OkStatus();
    }
    if (type == "Fuse") return absl::OkStatus();  // Decode joins the tokens anyway
    if (type == "Strip" && d.value("stop", 0) == 0 && d.contains("content") && d["content"].is_string()) {
      strip = d["content"];
      strip_start = d.value("start", 0);
      return absl::OkStatus();
    }
  }
  return absl::UnimplementedError(absl::StrCat(origin, ": decoder '", type,
                                               "' is not supported (ByteLevel for byte-level BPE; Replace, "
                                               "ByteFallback, Fuse and a final Strip for byte_fallback BPE)"));
}

// ---------------------------------------------------------------------------------------------
// Encoding

void Tokenizer::Impl::SplitAdded(int which, std::string_view s, std::vector<Segment>* out) const {
  const auto& cands = matchers[which];
  size_t start_offset = 0;
  size_t i = 0;
  while (i < s.size()) {
    const auto& c = cands[static_cast<unsigned char>(s[i])];
    const AddedToken* hit = nullptr;
    for (const AddedToken* t : c) {
      if (s.compare(i, t->content.size(), t->content) == 0) {
        hit = t;
        break;
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    size_t start = i, stop = i + hit->content.size();
    i = stop;  // the next search starts after this match, whether it is kept or not
    if (hit->single_word) {
      const bool start_space = start == 0 || !IsWordChar(LastCodePoint(s.substr(0, start)));
      size_t p = stop;
      const bool stop_space = stop == s.size() || !IsWordChar(NextCodePoint(s, &p));
      if (!start_space || !stop_space) continue;
    }
    if (hit->lstrip) {
      size_t new_start = start;
      while (new_start > start_offset) {
        size_t q = new_start - 1;
        while (q > 0 && (static_cast<unsigned char>(s[q]) & 0xC0) == 0x80) --q;
        size_t r = q;
        if (!IsUnicodeWhitespace(NextCodePoint(s, &r))) break;
        new_start = q;
      }
      start = new_start;
    }
    if (hit->rstrip) {
      while (stop < s.size()) {
        size_t r = stop;
        if (!IsUnicodeWhitespace(NextCodePoint(s, &r))) break;
        stop = r;
      }
      i = stop;
    }
    if (start_offset < start) out->push_back({s.substr(start_offset, start - start_offset), -1});
    out->push_back({s.substr(start, stop - start), hit->id});
    start_offset = stop;
  }
  if (start_offset < s.size()) out->push_back({s.substr(start_offset), -1});
}

absl::Status Tokenizer::Impl::EncodeValid(std::string_view text, bool add_special, std::vector<int32_t>* ids) const {
  MatchScratch scratch;
  if (add_special) ids->insert(ids->end(), template_prefix.begin(), template_prefix.end());
  std::vector<Segment> raw;
  SplitAdded(0, text, &raw);
  std::vector<Segment> norm_segs;
  for (const Segment& seg : raw) {
    if (seg.id >= 0) {
      ids->push_back(seg.id);
      continue;
    }
    const std::string normalized = normalizers.empty() ? std::string() : Normalize(seg.text);
    const std::string_view n = normalizers.empty() ? seg.text : std::string_view(normalized);
    norm_segs.clear();
    SplitAdded(1, n, &norm_segs);
    for (const Segment& s2 : norm_segs) {
      if (s2.id >= 0) {
        ids->push_back(s2.id);
      } else {
        OOMB_RETURN_IF_ERROR(EncodeSegment(s2.text, scratch, ids));
      }
    }
  }
  if (add_special) ids->insert(ids->end(), template_suffix.begin(), template_suffix.end());
  return absl::OkStatus();
}

absl::Status Tokenizer::Impl::EncodeSegment(std::string_view text, const MatchScratch& scratch,
                                            std::vector<int32_t>* ids) const {
  // Pieces are owned strings only when a prefix space was added; otherwise views into `text`.
  std::deque<std::string> owned;  // a deque: views into earlier elements survive push_back
  std::vector<std::string_view> cur{text}, next;
  std::vector<std::pair<size_t, size_t>> matches;
  std::vector<Piece> parts, kept;
  for (const PreTokStep& step : steps) {
    next.clear();
    if (step.kind == PreTokStep::Kind::kPrefixSpace) {
      for (std::string_view p : cur) {
        if (!p.empty() && p[0] == ' ') {
          next.push_back(p);
        } else {
          owned.push_back(absl::StrCat(" ", std::string(p)));
          next.push_back(owned.back());
        }
      }
      cur.swap(next);
      continue;
    }
    for (std::string_view p : cur) {
      if (p.empty()) continue;
      matches.clear();
      OOMB_RETURN_IF_ERROR(step.regex->FindAll(p, scratch, &matches));
      parts.clear();
      size_t prev = 0;
      for (const auto& [b, e] : matches) {
        if (prev != b) parts.push_back({prev, b, false});
        parts.push_back({b, e, true});
        prev = e;
      }
      if (prev != p.size()) parts.push_back({prev, p.size(), false});
      if (step.invert) {
        for (Piece& x : parts) x.match = !x.match;
      }
      KeepPieces(step.behavior, parts, &kept);
      for (const Piece& x : kept) {
        if (x.end > x.begin) next.push_back(p.substr(x.begin, x.end - x.begin));
      }
    }
    cur.swap(next);
  }
  for (std::string_view word : cur) {
    if (!word.empty()) Bpe(word, ids);
  }
  return absl::OkStatus();
}

void Tokenizer::Impl::Bpe(std::string_view word, std::vector<int32_t>* ids) const {
  if (byte_level && word.size() == 1 && byte_id[static_cast<unsigned char>(word[0])] >= 0) {
    ids->push_back(byte_id[static_cast<unsigned char>(word[0])]);
    return;
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    absl::ReaderMutexLock lock(&cache_mu);
    auto it = cache.find(absl::string_view(word.data(), word.size()));
    if (it != cache.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t before = ids->size();
  BpeUncached(word, ids);
  if (cacheable) {
    absl::MutexLock lock(&cache_mu);
    if (cache.size() < kMaxCacheEntries)
      cache.emplace(std::string(word), std::vector<int32_t>(ids->begin() + before, ids->end()));
  }
}

std::vector<int32_t> Tokenizer::Impl::InitialSymbols(std::string_view word) const {
  std::vector<int32_t> sym;
  sym.reserve(word.size());
  const auto unknown = [&] {
    if (!unk_id) return;  // HF drops characters it cannot represent when there is no unk
    if (fuse_unk && !sym.empty() && sym.back() == *unk_id) return;
    sym.push_back(*unk_id);
  };
  for (size_t p = 0; p < word.size();) {
    if (byte_level) {
      const int32_t id = byte_id[static_cast<unsigned char>(word[p++])];
      id < 0 ? unknown() : sym.push_back(id);
      continue;
    }
    const size_t begin = p;
    NextCodePoint(word, &p);
    const std::string_view ch = word.substr(begin, p - begin);
    if (auto it = vocab.find(absl::string_view(ch.data(), ch.size())); it != vocab.end()) {
      sym.push_back(it->second);
      continue;
    }
    // byte_fallback: the character's UTF-8 bytes as <0xXX> tokens, when all of them exist.
    const bool spelled = byte_fallback && std::all_of(ch.begin(), ch.end(), [&](char c) {
                           return fallback_id[static_cast<unsigned char>(c)] >= 0;
                         });
    if (!spelled) {
      unknown();
      continue;
    }
    for (char c : ch) sym.push_back(fallback_id[static_cast<unsigned char>(c)]);
  }
  return sym;
}

void Tokenizer::Impl::BpeUncached(std::string_view word, std::vector<int32_t>* ids) const {
  if (ignore_merges) {
    std::string mapped;
    for (char c : word) mapped += byte_level ? byte_char[static_cast<unsigned char>(c)] : std::string(1, c);
    if (auto it = vocab.find(mapped); it != vocab.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    bool alive;
  };
  std::vector<Symbol> sym;
  for (const int32_t id : InitialSymbols(word)) sym.push_back({id, 0, 0, true});
  const int32_t n = static_cast<int32_t>(sym.size());
  for (int32_t i = 0; i < n; ++i) {
    sym[i].prev = i - 1;
    sym[i].next = i + 1 < n ? i + 1 : -1;
  }
  // HF's merge loop: a min-heap of (rank, position); stale entries are skipped when popped.
  struct Merge {
    int32_t rank, pos, new_id;
  };
  const auto worse = [](const Merge& a, const Merge& b) { return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos; };
  const auto lookup = [this](int32_t a, int32_t b) -> const std::pair<int32_t, int32_t>* {
    auto it = merges.find((static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b));
    return it == merges.end() ? nullptr : &it->second;
  };
  std::vector<Merge> heap;
  for (int32_t i = 0; i + 1 < n; ++i) {
    if (const auto* m = lookup(sym[i].id, sym[i + 1].id)) heap.push_back({m->first, i, m->second});
  }
  std::make_heap(heap.begin(), heap.end(), worse);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), worse);
    const Merge top = heap.back();
    heap.pop_back();
    Symbol& cur = sym[top.pos];
    if (!cur.alive || cur.next < 0) continue;
    const int32_t right = cur.next;
    const auto* m = lookup(cur.id, sym[right].id);
    if (m == nullptr || m->second != top.new_id) continue;
    cur.id = top.new_id;
    sym[right].alive = false;
    cur.next = sym[right].next;
    if (cur.next >= 0) sym[cur.next].prev = top.pos;
    if (cur.prev >= 0) {
      if (const auto* pm = lookup(sym[cur.prev].id, cur.id)) {
        heap.push_back({pm->first, cur.prev, pm->second});
        std::push_heap(heap.begin(), heap.end(), worse);
      }
    }
    if (cur.next >= 0) {
      if (const auto* nm = lookup(cur.id, sym[cur.next].id)) {
        heap.push_back({nm->first, top.pos, nm->second});
        std::push_heap(heap.begin(), heap.end(), worse);
      }
    }
  }
  for (const Symbol& s : sym) {
    if (s.alive) ids->push_back(s.id);
  }
}

// ---------------------------------------------------------------------------------------------
// Tokenizer

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(std::string_view json, const std::string& origin) {
  Json j = Json::parse(json.begin(), json.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(origin, ": not valid JSON"));
  auto impl = std::make_unique<Impl>();
  impl->origin = origin;
  try {
    OOMB_RETURN_IF_ERROR(impl->Load(j));
  } catch (const nlohmann::json::exception& e) {
    // A field of an unexpected type that the checks above did not anticipate.
    return absl::InvalidArgumentError(absl::StrCat(origin, ": unexpected JSON structure: ", e.what()));
  }
  impl->is_special.resize(impl->has_token.size(), false);
  for (const AddedToken& t : impl->added) {
    const int which = t.normalized ? 1 : 0;
    const std::string content = t.normalized ? impl->Normalize(t.content) : t.content;
    if (content != t.content) continue;  // keeps matching simple; no supported tokenizer has such tokens
    impl->matchers[which][static_cast<unsigned char>(t.content[0])].push_back(&t);
  }
  for (auto& per_kind : impl->matchers) {
    for (auto& v : per_kind) {
      std::stable_sort(v.begin(), v.end(),
                       [](const AddedToken* a, const AddedToken* b) { return a->content.size() > b->content.size(); });
    }
  }
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromModelDir(const Dir& dir) {
  OOMB_ASSIGN_OR_RETURN(std::string json, dir.ReadFile("tokenizer.json"));
  OOMB_ASSIGN_OR_RETURN(auto tok, FromJson(json, dir.PathOf("tokenizer.json")));
  Impl& impl = *tok->impl_;
  const std::string config_path = dir.PathOf("tokenizer_config.json");
  if (dir.Contains("tokenizer_config.json")) {
    OOMB_ASSIGN_OR_RETURN(std::string text, dir.ReadFile("tokenizer_config.json"));
    Json c = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (c.is_discarded() || !c.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(config_path, ": not a JSON object"));
    }
    for (auto [key, slot] :
         {std::pair{"bos_token", &impl.bos}, std::pair{"eos_token", &impl.eos}, std::pair{"pad_token", &impl.pad}}) {
      auto it = c.find(key);
      if (it == c.end() || it->is_null()) continue;
      std::string content;
      if (it->is_string()) {
        content = it->get<std::string>();
      } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
        content = (*it)["content"].get<std::string>();
      } else {
        return absl::InvalidArgumentError(absl::StrCat(config_path, ": '", key, "' is neither a string nor a token"));
      }
      *slot = tok->TokenId(content);
      if (!*slot) {
        return absl::InvalidArgumentError(
            absl::StrCat(config_path, ": ", key, " '", content, "' is not a token of tokenizer.json"));
      }
    }
    if (auto it = c.find("chat_template"); it != c.end()) {
      if (it->is_string()) {
        impl.chat_template = it->get<std::string>();
      } else if (it->is_array()) {  // [{"name": "default", "template": ...}, ...]
        for (const Json& e : *it) {
          if (e.is_object() && e.value("name", "") == "default" && e.contains("template") &&
              e["template"].is_string()) {
            impl.chat_template = e["template"].get<std::string>();
          }
        }
      }
    }
  }
  if (impl.chat_template.empty() && dir.Contains("chat_template.jinja")) {
    OOMB_ASSIGN_OR_RETURN(impl.chat_template, dir.ReadFile("chat_template.jinja"));
  }
  return tok;
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::EncodeChecked(std::string_view text, bool add_special_tokens) const {
  size_t bad = 0;
  if (!IsValidUtf8(text, &bad)) {
    return absl::InvalidArgumentError(
        absl::StrCat("text is not valid UTF-8 (ill-formed byte sequence at offset ", bad, ")"));
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);
  OOMB_RETURN_IF_ERROR(impl_->EncodeValid(text, add_special_tokens, &ids));
  return ids;
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  std::string repaired;
  if (!IsValidUtf8(text)) {
    repaired = RepairUtf8(text);
    text = repaired;
  }
  auto ids = EncodeChecked(text, add_special_tokens);
  if (!ids.ok()) {
    spdlog::error("tokenizer {}: {}", impl_->origin, std::string(ids.status().message()));
    return {};
  }
  return *std::move(ids);
}

// HF's decoders for byte_fallback BPE over the tokens' strings: a run of <0xXX> tokens becomes
// its bytes (one U+FFFD a byte when they are not UTF-8), every other token goes through the
// Replace steps, and Strip removes leading copies of its content from the joined text.
std::string Tokenizer::Impl::DecodeText(const std::vector<const std::string*>& tokens) const {
  std::string out, run;
  const auto flush = [&] {
    if (run.empty()) return;
    if (IsValidUtf8(run)) {
      out += run;
    } else {
      for (size_t i = 0; i < run.size(); ++i) out += "\xEF\xBF\xBD";
    }
    run.clear();
  };
  for (const std::string* tok : tokens) {
    unsigned byte = 0;
    if (decode_byte_fallback && tok->size() == 6 && absl::StartsWith(*tok, "<0x") && tok->back() == '>' &&
        std::sscanf(tok->c_str() + 3, "%2X", &byte) == 1) {
      run.push_back(static_cast<char>(byte));
      continue;
    }
    flush();
    std::string text = *tok;
    for (const auto& [from, to] : decode_replace) text = absl::StrReplaceAll(text, {{from, to}});
    out += text;
  }
  flush();
  for (int64_t i = 0; i < strip_start && !strip.empty() && absl::StartsWith(out, strip); ++i)
    out.erase(0, strip.size());
  return out;
}

absl::StatusOr<std::string> Tokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  const Impl& im = *impl_;
  std::string bytes;
  bytes.reserve(ids.size() * 4);
  std::vector<const std::string*> tokens;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || static_cast<size_t>(id) >= im.has_token.size() || !im.has_token[id]) {
      return absl::InvalidArgumentError(absl::StrCat("id ", id, " at position ", i, " is not in the vocabulary"));
    }
    if (skip_special_tokens && im.is_special[id]) continue;
    const std::string& tok = im.id_to_token[id];
    if (!im.byte_level) {
      tokens.push_back(&tok);
      continue;
    }
    // As HF's ByteLevel decoder: map every character back to its byte, or, if some character
    // is not a byte-level character (e.g. an added token's space), keep the token's UTF-8.
    const size_t mark = bytes.size();
    bool mapped = true;
    for (size_t p = 0; p < tok.size();) {
      const char32_t cp = NextCodePoint(tok, &p);
      if (cp >= im.char_byte.size() || im.char_byte[cp] < 0) {
        mapped = false;
        break;
      }
      bytes.push_back(static_cast<char>(im.char_byte[cp]));
    }
    if (!mapped) {
      bytes.resize(mark);
      bytes += tok;
    }
  }
  return im.byte_level ? RepairUtf8(bytes) : im.DecodeText(tokens);
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->has_token.size()); }

std::optional<int32_t> Tokenizer::TokenId(std::string_view token) const {
  const absl::string_view key(token.data(), token.size());
  if (auto it = impl_->added_by_content.find(key); it != impl_->added_by_content.end()) return it->second;
  if (auto it = impl_->vocab.find(key); it != impl_->vocab.end()) return it->second;
  return std::nullopt;
}

std::optional<std::string> Tokenizer::IdToToken(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->has_token.size() || !impl_->has_token[id]) return std::nullopt;
  return impl_->id_to_token[id];
}

std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }
std::optional<int32_t> Tokenizer::pad_id() const { return impl_->pad; }
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }
const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->is_special.size() && impl_->is_special[id];
}

std::vector<int32_t> Tokenizer::special_ids() const {
  std::vector<int32_t> out;
  for (const AddedToken& t : impl_->added) {
    if (t.special) out.push_back(t.id);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace oomb
