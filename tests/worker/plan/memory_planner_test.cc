// The memory planner (worker/plan/memory_planner.h) against what the engine allocates on the
// CPU: for several tiny models, methods and chunk sizes, the plan's weights and trainable state
// equal the model's tensors to the byte, its page pools equal the executor's pools, and its
// activation term bounds the trainer's measured activation peak (one chunk's graph and
// temporaries) from above, and not by much. The 10% check of the whole peak is on the GPU
// (bench/bench_train.cc prints planned against measured; results committed under bench/results).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/worker/tiny_model.h"
#include "worker/hf/family.h"
#include "worker/paging/page_id.h"
#include "worker/paging/page_table.h"
#include "worker/plan/memory_planner.h"
#include "worker/session/training_session.h"
#include "worker/train/chunk_trainer.h"

namespace oomb {
namespace {

using ::testing::HasSubstr;

struct Case {
  const char* name;
  int64_t hidden, layers, heads, kv_heads, vocab;
  std::string method;  // lora | full
  double dropout;
  int64_t chunk, tokens;
  bool sparse = false;   // attention.mode: sparse, page_budget 8 of pages of 64
  bool qk_norm = false;  // Qwen3's per-head q/k norms, head_dim 2 x hidden / heads
  bool gemma = false;    // Gemma 3's layer (with q/k norms) and a window of 100 in every other layer
  bool moe = false;      // Qwen3-MoE's layer: 8 experts, 2 per token (LoRA on both expert banks)
};

int64_t Bytes(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

class PlannerVsTrainer : public ::testing::TestWithParam<Case> {};

ModelConfig CaseModel(const Case& k) {
  ModelConfig c = testing::TinyLlamaConfig(k.vocab, k.hidden, k.layers, k.heads, k.kv_heads);
  c.intermediate_size = k.hidden * 8 / 3;
  if (k.qk_norm || k.gemma) {
    c.qk_norm = true;
    c.head_dim = 2 * k.hidden / k.heads;
  }
  if (k.moe) {
    c.architecture = "Qwen3MoeForCausalLM";
    c.moe = MoeConfig{.experts = 8, .top_k = 2, .intermediate = k.hidden / 2, .renormalize = true};
    c.moe.layers.assign(k.layers, true);
  }
  if (k.gemma) {
    c.gemma_layers = true;
    c.sliding_window = 100;
    for (int64_t i = 0; i < k.layers; ++i) c.sliding_layers.push_back(i % 2 == 0);
    c.sliding_rope = RopeConfig{};
  }
  return c;
}

JobConfig CaseSpec(const Case& k) {
  JobConfig job;
  job.model.dtype = ModelDtype::kFloat32;
  job.method.type = k.method == "full" ? TrainMethod::kFull : TrainMethod::kLora;
  job.method.lora.rank = 8;
  job.method.lora.dropout = k.dropout;
  job.memory.chunk_tokens = k.chunk;
  job.memory.page_tokens = 64;
  job.data.max_seq_len = k.tokens;
  if (k.sparse) {
    job.sparse = JobConfig::Sparse{.page_budget = 8, .sink_pages = 1, .local_pages = 4};
  }
  return job;
}

// What training keeps besides the weights: the trainable parameters (LoRA's; full fine-tuning
// trains the weights themselves, which the plan counts once, as weights), their gradients and
// AdamW's two moments.
int64_t TrainableStateBytes(const Transformer& model, torch::optim::AdamW& adam, bool lora) {
  int64_t trainable = 0;
  for (auto& [name, p] : model.TrainableParameters()) trainable += (lora ? Bytes(p) : 0) + Bytes(p.grad());
  for (const auto& [key, state] : adam.state()) {
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(*state);
    trainable += Bytes(s.exp_avg()) + Bytes(s.exp_avg_sq());
  }
  return trainable;
}

TEST_P(PlannerVsTrainer, TermsMatchTheEngine) {
  const Case& k = GetParam();
  const ModelConfig c = CaseModel(k);
  const JobConfig job = CaseSpec(k);
  PlanTarget target;
  target.device = "cpu";
  target.device_bytes = target.host_bytes = int64_t{64} << 30;
  auto plan = PlanMemory(c, job, target);
  ASSERT_TRUE(plan.ok()) << plan.status();

  auto model = Transformer::Random(c, at::kFloat, at::kCPU, /*seed=*/1, /*init_std=*/0.05);
  int64_t weights = 0;
  for (const auto& [name, p] : model->BaseParameters()) weights += Bytes(p);
  EXPECT_EQ(plan->weights_bytes, weights);
  if (k.method == "lora") {
    LoraOptions lora;
    lora.rank = job.method.lora.rank;
    lora.dropout = k.dropout;
    ASSERT_TRUE(model->AddLora(lora, 2).ok());
  } else {
    model->EnableFullFineTuning();
  }

  // The engine as the executor builds it: plan, pools, trainer and AdamW (TrainingSession).
  SessionOptions options;
  options.machine = target;
  options.longest_sequence = k.tokens;
  auto session = TrainingSession::Create(model.get(), job, options);
  ASSERT_TRUE(session.ok()) << session.status();
  const PagePool& kv = *(*session)->pools().kv;
  const PagePool& grad = *(*session)->pools().grad;
  const int64_t P = job.memory.page_tokens;
  // The tokens that take pages: dense attention does not append the last chunk.
  const int64_t paged = k.sparse ? k.tokens : (k.tokens - 1) / k.chunk * k.chunk;
  // Every layer attending its whole past: ceil(T' / P) + 1 pages; sliding-window layers fewer.
  const PastReach reach{.windows = DescribeModel(c).Windows(), .chunk_tokens = job.memory.chunk_tokens};
  const int64_t all_pages = c.num_layers * ((paged + P - 1) / P + 1);
  EXPECT_EQ(kv.stats().capacity_pages, SequencePagesBound(paged, P, reach, c.num_layers));
  if (!DescribeModel(c).HasWindows()) {
    EXPECT_EQ(kv.stats().capacity_pages, all_pages);
  }
  if (std::string(k.name) == "gemma_c256") {   // a window of 100 before chunks of 256: 6 of 12 pages
    EXPECT_EQ(kv.stats().capacity_pages, 25);  // 13 (global layer) + 6 + 1 kept + 5 (a chunk, appended)
  }
  EXPECT_EQ(plan->kv_bytes, (kv.stats().capacity_pages + grad.stats().capacity_pages) * kv.stats().bytes_per_page);

  ChunkTrainer& trainer = (*session)->trainer();
  // (The trainer fails with RESOURCE_EXHAUSTED if the pools are smaller than what it holds.)
  const auto docs = testing::RandomDocs(1, k.tokens, k.tokens, c.vocab_size, 7);
  // Twice: the first sequence also allocates the parameters' .grad, which the plan counts as
  // trainable state, not activations.
  for (int i = 0; i < 2; ++i) {
    auto loss = trainer.TrainSequence(TokenSequence::FromDocument(docs[0]), 1.0 / k.tokens, 3);
    ASSERT_TRUE(loss.ok()) << loss.status();
  }
  torch::optim::AdamW& adam = (*session)->optimizer();
  adam.step();
  EXPECT_EQ(plan->trainable_state_bytes, TrainableStateBytes(*model, adam, k.method == "lora"));

  const int64_t measured = trainer.memory().activation_peak_bytes;
  const double ratio = static_cast<double>(plan->activation_bytes) / static_cast<double>(measured);
  std::printf("%-12s activations: planned %lld, measured %lld (ratio %.3f)\n", k.name,
              static_cast<long long>(plan->activation_bytes), static_cast<long long>(measured), ratio);
  // Never less than measured (admission must not accept what cannot run); on these tiny models
  // the transients of the attention, which the plan bounds rather than traces, are a large part,
  // so the bound is loose here. The 10% check is on the GPU with the real architecture (bench/).
  EXPECT_GE(ratio, 1.0) << "planned " << plan->activation_bytes << " measured " << measured;
  EXPECT_LE(ratio, 1.75) << "planned " << plan->activation_bytes << " measured " << measured;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, PlannerVsTrainer,
    ::testing::Values(Case{"lora_c256", 256, 2, 4, 2, 512, "lora", 0.0, 256, 1024},
                      Case{"lora_drop", 256, 2, 4, 2, 512, "lora", 0.1, 256, 1024},
                      Case{"full_c128", 192, 3, 6, 2, 384, "full", 0.0, 128, 768},
                      Case{"lora_c512", 256, 2, 8, 8, 512, "lora", 0.0, 512, 1536},
                      Case{"sparse_c256", 256, 2, 4, 2, 512, "lora", 0.0, 256, 2048, true},
                      Case{"qknorm_c256", 256, 2, 4, 2, 512, "lora", 0.0, 256, 1024, false, true},
                      Case{"qknorm_full", 192, 2, 6, 2, 384, "full", 0.0, 128, 768, false, true},
                      Case{"gemma_c256", 256, 2, 4, 2, 512, "lora", 0.0, 256, 1024, false, false, true},
                      Case{"gemma_full", 192, 2, 6, 2, 384, "full", 0.0, 128, 768, false, false, true},
                      // Sparse: the global layer selects pages, the sliding-window one attends
                      // densely over its window.
                      Case{"gemma_sparse", 256, 2, 4, 2, 512, "lora", 0.0, 256, 1024, true, false, true},
                      Case{"moe_c256", 256, 2, 4, 2, 512, "lora", 0.0, 256, 1024, false, true, false, true},
                      Case{"moe_full", 192, 2, 6, 2, 384, "full", 0.0, 128, 768, false, true, false, true}),
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

TEST(MemoryPlannerTest, LongestContextThatFitsAndTheLimitInWords) {
  ModelConfig c = testing::TinyLlamaConfig(512, 256, 2, 4, 2);
  JobConfig job;
  job.model.dtype = ModelDtype::kFloat32;
  job.data.max_seq_len = int64_t{1} << 30;
  PlanTarget target;
  target.device = "cpu";
  target.device_bytes = target.host_bytes = int64_t{8} << 30;
  auto plan = PlanMemory(c, job, target);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->fits);
  EXPECT_GT(plan->max_seq_len_that_fits, 0);
  EXPECT_LT(plan->max_seq_len_that_fits, job.data.max_seq_len);
  EXPECT_NE(plan->limit.find("the longest context that fits is " + std::to_string(plan->max_seq_len_that_fits)),
            std::string::npos)
      << plan->limit;
  // The boundary: the longest context fits, one more token does not (or lands on a page the
  // plan already counts).
  job.data.max_seq_len = plan->max_seq_len_that_fits;
  auto at = PlanMemory(c, job, target);
  ASSERT_TRUE(at.ok());
  EXPECT_TRUE(at->fits) << at->limit;
  EXPECT_LE(at->peak_device_bytes, at->device_capacity_bytes);
  job.data.max_seq_len += job.memory.page_tokens;
  auto over = PlanMemory(c, job, target);
  ASSERT_TRUE(over.ok());
  EXPECT_FALSE(over->fits);
  // KV bytes per token: K and V in float32 plus their float32 gradient pages, every layer.
  EXPECT_EQ(plan->kv_bytes_per_token, c.num_layers * 2 * c.kv_dim() * (4 + 4));
}

// model.router_aux_loss_coef weighs a mixture of experts' router loss: a dense model has none to
// weigh, and the field is refused by name; a mixture of experts plans with it.
TEST(MemoryPlannerTest, RouterAuxLossCoefNeedsARouter) {
  JobConfig job;
  job.model.path = "/models/dense";
  job.model.router_aux_loss_coef = 0.01;
  job.data.max_seq_len = 256;
  PlanTarget target;
  target.device = "cpu";
  target.device_bytes = target.host_bytes = int64_t{8} << 30;
  const absl::Status dense = PlanMemory(testing::TinyLlamaConfig(), job, target).status();
  EXPECT_TRUE(absl::IsInvalidArgument(dense)) << dense;
  EXPECT_THAT(std::string(dense.message()), HasSubstr("model.router_aux_loss_coef: /models/dense has no experts"));
  ModelConfig moe = testing::TinyLlamaConfig();
  moe.architecture = "Qwen3MoeForCausalLM";
  moe.moe = MoeConfig{.experts = 4, .top_k = 2, .intermediate = 16, .renormalize = true};
  moe.moe.layers.assign(moe.num_layers, true);
  job.method.lora.target_modules = {"q_proj", "v_proj"};
  EXPECT_TRUE(PlanMemory(moe, job, target).ok());
}

// Qwen2.5-7B's shapes (the GPU benchmarks' model).
ModelConfig Qwen7B() {
  ModelConfig c = testing::TinyLlamaConfig(152064, 3584, 28, 28, 4);
  c.intermediate_size = 18944;
  c.qkv_bias = true;
  return c;
}

// A bfloat16 LoRA job of T tokens with memory.chunk_tokens auto and kv_offload auto.
JobConfig AutoChunkJob(int64_t T, KvGradDtype grad_dtype) {
  JobConfig job;
  job.model.dtype = ModelDtype::kBFloat16;
  job.memory.kv_grad_dtype = grad_dtype;
  job.memory.kv_offload = KvOffload::kAuto;
  job.data.max_seq_len = T;
  job.memory.chunk_tokens = 0;
  return job;
}

// memory.chunk_tokens auto picks a chunk for the job's length; a longer sequence would get a
// smaller one, so the longest context the plan reports is the longest any candidate fits, not
// the picked chunk's own (shorter: a larger chunk's workspace leaves fewer pages on the GPU).
TEST(MemoryPlannerTest, AutoChunksLongestContextIsItsCandidatesLongest) {
  const ModelConfig c = Qwen7B();
  const PlanTarget h100{.device = "cuda:0", .device_bytes = int64_t{80} << 30, .host_bytes = int64_t{128} << 30};
  JobConfig job = AutoChunkJob(16384, KvGradDtype::kBFloat16);
  auto automatic = PlanMemory(c, job, h100);
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  int64_t longest = 0, picked_longest = 0;
  for (const int64_t chunk : AutoChunkCandidates(job.memory.page_tokens)) {
    JobConfig fixed = job;
    fixed.memory.chunk_tokens = chunk;
    auto plan = PlanMemory(c, fixed, h100);
    ASSERT_TRUE(plan.ok()) << plan.status();
    longest = std::max(longest, plan->max_seq_len_that_fits);
    if (chunk == automatic->chunk_tokens) picked_longest = plan->max_seq_len_that_fits;
  }
  EXPECT_GT(automatic->chunk_tokens, AutoChunkCandidates(job.memory.page_tokens).back());
  EXPECT_EQ(automatic->max_seq_len_that_fits, longest);
  EXPECT_GT(longest, picked_longest);
  // At that length auto picks a chunk that fits.
  job.data.max_seq_len = longest;
  auto there = PlanMemory(c, job, h100);
  ASSERT_TRUE(there.ok()) << there.status();
  EXPECT_TRUE(there->fits) << there->limit;
  EXPECT_LT(there->chunk_tokens, automatic->chunk_tokens);
}

// A mixture of experts on grouped products with LoRA (Qwen3-30B-A3B on an H200, LoRA r = 16 on
// attention and both banks, the defaults' targets): at 32K, chunks of 16384 leave less than a
// sixteenth of the device free unless backward recomputes the experts' gate_up product in some
// sparse layers; auto takes that chunk with the fewest such layers that fit, and says so. The
// plans of a given chunk (a spec's own memory.chunk_tokens) recompute nothing; nor does the CPU's
// plan (its experts run the loop, which keeps the products).
TEST(MemoryPlannerTest, AutoChunksRecomputeTheExpertsProductsWhereThatLetsALargerChunkFit) {
  const absl::StatusOr<ModelConfig> c = PresetConfig("qwen3-30b-a3b");
  ASSERT_TRUE(c.ok()) << c.status();
  const PlanTarget h200{.device = "cuda:0", .device_bytes = int64_t{143771} << 20, .host_bytes = int64_t{125} << 30};
  const JobConfig job = AutoChunkJob(32768, KvGradDtype::kFloat32);
  auto automatic = PlanMemory(*c, job, h200);
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  EXPECT_EQ(automatic->chunk_tokens, 16384);
  const int64_t n = automatic->expert_recompute_layers;
  EXPECT_GT(n, 0);
  EXPECT_LT(n, c->num_layers / 2);
  EXPECT_THAT(absl::StrJoin(automatic->choices, "\n"), HasSubstr("gate_up products recomputed in backward in"));
  const int64_t capacity = automatic->device_capacity_bytes, limit = capacity - capacity / 16;
  EXPECT_LE(automatic->peak_device_bytes, limit);
  const auto peak = [&](int64_t layers) {
    JobConfig fixed = job;
    fixed.memory.chunk_tokens = 16384;
    fixed.memory.expert_recompute_layers = layers;
    auto plan = PlanMemory(*c, fixed, h200);
    EXPECT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->expert_recompute_layers, layers);
    return plan->peak_device_bytes;
  };
  EXPECT_EQ(peak(n), automatic->peak_device_bytes);
  EXPECT_GT(peak(n - 1), limit);
  // Each such layer keeps 16384 tokens x 8 pairs x the gate_up product (2 x 768, bfloat16) less.
  EXPECT_EQ(peak(0) - peak(1), int64_t{16384} * 8 * 2 * 768 * 2);
  JobConfig given = job;
  given.memory.chunk_tokens = 16384;
  auto fixed = PlanMemory(*c, given, h200);
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  EXPECT_EQ(fixed->expert_recompute_layers, 0);
  auto cpu = PlanMemory(*c, job, PlanTarget{.device = "cpu", .device_bytes = int64_t{1} << 40, .host_bytes = 0});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(cpu->expert_recompute_layers, 0);
}

// The experts' path is one choice (RunsGroupedExperts) the model and the planner both take: on a
// GPU below compute capability 9.0 the model runs the loop, which keeps each pair's input row
// and activation besides, so the plan there is larger; before, the planner took every GPU for
// a Hopper and under-counted it. The choice itself: grouped only on 9.0 or more, in bfloat16 or
// float16, with inner sizes of 16-byte multiples.
TEST(MemoryPlannerTest, TheExpertsPathFollowsTheComputeCapability) {
  EXPECT_TRUE(RunsGroupedExperts({.cuda = true, .compute_capability = 90, .half_precision = true, .elem_bytes = 2},
                                 {2048, 768, 16}));
  EXPECT_FALSE(RunsGroupedExperts({.cuda = true, .compute_capability = 80, .half_precision = true, .elem_bytes = 2},
                                  {2048, 768, 16}));
  EXPECT_FALSE(RunsGroupedExperts({.cuda = true, .compute_capability = 90, .half_precision = false, .elem_bytes = 4},
                                  {2048, 768, 16}));
  EXPECT_FALSE(RunsGroupedExperts({.cuda = true, .compute_capability = 90, .half_precision = true, .elem_bytes = 2},
                                  {2048, 768, 12}));
  EXPECT_FALSE(RunsGroupedExperts({.cuda = false, .compute_capability = 0, .half_precision = true, .elem_bytes = 2},
                                  {2048, 768, 16}));
  const absl::StatusOr<ModelConfig> c = PresetConfig("qwen3-30b-a3b");
  ASSERT_TRUE(c.ok()) << c.status();
  JobConfig job = AutoChunkJob(16384, KvGradDtype::kFloat32);
  job.memory.chunk_tokens = 4096;
  PlanTarget hopper{.device = "cuda:0", .device_bytes = int64_t{143771} << 20, .host_bytes = int64_t{125} << 30};
  PlanTarget ampere = hopper;
  ampere.compute_capability = 80;
  auto grouped = PlanMemory(*c, job, hopper), loop = PlanMemory(*c, job, ampere);
  ASSERT_TRUE(grouped.ok() && loop.ok()) << grouped.status() << loop.status();
  EXPECT_GT(loop->activation_bytes, grouped->activation_bytes);
}

// Placement (memory.kv_offload) on an 80 GiB GPU with 128 GiB of host memory, LoRA in bf16:
// none keeps every page on the GPU and runs out of it; auto keeps what fits there, the rest in
// pinned host memory, with a GPU peak that no longer grows with the context; host moves every
// page; the host's memory then sets the longest context, and the limit says so.
TEST(MemoryPlannerTest, HostTierPlacement) {
  const ModelConfig c = Qwen7B();
  const PlanTarget h100{.device = "cuda:0", .device_bytes = int64_t{80} << 30, .host_bytes = int64_t{128} << 30};
  JobConfig job;
  job.model.dtype = ModelDtype::kBFloat16;
  job.memory.kv_grad_dtype = KvGradDtype::kBFloat16;
  job.data.max_seq_len = 1 << 20;

  job.memory.kv_offload = KvOffload::kNone;
  auto none = PlanMemory(c, job, h100);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->fits);
  EXPECT_EQ(none->host_kv_pages, 0);
  EXPECT_NE(none->limit.find("memory.kv_offload: none"), std::string::npos) << none->limit;

  job.memory.kv_offload = KvOffload::kAuto;
  auto one_m = PlanMemory(c, job, h100);
  ASSERT_TRUE(one_m.ok());
  EXPECT_TRUE(one_m->fits) << one_m->limit;
  EXPECT_GT(one_m->device_kv_pages, 0);
  EXPECT_GT(one_m->host_kv_pages, 0);
  // Every chunk's pages but the last's (chunks of 4096).
  EXPECT_EQ(one_m->device_kv_pages + one_m->host_kv_pages, 28 * (((1 << 20) - 4096) / 128 + 1));
  EXPECT_LE(one_m->peak_device_bytes, one_m->device_capacity_bytes);
  EXPECT_GE(one_m->max_seq_len_that_fits, 1 << 20);
  EXPECT_NE(one_m->placement.find("in the host tier"), std::string::npos) << one_m->placement;
  // The GPU peak is flat in the context once pages spill to the host.
  job.data.max_seq_len = 1 << 19;
  auto half_m = PlanMemory(c, job, h100);
  ASSERT_TRUE(half_m.ok());
  EXPECT_EQ(half_m->peak_device_bytes, one_m->peak_device_bytes);
  EXPECT_LT(half_m->peak_host_bytes, one_m->peak_host_bytes);
  // A context that fits on the GPU stays there.
  job.data.max_seq_len = 1 << 16;
  auto short_ctx = PlanMemory(c, job, h100);
  ASSERT_TRUE(short_ctx.ok());
  EXPECT_EQ(short_ctx->host_kv_pages, 0);

  // float32 gradient pages: 1.5x the page bytes, more than the host holds at 1M tokens.
  job.memory.kv_grad_dtype = KvGradDtype::kFloat32;
  job.data.max_seq_len = 1 << 20;
  auto f32 = PlanMemory(c, job, h100);
  ASSERT_TRUE(f32.ok());
  EXPECT_FALSE(f32->fits);
  EXPECT_NE(f32->limit.find("host memory"), std::string::npos) << f32->limit;
  EXPECT_LT(f32->max_seq_len_that_fits, one_m->max_seq_len_that_fits);
  EXPECT_TRUE(PlanMemory(
                  c,
                  [&] {
                    JobConfig s = job;
                    s.data.max_seq_len = f32->max_seq_len_that_fits;
                    return s;
                  }(),
                  h100)
                  ->fits);

  job.memory.kv_offload = KvOffload::kHost;
  job.data.max_seq_len = 1 << 16;
  auto host = PlanMemory(c, job, h100);
  ASSERT_TRUE(host.ok());
  EXPECT_EQ(host->device_kv_pages, 0);
  EXPECT_EQ(host->kv_device_bytes, 0);
  EXPECT_EQ(host->kv_host_bytes, host->kv_bytes);
}

// Data-parallel ranks on one node each pin their own host tier: a rank plans with its share of
// the host, so 4 ranks of a 1M-token job that one rank fits with the host do not fit, and the
// plan is that of one rank on a quarter of the host.
TEST(MemoryPlannerTest, DataParallelRanksShareTheHost) {
  const ModelConfig c = Qwen7B();
  const PlanTarget h100{.device = "cuda:0", .device_bytes = int64_t{80} << 30, .host_bytes = int64_t{128} << 30};
  JobConfig job;
  job.model.dtype = ModelDtype::kBFloat16;
  job.memory.kv_grad_dtype = KvGradDtype::kBFloat16;
  job.memory.kv_offload = KvOffload::kAuto;
  job.data.max_seq_len = 1 << 20;
  const auto one = PlanMemory(c, job, h100);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_TRUE(one->fits) << one->limit;

  job.resources.gpus = 4;
  const auto rank = PlanMemory(c, job, h100);
  ASSERT_TRUE(rank.ok()) << rank.status();
  EXPECT_FALSE(rank->fits);
  EXPECT_NE(rank->limit.find("host memory"), std::string::npos) << rank->limit;
  EXPECT_EQ(rank->host_capacity_bytes, (h100.host_bytes - kHostReserveBytes) / 4);
  EXPECT_NE(rank->choices.front().find("resources.gpus 4: the plan of one data-parallel rank"), std::string::npos)
      << rank->choices.front();
  JobConfig alone = job;
  alone.resources.gpus = 1;
  PlanTarget quarter = h100;
  quarter.host_bytes = kHostReserveBytes + (h100.host_bytes - kHostReserveBytes) / 4;
  const auto same = PlanMemory(c, alone, quarter);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(rank->max_seq_len_that_fits, same->max_seq_len_that_fits);
  EXPECT_EQ(rank->peak_device_bytes, same->peak_device_bytes);
  EXPECT_LT(rank->max_seq_len_that_fits, one->max_seq_len_that_fits);
}

// On a GPU, a key block's gradient reaches bfloat16 KV-gradient pages through the pages' images
// (KvStore::AccumulateGrad: read, widened to float32, added to, rounded back): the fused
// attention's workspace counts them, 2 + 4 bytes per K and V element of the block (64K keys),
// beside the float32 pages' in-place addition. Missing, the plan was 3% under the measured
// peak of Gemma-3-12B (docs/PERFORMANCE.md, "The planner's predictions").
TEST(MemoryPlannerTest, BFloat16GradientPagesCountTheirImagesInTheAttentionWorkspace) {
  const absl::StatusOr<ModelConfig> c = PresetConfig("gemma-3-12b");  // where attention is the largest transient
  ASSERT_TRUE(c.ok()) << c.status();
  const PlanTarget h100{.device = "cuda:0", .device_bytes = int64_t{80} << 30, .host_bytes = int64_t{128} << 30};
  const auto activations = [&](KvGradDtype dtype) {
    JobConfig s;
    s.model.dtype = ModelDtype::kBFloat16;
    s.memory.chunk_tokens = 4096;
    s.memory.kv_grad_dtype = dtype;
    s.data.max_seq_len = 1 << 17;
    const absl::StatusOr<MemoryPlan> plan = PlanMemory(*c, s, h100);
    EXPECT_TRUE(plan.ok()) << plan.status();
    return plan->activation_bytes;
  };
  const int64_t block = 65536, images_per_key = 2 * c->kv_dim() * (2 + 4);
  EXPECT_EQ(activations(KvGradDtype::kBFloat16) - activations(KvGradDtype::kFloat32), block * images_per_key);
}

// Gradient pages on the host: sparse backward adds into them through the copy engine, whose
// queued additions the device peak holds (twice kHostAddBytesInFlight); dense backward adds into
// a key block's page images (in the attention's workspace) and holds two blocks' images, in the
// pages' dtype, while they are written back.
TEST(MemoryPlannerTest, HostGradientPagesCountTheCopiesInFlightOfTheirBackward) {
  const ModelConfig c = Qwen7B();
  const PlanTarget h100{.device = "cuda:0", .device_bytes = int64_t{80} << 30, .host_bytes = int64_t{512} << 30};
  const auto beyond_state = [&](bool sparse) {
    JobConfig job;
    job.model.dtype = ModelDtype::kBFloat16;
    job.memory.chunk_tokens = 4096;
    job.memory.kv_offload = KvOffload::kHost;
    job.memory.kv_grad_dtype = KvGradDtype::kBFloat16;
    job.data.max_seq_len = 1 << 17;
    if (sparse) job.sparse = JobConfig::Sparse{};
    const absl::StatusOr<MemoryPlan> plan = PlanMemory(c, job, h100);
    EXPECT_TRUE(plan.ok()) << plan.status();
    EXPECT_GT(plan->host_grad_pages, 0);
    EXPECT_EQ(plan->kv_device_bytes, 0);
    return plan->peak_device_bytes - plan->weights_bytes - plan->trainable_state_bytes - plan->activation_bytes;
  };
  EXPECT_EQ(beyond_state(false), 2 * int64_t{65536} * c.kv_dim() * 2 * 2);  // two flash key blocks, K and V, bfloat16
  EXPECT_GE(beyond_state(true), 2 * kHostAddBytesInFlight);
}

// memory.kv_grad_dtype auto on an 80 GiB GPU: float32 while every page stays on the GPU; bfloat16
// once KV-gradient pages go to the host (half their PCIe traffic) or only bfloat16 fits; the
// choice is planned with (the same plan as the fixed dtype), said in words, and the longest
// context is bfloat16's. A float32 model keeps float32 pages; on the CPU, float32 while it fits.
TEST(MemoryPlannerTest, AutoGradDtypeKeepsFloat32OnTheDeviceAndHalvesWhatGoesToTheHost) {
  const ModelConfig c = Qwen7B();
  const PlanTarget h100{.device = "cuda:0", .device_bytes = int64_t{80} << 30, .host_bytes = int64_t{128} << 30};
  JobConfig job;
  job.model.dtype = ModelDtype::kBFloat16;
  const auto plan_with = [&](KvGradDtype dtype, int64_t T, const PlanTarget& target) {
    JobConfig s = job;
    s.memory.kv_grad_dtype = dtype;
    s.data.max_seq_len = T;
    absl::StatusOr<MemoryPlan> plan = PlanMemory(c, s, target);
    EXPECT_TRUE(plan.ok()) << plan.status();
    return *plan;
  };
  const auto same_pages = [](const MemoryPlan& a, const MemoryPlan& b) {
    EXPECT_EQ(a.kv_grad_dtype, b.kv_grad_dtype);
    EXPECT_EQ(a.kv_bytes, b.kv_bytes);
    EXPECT_EQ(a.device_grad_pages, b.device_grad_pages);
    EXPECT_EQ(a.host_grad_pages, b.host_grad_pages);
    EXPECT_EQ(a.peak_device_bytes, b.peak_device_bytes);
    EXPECT_EQ(a.peak_host_bytes, b.peak_host_bytes);
  };

  const MemoryPlan on_gpu = plan_with(KvGradDtype::kAuto, 1 << 16, h100);
  EXPECT_EQ(on_gpu.kv_grad_dtype, KvGradDtype::kFloat32);
  EXPECT_EQ(on_gpu.host_grad_pages, 0);
  same_pages(on_gpu, plan_with(KvGradDtype::kFloat32, 1 << 16, h100));
  EXPECT_THAT(absl::StrJoin(on_gpu.choices, "\n"),
              HasSubstr("memory.kv_grad_dtype auto: float32, every KV-gradient page stays on cuda:0 at 65536 tokens"));
  EXPECT_EQ(on_gpu.max_seq_len_that_fits, plan_with(KvGradDtype::kBFloat16, 1 << 16, h100).max_seq_len_that_fits);

  // 512K: float32 pages fit, some in the host tier: bfloat16.
  const MemoryPlan spilled_f32 = plan_with(KvGradDtype::kFloat32, 1 << 19, h100);
  ASSERT_TRUE(spilled_f32.fits) << spilled_f32.limit;
  ASSERT_GT(spilled_f32.host_grad_pages, 0);
  const MemoryPlan spilled = plan_with(KvGradDtype::kAuto, 1 << 19, h100);
  same_pages(spilled, plan_with(KvGradDtype::kBFloat16, 1 << 19, h100));
  EXPECT_THAT(absl::StrJoin(spilled.choices, "\n"),
              HasSubstr(absl::StrCat("memory.kv_grad_dtype auto: bfloat16 (accumulated in float32, stored rounded), ",
                                     spilled_f32.host_grad_pages,
                                     " KV-gradient pages go to the host tier at 524288 tokens: bfloat16 halves "
                                     "their PCIe traffic")));

  // 1M: only bfloat16 pages fit (HostTierPlacement).
  const MemoryPlan one_m = plan_with(KvGradDtype::kAuto, 1 << 20, h100);
  EXPECT_TRUE(one_m.fits) << one_m.limit;
  EXPECT_EQ(one_m.kv_grad_dtype, KvGradDtype::kBFloat16);
  EXPECT_THAT(absl::StrJoin(one_m.choices, "\n"), HasSubstr("float32 pages do not fit at 1048576 tokens"));

  // A float32 model: float32 pages whatever the placement.
  job.model.dtype = ModelDtype::kFloat32;
  const MemoryPlan f32_model = plan_with(KvGradDtype::kAuto, 1 << 19, h100);
  EXPECT_EQ(f32_model.kv_grad_dtype, KvGradDtype::kFloat32);
  EXPECT_THAT(absl::StrJoin(f32_model.choices, "\n"), HasSubstr("float32, as the model's dtype"));

  // The CPU: the host tier is the same memory, so float32 while it fits, even with every page there.
  job.model.dtype = ModelDtype::kBFloat16;
  job.memory.kv_offload = KvOffload::kHost;
  const PlanTarget cpu{.device = "cpu", .device_bytes = int64_t{64} << 30, .host_bytes = int64_t{64} << 30};
  const MemoryPlan cpu_host = plan_with(KvGradDtype::kAuto, 1 << 14, cpu);
  ASSERT_GT(cpu_host.host_grad_pages, 0);
  EXPECT_EQ(cpu_host.kv_grad_dtype, KvGradDtype::kFloat32);
  EXPECT_THAT(absl::StrJoin(cpu_host.choices, "\n"), HasSubstr("float32, its pages fit at 16384 tokens"));
}

// The training session trains with auto's choice: a bfloat16 model on a machine where float32
// KV-gradient pages do not fit and bfloat16 ones do gets bfloat16 gradient pools, and trains.
TEST(MemoryPlannerTest, SessionTrainsWithAutoGradDtypesChoice) {
  const ModelConfig c = testing::TinyLlamaConfig(256, 64, 2, 4, 2);
  JobConfig job;
  job.model.dtype = ModelDtype::kBFloat16;
  job.memory.chunk_tokens = 128;
  job.memory.page_tokens = 64;
  job.data.max_seq_len = 512;
  const PlanTarget roomy{.device = "cpu", .device_bytes = int64_t{64} << 30, .host_bytes = int64_t{64} << 30};
  const auto peak = [&](KvGradDtype dtype) {
    JobConfig s = job;
    s.memory.kv_grad_dtype = dtype;
    return PlanMemory(c, s, roomy)->peak_device_bytes;
  };
  const int64_t f32 = peak(KvGradDtype::kFloat32), bf16 = peak(KvGradDtype::kBFloat16);
  ASSERT_LT(bf16, f32);
  const int64_t between = kDeviceReserveBytes + (f32 + bf16) / 2;
  const PlanTarget tight{.device = "cpu", .device_bytes = between, .host_bytes = between};

  auto model = Transformer::Random(c, at::kBFloat16, at::kCPU, /*seed=*/1, /*init_std=*/0.05);
  LoraOptions lora;
  lora.rank = job.method.lora.rank;
  ASSERT_TRUE(model->AddLora(lora, 2).ok());
  job.memory.kv_grad_dtype = KvGradDtype::kAuto;
  SessionOptions options;
  options.machine = tight;
  options.longest_sequence = job.data.max_seq_len;
  auto session = TrainingSession::Create(model.get(), job, options);
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_EQ((*session)->plan().kv_grad_dtype, KvGradDtype::kBFloat16);
  EXPECT_EQ((*session)->pools().grad->options().dtype(), at::kBFloat16);
  const auto docs = testing::RandomDocs(1, 512, 512, c.vocab_size, 7);
  auto loss = (*session)->trainer().TrainSequence(TokenSequence::FromDocument(docs[0]), 1.0 / 512, 3);
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_TRUE(std::isfinite(loss->loss_sum));
  EXPECT_GT(loss->label_tokens, 0);

  // float32 pages, asked for, would not fit this machine (admission would refuse the job).
  job.memory.kv_grad_dtype = KvGradDtype::kFloat32;
  EXPECT_FALSE(PlanMemory(c, job, tight)->fits);
}

// SpaCO's bound on the kept chunks is the binomial quantile it states: P(K > k) <= 1e-9 <
// P(K > k - 1), with the tail summed here term by term from the top (pmf by recurrence).
TEST(MemoryPlannerTest, SpacoKeptChunksBoundIsTheBinomialQuantile) {
  EXPECT_EQ(SpacoKeptChunksBound(17, 1.0), 17);
  EXPECT_EQ(SpacoKeptChunksBound(0, 0.5), 0);
  for (const int64_t n : {1, 5, 40, 300, 2000}) {
    for (const double p : {0.01, 0.125, 0.25, 0.5, 0.9}) {
      SCOPED_TRACE(std::to_string(n) + " chunks, p " + std::to_string(p));
      // pmf(j) for every j, from pmf(0) = (1 - p)^n in logs.
      std::vector<long double> pmf(n + 1);
      long double log_pmf = n * std::log1p(-static_cast<long double>(p));
      for (int64_t j = 0; j <= n; ++j) {
        pmf[j] = std::exp(log_pmf);
        log_pmf += std::log(static_cast<long double>(n - j)) - std::log(static_cast<long double>(j + 1)) +
                   std::log(static_cast<long double>(p)) - std::log1p(-static_cast<long double>(p));
      }
      const auto tail_above = [&](int64_t k) {  // P(K > k)
        long double t = 0;
        for (int64_t j = n; j > k; --j) t += pmf[j];
        return t;
      };
      const int64_t k = SpacoKeptChunksBound(n, p);
      EXPECT_LE(tail_above(k), 1e-9);
      if (k > 0) {
        EXPECT_GT(tail_above(k - 1), 1e-9) << "bound " << k;
      }
    }
  }
  // Long sequences keep about p of their chunks: 2M tokens in chunks of 4096 at p = 0.25.
  EXPECT_LT(SpacoKeptChunksBound(489, 0.25), 190);
}

// SpaCO keeps every KV page of stage 1 but gradient pages only for the chunks it keeps: the plan
// holds the same KV pages as exact training, and gradient pages for SpacoKeptChunksBound chunks.
// On an 80 GiB GPU with 128 GiB of host memory this takes Qwen2.5-7B LoRA past 2M tokens
// (sparse, p = 0.125), where exact training stops near 1.3M.
TEST(MemoryPlannerTest, SpacoPlansGradientPagesForTheKeptChunks) {
  const ModelConfig tiny = testing::TinyLlamaConfig();
  PlanTarget target;
  target.device_bytes = target.host_bytes = int64_t{8} << 30;
  JobConfig job;
  job.data.max_seq_len = 40960;  // 10 chunks of 4096
  const auto exact = PlanMemory(tiny, job, target);
  job.chunk_fraction = 0.5;
  const auto spaco = PlanMemory(tiny, job, target);
  ASSERT_TRUE(exact.ok() && spaco.ok()) << spaco.status();
  EXPECT_EQ(spaco->device_kv_pages, exact->device_kv_pages);
  EXPECT_EQ(exact->device_grad_pages, exact->device_kv_pages);
  const int64_t pages_per_chunk = 4096 / job.memory.page_tokens;
  EXPECT_EQ(spaco->device_grad_pages,
            std::min(exact->device_kv_pages, tiny.num_layers * (SpacoKeptChunksBound(10, 0.5) * pages_per_chunk + 1)));
  // 400 chunks at p = 0.25: room for 153 (the mean is 100).
  job.data.max_seq_len = 4096 * 400;
  job.chunk_fraction = 0.25;
  const auto long_spaco = PlanMemory(tiny, job, target);
  ASSERT_TRUE(long_spaco.ok());
  EXPECT_LT(long_spaco->device_grad_pages, long_spaco->device_kv_pages * 4 / 10);
  EXPECT_NE(long_spaco->placement.find("backward.chunk_fraction 0.25"), std::string::npos) << long_spaco->placement;

  const ModelConfig c = Qwen7B();
  const PlanTarget h100{.device = "cuda:0", .device_bytes = int64_t{80} << 30, .host_bytes = int64_t{128} << 30};
  JobConfig qwen;
  qwen.model.dtype = ModelDtype::kBFloat16;
  qwen.memory.kv_grad_dtype = KvGradDtype::kBFloat16;
  qwen.memory.kv_offload = KvOffload::kAuto;
  qwen.sparse = JobConfig::Sparse{};
  qwen.data.max_seq_len = 2'000'000;
  const auto exact_2m = PlanMemory(c, qwen, h100);
  qwen.chunk_fraction = 0.125;
  const auto spaco_2m = PlanMemory(c, qwen, h100);
  ASSERT_TRUE(exact_2m.ok() && spaco_2m.ok());
  EXPECT_FALSE(exact_2m->fits);
  EXPECT_LT(exact_2m->max_seq_len_that_fits, 1'500'000);
  EXPECT_TRUE(spaco_2m->fits) << spaco_2m->limit;
  EXPECT_GT(spaco_2m->host_grad_pages, 0);
  EXPECT_LT(spaco_2m->host_grad_pages, spaco_2m->host_kv_pages / 3);
}

// Swap instead of recompute (worker/paging/swap_layout.h): on an H100 with 128 GiB of host
// memory, Qwen2.5-7B at 128K in chunks of 8192 with its pages on the host swaps the 13 latest
// of the 15 chunks stage 2 recomputes (chunks 0 and 1 read fewer keys per query than make the
// copies pay beside the pages'), in records of the output and log-sum-exp of every layer; with
// every page on the GPU, all 15; at 1M the host memory the pages leave limits it; on the CPU
// every chunk is worth it; off, sparse and SpaCO plan none; the choice is in words.
TEST(MemoryPlannerTest, SwapPlansTheLatestChunksWithinTheHostMemoryLeft) {
  const ModelConfig c = Qwen7B();
  const PlanTarget h100{.device = "cuda:0", .device_bytes = int64_t{80} << 30, .host_bytes = int64_t{128} << 30};
  JobConfig job;
  job.model.dtype = ModelDtype::kBFloat16;
  job.memory.kv_grad_dtype = KvGradDtype::kBFloat16;
  job.memory.chunk_tokens = 8192;
  job.data.max_seq_len = 131072;
  const int64_t record = (8192 * 28 * 128 * 2) + 8192 * 28 * 4;  // both multiples of 256
  const auto on_gpu = PlanMemory(c, job, h100);
  ASSERT_TRUE(on_gpu.ok()) << on_gpu.status();
  EXPECT_EQ(on_gpu->host_kv_pages, 0);
  EXPECT_EQ(on_gpu->swap_min_key_tokens, 0);
  EXPECT_EQ(on_gpu->swap_chunks, 15);
  EXPECT_EQ(on_gpu->peak_host_bytes, on_gpu->swap_bytes);
  EXPECT_NE(on_gpu->choices[0].find("the last 15 chunks"), std::string::npos) << on_gpu->choices[0];

  job.memory.kv_offload = KvOffload::kHost;
  const auto plan = PlanMemory(c, job, h100);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_GT(plan->host_kv_pages, 0);
  EXPECT_EQ(plan->swap_min_key_tokens, 15000);
  EXPECT_EQ(plan->swap_chunks, 13);
  EXPECT_EQ(plan->swap_bytes, 13 * 28 * record);
  EXPECT_EQ(plan->peak_host_bytes, plan->kv_host_bytes + plan->swap_bytes);
  ASSERT_FALSE(plan->choices.empty());
  EXPECT_NE(plan->choices[0].find("the last 13 chunks"), std::string::npos) << plan->choices[0];
  EXPECT_NE(plan->choices[0].find("fewer than 15000 keys"), std::string::npos) << plan->choices[0];

  job.data.max_seq_len = 1 << 20;
  job.memory.kv_offload = KvOffload::kAuto;
  const auto long_plan = PlanMemory(c, job, h100);
  ASSERT_TRUE(long_plan.ok() && long_plan->fits) << long_plan->limit;
  EXPECT_GT(long_plan->swap_chunks, 0);
  EXPECT_LT(long_plan->swap_chunks, 128 - 1 - 1);
  EXPECT_LE(long_plan->peak_host_bytes, long_plan->host_capacity_bytes);
  EXPECT_GT(long_plan->peak_host_bytes + 28 * record, long_plan->host_capacity_bytes);  // not one chunk more
  EXPECT_NE(long_plan->choices[0].find("the host memory the plan leaves"), std::string::npos) << long_plan->choices[0];
  EXPECT_EQ(long_plan->max_seq_len_that_fits, [&] {
    JobConfig off = job;
    off.memory.swap_attention = false;
    return PlanMemory(c, off, h100)->max_seq_len_that_fits;
  }());  // never a limit of its own

  PlanTarget cpu;  // the CPU's blockwise attention keeps float32 outputs: records twice as large
  cpu.device_bytes = cpu.host_bytes = int64_t{512} << 30;
  job.data.max_seq_len = 131072;
  const auto on_cpu = PlanMemory(c, job, cpu);
  ASSERT_TRUE(on_cpu.ok());
  EXPECT_EQ(on_cpu->swap_min_key_tokens, 0);
  EXPECT_EQ(on_cpu->swap_chunks, 15);
  EXPECT_EQ(on_cpu->swap_bytes, int64_t{15} * 28 * ((8192 * 28 * 128 * 4) + 8192 * 28 * 4));

  for (const std::string what : {"off", "sparse", "spaco"}) {
    JobConfig none = job;
    if (what == "off") none.memory.swap_attention = false;
    if (what == "sparse") none.sparse = JobConfig::Sparse{};
    if (what == "spaco") none.chunk_fraction = 0.5;
    const auto p = PlanMemory(c, none, h100);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(p->swap_bytes, 0) << what;
    EXPECT_NE(p->choices[0].find("attention swap: none"), std::string::npos) << p->choices[0];
  }
}

}  // namespace
}  // namespace oomb
