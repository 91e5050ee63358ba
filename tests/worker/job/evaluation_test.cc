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
  JobConfig spec;
  spec.model.path = model;
  spec.model.dtype = ModelDtype::kFloat32;
  spec.method.lora.rank = 4;
  spec.data.train = dir + "/train.jsonl";
  spec.data.validation = dir + "/validation.jsonl";
  spec.data.max_seq_len = 1536;
  spec.training.max_steps = 3;
  spec.training.warmup_steps = 0;
  spec.memory.chunk_tokens = 512;
  spec.checkpoint.every_steps = 0;
  spec.resources.device = "cpu";
  spec.evaluation.suites = {"positions", "passkey", "needle"};
  spec.evaluation.every_steps = 2;
  spec.evaluation.lengths = {384};
  spec.evaluation.depths = 2;
  spec.evaluation.haystack = austen;

  RunOptions options;
  options.files = FileAccess::Unconfined();
  options.checkpoint_dir = testing::MakeDirs(dir + "/out");
  options.devices = {"cpu"};
  std::vector<int64_t> evaluated;
  options.on_step = [&](const StepReport& p) {
    if (!p.evaluation.has_value()) return;
    evaluated.push_back(p.step);
    const EvalReport& e = *p.evaluation;
    ASSERT_EQ(e.positions.size(), 2u);  // [0, 1K) and [1K, 2K) of the 1500-token sample
    EXPECT_EQ(e.positions[0].tokens, 1024);
    EXPECT_EQ(e.positions[1].tokens, 475);
    EXPECT_GT(e.positions[0].loss, 0);
    for (const auto* cells : {&e.passkey, &e.needle}) {
      ASSERT_EQ(cells->size(), 2u);  // depths 0 and 1 at 384 tokens, one trial each
      EXPECT_EQ((*cells)[0].length, 384);
      EXPECT_EQ((*cells)[1].depth, 1.0);
      EXPECT_EQ((*cells)[0].trials, 1);
    }
  };
  auto r = RunJob(spec, options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(evaluated, (std::vector<int64_t>{2, 3}));  // every 2nd step, and the last

  std::ifstream metrics(dir + "/out/metrics.jsonl");
  std::string line;
  std::vector<int64_t> logged;
  while (std::getline(metrics, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (!j.contains("evaluation")) continue;
    logged.push_back(j["step"].get<int64_t>());
    EXPECT_EQ(j["evaluation"]["positions"].size(), 2u);
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
  JobConfig spec;
  spec.model.path = model;
  spec.model.dtype = ModelDtype::kFloat32;
  spec.data.train = dir + "/train.jsonl";
  spec.data.max_seq_len = 64;
  spec.training.max_steps = 1;
  spec.resources.device = "cpu";
  spec.evaluation.suites = {"passkey"};
  spec.evaluation.lengths = {20};
  RunOptions options;
  options.files = FileAccess::Unconfined();
  options.checkpoint_dir = testing::MakeDirs(dir + "/out");
  options.devices = {"cpu"};
  int steps = 0;
  options.on_step = [&](const StepReport&) { ++steps; };
  auto r = RunJob(spec, options);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), ::testing::HasSubstr("evaluation.lengths: 20 tokens cannot hold"));
  EXPECT_EQ(steps, 0);
}

}  // namespace
}  // namespace oomb
