// The data-parallel gradient case shared by data_parallel_test (the single-process reference)
// and dp_rank (one rank of a multi-process group): a tiny float32 Llama with LoRA (B
// randomised, so that every gradient is non-zero) and four sequences of different lengths.
#ifndef OOMB_TESTS_WORKER_TRAIN_DP_CASE_H_
#define OOMB_TESTS_WORKER_TRAIN_DP_CASE_H_

#include <ATen/ATen.h>

#include <memory>
#include <vector>

#include "tests/worker/tiny_model.h"
#include "worker/kv/page_pool.h"
#include "worker/model/transformer.h"
#include "worker/train/chunk_trainer.h"
#include "worker/train/rank_group.h"

namespace oomb::testing {

struct DpCase {
  std::unique_ptr<Transformer> model;
  std::vector<TokenSequence> batch;
  int64_t label_tokens = 0;
};

inline DpCase MakeDpCase() {
  DpCase c;
  const ModelConfig config = TinyLlamaConfig();
  c.model = Transformer::Random(config, at::kFloat, at::kCPU, /*seed=*/7, /*init_std=*/0.2);
  LoraOptions lora;
  lora.rank = 4;
  if (!c.model->AddLora(lora, 11).ok()) std::abort();
  at::NoGradGuard no_grad;
  at::Generator gen = at::detail::createCPUGenerator(13);
  for (auto& [name, p] : c.model->TrainableParameters()) {
    if (name.find("lora_B") != std::string::npos) p.copy_(at::normal(0, 0.2, p.sizes(), gen, at::kFloat));
  }
  uint64_t seed = 21;
  for (const int64_t len : {40, 25, 33, 18}) {
    c.batch.push_back(TokenSequence::FromDocument(RandomDocs(1, len, len, config.vocab_size, seed++)[0]));
    c.label_tokens += c.batch.back().label_tokens();
  }
  return c;
}

// Trains the sequences of `c.batch` that `group` owns (all of them without a group), each
// scaled by 1 / (label tokens of the whole batch) as the executor does, sums the gradients
// over the group, and returns them flattened in TrainableParameters order.
inline at::Tensor TrainShare(DpCase& c, RankGroup* group) {
  const ModelConfig& config = c.model->config();
  const int64_t page = 8;
  const PageShape shape{config.num_kv_heads, page, config.head_dim};
  const int64_t pages = config.num_layers * (64 / page + 1);
  auto kv = *PagePool::Create(PageKind::kKv, Tier::kDevice, shape, at::TensorOptions().dtype(at::kFloat), pages);
  auto grad = *PagePool::Create(PageKind::kKvGrad, Tier::kDevice, shape, at::TensorOptions().dtype(at::kFloat), pages);
  ChunkTrainerOptions options;
  options.chunk_tokens = 16;
  ChunkTrainer trainer(c.model.get(), kv.get(), grad.get(), options);
  for (size_t i = 0; i < c.batch.size(); ++i) {
    if (group != nullptr && !group->Owns(static_cast<int64_t>(i))) continue;
    if (!trainer.TrainSequence(c.batch[i], 1.0 / static_cast<double>(c.label_tokens), /*dropout_seed=*/i).ok()) {
      std::abort();
    }
  }
  std::vector<at::Tensor> params, flat;
  for (auto& [name, p] : c.model->TrainableParameters()) params.push_back(p);
  if (group != nullptr && !group->AllReduceGradients(params).ok()) std::abort();
  for (const at::Tensor& p : params) flat.push_back(p.grad().reshape({-1}));
  return at::cat(flat);
}

}  // namespace oomb::testing

#endif  // OOMB_TESTS_WORKER_TRAIN_DP_CASE_H_
