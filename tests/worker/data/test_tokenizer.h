// A hermetic byte-level BPE tokenizer for the data tests: token id = byte value (0..255), the
// ChatML markers <|im_start|> (256) and <|im_end|> (257) as special added tokens, and, with
// `newline_merge`, one merge "\n\n" -> 258, which makes a text's token count differ from the
// sum of its parts' counts when a cut falls inside a run of newlines. No gtest: the fuzz
// targets use it too. ByteTokenizerJson gives the file's text (the tiny models have none).
#ifndef OOMB_TESTS_WORKER_DATA_TEST_TOKENIZER_H_
#define OOMB_TESTS_WORKER_DATA_TEST_TOKENIZER_H_

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "worker/hf/tokenizer.h"

namespace oomb::testing {

inline constexpr int64_t kImStart = 256, kImEnd = 257;

// GPT-2's byte-to-unicode table: the vocab string of byte b.
inline std::string ByteToken(int b) {
  std::vector<int> bs;
  for (int c = '!'; c <= '~'; ++c) bs.push_back(c);
  for (int c = 0xA1; c <= 0xAC; ++c) bs.push_back(c);
  for (int c = 0xAE; c <= 0xFF; ++c) bs.push_back(c);
  int cp = -1, n = 0;
  for (int x = 0; x < 256; ++x) {
    const bool direct = std::find(bs.begin(), bs.end(), x) != bs.end();
    const int mapped = direct ? x : 256 + n++;
    if (x == b) cp = mapped;
  }
  std::string s;  // UTF-8 of cp (< 0x800)
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// The tokenizer.json text; `chatml` adds the two markers (ids 256 and 257).
inline std::string ByteTokenizerJson(bool newline_merge, bool chatml = true) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteToken(b)] = b;
  nlohmann::json merges = nlohmann::json::array();
  if (newline_merge) {
    vocab[ByteToken('\n') + ByteToken('\n')] = 258;
    merges.push_back(ByteToken('\n') + " " + ByteToken('\n'));
  }
  nlohmann::json j = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
                      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
                      {"decoder", {{"type", "ByteLevel"}}},
                      {"added_tokens", nlohmann::json::array()}};
  if (chatml) {
    j["added_tokens"] = {{{"id", kImStart}, {"content", "<|im_start|>"}, {"special", true}},
                         {{"id", kImEnd}, {"content", "<|im_end|>"}, {"special", true}}};
  }
  return j.dump();
}

inline std::unique_ptr<Tokenizer> MakeByteTokenizer(bool newline_merge) {
  auto t = Tokenizer::FromJson(ByteTokenizerJson(newline_merge), "byte_tokenizer.json");
  return t.ok() ? *std::move(t) : nullptr;  // callers check: null means the JSON above is wrong
}

}  // namespace oomb::testing

#endif  // OOMB_TESTS_WORKER_DATA_TEST_TOKENIZER_H_
