// A BPE tokenizer that reads Hugging Face `tokenizer.json` files and produces the same ids as
// the `tokenizers` library for the tokenizers of the model families oomb trains: byte-level BPE
// (GPT-2 style, Qwen2 / Qwen2.5 / Qwen3, Llama-3, SmolLM2) and SentencePiece-style BPE with
// byte fallback (Gemma 3, Llama-2 / Mistral layouts).
//
// Supported tokenizer.json content (anything else is rejected at load time with UNIMPLEMENTED
// naming the component, so a model never silently tokenizes differently from HF):
//   model          BPE with "vocab" and "merges" ("a b" strings or [a, b] pairs),
//                  "ignore_merges", "unk_token"/"fuse_unk", "byte_fallback" (a character not in
//                  the vocab becomes the <0xXX> tokens of its UTF-8 bytes); no dropout, no
//                  continuing_subword_prefix / end_of_word_suffix.
//   normalizer     null, NFC, Replace (of a literal string), Prepend, or a Sequence of those.
//   pre_tokenizer  Split (Regex or String pattern; behavior Removed, Isolated,
//                  MergedWithPrevious, MergedWithNext, Contiguous; invert), Digits
//                  (individual_digits), ByteLevel (add_prefix_space, use_regex with the GPT-2
//                  pattern), or a Sequence of those with ByteLevel last. Without ByteLevel the
//                  model must use byte_fallback; its symbols are then the text's characters.
//                  Regexes run on PCRE2 (UTF + UCP, JIT when available); \s and \S are
//                  rewritten to Unicode White_Space, which is what Oniguruma (used by
//                  `tokenizers`) matches.
//   added_tokens   matched leftmost-longest before pre-tokenization, honouring single_word,
//                  lstrip, rstrip and normalized (normalized tokens are matched after the
//                  normalizer, the others on the raw text).
//   post_processor null, ByteLevel, TemplateProcessing ("single" template only), or a Sequence.
//   decoder        ByteLevel (or a Sequence holding only ByteLevel) for byte-level BPE; for
//                  byte_fallback BPE a Sequence of Replace (a literal string), ByteFallback, Fuse
//                  and a final Strip (of leading content).
//
// Thread-safety: a Tokenizer is immutable after loading except for an internal word cache that
// is guarded by a mutex; Encode / Decode may be called from any number of threads.
#ifndef OOMB_WORKER_HF_TOKENIZER_H_
#define OOMB_WORKER_HF_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/common/file_access.h"

namespace oomb {

// One entry of tokenizer.json's "added_tokens".
struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool single_word = false;  // match only when not inside a word (\w on neither side)
  bool lstrip = false;       // the match swallows whitespace on its left
  bool rstrip = false;       // ... and on its right
  bool normalized = false;   // matched against normalized text instead of raw text
  bool special = false;      // dropped by Decode(..., skip_special_tokens = true)
};

class Tokenizer {
 public:
  // Loads a tokenizer.json. Errors name the file and the offending field:
  //   NOT_FOUND          the file does not exist;
  //   INVALID_ARGUMENT   invalid JSON, missing "model", malformed vocab / merges (a merge naming
  //                      a token that is not in the vocab, or whose result is not), bad regex;
  //   UNIMPLEMENTED      a model type other than BPE (e.g. "Unigram"), or a normalizer,
  //                      pre-tokenizer, post-processor or decoder outside the list above.
  // As FromFile, for JSON text already in memory; `origin` names it in error messages.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(std::string_view json, const std::string& origin);

  // Loads `dir`/tokenizer.json plus, when present, `dir`/tokenizer_config.json for the
  // bos / eos / pad tokens (strings or {"content": ...} objects; INVALID_ARGUMENT if one is not
  // a known token) and the chat template (its "chat_template" field, or `dir`/
  // chat_template.jinja).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromModelDir(const Dir& dir);

  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;
  ~Tokenizer();

  // Token ids of `text`, as `tokenizers`' encode(text, add_special_tokens).ids. With
  // `add_special_tokens`, the post-processor's template is applied (e.g. Llama-3 prepends
  // <|begin_of_text|>; SmolLM2 and Qwen2 add nothing). Ill-formed UTF-8 is first replaced with
  // U+FFFD (HF accepts only str); use EncodeChecked to reject it instead. Special tokens that
  // appear in `text` are recognised (like HF's default split_special_tokens=False). On an
  // internal regex-engine failure (resource limits on pathological input) this logs and
  // returns what EncodeChecked would have failed with as an empty vector.
  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens = false) const;

  // As Encode, but INVALID_ARGUMENT (with the byte offset) for ill-formed UTF-8 and
  // RESOURCE_EXHAUSTED if the regex engine hits its limits.
  absl::StatusOr<std::vector<int32_t>> EncodeChecked(std::string_view text, bool add_special_tokens = false) const;

  // Text of `ids` as `tokenizers`' decode: token strings are mapped back through the byte-level
  // table and the bytes are decoded as UTF-8, replacing ill-formed parts (e.g. a character cut
  // between two calls) with U+FFFD; for byte_fallback BPE, the decoders listed above. With `skip_special_tokens`, added
  // tokens marked special are dropped. INVALID_ARGUMENT naming the id and its position when an id is not in the
  // vocabulary (HF silently skips those).
  absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;

  // One more than the largest id of the vocabulary and the added tokens (HF's len(tokenizer)
  // when ids are dense).
  int32_t vocab_size() const;

  // The id of a token given by its string form (added-token content or byte-level vocab
  // string, e.g. "Ġthe"), or nullopt.
  std::optional<int32_t> TokenId(std::string_view token) const;

  // The string form of `id`, or nullopt when it is not in the vocabulary.
  std::optional<std::string> IdToToken(int32_t id) const;

  // From tokenizer_config.json (FromModelDir only); nullopt when absent or null.
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  std::optional<int32_t> pad_id() const;

  // The chat template's Jinja text from the model dir, or "" (see chat_template.h).
  const std::string& chat_template() const;

  const std::vector<AddedToken>& added_tokens() const;

  // True for ids of added tokens marked special.
  bool IsSpecial(int32_t id) const;

  // Ids of all added tokens marked special, sorted.
  std::vector<int32_t> special_ids() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace oomb

#endif  // OOMB_WORKER_HF_TOKENIZER_H_
