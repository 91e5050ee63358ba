// The JSONL dataset reader (worker/data/dataset.h): every sample format, every error class with
// the line it names, data.too_long, the dataset summary, and the lazily loaded tokenizer.
//
// Hermetic: a byte-level BPE tokenizer with no merges (token id = byte value) plus the ChatML
// markers as added tokens (ids 256, 257), and a ChatML chat template (test_tokenizer.h).
#include "worker/data/dataset.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/worker/data/test_tokenizer.h"
#include "tests/worker/test_files.h"

namespace oomb {
namespace {

using ::testing::HasSubstr;

using testing::kImEnd;
using testing::kImStart;

const Tokenizer& ByteTokenizer() {
  static const Tokenizer* tok = testing::MakeByteTokenizer(/*newline_merge=*/false).release();
  return *tok;
}

const ChatTemplate& ChatMl() {
  static const ChatTemplate chat = *ChatTemplate::FromJinja(
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
      "'<|im_end|>' + '\\n'}}{% endfor %}");
  return chat;
}

std::vector<int64_t> Bytes(const std::string& s) { return std::vector<int64_t>(s.begin(), s.end()); }

class DatasetTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& contents) {
    const std::string path =
        ::testing::TempDir() + "/oomb_dataset_" + std::to_string(::getpid()) + "_" + std::to_string(++n_) + ".jsonl";
    std::ofstream(path, std::ios::binary) << contents;
    return path;
  }
  absl::StatusOr<std::vector<Document>> Read(const std::string& contents, DatasetOptions o = {}) {
    path_ = Write(contents);
    return ReadJsonlDataset(*testing::OpenFile(path_), ByteTokenizer(), &ChatMl(), o, &stats_);
  }
  // The read fails with `code`, naming the field, the file, `line` and `what`.
  void ExpectError(const std::string& contents, int64_t line, const std::string& what,
                   absl::StatusCode code = absl::StatusCode::kInvalidArgument, DatasetOptions o = {}) {
    auto r = Read(contents, o);
    ASSERT_FALSE(r.ok()) << contents;
    EXPECT_EQ(r.status().code(), code) << r.status();
    EXPECT_THAT(std::string(r.status().message()),
                HasSubstr(o.field + ": " + path_ + ":" + std::to_string(line) + ": "));
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(what));
  }
  std::string path_;
  DatasetStats stats_;
  int n_ = 0;
};

// ---- formats ---------------------------------------------------------------------------------

TEST_F(DatasetTest, Text) {
  auto r = Read("{\"text\": \"Hi you\"}\n");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 1u);
  EXPECT_EQ((*r)[0].ids, Bytes("Hi you"));
  EXPECT_EQ((*r)[0].labels, (*r)[0].ids);
  EXPECT_EQ((*r)[0].line, 1);
}

TEST_F(DatasetTest, PromptCompletionLossOnCompletionOnly) {
  auto r = Read(R"({"prompt": "Q?", "completion": " A."})");
  ASSERT_TRUE(r.ok()) << r.status();
  const Document& d = (*r)[0];
  EXPECT_EQ(d.ids, Bytes("Q? A."));
  EXPECT_EQ(d.labels, (std::vector<int64_t>{kIgnoreLabel, kIgnoreLabel, ' ', 'A', '.'}));
}

// Loss on assistant turns only: the labelled tokens are exactly the assistant contents and their
// <|im_end|>, as the chat template's spans say; the ids are the tokenization of the whole
// rendered conversation.
TEST_F(DatasetTest, MessagesLossOnAssistantTurnsOnly) {
  const std::vector<ChatMessage> msgs = {
      {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Bye"}, {"assistant", "Bye."}};
  nlohmann::json j = {{"messages", nlohmann::json::array()}};
  for (const auto& m : msgs) j["messages"].push_back({{"role", m.role}, {"content", m.content}});
  auto r = Read(j.dump() + "\n");
  ASSERT_TRUE(r.ok()) << r.status();
  const Document& d = (*r)[0];
  const RenderedChat rendered = *ChatMl().Render(msgs);
  std::vector<int64_t> whole;
  for (int32_t id : ByteTokenizer().Encode(rendered.text)) whole.push_back(id);
  EXPECT_EQ(d.ids, whole);
  ASSERT_EQ(d.labels.size(), d.ids.size());
  // Expected mask from the spans: token i covers rendered bytes; special tokens cover their text.
  std::vector<int64_t> want;
  size_t byte = 0;
  for (int64_t id : d.ids) {
    const size_t len = id == kImStart ? 12 : id == kImEnd ? 10 : 1;
    bool in_span = false;
    for (const AssistantSpan& s : rendered.assistant_spans) in_span |= byte >= s.content_begin && byte < s.turn_end;
    want.push_back(in_span ? id : kIgnoreLabel);
    byte += len;
  }
  EXPECT_EQ(byte, rendered.text.size());
  EXPECT_EQ(d.labels, want);
  std::string labelled;
  for (int64_t l : d.labels) {
    if (l == kImEnd) labelled += "|";
    if (l >= 0 && l < 256) labelled += static_cast<char>(l);
  }
  EXPECT_EQ(labelled, "Hello!|Bye.|");
}

// Where a BPE merge crosses the start of an assistant turn ("\n" ending the header, "\n\n"
// starting the content, merged "\n\n" -> 258), the ids are still those of the whole text (as
// transformers tokenizes a chat), and the merged token, which starts before the content, has
// no loss.
TEST_F(DatasetTest, MessagesTokenizedWholeAcrossSpanBoundaries) {
  static const Tokenizer* merging = testing::MakeByteTokenizer(/*newline_merge=*/true).release();
  ASSERT_NE(merging, nullptr);
  path_ = Write(R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "\n\nA"}]})");
  auto r = ReadJsonlDataset(*testing::OpenFile(path_), *merging, &ChatMl(), {}, nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  const RenderedChat rendered = *ChatMl().Render({{"user", "q"}, {"assistant", "\n\nA"}});
  std::vector<int64_t> whole;
  for (int32_t id : merging->Encode(rendered.text)) whole.push_back(id);
  EXPECT_EQ((*r)[0].ids, whole);
  // ... "assistant" "\n\n"(258, starts in the header) "\n" "A" <|im_end|> "\n"
  const std::vector<int64_t> tail((*r)[0].labels.end() - 5, (*r)[0].labels.end());
  EXPECT_EQ(tail, (std::vector<int64_t>{kIgnoreLabel, '\n', 'A', kImEnd, kIgnoreLabel}));
  const std::vector<int64_t> tail_ids((*r)[0].ids.end() - 5, (*r)[0].ids.end());
  EXPECT_EQ(tail_ids, (std::vector<int64_t>{258, '\n', 'A', kImEnd, '\n'}));
}

TEST_F(DatasetTest, InputIdsWithAndWithoutLabels) {
  auto r = Read("{\"input_ids\": [1, 2, 3]}\n{\"input_ids\": [4, 5, 6], \"labels\": [-100, 5, 6]}\n");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[0].ids, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ((*r)[0].labels, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ((*r)[1].labels, (std::vector<int64_t>{kIgnoreLabel, 5, 6}));
  EXPECT_EQ((*r)[1].line, 2);
}

// Blank lines are skipped but counted; CRLF line ends are accepted.
TEST_F(DatasetTest, LineNumbersCountBlankLinesAndCrlf) {
  auto r = Read("\n{\"text\": \"a\"}\r\n  \n{\"text\": \"b\"}\r\n");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[0].line, 2);
  EXPECT_EQ((*r)[1].line, 4);
  EXPECT_EQ((*r)[1].ids, Bytes("b"));
  ExpectError("\n{\"text\": \"a\"}\r\n\n{\"text\": 1}\r\n", 4, "field 'text': expected a string, got number");
}

// ---- errors, each naming its line ------------------------------------------------------------

constexpr char kGood[] = "{\"text\": \"ok\"}\n";

TEST_F(DatasetTest, MalformedJson) {
  ExpectError(std::string(kGood) + "{\"text\": \"unterminated}\n", 2, "invalid JSON");
  ExpectError(std::string(kGood) + kGood + "{\"text\": \"a\"} trailing\n", 3, "invalid JSON");
  ExpectError("{\"text\": \"\\ud800\"}\n", 1, "invalid JSON");  // a lone surrogate escape
  ExpectError("[1, 2]\n", 1, "expected a JSON object, got array");
  // nlohmann throws out_of_range, not parse_error, for a number it cannot hold (found by
  // tests/fuzz): an error naming the line, not an uncaught exception.
  ExpectError(std::string(kGood) + "{\"input_ids\": [1e999]}\n", 2, "number overflow");
}

TEST_F(DatasetTest, WrongTypes) {
  ExpectError(std::string(kGood) + "{\"text\": 5}\n", 2, "field 'text': expected a string, got number");
  ExpectError("{\"prompt\": \"a\", \"completion\": null}\n", 1, "field 'completion': expected a string, got null");
  ExpectError("{\"messages\": {\"role\": \"user\"}}\n", 1, "field 'messages': expected a non-empty array");
  ExpectError("{\"messages\": [{\"role\": \"user\", \"content\": 3}]}\n", 1, "messages[0]: expected");
  ExpectError("{\"input_ids\": \"1 2\"}\n", 1, "field 'input_ids': expected an array of token ids, got string");
  ExpectError("{\"input_ids\": [1, 2.5]}\n", 1, "input_ids[1]: expected an integer, got 2.5");
  ExpectError("{\"input_ids\": [1, 2], \"labels\": [1]}\n", 1, "field 'labels': expected an array of 2 integers");
  ExpectError("{\"input_ids\": [1, 2], \"labels\": [1, \"x\"]}\n", 1, "labels[1]: expected an integer");
}

TEST_F(DatasetTest, MissingOrAmbiguousFields) {
  ExpectError(std::string(kGood) + "{\"txt\": \"a\"}\n", 2, "no known field");
  ExpectError("{\"prompt\": \"a\"}\n", 1, "'prompt' and 'completion' go together");
  ExpectError("{\"messages\": [{\"role\": \"user\"}]}\n", 1, "messages[0]: expected {\"role\": string");
  ExpectError("{\"text\": \"a\", \"input_ids\": [1]}\n", 1, "more than one sample format");
}

TEST_F(DatasetTest, EmptySample) {
  ExpectError(std::string(kGood) + "{\"text\": \"\"}\n", 2, "empty sample");
  ExpectError("{\"input_ids\": []}\n", 1, "empty sample");
}

TEST_F(DatasetTest, EmptyFileAndMissingFile) {
  auto r = Read("\n\n");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("no samples"));
  EXPECT_EQ(testing::OpenFile("/nonexistent/x.jsonl").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(DatasetTest, InvalidUtf8) {
  ExpectError(std::string(kGood) +
                  "{\"text\": \"a\xff"
                  "b\"}\n",
              2, "invalid UTF-8 at byte 12");
  ExpectError("{\"text\": \"\xe2\x82\"}\n", 1, "invalid UTF-8");  // a cut 3-byte sequence
  ExpectError("{\"text\": \"\xc0\x80\"}\n", 1, "invalid");        // overlong NUL
  ExpectError("{\"text\": \"\xed\xa0\x80\"}\n", 1, "invalid");    // an encoded surrogate
}

TEST_F(DatasetTest, UnknownRole) {
  ExpectError("{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}\n", 1, "messages[0]: unknown role 'robot'");
}

TEST_F(DatasetTest, TokenIdOutOfVocabulary) {
  // The tokenizer's vocabulary: 258 ids.
  ExpectError(std::string(kGood) + "{\"input_ids\": [1, 258]}\n", 2,
              "input_ids[1] = 258 is outside the vocabulary [0, 258)");
  ExpectError("{\"input_ids\": [-1]}\n", 1, "input_ids[0] = -1 is outside");
  ExpectError("{\"input_ids\": [18446744073709551615]}\n", 1, "input_ids[0] = 18446744073709551615 is outside");
  ExpectError("{\"input_ids\": [1], \"labels\": [-5]}\n", 1, "labels[0] = -5 is neither -100 nor in the vocabulary");
  // 2^64 - 100 would wrap to -100 in int64.
  ExpectError("{\"input_ids\": [1], \"labels\": [18446744073709551516]}\n", 1, "labels[0] = 18446744073709551516");
  // The model's embedding size, when given, is the bound.
  DatasetOptions o;
  o.vocab_size = 1000;
  EXPECT_TRUE(Read("{\"input_ids\": [999]}\n", o).ok());
  ExpectError("{\"input_ids\": [1000]}\n", 1, "[0, 1000)", absl::StatusCode::kInvalidArgument, o);
}

TEST_F(DatasetTest, TooLong) {
  const std::string data = "{\"input_ids\": [1, 2, 3]}\n{\"input_ids\": [1, 2, 3, 4, 5, 6]}\n{\"text\": \"abcd\"}\n";
  DatasetOptions o;
  o.max_seq_len = 4;
  o.too_long = TooLong::kTruncate;
  auto r = Read(data, o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 3u);
  EXPECT_EQ((*r)[1].ids, (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ((*r)[1].labels, (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(stats_.truncated, 1);
  EXPECT_EQ(stats_.dropped, 0);
  EXPECT_EQ(stats_.tokens, 3 + 4 + 4);

  o.too_long = TooLong::kDrop;
  r = Read(data, o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[1].line, 3);
  EXPECT_EQ(stats_.dropped, 1);
  EXPECT_EQ(stats_.samples, 2);

  o.too_long = TooLong::kError;
  ExpectError(data, 2, "sample of 6 tokens is longer than data.max_seq_len (4)", absl::StatusCode::kInvalidArgument, o);

  o.too_long = TooLong::kDrop;
  r = Read("{\"input_ids\": [1, 2, 3, 4, 5]}\n", o);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("every sample was longer than max_seq_len"));
}

// ---- summary ---------------------------------------------------------------------------------

TEST_F(DatasetTest, Summary) {
  std::string data;
  const std::vector<int> lengths = {1, 127, 128, 600, 3000};
  for (int n : lengths) data += nlohmann::json{{"input_ids", std::vector<int64_t>(n, 7)}}.dump() + "\n";
  auto r = Read(data);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(stats_.samples, 5);
  EXPECT_EQ(stats_.tokens, 1 + 127 + 128 + 600 + 3000);
  // Buckets: [0,128) [128,512) [512,2048) [2048,8192) ...
  EXPECT_EQ(stats_.length_counts, (std::vector<int64_t>{2, 1, 1, 1, 0, 0, 0, 0}));
}

// ---- the lazily loaded tokenizer --------------------------------------------------------------

TEST_F(DatasetTest, PreTokenizedDataNeedsNoTokenizer) {
  int calls = 0;
  const TokenizerLoader failing = [&]() -> absl::StatusOr<TextTokenizer> {
    ++calls;
    return absl::NotFoundError("model.path: /m/tokenizer.json: no such file");
  };
  DatasetOptions o;
  o.vocab_size = 100;
  path_ = Write("{\"input_ids\": [1, 2]}\n{\"input_ids\": [3], \"labels\": [-100]}\n");
  auto r = ReadJsonlDataset(*testing::OpenFile(path_), failing, o, nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(calls, 0);

  path_ = Write("{\"input_ids\": [1, 2]}\n{\"text\": \"x\"}\n{\"text\": \"y\"}\n");
  r = ReadJsonlDataset(*testing::OpenFile(path_), failing, o, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("data.train: " + path_ + ":2: model.path: /m/tokenizer.json: no such file"));
  EXPECT_EQ(calls, 1);

  // Loaded once, on the first text sample.
  calls = 0;
  const TokenizerLoader ok = [&]() -> absl::StatusOr<TextTokenizer> {
    ++calls;
    return TextTokenizer{&ByteTokenizer(), nullptr, {}};
  };
  path_ = Write("{\"text\": \"x\"}\n{\"text\": \"y\"}\n{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}]}\n");
  r = ReadJsonlDataset(*testing::OpenFile(path_), ok, o, nullptr);
  EXPECT_EQ(calls, 1);
  ASSERT_FALSE(r.ok());  // no chat template
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr(":3: the model has no supported chat template"));
}

// ---- the upload's check, fed in pieces --------------------------------------------------------

// Feeds `contents` to a JsonlRecordChecker of `threads` in pieces of `piece` bytes (each copied
// into a buffer of its own size, so that a line at a piece's end has no bytes after it).
absl::StatusOr<RecordCounts> CheckInPieces(const std::string& contents, size_t piece, int threads) {
  JsonlRecordChecker checker("data", "up.jsonl", threads);
  for (size_t at = 0; at < contents.size(); at += piece) {
    const std::vector<char> copy(contents.begin() + static_cast<std::ptrdiff_t>(at),
                                 contents.begin() + static_cast<std::ptrdiff_t>(std::min(contents.size(), at + piece)));
    const absl::Status s = checker.Feed(std::string_view(copy.data(), copy.size()));
    if (!s.ok()) {
      EXPECT_EQ(checker.Finish().status(), s);  // the first error sticks
      return s;
    }
  }
  return checker.Finish();
}

TEST_F(DatasetTest, RecordCheckerGivesTheSameAnswerWhereverPiecesEndOnAnyThreads) {
  const std::string good =
      "\n{\"text\": \"a\"}\r\n  \n{\"input_ids\": [1, 2, 3], \"labels\": [-100, 2, 3]}\n"
      "{\"prompt\": \"q\", \"completion\": \"r\"}\n{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n"
      "{\"input_ids\": [7]}";  // the last line without its newline
  const std::string bad = std::string(kGood) + kGood + "{\"input_ids\": [1, -2]}\n" + kGood;
  const std::string bad_utf8 = std::string(kGood) + "{\"text\": \"a\xff\"}\n";
  // Two bad lines far apart: the first is the one reported, however the lines were split.
  std::string two_bad = std::string(kGood) + kGood + "{\"text\": 5}\n";
  for (int i = 0; i < 400; ++i) two_bad += kGood;
  two_bad += "{\"input_ids\": [1, -2]}\n";
  for (int threads : {1, 3}) {
    for (size_t piece : {size_t{1}, size_t{2}, size_t{7}, size_t{64}, size_t{1} << 20}) {
      SCOPED_TRACE(::testing::Message() << threads << " threads, pieces of " << piece);
      auto r = CheckInPieces(good, piece, threads);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->records, 5);
      EXPECT_EQ(r->by_kind[static_cast<size_t>(RecordKind::kInputIds)], 2);
      EXPECT_EQ(r->by_kind[static_cast<size_t>(RecordKind::kText)], 1);
      EXPECT_EQ(r->by_kind[static_cast<size_t>(RecordKind::kMessages)], 1);
      EXPECT_EQ(r->by_kind[static_cast<size_t>(RecordKind::kPromptCompletion)], 1);
      auto e = CheckInPieces(bad, piece, threads);
      ASSERT_FALSE(e.ok());
      EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(std::string(e.status().message()), HasSubstr("data: up.jsonl:3: input_ids[1]"));
      e = CheckInPieces(bad_utf8, piece, threads);
      ASSERT_FALSE(e.ok());
      EXPECT_THAT(std::string(e.status().message()), HasSubstr("data: up.jsonl:2: invalid UTF-8 at byte 12"));
      e = CheckInPieces(two_bad, piece, threads);
      ASSERT_FALSE(e.ok());
      EXPECT_THAT(std::string(e.status().message()), HasSubstr("data: up.jsonl:3: field 'text'"));
      e = CheckInPieces("\n \r\n", piece, threads);
      ASSERT_FALSE(e.ok());
      EXPECT_THAT(std::string(e.status().message()), HasSubstr("data: up.jsonl: no samples"));
    }
  }
  // The file's check reads it in pieces too, and agrees.
  path_ = Write(good);
  auto whole = CheckJsonlRecords(*testing::OpenFile(path_), "data", "up.jsonl");
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->records, 5);
}

TEST_F(DatasetTest, RecordCheckerEndsALineLongerThanItsLimitAsItGrows) {
  for (int threads : {1, 2}) {
    JsonlRecordChecker checker("data", "up.jsonl", threads);
    ASSERT_TRUE(checker.Feed(kGood).ok());
    const std::string mib(size_t{1} << 20, 'x');
    absl::Status s;
    size_t fed = 0;
    for (; s.ok() && fed <= (size_t{257} << 20); fed += mib.size()) s = checker.Feed(mib);
    ASSERT_FALSE(s.ok());
    EXPECT_LE(fed, size_t{257} << 20);  // stopped at 256 MiB, not at the line's end
    EXPECT_THAT(std::string(s.message()), HasSubstr("data: up.jsonl:2: the line is longer than 268435456 bytes"));
  }
}

}  // namespace
}  // namespace oomb
