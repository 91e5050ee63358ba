#include "worker/job/eval_suites.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/common/status.h"
#include "worker/train/chunk_trainer.h"

namespace oomb {
namespace {

constexpr char kPasskeyIntro[] =
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz you "
    "about the important information there.";
constexpr char kPasskeyFiller[] =
    " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
constexpr char kNeedleIntro[] =
    "A special magic number is hidden in the following text. Find it and memorize it. I will quiz you about it.\n";
constexpr const char* kCities[] = {"Lisbon", "Oslo",  "Nairobi", "Lima",   "Hanoi",   "Quito", "Tunis",
                                   "Dublin", "Perth", "Kyoto",   "Bergen", "Seville", "Cusco", "Accra"};

absl::StatusOr<std::vector<int64_t>> Ids(const Tokenizer& tok, const std::string& text) {
  OOMB_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok.EncodeChecked(text));
  return std::vector<int64_t>(ids.begin(), ids.end());
}

std::vector<double> Depths(int64_t n) {
  if (n <= 1) return {0.5};
  std::vector<double> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(static_cast<double>(i) / static_cast<double>(n - 1));
  return out;
}

// What one document says besides its filler.
struct Pieces {
  std::vector<int64_t> intro, fact, question, answer;
  std::string answer_text;
};

// intro + filler[0, before) + fact + filler[before, F) + question + answer, `length` tokens;
// labels on the answer only. `filler(n)` gives the first n filler tokens.
absl::StatusOr<RetrievalDoc> Assemble(const Pieces& p, int64_t length, double depth,
                                      const std::function<std::vector<int64_t>(int64_t)>& filler) {
  const int64_t fixed = static_cast<int64_t>(p.intro.size() + p.fact.size() + p.question.size() + p.answer.size());
  if (length < fixed) {
    return absl::InvalidArgumentError(
        absl::StrCat(length, " tokens cannot hold the instruction, the fact and the question (", fixed, " tokens)"));
  }
  const int64_t f = length - fixed;
  const auto before = static_cast<int64_t>(depth * static_cast<double>(f) + 0.5);
  const std::vector<int64_t> fill = filler(f);
  RetrievalDoc d;
  d.length = length;
  d.depth = depth;
  d.answer = p.answer_text;
  std::vector<int64_t>& ids = d.doc.ids;
  ids = p.intro;
  ids.insert(ids.end(), fill.begin(), fill.begin() + before);
  ids.insert(ids.end(), p.fact.begin(), p.fact.end());
  ids.insert(ids.end(), fill.begin() + before, fill.end());
  ids.insert(ids.end(), p.question.begin(), p.question.end());
  d.doc.labels.assign(ids.size(), kIgnoreLabel);
  ids.insert(ids.end(), p.answer.begin(), p.answer.end());
  d.doc.labels.insert(d.doc.labels.end(), p.answer.begin(), p.answer.end());
  return d;
}

}  // namespace

absl::StatusOr<std::vector<RetrievalDoc>> PasskeyDocs(const Tokenizer& tok, const RetrievalOptions& o) {
  OOMB_ASSIGN_OR_RETURN(const std::vector<int64_t> intro, Ids(tok, kPasskeyIntro));
  OOMB_ASSIGN_OR_RETURN(const std::vector<int64_t> filler, Ids(tok, kPasskeyFiller));
  OOMB_ASSIGN_OR_RETURN(const std::vector<int64_t> question, Ids(tok, " What is the pass key? The pass key is"));
  std::mt19937_64 rng(o.seed);
  std::vector<RetrievalDoc> out;
  for (const int64_t length : o.lengths) {
    for (const double depth : Depths(o.depths)) {
      for (int64_t t = 0; t < o.trials; ++t) {
        const std::string key = std::to_string(10000 + rng() % 90000);
        Pieces p{intro, {}, question, {}, key};
        OOMB_ASSIGN_OR_RETURN(
            p.fact, Ids(tok, absl::StrCat(" The pass key is ", key, ". Remember it. ", key, " is the pass key.")));
        OOMB_ASSIGN_OR_RETURN(p.answer, Ids(tok, " " + key));
        auto repeat = [&](int64_t n) {
          std::vector<int64_t> f;
          while (static_cast<int64_t>(f.size()) < n) f.insert(f.end(), filler.begin(), filler.end());
          f.resize(n);
          return f;
        };
        OOMB_ASSIGN_OR_RETURN(RetrievalDoc d, Assemble(p, length, depth, repeat));
        out.push_back(std::move(d));
      }
    }
  }
  return out;
}

absl::StatusOr<std::vector<RetrievalDoc>> NeedleDocs(const Tokenizer& tok, const std::string& haystack,
                                                     const RetrievalOptions& o) {
  OOMB_ASSIGN_OR_RETURN(const std::vector<int64_t> text, Ids(tok, haystack));
  OOMB_ASSIGN_OR_RETURN(const std::vector<int64_t> intro, Ids(tok, kNeedleIntro));
  const int64_t longest = o.lengths.empty() ? 0 : *std::max_element(o.lengths.begin(), o.lengths.end());
  if (static_cast<int64_t>(text.size()) < longest) {
    return absl::InvalidArgumentError(
        absl::StrCat("the haystack has ", text.size(), " tokens, fewer than the longest length (", longest, ")"));
  }
  std::mt19937_64 rng(o.seed);
  std::vector<RetrievalDoc> out;
  for (const int64_t length : o.lengths) {
    for (const double depth : Depths(o.depths)) {
      for (int64_t t = 0; t < o.trials; ++t) {
        const std::string city = kCities[rng() % std::size(kCities)];
        const std::string value = std::to_string(1000000 + rng() % 9000000);
        const int64_t offset = static_cast<int64_t>(rng() % (text.size() - length + 1));
        Pieces p{intro, {}, {}, {}, value};
        OOMB_ASSIGN_OR_RETURN(p.fact,
                              Ids(tok, absl::StrCat(" The special magic number for ", city, " is ", value, ". ")));
        OOMB_ASSIGN_OR_RETURN(p.question, Ids(tok, absl::StrCat("\nWhat is the special magic number for ", city,
                                                                "? The special magic number for ", city, " is")));
        OOMB_ASSIGN_OR_RETURN(p.answer, Ids(tok, " " + value));
        auto slice = [&](int64_t n) { return std::vector<int64_t>(text.begin() + offset, text.begin() + offset + n); };
        OOMB_ASSIGN_OR_RETURN(RetrievalDoc d, Assemble(p, length, depth, slice));
        out.push_back(std::move(d));
      }
    }
  }
  return out;
}

std::vector<std::pair<int64_t, int64_t>> PositionBuckets(int64_t longest) {
  std::vector<std::pair<int64_t, int64_t>> out = {{0, 1024}};
  while (out.back().second < longest) out.emplace_back(out.back().second, 2 * out.back().second);
  return out;
}

absl::StatusOr<DataScore> ScoreData(ChunkTrainer& trainer, const std::vector<TokenSequence>& seqs, bool by_position) {
  DataScore out;
  int64_t longest = 1;
  for (const TokenSequence& s : seqs) longest = std::max(longest, s.size());
  if (by_position) {
    for (const auto& [begin, end] : PositionBuckets(longest)) out.positions.push_back({begin, end});
  }
  TokenScores scores;
  for (const TokenSequence& s : seqs) {
    OOMB_ASSIGN_OR_RETURN(SequenceLoss l, trainer.EvalSequence(s, by_position ? &scores : nullptr));
    out.loss_sum += l.loss_sum;
    out.tokens += l.label_tokens;
    ++out.samples;
    for (size_t t = 0; by_position && t < scores.loss.size(); ++t) {
      if (std::isnan(scores.loss[t])) continue;
      PositionLoss& b = out.positions[std::bit_width(static_cast<uint64_t>(t >> 10))];  // PositionBuckets' order
      b.loss += scores.loss[t];
      ++b.tokens;
      b.hits += scores.hit[t] ? 1 : 0;
    }
  }
  for (PositionLoss& b : out.positions) b.loss = b.tokens > 0 ? b.loss / static_cast<double>(b.tokens) : 0.0;
  return out;
}

absl::StatusOr<std::vector<RetrievalScore>> ScoreRetrieval(ChunkTrainer& trainer,
                                                           const std::vector<RetrievalDoc>& docs) {
  std::vector<RetrievalScore> out;
  TokenScores scores;
  for (const RetrievalDoc& d : docs) {
    TokenSequence seq;
    seq.Append(d.doc);
    OOMB_RETURN_IF_ERROR(trainer.EvalSequence(seq, &scores).status());
    bool correct = true;
    for (size_t t = 0; t < scores.loss.size(); ++t) correct &= std::isnan(scores.loss[t]) || scores.hit[t];
    if (out.empty() || out.back().length != d.length || out.back().depth != d.depth) {
      out.push_back({d.length, d.depth});
    }
    out.back().correct += correct ? 1 : 0;
    ++out.back().trials;
  }
  return out;
}

namespace {

class PositionsSuite final : public Suite {
 public:
  explicit PositionsSuite(const std::vector<Document>& samples) {
    for (const Document& d : samples) {
      seqs_.emplace_back();
      seqs_.back().Append(d);
    }
  }
  int64_t longest() const override {
    int64_t longest = 0;
    for (const TokenSequence& s : seqs_) longest = std::max(longest, s.size());
    return longest;
  }
  absl::StatusOr<SuiteResult> Score(ChunkTrainer& trainer) const override {
    SuiteResult r;
    if (seqs_.empty()) return r;
    OOMB_ASSIGN_OR_RETURN(DataScore d, ScoreData(trainer, seqs_, /*by_position=*/true));
    r.buckets = std::move(d.positions);
    return r;
  }

 private:
  std::vector<TokenSequence> seqs_;
};

class RetrievalSuite final : public Suite {
 public:
  explicit RetrievalSuite(std::vector<RetrievalDoc> docs) : docs_(std::move(docs)) {}
  int64_t longest() const override {
    int64_t longest = 0;
    for (const RetrievalDoc& d : docs_) longest = std::max(longest, d.length);
    return longest;
  }
  absl::StatusOr<SuiteResult> Score(ChunkTrainer& trainer) const override {
    SuiteResult r;
    OOMB_ASSIGN_OR_RETURN(r.cells, ScoreRetrieval(trainer, docs_));
    return r;
  }

 private:
  std::vector<RetrievalDoc> docs_;
};

class RulerSuite final : public Suite {
 public:
  RulerSuite(std::vector<RulerDoc> docs, std::shared_ptr<const Tokenizer> tokenizer, double threshold, int64_t margin)
      : docs_(std::move(docs)), tokenizer_(std::move(tokenizer)), threshold_(threshold), margin_(margin) {}
  int64_t longest() const override {
    int64_t longest = 0;
    for (const RulerDoc& d : docs_) longest = std::max(longest, d.length + margin_);
    return longest;
  }
  absl::StatusOr<SuiteResult> Score(ChunkTrainer& trainer) const override {
    SuiteResult r;
    r.threshold = threshold_;
    std::optional<int64_t> stop;
    if (tokenizer_->eos_id().has_value()) stop = *tokenizer_->eos_id();
    for (const RulerDoc& d : docs_) {
      OOMB_ASSIGN_OR_RETURN(const std::vector<int64_t> ids, trainer.Generate(d.prompt, d.max_new_tokens, stop));
      OOMB_ASSIGN_OR_RETURN(const std::string text, tokenizer_->Decode(std::vector<int32_t>(ids.begin(), ids.end()),
                                                                       /*skip_special_tokens=*/true));
      if (r.ruler.empty() || r.ruler.back().task != d.task || r.ruler.back().length != d.length) {
        r.ruler.push_back({.task = d.task, .length = d.length});
      }
      r.ruler.back().score += StringMatchAll(text, d.answers);
      ++r.ruler.back().samples;
    }
    for (RulerScore& s : r.ruler) s.score = 100 * s.score / static_cast<double>(s.samples);
    return r;
  }

 private:
  std::vector<RulerDoc> docs_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  double threshold_;
  int64_t margin_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Suite>> MakeSuite(EvalSuite suite, const SuiteInputs& in) {
  switch (suite) {
    case EvalSuite::kPositions:
      return std::make_unique<PositionsSuite>(in.samples);
    case EvalSuite::kPasskey: {
      OOMB_ASSIGN_OR_RETURN(std::vector<RetrievalDoc> docs, PasskeyDocs(*in.tokenizer, in.retrieval));
      return std::make_unique<RetrievalSuite>(std::move(docs));
    }
    case EvalSuite::kNeedle: {
      OOMB_ASSIGN_OR_RETURN(std::vector<RetrievalDoc> docs, NeedleDocs(*in.tokenizer, in.haystack, in.retrieval));
      return std::make_unique<RetrievalSuite>(std::move(docs));
    }
    case EvalSuite::kRuler: {
      OOMB_ASSIGN_OR_RETURN(const PromptFormat format, RulerPromptFormat(*in.tokenizer));
      OOMB_ASSIGN_OR_RETURN(std::vector<RulerDoc> docs, RulerDocs(*in.tokenizer, format, in.haystack, in.ruler));
      return std::make_unique<RulerSuite>(std::move(docs), in.tokenizer, in.ruler_threshold, in.ruler_margin);
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown suite ", static_cast<int>(suite)));
}

}  // namespace oomb
