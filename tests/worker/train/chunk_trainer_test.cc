// Exactness of the chunk-recurrent trainer (docs/ARCHITECTURE.md §3): parameter gradients of chunked
// training equal those of ordinary full-sequence backpropagation, for any chunk and page size,
// LoRA and full fine-tuning, with and without packed documents, dense and mixture-of-experts
// layers (LoRA on the experts' banks).
#include "worker/train/chunk_trainer.h"

#include <gtest/gtest.h>

#include <cmath>

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include "kernels/torch/chunked_cross_entropy.h"
#include "kernels/torch/matmul.h"
#include "kernels/torch/paged_attention.h"
#include "tests/kernels/sparse_attention_check.h"
#include "tests/worker/tiny_model.h"
#include "worker/common/status.h"
#include "worker/paging/swap_layout.h"
#include "worker/train/fused_adamw.h"

namespace oomb {
namespace {

using testing::Grads;
using testing::MaxRelativeError;
using testing::TakeGrads;
using testing::TinyConfig;

std::vector<int64_t> RandomIds(int64_t n, int64_t vocab, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const at::Tensor t = at::randint(0, vocab, {n}, gen, at::kLong);
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + n);
}

// Full-sequence backpropagation: one forward over all T tokens, attention by `attention`
// (layer, q, k, v, doc_start [T]), gradients of scale * sum(CE) (plus aux_loss_coef times the
// router's auxiliary loss of the forward, where the model has one: RouterBalance).
using FullAttention = std::function<at::Tensor(int64_t layer, const at::Tensor& q, const at::Tensor& k,
                                               const at::Tensor& v, const at::Tensor& doc_start)>;
Grads FullSequenceGrads(const Transformer& model, const TokenSequence& seq, double scale,
                        const FullAttention& attention) {
  ChunkInput in;
  in.ids = at::tensor(seq.ids, at::kLong);
  in.positions = at::tensor(seq.positions, at::kLong);
  in.doc_start = at::tensor(seq.doc_start, at::kLong);
  in.rope_seq_len = *std::max_element(seq.positions.begin(), seq.positions.end()) + 1;
  RouterBalance balance;
  const double aux_coef = model.config().moe.aux_loss_coef;
  if (aux_coef > 0) in.balance = &balance;
  const at::Tensor hidden =
      model.Hidden(in, [&](int64_t layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
        return attention(layer, q, k, v, in.doc_start);
      });
  const at::Tensor logits = at::matmul(hidden, model.lm_head().t());
  const at::Tensor loss =
      at::cross_entropy_loss(logits, at::tensor(seq.labels, at::kLong), {}, at::Reduction::Sum, kernels::kIgnoreIndex);
  at::Tensor objective = loss * scale;
  if (aux_coef > 0) objective = objective + balance.Loss() * aux_coef;
  objective.backward();
  return TakeGrads(model);
}

// Ordinary full-sequence backpropagation, with dense attention; a sliding-window layer's mask
// made here, position by position: token t sees keys j > t - window of its document.
at::Tensor DenseReference(const Transformer& model, const TokenSequence& seq, int64_t layer, const at::Tensor& q,
                          const at::Tensor& k, const at::Tensor& v, const at::Tensor& doc_start) {
  const int64_t window = model.spec().layers[layer].window;
  if (window == 0) return kernels::DenseAttentionReference(q, k, v, doc_start, model.sinks(layer));
  std::vector<int64_t> first(seq.doc_start);
  for (int64_t t = 0; t < static_cast<int64_t>(first.size()); ++t) {
    first[t] = std::max(first[t], t - window + 1);
  }
  return kernels::DenseAttentionReference(q, k, v, at::tensor(first, at::kLong), model.sinks(layer));
}

Grads ReferenceGrads(const Transformer& model, const TokenSequence& seq, double scale) {
  return FullSequenceGrads(
      model, seq, scale,
      [&](int64_t layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& doc_start) {
        return DenseReference(model, seq, layer, q, k, v, doc_start);
      });
}

struct Pools {
  std::unique_ptr<PagePool> kv, grad;
};

Pools MakePools(const ModelConfig& c, int64_t page_tokens, int64_t tokens, at::ScalarType dtype) {
  const PageShape shape{c.num_kv_heads, page_tokens, c.head_dim};
  const int64_t pages = c.num_layers * ((tokens + page_tokens - 1) / page_tokens + 1);
  const at::ScalarType grad_dtype = dtype == at::kDouble ? at::kDouble : at::kFloat;
  Pools p;
  p.kv = *PagePool::Create(PageKind::kKv, Tier::kDevice, shape, at::TensorOptions().dtype(dtype), pages);
  p.grad = *PagePool::Create(PageKind::kKvGrad, Tier::kDevice, shape, at::TensorOptions().dtype(grad_dtype), pages);
  return p;
}

struct Case {
  std::string family;
  bool full;
  at::ScalarType dtype;
  bool packed;
};

class ChunkTrainerExactnessTest : public ::testing::TestWithParam<Case> {};

// The case's model, of `config` (default: TinyConfig(c.family)).
std::unique_ptr<Transformer> MakeModel(const Case& c, at::ScalarType dtype, std::optional<ModelConfig> config = {}) {
  auto model =
      Transformer::Random(config.value_or(TinyConfig(c.family)), dtype, at::kCPU, /*seed=*/7, /*init_std=*/0.2);
  if (c.full) {
    model->EnableFullFineTuning();
    return model;
  }
  LoraOptions lora;
  lora.rank = 4;
  EXPECT_TRUE(model->AddLora(lora, 11).ok());
  testing::RandomizeLoraB(*model, 13);
  return model;
}

// The case's 50 tokens: one document, or three packed.
TokenSequence CaseSequence(const Case& c, int64_t vocab) {
  return c.packed ? TokenSequence::Pack({RandomIds(17, vocab, 1), RandomIds(25, vocab, 2), RandomIds(8, vocab, 3)})
                  : TokenSequence::FromDocument(RandomIds(50, vocab, 1));
}

TEST_P(ChunkTrainerExactnessTest, ChunkedGradientsEqualFullSequenceGradients) {
  const Case c = GetParam();
  const ModelConfig config = TinyConfig(c.family);
  auto model = MakeModel(c, c.dtype);
  const int64_t T = 50;
  const TokenSequence seq = CaseSequence(c, config.vocab_size);
  ASSERT_EQ(seq.size(), T);
  const double scale = 1.0 / static_cast<double>(seq.label_tokens());
  // float64: against the float64 full-sequence gradients, 1e-9. float32: against the float64
  // full-sequence gradients, within 1e-5 or, where the problem's conditioning makes float32
  // itself less accurate, twice the error of the ordinary float32 full-sequence computation
  // (docs/CONVENTIONS.md §6.10).
  Grads want;
  double tolerance = 1e-9;
  if (c.dtype == at::kDouble) {
    want = ReferenceGrads(*model, seq, scale);
  } else {
    want = ReferenceGrads(*MakeModel(c, at::kDouble), seq, scale);
    std::string worst;
    const double naive = MaxRelativeError(ReferenceGrads(*model, seq, scale), want, &worst);
    tolerance = std::max(1e-5, 2 * naive);
    std::cout << "float32 full-sequence gradients vs float64: " << naive << " (" << worst << ")\n";
  }
  for (const int64_t chunk : {1, 7, 16, 64}) {
    for (const int64_t page : {3, 16}) {
      Pools pools = MakePools(config, page, T, c.dtype);
      ChunkTrainerOptions options;
      options.chunk_tokens = chunk;
      options.attention_key_block = 2 * page + 1;  // key blocks that straddle pages
      options.ce_rows_per_block = 5;
      ChunkTrainer trainer(model.get(), pools.kv.get(), pools.grad.get(), options);
      auto loss = trainer.TrainSequence(seq, scale, 0);
      ASSERT_TRUE(loss.ok()) << loss.status();
      EXPECT_EQ(loss->label_tokens, seq.label_tokens());
      // Training takes the losses from stage 2 (the trimmed stage 1 has no LM head): they are
      // the evaluation's.
      auto eval = trainer.EvalSequence(seq);
      ASSERT_TRUE(eval.ok()) << eval.status();
      EXPECT_NEAR(loss->loss_sum, eval->loss_sum, (c.dtype == at::kDouble ? 1e-10 : 1e-5) * std::abs(eval->loss_sum));
      std::string worst;
      const double err = MaxRelativeError(TakeGrads(*model), want, &worst);
      EXPECT_LE(err, tolerance) << "chunk " << chunk << " page " << page << ": worst " << worst;
      std::cout << "chunk " << chunk << " page " << page << ": max relative gradient error " << err << "\n";
      // A sliding-window layer held only the pages later chunks read.
      const PastReach reach{.windows = DescribeModel(config).Windows(), .chunk_tokens = chunk};
      EXPECT_LE(pools.kv->stats().peak_used_pages, SequencePagesBound(T, page, reach, config.num_layers));
      if (DescribeModel(config).HasWindows() && chunk == 16 && page == 3) {
        EXPECT_LT(pools.kv->stats().peak_used_pages, config.num_layers * ((T + page - 1) / page));
      }
      // Every page went back to its pool.
      EXPECT_EQ(pools.kv->stats().used_pages, 0);
      EXPECT_EQ(pools.grad->stats().used_pages, 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Tiny, ChunkTrainerExactnessTest,
    ::testing::Values(Case{"qwen2", false, at::kDouble, false}, Case{"qwen2", true, at::kDouble, false},
                      Case{"llama", false, at::kDouble, false}, Case{"llama", true, at::kDouble, true},
                      Case{"qwen2", false, at::kDouble, true}, Case{"qwen2", false, at::kFloat, false},
                      Case{"llama", true, at::kFloat, true}, Case{"qwen3", false, at::kDouble, true},
                      Case{"qwen3", true, at::kDouble, false}, Case{"qwen3", false, at::kFloat, false},
                      Case{"mistral", false, at::kDouble, false}, Case{"mistral", true, at::kDouble, true},
                      Case{"mistral", true, at::kFloat, true}, Case{"gemma3", false, at::kDouble, false},
                      Case{"gemma3", true, at::kDouble, true}, Case{"gemma3", true, at::kFloat, true},
                      Case{"phi3", false, at::kDouble, false}, Case{"phi3", true, at::kDouble, true},
                      Case{"phi3", true, at::kFloat, true}, Case{"qwen3_moe", false, at::kDouble, true},
                      Case{"qwen3_moe", true, at::kDouble, false}, Case{"qwen3_moe", false, at::kFloat, false},
                      Case{"mixtral", false, at::kDouble, false}, Case{"mixtral", true, at::kDouble, true},
                      Case{"gpt_oss", false, at::kDouble, false}, Case{"gpt_oss", true, at::kDouble, true},
                      Case{"gpt_oss", true, at::kFloat, false}),
    [](const auto& info) {
      const Case& c = info.param;
      return c.family + (c.full ? "_full" : "_lora") + (c.dtype == at::kDouble ? "_f64" : "_f32") +
             (c.packed ? "_packed" : "");
    });

// Swap instead of recompute (worker/train/attention_swap.h): stage 2 replaying stage 1's
// attention results gives the recompute path's loss and gradients bit for bit, whatever the
// budget (every chunk, some of the latest, none) and the fewest keys that make a chunk worth it.
TEST_P(ChunkTrainerExactnessTest, SwappedAttentionGivesTheRecomputedGradientsBitForBit) {
  const Case c = GetParam();
  const ModelConfig config = TinyConfig(c.family);
  auto model = MakeModel(c, c.dtype);
  const int64_t T = 50;
  const TokenSequence seq = CaseSequence(c, config.vocab_size);
  const double scale = 1.0 / static_cast<double>(seq.label_tokens());
  for (const int64_t chunk : {7, 16}) {
    const int64_t chunks = (T + chunk - 1) / chunk;
    const SwapLayout layout =
        MakeSwapLayout(chunk, config.num_heads, config.head_dim,
                       SwapOutputBytes(static_cast<int64_t>(c10::elementSize(c.dtype)), /*cuda=*/false), 0);
    const int64_t chunk_bytes = config.num_layers * layout.record_bytes;
    const auto train = [&](int64_t budget_bytes, int64_t min_key_tokens, TrainerMemory* memory) {
      Pools pools = MakePools(config, 3, T, c.dtype);
      ChunkTrainerOptions options;
      options.chunk_tokens = chunk;
      options.attention_key_block = 7;
      options.ce_rows_per_block = 5;
      options.swap_budget_bytes = budget_bytes;
      options.swap_min_key_tokens = min_key_tokens;
      ChunkTrainer trainer(model.get(), pools.kv.get(), pools.grad.get(), options);
      auto loss = trainer.TrainSequence(seq, scale, 0);
      EXPECT_TRUE(loss.ok()) << loss.status();
      *memory = trainer.memory();
      EXPECT_EQ(pools.kv->stats().used_pages, 0);
      return std::make_pair(loss.ok() ? loss->loss_sum : 0.0, TakeGrads(*model));
    };
    TrainerMemory recomputed_memory, memory;
    const auto [want_loss, want] = train(0, 0, &recomputed_memory);
    EXPECT_EQ(recomputed_memory.swapped_chunks, 0);
    // (budget in chunks, fewest keys per query) -> chunks swapped: chunk N-1 runs in stage 2
    // only; the latest chunks go first; a chunk whose keys (i * C + C / 2) fall short is left.
    const int64_t some = chunks / 2;
    const int64_t keys_of_second_last = (chunks - 2) * chunk + chunk / 2;
    for (const auto& [budget, min_keys, swapped] : {std::tuple<int64_t, int64_t, int64_t>{chunks, 0, chunks - 1},
                                                    {some, 0, some},
                                                    {chunks, keys_of_second_last, 1},
                                                    {chunks, keys_of_second_last + 1, 0}}) {
      SCOPED_TRACE(::testing::Message() << "chunk " << chunk << ", budget " << budget << " chunks, min keys "
                                        << min_keys);
      const auto [loss, got] = train(budget * chunk_bytes, min_keys, &memory);
      EXPECT_EQ(memory.swapped_chunks, swapped);
      EXPECT_EQ(memory.swapped_bytes > 0, swapped > 0);
      EXPECT_EQ(loss, want_loss);
      ASSERT_EQ(got.size(), want.size());
      for (const auto& [name, g] : want) {
        EXPECT_TRUE(at::equal(got.at(name), g))
            << name << ": max difference " << (got.at(name) - g).abs().max().item<double>();
      }
    }
  }
}

// The GPU tests' model: `config` in bfloat16 on the GPU with LoRA of `rank` (B drawn at random,
// so every gradient is non-zero).
std::unique_ptr<Transformer> GpuLoraModel(const ModelConfig& config, int64_t rank) {
  auto model = Transformer::Random(config, at::kBFloat16, at::Device(at::kCUDA, 0), /*seed=*/7, /*init_std=*/0.2);
  LoraOptions lora;
  lora.rank = rank;
  EXPECT_TRUE(model->AddLora(lora, 11).ok());
  testing::RandomizeLoraB(*model, 13);
  return model;
}

// The GPU tests' step: `seq` (256 tokens) through the chunked trainer on `model` (chunks of 64,
// pages of 16 in device pools, float32 gradient pages), the gradients in float64 on the host.
Grads GpuGrads(const Transformer& model, const TokenSequence& seq, ChunkTrainerOptions options,
               TrainerMemory* memory = nullptr) {
  const ModelConfig& config = model.config();
  const PageShape shape{config.num_kv_heads, 16, config.head_dim};
  const int64_t pages = config.num_layers * (256 / 16 + 1);
  const at::TensorOptions on_gpu = at::TensorOptions().device(model.device());
  auto kv = *PagePool::Create(PageKind::kKv, Tier::kDevice, shape, on_gpu.dtype(model.dtype()), pages);
  auto grad = *PagePool::Create(PageKind::kKvGrad, Tier::kDevice, shape, on_gpu.dtype(at::kFloat), pages);
  options.chunk_tokens = 64;
  ChunkTrainer trainer(&model, kv.get(), grad.get(), options);
  EXPECT_TRUE(trainer.TrainSequence(seq, 1.0 / static_cast<double>(seq.label_tokens()), 1).ok());
  if (memory != nullptr) *memory = trainer.memory();
  Grads g = TakeGrads(model);
  for (auto& [name, t] : g) t = t.to(at::kCPU, at::kDouble);
  return g;
}

// On a GPU: the swap's gradients against the recompute path's, on pools on the device. float32
// (the blockwise attention) within 1e-5, the GPU tests' tolerance; bfloat16 (the fused kernels)
// closer to the recompute path's than bfloat16 itself is to float32 (on the H100 the 7B step at
// 64K differed by 1.8% where bfloat16 is 8.4% from float32: docs/PERFORMANCE.md, dense training speed).
TEST(SwapGpuTest, SwappedGradientsMatchTheRecomputedOnes) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const ModelConfig config = TinyConfig("qwen3");  // head_dim 16: the fused kernels' shapes
  const TokenSequence seq = TokenSequence::FromDocument(RandomIds(256, config.vocab_size, 5));
  const auto bf16 = GpuLoraModel(config, 4);
  const auto f32 = bf16->CastTo(at::kFloat);  // the same bf16-valued weights
  const auto grads = [&](const Transformer& model, bool swap) {
    ChunkTrainerOptions options;
    if (swap) {
      const SwapLayout layout =
          MakeSwapLayout(64, config.num_heads, config.head_dim,
                         SwapOutputBytes(static_cast<int64_t>(c10::elementSize(model.dtype())), /*cuda=*/true), 0);
      options.swap_budget_bytes = 3 * config.num_layers * layout.record_bytes;
    }
    TrainerMemory memory;
    Grads g = GpuGrads(model, seq, options, &memory);
    EXPECT_EQ(memory.swapped_chunks, swap ? 3 : 0);
    return g;
  };
  std::string worst;
  const Grads want32 = grads(*f32, false);
  EXPECT_LE(MaxRelativeError(grads(*f32, true), want32, &worst), 1e-5) << worst;
  const Grads want16 = grads(*bf16, false);
  const double swap_error = MaxRelativeError(grads(*bf16, true), want16, &worst);
  const double bf16_error = MaxRelativeError(want16, want32, &worst);
  std::cout << "bfloat16: swap against recompute " << swap_error << ", recompute against float32 " << bf16_error
            << "\n";
  EXPECT_LT(swap_error, bf16_error);
}

void ExpectGroupedGradientsMatchTheLoops(const std::string& family) {
  ModelConfig config = TinyConfig(family);
  config.moe.aux_loss_coef = 0.5;
  const TokenSequence seq = TokenSequence::FromDocument(RandomIds(256, config.vocab_size, 5));
  const auto bf16 = GpuLoraModel(config, 8);
  const auto f32 = bf16->CastTo(at::kFloat);
  f32->set_expert_kernel(ExpertKernel::kLoop);
  const Grads want = GpuGrads(*f32, seq, {});
  EXPECT_EQ(bf16->expert_kernel(),
            kernels::GroupedMatmulIsNative(bf16->device()) ? ExpertKernel::kGrouped : ExpertKernel::kLoop);
  std::string worst;
  bf16->set_expert_kernel(ExpertKernel::kLoop);
  const double loop_error = MaxRelativeError(GpuGrads(*bf16, seq, {}), want, &worst);
  bf16->set_expert_kernel(ExpertKernel::kGrouped);
  const double grouped_error = MaxRelativeError(GpuGrads(*bf16, seq, {}), want, &worst);
  EXPECT_LE(grouped_error, 2 * loop_error) << worst;
  bf16->set_expert_recompute_layers(config.num_layers);
  const double recompute_error = MaxRelativeError(GpuGrads(*bf16, seq, {}), want, &worst);
  bf16->set_expert_recompute_layers(0);
  EXPECT_LE(recompute_error, 2 * loop_error) << worst;
  std::cout << family << ": bfloat16 against the float32 loop: loop " << loop_error << ", grouped " << grouped_error
            << ", recomputing gate_up " << recompute_error << "\n";
}

// On a GPU: the experts' grouped GEMMs (ExpertKernel::kGrouped, what kAuto takes on a GPU of
// compute capability 9.0 and more in bfloat16) against the loop, over the chunked trainer with
// LoRA on attention and both banks (rank 8: grouped GEMMs want rows of 16 bytes) and the
// router's auxiliary loss: in bfloat16, the grouped gradients are as close to the float32
// loop's as the bfloat16 loop's are (within twice its error), also with backward recomputing the
// experts' gate_up products in every sparse layer. Qwen3-MoE's experts, and gpt-oss's
// (biases, the clamped SwiGLU; its attention sinks in the fused kernels' path).
TEST(ExpertsGpuTest, GroupedGradientsMatchTheLoops) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (const std::string family : {"qwen3_moe", "gpt_oss"}) {
    SCOPED_TRACE(family);
    ExpectGroupedGradientsMatchTheLoops(family);
  }
}

// The loss of chunked training equals the full-sequence loss too.
TEST(ChunkTrainerTest, EvalLossMatchesFullSequence) {
  const ModelConfig config = TinyConfig("qwen2");
  auto model = Transformer::Random(config, at::kDouble, at::kCPU, 3, 0.2);
  const TokenSequence seq = TokenSequence::FromDocument(RandomIds(40, config.vocab_size, 5));
  // Pools for the tokens before the last chunk (36 of 40): no later chunk reads the last one's.
  Pools pools = MakePools(config, 4, 36, at::kDouble);
  ChunkTrainerOptions options;
  options.chunk_tokens = 9;
  ChunkTrainer trainer(model.get(), pools.kv.get(), pools.grad.get(), options);
  TokenScores scores;
  auto loss = trainer.EvalSequence(seq, &scores);
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_EQ(pools.kv->stats().peak_used_pages, config.num_layers * 36 / 4);
  ChunkInput in;
  in.ids = at::tensor(seq.ids, at::kLong);
  in.positions = at::tensor(seq.positions, at::kLong);
  in.doc_start = at::tensor(seq.doc_start, at::kLong);
  at::NoGradGuard no_grad;
  const at::Tensor hidden =
      model->Hidden(in, [&](int64_t, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
        return kernels::DenseAttentionReference(q, k, v, in.doc_start);
      });
  const at::Tensor logits = at::matmul(hidden, model->lm_head().t());
  const at::Tensor labels = at::tensor(seq.labels, at::kLong);
  const double want =
      at::cross_entropy_loss(logits, labels, {}, at::Reduction::Sum, kernels::kIgnoreIndex).item<double>();
  EXPECT_NEAR(loss->loss_sum, want, 1e-10 * std::abs(want));
  EXPECT_EQ(loss->label_tokens, 39);
  // Every position's loss and greedy hit (the retrieval suites' exact match) as the full
  // forward's; the last position has no label.
  const at::Tensor per_token = at::cross_entropy_loss(logits, labels, {}, at::Reduction::None, kernels::kIgnoreIndex);
  const at::Tensor argmax = logits.argmax(-1);
  ASSERT_EQ(scores.loss.size(), 40u);
  int64_t hits = 0;
  for (int64_t t = 0; t < 39; ++t) {
    EXPECT_NEAR(scores.loss[t], per_token[t].item<double>(), 1e-10) << t;
    EXPECT_EQ(scores.hit[t], argmax[t].item<int64_t>() == seq.labels[t]) << t;
    hits += scores.hit[t] ? 1 : 0;
  }
  EXPECT_TRUE(std::isnan(scores.loss[39]));
  EXPECT_FALSE(scores.hit[39]);
  EXPECT_LT(hits, 39);

  // A greedy continuation (each token the full forward's argmax after the ones before) is a
  // hit at every position of it.
  std::vector<int64_t> ids(seq.ids.begin(), seq.ids.begin() + 20);
  while (ids.size() < 40) {
    ChunkInput g;
    const auto T = static_cast<int64_t>(ids.size());
    g.ids = at::tensor(ids, at::kLong);
    g.positions = at::arange(T, at::kLong);
    g.doc_start = at::zeros({T}, at::kLong);
    const at::Tensor h = model->Hidden(g, [&](int64_t, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
      return kernels::DenseAttentionReference(q, k, v, g.doc_start);
    });
    ids.push_back(at::matmul(h[T - 1], model->lm_head().t()).argmax().item<int64_t>());
  }
  ASSERT_TRUE(trainer.EvalSequence(TokenSequence::FromDocument(ids), &scores).ok());
  for (int64_t t = 19; t < 39; ++t) EXPECT_TRUE(scores.hit[t]) << t;
}

// A sequence of one chunk takes no KV or gradient pages, to train or to evaluate: no chunk
// reads its KV after it (the planner's pools for it: a page per layer).
TEST(ChunkTrainerTest, OneChunkTakesNoPages) {
  const ModelConfig config = TinyConfig("qwen2");
  auto model = Transformer::Random(config, at::kDouble, at::kCPU, 3, 0.2);
  ASSERT_TRUE(model->AddLora(LoraOptions{.rank = 4}, 5).ok());
  const TokenSequence seq = TokenSequence::FromDocument(RandomIds(24, config.vocab_size, 5));
  Pools pools = MakePools(config, 4, 0, at::kDouble);
  ChunkTrainerOptions options;
  options.chunk_tokens = 32;
  ChunkTrainer trainer(model.get(), pools.kv.get(), pools.grad.get(), options);
  auto trained = trainer.TrainSequence(seq, 1.0, 0);
  ASSERT_TRUE(trained.ok()) << trained.status();
  auto evaluated = trainer.EvalSequence(seq);
  ASSERT_TRUE(evaluated.ok()) << evaluated.status();
  EXPECT_NEAR(evaluated->loss_sum, trained->loss_sum, 1e-10 * trained->loss_sum);
  EXPECT_EQ(pools.kv->stats().peak_used_pages, 0);
  EXPECT_EQ(pools.grad->stats().peak_used_pages, 0);
}

// SpaCO (chunk_trainer.h): the gradient of one run over `seq` with `options`, taken from the
// model's trainable parameters.
Grads SpacoGrads(Transformer& model, const TokenSequence& seq, ChunkTrainerOptions options, uint64_t seed) {
  Pools pools = MakePools(model.config(), 4, seq.size(), at::kDouble);
  ChunkTrainer trainer(&model, pools.kv.get(), pools.grad.get(), options);
  auto loss = trainer.TrainSequence(seq, 1.0 / static_cast<double>(seq.label_tokens()), seed);
  EXPECT_TRUE(loss.ok()) << loss.status();
  EXPECT_EQ(pools.kv->stats().used_pages, 0);
  EXPECT_EQ(pools.grad->stats().used_pages, 0);
  return TakeGrads(model);
}

// The exact expectation of SpaCO's estimate at chunk_fraction p over `seq` cut into 5 chunks
// (options.chunk_tokens): every one of the 2^5 selections' gradients times its probability.
Grads SpacoExpectation(Transformer& model, const TokenSequence& seq, ChunkTrainerOptions options, double p) {
  options.chunk_fraction = p;
  Grads expectation;
  for (int mask = 0; mask < 32; ++mask) {
    options.keep_chunk = [mask](int64_t chunk) { return ((mask >> chunk) & 1) != 0; };
    const int kept = __builtin_popcount(mask);
    const double probability = std::pow(p, kept) * std::pow(1 - p, 5 - kept);
    for (const auto& [name, g] : SpacoGrads(model, seq, options, 0)) {
      expectation[name] = expectation.count(name) ? expectation[name] + probability * g : probability * g;
    }
  }
  return expectation;
}

// The exact expectation of SpaCO's estimate, summed over all 2^5 selections of 5 chunks with
// their probabilities, is the exact gradient (float64, to 1e-10): the estimator is unbiased by
// construction, not only in the mean of a sample. At chunk_fraction 1 it is the exact trainer.
TEST(SpacoTest, ExpectationOverEverySelectionIsTheExactGradient) {
  const Case c{"qwen2", false, at::kDouble, false};
  auto model = MakeModel(c, at::kDouble);
  const TokenSequence seq = TokenSequence::FromDocument(RandomIds(40, 61, 9));
  ChunkTrainerOptions options;
  options.chunk_tokens = 8;  // 5 chunks
  const Grads exact = SpacoGrads(*model, seq, options, 0);
  std::string worst;
  EXPECT_EQ(MaxRelativeError(SpacoGrads(*model, seq, options, 123), exact, &worst), 0.0) << worst;

  EXPECT_LE(MaxRelativeError(SpacoExpectation(*model, seq, options, 0.6), exact, &worst), 1e-10) << worst;
  // A single selection is not the exact gradient (the test can tell them apart).
  options.chunk_fraction = 0.6;
  options.keep_chunk = [](int64_t chunk) { return chunk % 2 == 0; };
  EXPECT_GT(MaxRelativeError(SpacoGrads(*model, seq, options, 0), exact, &worst), 1e-2);
}

// The statistical check: 400 estimates with their own random draws (p = 0.5), projected on
// three directions (the exact gradient's and two random ones, all tensors flattened together):
// each projection's sample mean is within 4 standard errors of the exact gradient's projection
// (a t-test; the draws are seeded, so the outcome is fixed). The same check rejects a biased
// estimate: SpaCO's times p, whose mean is p times the gradient.
TEST(SpacoTest, MeanOfRandomEstimatesIsUnbiased) {
  const Case c{"llama", false, at::kDouble, false};
  auto model = MakeModel(c, at::kDouble);
  const TokenSequence seq = TokenSequence::FromDocument(RandomIds(32, 61, 4));
  ChunkTrainerOptions options;
  options.chunk_tokens = 8;          // 4 chunks
  auto flat = [&](const Grads& g) {  // every parameter, zeros where no chunk was kept
    std::vector<at::Tensor> parts;
    for (const auto& [name, p] : model->TrainableParameters()) {
      parts.push_back(g.count(name) ? g.at(name).reshape({-1}) : at::zeros({p.numel()}, p.options()));
    }
    return at::cat(parts);
  };
  const at::Tensor exact = flat(SpacoGrads(*model, seq, options, 0));
  at::Generator gen = at::detail::createCPUGenerator(5);
  const std::vector<at::Tensor> directions = {exact / exact.norm(), at::randn(exact.sizes(), gen, at::kDouble),
                                              at::randn(exact.sizes(), gen, at::kDouble)};
  options.chunk_fraction = 0.5;
  const int n = 400;
  std::vector<at::Tensor> estimates;
  for (int i = 0; i < n; ++i)
    estimates.push_back(flat(SpacoGrads(*model, seq, options, 1000 + static_cast<uint64_t>(i))));
  const at::Tensor samples = at::stack(estimates);  // [n, parameters]
  auto t_statistics = [&](double weight) {
    std::vector<double> ts;
    for (const at::Tensor& v : directions) {
      const at::Tensor s = at::matmul(samples * weight, v);
      const double want = at::dot(exact, v).item<double>();
      ts.push_back((s.mean().item<double>() - want) / (s.std().item<double>() / std::sqrt(n)));
    }
    return ts;
  };
  for (const double t : t_statistics(1.0)) {
    std::cout << "SpaCO t statistic: " << t << "\n";
    EXPECT_LT(std::abs(t), 4.0);
  }
  EXPECT_GT(std::abs(t_statistics(0.5)[0]), 10.0);
}

// The router's auxiliary loss (RouterBalance; chunk_trainer.h): the chunked trainer gives the
// full-sequence gradients of CE + coef * aux (float64, 1e-9) both ways it gets the routing
// counts — exact dense training (stage 1 skips the last chunk: stage 2 tallies it) and sparse
// attention at a budget covering every page (stage 1 tallies every chunk) — and SpaCO's
// expectation over all 2^5 selections is that gradient; the loss it reports is the
// whole-sequence forward's; aux_scale weighs it (0: the gradients without it, which differ).
TEST(RouterAuxLossTest, ChunkedGradientsIncludeTheLoadBalancingLoss) {
  const Case c{"mixtral", false, at::kDouble, false};
  auto model = MakeModel(c, at::kDouble);
  ASSERT_GT(model->config().moe.aux_loss_coef, 0);
  const TokenSequence seq = TokenSequence::FromDocument(RandomIds(40, 61, 9));
  const double scale = 1.0 / static_cast<double>(seq.label_tokens());
  const Grads want = ReferenceGrads(*model, seq, scale);
  // The whole sequence's loss, as transformers' load_balancing_loss_func computes it.
  RouterBalance whole;
  {
    at::NoGradGuard no_grad;
    ChunkInput in;
    in.ids = at::tensor(seq.ids, at::kLong);
    in.positions = at::tensor(seq.positions, at::kLong);
    in.doc_start = at::tensor(seq.doc_start, at::kLong);
    in.balance = &whole;
    model->Hidden(in, [&](int64_t layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
      return DenseReference(*model, seq, layer, q, k, v, in.doc_start);
    });
  }
  EXPECT_EQ(whole.rows, 40 * 2);  // both layers are sparse
  EXPECT_EQ(whole.counts.sum().item<double>(), 40 * 2 * 2);
  const double want_aux = whole.Loss().item<double>();
  EXPECT_GT(want_aux, 0.0);  // E * sum_e F_e P_e: top_k (2) where the routing is uniform
  EXPECT_LE(want_aux, 4.0 * 2.0);

  const auto train = [&](ChunkTrainerOptions options, double aux_scale, double* aux) {
    Pools pools = MakePools(model->config(), 4, seq.size(), at::kDouble);
    ChunkTrainer trainer(model.get(), pools.kv.get(), pools.grad.get(), options);
    auto loss = trainer.TrainSequence(seq, scale, 0, aux_scale);
    EXPECT_TRUE(loss.ok()) << loss.status();
    if (aux != nullptr) *aux = loss.ok() ? loss->router_aux : 0;
    return TakeGrads(*model);
  };
  std::string worst;
  for (const int64_t chunk : {1, 8, 16, 64}) {
    ChunkTrainerOptions options;
    options.chunk_tokens = chunk;
    double aux = 0;
    EXPECT_LE(MaxRelativeError(train(options, 1.0, &aux), want, &worst), 1e-9) << "chunk " << chunk << ": " << worst;
    EXPECT_NEAR(aux, want_aux, 1e-12) << "chunk " << chunk;
  }
  ChunkTrainerOptions sparse;
  sparse.chunk_tokens = 12;
  sparse.sparse = kernels::PageSelectOptions{.page_budget = 13, .sink_pages = 1, .local_pages = 2};
  double aux = 0;
  EXPECT_LE(MaxRelativeError(train(sparse, 1.0, &aux), want, &worst), 1e-9) << "sparse: " << worst;
  EXPECT_NEAR(aux, want_aux, 1e-12);

  ChunkTrainerOptions spaco;
  spaco.chunk_tokens = 8;  // 5 chunks
  EXPECT_LE(MaxRelativeError(SpacoExpectation(*model, seq, spaco, 0.6), want, &worst), 1e-10) << "SpaCO: " << worst;

  // aux_scale 0: the gradients of the cross-entropy alone, which the loss changes.
  ModelConfig plain = TinyConfig("mixtral");
  plain.moe.aux_loss_coef = 0;
  auto without = MakeModel(c, at::kDouble, plain);
  const Grads want_plain = ReferenceGrads(*without, seq, scale);
  ChunkTrainerOptions options;
  options.chunk_tokens = 8;
  EXPECT_LE(MaxRelativeError(train(options, 0.0, nullptr), want_plain, &worst), 1e-9) << worst;
  EXPECT_GT(MaxRelativeError(want_plain, want, &worst), 1e-3) << worst;
}

// SpaCO's dropped chunks get no gradient pages. Keeping chunks 0, 2 and 4 of 5 (chunks of 8,
// pages of 4), only chunks 0 and 2 get gradient pages (the last chunk's receive nothing), where
// the exact trainer gives every earlier chunk's pages some. Sparse attention with a budget
// covering every page leaves out the same contributions as dense attention: the same gradients.
// A draw whose gradient pages the pools cannot hold is refused before any work.
TEST(SpacoTest, DroppedChunksGetNoGradientPages) {
  const Case c{"qwen2", false, at::kDouble, false};
  auto model = MakeModel(c, at::kDouble);
  const TokenSequence seq = TokenSequence::FromDocument(RandomIds(40, 61, 9));
  const double scale = 1.0 / static_cast<double>(seq.label_tokens());
  const int64_t L = model->config().num_layers;
  const auto run = [&](const ChunkTrainerOptions& o, int64_t* grad_peak) {
    Pools pools = MakePools(model->config(), 4, seq.size(), at::kDouble);
    ChunkTrainer trainer(model.get(), pools.kv.get(), pools.grad.get(), o);
    auto loss = trainer.TrainSequence(seq, scale, 0);
    EXPECT_TRUE(loss.ok()) << loss.status();
    *grad_peak = pools.grad->stats().peak_used_pages;
    return TakeGrads(*model);
  };
  ChunkTrainerOptions options;
  options.chunk_tokens = 8;
  int64_t exact_peak = 0, dense_peak = 0, sparse_peak = 0;
  run(options, &exact_peak);
  EXPECT_EQ(exact_peak, 8 * L);
  options.chunk_fraction = 0.6;
  options.keep_chunk = [](int64_t chunk) { return chunk % 2 == 0; };
  const Grads dense = run(options, &dense_peak);
  EXPECT_EQ(dense_peak, 4 * L);
  options.sparse = kernels::PageSelectOptions{.page_budget = 10, .sink_pages = 1, .local_pages = 2};
  const Grads sparse = run(options, &sparse_peak);
  EXPECT_LE(sparse_peak, 4 * L);
  std::string worst;
  EXPECT_LE(MaxRelativeError(sparse, dense, &worst), 1e-9) << worst;

  // Chunks 0 and 2 touch 4 pages per layer (chunk 4, the last, gets none): a gradient pool of 3
  // per layer is refused, one of 4 trains.
  for (const int64_t per_layer : {3, 4}) {
    Pools small = MakePools(model->config(), 4, seq.size(), at::kDouble);
    small.grad = *PagePool::Create(PageKind::kKvGrad, Tier::kDevice, small.grad->shape(),
                                   at::TensorOptions().dtype(at::kDouble), per_layer * L);
    ChunkTrainer trainer(model.get(), small.kv.get(), small.grad.get(), options);
    auto loss = trainer.TrainSequence(seq, scale, 0);
    if (per_layer == 4) {
      EXPECT_TRUE(loss.ok()) << loss.status();
      continue;
    }
    EXPECT_EQ(loss.status().code(), absl::StatusCode::kResourceExhausted) << loss.status();
    EXPECT_NE(loss.status().message().find("backward.chunk_fraction"), std::string::npos) << loss.status();
    EXPECT_EQ(small.kv->stats().peak_used_pages, 0);
  }
}

// Gradient pages that run out inside the backward (issue 36, item 9): the pool's
// RESOURCE_EXHAUSTED reaches the caller as itself, with its reason (DOES_NOT_FIT), which the
// scheduler does not retry; it used to surface as a LibTorch error, INTERNAL, retried.
TEST(ChunkTrainerTest, GradientPagesThatRunOutAreResourceExhaustedAndNotRetried) {
  const Case c{"qwen2", false, at::kDouble, false};
  auto model = MakeModel(c, at::kDouble);
  const TokenSequence seq = TokenSequence::FromDocument(RandomIds(40, 61, 9));
  const int64_t L = model->config().num_layers;
  Pools pools = MakePools(model->config(), 4, seq.size(), at::kDouble);
  pools.grad = *PagePool::Create(PageKind::kKvGrad, Tier::kDevice, pools.grad->shape(),
                                 at::TensorOptions().dtype(at::kDouble), 2 * L);  // the past needs 8 a layer
  ChunkTrainerOptions options;
  options.chunk_tokens = 8;
  ChunkTrainer trainer(model.get(), pools.kv.get(), pools.grad.get(), options);
  auto r = trainer.TrainSequence(seq, 1.0 / static_cast<double>(seq.label_tokens()), 0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_EQ(ReasonOf(r.status()), Reason::kDoesNotFit) << r.status();
  EXPECT_FALSE(IsRetryable(r.status()));
  EXPECT_NE(r.status().message().find("kv_grad page pool"), std::string::npos) << r.status();
}

// ---- Sparse attention (chunk_trainer.h) ---------------------------------------------------

using Selections = std::map<std::pair<int64_t, int64_t>, at::Tensor>;  // (chunk, layer) -> selection

// Full-sequence backpropagation through attention masked to the selections the chunked run
// made: chunk i's queries see the pages selection (i, layer) names and their own chunk
// causally (tests/kernels/sparse_attention_check.h's SelectionMask); a sliding-window layer
// (which selects nothing) sees its window.
Grads MaskedReferenceGrads(const Transformer& model, const TokenSequence& seq, double scale,
                           const Selections& selections, int64_t chunk, int64_t page) {
  const int64_t T = seq.size(), Hq = model.config().num_heads, Hkv = model.config().num_kv_heads;
  return FullSequenceGrads(
      model, seq, scale,
      [&](int64_t layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& doc_start) {
        if (model.spec().layers[layer].window > 0) return DenseReference(model, seq, layer, q, k, v, doc_start);
        at::Tensor allowed = at::zeros({Hq, T, T}, at::kBool);
        for (int64_t begin = 0, i = 0; begin < T; begin += chunk, ++i) {
          const int64_t C = std::min(chunk, T - begin);
          allowed.slice(1, begin, begin + C)
              .slice(2, 0, begin + C)
              .copy_(testing::SelectionMask(selections.at({i, layer}), doc_start, begin, C, Hq, page));
        }
        const at::Tensor kk = k.repeat_interleave(Hq / Hkv, 1).permute({1, 0, 2});
        const at::Tensor vv = v.repeat_interleave(Hq / Hkv, 1).permute({1, 0, 2});
        const at::Tensor scores =
            (at::matmul(q.permute({1, 0, 2}), kk.transpose(1, 2)) / std::sqrt(static_cast<double>(q.size(2))))
                .masked_fill(allowed.logical_not(), -std::numeric_limits<double>::infinity());
        return at::matmul(at::softmax(scores, -1), vv).permute({1, 0, 2});
      });
}

struct SparseCase {
  const char* name;
  kernels::PageSummary summary;
  bool packed;
};

class SparseTrainerTest : public ::testing::TestWithParam<SparseCase> {};

// Chunked sparse training gives the gradients of full-sequence training through attention
// restricted to the selected pages (float64, 1e-9), the same loss, and allocates gradient
// pages only for pages some chunk selected.
TEST_P(SparseTrainerTest, ChunkedGradientsEqualFullSequenceOverTheSelectedPages) {
  const SparseCase sc = GetParam();
  const Case c{"qwen2", false, at::kDouble, sc.packed};
  auto model = MakeModel(c, at::kDouble);
  const TokenSequence seq =
      sc.packed ? TokenSequence::Pack({RandomIds(30, 61, 1), RandomIds(41, 61, 2), RandomIds(25, 61, 3)})
                : TokenSequence::FromDocument(RandomIds(96, 61, 1));
  const double scale = 1.0 / static_cast<double>(seq.label_tokens());
  const int64_t page = 4, chunk = 8, L = model->config().num_layers;
  Pools pools = MakePools(model->config(), page, seq.size(), at::kDouble);
  ChunkTrainerOptions options;
  options.chunk_tokens = chunk;
  options.sparse =
      kernels::PageSelectOptions{.page_budget = 3, .sink_pages = 1, .local_pages = 1, .summary = sc.summary};
  Selections selections;
  // (chunk, layer) as stage 1 selected them, and (-1, n) when the n-th chunk of either stage ended.
  std::vector<std::pair<int64_t, int64_t>> order;
  options.on_selection = [&](int64_t i, int64_t layer, const at::Tensor& s) {
    selections[{i, layer}] = s.clone();
    order.emplace_back(i, layer);
  };
  int64_t ended = 0;
  options.should_stop = [&] {
    order.emplace_back(-1, ended++);
    return false;
  };
  ChunkTrainer trainer(model.get(), pools.kv.get(), pools.grad.get(), options);
  auto loss = trainer.TrainSequence(seq, scale, 0);
  ASSERT_TRUE(loss.ok()) << loss.status();
  const Grads got = TakeGrads(*model);
  ASSERT_EQ(static_cast<int64_t>(selections.size()), 12 * L);
  // Stage 1 ran chunks at once: chunk 1 selected its first layer before chunk 0 ended, and no
  // chunk selected a layer before the chunk before it (three at once: SparseStageOneTest).
  const auto when = [&](int64_t i, int64_t layer) {
    return std::find(order.begin(), order.end(), std::make_pair(i, layer)) - order.begin();
  };
  EXPECT_LT(when(1, 0), when(-1, 0));
  for (int64_t i = 1; i < 12; ++i) {
    for (int64_t layer = 0; layer < L; ++layer) EXPECT_LT(when(i - 1, layer), when(i, layer));
  }
  EXPECT_EQ(pools.kv->stats().used_pages, 0);
  EXPECT_EQ(pools.grad->stats().used_pages, 0);

  std::string worst;
  EXPECT_LE(MaxRelativeError(got, MaskedReferenceGrads(*model, seq, scale, selections, chunk, page), &worst), 1e-9)
      << worst;
  // The sparse model is not the dense one: the test can tell them apart.
  EXPECT_GT(MaxRelativeError(got, ReferenceGrads(*model, seq, scale), &worst), 1e-3);

  // Gradient pages: at most the pages some later chunk selected, fewer than all of them.
  int64_t selected = 0;
  for (int64_t layer = 0; layer < L; ++layer) {
    std::set<int64_t> pages;
    for (const auto& [key, s] : selections) {
      if (key.second != layer) continue;
      for (int64_t j = 0; j < s.numel(); ++j) {
        if (s.flatten()[j].item<int64_t>() >= 0) pages.insert(s.flatten()[j].item<int64_t>());
      }
    }
    selected += static_cast<int64_t>(pages.size());
  }
  EXPECT_LE(pools.grad->stats().peak_used_pages, selected);
  EXPECT_LT(selected, L * 24);
  const SparseStats& st = trainer.sparse_stats();
  EXPECT_GT(st.past_pages, st.selected_pages);
  EXPECT_GT(st.selected_pages, 0);
}

// Gemma 3's layers with sparse attention: the global layer selects pages, the sliding-window
// layer (a window of 11, no multiple of the page size) attends densely over its window and
// selects nothing. Chunked training gives the gradients of full-sequence training through that
// attention (float64, 1e-9), and the window's pages are released as in dense training.
TEST(SparseWindowedTrainerTest, GlobalLayersSelectAndSlidingWindowLayersAttendTheirWindow) {
  const Case c{"gemma3", false, at::kDouble, true};
  auto model = MakeModel(c, at::kDouble);
  ASSERT_TRUE(model->spec().HasWindows());
  const TokenSequence seq = TokenSequence::Pack({RandomIds(30, 61, 1), RandomIds(41, 61, 2), RandomIds(25, 61, 3)});
  const double scale = 1.0 / static_cast<double>(seq.label_tokens());
  // Chunks of 16: the window of 11 reaches back over a page boundary at each chunk start only, so
  // the sliding-window layer's other pages are released.
  const int64_t page = 4, chunk = 16, L = model->config().num_layers;
  Pools pools = MakePools(model->config(), page, seq.size(), at::kDouble);
  ChunkTrainerOptions options;
  options.chunk_tokens = chunk;
  options.sparse = kernels::PageSelectOptions{.page_budget = 3, .sink_pages = 1, .local_pages = 1};
  Selections selections;
  options.on_selection = [&](int64_t i, int64_t layer, const at::Tensor& s) { selections[{i, layer}] = s.clone(); };
  ChunkTrainer trainer(model.get(), pools.kv.get(), pools.grad.get(), options);
  auto loss = trainer.TrainSequence(seq, scale, 0);
  ASSERT_TRUE(loss.ok()) << loss.status();
  const Grads got = TakeGrads(*model);
  // Only the global layer (layer 1) selected, once a chunk.
  ASSERT_EQ(static_cast<int64_t>(selections.size()), 6);
  for (const auto& [key, s] : selections) EXPECT_EQ(key.second, 1);
  EXPECT_EQ(pools.kv->stats().used_pages, 0);
  EXPECT_EQ(pools.grad->stats().used_pages, 0);
  // The sliding-window layer held no more pages than its window lets later chunks read.
  const PastReach reach{.windows = model->spec().Windows(), .chunk_tokens = chunk};
  EXPECT_LE(pools.kv->stats().peak_used_pages, SequencePagesBound(seq.size(), page, reach, L));
  EXPECT_LT(pools.kv->stats().peak_used_pages, L * ((seq.size() + page - 1) / page));

  std::string worst;
  EXPECT_LE(MaxRelativeError(got, MaskedReferenceGrads(*model, seq, scale, selections, chunk, page), &worst), 1e-9)
      << worst;
  EXPECT_GT(MaxRelativeError(got, ReferenceGrads(*model, seq, scale), &worst), 1e-3);
  const SparseStats& st = trainer.sparse_stats();
  EXPECT_GT(st.past_pages, st.selected_pages);
  EXPECT_GT(st.selected_pages, 0);
}

// Sparse stage 1 keeps three chunks in flight: with four layers, chunk 2 selects its first
// layer before chunk 0 has finished (two in flight would start chunk 2 only after), and every
// chunk still selects a layer only after the chunk before it has written that layer.
TEST(SparseStageOneTest, RunsThreeChunksAtOnce) {
  auto model = Transformer::Random(testing::TinyLlamaConfig(61, 32, /*layers=*/4), at::kDouble, at::kCPU, 7, 0.2);
  LoraOptions lora;
  lora.rank = 4;
  ASSERT_TRUE(model->AddLora(lora, 11).ok());
  const TokenSequence seq = TokenSequence::FromDocument(RandomIds(64, 61, 1));
  const int64_t L = model->config().num_layers;
  Pools pools = MakePools(model->config(), 4, seq.size(), at::kDouble);
  ChunkTrainerOptions options;
  options.chunk_tokens = 8;
  options.sparse = kernels::PageSelectOptions{.page_budget = 3, .sink_pages = 1, .local_pages = 1};
  std::vector<std::pair<int64_t, int64_t>> order;  // (chunk, layer) selected; (-1, n): the n-th chunk ended
  options.on_selection = [&](int64_t i, int64_t layer, const at::Tensor&) { order.emplace_back(i, layer); };
  int64_t ended = 0;
  options.should_stop = [&] {
    order.emplace_back(-1, ended++);
    return false;
  };
  ChunkTrainer trainer(model.get(), pools.kv.get(), pools.grad.get(), options);
  auto loss = trainer.TrainSequence(seq, 1.0 / static_cast<double>(seq.label_tokens()), 0);
  ASSERT_TRUE(loss.ok()) << loss.status();
  const auto when = [&](int64_t i, int64_t layer) {
    return std::find(order.begin(), order.end(), std::make_pair(i, layer)) - order.begin();
  };
  EXPECT_LT(when(2, 0), when(-1, 0));
  for (int64_t i = 1; i < 8; ++i) {
    for (int64_t layer = 0; layer < L; ++layer) EXPECT_LT(when(i - 1, layer), when(i, layer));
  }
}

// With a budget covering every page, sparse training is dense training (float64, 1e-9).
TEST_P(SparseTrainerTest, FullBudgetEqualsDenseTraining) {
  const SparseCase sc = GetParam();
  const Case c{"llama", false, at::kDouble, sc.packed};
  auto model = MakeModel(c, at::kDouble);
  const TokenSequence seq = sc.packed ? TokenSequence::Pack({RandomIds(19, 61, 4), RandomIds(31, 61, 5)})
                                      : TokenSequence::FromDocument(RandomIds(50, 61, 4));
  const double scale = 1.0 / static_cast<double>(seq.label_tokens());
  const Grads want = ReferenceGrads(*model, seq, scale);
  Pools pools = MakePools(model->config(), 4, seq.size(), at::kDouble);
  ChunkTrainerOptions options;
  options.chunk_tokens = 12;
  options.sparse =
      kernels::PageSelectOptions{.page_budget = 13, .sink_pages = 1, .local_pages = 2, .summary = sc.summary};
  ChunkTrainer trainer(model.get(), pools.kv.get(), pools.grad.get(), options);
  auto loss = trainer.TrainSequence(seq, scale, 0);
  ASSERT_TRUE(loss.ok()) << loss.status();
  std::string worst;
  EXPECT_LE(MaxRelativeError(TakeGrads(*model), want, &worst), 1e-9) << worst;
  if (!sc.packed) {
    EXPECT_EQ(trainer.sparse_stats().selected_pages, trainer.sparse_stats().past_pages);
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, SparseTrainerTest,
                         ::testing::Values(SparseCase{"mean_key", kernels::PageSummary::kMeanKey, false},
                                           SparseCase{"min_max", kernels::PageSummary::kMinMax, false},
                                           SparseCase{"mean_key_packed", kernels::PageSummary::kMeanKey, true}),
                         [](const auto& info) { return std::string(info.param.name); });

// A recycled page is zero: nothing stale reaches a gradient accumulator.
TEST(PagePoolTest, RecycledPagesAreZeroed) {
  auto pool = *PagePool::Create(PageKind::kKvGrad, Tier::kHost, {2, 4, 8}, at::TensorOptions().dtype(at::kFloat), 2);
  auto a = pool->Allocate();
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->tier(), Tier::kHost);
  pool->Page(*a).fill_(3.5);
  pool->Free(*a);
  auto b = pool->Allocate();  // the other, never used slot
  auto c = pool->Allocate();  // the recycled one
  ASSERT_TRUE(b.ok() && c.ok());
  EXPECT_EQ(c->slot(), a->slot());
  EXPECT_EQ(pool->Page(*c).abs().sum().item<float>(), 0.0f);
  EXPECT_FALSE(pool->CanAllocate(1));
  auto d = pool->Allocate();
  EXPECT_EQ(d.status().code(), absl::StatusCode::kResourceExhausted);
  const PoolStats s = pool->stats();
  EXPECT_EQ(s.used_pages, 2);
  EXPECT_EQ(s.bytes_per_page, 2 * 2 * 4 * 8 * 4);
}

// FusedAdamW (worker/train/fused_adamw.h) steps as LibTorch's AdamW does: three steps over
// parameters of several shapes, one without a gradient at the second step (its state and step
// count stay), in `dt` on `device`; equal within float rounding, the step counts exactly.
void ExpectFusedAdamWStepsAsLibTorch(at::Device device, at::ScalarType dt) {
  SCOPED_TRACE(device.str() + " " + c10::toString(dt));
  at::manual_seed(3);
  const auto o = at::device(device).dtype(dt);
  std::vector<at::Tensor> a = {at::randn({7, 5}, o), at::randn({300}, o), at::randn({2, 3, 4}, o)}, b;
  for (const at::Tensor& t : a) b.push_back(t.clone());
  for (at::Tensor& t : a) t.requires_grad_(true);
  for (at::Tensor& t : b) t.requires_grad_(true);
  torch::optim::AdamWOptions options(1e-2);
  options.betas({0.9, 0.95});
  options.eps(1e-6);
  options.weight_decay(0.1);
  torch::optim::AdamW reference(a, options);
  FusedAdamW fused(b, options);
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < a.size(); ++i) {
      if (step == 1 && i == 2) continue;  // no gradient this step
      const at::Tensor g = at::randn(a[i].sizes(), o);
      a[i].mutable_grad() = g.clone();
      b[i].mutable_grad() = g.clone();
    }
    reference.step();
    fused.step();
    reference.zero_grad(/*set_to_none=*/true);
    fused.zero_grad(/*set_to_none=*/true);
  }
  const double tol = dt == at::kFloat ? 1e-6 : 1e-13;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(at::allclose(a[i], b[i], tol, tol)) << i << ": " << (a[i] - b[i]).abs().max().item<double>();
    const auto& ra =
        static_cast<const torch::optim::AdamWParamState&>(*reference.state().at(a[i].unsafeGetTensorImpl()));
    const auto& fa = static_cast<const torch::optim::AdamWParamState&>(*fused.state().at(b[i].unsafeGetTensorImpl()));
    EXPECT_EQ(ra.step(), fa.step()) << i;
    EXPECT_EQ(fa.step(), i == 2 ? 2 : 3) << i;
    EXPECT_TRUE(at::allclose(ra.exp_avg(), fa.exp_avg(), tol, tol)) << i;
    EXPECT_TRUE(at::allclose(ra.exp_avg_sq(), fa.exp_avg_sq(), tol, tol)) << i;
  }
}

TEST(FusedAdamWTest, StepsAsLibTorchAdamWDoes) {
  ExpectFusedAdamWStepsAsLibTorch(at::kCPU, at::kFloat);
  ExpectFusedAdamWStepsAsLibTorch(at::kCPU, at::kDouble);
}

// The same in float32 on a GPU (a test of its own, labelled gpu: it skips, visibly, without one).
TEST(FusedAdamWGpuTest, StepsAsLibTorchAdamWDoes) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  ExpectFusedAdamWStepsAsLibTorch(at::kCUDA, at::kFloat);
}

}  // namespace
}  // namespace oomb
