// Tensor parallelism (worker/model/tensor_parallel.h) on the CPU: N ranks, threads of this
// process over Gloo, train a sequence with the chunk-recurrent trainer and give one rank's
// loss and gradients (float64 within 1e-9, float32 within 1e-5), for every family, LoRA and full
// fine-tuning, dense, windowed and sparse attention, experts (also on grouped products); and a
// sharded model gathers back into the whole one bit for bit.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kernels/torch/matmul.h"
#include "tests/worker/tiny_model.h"
#include "worker/job/build_info.h"
#include "worker/kv/page_pool.h"
#include "worker/model/transformer.h"
#include "worker/plan/memory_planner.h"
#include "worker/train/chunk_trainer.h"
#include "worker/train/rank_group.h"

namespace oomb {
namespace {

using testing::Grads;
using testing::MaxRelativeError;
using testing::TakeGrads;

struct TpCase {
  std::string family;
  bool full;
  at::ScalarType dtype;
  bool sparse = false;
  double dropout = 0;
  // The experts on grouped products (the CPU's grouped loop; GroupedExpertMlp with LoRA), the
  // first sparse layer recomputing its gate_up product in backward.
  bool grouped = false;
};

// The family's tiny model with 8 heads over 4 KV heads, so that 2 and 4 ranks divide them; its
// vocabulary of 61 tokens does not divide evenly.
ModelConfig TpConfig(const std::string& family) {
  ModelConfig c = testing::TinyConfig(family);
  c.num_heads = 8;
  c.num_kv_heads = 4;
  return c;
}

std::unique_ptr<Transformer> MakeModel(const TpCase& c) {
  auto model = Transformer::Random(TpConfig(c.family), c.dtype, at::kCPU, /*seed=*/7, /*init_std=*/0.2);
  if (c.grouped) {
    model->set_expert_kernel(ExpertKernel::kGrouped);
    model->set_expert_recompute_layers(1);
  }
  if (c.full) {
    model->EnableFullFineTuning();
    return model;
  }
  LoraOptions lora;
  lora.rank = 4;
  lora.dropout = c.dropout;
  EXPECT_TRUE(model->AddLora(lora, 11).ok());
  testing::RandomizeLoraB(*model, 13);
  return model;
}

TokenSequence Sequence(int64_t vocab) {
  std::vector<std::vector<int64_t>> docs;
  uint64_t seed = 1;
  for (const int64_t len : {17, 25, 22}) {
    at::Generator gen = at::detail::createCPUGenerator(seed++);
    const at::Tensor t = at::randint(0, vocab, {len}, gen, at::kLong);
    docs.emplace_back(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + len);
  }
  return TokenSequence::Pack(docs);
}

struct Outcome {
  double loss = 0;
  Grads grads;  // the whole model's, gathered
};

// One rank's training of the case's sequence; `group` null: one rank alone.
Outcome TrainRank(const TpCase& c, RankGroup* group) {
  auto model = MakeModel(c);
  if (group != nullptr) {
    EXPECT_TRUE(model->Shard(*group).ok());
  }
  const ModelConfig& config = model->config();
  const TokenSequence seq = Sequence(config.vocab_size);
  const int64_t page = c.sparse ? 4 : 3;
  const PageShape shape{model->local_kv_heads(), page, config.head_dim};
  const int64_t pages = config.num_layers * (seq.size() / page + 2);
  const at::ScalarType grad_dtype = c.dtype == at::kDouble ? at::kDouble : at::kFloat;
  auto kv = *PagePool::Create(PageKind::kKv, Tier::kDevice, shape, at::TensorOptions().dtype(c.dtype), pages);
  auto grad = *PagePool::Create(PageKind::kKvGrad, Tier::kDevice, shape, at::TensorOptions().dtype(grad_dtype), pages);
  ChunkTrainerOptions options;
  options.chunk_tokens = c.sparse ? 8 : 16;
  options.attention_key_block = 7;
  options.ce_rows_per_block = 5;
  if (c.sparse) options.sparse = kernels::PageSelectOptions{.page_budget = 3, .sink_pages = 1, .local_pages = 1};
  ChunkTrainer trainer(model.get(), kv.get(), grad.get(), options);
  auto loss = trainer.TrainSequence(seq, 1.0 / static_cast<double>(seq.label_tokens()), /*dropout_seed=*/5);
  EXPECT_TRUE(loss.ok()) << loss.status();
  if (group != nullptr) {
    EXPECT_TRUE(group->AllReduceGradients(model->PartialGradients()).ok());
  }
  Outcome out;
  out.loss = loss.ok() ? loss->loss_sum : NAN;
  out.grads = TakeGrads(*model->Whole());
  return out;
}

// `fn(rank, group)` on `size` ranks, threads of this process; rank 0's result.
template <typename Fn>
auto OnRanks(int size, Fn fn) {
  const Rendezvous rendezvous = Rendezvous::InProcess();
  std::vector<std::optional<decltype(fn(nullptr))>> results(size);  // not vector<bool>: ranks write at once
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      auto group = RankGroup::Join(rendezvous, rank, size, at::kCPU, absl::Minutes(2));
      ASSERT_TRUE(group.ok()) << group.status();
      results[rank] = fn(group->get());
    });
  }
  for (std::thread& t : threads) t.join();
  return std::move(results[0]).value();
}

class TensorParallelTest : public ::testing::TestWithParam<TpCase> {};

TEST_P(TensorParallelTest, RanksGiveTheGradientsOfOneRank) {
  const TpCase c = GetParam();
  const Outcome one = TrainRank(c, nullptr);
  ASSERT_FALSE(one.grads.empty());
  const double tolerance = c.dtype == at::kDouble ? 1e-9 : 1e-5;
  for (const int size : {2, 4}) {
    // Grouped GEMMs take rows of 16 bytes: the tiny experts' intermediate splits into 2 such shards, not 4.
    if (c.grouped && !kernels::GroupedMatmulTakes(c.dtype, {TpConfig(c.family).moe.intermediate / size})) continue;
    const Outcome many = OnRanks(size, [&](RankGroup* group) { return TrainRank(c, group); });
    EXPECT_NEAR(many.loss, one.loss, tolerance * std::abs(one.loss)) << size << " ranks";
    std::string worst;
    const double err = MaxRelativeError(many.grads, one.grads, &worst);
    EXPECT_LE(err, tolerance) << size << " ranks: worst " << worst;
    EXPECT_EQ(many.grads.size(), one.grads.size());
    std::cout << size << " ranks: max relative gradient error " << err << "\n";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Tiny, TensorParallelTest,
    ::testing::Values(TpCase{"llama", false, at::kDouble}, TpCase{"llama", true, at::kDouble},
                      TpCase{"qwen2", false, at::kDouble, false, 0.1}, TpCase{"qwen2", false, at::kDouble, true},
                      TpCase{"qwen3", true, at::kDouble}, TpCase{"mistral", true, at::kFloat},
                      TpCase{"gemma3", false, at::kDouble}, TpCase{"gemma3", true, at::kDouble},
                      TpCase{"gemma3", false, at::kDouble, true}, TpCase{"phi3", false, at::kDouble},
                      TpCase{"phi3", true, at::kDouble}, TpCase{"qwen3_moe", false, at::kDouble},
                      TpCase{"qwen3_moe", false, at::kFloat, false, 0, true}, TpCase{"mixtral", true, at::kDouble},
                      TpCase{"gpt_oss", false, at::kDouble}, TpCase{"gpt_oss", true, at::kDouble}),
    [](const auto& info) {
      const TpCase& c = info.param;
      return c.family + (c.full ? "_full" : "_lora") + (c.dtype == at::kDouble ? "_f64" : "_f32") +
             (c.sparse ? "_sparse" : "") + (c.dropout > 0 ? "_dropout" : "") + (c.grouped ? "_grouped" : "");
    });

// Shard, then Whole, gives every weight and adapter back bit for bit, under the names
// checkpoints use; every rank holds a share of each split tensor, no more.
TEST(TensorParallelLayoutTest, ShardThenWholeGivesTheModelBack) {
  for (const std::string family : {"llama", "phi3", "gemma3", "gpt_oss", "qwen3_moe"}) {
    const TpCase c{family, false, at::kFloat};
    const auto whole = MakeModel(c);
    const bool same = OnRanks(4, [&](RankGroup* group) {
      auto model = MakeModel(c);
      const int64_t before = model->BaseParameters().front().second.numel();
      EXPECT_TRUE(model->Shard(*group).ok());
      EXPECT_LT(model->BaseParameters().front().second.numel(), before) << "the embedding is split";
      const auto back = model->Whole();
      bool equal = true;
      const auto a = back->BaseParameters(), b = whole->BaseParameters();
      const auto la = back->TrainableParameters(), lb = whole->TrainableParameters();

      // Drawn sharded (Random's tensor_parallel): the same weights and LoRA A as drawn whole.
      auto drawn = Transformer::Random(TpConfig(family), at::kFloat, at::kCPU, /*seed=*/7, /*init_std=*/0.2, group);
      LoraOptions lora;
      lora.rank = 4;
      EXPECT_TRUE(drawn->AddLora(lora, 11).ok());
      const auto drawn_whole = drawn->Whole();
      const auto d = drawn_whole->BaseParameters(), ld = drawn_whole->TrainableParameters();
      for (size_t i = 0; i < d.size() && i < b.size(); ++i) {
        EXPECT_TRUE(d[i].second.equal(b[i].second)) << family << " drawn sharded: " << d[i].first;
      }
      for (size_t i = 0; i < ld.size() && i < lb.size(); ++i) {
        if (ld[i].first.find("lora_A") == std::string::npos) continue;
        EXPECT_TRUE(ld[i].second.equal(lb[i].second)) << family << " drawn sharded: " << ld[i].first;
      }
      EXPECT_EQ(a.size(), b.size());
      EXPECT_EQ(la.size(), lb.size());
      for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
        EXPECT_TRUE(a[i].second.equal(b[i].second)) << family << " " << a[i].first;
        equal = equal && a[i].second.equal(b[i].second);
      }
      for (size_t i = 0; i < la.size() && i < lb.size(); ++i) {
        EXPECT_TRUE(la[i].second.equal(lb[i].second)) << family << " " << la[i].first;
        equal = equal && la[i].second.equal(lb[i].second);
      }
      return equal;
    });
    EXPECT_TRUE(same) << family;
  }
}

// The planner plans a rank with its shard (ShardConfig): its weights and LoRA state are the
// bytes the rank holds, its KV per token 1/N of one device's, and the longest context grows.
TEST(TensorParallelPlanTest, ARanksPlanCountsItsShards) {
  JobConfig job;
  job.model.dtype = ModelDtype::kFloat32;
  job.method.lora.rank = 4;
  job.data.max_seq_len = 4096;
  PlanTarget target;
  target.device = "cuda:0";
  target.device_bytes = int64_t{4} << 30;
  target.host_bytes = int64_t{24} << 30;
  const ModelConfig config = TpConfig("qwen2");
  const auto one = PlanMemory(config, job, target);
  ASSERT_TRUE(one.ok()) << one.status();
  for (const int n : {2, 4}) {
    JobConfig sharded = job;
    sharded.parallel.tensor = n;
    sharded.resources.gpus = n;
    const auto plan = PlanMemory(config, sharded, target);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const auto [weights, trainable] = OnRanks(n, [&](RankGroup* group) {
      auto model = MakeModel(TpCase{"qwen2", false, at::kFloat});
      EXPECT_TRUE(model->Shard(*group).ok());
      int64_t w = 0, t = 0;
      for (const auto& [name, p] : model->BaseParameters()) w += p.numel() * 4;
      for (const auto& [name, p] : model->TrainableParameters()) t += p.numel() * 4 * 4;  // + grad, 2 moments
      return std::make_pair(w, t);
    });
    EXPECT_EQ(plan->weights_bytes, weights) << n << " ranks";
    EXPECT_EQ(plan->trainable_state_bytes, trainable) << n << " ranks";
    EXPECT_EQ(plan->kv_bytes_per_token * n, one->kv_bytes_per_token) << n << " ranks";
    EXPECT_GT(plan->max_seq_len_that_fits, one->max_seq_len_that_fits) << n << " ranks";
    EXPECT_NE(plan->choices.front().find("the plan of one rank"), std::string::npos) << plan->choices.front();
  }
  JobConfig three = job;
  three.parallel.tensor = three.resources.gpus = 3;
  const auto refused = PlanMemory(config, three, target);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("parallel.tensor: tensor parallelism over 3 ranks"), std::string::npos)
      << refused.status();
}

// The run's log line on the groups' links, from what NVML answers for each pair.
TEST(TensorParallelLinksTest, NamesThePairsWithoutNvLink) {
  const std::vector<std::string> gpus = {"cuda:0", "cuda:1", "cuda:2", "cuda:3"};
  EXPECT_EQ(DescribeTensorParallelLinks(gpus, 4, [](int, int) { return true; }),
            "tensor parallel: 1 group of 4 ranks (cuda:0, cuda:1, cuda:2, cuda:3), NVLink between every pair of a "
            "group (NCCL)");
  EXPECT_EQ(DescribeTensorParallelLinks(gpus, 2, [](int a, int b) { return a / 2 == b / 2 && a != 2; }),
            "tensor parallel: 2 groups of 2 ranks (cuda:0, cuda:1 | cuda:2, cuda:3), without NVLink (PCIe or the "
            "host) between cuda:2-cuda:3: each layer's sums cross that link (NCCL)");
  EXPECT_EQ(DescribeTensorParallelLinks(
                gpus, 2,
                [](int, int) -> absl::StatusOr<bool> { return absl::UnavailableError("NVML: no libnvidia-ml.so.1"); }),
            "tensor parallel: 2 groups of 2 ranks (cuda:0, cuda:1 | cuda:2, cuda:3), links unknown (NVML: no "
            "libnvidia-ml.so.1)");
}

TEST(TensorParallelLayoutTest, GroupsThatDoNotDivideTheHeadsAreRefused) {
  const std::string message = OnRanks(3, [](RankGroup* group) {
    auto model = MakeModel(TpCase{"llama", false, at::kFloat});
    return std::string(model->Shard(*group).message());
  });
  EXPECT_NE(message.find("num_attention_heads = 8 is not a multiple of 3"), std::string::npos) << message;
}

}  // namespace
}  // namespace oomb
