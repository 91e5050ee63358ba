// A job's evaluation section (job_spec.proto EvaluationSpec) through RunJob on the real
// SmolLM2-135M-Instruct: the suites run after every every_steps-th step and after the last, on
// the model being trained; their results reach the step reports and metrics.jsonl. Skips
// without the test data.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

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

}  // namespace
}  // namespace oomb
