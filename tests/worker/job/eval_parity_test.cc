// `oombd model eval` (EvaluateModel, the function behind it) against transformers on the real
// SmolLM2-135M-Instruct: the mean next-token loss of the same pre-tokenized samples (ids from
// HF's tokenizer, written as {"input_ids"} JSONL, so tokenization is not in question) agrees to
// 1e-4 in float32, with the chunked paged forward (chunks smaller than a sample, and one chunk
// per sample); so does the loss by position bucket (the positions suite). Skips without the
// venv or the model (scripts/fetch_test_data.sh).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/worker/test_env.h"
#include "worker/job/model_tools.h"

namespace oomb {
namespace {

// transformers' loss on samples of `lengths` tokens of `text` (hf_eval_reference.py, with
// `env` before it), which it writes pre-tokenized to `dir`/samples.jsonl; null on failure
// (a test failure is recorded).
nlohmann::json HfEvalReference(const std::string& dir, const std::string& model, const std::string& text,
                               const std::string& lengths, const std::string& env = "") {
  const std::string ref = dir + "/reference.json";
  const std::string cmd = env + testing::VenvPython() + " " + testing::SourceDir() +
                          "/tests/worker/job/hf_eval_reference.py " + model + " " + text + " " + dir +
                          "/samples.jsonl " + lengths + " > " + ref + " 2>" + dir + "/stderr.txt";
  if (testing::RunCommand(cmd) != 0) {
    ADD_FAILURE() << cmd;
    return nullptr;
  }
  std::ifstream in(ref);
  return nlohmann::json::parse(in);
}

TEST(EvalParityTest, SmolLM2LossEqualsTransformers) {
  const std::string model = testing::DataDir() + "/models/SmolLM2-135M-Instruct";
  const std::string text = testing::DataDir() + "/texts/austen/emma.txt";
  const std::string python = testing::VenvPython();
  if (python.empty() || !std::filesystem::exists(model + "/model.safetensors") || !std::filesystem::exists(text)) {
    GTEST_SKIP() << "needs the venv and " << model;
  }
  const std::string dir = testing::ScratchDir("eval_parity");
  const std::string data = dir + "/samples.jsonl";
  // Two samples (1300 + 212 tokens): the loss is the mean over both samples' labels; positions
  // fall in the buckets [0, 1024) and [1024, 2048).
  const nlohmann::json want = HfEvalReference(dir, model, text, "1300 212");
  ASSERT_FALSE(want.is_null());
  for (const int64_t chunk : {512, 4096}) {
    EvalOptions o;
    o.model_dir = model;
    o.suites = {EvalSuite::kPositions};
    o.data_path = data;
    o.chunk_tokens = chunk;
    o.dtype = "float32";
    o.device = "cpu";
    auto got = EvaluateModel(o);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->tokens, want["tokens"].get<int64_t>());
    EXPECT_EQ(got->samples, 2);
    const std::vector<PositionLoss>& positions = got->suites.at(EvalSuite::kPositions).buckets;
    const double hf = want["loss"].get<double>();
    std::cout << "chunk " << chunk << ": oomb " << got->mean_loss << " transformers " << hf << " |diff| "
              << std::abs(got->mean_loss - hf) << "\n";
    EXPECT_NEAR(got->mean_loss, hf, 1e-4);
    const nlohmann::json& buckets = want["positions"];
    ASSERT_EQ(positions.size(), buckets.size());
    int64_t hits = 0;
    for (const PositionLoss& p : positions) hits += p.hits;
    // The argmax the retrieval suites score by: the same tokens but for near-ties.
    EXPECT_NEAR(hits, want["hits"].get<int64_t>(), 2);
    for (size_t b = 0; b < buckets.size(); ++b) {
      EXPECT_EQ(positions[b].begin, b == 0 ? 0 : int64_t{512} << b);
      EXPECT_EQ(positions[b].tokens, buckets[b]["tokens"].get<int64_t>()) << "bucket " << b;
      EXPECT_NEAR(positions[b].loss, buckets[b]["loss"].get<double>(), 1e-4) << "bucket " << b;
    }
  }
}

// Gemma-3-270M from its Q4_K_M GGUF (scripts/fetch_test_data.sh): 15 of its 18 layers attend a
// window of 512 tokens, so a 900-token sample is scored partly outside the window, in chunks
// smaller than the window and in one chunk. The loss equals transformers' to 1e-4 (float32) and
// the next-token argmax (greedy decoding's choice) agrees position by position but for near-ties.
TEST(EvalParityTest, Gemma3LossWithSlidingWindowsEqualsTransformers) {
  const std::string model = testing::DataDir() + "/models/gemma-3-270m";
  const std::string text = testing::DataDir() + "/texts/austen/emma.txt";
  const std::string python = testing::VenvPython();
  if (python.empty() || !std::filesystem::exists(model + "/model.safetensors") || !std::filesystem::exists(text)) {
    GTEST_SKIP() << "needs the venv and " << model;
  }
  const std::string dir = testing::ScratchDir("eval_parity_gemma3");
  const std::string data = dir + "/samples.jsonl";
  const nlohmann::json want = HfEvalReference(dir, model, text, "900 200");
  ASSERT_FALSE(want.is_null());
  for (const int64_t chunk : {192, 4096}) {
    EvalOptions o;
    o.model_dir = model;
    o.suites = {EvalSuite::kPositions};
    o.data_path = data;
    o.chunk_tokens = chunk;
    o.dtype = "float32";
    o.device = "cpu";
    auto got = EvaluateModel(o);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->tokens, want["tokens"].get<int64_t>());
    const double hf = want["loss"].get<double>();
    std::cout << "chunk " << chunk << ": oomb " << got->mean_loss << " transformers " << hf << " |diff| "
              << std::abs(got->mean_loss - hf) << "\n";
    EXPECT_NEAR(got->mean_loss, hf, 1e-4);
    int64_t hits = 0;
    for (const PositionLoss& p : got->suites.at(EvalSuite::kPositions).buckets) hits += p.hits;
    EXPECT_NEAR(hits, want["hits"].get<int64_t>(), 2);
    EXPECT_GT(hits, 0);
  }
}

// `oombd model generate` on Gemma-3-270M: the prompt encoded by oomb's tokenizer (Gemma's
// byte_fallback BPE, <bos> first) and its greedy continuation are transformers' own, token for token.
TEST(EvalParityTest, Gemma3GreedyContinuationEqualsTransformers) {
  const std::string model = testing::DataDir() + "/models/gemma-3-270m";
  const std::string python = testing::VenvPython();
  if (python.empty() || !std::filesystem::exists(model + "/model.safetensors")) {
    GTEST_SKIP() << "needs the venv and " << model;
  }
  const std::string prompt = "Paris is the capital of";
  const std::string dir = testing::ScratchDir("generate_parity_gemma3");
  const std::string cmd = python + " " + testing::SourceDir() + "/tests/worker/job/hf_generate_reference.py " + model +
                          " '" + prompt + "' 10 > " + dir + "/reference.json 2>" + dir + "/stderr.txt";
  ASSERT_EQ(testing::RunCommand(cmd), 0) << cmd;
  std::ifstream in(dir + "/reference.json");
  const nlohmann::json want = nlohmann::json::parse(in);
  GenerateOptions o;
  o.model_dir = model;
  o.prompt = prompt;
  o.max_new_tokens = 10;
  o.prefill_chunk_tokens = 3;  // the prompt in several chunks over the cache
  o.device = "cpu";
  auto got = GreedyGenerate(o);
  ASSERT_TRUE(got.ok()) << got.status();
  std::cout << "oomb: '" << got->text << "'; transformers: '" << want["text"].get<std::string>() << "'\n";
  EXPECT_EQ(got->prompt_ids, want["prompt_ids"].get<std::vector<int32_t>>());
  EXPECT_EQ(got->new_ids, want["new_ids"].get<std::vector<int32_t>>());
  EXPECT_EQ(got->text, want["text"].get<std::string>());
}

// --rope-scaling (EvalOptions::rope_scaling): the base model evaluated with YaRN x4 over its
// window, as a fine-tune will see it, gives transformers' loss with the same scaling; and not the
// loss without it.
TEST(EvalParityTest, RopeScalingOverrideEqualsTransformersWithTheSameScaling) {
  const std::string model = testing::DataDir() + "/models/SmolLM2-135M-Instruct";
  const std::string text = testing::DataDir() + "/texts/austen/emma.txt";
  const std::string python = testing::VenvPython();
  if (python.empty() || !std::filesystem::exists(model + "/model.safetensors") || !std::filesystem::exists(text)) {
    GTEST_SKIP() << "needs the venv and " << model;
  }
  const std::string dir = testing::ScratchDir("eval_parity_yarn");
  const std::string data = dir + "/samples.jsonl";
  const nlohmann::json want = HfEvalReference(dir, model, text, "1024", "OOMB_REF_YARN=4 ");
  ASSERT_FALSE(want.is_null());
  const double hf = want["loss"].get<double>();
  EvalOptions o;
  o.model_dir = model;
  o.data_path = data;
  o.chunk_tokens = 256;
  o.device = "cpu";
  auto plain = EvaluateModel(o);
  RopeScalingOverride yarn;
  yarn.type = RopeType::kYarn;
  yarn.factor = 4.0;
  o.rope_scaling = yarn;
  auto scaled = EvaluateModel(o);
  ASSERT_TRUE(plain.ok() && scaled.ok()) << plain.status() << scaled.status();
  std::cout << "YaRN x4: oomb " << scaled->mean_loss << " transformers " << hf << "; without: " << plain->mean_loss
            << "\n";
  EXPECT_NEAR(scaled->mean_loss, hf, 1e-4);
  EXPECT_GT(std::abs(plain->mean_loss - hf), 1e-3);
}

// The retrieval suites on the real model: every (length, depth) cell scored, in order, each
// document by the exact match of its answer; a missing input is refused naming the flag.
TEST(EvalSuitesOnSmolLM2Test, PasskeyAndNeedleScoreEveryCell) {
  const std::string model = testing::DataDir() + "/models/SmolLM2-135M-Instruct";
  const std::string text = testing::DataDir() + "/texts/austen/emma.txt";
  if (!std::filesystem::exists(model + "/model.safetensors") || !std::filesystem::exists(text)) {
    GTEST_SKIP() << "needs " << model;
  }
  EvalOptions o;
  o.model_dir = model;
  o.loss = false;
  o.suites = {EvalSuite::kPasskey, EvalSuite::kNeedle};
  o.lengths = {256, 512};
  o.depths = 2;
  o.trials = 2;
  o.haystack = text;
  o.chunk_tokens = 128;
  o.device = "cpu";
  auto got = EvaluateModel(o);
  ASSERT_TRUE(got.ok()) << got.status();
  for (const auto* cells : {&got->suites.at(EvalSuite::kPasskey).cells, &got->suites.at(EvalSuite::kNeedle).cells}) {
    ASSERT_EQ(cells->size(), 4u);
    for (size_t i = 0; i < cells->size(); ++i) {
      EXPECT_EQ((*cells)[i].length, i < 2 ? 256 : 512);
      EXPECT_EQ((*cells)[i].depth, i % 2 == 0 ? 0.0 : 1.0);
      EXPECT_EQ((*cells)[i].trials, 2);
      EXPECT_LE((*cells)[i].correct, 2);
    }
  }
  EXPECT_EQ(got->samples, 0);  // no --data, no loss suite
  o.suites = {EvalSuite::kNeedle};
  o.haystack.clear();
  EXPECT_THAT(std::string(EvaluateModel(o).status().message()), ::testing::HasSubstr("--haystack: required"));
}

}  // namespace
}  // namespace oomb
