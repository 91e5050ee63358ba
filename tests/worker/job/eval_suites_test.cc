// The retrieval suites' documents (worker/job/eval_suites.h) with the real SmolLM2 tokenizer:
// exact lengths, the fact at its depth, labels on the answer only, seeded. Skips without the
// test data.
#include "worker/job/eval_suites.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "tests/worker/test_env.h"
#include "worker/common/file_access.h"

namespace oomb {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<Tokenizer> SmolTokenizer() {
  const std::string dir = testing::DataDir() + "/models/SmolLM2-135M-Instruct";
  if (!std::filesystem::exists(dir + "/tokenizer.json")) return nullptr;
  auto d = FileAccess::Unconfined()->OpenDir(dir);
  if (!d.ok()) return nullptr;
  auto t = Tokenizer::FromModelDir(*d);
  return t.ok() ? *std::move(t) : nullptr;
}

std::string Decode(const Tokenizer& tok, const std::vector<int64_t>& ids, size_t begin, size_t end) {
  auto s = tok.Decode(std::vector<int32_t>(ids.begin() + begin, ids.begin() + end));
  return s.ok() ? *s : "";
}

// Where the labelled (answer) tokens start; every label before is ignored.
size_t AnswerBegin(const Document& d) {
  size_t i = 0;
  while (i < d.labels.size() && d.labels[i] == kIgnoreLabel) ++i;
  return i;
}

TEST(EvalSuitesTest, PasskeyDocumentsHaveExactLengthsTheKeyAtItsDepthAndLabelsOnTheAnswer) {
  auto tok = SmolTokenizer();
  if (tok == nullptr) GTEST_SKIP() << "no SmolLM2 tokenizer";
  RetrievalOptions o;
  o.lengths = {300, 600};
  o.depths = 3;
  o.trials = 2;
  auto docs = PasskeyDocs(*tok, o);
  ASSERT_TRUE(docs.ok()) << docs.status();
  ASSERT_EQ(docs->size(), 2u * 3u * 2u);
  for (const RetrievalDoc& d : *docs) {
    ASSERT_EQ(static_cast<int64_t>(d.doc.ids.size()), d.length);
    ASSERT_EQ(d.doc.labels.size(), d.doc.ids.size());
    const size_t a = AnswerBegin(d.doc);
    for (size_t i = a; i < d.doc.ids.size(); ++i) EXPECT_EQ(d.doc.labels[i], d.doc.ids[i]);
    EXPECT_EQ(Decode(*tok, d.doc.ids, a, d.doc.ids.size()), " " + d.answer);
    const std::string text = Decode(*tok, d.doc.ids, 0, d.doc.ids.size());
    EXPECT_THAT(text, HasSubstr("The pass key is " + d.answer + ". Remember it."));
    EXPECT_THAT(text, HasSubstr("What is the pass key? The pass key is " + d.answer));
    // Depth 0: the key right after the instruction; depth 1: right before the question.
    const size_t key = text.find("The pass key is " + d.answer + ".");
    const size_t intro_end = text.find("information there.") + std::string("information there.").size();
    const size_t question = text.find(" What is the pass key?");
    const size_t key_end = text.find(d.answer + " is the pass key.") + d.answer.size() + 17;
    if (d.depth == 0) {
      EXPECT_EQ(key, intro_end + 1);
    } else if (d.depth == 1) {
      EXPECT_EQ(key_end, question);
    } else {
      EXPECT_GT(key, intro_end + 100);
    }
  }
  // Seeded: the same seed, the same keys; another seed, others.
  auto again = PasskeyDocs(*tok, o);
  o.seed = 2;
  auto other = PasskeyDocs(*tok, o);
  ASSERT_TRUE(again.ok() && other.ok());
  EXPECT_EQ((*again)[5].doc.ids, (*docs)[5].doc.ids);
  EXPECT_NE((*other)[5].answer, (*docs)[5].answer);
}

TEST(EvalSuitesTest, NeedleHidesAFactInRealTextAndRefusesWhatCannotHoldIt) {
  auto tok = SmolTokenizer();
  const std::string austen = testing::DataDir() + "/texts/austen/emma.txt";
  if (tok == nullptr || !std::filesystem::exists(austen)) GTEST_SKIP() << "no SmolLM2 tokenizer or Austen text";
  auto text = FileAccess::Unconfined()->ReadFile(austen);
  ASSERT_TRUE(text.ok());
  RetrievalOptions o;
  o.lengths = {1000};
  o.depths = 2;
  auto docs = NeedleDocs(*tok, text->substr(0, 50000), o);
  ASSERT_TRUE(docs.ok()) << docs.status();
  ASSERT_EQ(docs->size(), 2u);
  for (const RetrievalDoc& d : *docs) {
    EXPECT_EQ(static_cast<int64_t>(d.doc.ids.size()), 1000);
    const std::string decoded = Decode(*tok, d.doc.ids, 0, d.doc.ids.size());
    EXPECT_THAT(decoded, HasSubstr(" is " + d.answer + ". "));
    EXPECT_EQ(Decode(*tok, d.doc.ids, AnswerBegin(d.doc), d.doc.ids.size()), " " + d.answer);
  }
  auto short_haystack = NeedleDocs(*tok, "Too short.", o);
  EXPECT_EQ(short_haystack.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(short_haystack.status().message()), HasSubstr("the haystack has 3 tokens"));
  o.lengths = {20};
  auto too_short = PasskeyDocs(*tok, o);
  EXPECT_EQ(too_short.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(too_short.status().message()), HasSubstr("20 tokens cannot hold"));
}

TEST(EvalSuitesTest, PositionBucketsDoubleFrom1024) {
  using B = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(PositionBuckets(1), (B{{0, 1024}}));
  EXPECT_EQ(PositionBuckets(1024), (B{{0, 1024}}));
  EXPECT_EQ(PositionBuckets(1025), (B{{0, 1024}, {1024, 2048}}));
  EXPECT_EQ(PositionBuckets(5000), (B{{0, 1024}, {1024, 2048}, {2048, 4096}, {4096, 8192}}));
}

}  // namespace
}  // namespace oomb
