// A job's evaluation section (job_spec.proto EvaluationSpec) through RunJob on the real
// SmolLM2-135M-Instruct: the suites run after every every_steps-th step and after the last, on
// the model being trained; their results reach the step reports and metrics.jsonl. Skips
// without the test data. The ruler suite runs end to end on a tiny random model with a
// byte-level tokenizer and a ChatML template (hermetic): every task generated, scored and
// logged; and a job training on data a suite's generator wrote, while evaluating it, is warned.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "tests/worker/data/test_tokenizer.h"
#include "tests/worker/test_env.h"
#include "tests/worker/tiny_model.h"
#include "worker/common/file_access.h"
#include "worker/job/executor.h"

namespace oomb {
namespace {

TEST(EvaluationSectionTest, SuitesRunEveryNStepsAndAtTheEndOnTheModelBeingTrained) {
  const std::string model = testing::DataDir() + "/models/SmolLM2-135M-Instruct";
  const std::string austen = testing::DataDir() + "/texts/austen/emma.txt";
  if (!std::filesystem::exists(model + "/model.safetensors") || !std::filesystem::exists(austen)) {
    GTEST_SKIP() << "needs " << model;
  }
  const std::string dir = testing::ScratchDir("evaluation_section");
  testing::WriteInputIdsJsonl(dir + "/train.jsonl", testing::RandomDocs(2, 200, 200, 49152, 5));
  testing::WriteInputIdsJsonl(dir + "/validation.jsonl", testing::RandomDocs(1, 1500, 1500, 49152, 6));
  JobConfig job;
  job.model.path = model;
  job.model.dtype = ModelDtype::kFloat32;
  job.method.lora.rank = 4;
  job.data.train = dir + "/train.jsonl";
  job.data.validation = dir + "/validation.jsonl";
  job.data.max_seq_len = 1536;
  job.training.max_steps = 3;
  job.training.warmup_steps = 0;
  job.memory.chunk_tokens = 512;
  job.checkpoint.every_steps = 0;
  job.resources.device = "cpu";
  job.evaluation.suites = {EvalSuite::kPositions, EvalSuite::kPasskey, EvalSuite::kNeedle};
  job.evaluation.every_steps = 2;
  job.evaluation.lengths = {384};
  job.evaluation.depths = 2;
  job.evaluation.haystack = austen;

  RunOptions options;
  options.files = FileAccess::Unconfined();
  options.checkpoint_dir = testing::MakeDirs(dir + "/out");
  options.devices = {"cpu"};
  std::vector<int64_t> evaluated;
  options.on_step = [&](const StepReport& p) {
    if (!p.evaluation.has_value()) return;
    evaluated.push_back(p.step);
    const EvalReport& e = *p.evaluation;
    ASSERT_EQ(e.size(), 3u);
    const std::vector<PositionLoss>& buckets = e.at(EvalSuite::kPositions).buckets;
    ASSERT_EQ(buckets.size(), 2u);  // [0, 1K) and [1K, 2K) of the 1500-token sample
    EXPECT_EQ(buckets[0].tokens, 1024);
    EXPECT_EQ(buckets[1].tokens, 475);
    EXPECT_GT(buckets[0].loss, 0);
    for (const auto* cells : {&e.at(EvalSuite::kPasskey).cells, &e.at(EvalSuite::kNeedle).cells}) {
      ASSERT_EQ(cells->size(), 2u);  // depths 0 and 1 at 384 tokens, one trial each
      EXPECT_EQ((*cells)[0].length, 384);
      EXPECT_EQ((*cells)[1].depth, 1.0);
      EXPECT_EQ((*cells)[0].trials, 1);
    }
  };
  auto r = RunJob(job, options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(evaluated, (std::vector<int64_t>{2, 3}));  // every 2nd step, and the last

  std::ifstream metrics(dir + "/out/metrics.jsonl");
  std::string line;
  std::vector<int64_t> logged;
  while (std::getline(metrics, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (!j.contains("evaluation")) continue;
    logged.push_back(j["step"].get<int64_t>());
    EXPECT_EQ(j["evaluation"]["positions"]["buckets"].size(), 2u);
    EXPECT_EQ(j["evaluation"]["passkey"]["cells"].size(), 2u);
    EXPECT_TRUE(j["evaluation"]["needle"].contains("accuracy"));
  }
  EXPECT_EQ(logged, (std::vector<int64_t>{2, 3}));
}

TEST(EvaluationSectionTest, ALengthTooShortForThePromptFailsBeforeTraining) {
  const std::string model = testing::DataDir() + "/models/SmolLM2-135M-Instruct";
  if (!std::filesystem::exists(model + "/model.safetensors")) GTEST_SKIP() << "needs " << model;
  const std::string dir = testing::ScratchDir("evaluation_section_short");
  testing::WriteInputIdsJsonl(dir + "/train.jsonl", testing::RandomDocs(1, 64, 64, 49152, 5));
  JobConfig job;
  job.model.path = model;
  job.model.dtype = ModelDtype::kFloat32;
  job.data.train = dir + "/train.jsonl";
  job.data.max_seq_len = 64;
  job.training.max_steps = 1;
  job.resources.device = "cpu";
  job.evaluation.suites = {EvalSuite::kPasskey};
  job.evaluation.lengths = {20};
  RunOptions options;
  options.files = FileAccess::Unconfined();
  options.checkpoint_dir = testing::MakeDirs(dir + "/out");
  options.devices = {"cpu"};
  int steps = 0;
  options.on_step = [&](const StepReport&) { ++steps; };
  auto r = RunJob(job, options);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), ::testing::HasSubstr("evaluation.lengths: 20 tokens cannot hold"));
  EXPECT_EQ(steps, 0);
}

// A random tiny Llama over the byte tokenizer's 258 ids, with tokenizer.json and a ChatML
// template whose end of turn (<|im_end|>) is the end-of-sequence token.
std::string TinyChatModel(const std::string& dir) {
  const std::string model = dir + "/model";
  std::filesystem::create_directories(model);
  testing::WriteTinyModelDir(model, testing::TinyLlamaConfig(/*vocab=*/258), at::kFloat, /*seed=*/3);
  std::ofstream(model + "/tokenizer.json") << testing::ByteTokenizerJson(/*newline_merge=*/false);
  const nlohmann::json config = {
      {"eos_token", "<|im_end|>"},
      {"chat_template",
       "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
       "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"}};
  std::ofstream(model + "/tokenizer_config.json") << config.dump();
  return model;
}

// Invented prose for the essay tasks.
std::string WriteEssay(const std::string& dir) {
  std::string text;
  for (int i = 0; i < 20; ++i) {
    text +=
        "The ferry crossed the bay at dawn. Gulls followed it for a while! Did the captain wave from the bridge? "
        "Passengers drank tea in the warm cabin. The island grew larger with every minute. ";
  }
  std::ofstream(dir + "/essay.txt") << text;
  return dir + "/essay.txt";
}

TEST(EvaluationSectionTest, RulerRunsEveryTaskThroughGenerationOnATinyModel) {
  const std::string dir = testing::ScratchDir("evaluation_ruler");
  JobConfig job;
  job.model.path = TinyChatModel(dir);
  job.model.dtype = ModelDtype::kFloat32;
  job.method.type = TrainMethod::kEvaluate;
  job.data.max_seq_len = 2600;
  job.memory.chunk_tokens = 512;
  job.checkpoint.every_steps = 0;
  job.resources.device = "cpu";
  job.evaluation.suites = {EvalSuite::kRuler};
  job.evaluation.lengths = {2600};
  job.evaluation.haystack = WriteEssay(dir);
  job.evaluation.ruler_samples = 1;
  job.evaluation.ruler_threshold = 0;  // a random model scores 0 or so: every length is above 0

  RunOptions options;
  options.files = FileAccess::Unconfined();
  options.checkpoint_dir = testing::MakeDirs(dir + "/out");
  options.devices = {"cpu"};
  std::optional<EvalReport> report;
  options.on_step = [&](const StepReport& p) { report = p.evaluation; };
  auto r = RunJob(job, options);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(report.has_value());
  const SuiteResult& ruler = report->at(EvalSuite::kRuler);
  ASSERT_EQ(ruler.ruler.size(), std::size(kRulerTasks));
  for (size_t i = 0; i < ruler.ruler.size(); ++i) {
    EXPECT_EQ(ruler.ruler[i].task, kRulerTasks[i]);
    EXPECT_EQ(ruler.ruler[i].length, 2600);
    EXPECT_EQ(ruler.ruler[i].samples, 1);
    EXPECT_GE(ruler.ruler[i].score, 0);
    EXPECT_LE(ruler.ruler[i].score, 100);
  }
  EXPECT_EQ(ruler.effective_length(), 2600);

  std::ifstream metrics(dir + "/out/metrics.jsonl");
  std::string line;
  ASSERT_TRUE(std::getline(metrics, line));
  const nlohmann::json j = nlohmann::json::parse(line)["evaluation"]["ruler"];
  EXPECT_EQ(j["scores"].size(), 11u);
  EXPECT_EQ(j["scores"][10]["task"], "fwe");
  EXPECT_EQ(j["averages"][0]["length"], 2600);
  EXPECT_EQ(j["effective_length"], 2600);
  EXPECT_EQ(j["threshold"], 0.0);
}

TEST(EvaluationSectionTest, TrainingOnAnEvaluatedSuitesGeneratorIsWarned) {
  const std::string dir = testing::ScratchDir("evaluation_generator");
  {
    std::ofstream train(dir + "/train.jsonl");
    const std::vector<std::vector<int64_t>> docs = testing::RandomDocs(3, 64, 64, 256, 5);
    const char* marks[] = {"ruler/vt", "passkey", "ruler/cwe"};
    for (size_t i = 0; i < docs.size(); ++i) {
      train << nlohmann::json{{"input_ids", docs[i]}, {"generator", marks[i]}}.dump() << "\n";
    }
  }
  JobConfig job;
  job.model.path = TinyChatModel(dir);
  job.model.dtype = ModelDtype::kFloat32;
  job.method.lora.rank = 2;
  job.data.train = dir + "/train.jsonl";
  job.data.max_seq_len = 1200;
  job.training.max_steps = 1;
  job.training.warmup_steps = 0;
  job.memory.chunk_tokens = 512;
  job.checkpoint.every_steps = 0;
  job.resources.device = "cpu";
  job.evaluation.suites = {EvalSuite::kPasskey, EvalSuite::kRuler};
  job.evaluation.lengths = {1200};
  job.evaluation.depths = 1;
  job.evaluation.ruler_tasks = {RulerTask::kVt, RulerTask::kFwe};  // not cwe
  job.evaluation.ruler_samples = 1;
  RunOptions options;
  options.files = FileAccess::Unconfined();
  options.checkpoint_dir = testing::MakeDirs(dir + "/out");
  options.devices = {"cpu"};
  std::vector<std::string> warnings;
  options.on_warning = [&](const std::string& w) { warnings.push_back(w); };
  auto r = RunJob(job, options);
  ASSERT_TRUE(r.ok()) << r.status();
  const auto generators = std::count_if(warnings.begin(), warnings.end(), [](const std::string& w) {
    return w.find("written by the generators of suites this job evaluates") != std::string::npos;
  });
  ASSERT_EQ(generators, 1) << ::testing::PrintToString(warnings);
  for (const std::string& w : warnings) {
    if (w.find("generators of suites") == std::string::npos) continue;
    EXPECT_THAT(w, ::testing::HasSubstr("1 passkey, 1 ruler/vt"));
    EXPECT_THAT(w, ::testing::Not(::testing::HasSubstr("ruler/cwe")));  // cwe is not evaluated
  }
  // Evaluating other suites: no warning.
  job.evaluation.suites = {EvalSuite::kNeedle};
  job.evaluation.haystack = WriteEssay(dir);
  warnings.clear();
  options.checkpoint_dir = testing::MakeDirs(dir + "/out2");
  ASSERT_TRUE(RunJob(job, options).ok());
  for (const std::string& w : warnings) EXPECT_THAT(w, ::testing::Not(::testing::HasSubstr("generators of suites")));
}

}  // namespace
}  // namespace oomb
