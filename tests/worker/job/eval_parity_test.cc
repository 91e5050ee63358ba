// `oombd model eval` (EvaluateModel, the function behind it) against transformers on the real
// SmolLM2-135M-Instruct: the mean next-token loss of the same pre-tokenized samples (ids from
// HF's tokenizer, written as {"input_ids"} JSONL, so tokenization is not in question) agrees to
// 1e-4 in float32, with the chunked paged forward (chunks smaller than a sample, and one chunk
// per sample). Skips without the venv or the model (scripts/fetch_test_data.sh).
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

TEST(EvalParityTest, SmolLM2LossEqualsTransformers) {
  const std::string model = testing::DataDir() + "/models/SmolLM2-135M-Instruct";
  const std::string text = testing::DataDir() + "/texts/austen/emma.txt";
  const std::string python = testing::VenvPython();
  if (python.empty() || !std::filesystem::exists(model + "/model.safetensors") || !std::filesystem::exists(text)) {
    GTEST_SKIP() << "needs the venv and " << model;
  }
  const std::string dir = testing::ScratchDir("eval_parity");
  const std::string data = dir + "/samples.jsonl", ref = dir + "/reference.json";
  // Two samples (300 + 212 = 512 tokens): the loss is the mean over both samples' labels.
  const std::string cmd = python + " " + testing::SourceDir() + "/tests/worker/job/hf_eval_reference.py " + model +
                          " " + text + " " + data + " 300 212 > " + ref + " 2>" + dir + "/stderr.txt";
  ASSERT_EQ(testing::RunCommand(cmd), 0) << cmd;
  std::ifstream in(ref);
  const nlohmann::json want = nlohmann::json::parse(in);
  for (const int64_t chunk : {128, 4096}) {
    EvalOptions o;
    o.model_dir = model;
    o.data_path = data;
    o.max_tokens = 512;
    o.chunk_tokens = chunk;
    o.dtype = "float32";
    o.device = "cpu";
    auto got = EvaluateModel(o);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->tokens, want["tokens"].get<int64_t>());
    EXPECT_EQ(got->samples, 2);
    const double hf = want["loss"].get<double>();
    std::cout << "chunk " << chunk << ": oomb " << got->mean_loss << " transformers " << hf << " |diff| "
              << std::abs(got->mean_loss - hf) << "\n";
    EXPECT_NEAR(got->mean_loss, hf, 1e-4);
  }
}

}  // namespace
}  // namespace oomb
