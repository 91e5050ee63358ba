// Training with pages on the host tier (docs/ARCHITECTURE.md §4): whole training steps, dense and
// sparse, bit-identical to training with every page on the device; on a GPU, a step waits for
// the device only for its loss; bfloat16 gradient pages change the gradients by their rounding
// only.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/Exception.h>
#include <torch/cuda.h>

#include <cmath>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "tests/worker/kv/kv_testing.h"
#include "tests/worker/tiny_model.h"
#include "worker/kv/kv_pools.h"
#include "worker/train/chunk_trainer.h"

namespace oomb {
namespace {

using namespace testing;  // NOLINT(build/namespaces): the KV tests' shared helpers

std::unique_ptr<Transformer> LoraModel(at::ScalarType dtype = at::kDouble, at::Device device = at::kCPU) {
  auto model = Transformer::Random(testing::TinyLlamaConfig(), dtype, device, /*seed=*/3, /*init_std=*/0.2);
  LoraOptions lora;
  lora.rank = 4;
  EXPECT_TRUE(model->AddLora(lora, 5).ok());
  testing::RandomizeLoraB(*model, 13);
  return model;
}

TokenSequence SeventyTokens() {
  std::vector<int64_t> ids;
  for (int i = 0; i < 70; ++i) ids.push_back((i * 37 + 11) % 61);
  return TokenSequence::FromDocument(ids);
}

// A whole training step with most pages in the host tier gives the same loss and gradients as
// with every page on the device, dense and sparse; the host tier was used both ways. On the
// CPU bit for bit. On a GPU within `tolerance`: there the copies run on their own streams,
// beside the computation, ordered by events only (a copy that overtook a write, or a buffer
// reused before its copy landed, would show as garbage), and sparse stage 1 overlaps its two
// chunks' fetches with their computation.
void CheckTrainingStep(const Target& target, double tolerance) {
  for (const bool sparse : {false, true}) {
    SCOPED_TRACE(sparse ? "sparse" : "dense");
    const TokenSequence seq = SeventyTokens();
    const double scale = 1.0 / static_cast<double>(seq.label_tokens());
    ChunkTrainerOptions options;
    options.chunk_tokens = 8;
    if (sparse) options.sparse = kernels::PageSelectOptions{.page_budget = 3, .sink_pages = 1, .local_pages = 1};
    const int64_t pages = 2 * (70 / kShape.page_tokens + 2);

    auto model = LoraModel(target.dtype, target.device);
    OwnedKvPools device_only = MakeTiers(pages, 0, target);
    ChunkTrainer reference(model.get(), device_only.pools(), options);
    auto want_loss = reference.TrainSequence(seq, scale, 1);
    ASSERT_TRUE(want_loss.ok()) << want_loss.status();
    const Grads want = TakeGrads(*model);

    OwnedKvPools tiered = MakeTiers(6, pages, target);
    ChunkTrainer trainer(model.get(), tiered.pools(), options);
    auto loss = trainer.TrainSequence(seq, scale, 1);
    ASSERT_TRUE(loss.ok()) << loss.status();
    if (tolerance == 0) {
      EXPECT_EQ(loss->loss_sum, want_loss->loss_sum);
    } else {
      EXPECT_NEAR(loss->loss_sum, want_loss->loss_sum, tolerance * std::abs(want_loss->loss_sum));
    }
    const Grads got = TakeGrads(*model);
    for (const auto& [name, g] : want) ExpectSame(got.at(name), g, name, tolerance);
    EXPECT_GT(trainer.memory().host_kv_peak_bytes, 0);
    EXPECT_GT(trainer.memory().bytes_to_device, 0);
    EXPECT_GT(trainer.memory().bytes_to_host, 0);
    EXPECT_EQ(tiered.kv_host->stats().used_pages, 0);
  }
}

TEST(HostTierTest, TrainingStepEqualsTheDeviceOnlyStep) { CheckTrainingStep(kCpu, 0); }

// float32 on the GPU: the two runs may sum in different orders (index-add), not more.
TEST(HostTierGpuTest, TrainingStepEqualsTheDeviceOnlyStep) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  CheckTrainingStep(kCuda, 1e-5);
}

// Counts LibTorch's warnings of calls that wait for the device (its synchronisation debug
// mode): reads of device values, blocking copies, stream synchronisations. Waits on CUDA events,
// which the trainer and the copy engine make on purpose, are not among them.
class DeviceWaits : public c10::WarningHandler {
 public:
  DeviceWaits() : previous_(c10::WarningUtils::get_warning_handler()) {
    c10::WarningUtils::set_warning_handler(this);
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_WARN);
  }
  ~DeviceWaits() override {
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
    c10::WarningUtils::set_warning_handler(previous_);
  }
  void process(const c10::Warning& warning) override {
    if (warning.msg().find("synchroniz") != std::string::npos) ++count_;
  }
  int count() const { return count_; }

 private:
  c10::WarningHandler* previous_;
  int count_ = 0;
};

// A training step on the GPU in bfloat16 (the fused attention path), dense and sparse, with
// pages on both tiers, waits for the device once: to read the loss at its end. No step of
// either stage drains the device's queue while the host prepares the next work (a document
// start or a label read back, a blocking upload, a stream synchronised), which would leave the
// device idle meanwhile.
TEST(HostTierGpuTest, TrainingStepWaitsForTheDeviceOnlyForItsLoss) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const Target bf16{at::Device(at::kCUDA, 0), at::kBFloat16};
  for (const bool sparse : {false, true}) {
    SCOPED_TRACE(sparse ? "sparse" : "dense");
    const TokenSequence seq = SeventyTokens();
    ChunkTrainerOptions options;
    options.chunk_tokens = 8;
    if (sparse) options.sparse = kernels::PageSelectOptions{.page_budget = 3, .sink_pages = 1, .local_pages = 1};
    auto model = LoraModel(bf16.dtype, bf16.device);
    OwnedKvPools tiered = MakeTiers(6, 2 * (70 / kShape.page_tokens + 2), bf16, at::kFloat);
    ChunkTrainer trainer(model.get(), tiered.pools(), options);
    ASSERT_TRUE(trainer.TrainSequence(seq, 0.01, 1).ok());  // first use: cuDNN plans, allocations
    int waits = 0;
    {
      DeviceWaits counter;
      auto loss = trainer.TrainSequence(seq, 0.01, 1);
      waits = counter.count();
      ASSERT_TRUE(loss.ok()) << loss.status();
    }
    EXPECT_EQ(waits, 1);
    EXPECT_GT(trainer.memory().bytes_to_device, 0);
  }
}

// memory.kv_grad_dtype: bfloat16 gradient pages (accumulated in float32, stored rounded after
// each chunk's contribution) against float32 pages, float32 model: the LoRA gradients move by
// the rounding and no more, and the host tier stores the same bf16 pages bit for bit.
TEST(KvGradDtypeTest, Bfloat16PagesChangeTheGradientsByTheirRoundingOnly) {
  const TokenSequence seq = SeventyTokens();
  const double scale = 1.0 / static_cast<double>(seq.label_tokens());
  ChunkTrainerOptions options;
  options.chunk_tokens = 8;
  const int64_t pages = 2 * (70 / kShape.page_tokens + 2);
  const Target f32{at::Device(at::kCPU), at::kFloat};
  auto model = LoraModel(at::kFloat);
  const auto train = [&](const OwnedKvPools& tiers) {
    ChunkTrainer trainer(model.get(), tiers.pools(), options);
    EXPECT_TRUE(trainer.TrainSequence(seq, scale, 1).ok());
    return TakeGrads(*model);
  };
  const Grads want = train(MakeTiers(pages, 0, f32));
  const Grads bf16 = train(MakeTiers(pages, 0, f32, at::kBFloat16));
  const Grads bf16_host = train(MakeTiers(6, pages, f32, at::kBFloat16));
  std::string worst;
  const double error = testing::MaxRelativeError(bf16, want, &worst);
  std::cout << "bfloat16 gradient pages: largest relative error of a LoRA gradient " << error << " (" << worst << ")\n";
  EXPECT_GT(error, 1e-6);  // the pages were bf16
  EXPECT_LT(error, 2e-2);  // and only rounded
  for (const auto& [name, g] : bf16) ExpectSame(bf16_host.at(name), g, name);
}

}  // namespace
}  // namespace oomb
