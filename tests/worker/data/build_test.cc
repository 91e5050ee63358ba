// `oombd data build` (worker/data/build.h): samples of at most the target token count and close
// to it, cut at paragraph boundaries where possible, every input byte in exactly one sample
// with overlap 0, overlap repeating the previous sample's tail, directories walked in order.
#include "worker/data/build.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>
#include "tests/worker/test_files.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "tests/worker/data/test_tokenizer.h"
#include "tests/worker/test_env.h"

namespace oomb {
namespace {

namespace fs = std::filesystem;

// Seeded English-like text: paragraphs of sentences of words, some long paragraphs, a few
// multi-byte characters, runs of blank lines.
std::string MakeText(uint64_t seed, int paragraphs) {
  std::mt19937_64 rng(seed);
  const std::vector<std::string> words = {"the", "letter", "was",    "Emma", "walked", "über", "naïve", "and",
                                          "of",  "to",     "garden", "—",    "it",     "said", "café",  "rain"};
  std::string t;
  for (int p = 0; p < paragraphs; ++p) {
    const int sentences = 1 + static_cast<int>(rng() % (p % 7 == 3 ? 60 : 6));
    for (int s = 0; s < sentences; ++s) {
      const int n = 3 + static_cast<int>(rng() % 12);
      for (int w = 0; w < n; ++w) t += (w ? " " : "") + words[rng() % words.size()];
      t += rng() % 5 == 0 ? ".\n" : ". ";
    }
    t += rng() % 4 == 0 ? "\n\n\n" : "\n\n";
  }
  return t;
}

struct Sample {
  std::string text;
  int64_t tokens;
};

std::vector<Sample> Cut(const std::string& text, const Tokenizer& tok, BuildOptions o) {
  std::vector<Sample> out;
  const absl::Status s = CutText(text, tok, o, [&](const std::string& t, int64_t n) {
    out.push_back({t, n});
    return true;
  });
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

// The checks of the contract on one text.
void CheckCut(const std::string& text, const Tokenizer& tok, int64_t target) {
  BuildOptions o;
  o.target_tokens = target;
  const std::vector<Sample> samples = Cut(text, tok, o);
  ASSERT_FALSE(samples.empty());
  std::string joined;
  int paragraph_ends = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    const Sample& s = samples[i];
    const int64_t exact = static_cast<int64_t>(tok.Encode(s.text).size());
    EXPECT_EQ(s.tokens, exact) << "sample " << i;
    EXPECT_LE(exact, target) << "sample " << i;
    if (i + 1 < samples.size()) {
      EXPECT_GE(exact, 0.9 * target) << "sample " << i << " of " << samples.size();
    }
    paragraph_ends += s.text.size() >= 2 && s.text.compare(s.text.size() - 2, 2, "\n\n") == 0;
    joined += s.text;
  }
  // Every byte in exactly one sample, in order.
  EXPECT_TRUE(joined == text) << "samples do not concatenate to the input";
  std::cout << "target " << target << ": " << samples.size() << " samples, " << paragraph_ends
            << " ending at a paragraph boundary\n";
}

TEST(BuildTest, ByteTokenizerWithNewlineMerge) {
  // The merge makes joined counts differ from summed piece counts at "\n\n" cuts.
  const auto tok = testing::MakeByteTokenizer(/*newline_merge=*/true);
  const std::string text = MakeText(1, 120);
  for (const int64_t target : {64, 500, 2048, 100000}) CheckCut(text, *tok, target);
}

TEST(BuildTest, PrefersParagraphBoundaries) {
  const auto tok = testing::MakeByteTokenizer(false);
  // Paragraphs of 40 bytes: a target of 100 holds two whole paragraphs (80 >= 0.9 * 100 is
  // false, so the third is cut to fill); with min_fill 0.5 samples end at paragraphs.
  std::string text;
  for (int i = 0; i < 10; ++i) text += std::string(37, 'a' + i) + ".\n\n";
  BuildOptions o;
  o.target_tokens = 100;
  o.min_fill = 0.5;
  const auto samples = Cut(text, *tok, o);
  ASSERT_EQ(samples.size(), 5u);
  for (const Sample& s : samples) {
    EXPECT_EQ(s.tokens, 80);
    EXPECT_EQ(s.text.substr(s.text.size() - 3), ".\n\n");
  }
  o.min_fill = 0.9;
  const auto filled = Cut(text, *tok, o);
  for (size_t i = 0; i + 1 < filled.size(); ++i) EXPECT_GE(filled[i].text.size(), 90u) << "only the last may be short";
}

TEST(BuildTest, Overlap) {
  const auto tok = testing::MakeByteTokenizer(false);
  const std::string text = MakeText(2, 60);
  BuildOptions o;
  o.target_tokens = 400;
  o.overlap_tokens = 100;
  const auto samples = Cut(text, *tok, o);
  ASSERT_GT(samples.size(), 2u);
  size_t pos = 0;  // where the new part of each sample starts in the text
  for (size_t i = 0; i < samples.size(); ++i) {
    const std::string& s = samples[i].text;
    EXPECT_LE(samples[i].tokens, 400);
    const size_t at = text.find(s, i == 0 ? 0 : pos - std::min(pos, s.size()));
    ASSERT_NE(at, std::string::npos) << "sample " << i << " is not a substring of the text";
    if (i > 0) {
      EXPECT_LT(at, pos) << "sample " << i << " repeats nothing";
      EXPECT_LE(static_cast<int64_t>(pos - at), 100) << "overlap longer than asked";
    }
    pos = at + s.size();
  }
  EXPECT_EQ(pos, text.size());
}

TEST(BuildTest, DatasetFromFilesAndDirectories) {
  const auto tok = testing::MakeByteTokenizer(false);
  const std::string dir = testing::ScratchDir("data_build");
  fs::create_directories(dir + "/texts/sub");
  fs::create_directories(dir + "/texts/.hidden");
  const std::string a = MakeText(3, 30), b = MakeText(4, 30), c = MakeText(5, 5);
  std::ofstream(dir + "/texts/b.txt") << b;
  std::ofstream(dir + "/texts/sub/a.txt") << a;  // "sub/a.txt" sorts after "b.txt"
  std::ofstream(dir + "/texts/.hidden/x.txt") << "ignored";
  std::ofstream(dir + "/c.txt") << c;
  BuildOptions o;
  o.target_tokens = 300;
  auto st = BuildTextDataset({dir + "/c.txt", dir + "/texts"}, *tok, o, dir + "/out.jsonl");
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->files, 3);
  EXPECT_EQ(st->bytes, static_cast<int64_t>(a.size() + b.size() + c.size()));
  std::ifstream in(dir + "/out.jsonl");
  std::string joined;
  int64_t samples = 0, tokens = 0;
  for (std::string line; std::getline(in, line); ++samples) {
    const auto j = nlohmann::json::parse(line);
    const std::string t = j["text"];
    tokens += static_cast<int64_t>(tok->Encode(t).size());
    joined += t;
  }
  EXPECT_EQ(samples, st->samples);
  EXPECT_EQ(tokens, st->tokens);
  EXPECT_LE(st->max_sample_tokens, 300);
  EXPECT_TRUE(joined == c + b + a);

  o.max_samples = 2;
  st = BuildTextDataset({dir + "/texts"}, *tok, o, dir + "/two.jsonl");
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->samples, 2);

  EXPECT_EQ(BuildTextDataset({dir + "/missing"}, *tok, o, dir + "/x.jsonl").status().code(),
            absl::StatusCode::kNotFound);
  std::ofstream(dir + "/bad.txt") << "ok\xff";
  auto bad = BuildTextDataset({dir + "/bad.txt"}, *tok, o, dir + "/x.jsonl");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), ::testing::HasSubstr("bad.txt"));
  EXPECT_FALSE(fs::exists(dir + "/x.jsonl"));
  o.overlap_tokens = 300;
  EXPECT_EQ(BuildTextDataset({dir + "/c.txt"}, *tok, o, dir + "/x.jsonl").status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The real tokenizer (SmolLM2) on a real long text; skips without the test data.
TEST(BuildTest, SmolLM2OnAusten) {
  const std::string model = testing::DataDir() + "/models/SmolLM2-135M-Instruct";
  const std::string text_path = testing::DataDir() + "/texts/austen/persuasion.txt";
  if (!fs::exists(model + "/tokenizer.json") || !fs::exists(text_path)) GTEST_SKIP() << "no test data";
  auto tok = Tokenizer::FromModelDir(testing::OpenDir(model));
  ASSERT_TRUE(tok.ok()) << tok.status();
  std::ifstream in(text_path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  text.resize(std::min<size_t>(text.size(), 120000));
  while (!text.empty() && (static_cast<unsigned char>(text.back()) & 0xC0) == 0x80) text.pop_back();
  if (!text.empty() && static_cast<unsigned char>(text.back()) >= 0xC0) text.pop_back();
  for (const int64_t target : {1024, 4096}) CheckCut(text, **tok, target);
}

}  // namespace
}  // namespace oomb
