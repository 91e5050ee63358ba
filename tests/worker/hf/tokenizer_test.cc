#include "worker/hf/tokenizer.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/worker/test_env.h"
#include "tests/worker/test_files.h"
#include "worker/common/file_access.h"
#include "worker/hf/unicode.h"

namespace oomb {
namespace {

using ::testing::HasSubstr;

std::string SmolDir() { return testing::DataDir() + "/models/SmolLM2-135M-Instruct"; }

std::vector<nlohmann::json> ReadJsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

// ---- parity with HF tokenizers -----------------------------------------------------------

// Runs tests/python/tokenizer_reference.py once for the whole suite.
class TokenizerParityTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    const std::string py = testing::VenvPython();
    if (py.empty()) {
      skip_reason_ = new std::string("Python venv not found (set OOMB_VENV or run the setup script)");
      return;
    }
    if (!std::filesystem::exists(SmolDir())) {
      skip_reason_ = new std::string("test data not found at " + testing::DataDir() + " (scripts/fetch_test_data.sh)");
      return;
    }
    out_dir_ = new std::string(testing::ScratchDir("tokref"));
    const std::string cmd = py + " " + testing::SourceDir() + "/tests/python/tokenizer_reference.py --data-dir " +
                            testing::DataDir() + " --out-dir " + *out_dir_;
    if (testing::RunCommand(cmd) != 0) setup_error_ = new std::string("reference script failed: " + cmd);
  }
  void SetUp() override {
    if (skip_reason_ != nullptr) GTEST_SKIP() << *skip_reason_;
    ASSERT_EQ(setup_error_, nullptr) << *setup_error_;
    if (!std::filesystem::exists(TokenizerPath(GetParam()))) GTEST_SKIP() << "no " << TokenizerPath(GetParam());
  }
  std::string TokenizerPath(const std::string& name) const {
    if (name == "gemma3") return testing::DataDir() + "/models/gemma-3-270m/tokenizer.json";
    return name == "smollm2" ? SmolDir() + "/tokenizer.json" : *out_dir_ + "/" + name + "/tokenizer.json";
  }
  static inline std::string* out_dir_ = nullptr;
  static inline std::string* skip_reason_ = nullptr;
  static inline std::string* setup_error_ = nullptr;
};

TEST_P(TokenizerParityTest, ZeroMismatchesOnCorpus) {
  const std::string name = GetParam();
  auto tok = Tokenizer::FromJson(*FileAccess::Unconfined()->ReadFile(TokenizerPath(name)), TokenizerPath(name));
  ASSERT_TRUE(tok.ok()) << tok.status();
  const auto corpus = ReadJsonl(*out_dir_ + "/corpus.jsonl");
  const auto expected = ReadJsonl(*out_dir_ + "/" + name + ".expected.jsonl");
  ASSERT_EQ(corpus.size(), expected.size());
  ASSERT_GT(corpus.size(), 500u);
  int id_mismatches = 0, special_mismatches = 0, decode_mismatches = 0, roundtrip_mismatches = 0;
  size_t bytes = 0, tokens = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    const std::string text = corpus[i]["text"].get<std::string>();
    bytes += text.size();
    const auto want = expected[i]["ids"].get<std::vector<int32_t>>();
    const auto got = (*tok)->Encode(text);
    tokens += got.size();
    if (got != want && ++id_mismatches <= 5) {
      ADD_FAILURE() << name << " line " << i << " ids differ for text: " << nlohmann::json(text).dump() << "\n  want "
                    << nlohmann::json(want).dump() << "\n  got  " << nlohmann::json(got).dump();
    }
    if ((*tok)->Encode(text, true) != expected[i]["ids_special"].get<std::vector<int32_t>>()) ++special_mismatches;
    auto decoded = (*tok)->Decode(got);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    if (*decoded != expected[i]["decoded"].get<std::string>() && ++decode_mismatches <= 5) {
      ADD_FAILURE() << name << " line " << i << " decode differs from HF for " << nlohmann::json(text).dump();
    }
    // Decode(Encode(x)) == x, up to the tokenizer's normalizer; the llama3-style tokenizer's
    // <|mask|> strips the spaces around it, so it is checked against HF's decode only.
    if (name == "smollm2" && *decoded != text) ++roundtrip_mismatches;
    if (name == "qwen2" && *decoded != NfcNormalize(text)) ++roundtrip_mismatches;
  }
  EXPECT_EQ(id_mismatches, 0) << name;
  EXPECT_EQ(special_mismatches, 0) << name;
  EXPECT_EQ(decode_mismatches, 0) << name;
  EXPECT_EQ(roundtrip_mismatches, 0) << name;
  std::printf(
      "[parity] %s: %zu texts, %zu bytes, %zu tokens; mismatches: ids %d, with specials %d, decode %d, "
      "roundtrip %d\n",
      name.c_str(), corpus.size(), bytes, tokens, id_mismatches, special_mismatches, decode_mismatches,
      roundtrip_mismatches);
}

// Encoding 1 MB of prose and code stays in seconds, not minutes: a guard against quadratic
// behaviour, loose enough for a loaded 2-core CI machine (about 1 s there); the speed itself is
// printed, not asserted.
TEST_P(TokenizerParityTest, EncodesOneMegabyteQuickly) {
  const std::string name = GetParam();
  auto tok = Tokenizer::FromJson(*FileAccess::Unconfined()->ReadFile(TokenizerPath(name)), TokenizerPath(name));
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto docs = FileAccess::Unconfined()->ReadFile(testing::DataDir() + "/texts/python-docs.txt");
  auto emma = FileAccess::Unconfined()->ReadFile(testing::DataDir() + "/texts/austen/emma.txt");
  ASSERT_TRUE(docs.ok() && emma.ok());
  std::string text = docs->substr(3'000'000, 500'000) + emma->substr(100'000, 500'000);
  text = RepairUtf8(text);  // the cuts may split a character
  double cold = 0, warm = 0;
  size_t n = 0;
  for (int round = 0; round < 2; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    n = (*tok)->Encode(text).size();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    (round == 0 ? cold : warm) = s;
  }
  std::printf("[timing] %s: %zu bytes -> %zu tokens; cold cache %.3f s, warm cache %.3f s\n", name.c_str(), text.size(),
              n, cold, warm);
  EXPECT_LT(cold, 5.0);
}

// o200k: a byte-level BPE in Phi-4-mini's layout (OpenAI's o200k split with its Unicode case
// classes); llama2: a SentencePiece-style (byte_fallback) BPE in Llama-2's, Mistral's and
// Phi-3's layout; gemma3: Gemma-3-270M's own, with 262,144 tokens and 6,384 added ones.
INSTANTIATE_TEST_SUITE_P(Tokenizers, TokenizerParityTest,
                         ::testing::Values("smollm2", "qwen2", "llama3", "o200k", "llama2", "gemma3"));

// ---- SmolLM2 specifics --------------------------------------------------------------------

class SmolTokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(SmolDir())) GTEST_SKIP() << "test data not found at " << SmolDir();
    auto tok = Tokenizer::FromModelDir(testing::OpenDir(SmolDir()));
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = *std::move(tok);
  }
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(SmolTokenizerTest, ConfigAndSpecialTokens) {
  EXPECT_EQ(tok_->vocab_size(), 49152);
  EXPECT_EQ(tok_->TokenId("<|im_start|>"), 1);
  EXPECT_EQ(tok_->TokenId("<|im_end|>"), 2);
  EXPECT_EQ(tok_->TokenId("Ġthe").has_value(), true);
  EXPECT_EQ(tok_->TokenId("no such token"), std::nullopt);
  EXPECT_EQ(tok_->bos_id(), 1);
  EXPECT_EQ(tok_->eos_id(), 2);
  EXPECT_EQ(tok_->pad_id(), 2);
  EXPECT_TRUE(tok_->IsSpecial(0));
  EXPECT_FALSE(tok_->IsSpecial(1000));
  EXPECT_EQ(tok_->IdToToken(1), "<|im_start|>");
  EXPECT_FALSE(tok_->special_ids().empty());
  EXPECT_THAT(tok_->chat_template(), HasSubstr("<|im_start|>"));
}

TEST_F(SmolTokenizerTest, DecodeOptionsAndErrors) {
  const auto ids = tok_->Encode("<|im_start|>user\nHi<|im_end|>");
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(ids.back(), 2);
  EXPECT_EQ(*tok_->Decode(ids), "<|im_start|>user\nHi<|im_end|>");
  EXPECT_EQ(*tok_->Decode(ids, /*skip_special_tokens=*/true), "user\nHi");
  auto bad = tok_->Decode({5, 1000000});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("id 1000000 at position 1"));
  EXPECT_EQ(tok_->Decode({-1}).status().code(), absl::StatusCode::kInvalidArgument);
  // A character split across calls decodes to U+FFFD, as in HF.
  const auto euro = tok_->Encode("€");
  if (euro.size() > 1) {
    EXPECT_EQ(*tok_->Decode({euro[0]}), "\xEF\xBF\xBD");
  }
}

TEST_F(SmolTokenizerTest, InvalidUtf8) {
  const std::string bad = "ok \xC3\x28 then \xFF end";
  auto checked = tok_->EncodeChecked(bad);
  ASSERT_FALSE(checked.ok());
  EXPECT_EQ(checked.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(checked.status().message()), HasSubstr("offset 3"));
  // Encode replaces ill-formed sequences with U+FFFD, like Python's errors="replace".
  EXPECT_EQ(tok_->Encode(bad), tok_->Encode(RepairUtf8(bad)));
  EXPECT_EQ(RepairUtf8(bad), "ok \xEF\xBF\xBD( then \xEF\xBF\xBD end");
  EXPECT_TRUE(tok_->Encode("").empty());
}

TEST(UnicodeTest, NfcBasics) {
  EXPECT_EQ(NfcNormalize("cafe\xCC\x81"), "caf\xC3\xA9");                           // e + acute -> é
  EXPECT_EQ(NfcNormalize("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"), "\xEA\xB0\x81");  // jamo -> 각
  EXPECT_EQ(NfcNormalize("\xE2\x84\xAB"), "\xC3\x85");                              // Å angstrom sign -> Å
  EXPECT_EQ(NfcNormalize("plain ascii"), "plain ascii");
  EXPECT_EQ(NfcNormalize("q\xCC\x87\xCC\xA3"), "q\xCC\xA3\xCC\x87");  // reordered by combining class
}

// ---- malformed tokenizer.json ---------------------------------------------------------------

absl::Status LoadJson(const std::string& text) { return Tokenizer::FromJson(text, "tok.json").status(); }

constexpr char kMinimal[] = R"({
  "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [MERGES]},
  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
  "decoder": {"type": "ByteLevel"}})";

std::string WithMerges(const std::string& merges) {
  std::string s = kMinimal;
  s.replace(s.find("MERGES"), 6, merges);
  return s;
}

TEST(TokenizerBadInputTest, ClearErrors) {
  EXPECT_TRUE(LoadJson(WithMerges(R"("a b")")).ok());
  EXPECT_TRUE(LoadJson(WithMerges(R"(["a", "b"])")).ok());

  auto expect = [](const std::string& json, absl::StatusCode code, const std::string& fragment) {
    const absl::Status s = LoadJson(json);
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(fragment));
    EXPECT_THAT(std::string(s.message()), HasSubstr("tok.json"));
  };
  expect("{not json", absl::StatusCode::kInvalidArgument, "not valid JSON");
  expect(R"({"decoder": null})", absl::StatusCode::kInvalidArgument, "'model'");
  expect(R"({"model": {"type": "Unigram", "vocab": []}})", absl::StatusCode::kUnimplemented, "'Unigram'");
  expect(R"({"model": {"type": "WordPiece", "vocab": {}}})", absl::StatusCode::kUnimplemented, "'WordPiece'");
  expect(WithMerges(R"("a c")"), absl::StatusCode::kInvalidArgument, "token 'c', which is not in the vocab");
  expect(WithMerges(R"("b a")"), absl::StatusCode::kInvalidArgument, "makes 'ba', which is not in the vocab");
  expect(WithMerges(R"("a b c")"), absl::StatusCode::kInvalidArgument, "merge #0");
  expect(WithMerges(R"(7)"), absl::StatusCode::kInvalidArgument, "merge #0");
  std::string s = WithMerges(R"("a b")");
  expect(std::string(s).replace(s.find("\"vocab\": {\"a\": 0"), 16, "\"vocab\": {\"a\": -4"),
         absl::StatusCode::kInvalidArgument, "vocab entry 'a'");
  expect(std::string(s).replace(s.find("ByteLevel\", \"add"), 9, "Metaspace"), absl::StatusCode::kUnimplemented,
         "'Metaspace'");
  std::string no_bl = R"({"model": {"type": "BPE", "vocab": {}, "merges": []},
      "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "\\s+"}, "behavior": "Isolated"},
      "decoder": {"type": "ByteLevel"}})";
  expect(no_bl, absl::StatusCode::kUnimplemented, "only byte-level BPE");
  std::string bad_re = R"({"model": {"type": "BPE", "vocab": {}, "merges": []},
      "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"}, {"type": "ByteLevel"}]},
      "decoder": {"type": "ByteLevel"}})";
  expect(bad_re, absl::StatusCode::kInvalidArgument, "does not compile");
  std::string nfkc = s;
  nfkc.insert(1, R"("normalizer": {"type": "NFKC"},)");
  expect(nfkc, absl::StatusCode::kUnimplemented, "normalizer 'NFKC'");
  std::string wrong_types = s;
  wrong_types.insert(1, R"("added_tokens": [{"id": "x", "content": 3}],)");
  expect(wrong_types, absl::StatusCode::kInvalidArgument, "added_tokens");
  EXPECT_EQ(Tokenizer::FromModelDir(testing::OpenDir("/")).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace oomb
