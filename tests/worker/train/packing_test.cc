// Packing exactness (issue 10): training on documents packed into one sequence gives the same
// loss and the same parameter gradients as training on each document on its own, with the same
// normalisation (loss_scale = 1 / label tokens of all the documents), in float64. Packing keeps
// positions restarting at each document, no attention across documents, and no loss on the
// last token of a document (it would predict the next document's first token); any leak shows
// up here as a gradient difference far above float64 rounding.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <iostream>
#include <map>
#include <string>

#include "tests/worker/tiny_model.h"
#include "worker/data/dataset.h"
#include "worker/train/chunk_trainer.h"

namespace oomb {
namespace {

using testing::Grads;
using testing::MaxRelativeError;
using testing::TakeGrads;

struct TrainRig {
  std::unique_ptr<Transformer> model;
  std::unique_ptr<PagePool> kv, grad;
};

TrainRig MakeRig(bool full, int64_t page_tokens, int64_t tokens) {
  const ModelConfig c = testing::TinyLlamaConfig();
  TrainRig s;
  s.model = Transformer::Random(c, at::kDouble, at::kCPU, /*seed=*/21, /*init_std=*/0.2);
  if (full) {
    s.model->EnableFullFineTuning();
  } else {
    LoraOptions lora;
    lora.rank = 4;
    EXPECT_TRUE(s.model->AddLora(lora, 3).ok());
    testing::RandomizeLoraB(*s.model, 9);
  }
  const PageShape shape{c.num_kv_heads, page_tokens, c.head_dim};
  const int64_t pages = c.num_layers * ((tokens + page_tokens - 1) / page_tokens + 1);
  s.kv = *PagePool::Create(PageKind::kKv, Tier::kDevice, shape, at::TensorOptions().dtype(at::kDouble), pages);
  s.grad = *PagePool::Create(PageKind::kKvGrad, Tier::kDevice, shape, at::TensorOptions().dtype(at::kDouble), pages);
  return s;
}

// Documents as the dataset reader makes them: labels = ids, with -100 on a "prompt" prefix of
// some of them (prompt/completion and chat samples).
std::vector<Document> MakeDocuments() {
  const auto ids = testing::RandomDocs(4, 5, 30, testing::TinyLlamaConfig().vocab_size, 77);
  std::vector<Document> docs;
  for (size_t i = 0; i < ids.size(); ++i) {
    Document d{ids[i], ids[i], static_cast<int64_t>(i + 1)};
    if (i % 2 == 1) {
      for (size_t t = 0; t < d.labels.size() / 2; ++t) d.labels[t] = kIgnoreLabel;
    }
    docs.push_back(std::move(d));
  }
  docs.push_back(Document{{7}, {7}, 5});  // a one-token document: no label at all
  return docs;
}

class PackingTest : public ::testing::TestWithParam<bool> {};

TEST_P(PackingTest, PackedGradientsEqualPerDocumentGradients) {
  const bool full = GetParam();
  const std::vector<Document> docs = MakeDocuments();
  int64_t total = 0;
  for (const Document& d : docs) total += static_cast<int64_t>(d.ids.size());
  // Unshuffled packing into one sequence (the dataset path the executor uses).
  const std::vector<TokenSequence> packed = PackDocuments(docs, total, /*packing=*/true, /*shuffle_seed=*/-1);
  ASSERT_EQ(packed.size(), 1u);
  const TokenSequence& seq = packed[0];
  ASSERT_EQ(seq.size(), total);
  int64_t label_tokens = 0;
  std::vector<TokenSequence> separate;
  for (const Document& d : docs) {
    TokenSequence s;
    s.Append(d);
    label_tokens += s.label_tokens();
    separate.push_back(std::move(s));
  }
  ASSERT_EQ(seq.label_tokens(), label_tokens);
  const double scale = 1.0 / static_cast<double>(label_tokens);

  for (const int64_t chunk : {4, 11, 64}) {  // chunks that cut documents, and one chunk for all
    for (const int64_t page : {3, 8}) {
      TrainRig s = MakeRig(full, page, total);
      ChunkTrainerOptions options;
      options.chunk_tokens = chunk;
      options.attention_key_block = 5;
      options.ce_rows_per_block = 7;
      ChunkTrainer trainer(s.model.get(), s.kv.get(), s.grad.get(), options);
      double separate_loss = 0;
      for (const TokenSequence& one : separate) {
        auto l = trainer.TrainSequence(one, scale, 0);
        ASSERT_TRUE(l.ok()) << l.status();
        separate_loss += l->loss_sum;
      }
      const Grads want = TakeGrads(*s.model);
      auto l = trainer.TrainSequence(seq, scale, 0);
      ASSERT_TRUE(l.ok()) << l.status();
      const Grads got = TakeGrads(*s.model);
      EXPECT_EQ(l->label_tokens, label_tokens);
      EXPECT_NEAR(l->loss_sum, separate_loss, 1e-12 * separate_loss);
      std::string worst;
      const double err = MaxRelativeError(got, want, &worst);
      std::cout << (full ? "full" : "lora") << " chunk " << chunk << " page " << page
                << ": packed vs separate, max relative gradient error " << err << " (" << worst << ")\n";
      EXPECT_LE(err, 1e-10) << worst;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, PackingTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Full" : "Lora"; });

// The control: without the document boundaries (one document of the same tokens) the gradients
// differ, so the comparison above can fail.
TEST(PackingTest, IgnoringBoundariesChangesGradients) {
  const std::vector<Document> docs = MakeDocuments();
  const TokenSequence packed = PackDocuments(docs, 1 << 20, true, -1)[0];
  TokenSequence merged = TokenSequence::FromDocument(packed.ids);
  TrainRig s = MakeRig(true, 8, packed.size());
  ChunkTrainerOptions options;
  options.chunk_tokens = 11;
  ChunkTrainer trainer(s.model.get(), s.kv.get(), s.grad.get(), options);
  ASSERT_TRUE(trainer.TrainSequence(packed, 1.0, 0).ok());
  const Grads a = TakeGrads(*s.model);
  ASSERT_TRUE(trainer.TrainSequence(merged, 1.0, 0).ok());
  std::string worst;
  EXPECT_GT(MaxRelativeError(TakeGrads(*s.model), a, &worst), 1e-3);
}

}  // namespace
}  // namespace oomb
