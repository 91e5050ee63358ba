// RULER's tasks (worker/job/ruler.h) with a byte-level tokenizer (one token a byte, so token
// offsets are text offsets): RULER's scoring per task (the right answer scores 1, a near miss
// 0), exact lengths, seeded documents, the needles and chains where the documents say, cwe's
// and fwe's answers really the most frequent words, the chat template around the prompt, and
// the effective length. Hermetic: in-test texts only.
#include "worker/job/ruler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_join.h"
#include "tests/worker/data/test_tokenizer.h"
#include "worker/hf/chat_template.h"

namespace oomb {
namespace {

using ::testing::HasSubstr;

const Tokenizer& Bytes() {
  static const Tokenizer* tok = testing::MakeByteTokenizer(/*newline_merge=*/false).release();
  return *tok;
}

// Invented prose, repeated by the essay tasks where a document is longer.
std::string Essay() {
  return "The harbour town woke early in the spring. Fishing boats left before dawn and came back at noon. "
         "Children ran along the quay with bread for the gulls! Old sailors argued about the weather on the benches. "
         "Was the lighthouse keeper ever seen in the market? Nobody could say for certain. The baker sold rye loaves "
         "and honey cakes. In the evening the lamps were lit one by one along the shore.\n\nA storm came in the "
         "autumn and the boats stayed home. The nets were mended in the long sheds. Rain fell for nine days.";
}

std::string Text(const std::vector<int64_t>& ids) {
  std::string s;
  for (const int64_t id : ids) {
    s += id == testing::kImStart ? "<|im_start|>"
         : id == testing::kImEnd ? "<|im_end|>"
                                 : std::string(1, static_cast<char>(id));
  }
  return s;
}

std::vector<RulerDoc> Docs(RulerTask task, std::vector<int64_t> lengths, uint64_t seed = 1, int64_t samples = 1,
                           const PromptFormat& format = {}) {
  RulerOptions o;
  o.tasks = {task};
  o.lengths = std::move(lengths);
  o.samples = samples;
  o.seed = seed;
  auto docs = RulerDocs(Bytes(), format, Essay(), o);
  EXPECT_TRUE(docs.ok()) << docs.status();
  return docs.ok() ? *docs : std::vector<RulerDoc>{};
}

// One character of each answer changed: found nowhere.
std::string NearMiss(const std::vector<std::string>& answers) {
  std::vector<std::string> out;
  for (std::string a : answers) {
    char& c = a[a.size() / 2];
    c = std::isdigit(static_cast<unsigned char>(c)) ? (c == '9' ? '0' : static_cast<char>(c + 1))
                                                    : (c == 'z' || c == 'Z' ? 'a' : static_cast<char>(c + 1));
    out.push_back(a);
  }
  return absl::StrJoin(out, ", ");
}

TEST(RulerTest, EachTaskScoresTheRightAnswerOneAndANearMissZero) {
  for (const RulerTask task : kRulerTasks) {
    SCOPED_TRACE(RulerTaskName(task));
    const std::vector<RulerDoc> docs = Docs(task, {2000});
    ASSERT_EQ(docs.size(), 1u);
    const RulerDoc& d = docs[0];
    ASSERT_FALSE(d.answers.empty());
    // As a model might write it: upper case, numbered, with a control character before.
    std::string right = "\x02 ";
    for (size_t i = 0; i < d.answers.size(); ++i) right += std::to_string(i + 1) + ". " + d.answers[i] + " ";
    EXPECT_EQ(StringMatchAll(right, d.answers), 1.0);
    EXPECT_EQ(StringMatchAll(absl::AsciiStrToUpper(right), d.answers), 1.0);
    EXPECT_EQ(StringMatchAll(NearMiss(d.answers), d.answers), 0.0) << NearMiss(d.answers);
    EXPECT_EQ(StringMatchAll("", d.answers), 0.0);
    if (d.answers.size() > 1) {  // string_match_all: the share found
      const std::vector<std::string> but_last(d.answers.begin(), d.answers.end() - 1);
      EXPECT_DOUBLE_EQ(StringMatchAll(absl::StrJoin(but_last, " "), d.answers),
                       static_cast<double>(but_last.size()) / static_cast<double>(d.answers.size()));
    }
  }
  EXPECT_EQ(StringMatchAll("anything", {}), 0.0);
}

TEST(RulerTest, AnswerCountsAndBudgetsAreRulers) {
  const std::map<RulerTask, std::pair<size_t, int64_t>> want = {{RulerTask::kNiahSingle1, {1, 128}},
                                                                {RulerTask::kNiahSingle2, {1, 128}},
                                                                {RulerTask::kNiahSingle3, {1, 128}},
                                                                {RulerTask::kNiahMultikey1, {1, 128}},
                                                                {RulerTask::kNiahMultikey2, {1, 128}},
                                                                {RulerTask::kNiahMultikey3, {1, 128}},
                                                                {RulerTask::kNiahMultivalue, {4, 128}},
                                                                {RulerTask::kNiahMultiquery, {4, 128}},
                                                                {RulerTask::kVt, {5, 30}},
                                                                {RulerTask::kCwe, {10, 120}},
                                                                {RulerTask::kFwe, {3, 50}}};
  for (const auto& [task, counts] : want) {
    SCOPED_TRACE(RulerTaskName(task));
    const std::vector<RulerDoc> docs = Docs(task, {2000});
    ASSERT_EQ(docs.size(), 1u);
    EXPECT_EQ(docs[0].answers.size(), counts.first);
    EXPECT_EQ(docs[0].max_new_tokens, counts.second);
    EXPECT_EQ(RulerTokensToGenerate(task), counts.second);
  }
  const RulerDoc uuid = Docs(RulerTask::kNiahSingle3, {2000})[0];
  EXPECT_TRUE(std::regex_match(uuid.answers[0], std::regex("[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-"
                                                           "[0-9a-f]{12}")))
      << uuid.answers[0];
  EXPECT_TRUE(std::regex_match(Docs(RulerTask::kNiahSingle1, {2000})[0].answers[0], std::regex("[1-9][0-9]{6}")));
}

TEST(RulerTest, LengthsAreExactAndTheSameSeedGivesTheSameDocuments) {
  for (const RulerTask task : kRulerTasks) {
    SCOPED_TRACE(RulerTaskName(task));
    const std::vector<RulerDoc> docs = Docs(task, {2500, 8000}, /*seed=*/3, /*samples=*/2);
    ASSERT_EQ(docs.size(), 4u);
    for (const RulerDoc& d : docs) {
      EXPECT_EQ(static_cast<int64_t>(d.prompt.size()) + d.max_new_tokens, d.length);
    }
    EXPECT_EQ(docs[0].length, 2500);
    EXPECT_EQ(docs[3].length, 8000);
    EXPECT_NE(docs[0].prompt, docs[1].prompt);  // each document its own draw
    const std::vector<RulerDoc> again = Docs(task, {2500, 8000}, 3, 2);
    const std::vector<RulerDoc> other = Docs(task, {2500, 8000}, 4, 2);
    for (size_t i = 0; i < docs.size(); ++i) {
      EXPECT_EQ(again[i].prompt, docs[i].prompt);
      EXPECT_EQ(again[i].answers, docs[i].answers);
      EXPECT_NE(other[i].prompt, docs[i].prompt);
    }
    // Another task list, the same documents for this one.
    RulerOptions o;
    o.tasks = {RulerTask::kFwe, task};
    o.lengths = {2500, 8000};
    o.samples = 2;
    o.seed = 3;
    auto both = RulerDocs(Bytes(), {}, Essay(), o);
    ASSERT_TRUE(both.ok()) << both.status();
    EXPECT_EQ((*both)[task == RulerTask::kFwe ? 0 : 4].prompt, docs[0].prompt);
  }
}

bool NiahEssay(RulerTask t) {
  return t == RulerTask::kNiahSingle2 || t == RulerTask::kNiahSingle3 || t == RulerTask::kNiahMultikey1 ||
         t == RulerTask::kNiahMultivalue || t == RulerTask::kNiahMultiquery;
}

// The needles are in the text, each where its depth says, and the question asks for the answers.
TEST(RulerTest, NiahNeedlesSitAtTheirDepths) {
  for (const RulerTask task :
       {RulerTask::kNiahSingle1, RulerTask::kNiahSingle2, RulerTask::kNiahSingle3, RulerTask::kNiahMultikey1,
        RulerTask::kNiahMultikey2, RulerTask::kNiahMultikey3, RulerTask::kNiahMultivalue, RulerTask::kNiahMultiquery}) {
    SCOPED_TRACE(RulerTaskName(task));
    for (const RulerDoc& d : Docs(task, {3000}, 7, 3)) {
      const std::string text = Text(d.prompt);
      const bool essay = NiahEssay(task);
      const size_t begin = text.find("afterwards.\n") + 12;
      const size_t end = text.rfind("What ") - (essay ? 1 : 0);
      ASSERT_LT(begin, end);
      const double size = static_cast<double>(end - begin);
      std::vector<double> found;
      for (const std::string& a : d.answers) {
        const size_t at = text.find("is: " + a + ".");
        ASSERT_NE(at, std::string::npos) << a;
        const size_t needle = text.rfind("One of the special magic", at) - (essay ? 1 : 0);  // essays: " One of"
        found.push_back(static_cast<double>(needle - begin) / size);
      }
      // Each answer's needle starts at one of the stated depths; multikey_1's other keys too.
      ASSERT_EQ(d.depths.size(), task == RulerTask::kNiahMultikey1 ? 4 : d.answers.size());
      for (const double f : found) {
        const bool stated = std::any_of(d.depths.begin(), d.depths.end(),
                                        [&](double depth) { return std::abs(depth - f) < 0.5 / size; });
        EXPECT_TRUE(stated) << f;
      }
      const std::string prefix = d.answers.size() == 1 ? "mentioned in the provided text is" : "text are";
      EXPECT_TRUE(text.ends_with(prefix)) << text.substr(text.size() - 80);
    }
  }
}

TEST(RulerTest, NiahTemplatesAreRulersSingularAndPlural) {
  const std::string single = Text(Docs(RulerTask::kNiahSingle1, {1500})[0].prompt);
  EXPECT_TRUE(
      single.starts_with("A special magic number is hidden within the following text. Make sure to memorize "
                         "it. I will quiz you about the number afterwards.\n"));
  EXPECT_THAT(single, HasSubstr("The grass is green. The sky is blue. The sun is yellow. Here we go. There and back "
                                "again.\n"));
  EXPECT_THAT(single, HasSubstr("\nWhat is the special magic number for "));
  EXPECT_THAT(single, HasSubstr("One of the special magic numbers for "));
  const std::string query = Text(Docs(RulerTask::kNiahMultiquery, {1500})[0].prompt);
  EXPECT_TRUE(query.starts_with("Some special magic numbers are hidden"));
  EXPECT_TRUE(std::regex_search(query, std::regex("What are all the special magic numbers for [a-z]+-[a-z]+, "
                                                  "[a-z]+-[a-z]+, [a-z]+-[a-z]+, and [a-z]+-[a-z]+ mentioned")));
  const std::string uuid = Text(Docs(RulerTask::kNiahMultikey3, {1500})[0].prompt);
  EXPECT_THAT(uuid, HasSubstr("special magic uuid for "));
  EXPECT_EQ(std::count(uuid.begin(), uuid.end(), '\n') > 5, true);  // a haystack of needle lines
}

TEST(RulerTest, VtChainsItsFiveVariablesAfterAnExample) {
  for (const RulerDoc& d : Docs(RulerTask::kVt, {1500, 4500}, 5, 2)) {
    const std::string text = Text(d.prompt);
    // The example first, then the task: the last intro opens the task.
    const size_t task = text.rfind("Memorize and track the chain(s)");
    ASSERT_NE(task, std::string::npos);
    EXPECT_GT(task, 0u);
    EXPECT_THAT(text.substr(0, task), HasSubstr("variables are assigned the value"));
    const std::string body = text.substr(task);
    std::smatch m;
    ASSERT_TRUE(std::regex_search(body, m, std::regex("VAR " + d.answers[0] + " = ([0-9]{5})\n")));
    const std::string value = m[1];
    size_t at = body.find("VAR " + d.answers[0] + " = " + value);
    for (size_t j = 1; j < d.answers.size(); ++j) {
      const size_t next = body.find("VAR " + d.answers[j] + " = VAR " + d.answers[j - 1] + " \n");
      ASSERT_NE(next, std::string::npos) << j;
      EXPECT_GT(next, at);
      at = next;
    }
    EXPECT_THAT(body, HasSubstr("Question: Find all variables that are assigned the value " + value));
    EXPECT_TRUE(body.ends_with("5 variables are assigned the value " + value + ", they are: "));
    ASSERT_EQ(d.depths.size(), 5u);
    EXPECT_TRUE(std::is_sorted(d.depths.begin(), d.depths.end()));
  }
}

// Counts of the words of `list`, "1. word 2. word ...".
std::map<std::string, int> ListCounts(const std::string& list) {
  std::map<std::string, int> counts;
  std::istringstream in(list);
  std::string number, word;
  while (in >> number >> word) ++counts[word];
  return counts;
}

TEST(RulerTest, CweAnswersAreTheMostCommonWords) {
  for (const RulerDoc& d : Docs(RulerTask::kCwe, {2500, 8000, 12000}, 2, 2)) {
    SCOPED_TRACE(d.length);
    const std::string text = Text(d.prompt);
    const std::string intro = "Memorize the ones that appear most often.\n";
    const size_t begin = text.rfind(intro) + intro.size();
    const size_t end = text.rfind("\nQuestion: What are the 10 most common words");
    ASSERT_LT(begin, end);
    EXPECT_THAT(text.substr(0, begin), HasSubstr("are: 1. "));  // the example and its answer
    std::map<std::string, int> counts = ListCounts(text.substr(begin, end - begin));
    const int common = d.length < 4096 ? 6 : 30;
    int others = 0;
    for (const std::string& a : d.answers) {
      EXPECT_EQ(counts[a], common) << a;
      counts.erase(a);
    }
    for (const auto& [w, n] : counts) others = std::max(others, n);
    EXPECT_LT(others, common);
    EXPECT_GT(counts.size(), 5u);
  }
}

TEST(RulerTest, FweAnswersAreTheThreeMostFrequentCodedWords) {
  for (const RulerDoc& d : Docs(RulerTask::kFwe, {1500, 4500, 9000}, 2, 2)) {
    SCOPED_TRACE(d.length);
    const std::string text = Text(d.prompt);
    const size_t begin = text.find("coded words.") + 12;
    const size_t end = text.rfind("\nQuestion: Do not provide");
    std::map<std::string, int> counts;
    std::istringstream in(text.substr(begin, end - begin));
    std::string w;
    while (in >> w) ++counts[w];
    std::vector<std::pair<int, std::string>> ranked;
    for (const auto& [word, n] : counts) {
      if (word.find('.') == std::string::npos) ranked.emplace_back(n, word);  // "..." is noise
    }
    std::sort(ranked.rbegin(), ranked.rend());
    ASSERT_GE(ranked.size(), 4u);
    const std::set<std::string> top = {ranked[0].second, ranked[1].second, ranked[2].second};
    EXPECT_EQ(top, std::set<std::string>(d.answers.begin(), d.answers.end()));
    EXPECT_GT(ranked[2].first, ranked[3].first);
    EXPECT_GT(counts["..."], ranked[0].first);
    for (const std::string& a : d.answers) EXPECT_TRUE(std::regex_match(a, std::regex("[a-z]{6}")));
  }
}

TEST(RulerTest, TheChatTemplateWrapsThePromptBeforeTheAnswerPrefix) {
  const auto chat = ChatTemplate::FromJinja(
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
      "'<|im_end|>' + '\\n'}}{% endfor %}");
  ASSERT_TRUE(chat.ok());
  const auto rendered = chat->Render({{"user", "X"}}, /*add_generation_prompt=*/true);
  ASSERT_TRUE(rendered.ok());
  const size_t x = rendered->text.find('X');
  PromptFormat f;
  f.head = rendered->text.substr(0, x);
  f.tail = rendered->text.substr(x + 1);
  f.head_ids = {testing::kImStart};
  for (const char c : std::string("user\n")) f.head_ids.push_back(c);
  const std::string text = Text(Docs(RulerTask::kNiahSingle2, {1500}, 1, 1, f)[0].prompt);
  EXPECT_TRUE(text.starts_with("<|im_start|>user\nA special magic number")) << text.substr(0, 40);
  EXPECT_THAT(text, HasSubstr("mentioned in the provided text?<|im_end|>\n<|im_start|>assistant\n The special magic "
                              "number for "));
  // Without a chat template (the byte tokenizer has none): the task's text alone.
  auto base = RulerPromptFormat(Bytes());
  ASSERT_TRUE(base.ok()) << base.status();
  EXPECT_TRUE(base->head.empty() && base->tail.empty() && base->head_ids.empty());
}

TEST(RulerTest, RefusesWhatALengthCannotHoldAndEssaysWithoutAHaystack) {
  RulerOptions o;
  o.tasks = {RulerTask::kVt};
  o.lengths = {300};
  auto short_doc = RulerDocs(Bytes(), {}, "", o);
  EXPECT_EQ(short_doc.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(short_doc.status().message()), HasSubstr("300 tokens cannot hold vt's prompt"));
  o.tasks = {RulerTask::kNiahSingle2};
  o.lengths = {1500};
  auto no_essay = RulerDocs(Bytes(), {}, "", o);
  EXPECT_EQ(no_essay.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(no_essay.status().message()), HasSubstr("required by niah_single_2"));
  EXPECT_TRUE(RulerNeedsHaystack({}));
  EXPECT_TRUE(RulerNeedsHaystack({RulerTask::kVt, RulerTask::kNiahMultivalue}));
  EXPECT_FALSE(RulerNeedsHaystack({RulerTask::kNiahSingle1, RulerTask::kNiahMultikey2, RulerTask::kNiahMultikey3,
                                   RulerTask::kVt, RulerTask::kCwe, RulerTask::kFwe}));
}

TEST(RulerTest, EffectiveLengthIsTheLongestLengthAboveTheThresholdWithEveryShorterOne) {
  SuiteResult r;
  EXPECT_EQ(r.effective_length(), std::nullopt);
  auto score = [](RulerTask t, int64_t length, double s) { return RulerScore{t, length, s, 10}; };
  // Averages: 4K 90, 8K 85.6 (the threshold itself counts, as Llama-2-7B's 4K does), 16K 80, 32K 95.
  r.ruler = {score(RulerTask::kVt, 4096, 100),  score(RulerTask::kVt, 8192, 85.6), score(RulerTask::kVt, 16384, 70),
             score(RulerTask::kVt, 32768, 100), score(RulerTask::kCwe, 4096, 80),  score(RulerTask::kCwe, 8192, 85.6),
             score(RulerTask::kCwe, 16384, 90), score(RulerTask::kCwe, 32768, 90)};
  const std::vector<std::pair<int64_t, double>> want = {{4096, 90}, {8192, 85.6}, {16384, 80}, {32768, 95}};
  EXPECT_EQ(r.averages(), want);
  EXPECT_EQ(r.effective_length(), 8192);  // 32K is above it again, but 16K is not
  r.threshold = 95;
  EXPECT_EQ(r.effective_length(), 0);  // the shortest falls below
  r.threshold = 0;
  EXPECT_EQ(r.effective_length(), 32768);
  const nlohmann::json j = EvalReportJson({{EvalSuite::kRuler, r}});
  EXPECT_EQ(j["ruler"]["scores"].size(), 8u);
  EXPECT_EQ(j["ruler"]["scores"][0]["task"], "vt");
  EXPECT_EQ(j["ruler"]["averages"][2]["length"], 16384);
  EXPECT_EQ(j["ruler"]["effective_length"], 32768);
  EXPECT_EQ(RulerTaskNamed("niah_multikey_3"), RulerTask::kNiahMultikey3);
  EXPECT_EQ(RulerTaskNamed("qa_1"), std::nullopt);
  EXPECT_EQ(SuiteNamed("ruler"), EvalSuite::kRuler);
}

}  // namespace
}  // namespace oomb
