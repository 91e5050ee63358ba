// EstimateJob's step time (worker/plan/step_time.h): the work the chunk-recurrent trainer does,
// counted by hand for small cases, times made-up rates. The rates' measurement and the
// prediction against measured steps: tests/python/test_estimate.py (CPU) and bench/results
// (GPU).
#include "worker/plan/step_time.h"

#include <gtest/gtest.h>

namespace oomb {
namespace {

constexpr int64_t kC = 64;  // chunk tokens
constexpr int64_t kL = 3;   // layers

ModelConfig Config() {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.vocab_size = 100;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_layers = kL;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  return c;
}

EngineRates Rates() {
  EngineRates r;
  r.chunk_tokens = kC;
  r.layer_forward_s = 1;
  r.layer_train_s = 10;
  r.head_train_s = 100;
  r.past_forward_s_per_pair = 1e-3;
  r.past_backward_s_per_pair = 1e-2;
  return r;
}

MemoryPlan Plan(int64_t T) {
  MemoryPlan p;
  p.seq_len = T;
  p.chunk_tokens = kC;
  return p;
}

JobConfig Spec() {
  JobConfig s;
  s.memory.chunk_tokens = kC;
  return s;
}

constexpr double kC2 = static_cast<double>(kC) * kC;

TEST(StepTimeTest, OneChunkIsStageTwoOnly) {
  const StepTime t = *EstimateStepTime(Config(), Spec(), Plan(kC), Rates());
  EXPECT_DOUBLE_EQ(t.seconds, kL * 10 + 100);
  EXPECT_DOUBLE_EQ(t.attention_s, 0);
}

TEST(StepTimeTest, ASequenceShorterThanAChunkIsOneChunkOfItsLength) {
  MemoryPlan plan = Plan(kC);
  plan.chunk_tokens = 16 * kC;  // what memory.chunk_tokens auto may choose for a short sequence
  EXPECT_EQ(StepChunkTokens(plan), kC);
  EXPECT_DOUBLE_EQ(EstimateStepTime(Config(), Spec(), plan, Rates())->seconds, kL * 10 + 100);
}

TEST(StepTimeTest, FourChunksCountBothStagesAndThePast) {
  // Stage 1: chunks 0..2 through the layers; stage 2: all 4 with the LM head. Past pairs per
  // layer: chunk i reads i C keys for each of its C queries; stage 1 forward 0+1+2, stage 2
  // forward and backward 0+1+2+3 (in C^2).
  const StepTime t = *EstimateStepTime(Config(), Spec(), Plan(4 * kC), Rates());
  const double attention = kL * kC2 * ((3 + 6) * 1e-3 + 6 * 1e-2);
  EXPECT_NEAR(t.attention_s, attention, 1e-9);
  EXPECT_NEAR(t.seconds, kL * (3 * 1 + 4 * 10) + 4 * 100 + attention, 1e-9);
}

TEST(StepTimeTest, SwappedChunksSkipStageTwosForwardOverThePast) {
  MemoryPlan plan = Plan(4 * kC);
  plan.swap_chunks = 2;  // chunks 1 and 2 (the latest of 0..2)
  EngineRates rates = Rates();
  rates.host_copy_bytes_per_s = 1e6;
  const StepTime t = *EstimateStepTime(Config(), Spec(), plan, rates);
  EXPECT_NEAR(t.attention_s, kL * kC2 * ((3 + 0 + 3) * 1e-3 + 6 * 1e-2), 1e-9);
  // Their records (C x q_dim bfloat16 outputs and C x heads float32 log-sum-exps) down and back.
  const double record = kC * 32 * 2 + kC * 4 * 4;
  EXPECT_NEAR(t.host_copy_s, 2 * 2 * kL * record / 1e6, 1e-12);
}

TEST(StepTimeTest, AWindowBoundsThePast) {
  ModelConfig c = Config();
  c.sliding_window = kC;
  c.sliding_layers = {true, false, true};
  const StepTime t = *EstimateStepTime(c, Spec(), Plan(4 * kC), Rates());
  // A windowed layer's chunk i >= 1 reads C - 1 - t past keys at query t: C (C - 1) / 2.
  const double windowed = kC * (kC - 1) / 2.0;
  const double pairs_fwd = 2 * (2 * windowed + 3 * windowed) + 1 * 9 * kC2;
  const double pairs_bwd = 2 * 3 * windowed + 1 * 6 * kC2;
  EXPECT_NEAR(t.attention_s, pairs_fwd * 1e-3 + pairs_bwd * 1e-2, 1e-9);
}

TEST(StepTimeTest, RanksShareTheBatch) {
  JobConfig job = Spec();
  job.training.batch_sequences = 3;
  const double one = EstimateStepTime(Config(), Spec(), Plan(kC), Rates())->seconds;
  EXPECT_DOUBLE_EQ(EstimateStepTime(Config(), job, Plan(kC), Rates())->seconds, 3 * one);
  job.resources.gpus = 2;  // sequences 0 and 2 on rank 0
  EXPECT_DOUBLE_EQ(EstimateStepTime(Config(), job, Plan(kC), Rates())->seconds, 2 * one);
  job.resources.gpus = 4;  // two tensor-parallel groups of 2: sequences 0 and 2 on group 0
  job.parallel.tensor = 2;
  EXPECT_DOUBLE_EQ(EstimateStepTime(Config(), job, Plan(kC), Rates())->seconds, 2 * one);
  job.parallel.tensor = 4;  // one group: every sequence
  EXPECT_DOUBLE_EQ(EstimateStepTime(Config(), job, Plan(kC), Rates())->seconds, 3 * one);
}

TEST(StepTimeTest, SpacoRunsEveryChunkInStageOneAndAFractionInStageTwo) {
  JobConfig job = Spec();
  job.chunk_fraction = 0.5;
  const StepTime t = *EstimateStepTime(Config(), job, Plan(2 * kC), Rates());
  const double attention = kL * kC2 * (1e-3 + 0.5 * (1e-3 + 1e-2));
  EXPECT_NEAR(t.seconds, kL * (2 * 1 + 0.5 * 2 * 10) + (0.5 * 2 + 2.0 / 3) * 100 + attention, 1e-9);
}

TEST(StepTimeTest, WhatIsNotModelledSaysWhy) {
  JobConfig sparse = Spec();
  sparse.sparse = JobConfig::Sparse{};
  EXPECT_EQ(EstimateStepTime(Config(), sparse, Plan(kC), Rates()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  MemoryPlan other = Plan(4 * kC);
  other.chunk_tokens = 2 * kC;
  const absl::Status mismatch = EstimateStepTime(Config(), Spec(), other, Rates()).status();
  EXPECT_EQ(mismatch.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(mismatch.message().find("chunks of 64"), std::string::npos) << mismatch;
}

}  // namespace
}  // namespace oomb
